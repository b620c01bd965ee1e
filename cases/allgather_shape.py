"""allgather-shape: ranks whose collective operands or counts differ.

Catches: statistics merged with equal weights instead of per-rank counts
(uneven batches give a wrong mean and variance); ranks with an empty batch
(a crash, or NaN from a 0/0 poisoning the merge); all_gather operands of
different sizes across ranks (the 2020 break of apex.parallel.SyncBatchNorm
between pytorch#40358 and pytorch#40573: "All tensor operands to
scatter/gather must have the same size"); one sample per rank ("Expected more
than 1 value per channel" although the global batch is larger); different
spatial sizes per rank (a count taken from N instead of N*H*W).
"""

from harness.case import Case

FAMILY = "allgather-shape"


def _case(name: str, batch_sizes, spatial=None, **kw) -> Case:
    ws = len(batch_sizes)
    spatial = spatial or [(4, 3)] * ws
    return Case(id=f"{FAMILY}/{name}/ws{ws}", family=FAMILY, batch_sizes=tuple(batch_sizes),
                spatial=tuple(tuple(s) for s in spatial), **kw)


def cases() -> list[Case]:
    return [
        _case("even-4-4", [4, 4]),
        _case("uneven-2-6", [2, 6]),
        _case("empty-rank-0-5", [0, 5]),
        _case("one-sample-1-1", [1, 1]),
        _case("spatial-differs", [3, 3], spatial=[(4, 3), (2, 5)]),
        _case("uneven-1-2-5", [1, 2, 5]),
        _case("empty-ranks-0-3-0-2", [0, 3, 0, 2]),
        _case("uneven-steps-3-1", [3, 1], steps=("train", "train", "eval")),
    ]
