"""join: DDP's ``join()`` with uneven numbers of batches per rank (rank r has one batch fewer than rank r - 1).

Catches: a hang at the end of an epoch with uneven batches.
DistributedDataParallel documents that join does not support collectives in
the forward pass such as SyncBatchNorm's: a rank that has run out of batches
shadows DDP's gradient all-reduce, not SyncBN's all_gather, so the ranks
still training wait on a collective that never completes, or pair it with
the wrong one (pytorch#38174; Lightning#3325). Users meet it as a hang at the
end of an epoch. The harness must end such a case in bounded time and name
the rank and the collective; a SyncBN that supports join is judged like any
DDP step over the ranks that still have batches.
"""

from harness.catalog.case import Case

FAMILY = "join"
TIME_LIMIT_S = 15.0  # the expected failure is a hang: 15 s tells it from a slow step (a step takes < 1 s)


def cases() -> list[Case]:
    out = []
    for net in ("cnn", "resblock"):
        for batches in ((3, 5), (2, 4, 3)):
            ws = len(batches)
            out.append(Case(id=f"{FAMILY}/{net}/ws{ws}", family=FAMILY, batch_sizes=batches,
                            spatial=((4, 4),) * ws, channels=3, scenario="model", model=net, optimizer="sgd",
                            ddp=("ddp",), steps=("train",) * (ws + 1), use="join",
                            time_limit=TIME_LIMIT_S, default=net == "cnn" and ws == 2))
    return out
