"""mixed-precision: half and bfloat16 input with float32 parameters, and fully half models.

Catches:
- a float32 layer fed half input rejected or mis-cast ("expected scalar type
  Half but found Float", pytorch#27420, apex#254);
- a fully half model whose counts or running statistics mismatch in dtype
  ("Expected counts to have type Half but got Float", pytorch#96203,
  ColossalAI#258, DeepSpeed#2102; fixed by pytorch#98332);
- counts cast to half precision: 2049 elements become 2048 (a half has 11
  significant bits), so the merge weights and Bessel's correction are wrong;
- statistics accumulated in half: a sum of 8192 values near 10 overflows
  half's 65504;
- an output returned in the parameter dtype instead of the input dtype;
- an empty rank whose zero row is sent in the input dtype while the others
  send float32 statistics (all_gather of mismatched sizes);
- half input with float32 parameters and no running statistics, where no
  running_mean's dtype decides the counts' dtype (torch's CUDA gather then
  dispatches on the half input and refuses float32 counts; nn.BatchNorm
  accepts the same layer);
- backward sums of half gradients scaled as GradScaler scales them (2**16
  over a mean of 1024 values, with a mean) rounded to half: torch's
  contiguous batch_norm_backward_reduce rounds its partial sums to the input
  dtype and they pass 65,504 (pytorch#195701, fixed by pytorch#196125); the
  channels-last and bfloat16 twins do not overflow.
"""

from harness.catalog.case import Case

FAMILY = "mixed-precision"


def _case(name: str, dtype: str, param_dtype: str, batch_sizes=(3, 5), spatial=(5, 4), **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/{dtype}-{param_dtype}/ws{ws}", family=FAMILY,
                batch_sizes=tuple(batch_sizes), spatial=(tuple(spatial),) * ws, dtype=dtype, param_dtype=param_dtype,
                **kw)


def cases() -> list[Case]:
    out = []
    for dtype, pdtype in (("float16", "float32"), ("bfloat16", "float32"), ("float16", "float16"),
                          ("bfloat16", "bfloat16"), ("float32", "float64"), ("float64", "float64")):
        out.append(_case("uneven", dtype, pdtype))
    out += [
        _case("count-2049", "float16", "float32", batch_sizes=(1, 1), spatial=(2049,), channels=3),
        _case("count-2049", "float16", "float16", batch_sizes=(1, 1), spatial=(2049,), channels=3),
        _case("half-sum-overflow", "float16", "float32", batch_sizes=(2, 2), spatial=(64, 64), channels=2,
              input_mean=10.0, input_scale=1.0),
        _case("empty-rank", "float16", "float32", batch_sizes=(0, 4)),
        _case("empty-rank", "bfloat16", "bfloat16", batch_sizes=(3, 0)),
        _case("offset", "float16", "float32", input_mean=20.0),
        _case("steps-train-eval", "bfloat16", "float32", steps=("train", "train", "eval")),
        _case("no-running-stats", "float16", "float32", track_running_stats=False),
        _case("no-running-stats", "bfloat16", "float32", track_running_stats=False),
        # A loss scaled by 2**16 (GradScaler's initial scale) and averaged over 1024 values: upstream gradients
        # of about 64 with a mean, 2048 per channel and rank, whose sums pass 65,504 (well inside float32).
        _case("scaled-grads", "float16", "float32", batch_sizes=(8, 8), spatial=(16, 16), channels=2, **SCALED),
        _case("scaled-grads-channels-last", "float16", "float32", batch_sizes=(8, 8), spatial=(16, 16), channels=2,
              memory_format="channels_last", **SCALED),
        _case("scaled-grads", "bfloat16", "float32", batch_sizes=(8, 8), spatial=(16, 16), channels=2, **SCALED),
    ]
    # torch's non-gloo code path (nccl-contract on CPU): the same cases; the uneven and empty-rank half ones by
    # default, where the flat all_gather's operands differ most between ranks.
    out += [c.on_backend("nccl-contract", default=c.id in NON_GLOO_DEFAULT) for c in out]
    return out


SCALED = {"grad_mean": 1.0, "grad_scale": 2.0**16 / 1024}
NON_GLOO_DEFAULT = (f"{FAMILY}/uneven/float16-float32/ws2", f"{FAMILY}/empty-rank/float16-float32/ws2",
                    f"{FAMILY}/count-2049/float16-float16/ws2")
