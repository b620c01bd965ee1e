"""mixed-precision: half and bfloat16 input, with float32 or half parameters.

Catches: statistics exchanged in the input's half precision (large counts and
sums overflow or lose digits); counts cast to half (2049 becomes 2048); an
output returned in the parameter dtype instead of the input dtype; running
statistics updated in half arithmetic; a float32 weight mixed with half input
rejected, or silently cast so that gradients come back in the wrong dtype.
"""

from harness.case import Case

FAMILY = "mixed-precision"


def _case(name: str, dtype: str, param_dtype: str, batch_sizes=(3, 5), **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/{dtype}-{param_dtype}/ws{ws}", family=FAMILY,
                batch_sizes=tuple(batch_sizes), spatial=((5, 4),) * ws, dtype=dtype, param_dtype=param_dtype,
                **kw)


def cases() -> list[Case]:
    return [
        _case("uneven", "float16", "float32"),
        _case("uneven", "bfloat16", "float32"),
        _case("uneven", "float16", "float16"),
        _case("uneven", "bfloat16", "bfloat16"),
        _case("uneven", "float64", "float64"),
        _case("empty-rank", "float16", "float32", batch_sizes=(0, 4)),
        _case("offset", "float16", "float32", input_mean=20.0),
    ]
