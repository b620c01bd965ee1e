"""cuda-graph: a SyncBN training step captured in a CUDA graph and replayed (the cuda_graph scenario).

Catches:
- host syncs in the forward or backward that make capture fail (pytorch#78549:
  the boolean mask that drops empty ranks' rows);
- gathered rows of empty ranks, which reach batch_norm_gather_stats_with_counts
  with count 0 under capture (pytorch#78666 skips the mask while capturing),
  getting weight in the merge: NaN or shifted statistics (pytorch#78656);
- graphs that replay stale inputs, or do not update running statistics and
  num_batches_tracked in place, across replays.

These cases need a GPU per rank and nccl (on CPU, or over gloo, they are
``unsupported`` at once, with the reason), so they are outside the default
selection: ``run --device cuda --backend nccl --exhaustive --case 'cuda-graph/*'``
(``nox -s gpu`` runs them).
"""

from harness.catalog.case import Case

FAMILY = "cuda-graph"


def _case(name: str, batch_sizes, spatial=(4, 4), **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/ws{ws}", family=FAMILY, batch_sizes=tuple(batch_sizes),
                spatial=(tuple(spatial),) * ws, steps=("train", "train"), scenario="cuda_graph", default=False, **kw)


def cases() -> list[Case]:
    return [
        _case("even", (4, 4)),
        _case("empty-rank", (3, 0), note="zero count under capture (pytorch#78656)"),
        _case("uneven-float16-channels_last", (2, 5), dtype="float16", param_dtype="float32",
              memory_format="channels_last", spatial=(3, 5)),
    ]
