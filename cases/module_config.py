"""module-config: the module's options and modes.

Catches: affine=False (weight None) dereferenced; track_running_stats=False
still updating or reading buffers; momentum=None (cumulative average) treated
as 0.1 or dividing by a stale num_batches_tracked; eval mode that still
synchronizes or uses batch statistics; several steps whose running statistics
drift; eps ignored or applied twice; 2-D, 3-D and 5-D input.
"""

from harness.case import Case

FAMILY = "module-config"


def _case(name: str, batch_sizes=(3, 4), spatial=(4, 3), **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/ws{ws}", family=FAMILY, batch_sizes=tuple(batch_sizes),
                spatial=(tuple(spatial),) * ws, **kw)


def cases() -> list[Case]:
    return [
        _case("affine-off", affine=False),
        _case("no-running-stats", track_running_stats=False, steps=("train", "eval")),
        _case("momentum-none-3-steps", momentum=None, steps=("train", "train", "train")),
        _case("train-eval-train", steps=("train", "eval", "train", "eval")),
        _case("eps-1e-2", eps=1e-2, input_scale=0.1),
        _case("input-2d", spatial=()),
        _case("input-3d", spatial=(7,)),
        _case("input-5d", spatial=(2, 3, 2)),
    ]
