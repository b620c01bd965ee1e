"""Git repositories laid out like pytorch's, made in a test's tmp_path (real ``git``, real commits).

``PytorchRepo(path)`` starts an empty repository; :meth:`PytorchRepo.commit` writes files (bytes or
text; None deletes) and commits them, returning the full sha; :meth:`PytorchRepo.nightly` commits,
on the ``nightly`` branch, a nightly-release commit whose tree is a main commit's and whose subject
reads ``YYYY-MM-DD nightly release (<main sha>)``, as pytorch's nightly branch does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional, Union

IDENT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}


class PytorchRepo:
    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        self.last_nightly: Optional[str] = None

    def git(self, *args: str, stdin: Optional[str] = None) -> str:
        out = subprocess.run(["git", *args], cwd=self.path, capture_output=True, text=True, timeout=120,
                             input=stdin, env={**os.environ, **IDENT})
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout.strip()

    def commit(self, message: str, files: dict[str, Union[bytes, str, None]]) -> str:
        for rel, content in files.items():
            target = self.path / rel
            if content is None:
                self.git("rm", "-q", rel)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else content)
            self.git("add", rel)
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def nightly(self, day: str, main_sha: str) -> str:
        """A commit on ``nightly`` with ``main_sha``'s tree, named like pytorch's nightly-release commits."""
        parents = ["-p", self.last_nightly] if self.last_nightly else []
        sha = self.git("commit-tree", f"{main_sha}^{{tree}}", *parents, "-m", f"{day} nightly release ({main_sha})")
        self.git("update-ref", "refs/heads/nightly", sha)
        self.last_nightly = sha
        return sha
