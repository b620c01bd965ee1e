"""Metric names: built and read by one type, and every name a real run writes reads back as itself."""

from __future__ import annotations

import pytest

from harness.judge.metric_key import MetricKey, step_key, sum_key


@pytest.mark.parametrize("name, key", [
    ("rank1.step2.train.running_var", MetricKey("running_var", step=2, phase="train", rank=1)),
    ("rank0.step0.eval.output.across_ranks", MetricKey("output", step=0, phase="eval", rank=0, across_ranks=True)),
    ("step3.grad_weight_sum", MetricKey("grad_weight_sum", step=3)),
    ("rank0.step1.train.grad.stages.0.0.weight", MetricKey("grad.stages.0.0.weight", step=1, phase="train", rank=0)),
    ("rank1.convert.00", MetricKey("convert.00", rank=1)),
    ("rank0.revert.eval.output", MetricKey("revert.eval.output", rank=0)),
])
def test_names_and_keys_are_one_to_one(name, key):
    assert MetricKey.parse(name) == key and str(key) == name


def test_what_readers_take_from_a_key():
    summed = MetricKey.parse(sum_key(0, "grad_bias"))
    assert summed.summed and summed.quantity == "grad_bias" and summed.kind == "grad_bias_sum"
    model = MetricKey.parse("rank2.step3.eval.1.running_mean")
    assert model.leaf == "running_mean" and model.kind == "eval.1.running_mean" and model.order == 3
    assert MetricKey.parse("rank0.convert.3").kind == "convert" and MetricKey.parse("rank0.convert.3").order == 10**6
    assert step_key(1, "train", "output", across_ranks=True) == "step1.train.output.across_ranks"
    assert str(MetricKey.parse(step_key(1, "train", "output")).on_rank(4)) == "rank4.step1.train.output"


@pytest.mark.slow
def test_every_metric_name_of_a_real_run_reads_back_as_itself(tmp_path):
    """Layer, model and conversion cases with real ranks: each record's names round-trip through the key."""
    from harness.engine.plan import execute, make_plan
    from harness.selection import Selection

    selection = Selection(impls=("reference",), device="cpu",
                          case_patterns=("module-config/momentum-0.5/*", "conversion/nested/float32/uneven-3-5/*",
                                         "training-loop/two-forwards/float32-float32/uneven-3-5/*",
                                         "ddp/cnn-sgd/broadcast-buffers-True-default-plain/float32/ws2"))
    records, _ = execute(make_plan(selection, diagnose=False))
    names = {n for r in records for n in r.metrics}
    assert any(n.startswith("rank0.step0.train.grad.") for n in names)  # a model's dotted tensor names too
    assert all(str(MetricKey.parse(n)) == n for n in names)
