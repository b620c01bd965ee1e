"""A case drawn per rank in a real pool: each rank makes only its own part, the oracle's sums cross over the
harness's own process group, and the implementation's recorded collectives are exactly its own.

The same parameters drawn in sequence (every rank making every rank's tensors, no exchange) are the control:
the two cases' data differ, but an implementation issues the same collectives on both, and both pass.
"""

from __future__ import annotations

from harness.engine.session import RunOptions, Session, resolve_impls
from harness.judge.status import Status
from harness.search import space

FIELDS = dict(batch_sizes=(3, 0, 2), spatial=((2, 3),) * 3, channels=4, steps=("train", "eval", "train"),
              groups=((0,), (1, 2)), seed=21)


def _ops(record) -> list:
    return [[(c["op"], c["dtype"], c["shape"], c.get("group")) for c in r.collectives or []] for r in record.ranks]


def test_a_case_drawn_per_rank_passes_and_records_only_the_implementations_collectives():
    per_rank = space.make_case(**FIELDS)
    sequential = space.make_case(**FIELDS, draws="sequential")
    assert per_rank.draws == "per-rank" and per_rank.id != sequential.id
    impls = resolve_impls(["torch", "reference"])
    session = Session(impls, RunOptions(device="cpu", timeout=60, diagnose=False))
    try:
        for impl in impls:
            a, b = session.run_one(per_rank, impl), session.run_one(sequential, impl)
            assert a.status == Status.PASS, a.message
            assert b.status == Status.PASS, b.message
            # The sequential twin exchanges nothing: equal lists mean the exchange's calls were not recorded.
            assert _ops(a) == _ops(b)
            assert any(_ops(a)), "the implementation's own collectives are recorded"
    finally:
        session.close()
