"""The command line: flags, usage errors with the valid choices, output people read, exit codes.

Flags are checked through the real entry point (in process, or as a subprocess where a run starts rank
processes); every flag named in ``run``'s and ``check``'s contract is exercised here at least once.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_here import run_here
from correct_budget import CORRECT_USE_AT_MOST
from click.testing import CliRunner

from harness import catalog
from harness.commands import cli, load_commands, main
from harness.judge.metric import Metric
from harness.results.console import format_ratio, print_table
from harness.judge.status import Status
from harness.results.records import Record

load_commands()

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
RECORD_KEYS = {"schema_version", "case", "family", "params", "impl", "impl_version", "mode", "status",
               "message", "ranks", "metrics", "torch_version", "torch_git_version", "cuda_version", "device",
               "backend", "world_size", "duration_s", "started_at", "host"}
PARAM_KEYS = {"dtype", "param_dtype", "memory_format", "ndim", "batch_sizes", "world_size", "affine",
              "track_running_stats", "momentum", "steps"}
KNOWN_CASE = "mixed-precision/empty-rank/float16-float32/ws2"


def _main(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def _env(**extra) -> dict:
    """This environment with ``extra``, the support modules (probes, defects) first on ``PYTHONPATH``."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SUPPORT, env.get("PYTHONPATH")]))
    return env


def harness(*args, env=None, timeout=600, **kw):
    """``python -m harness ARGS`` in a subprocess: for what the process does (its exit path, its temporary
    folder, what it leaks, check's exit codes)."""
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=timeout,
                          env=_env(**(env or {})), **kw)


def here(*args, cwd=None):
    """The command in this process (tests/support/cli_here.py): for what the command says and writes."""
    return run_here(args, env=_env(), cwd=cwd)


# --- usage errors -----------------------------------------------------------------------------------------------

def test_unknown_impl_lists_the_valid_ones(capsys):
    code, _, err = _main(["run", "--impl", "apx", "--case", "allgather-shape/*"], capsys)
    assert code == 2
    assert "unknown impl 'apx'" in err and "reference" in err and "MODULE:ATTR" in err


def test_unknown_case_pattern_lists_the_families(capsys):
    code, _, err = _main(["run", "--impl", "reference", "--case", "nosuch/*"], capsys)
    assert code == 2
    assert "nosuch/*" in err and "allgather-shape" in err and "list cases" in err


def test_bad_option_values_are_usage_errors(capsys):
    code, _, err = _main(["run", "--device", "tpu"], capsys)
    assert code == 2 and "tpu" in err
    code, _, err = _main(["run", "--impl", "reference", "--device", "cpu", "--backend", "nccl"], capsys)
    assert code == 2 and "--backend nccl needs --device cuda" in err
    code, _, err = _main(["run", "--impl", "reference", "--world-size", "9"], capsys)
    assert code == 2 and "--world-size 9 leaves no case" in err and "world sizes 1, 2, 3, 4" in err
    code, _, err = _main(["run", "--compare", "torch"], capsys)
    assert code == 2 and "--compare 'torch'" in err


# --- list and env -----------------------------------------------------------------------------------------------

def test_list_cases_json_has_ids_families_and_params():
    result = CliRunner().invoke(cli, ["list", "cases", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["id"] for r in rows] == [c.id for c in catalog.select()]
    assert {"allgather-shape", "mixed-precision", "channels-last", "module-config", "process-group",
            "numerics"} <= {r["family"] for r in rows}
    for r in rows:
        assert r["id"].startswith(r["family"] + "/") and PARAM_KEYS <= set(r["params"])


@pytest.mark.parametrize("flags", [["--case", "allgather-shape/*"], ["--case", "allgather-shape/*", "--exhaustive"],
                                   ["--world-size", "3"], ["--exhaustive", "--world-size", "4"]])
def test_list_cases_previews_exactly_what_run_would_select(flags):
    result = CliRunner().invoke(cli, ["list", "cases", "--format", "json", *flags])
    assert result.exit_code == 0, result.output
    pats = [flags[i + 1] for i, f in enumerate(flags) if f == "--case"]
    sizes = [int(flags[i + 1]) for i, f in enumerate(flags) if f == "--world-size"]
    expected = catalog.select(pats, exhaustive="--exhaustive" in flags, world_sizes=sizes)
    assert [r["id"] for r in json.loads(result.output)] == [c.id for c in expected]


def test_list_tables_size_their_columns_to_the_content():
    result = CliRunner().invoke(cli, ["list", "cases", "--case", "numerics/*"])
    lines = [ln for ln in result.output.splitlines() if ln and not ln.endswith(" cases")]
    widest_id = max(len(c.id) for c in catalog.select(["numerics/*"]))
    assert all(line.index(" ws") if line.startswith("case") else True for line in lines)
    assert lines[0].startswith("case" + " " * (widest_id - 4 + 2) + "ws")  # the id column is as wide as the ids
    impls = CliRunner().invoke(cli, ["list", "impls"])
    assert impls.exit_code == 0 and impls.output.splitlines()[0].split() == ["impl", "version", "mode", "state"]


def test_env_reports_the_build():
    import torch

    result = CliRunner().invoke(cli, ["env", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["torch"] == torch.__version__ and data["torch_git_version"] == torch.version.git_version
    assert "gloo" in data["backends"]
    from harness.impls.apex import probe

    assert data["apex"] == probe().text


# --- what a run prints ------------------------------------------------------------------------------------------

def _record(case, status, impl="reference", message="", ratio=None, known=None):
    metrics = {} if ratio is None else {"rank0.step0.train.output": Metric(1.0, 1.0, 1e-6, ratio)}
    return Record(case=case, family=case.split("/")[0], params={}, impl=impl, status=status, message=message,
                  metrics=metrics, known_issue=known)


def test_ratios_are_compact_and_failures_come_first():
    assert [format_ratio(x) for x in (None, 0.03125, 938.2, 177457438516.208, float("inf"))] == \
        ["-", "0.0312", "938", "1.77e+11", "inf"]
    from harness.results.records import KnownIssueMatch

    known = KnownIssueMatch(link="https://x.invalid/1", expected=("crash",), matched=True)
    lines = []
    print_table([_record(KNOWN_CASE, Status.CRASH, impl="torch", message="rank 0: crash", known=known),
                 _record("numerics/a/ws2", Status.MISMATCH, message="rank 0: mismatch", ratio=177457438516.208)],
                echo=lines.append)
    text = "\n".join(lines)
    assert "1.77e+11" in text and "177457438516" not in text
    assert text.index("unexpected (1):") < text.index("numerics/a/ws2") < text.index("known issues (1 records")
    assert KNOWN_CASE not in text  # a known failure is counted under its issue, not listed


def test_an_implementation_that_is_not_installed_is_said_once_wrapped():
    reason = "apex not installed (" + "a long install advice, " * 20 + "the end of the sentence)"
    records = [_record(f"numerics/c{i}/ws2", Status.SKIPPED, impl="apex", message=reason) for i in range(50)]
    records += [_record("numerics/c0/ws2", Status.PASS)]
    lines = []
    print_table(records, echo=lines.append)
    assert " ".join(ln.strip() for ln in lines).count(f"apex: 50 skipped: {reason}") == 1
    assert all(len(ln) <= 100 for ln in lines), [ln for ln in lines if len(ln) > 100]
    assert not any("numerics/c1/ws2" in ln for ln in lines)


def test_known_failures_are_one_entry_per_issue_and_verbose_lists_them():
    from harness.results.records import KnownIssueMatch

    known = KnownIssueMatch(link="https://x.invalid/1", expected=("crash",), matched=True)
    records = [_record(f"{KNOWN_CASE}/{i}", Status.CRASH, impl="torch", message="rank 0: crash", known=known)
               for i in range(3)]
    lines = []
    print_table(records, echo=lines.append)
    entry = next(i for i, ln in enumerate(lines) if ln.strip().startswith("3 crash"))
    assert "torch: " + KNOWN_CASE.split("/")[0] in lines[entry] and lines[entry + 1].strip() == "https://x.invalid/1"
    assert lines[-1].startswith("3 records: 3 crash (known)")
    lines = []
    print_table(records, verbose=True, echo=lines.append)
    assert sum(KNOWN_CASE in ln for ln in lines) == 3 and sum("crash (known)  torch" in ln for ln in lines) == 3


def test_the_summary_fits_100_columns_with_ten_implementations():
    impls = [f"mypkg.syncbn_variant_{i}:SyncBatchNorm" for i in range(10)]
    families = ["allgather-shape", "mixed-precision", "training-loop"]
    statuses = [Status.PASS, Status.MISMATCH, Status.ERROR, Status.CRASH, Status.UNSUPPORTED]
    records = [_record(f"{f}/c{j}/ws2", statuses[j % 5], impl=i, message="m") for i in impls for f in families
               for j in range(12)]
    lines = []
    print_table(records, echo=lines.append)
    assert all(len(ln) <= 100 for ln in lines), max(lines, key=len)
    headers = [ln for ln in lines if ln.startswith("family ")]
    assert len(headers) > 1  # wrapped by implementation, whole columns
    assert sorted(name for h in headers for name in h.split()[1:]) == sorted(impls)
    assert sum(ln.startswith("allgather-shape ") for ln in lines) == len(headers)
    assert "3P 3M 2E 2C 2U" in next(ln for ln in lines if ln.startswith("mixed-precision "))


def test_a_command_run_here_leaves_the_test_process_as_it_was(tmp_path):
    """run_here (tests/support/cli_here.py) gives a command its environment, PYTHONPATH and folder for the call
    only: the ranks see the call's environment, the plugin module is forgotten, the rest is restored."""
    (tmp_path / "hereplug.py").write_text(
        "import os\n\nfrom harness.impls.reference import SyncBatchNorm as _Ref\n\n\n"
        "class SyncBN(_Ref):\n    def forward(self, input):\n"
        "        assert os.environ['SYNCBN_TEST_HERE'] == 'seen', 'the rank has another environment'\n"
        "        return super().forward(input)\n")
    env, path, cwd = dict(os.environ), list(sys.path), os.getcwd()
    proc = run_here(["run", "--impl", "hereplug:SyncBN", "--case", "numerics/offset-1e3/ws2", "--device", "cpu",
                     "--store", "s", "--format", "json"],
                    env=dict(os.environ, SYNCBN_TEST_HERE="seen", PYTHONPATH=str(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert [r["status"] for r in json.loads(proc.stdout)] == ["pass"]
    assert (tmp_path / "s").is_dir()  # the relative store, in the call's folder
    assert dict(os.environ) == env and sys.path == path and os.getcwd() == cwd
    assert "hereplug" not in sys.modules


@pytest.mark.sweep(60)
@pytest.mark.slow
def test_run_reference_json_all_pass(tmp_path):
    """`run --impl reference --device cpu --format json` prints passing records with every contracted field."""
    proc = harness("run", "--impl", "reference", "--device", "cpu", "--format", "json", "--store", "/dev/null/x",
                   timeout=900)
    assert proc.returncode == 3 and "cannot be created" in proc.stderr  # the store is checked before any case runs
    # Outside the checkout, in a folder of the test's own: the default store ./results lands there.
    proc = harness("run", "--impl", "reference", "--device", "cpu", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(proc.stdout)
    assert sorted(r["case"] for r in records) == sorted(c.id for c in catalog.select())
    for r in records:
        assert RECORD_KEYS <= set(r) and PARAM_KEYS <= set(r["params"])
        if r["status"] == "unsupported":  # what the reference declares it cannot do: said, never run
            assert any(w in r["message"] for w in ("fullgraph", "double backward", "torch.jit.script")), r["message"]
            continue
        assert len(r["ranks"]) == r["world_size"]
        if (r["known_issue"] or {}).get("matched"):  # DDP's and checkpoint's own, met by every implementation
            assert r["family"] in ("ddp", "activation-checkpoint", "join"), r["case"]
            continue
        assert r["status"] == "pass", (r["case"], r["message"])
        assert r["metrics"] and all(m["ok"] for m in r["metrics"].values())
        # The full-product judgement leaves these cases to this run: the same bound as there.
        worst = max(m["ratio"] for m in r["metrics"].values() if not math.isnan(m["ratio"]))
        assert worst < CORRECT_USE_AT_MOST, (r["case"], worst)


@pytest.mark.slow
def test_run_flags_world_size_exhaustive_backend_and_junit(tmp_path):
    extra = next(c for c in catalog.all_cases() if not c.default and c.world_size == 3)
    pattern = extra.id.rsplit("/", 2)[0] + "/*"
    proc = here("run", "--impl", "reference", "--case", pattern, "--exhaustive", "--world-size", "3",
                "--backend", "gloo", "--device", "cpu", "--junit", str(tmp_path / "run.xml"), "--format", "json",
                "--store", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads(proc.stdout)
    expected = catalog.select([pattern], exhaustive=True, world_sizes=[3])
    # Records come pool by pool (world size, then backend: the nccl-contract twins after the gloo cases).
    assert sorted(r["case"] for r in records) == sorted(c.id for c in expected)
    assert extra.id in [r["case"] for r in records]
    assert {r["backend"] for r in records} == {"gloo"} and {r["world_size"] for r in records} == {3}
    suite = ET.parse(tmp_path / "run.xml").getroot()
    assert suite.get("tests") == str(len(records)) and suite.get("failures") == "0"
    assert {tc.get("name") for tc in suite.iter("testcase")} == {r["case"] for r in records}


@pytest.mark.slow
def test_run_compare_reports_the_differences_on_the_same_inputs(tmp_path):
    proc = here("run", "--impl", "torch", "--case", "numerics/offset-1e3/ws2", "--compare", "torch,reference",
                "--device", "cpu", "--format", "json", "--store", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {r["impl"]: r for r in json.loads(proc.stdout)}
    assert set(records) == {"torch", "reference"}  # --compare runs B too
    comp = records["torch"]["compare"]
    assert comp["with"] == "reference" and comp["error"] is None
    assert {"step0.train.output", "step0.train.grad_input", "step0.train.running_var"} <= set(comp["max_abs_diff"])
    assert all(0 <= v < 1e-2 for v in comp["max_abs_diff"].values())
    assert records["reference"]["compare"] is None


@pytest.mark.slow
def test_a_failing_run_says_how_to_write_a_repro(tmp_path):
    case = "allgather-shape/uneven-2-6/float32-float32/channels_last/ws2"
    proc = here("run", "--impl", "defects:EqualWeightMerge", "--case", case, "--device", "cpu",
                "--store", str(tmp_path / "s"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (f"to reproduce the first failure as a short standalone file:\n  syncbn-harness repro {case} "
            "--impl defects:EqualWeightMerge --device cpu -o repro.py") in proc.stdout


# --- check ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_check_says_a_known_failure_is_known():
    proc = harness("check", "--impl", "torch", "--case", KNOWN_CASE, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "crash as known (https://github.com/pytorch/pytorch/pull/74944)" in proc.stderr
    assert "check: 0 good, 0 bad, 1 failed as known issues (good)" in proc.stderr


def test_check_with_a_mistyped_flag_is_untestable_not_bad():
    proc = harness("check", "--impl", "reference", "--cases", "numerics/*", timeout=120)
    assert proc.returncode == 125, proc.stderr
    assert "the command line above is not valid" in proc.stderr and "skips this commit" in proc.stderr


@pytest.mark.parametrize("decoy", ["raise ImportError('libtorch_cpu.so: undefined symbol')", "import os; os.abort()"])
def test_check_of_a_torch_that_does_not_import_is_untestable(tmp_path, decoy):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(decoy + "\n")
    proc = harness("check", "--impl", "reference", "--case", "numerics/offset-1e3/ws2",
                   env={"PYTHONPATH": str(tmp_path)}, timeout=120)
    assert proc.returncode == 125, proc.stdout + proc.stderr
    assert "check: cannot test: importing torch" in proc.stderr
    assert ("SIGABRT" if "abort" in decoy else "undefined symbol") in proc.stderr


@pytest.mark.slow
def test_check_under_sigterm_is_untestable_and_leaves_no_rank(tmp_path):
    from proctools import alive, rank_processes, wait_until

    env = dict(os.environ, PYTHONPATH=SUPPORT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "harness", "check", "--impl", "probes:SleepOnRank1", "--case",
                             "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2", "--timeout", "600"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert wait_until(lambda: len(rank_processes(proc.pid)) == 2, timeout=120), "ranks did not start"
        ranks = rank_processes(proc.pid)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read().decode()
    assert code == 125, err
    assert "check: terminated; cannot test" in err
    assert wait_until(lambda: not any(alive(p) for p in ranks), timeout=5)


@pytest.mark.slow
def test_a_run_log_names_an_implementation_that_cannot_run_once(tmp_path):
    """Off a terminal, a skipped implementation is one line of the log, not one per case."""
    from harness.impls.apex import probe

    if probe().kind in ("fallback", "optimized"):
        pytest.skip("apex is installed here: its records run instead of being skipped")
    proc = here("run", "--impl", "apex", "--case", "numerics/*", "--device", "cpu", "--store", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    n = len(catalog.select(["numerics/*"]))
    assert proc.stderr.count("apex not installed") == 1, proc.stderr
    assert proc.stdout.count("apex not installed") == 1 and f"apex: {n} skipped: apex not installed" in proc.stdout


@pytest.mark.slow
def test_a_run_prints_within_100_columns_and_leaks_no_semaphore(tmp_path):
    """Layer families, a known crash and ranks that draw tqdm bars (as torch.fx and inductor do under compile:
    tqdm's lock was a semaphore no rank released): every stdout line fits 100 columns, the resource tracker
    finds nothing to clean up."""
    proc = harness("run", "--impl", "torch", "--impl", "probes:DrawsProgressBar", "--case", "module-config/*",
                   "--case", "mixed-precision/empty-rank/*", "--case", "channels-last/uneven/*", "--device", "cpu",
                   "--store", str(tmp_path / "s"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "known issues (" in proc.stdout and not any(ln.startswith("  crash (known)") for ln in lines)
    assert all(len(ln) <= 100 for ln in proc.stdout.splitlines()), proc.stdout
    assert "leaked semaphore" not in proc.stderr and "resource_tracker" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("command", [["report", "--out", "out"], ["diff", "a", "b"]])
def test_an_empty_store_is_a_usage_error_everywhere(tmp_path, command):
    (tmp_path / "empty").mkdir()
    proc = here(*command, "--store", str(tmp_path / "empty"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "holds no" in proc.stderr and "syncbn-harness run --store" in proc.stderr


def test_a_run_leaves_nothing_in_the_temporary_directory(tmp_path, own_cache):
    """A run with a pass and a crash: the temporary directory is left as it was found, the crash's rank logs are
    kept in the cache and named by its record."""
    tmp, cache = tmp_path / "tmp", own_cache
    tmp.mkdir()
    case = "allgather-shape/uneven-2-6/float32-float32/contiguous/ws2"
    proc = harness("run", "--impl", "reference", "--impl", "probes:SegfaultOnRank1", "--case", case,
                   "--device", "cpu", "--no-diagnose", "--format", "json", "--store", str(tmp_path / "store"),
                   env={"TMPDIR": str(tmp), "SYNCBN_HARNESS_CACHE": str(cache)})
    assert proc.returncode == 1 and proc.stdout.strip(), proc.stderr[-3000:]  # 1: the crash, not a traceback
    records = {r["impl"]: r for r in json.loads(proc.stdout)}
    assert records["reference"]["status"] == "pass" and records["reference"]["logs"] is None
    crash = records["probes:SegfaultOnRank1"]
    assert crash["status"] == "crash" and Path(crash["logs"]).parent == cache / "logs", crash["logs"]
    assert (Path(crash["logs"]) / "rank1.log").exists()
    assert not list(tmp.iterdir()), list(tmp.iterdir())
