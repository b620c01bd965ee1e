"""Records of a judged case made in-process, for the rules that compare two runs (``diff`` and ``gate``).

``judged(case, status, ratio)``: a reference record on torch 2.13.0 whose worst error over tolerance is
``ratio`` (on rank 0's output; rank 1's input gradient has half of it, or infinity past 1e9).
"""

from __future__ import annotations

from harness.judge.metric import Metric
from harness.judge.status import Status
from harness.results.records import Record


def judged(case: str, status: Status, ratio: float = 0.01) -> Record:
    """A record of ``case`` with ``status`` and worst err/tol ``ratio``."""
    return Record(case=case, family=case.split("/")[0], params={}, impl="reference", status=status,
                  torch_version="2.13.0+cpu", torch_git_version="cf30153c4c13",
                  metrics={"rank0.step0.train.output": Metric(ratio * 1e-6, ratio * 1e-6, 1e-6, ratio),
                           "rank1.step0.train.grad_input": Metric(1.0, 1.0, 0.0, float("inf") if ratio > 1e9
                                                                  else ratio / 2)})
