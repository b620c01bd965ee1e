"""detectron2's ``NaiveSyncBatchNorm`` (``stats_mode="N"``) with one upstream fix undone, as harness plugins.

- :class:`EmptyAssertUndone`: before 2612e4a9 (2020-03, "less naive SyncBN") the training forward asserted
  ``input.shape[0] > 0`` (detectron2#366: a worker with no image stops training); the fix made
  ``stats_mode="N"`` weigh each rank by its batch, an empty one included.
- :class:`EmptyGradUndone`: before 7c69c051 (2020-03, "Fix backward of new NaiveSyncBatchNorm") an empty rank's
  zero statistics did not depend on its input, so its backward never reached the all-reduce the other ranks wait
  in: a deadlock.
- :class:`Control`: the same plugin without edits, which passes where those fail.

Each is the installed class (detectron2, or the ``detectron2-layers`` repackaging: the adapter's
:func:`harness.impls.detectron2.locate`) with its ``forward`` recompiled from the installed source with the lines
as they were before the fix (:mod:`source_edits`). Run: ``PYTHONPATH=tests/support python -m harness run --impl
undone_detectron2:EmptyGradUndone --case 'allgather-shape/empty-0-5/*'``.
"""

from __future__ import annotations

from source_edits import edited_method

from harness.impls.detectron2 import locate

NaiveSyncBatchNorm = locate()[0].NaiveSyncBatchNorm

# The method's source, dedented: its body is indented by four spaces.
EMPTY_ASSERT = [["    B, C = input.shape[0], input.shape[1]\n",
                 "    assert input.shape[0] > 0, 'SyncBatchNorm does not support empty inputs'\n"
                 "    B, C = input.shape[0], input.shape[1]\n"]]
EMPTY_GRAD = [["            vec = vec + input.sum()  # make sure there is gradient w.r.t input\n", ""]]


class Control(NaiveSyncBatchNorm):
    """``NaiveSyncBatchNorm(stats_mode="N")`` behind SyncBatchNorm's constructor (it reduces over the whole world)."""

    name = "detectron2-n (as installed)"

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None):
        assert process_group is None, "NaiveSyncBatchNorm reduces over the default group"
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, stats_mode="N")


class EmptyAssertUndone(Control):
    """2612e4a9 undone: an empty batch is refused by an assertion."""

    name = "detectron2-n, 2612e4a9 undone"
    forward = edited_method(NaiveSyncBatchNorm, "forward", EMPTY_ASSERT)


class EmptyGradUndone(Control):
    """7c69c051 undone: an empty rank's statistics do not depend on its input."""

    name = "detectron2-n, 7c69c051 undone"
    forward = edited_method(NaiveSyncBatchNorm, "forward", EMPTY_GRAD)
