"""Progress of a long run on a terminal: cases done of total, counts per status, elapsed and remaining.

The display is one line on standard error, redrawn by tqdm (which handles the
terminal width, the refresh rate and clearing the line around other output).
It is shown only when standard error is a terminal and the records do not go
to standard output as JSON; otherwise :class:`Progress` is silent and
:meth:`Progress.write` prints plain lines, so logs and pipes stay clean.

The remaining time is the average seconds per (case, impl) so far times what
is left (no smoothing: cases differ in cost, and pools restart).
"""

from __future__ import annotations

import collections
import os
import sys
import time
from typing import Mapping, Optional, TextIO

from harness.judge.status import Status
from harness.results.records import Record

BAR_FORMAT = "{n_fmt}/{total_fmt} cases |{bar:12}| {desc}  [{elapsed}<{remaining}]"


def format_counts(counts: Mapping[str, int]) -> str:
    """Per-status counts in :class:`Status` order, zeros left out: ``pass 10  mismatch 2``."""
    return "  ".join(f"{s.value} {counts[s.value]}" for s in Status if counts.get(s.value))


def format_line(done: int, total: int, counts: Mapping[str, int], elapsed: float) -> str:
    """The progress line, e.g. ``3/10 cases |███▌        | pass 2  mismatch 1  [00:30<01:10]``."""
    from tqdm import tqdm

    return tqdm.format_meter(done, total, elapsed, bar_format=BAR_FORMAT, prefix=format_counts(counts))


def wanted(stream: TextIO, fmt: str = "table") -> bool:
    """Whether to draw progress: on a terminal, and not when stdout carries JSON."""
    isatty = getattr(stream, "isatty", None)
    return fmt != "json" and bool(isatty and isatty())


def _size(stream: TextIO) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return 0, 0
    return size.columns, size.lines


class Progress:
    """A live progress line over ``total`` (case, impl) pairs; silent unless ``enabled``."""

    def __init__(self, total: int, *, enabled: bool, stream: Optional[TextIO] = None):
        self.total = total
        self.enabled = enabled and total > 0
        self.stream = stream or sys.stderr
        self.counts: collections.Counter = collections.Counter()
        self.started = time.monotonic()
        self._bar = None
        if self.enabled:
            from tqdm import tqdm

            # A terminal that reports no width (a bare pty, some CI consoles) makes tqdm draw nothing.
            sized = min(_size(self.stream)) > 0
            self._bar = tqdm(total=total, file=self.stream, bar_format=BAR_FORMAT, smoothing=0, leave=True,
                             dynamic_ncols=sized, ncols=None if sized else 100, nrows=None if sized else 24,
                             mininterval=0.5)

    def update(self, record: Record) -> None:
        """Count one finished record and redraw."""
        self.counts[record.status.value] += 1
        if self._bar is not None:
            self._bar.set_description_str(format_counts(self.counts), refresh=False)
            self._bar.update(1)

    def write(self, line: str) -> None:
        """Print a line above the progress line (or plainly, when there is none)."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """Leave the final line on screen and stop redrawing."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
