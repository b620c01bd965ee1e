"""numerics: inputs that break naive arithmetic.

Catches:
- variance as E[x^2] - E[x]^2: catastrophic cancellation with a large mean
  against a small spread, down to negative variance and NaN;
- variance near eps mishandled when recovered from 1/std (var = 1/invstd^2 -
  eps, as torch's gather does);
- constant channels (zero variance) dividing by zero;
- channel counts that are not powers of two and above 64: blocked or
  vectorized kernels that drop the tail (pytorch#57077, apex#1768);
- large reductions whose float32 sums lose digits.
"""

from harness.catalog.case import Case

FAMILY = "numerics"


def _case(name: str, batch_sizes=(4, 2), spatial=(4, 4), **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/ws{ws}", family=FAMILY, batch_sizes=tuple(batch_sizes),
                spatial=(tuple(spatial),) * ws, **kw)


def cases() -> list[Case]:
    return [
        _case("offset-1e3", input_mean=1000.0, input_scale=1.0),
        _case("offset-1e4-small-spread", input_mean=1e4, input_scale=0.5),
        _case("offset-1e3-ws3", batch_sizes=(1, 5, 2), input_mean=1000.0, input_scale=0.3),
        _case("var-near-eps", input_scale=3e-3),
        _case("var-below-eps", input_scale=1e-4),
        _case("constant-channels", constant_channels=(0, 3)),
        _case("channels-67", channels=67, spatial=(2, 3)),
        _case("channels-130", channels=130, spatial=(3,)),
        _case("large-reduction", batch_sizes=(8, 8), spatial=(48, 48), channels=3, input_mean=3.0),
    ]
