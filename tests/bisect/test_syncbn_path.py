"""SyncBN's path through compiled code: which compiled files make an overlay untestable, which only approximate.

Globs over real pytorch paths, and the two operator tables judged by entry over a real git repository.
"""

from __future__ import annotations

from harness.bisect.checkout import Checkout
from harness.bisect.overlay import classify
from harness.bisect.syncbn_path import ON_PATH, PathRule, changed_entries, glob_matches, is_compiled
from pytorch_repo import PytorchRepo

ON = ["aten/src/ATen/native/Normalization.cpp", "aten/src/ATen/native/cuda/Normalization.cuh",
      "aten/src/ATen/native/cpu/batch_norm_kernel.cpp", "aten/src/ATen/native/cudnn/BatchNorm.cpp",
      "aten/src/ATen/native/mkldnn/Normalization.cpp", "aten/src/ATen/native/batch_norm.h",
      "torch/csrc/distributed/c10d/ProcessGroupGloo.cpp", "torch/csrc/distributed/c10d/reducer.cpp",
      "torch/csrc/autograd/engine.cpp", "torch/csrc/autograd/functions/accumulate_grad.h",
      "aten/src/ATen/core/dispatch/Dispatcher.cpp", "aten/src/ATen/TensorIterator.cpp", "third_party/gloo",
      "tools/autograd/templates/Functions.cpp"]
OFF = ["aten/src/ATen/native/Linear.cpp", "torch/csrc/jit/passes/fuse_linear.cpp", "c10/core/Device.h",
       "aten/src/ATen/native/cuda/Blas.cpp", "torch/csrc/inductor/aoti_runtime/model.h", "third_party/fbgemm",
       "torchgen/gen.py", "caffe2/serialize/inline_container.cc"]

NATIVE_FUNCTIONS = """\
- func: linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor
  python_module: nn

- func: batch_norm_stats(Tensor input, float eps) -> (Tensor, Tensor)
  dispatch:
    CUDA: batch_norm_stats_cuda

- func: batch_norm_elemt(Tensor input, Tensor? weight, Tensor? bias, Tensor mean, Tensor invstd, float eps) -> Tensor
  dispatch:
    CUDA: batch_norm_elemt_cuda
"""
YAML = "aten/src/ATen/native/native_functions.yaml"


def test_the_built_in_path_holds_syncbn_kernels_c10d_autograd_and_the_core_not_the_rest():
    rule = PathRule()
    assert all(is_compiled(p) for p in ON + OFF)
    assert [p for p in ON if not rule.matches(p)] == []
    assert [p for p in OFF if rule.matches(p)] == []
    assert not is_compiled("torch/nn/modules/_functions.py") and classify("torch/nn/modules/_functions.py") == "python"
    # Case-insensitive; * crosses folders.
    assert glob_matches("aten/src/ATen/native/cuda/Normalization.cuh", "aten/*/NORMALIZATION*")
    # --on-path replaces the set; --strict puts every compiled file on it.
    only_linear = PathRule(("*Linear*",))
    assert only_linear.matches(OFF[0]) and not only_linear.matches(ON[0])
    assert all(PathRule(ON_PATH, strict=True).matches(p) for p in OFF)


def test_operator_tables_are_on_the_path_only_when_a_syncbn_operator_changes(tmp_path):
    repo = PytorchRepo(tmp_path / "pytorch")
    base = repo.commit("base", {YAML: NATIVE_FUNCTIONS})
    other = repo.commit("linear: a python_module", {YAML: NATIVE_FUNCTIONS.replace("python_module: nn",
                                                                                    "python_module: linalg")})
    dispatch = repo.commit("batch_norm_stats: CPU kernel", {YAML: NATIVE_FUNCTIONS.replace(
        "    CUDA: batch_norm_stats_cuda\n", "    CUDA: batch_norm_stats_cuda\n    CPU: batch_norm_stats_cpu\n")})
    rule, checkout = PathRule(), Checkout(repo.path)
    assert rule.on_path([YAML], checkout, base, other) == []
    assert rule.on_path([YAML], checkout, other, dispatch) == [f"{YAML} (batch_norm_stats)"]
    assert rule.on_path([YAML], checkout, base, dispatch) == [f"{YAML} (batch_norm_stats)"]
    assert PathRule(strict=True).on_path([YAML], checkout, base, other) == [YAML]
    # Entries added and removed count too.
    assert changed_entries("", NATIVE_FUNCTIONS, "- func:") == ["batch_norm_elemt", "batch_norm_stats", "linear"]


def test_the_readme_lists_every_built_in_glob():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## SyncBN's path"):]
    section = section[:section.index("\n## ", 1)]
    assert [g for g in ON_PATH if f"`{g}`" not in section] == []


def test_overlay_flags_out_of_place_or_malformed_are_usage_errors(tmp_path, capsys):
    from harness.commands import load_commands, main

    load_commands()
    repo = PytorchRepo(tmp_path / "pytorch")
    sha = repo.commit("base", {"README.md": "t\n"})
    other = repo.commit("docs", {"README.md": "t\nmore\n"})
    for args, msg in ((["--good", "torch==2.13.0", "--bad", "torch==2.14.1", "--strict"],
                       "--strict applies only to --overlay PATH or nightlies with --pytorch-repo"),
                      (["--good", "2026-10-01", "--bad", "2026-10-02", "--binary", "python=abc"],
                       "--binary applies only to --overlay PATH"),
                      (["--good", sha, "--bad", sha, "--overlay", str(repo.path)], "same commit"),
                      (["--good", sha, "--bad", other, "--overlay", str(repo.path), "--binary", "python"],
                       "--binary 'python' is not PYTHON=REV"),
                      (["--good", sha, "--bad", other, "--overlay", str(repo.path), "--binary", "python=nosuch"],
                       "--binary python=nosuch 'nosuch' is not a commit"),
                      (["--good", "HEAD", "--bad", "nosuch", "--overlay", str(repo.path)], "--bad 'nosuch'")):
        try:
            main(["bisect", *args])
        except SystemExit as exc:
            assert exc.code == 2, (args, capsys.readouterr().err)
        assert msg in capsys.readouterr().err, args
