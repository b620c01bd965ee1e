"""channels-last: channels_last (4-D) and channels_last_3d (5-D) input.

Catches: kernels that index NCHW memory as if it were NHWC (or the reverse)
and so mix channels; outputs returned contiguous when the input was
channels_last; a gradient whose layout differs from the input's (contiguous
grad for a channels_last input) read with the input's strides.
"""

from harness.case import Case

FAMILY = "channels-last"


def _case(name: str, fmt: str, spatial, batch_sizes=(2, 3), grad_fmt=None, **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/{fmt}/ws{ws}", family=FAMILY, batch_sizes=tuple(batch_sizes),
                spatial=(tuple(spatial),) * ws, memory_format=fmt, grad_memory_format=grad_fmt, channels=6, **kw)


def cases() -> list[Case]:
    return [
        _case("uneven", "channels_last", (5, 3)),
        _case("uneven", "channels_last_3d", (3, 2, 4)),
        _case("grad-contiguous", "channels_last", (4, 4), grad_fmt="contiguous"),
        _case("empty-rank", "channels_last", (4, 3), batch_sizes=(0, 3)),
        _case("half", "channels_last", (4, 3), dtype="float16"),
    ]
