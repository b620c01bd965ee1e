"""How an implementation ran when it was judged: a closed :class:`Mode`, with free notes kept apart.

Design note. Whether a verdict was reached on an implementation's own kernels
or on CPU stand-ins for CUDA's decides how it may be reported: a torch failure
seen only in ``cpu-emulation`` is "not yet confirmed on CUDA". So the mode is
one of a few values that readers compare (:attr:`Mode.emulated` is the one
question they ask), and whatever else a run wants to say of it (apex's nvtx
stub, detectron2's ``stats_mode``, DDP's CPU check skipped) is a note beside
it, never appended to it. :func:`parse` reads the one-string form that records
before schema 3 and adapters of user plugins may still give.
"""

from __future__ import annotations

import enum
from typing import Optional, Union


class Mode(str, enum.Enum):
    """How an implementation's kernels ran."""

    NATIVE = "native"  # its own code and kernels, on the device the record names
    CPU_EMULATION = "cpu-emulation"  # torch's SyncBN Python over CPU stand-ins for its five CUDA kernels
    OPTIMIZED = "optimized"  # apex's CUDA extension
    PYTHON_FALLBACK = "python-fallback"  # apex's Python fallback (no extension built)

    def __str__(self) -> str:
        return self.value

    @property
    def emulated(self) -> bool:
        """Whether the verdict was reached over stand-ins for another device's kernels (not yet confirmed there)."""
        return self is Mode.CPU_EMULATION


def parse(text: Union[str, "Mode", None]) -> tuple[Optional[Mode], tuple[str, ...]]:
    """A mode and its notes from the one-string form: ``"python-fallback (nvtx no-op)"``,
    ``"cpu-emulation; DDP's CPU SyncBatchNorm check skipped"``, ``"stats_mode='N' from detectron2"``.

    A text that names no mode keeps all its words as notes (nothing is lost), with no mode.
    """
    if text is None or isinstance(text, Mode):
        return text, ()
    head, *rest = [part.strip() for part in text.split(";")]
    notes = [p for p in rest if p]
    for mode in Mode:
        if head == mode.value or head.startswith(mode.value + " "):
            inner = head[len(mode.value):].strip()
            return mode, tuple(filter(None, [inner.strip("()").strip()] + notes))
    if head.startswith("stats_mode="):  # detectron2's NaiveSyncBatchNorm: its own Python, its own kernels
        said, _, where = head.partition(" from ")
        return Mode.NATIVE, tuple(filter(None, [said, f"from {where}" if where else "", *notes]))
    return None, tuple(filter(None, [head, *notes]))


def text(mode: Optional[Mode], notes: tuple[str, ...] = ()) -> str:
    """A mode and its notes as people read them: ``python-fallback (nvtx no-op)``; '' for no mode."""
    words = [mode.value] if mode else []
    return " ".join(words + ([f"({'; '.join(notes)})"] if notes else []))


def declared_mode(value: Union[str, Mode, None], where: str) -> Optional[Mode]:
    """An adapter's declared mode as a :class:`Mode`; a string must be one of the values exactly.

    ``where`` names the adapter in the error: a plugin that sets ``mode = "fast"`` is told the values and where
    its own words go (``mode_notes``).
    """
    if value is None or isinstance(value, Mode):
        return value
    try:
        return Mode(value)
    except ValueError:
        raise ValueError(f"{where}: mode {str(value)[:60]!r} is not one of {', '.join(m.value for m in Mode)} "
                         "(or None); put anything else in mode_notes") from None
