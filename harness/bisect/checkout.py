"""A local git checkout of PyTorch (a clone, a fork, a mirror, a test repository), read with git.

Protocol: every question is one ``git -C PATH ...`` child with a time limit
(:data:`GIT_TIMEOUT_S`), in its own process group and reaped
(:mod:`harness.bisect.children`). A revision that is not there, or a path that
is not a git repository, raises :class:`CheckoutError` (a usage error) naming
the value and the fix. Nothing here writes to the checkout: no checkout of a
revision, no fetch, no change to its index or work tree.

What is asked:
- the commits from one revision to another on the first-parent line (PyTorch's
  main is linear), oldest first;
- the files changed between two commits (a rename is a delete and an add);
- files' bytes at a commit (one ``git cat-file --batch`` for many files);
- the release line a commit says it belongs to: ``version.txt`` (PyTorch's),
  or a tracked ``torch/version.py`` (a fork that commits it);
- the main commit a nightly-release commit names (its subject reads
  ``YYYY-MM-DD nightly release (<main sha>)``);
- the commits of a range that touch SyncBN's files (:data:`SYNCBN_FILES`), and
  a compare link.

A commit named with the files that make it matter is a :class:`Suspect`.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from harness.bisect import children
from harness.errors import UsageError

GIT_TIMEOUT_S = 120.0
# Where SyncBatchNorm's Python lives: the module, its autograd Function, DDP's buffer broadcast, the collectives.
SYNCBN_FILES = ("torch/nn/modules/batchnorm.py", "torch/nn/modules/_functions.py",
                "torch/nn/parallel/distributed.py", "torch/distributed/distributed_c10d.py")
COMPARE_URL = "https://github.com/pytorch/pytorch/compare/{good}...{bad}"
_NIGHTLY_SUBJECT = re.compile(r"^(\d{4}-\d{2}-\d{2}) nightly release \(([0-9a-f]{7,40})\)")
_PY_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)


class CheckoutError(UsageError):
    """A checkout or a revision given on the command line is not what it should be (exit 2)."""


@dataclass
class Suspect:
    """A commit, its subject, and the files of its change that make it matter (SyncBN's, compiled ones)."""

    commit: str
    subject: str
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """``commit``, ``subject``, ``files``."""
        return {"commit": self.commit, "subject": self.subject, "files": list(self.files)}

    def line(self, width: int) -> str:
        """``  <sha>  <subject, cut to width>  [<files>]``."""
        return f"  {self.commit}  {self.subject[:width]}  [{', '.join(self.files)}]"


class Checkout:
    """A git repository on disk; ``path`` is its top folder."""

    def __init__(self, path: str | Path, flag: str = "--overlay"):
        self.flag = flag
        given = Path(path).expanduser()
        if not given.is_dir():
            raise CheckoutError(f"{flag} {str(path)!r} is not a folder: give the path of a local git clone")
        proc = self._run(["git", "-C", str(given), "rev-parse", "--show-toplevel"])
        if proc.returncode != 0:
            raise CheckoutError(f"{flag} {str(path)!r} is not a git repository ({children.tail(proc.stderr, 1)}): "
                                "give the path of a local clone (git clone https://github.com/pytorch/pytorch)")
        self.path = Path(proc.stdout.strip())

    @staticmethod
    def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
        try:
            return children.run(cmd, timeout=GIT_TIMEOUT_S, **kw)
        except FileNotFoundError:
            raise CheckoutError("git is not installed: install it (Debian: apt-get install git)") from None
        except subprocess.TimeoutExpired:
            raise CheckoutError(f"`{' '.join(cmd[:6])} ...` took more than {GIT_TIMEOUT_S:.0f}s") from None

    def git(self, *args: str) -> str:
        """stdout of ``git -C PATH ARGS``; a failure raises :class:`CheckoutError`."""
        proc = self._run(["git", "-C", str(self.path), *args])
        if proc.returncode != 0:
            raise CheckoutError(f"`git -C {self.path} {' '.join(args)}` failed: {children.tail(proc.stderr, 2)}")
        return proc.stdout

    # ------------------------------------------------------------------ commits

    def resolve(self, rev: str) -> Optional[str]:
        """The full sha of commit ``rev``, or None when the checkout does not hold it."""
        proc = self._run(["git", "-C", str(self.path), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"])
        return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None

    def require(self, rev: str, flag: str) -> str:
        """The full sha of ``rev``, or a :class:`CheckoutError` saying ``flag`` names no commit here."""
        sha = self.resolve(rev)
        if sha is None:
            raise CheckoutError(f"{flag} {rev!r} is not a commit in {self.path}: give a sha, branch or tag it "
                                f"holds (git -C {self.path} fetch origin, if it is newer than the clone)")
        return sha

    def subject(self, rev: str) -> str:
        """The first line of a commit's message."""
        return self.git("log", "-1", "--format=%s", rev).strip()

    def is_ancestor(self, a: str, b: str) -> bool:
        """Whether commit ``a`` is an ancestor of (or is) commit ``b``."""
        return self._run(["git", "-C", str(self.path), "merge-base", "--is-ancestor", a, b]).returncode == 0

    def first_parent_range(self, good: str, bad: str) -> list[tuple[str, str]]:
        """``(full sha, subject)`` from ``good`` to ``bad`` inclusive on ``bad``'s first-parent line, oldest first."""
        if not self.is_ancestor(good, bad):
            raise CheckoutError(f"--good {good[:12]} is not an ancestor of --bad {bad[:12]} in {self.path}: give a "
                                "good commit older than the bad one, on the same line of history")
        out = self.git("log", "--reverse", "--first-parent", "--format=%H%x00%s", f"{good}..{bad}")
        between = [tuple(line.split("\0", 1)) for line in out.splitlines() if line]
        return [(good, self.subject(good))] + between

    def changed(self, a: str, b: str) -> list[tuple[str, str]]:
        """``(status, path)`` for each file that differs between commits ``a`` and ``b`` (A, M, D, T)."""
        out = self.git("diff", "--no-renames", "--name-status", "-z", a, b)
        parts = [p for p in out.split("\0") if p]
        return [(parts[i][0], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]

    def blobs(self, rev: str, paths: Sequence[str]) -> dict[str, bytes]:
        """The bytes of each of ``paths`` at ``rev`` (paths absent there are left out)."""
        if not paths:
            return {}
        request = "".join(f"{rev}:{p}\n" for p in paths).encode()
        proc = self._run(["git", "-C", str(self.path), "cat-file", "--batch"], input=request, text=False)
        if proc.returncode != 0:
            raise CheckoutError(f"`git cat-file --batch` failed in {self.path}: "
                                f"{children.tail(proc.stderr.decode(errors='replace'), 2)}")
        out, pos, data = {}, 0, proc.stdout
        for path in paths:
            end = data.index(b"\n", pos)
            header = data[pos:end].decode()
            pos = end + 1
            if header.endswith(" missing"):
                continue
            size = int(header.split()[2])
            out[path] = data[pos:pos + size]
            pos += size + 1
        return out

    def version_line(self, rev: str) -> Optional[tuple[str, str]]:
        """``(file, version)`` that commit ``rev`` declares: ``version.txt``, else a tracked ``torch/version.py``."""
        found = self.blobs(rev, ["version.txt", "torch/version.py"])
        if "version.txt" in found and found["version.txt"].strip():
            return "version.txt", found["version.txt"].decode(errors="replace").strip()
        m = _PY_VERSION.search(found.get("torch/version.py", b"").decode(errors="replace"))
        return ("torch/version.py", m.group(1)) if m else None

    # ------------------------------------------------------------------ nightlies and ranges

    def nightly_main(self, rev: str) -> Optional[tuple[str, str]]:
        """``(date, main sha)`` named by a nightly-release commit's subject, or None for another commit."""
        m = _NIGHTLY_SUBJECT.match(self.subject(rev))
        if not m:
            return None
        return m.group(1), self.resolve(m.group(2)) or m.group(2)

    def count(self, good: str, bad: str) -> int:
        """How many commits ``good..bad`` holds on the first-parent line."""
        return int(self.git("rev-list", "--count", "--first-parent", f"{good}..{bad}").strip() or 0)

    def touching(self, good: str, bad: str, paths: Sequence[str] = SYNCBN_FILES) -> list[Suspect]:
        """Commits of ``good..bad`` that change any of ``paths``, oldest first, with the files of them."""
        out = self.git("log", "--reverse", "--format=%x01%H%x00%s", "--name-only", f"{good}..{bad}", "--", *paths)
        commits = []
        for chunk in out.split("\x01")[1:]:
            head, _, names = chunk.partition("\n")
            sha, _, subject = head.partition("\0")
            commits.append(Suspect(sha, subject, [n for n in names.split("\n") if n]))
        return commits


def compare_link(good: str, bad: str) -> str:
    """GitHub's page of the commits from ``good`` to ``bad`` on pytorch/pytorch."""
    return COMPARE_URL.format(good=good, bad=bad)
