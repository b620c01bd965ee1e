"""channels-last: channels_last (4-D) and channels_last_3d (5-D) input.

Catches:
- a gradient laid out differently from the input read with the input's
  strides (pytorch#64039, fixed by pytorch#64100: "if grad_output is channels
  last but not input, input would be read as if it were channels last");
- channels-last kernels whose launch configuration leaves channels past a
  power of two unwritten (pytorch#57077: only the first 64 channels correct;
  apex#1768: wrong mean/var when the channel count is not a power of two);
- outputs returned contiguous when the input was channels_last;
- NHWC memory indexed as NCHW (channels mixed), for 4-D and 5-D input.
"""

from harness.catalog.case import Case

FAMILY = "channels-last"


def _case(name: str, fmt: str, spatial, batch_sizes=(2, 3), grad_fmt=None, channels=6, **kw) -> Case:
    ws = len(batch_sizes)
    return Case(id=f"{FAMILY}/{name}/{fmt}/ws{ws}", family=FAMILY, batch_sizes=tuple(batch_sizes),
                spatial=(tuple(spatial),) * ws, memory_format=fmt, grad_memory_format=grad_fmt, channels=channels,
                **kw)


def cases() -> list[Case]:
    return [
        _case("uneven", "channels_last", (5, 3)),
        _case("uneven", "channels_last_3d", (3, 2, 4)),
        _case("grad-contiguous", "channels_last", (4, 4), grad_fmt="contiguous"),
        _case("grad-contiguous", "channels_last_3d", (2, 3, 2), grad_fmt="contiguous"),
        _case("grad-channels-last", "contiguous", (4, 4), grad_fmt="channels_last"),
        _case("channels-67", "channels_last", (6, 5), channels=67),
        _case("channels-130", "channels_last", (3, 3), channels=130, batch_sizes=(2, 1)),
        _case("empty-rank", "channels_last", (4, 3), batch_sizes=(0, 3)),
        _case("half", "channels_last", (4, 3), dtype="float16"),
        _case("bfloat16-3d", "channels_last_3d", (2, 2, 3), dtype="bfloat16", grad_fmt="contiguous"),
        _case("spatial-1x1", "channels_last", (1, 1), batch_sizes=(3, 4)),
    ]
