"""script: SyncBN layers through ``torch.jit.script`` inside a network trained as usual.

Catches: a SyncBN that cannot be scripted (torch's, pytorch#69972), and a
scripted layer that computes differently from the eager one or stops
synchronizing. TorchScript is
deprecated, so an implementation may declare it unsupported; one that accepts
it is judged like any model case (a scripted layer must compute what the
eager one does, and still synchronize).
"""

from harness.catalog.case import Case

FAMILY = "script"


def cases() -> list[Case]:
    out = []
    for net, wraps in (("cnn", (("local", ()), ("ddp", ("ddp",)))), ("bn-chain", (("local", ()),))):
        for wname, ddp in wraps:
            out.append(Case(id=f"{FAMILY}/{net}/{wname}/ws2", family=FAMILY, batch_sizes=(3, 5),
                            spatial=((4, 4),) * 2, channels=3, scenario="model", model=net,
                            optimizer="sgd" if ddp else None,  # an optimizer steps one network: DDP's
                            ddp=ddp, steps=("train", "train", "eval"), use="script"))
    return out
