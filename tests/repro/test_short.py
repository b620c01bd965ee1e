"""The short repro: written for planted defects and a real torch defect, run where the harness is not.

Each file is written by ``syncbn-harness repro`` (which runs the case with the
harness first, to learn the symptom), or, for the planted defects, by the
function that command calls, in the test's own process (``write_here`` in
conftest.py); then it is run with ``python FILE`` in a
virtual environment that has torch and nothing else (its site-packages reach
torch's folder as a plain path, so no other install of that folder is
activated: ``import harness`` fails there, which the fixture checks). A file
must exit 1 for its defect and, with the import line changed to an
independent correct SyncBN (the control), exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cli_here import run_here

from harness.judge.mode import Mode
from harness.repro import Form

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")

# (planted defect in tests/support, a case that catches it, what the file must check)
PLANTED = [
    ("defects:BiasedRunningVar", "module-config/momentum-0.5/ws2", "running_var: expected"),
    ("defects:BatchesNotCounted", "module-config/momentum-0.5/ws2", "num_batches_tracked: expected"),
    ("defects:OutputInParamDtype", "mixed-precision/uneven/float16-float32/ws2", "output: dtype torch.float32"),
    ("defects:EmptyRankPoisons", "allgather-shape/empty-0-5/float32-float32/channels_last_3d/ws2",
     "values NaN/Inf"),
    ("defects:OutputLosesChannelsLast", "channels-last/uneven/channels_last/ws2", "contiguous in torch.channels_last"),
    ("defects:IgnoresProcessGroup", "process-group/pairs-01-23/ws4", "output: expected"),
    ("defects:WorldSizeBackward", "allgather-shape/uneven-2-6/float16-float32/contiguous/ws2",
     "grad_input: expected"),
    ("tmp_bn:DoubleWeightGrad", "allgather-shape/uneven-2-6/float16-float32/contiguous/ws2", "grad_weight: expected"),
    ("tmp_bn:SyncBatchNorm", "module-config/momentum-none-3-steps/ws2", "TypeError: momentum=None"),
]
CONTROL = "from textbook import TextbookSyncBN as SyncBatchNorm"

TMP_BN = '''
from textbook import TextbookSyncBN


class SyncBatchNorm(TextbookSyncBN):
    def forward(self, x):
        if self.momentum is None:
            raise TypeError("momentum=None is not supported")
        return super().forward(x)


class DoubleWeightGrad(TextbookSyncBN):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight.register_hook(lambda g: 2 * g)
'''


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory) -> str:
    """A venv's python that imports torch (the one installed here) and not the harness."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import torch

    Path(site, "torch_only.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")
    probe = subprocess.run([python, "-c", "import torch\ntry:\n import harness\nexcept ImportError:\n print('bare')"],
                           capture_output=True, text=True, cwd=venv, timeout=120)
    assert probe.stdout.strip() == "bare", probe.stdout + probe.stderr
    assert sysconfig.get_paths()["purelib"] != site
    return python


@pytest.fixture
def plugins(tmp_path) -> str:
    (tmp_path / "tmp_bn.py").write_text(TMP_BN)
    return f"{tmp_path}{os.pathsep}{SUPPORT}"


def write(case: str, impl: str, out: Path, pythonpath: str, *extra: str) -> subprocess.CompletedProcess:
    """``repro`` run in this process (tests/support/cli_here.py): the property is the file and what it says."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return run_here(["repro", case, "--impl", impl, "-o", str(out), *(extra or ("--no-verify",))], env=env)


def run_bare(python: str, path: Path, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    # torch's start_processes leaves an error file in the temporary folder for each rank that raised: the test's.
    tmp = path.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return subprocess.run([python, str(path)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=path.parent)


def assert_short_and_standalone(text: str) -> None:
    assert len(text.splitlines()) <= 185  # torch's demonstration, with stand-ins for its five CUDA ops, is the
    # longest (~182)
    assert not re.search(r"^\s*(import|from)\s+harness\b", text, re.M)
    assert not re.search(r"(^|[^A-Za-z0-9_.])/(tmp|root|home|work)/", text), "a machine path in the file"


@pytest.mark.slow(22)
@pytest.mark.parametrize("impl, case, shows", PLANTED, ids=[p[0].split(":")[-1] for p in PLANTED])
def test_short_repro_shows_the_defect_and_passes_once_fixed(impl, case, shows, plugins, bare_python, tmp_path,
                                                            write_here):
    path = tmp_path / "repro.py"
    assert write_here(case, impl, path, plugins).form is Form.SHORT
    text = path.read_text()
    assert_short_and_standalone(text)

    bad = run_bare(bare_python, path, plugins)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert shows in bad.stdout + bad.stderr
    assert "SYMPTOM SHOWS" in bad.stdout

    module, attr = impl.split(":")
    line = f"from {module} import {attr} as SyncBatchNorm" if attr != "SyncBatchNorm" else \
        f"from {module} import SyncBatchNorm"
    assert line in text
    path.write_text(text.replace(line, CONTROL))
    good = run_bare(bare_python, path, plugins)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "no symptom" in good.stdout


@pytest.mark.slow(18)
def test_torch_file_needs_a_gpu_and_its_cpu_demonstration_says_what_it_is(bare_python, tmp_path):
    """torch's own defect (an empty rank all_gathers a half row where the others send float32). The file that is
    evidence runs on CUDA only: here, without a GPU, it says so and exits 2, with no stand-in in it. The CPU
    demonstration is another file, labelled in its first line, that shows it through CPU stand-ins for torch's
    CUDA ops; the same layer with both ranks non-empty is the control."""
    evidence = tmp_path / "torch_empty_gpu.py"
    proc = write("mixed-precision/empty-rank/float16-float32/ws2", "torch", evidence, "", "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the file needs a GPU (exit 2 here, where there is none)" in proc.stdout, proc.stdout
    text = evidence.read_text()
    assert "stand_in" not in text and 'DEVICE = "cuda"\n' in text and "demonstration" not in text
    gpu = run_bare(bare_python, evidence)
    assert gpu.returncode == 2 and "OTHER: needs a GPU" in gpu.stdout, gpu.stdout + gpu.stderr

    path = tmp_path / "torch_empty.py"
    proc = write("mixed-precision/empty-rank/float16-float32/ws2", "torch", path, "", "--cpu-demo", "--no-verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = path.read_text()
    assert_short_and_standalone(text)
    assert text.split("\n")[1].startswith('"""CPU demonstration, not evidence of CUDA\'s behaviour: ')
    assert "cpu-emulation, not yet confirmed on CUDA" in text
    assert "SyncBatchNorm = torch.nn.SyncBatchNorm" in text and "def stand_in_cuda_ops" in text

    bad = run_bare(bare_python, path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "SYMPTOM SHOWS (crash)" in bad.stdout and "SIGABRT" in bad.stdout

    control = re.sub(r"STEP_SIZES = \[\[0, (\d+)\]\]", r"STEP_SIZES = [[3, \1]]", text)
    assert control != text
    path.write_text(control)
    good = run_bare(bare_python, path)
    assert good.returncode == 0, good.stdout + good.stderr


@pytest.mark.slow(11)
def test_a_share_only_difference_is_said_not_to_show(plugins, tmp_path):
    """Gradient shares averaged inside the layer: each rank's share is wrong but their sum (all DDP uses) is
    right, so the file, which checks the sum, does not show it, and the command says so after running it."""
    path = tmp_path / "avg.py"
    proc = write("allgather-shape/uneven-2-6/float16-float32/contiguous/ws2", "defects:GradWeightAveraged", path,
                 plugins, "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "observed mismatch" in proc.stdout
    assert "does NOT show it standalone (exit 0)" in proc.stdout


def test_the_short_form_refuses_what_it_cannot_state(tmp_path):
    """A case it cannot express gets a usage error naming --long, before anything runs."""
    env = {**os.environ, "PYTHONPATH": SUPPORT}
    proc = subprocess.run([sys.executable, "-m", "harness", "repro", "conversion/bn-act/float32/uneven-3-5/ws2",
                           "--impl", "torch", "-o", str(tmp_path / "x.py")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--long" in proc.stderr and "scenario" in proc.stderr
    assert not (tmp_path / "x.py").exists()


@pytest.mark.slow(20)
def test_a_file_written_to_a_relative_path_is_run_once_from_its_folder(plugins, tmp_path):
    """``-o sub/repro.py`` from another folder: the check run finds the file (it once named the folder twice)."""
    env = {**os.environ, "PYTHONPATH": plugins}
    (tmp_path / "sub").mkdir()
    proc = run_here(["repro", "module-config/momentum-0.5/ws2", "--impl", "defects:BiasedRunningVar", "-o",
                     "sub/repro.py"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "sub" / "repro.py").exists()
    assert "shows the symptom" in proc.stdout and "No such file" not in proc.stdout, proc.stdout


def test_running_a_file_to_check_it_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    """torch's start_processes leaves an error file in the temporary folder for each rank that raised (the
    symptom of many findings); the check run of a written file keeps its temporary files to itself."""
    from harness.repro.short import verify

    outer = tmp_path / "tmp"
    outer.mkdir()
    monkeypatch.setenv("TMPDIR", str(outer))
    path = tmp_path / "raises.py"
    path.write_text("import torch.multiprocessing as mp\n\n\ndef rank_main(rank):\n"
                    "    raise RuntimeError('rank raised')\n\n\n"
                    "if __name__ == '__main__':\n    mp.start_processes(rank_main, nprocs=1, start_method='fork')\n")
    proc = verify(path, timeout=120)
    assert proc.returncode == 1 and "rank raised" in proc.stderr, proc.stdout + proc.stderr
    assert not list(outer.iterdir())


def test_spatial_sizes_that_differ_between_ranks_need_the_long_form():
    """The short form concatenates the ranks' samples into one batch for nn.BatchNorm: one spatial size only."""
    from harness.impls.registry import resolve
    from harness.repro.short import unexpressible
    from harness.search import space

    torch_impl = resolve("torch")
    same = space.make_case(batch_sizes=(2, 3), spatial=((4, 4), (4, 4)), channels=3)
    assert unexpressible(same, torch_impl) is None
    per_rank = space.make_case(batch_sizes=(2, 3), spatial=((4, 4), (2, 3)), channels=3)
    assert "spatial sizes that differ between ranks" in unexpressible(per_rank, torch_impl)


def test_a_symptom_seen_on_cuda_gets_a_gpu_only_file_without_the_stand_ins(tmp_path):
    """torch's record is made here in cpu-emulation; its device is then set to cuda, standing in for a run on a
    GPU (there is none here): the file written from it must need a GPU and carry no CPU stand-ins."""
    from harness.repro import find_case, observe, write_short

    case = find_case("mixed-precision/empty-rank/float16-float32/ws2")
    record = observe(case, "torch", "cpu", timeout=120)
    assert record.status.value == "crash"
    record.device, record.backend, record.mode = "cuda", "gloo", Mode.NATIVE
    path = tmp_path / "gpu.py"
    write_short(case, "torch", record, path, verify=False)
    text = path.read_text()
    compile(text, str(path), "exec")
    assert_short_and_standalone(text)
    assert "stand_in_cuda_ops" not in text and 'DEVICE = "cuda"\n' in text
    assert "a GPU" in text and "see below without a GPU" not in text and "cpu-emulation" not in text
    assert "if not torch.cuda.is_available():" in text  # no GPU: says so and exits 2, no traceback
    assert len(text.splitlines()) < 130
