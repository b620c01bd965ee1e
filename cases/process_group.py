"""process-group: SyncBN over process subgroups, and conversion of whole models.

Catches:
- a ``process_group`` ignored by the collective, so statistics are synchronized
  over the whole world instead of the subgroup (pytorch#38874, redone as
  pytorch#43861; mmcv#427; apex#90 added the argument);
- the world size taken from the default group instead of the subgroup;
- a collective issued in a group of one process, where there is nothing to
  synchronize (torch's ``need_sync`` is ``world_size > 1``; ``>= 1`` would
  gather from itself): every rank's collectives are checked, and an empty
  batch alone in its group is the case where such a gather changes results;
- an empty rank in a subgroup of two: its forward and backward must still join
  its group's collectives, not the default group's (the backward's all_reduce
  that unblocks the peers of an empty rank, pytorch#36382's path, given the
  default group hangs or mixes the subgroups); with ``--exhaustive``, a
  network fed data (no input gradient) with an empty rank: every rank must
  agree on whether backward's all_reduce runs;
- ``convert_sync_batchnorm`` (or apex's ``convert_syncbn_model``) on a nested
  model that resets ``requires_grad`` (pytorch#22569), drops the training flag
  of a module in eval mode (pytorch#111998), loses parameters or buffers, or
  forgets the process group on nested layers (apex#94).
"""

from harness.catalog.case import Case

FAMILY = "process-group"


def cases() -> list[Case]:
    subgroups = [
        Case(id=f"{FAMILY}/pairs-01-23/ws4", family=FAMILY, batch_sizes=(2, 3, 4, 1),
             spatial=((3, 3),) * 4, groups=((0, 1), (2, 3))),
        Case(id=f"{FAMILY}/pairs-02-13/ws4", family=FAMILY, batch_sizes=(1, 4, 2, 3),
             spatial=((2, 3),) * 4, groups=((0, 2), (1, 3)), steps=("train", "train")),
        Case(id=f"{FAMILY}/split-0-12/ws3", family=FAMILY, batch_sizes=(4, 2, 3),
             spatial=((3, 2),) * 3, groups=((0,), (1, 2))),
        Case(id=f"{FAMILY}/split-empty-0-12/ws3", family=FAMILY, batch_sizes=(0, 2, 3),
             spatial=((3, 2),) * 3, groups=((0,), (1, 2)), steps=("train", "train", "eval")),
        Case(id=f"{FAMILY}/pairs-empty-01-23/ws4", family=FAMILY, batch_sizes=(0, 3, 2, 4),
             spatial=((2, 3),) * 4, groups=((0, 1), (2, 3)), steps=("train", "train")),
    ]
    # Its twin on torch's non-gloo path (nccl-contract): the flat all_gather over the subgroup.
    return subgroups + [subgroups[-1].on_backend("nccl-contract")] + [
        Case(id=f"{FAMILY}/convert-nested/ws2", family=FAMILY, batch_sizes=(3, 2), spatial=((4, 3),) * 2,
             model="nested", steps=("train", "eval")),
        Case(id=f"{FAMILY}/convert-nested-subgroup/ws4", family=FAMILY, batch_sizes=(2, 1, 3, 2),
             spatial=((3, 3),) * 4, groups=((0, 1), (2, 3)), model="nested"),
        Case(id=f"{FAMILY}/convert-nested-1d/ws2", family=FAMILY, batch_sizes=(4, 3), spatial=((),) * 2,
             model="nested", affine=True, momentum=None, steps=("train", "train")),
        # SyncBN the network's first layer, its input data: only with --exhaustive (or by its ID), since a
        # training defect that search must find alone fails it (tests/support/training_defects.py, SEARCH_ONLY).
        Case(id=f"{FAMILY}/data-input-empty-rank/ws3", family=FAMILY, batch_sizes=(0, 3, 2), spatial=((4, 4),) * 3,
             channels=3, scenario="model", model="bn-first", options=("data-input",), steps=("train", "train"),
             default=False),
    ]
