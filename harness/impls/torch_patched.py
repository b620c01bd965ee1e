"""``torch@PATH``: torch's SyncBatchNorm from a patched copy of its Python, run exactly as torch is.

A PyTorch developer changing SyncBatchNorm's Python wants the change judged
before sending it: by the same cpu-emulation, DDP guard, CUDA contract and
``unsupported`` verdicts as the installed torch, against the same known
issues. ``--impl torch@PATH`` gives that. ``PATH`` is a PyTorch checkout (or
any folder laid out like one) holding ``torch/nn/modules/_functions.py``
(the autograd Function) and/or ``torch/nn/modules/batchnorm.py`` (the module
and ``convert_sync_batchnorm``); a file it lacks is the installed torch's.

Loading (:func:`load_copy`): each file's source is compiled under its own
path (tracebacks and ``inspect`` point into the checkout) and run as a module
of its own whose package is ``torch.nn.modules``, so its relative imports
reach the installed torch; the copy of ``batchnorm.py`` then calls the copy of
``_functions.py`` (its ``sync_batch_norm`` name is rebound to the copy's
Function). torch's ``convert_sync_batchnorm`` builds its layers as
``torch.nn.SyncBatchNorm(...)``, by that name: while the copy converts a model,
the name is the copy's class (:func:`as_torch_syncbn`), so converted models
run the copy too. The installed torch's files are never modified: only the
adapter's rank processes hold the copy.

Everything else is :class:`~harness.impls.torch_native.TorchImpl`'s: the
records' mode (``native`` on CUDA, ``cpu-emulation`` on CPU), the CUDA
contract, the device-check path (the copy's own ``forward`` is read), and the
known issues, which match ``torch@PATH`` as they match ``torch``
(:meth:`harness.results.known_issues.KnownIssue.covers`). The copy must come
from the installed release's branch: a ``batchnorm.py`` of another release may
import names this torch lacks, which is reported as the adapter being
unavailable, naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
import types
from pathlib import Path
from typing import Optional

from harness.errors import ImplUnavailable, UsageError
from harness.impls.base import ReproBinding
from harness.impls.torch_native import TorchImpl

PREFIX = "torch@"
FILES = ("torch/nn/modules/_functions.py", "torch/nn/modules/batchnorm.py")


def copy_files(path: Path) -> dict[str, Path]:
    """The SyncBatchNorm files ``path`` holds, by their path in torch's tree; a usage error if it holds neither."""
    found = {rel: path / rel for rel in FILES if (path / rel).is_file()}
    if not found:
        raise UsageError(f"--impl {PREFIX}{path}: {path} holds neither {FILES[0]} nor {FILES[1]}: give a PyTorch "
                         "checkout (or a folder laid out like one) with your copy of SyncBatchNorm's Python")
    return found


def _module(name: str, source: Path):
    mod = types.ModuleType(name)
    mod.__file__ = str(source)
    mod.__package__ = "torch.nn.modules"
    sys.modules[name] = mod  # dataclasses and pickling look modules up by name
    code = compile(source.read_text(encoding="utf-8"), str(source), "exec")
    exec(code, mod.__dict__)  # noqa: S102 - the user's own copy of torch's file, run as torch runs it
    return mod


def load_copy(path: Path):
    """The ``SyncBatchNorm`` class of the copy at ``path`` (see the module docstring)."""
    files = copy_files(path)
    tag = f"syncbn_harness_patched_{abs(hash(str(path.resolve()))):x}"
    try:
        functions = (_module(f"{tag}._functions", files[FILES[0]]) if FILES[0] in files
                     else importlib.import_module("torch.nn.modules._functions"))
        batchnorm = (_module(f"{tag}.batchnorm", files[FILES[1]]) if FILES[1] in files
                     else _module(f"{tag}.batchnorm", Path(importlib.import_module(
                         "torch.nn.modules.batchnorm").__file__)))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a copy from another release may fail in any way
        raise ImplUnavailable(f"{PREFIX}{path}: its copy of torch's SyncBatchNorm does not load with torch "
                              f"installed here: {type(exc).__name__}: {exc}") from None
    if hasattr(batchnorm, "sync_batch_norm"):
        batchnorm.sync_batch_norm = functions.SyncBatchNorm
    cls = getattr(batchnorm, "SyncBatchNorm", None)
    if cls is None:
        raise ImplUnavailable(f"{PREFIX}{path}: {files.get(FILES[1], 'batchnorm.py')} defines no SyncBatchNorm")
    return cls


@contextlib.contextmanager
def as_torch_syncbn(cls):
    """While the block runs, ``torch.nn.SyncBatchNorm`` names ``cls`` (the copy's converter builds by that name)."""
    import torch

    original = torch.nn.SyncBatchNorm
    torch.nn.SyncBatchNorm = cls
    try:
        yield
    finally:
        torch.nn.SyncBatchNorm = original


class PatchedTorchImpl(TorchImpl):
    """torch's SyncBatchNorm from the copy at ``path``, with everything the ``torch`` adapter gives."""

    def __init__(self, path: str):
        self.path_text = path
        self.source = Path(path).expanduser()
        copy_files(self.source)  # a usage error at once, before any rank starts
        self.name = f"{PREFIX}{path}"
        self._cls = None

    @property
    def key(self) -> str:
        return self.name

    def syncbn_class(self):
        if self._cls is None:
            self._cls = load_copy(self.source)
        return self._cls

    def check_available(self) -> None:
        self.syncbn_class()

    def converter(self):
        cls = self.syncbn_class()

        def convert(model, process_group=None):
            with as_torch_syncbn(cls):
                return cls.convert_sync_batchnorm(model, process_group)

        return convert

    def setup_rank(self, device: str) -> None:
        super().setup_rank(device)
        if device == "cpu" and self.path == "function":
            raise ImplUnavailable(f"{self.name}: this torch's SyncBatchNorm checks input.is_cuda, so on CPU the "
                                  "harness drives the installed torch's Function, not the copy's: run the copy on "
                                  "--device cuda, or use a torch whose check asks the privateuse1 backend (>= 2.1)")

    def private_ops(self):
        """None: a copy of torch's Python brings no ops of its own (the installed build's are ``--impl torch``'s)."""
        return None

    def describe(self) -> dict:
        d = super().describe()
        d["source"] = {rel: str(p) for rel, p in copy_files(self.source).items()}
        return d

    def repro_binding(self) -> ReproBinding:
        return dataclasses.replace(super().repro_binding(), library="torch (patched)")

    def version(self) -> Optional[str]:
        return f"{super().version()} with {self.source}"


def resolve(path: str) -> PatchedTorchImpl:
    """The adapter for ``torch@PATH``, given ``PATH``."""
    if not path:
        raise UsageError(f"--impl {PREFIX!r}: give the folder of your copy after '@' (e.g. torch@~/pytorch)")
    return PatchedTorchImpl(path)
