"""SyncBN's path through compiled code: which compiled sources can change what SyncBN computes or sends.

An overlay lays a commit's Python over a binary built from another commit
(:mod:`harness.bisect.overlay`); the compiled sources that differ between the
two are left out. Whether that matters depends on *which* files differ. A
compiled file is **on SyncBN's path** when a change to it can change what
SyncBN computes or communicates; a commit whose compiled diff from the binary
touches only files off the path is tested as an approximate overlay, one that
touches the path cannot be tested by an overlay.

The path is :data:`ON_PATH`, a tuple of globs matched against repository
paths. Matching (:func:`glob_matches`) is case-insensitive and ``*`` crosses
folders (``fnmatch``'s rules), so ``aten/src/ATen/native/*batch_norm*``
covers ``native/cpu/batch_norm_kernel.cpp``. ``bisect --on-path GLOB``
(repeatable) replaces the whole set; ``bisect --strict`` counts every compiled
file as on the path.

Two files are judged by entry, not as a whole (:data:`BY_ENTRY`):
``native_functions.yaml`` and ``derivatives.yaml`` declare every operator,
and almost every day some entry changes. Such a file is on the path only
when an entry of an operator SyncBN calls (:data:`SYNCBN_OPS`: the batch-norm
family) differs between the two commits; the entries are compared as text,
split at each ``- func:`` / ``- name:`` line.

What counts as compiled at all is :data:`COMPILED_PREFIXES` (the sources of
the C++/CUDA library, its code generators and its submodules).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

# Sources that end up in the binary (C++, CUDA, the code generators and their inputs, submodules).
COMPILED_PREFIXES = ("aten/", "c10/", "torch/csrc/", "caffe2/", "torchgen/", "tools/autograd/", "third_party/")

ON_PATH = (
    # The normalization kernels and their declarations, every backend.
    "aten/src/ATen/native/*normalization*",
    "aten/src/ATen/native/*batch_norm*",
    "aten/src/ATen/native/*batchnorm*",
    # The operators SyncBN calls: their schemas and their derivatives (judged by entry, see BY_ENTRY).
    "aten/src/ATen/native/native_functions.yaml",
    "tools/autograd/derivatives.yaml",
    # c10d, its process groups and DDP's reducer; the communication libraries themselves.
    "torch/csrc/distributed/c10d/*",
    "third_party/gloo",
    "third_party/nccl*",
    # The autograd engine, AccumulateGrad and the generated autograd functions' templates.
    "torch/csrc/autograd/*",
    "tools/autograd/templates/*",
    # The core every operator goes through: the dispatcher and TensorIterator.
    "aten/src/ATen/core/dispatch/*",
    "aten/src/ATen/TensorIterator*",
)

# Files judged by the entries that changed; the line that starts an entry.
BY_ENTRY = {"aten/src/ATen/native/native_functions.yaml": "- func:",
            "tools/autograd/derivatives.yaml": "- name:"}
SYNCBN_OPS = re.compile(r"batch_norm", re.I)
_OP_NAME = re.compile(r"^-\s*(?:func|name):\s*([A-Za-z0-9_.]+)")


def is_compiled(path: str) -> bool:
    """Whether ``path`` is part of what is compiled into the binary."""
    return path.startswith(COMPILED_PREFIXES)


def glob_matches(path: str, glob: str) -> bool:
    """``fnmatch``'s rule, case-insensitive, ``*`` crossing folders."""
    return fnmatch.fnmatchcase(path.lower(), glob.lower())


def entries(text: str, start: str) -> dict[str, str]:
    """A YAML list of operator entries split at each ``start`` line: ``{operator name: its text}``."""
    out: dict[str, list[str]] = {}
    name: Optional[str] = None
    for line in text.splitlines():
        if line.startswith(start):
            m = _OP_NAME.match(line)
            name = m.group(1) if m else line
            while name in out:  # overloads declared twice stay apart
                name += "'"
            out[name] = []
        if name is not None:
            out[name].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def changed_entries(old: str, new: str, start: str) -> list[str]:
    """Operators whose entry was added, removed or changed between two texts of one file, sorted."""
    a, b = entries(old, start), entries(new, start)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


class Blobs(Protocol):
    def blobs(self, rev: str, paths: Sequence[str]) -> dict[str, bytes]: ...


@dataclass(frozen=True)
class PathRule:
    """Which compiled files count as on SyncBN's path: ``globs`` (default :data:`ON_PATH`), or all (``strict``)."""

    globs: tuple[str, ...] = ON_PATH
    strict: bool = False

    def matches(self, path: str) -> bool:
        """Whether ``path`` matches a glob (before any entry-level judgement)."""
        return self.strict or any(glob_matches(path, g) for g in self.globs)

    def on_path(self, compiled: Sequence[str], repo: Blobs, old: str, new: str) -> list[str]:
        """Of the compiled paths that differ between commits ``old`` and ``new``, those on the path.

        A file of :data:`BY_ENTRY` is listed as ``path (op, op)`` when entries of SyncBN's operators differ,
        and left out when only other operators' entries do.
        """
        out = []
        for path in compiled:
            if not self.matches(path):
                continue
            start = BY_ENTRY.get(path)
            if start is None or self.strict:
                out.append(path)
                continue
            a = repo.blobs(old, [path]).get(path, b"").decode(errors="replace")
            b = repo.blobs(new, [path]).get(path, b"").decode(errors="replace")
            ops = [op for op in changed_entries(a, b, start) if SYNCBN_OPS.search(op)]
            if ops:
                out.append(f"{path} ({', '.join(ops)})")
        return out

    def describe(self) -> str:
        """One line for logs and summaries."""
        if self.strict:
            return "--strict: every compiled file counts as on SyncBN's path"
        return "on SyncBN's path: " + ", ".join(self.globs)
