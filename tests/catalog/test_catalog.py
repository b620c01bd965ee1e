"""The catalog's shape: families, stable IDs and data, the selection rule, the covering subset."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import catalog
from harness.catalog.case import Case
from harness.catalog.data import materialize
from harness.catalog.covering import covers_all_pairs, pairwise
from harness.errors import UsageError

FAMILIES = {"allgather-shape", "mixed-precision", "channels-last", "module-config", "process-group", "numerics",
            "training-loop", "ddp", "scale", "search", "degenerate", "validation", "activation-checkpoint",
            "double-backward", "autocast", "script", "join", "no-group", "inference"}
ROOT = Path(__file__).resolve().parents[2]

# The first input values and weights of two cases, as generated when these cases were written. A case's data
# must never change (a store's records of it would silently mean something else): not with catalog order, not
# with the rest of the catalog, not with a refactor of how seeds are made.
GOLDEN = {
    "numerics/offset-1e3/ws2": (395307560, [1001.6117553710938, 1000.7081909179688, 1001.153076171875],
                                [0.406803697347641, 1.4194176197052002, -1.4254990816116333]),
    "allgather-shape/uneven-2-6/float16-float32/channels_last/ws2": (
        685145515, [-1.251953125, -1.55859375, -1.1103515625],
        [-0.8599808812141418, 1.4168899059295654, 0.262135773897171]),
}


def test_every_named_family_exists_with_a_docstring_naming_defects():
    fams = catalog.families()
    assert FAMILIES <= set(fams)
    for name, mod in fams.items():
        assert mod.__doc__ and "Catches" in mod.__doc__, name
        assert any(c.isdigit() for c in mod.__doc__), f"{name}: no upstream issue number in its docstring"


def test_ids_are_unique_and_prefixed():
    cases = catalog.all_cases()
    assert len({c.id for c in cases}) == len(cases)
    for c in cases:
        assert c.id.split("/")[0] == c.family
        if c.family == "search":  # promoted search findings keep the search's IDs: .../ws<n>-<parameters' digest>
            assert re.search(rf"/ws{c.world_size}-[0-9a-f]{{8}}$", c.id), c.id
        else:
            assert c.id.endswith(f"/ws{c.world_size}" + (f"/{c.backend}" if c.backend else ""))


@pytest.mark.parametrize("case_id", sorted(GOLDEN))
def test_a_cases_data_never_changes(case_id):
    seed, first_inputs, first_weights = GOLDEN[case_id]
    in_catalog = next(c for c in catalog.all_cases() if c.id == case_id)
    alone = catalog.select([case_id])[0]
    # Rebuilt from its fields alone, outside the catalog, with its seed left to be derived from the ID.
    fields = {k: v for k, v in in_catalog.to_dict().items() if k != "seed"}
    rebuilt = Case.from_dict(fields)
    for case in (in_catalog, alone, rebuilt):
        assert case.seed == seed
        data = materialize(case)
        assert data.inputs[0][0].flatten()[:3].double().tolist() == first_inputs
        assert data.weight[:3].double().tolist() == first_weights


def test_matrix_crosses_dtypes_layouts_formats_and_world_sizes():
    full = [c for c in catalog.select(exhaustive=True) if c.family == "allgather-shape" and c.id.count("/") == 4]
    default = [c for c in full if c.default]
    assert len(full) == 8 * 6 * 3
    assert {c.world_size for c in default} == {2, 3, 4}
    factors = [sorted({c.id.split("/")[1] for c in full}), sorted({c.id.split("/")[2] for c in full}),
               sorted({c.memory_format for c in full})]
    rows = [(c.id.split("/")[1], c.id.split("/")[2], c.memory_format) for c in default]
    assert covers_all_pairs(rows, factors)
    assert len(default) < len(full) / 2
    assert any(0 in c.batch_sizes for c in default) and any(set(c.batch_sizes) == {1} for c in default)
    assert {"float16", "bfloat16", "float32", "float64"} <= {c.dtype for c in default}


def test_the_second_backend_meets_every_layout_dtype_and_format_by_default():
    twins = [c for c in catalog.select(exhaustive=True) if c.family == "allgather-shape" and c.id.count("/") == 5]
    full = [c for c in twins if c.backend == "nccl-contract"]
    assert len(full) == 8 * 6 * 3 and {c.backend for c in twins} == {"nccl-contract", "list-contract"}
    default = [c for c in full if c.default]
    for i in (1, 2, 3):
        assert {c.id.split("/")[i] for c in default} == {c.id.split("/")[i] for c in full}
    assert len(default) <= 8
    # The list-only backend has a twin of each of those and no other, one of them default.
    listed = [c for c in twins if c.backend == "list-contract"]
    assert sum(c.default for c in listed) == 1
    assert sorted(c.id.rsplit("/", 1)[0] for c in listed) == sorted(c.id.rsplit("/", 1)[0] for c in default)
    # Each twin is the same data as a default run-backend case, so a difference between the two is the backend's.
    gloo = {c.id: c for c in catalog.select()}
    for c in default + listed:
        twin = gloo[c.id.rsplit("/", 1)[0]]
        assert twin.seed == c.seed and twin.batch_sizes == c.batch_sizes


def factor_of(c):
    return tuple(c.id.split("/")[1:4])


@pytest.mark.parametrize("family", ["training-loop", "ddp"])
def test_new_families_default_to_a_pairwise_covering_of_their_product(family):
    full = [c for c in catalog.select(exhaustive=True) if c.family == family]
    default = [c for c in full if c.default]
    assert len(default) <= len(full) / 3
    if family == "training-loop":
        rows = [factor_of(c) for c in full if c.default]
        factors = [sorted({r[i] for r in map(factor_of, full)}) for i in range(3)]
        assert covers_all_pairs(rows, factors)
    else:
        from harness.cases import ddp

        flags = [set(c.ddp) for c in default]
        assert {c.model for c in default} == {"cnn", "resblock"} and {c.optimizer for c in default} == {"sgd", "adam"}
        for f in ("broadcast_buffers=False", "forward_sync_buffers=False", "static_graph", "find_unused_parameters",
                  "gradient_as_bucket_view", "bucket_cap_mb=0.0001", "no_sync=2", "checkpoint-rank0"):
            assert any(f in s for s in flags), f
        assert all(c.steps.count("train") >= ddp.STEPS for c in full)


def test_affine_parameters_are_not_ones_and_zeros():
    data = materialize(catalog.select(["module-config/input-3d/ws2"])[0])
    assert (data.weight < 0).any() and (data.weight > 0).any()
    assert not bool((data.weight == 1).all()) and not bool((data.bias == 0).all())


@pytest.mark.parametrize("sizes", [(2, 2), (3, 4, 2), (7, 6, 3), (2, 3, 4, 5)])
def test_pairwise_covers_every_pair_with_few_rows(sizes):
    factors = [list(range(n)) for n in sizes]
    rows = pairwise(factors)
    product = list(itertools.product(*factors))
    assert covers_all_pairs(rows, factors)
    assert set(rows) <= set(product) and len(set(rows)) == len(rows)
    # No covering array is smaller than the two largest factors' product; a useful one is far below the full one.
    a, b = sorted(sizes)[-2:]
    assert a * b <= len(rows) <= max(a * b, len(product) // 2)
    assert rows == pairwise(factors)  # deterministic
    # Dropping any row loses a pair: each row is there for a reason (greedy, not padded).
    missing_one = [r for r in rows if not covers_all_pairs([x for x in rows if x != r], factors)]
    assert len(missing_one) >= len(rows) // 2


def test_case_patterns_select_from_the_default_selection_unless_exhaustive():
    pattern = "allgather-shape/*"
    default = catalog.select([pattern])
    full = catalog.select([pattern], exhaustive=True)
    assert all(c.default for c in default)
    assert len(full) > len(default) and any(not c.default for c in full)


def test_an_exact_case_id_selects_that_case_even_outside_the_default_selection():
    extra = next(c for c in catalog.all_cases() if not c.default)
    assert [c.id for c in catalog.select([extra.id])] == [extra.id]


def test_a_pattern_of_only_non_default_cases_says_to_add_exhaustive():
    extra = next(c for c in catalog.all_cases() if not c.default)
    pattern = extra.id[:-1] + "?"
    if any(c.default for c in catalog.select([pattern], exhaustive=True)):
        pytest.skip("the pattern also matches a default case")
    with pytest.raises(UsageError, match="--exhaustive"):
        catalog.select([pattern])


def test_world_size_that_leaves_nothing_names_the_world_sizes_there_are():
    with pytest.raises(UsageError, match=r"--world-size 7 leaves no case: the selected cases have world sizes 2, 3, 4"):
        catalog.select(["allgather-shape/*"], world_sizes=[7])
    assert {c.world_size for c in catalog.select(["allgather-shape/*"], world_sizes=[3])} == {3}


def test_unknown_pattern_names_the_families():
    with pytest.raises(UsageError, match="matches no case: IDs start with one of allgather-shape"):
        catalog.select(["nosuch/*"])


@pytest.mark.sweep(30)
@pytest.mark.slow
def test_pytest_collects_and_runs_cases_with_xdist_and_junit(tmp_path):
    """`pytest cases/ -n 2 --junitxml` with real pools per worker; a known issue is an xfail."""
    junit = tmp_path / "cases.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "cases"), "-n", "2", "-p", "no:cacheprovider", "-q",
         "--impl", "reference", "--impl", "torch", "--case", "mixed-precision/empty-rank/float16-float32/ws2",
         "--case", "channels-last/uneven/*", f"--junitxml={junit}"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "5 passed, 1 xfailed" in proc.stdout
    xml = junit.read_text()
    assert 'name="test_case[channels-last/uneven/channels_last_3d/ws2-reference]"' in xml


def test_a_case_drawn_per_rank_makes_one_rank_alone_and_the_same_tensors():
    """``materialize(case, ranks=[r])`` of a case drawn per rank is rank r's part of the whole case, bit for bit;
    the others' entries are None. A sequential case refuses, naming why."""
    from harness.search import space

    case = space.make_case(batch_sizes=(2, 0, 3), spatial=((3,), (3,), (3,)), channels=4, steps=("train", "train"),
                           step_batch_sizes=((2, 0, 3), (1, 4, 2)), seed=9)
    assert case.draws == "per-rank"
    whole = materialize(case)
    for r in range(3):
        alone = materialize(case, ranks=[r])
        for s in range(2):
            assert torch.equal(alone.inputs[s][r], whole.inputs[s][r])
            assert torch.equal(alone.grad_outputs[s][r], whole.grad_outputs[s][r])
            assert all(alone.inputs[s][q] is None for q in range(3) if q != r)
        assert torch.equal(alone.weight, whole.weight)
    sequential = space.make_case(**{**space.parameters(case), "draws": "sequential"})
    with pytest.raises(ValueError, match="drawn in sequence"):
        materialize(sequential, ranks=[0])
    with pytest.raises(ValueError, match="draws must be one of"):
        space.make_case(**{**space.parameters(case), "draws": "parallel"})


def test_the_catalogs_cases_are_drawn_in_sequence():
    """Their data never changes under their stored records: only search's new cases are drawn per rank."""
    assert {c.draws for c in catalog.all_cases()} == {"sequential"}


def test_a_rank_removed_leaves_the_others_data_as_it_was():
    """Search's shrinking removes ranks: in a case drawn per rank the remaining ranks keep their generators."""
    from harness.search import space

    case = space.make_case(batch_sizes=(0, 3, 2), spatial=((2,),) * 3, channels=3, seed=4)
    smaller = space.without_rank(case, 0)
    assert smaller.rank_seeds == case.seeds_of_ranks()[1:]
    big, small = materialize(case), materialize(smaller)
    for r in (1, 2):
        assert torch.equal(big.inputs[0][r], small.inputs[0][r - 1])
        assert torch.equal(big.grad_outputs[0][r], small.grad_outputs[0][r - 1])
    with pytest.raises(ValueError, match="one seed per rank"):
        space.make_case(**{**space.parameters(case), "rank_seeds": (1, 2)})


def test_a_case_without_bias_has_a_zero_bias_and_otherwise_the_data_of_its_twin_with_one():
    """bias=False (a weight, no bias) changes only the data's bias, to what the missing bias adds: 0."""
    from dataclasses import replace

    case = catalog.select(["module-config/bias-off/ws2"])[0]
    assert not case.bias and case.params()["bias"] is False
    without, with_bias = materialize(case), materialize(replace(case, bias=True, seed=case.seed))
    assert bool((without.bias == 0).all()) and not bool((with_bias.bias == 0).all())
    assert torch.equal(without.weight, with_bias.weight) and torch.equal(without.running_var, with_bias.running_var)
    assert all(torch.equal(a, b) for sa, sb in zip(without.inputs, with_bias.inputs) for a, b in zip(sa, sb))
    convert = [c for c in catalog.select(["conversion/*"], exhaustive=True) if "no-bias" in c.id]
    assert convert and all(not c.bias for c in convert)  # so an implementation without the keyword is unsupported


def test_upstream_gradients_are_scaled_and_shifted_as_the_case_says():
    """``grad_scale * (grad_mean + N(0, 1))``: the same normals, a loss scaler's gradients (pytorch#195701)."""
    from dataclasses import replace

    plain = Case(id="mixed-precision/probe/ws2", family="mixed-precision", batch_sizes=(2, 3),
                 spatial=((4, 4),) * 2, dtype="float64", param_dtype="float64")
    scaled = replace(plain, grad_mean=1.0, grad_scale=64.0)
    a, b = materialize(plain), materialize(scaled)
    for ga, gb, xa, xb in zip(a.grad_outputs[0], b.grad_outputs[0], a.inputs[0], b.inputs[0]):
        assert torch.equal(xa, xb) and torch.equal((ga + 1.0) * 64.0, gb)
    assert scaled.params()["grad_scale"] == 64.0 and plain.params()["grad_mean"] == 0.0


def test_the_no_group_layers_cover_every_pair_but_half_input_with_momentum_none():
    """A pairwise covering of (configuration, dtypes, input) by default, one rank and no process group each; the
    pair (momentum=None, half input) is in no case at all (search_defects.HalfInputCumulativeAverage is search's)."""
    full = [c for c in catalog.select(["no-group/layer/*"], exhaustive=True)]
    assert all(c.world_size == 1 and c.backend == "no-group" for c in full)
    assert not [c.id for c in full if c.momentum is None and c.dtype == "float16"]
    rows = [tuple(c.id.split("/")[2:5]) for c in full]
    factors = [sorted({r[i] for r in rows}) for i in range(3)]
    default = [tuple(c.id.split("/")[2:5]) for c in full if c.default]
    allowed = {(i, r[i], j, r[j]) for r in rows for i, j in itertools.combinations(range(3), 2)}
    covered = {(i, r[i], j, r[j]) for r in default for i, j in itertools.combinations(range(3), 2)}
    assert covered == allowed and len(default) <= len(rows) / 2 and len(factors[1]) == 3


def test_a_layer_as_built_has_the_constructors_values_and_a_setup_is_for_layer_cases_only():
    from dataclasses import replace

    case = catalog.select(["module-config/as-built/ws2"])[0]
    data, copied = materialize(case), materialize(replace(case, setup="copied", seed=case.seed))
    assert bool((data.weight == 1).all()) and bool((data.bias == 0).all())
    assert bool((data.running_mean == 0).all()) and bool((data.running_var == 1).all())
    assert all(torch.equal(a, b) for sa, sb in zip(data.inputs, copied.inputs) for a, b in zip(sa, sb))
    with pytest.raises(ValueError, match="'bogus'"):
        replace(case, setup="bogus")
    with pytest.raises(ValueError, match="layer case only"):
        replace(case, setup="factory", scenario="model", model="cnn")
    with pytest.raises(ValueError, match="track_running_stats=True"):
        replace(case, setup="stats-off-after", track_running_stats=False)
