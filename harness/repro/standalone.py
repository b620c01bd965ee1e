"""The launcher of a standalone repro file: a real module, imported and tested as one, copied into each file.

A repro file is the harness code a case needs (the case's data, the float64
oracle, the tolerances, the scenario's rank code, the adapter's calls), then
this module's code, then the file's configuration (the module globals below,
reassigned by :mod:`harness.repro`), then ``sys.exit(main())``. In the file
every ``harness`` import is gone: the names are defined above it.

It runs as ``python FILE`` (one spawned process per rank over a TCPStore on a
port the OS picks, every wait bounded) or under ``torchrun`` (one rank per
process). It exits 0 when the implementation agrees with the oracle, 1 with
the disagreement printed, 2 when it cannot run here (no GPU, wrong world
size).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import shutil
import sys
import tempfile
import time

import torch

from harness.catalog.case import NO_GROUP, Case
from harness.engine.collectives import install_recorder
from harness.engine.list_contract import LIST_NAME, register_list_contract
from harness.engine.nccl_contract import NAME, register
from harness.engine.messages import RankResult, Task
from harness.engine.rank import RankContext, run_task
from harness.impls.apex import apex_forward, construct_apex, convert_apex
from harness.impls.base import construct_like_syncbn
from harness.judge.status import RankStatus

# The file's configuration (the writer assigns these after this code).
CASE: Case = None  # type: ignore[assignment]
IMPL_NAME = ""
KIND = "plugin"  # plugin | torch | apex | reference: how the implementation is loaded
DEVICE = "cpu"
BACKEND = "gloo"
TIMEOUT_S = 300.0  # the whole case, every rank; then the ranks are killed and it is a hang
PLUGIN_MODULE = None
PLUGIN_ATTR = None
FOUND_IN = None  # where the plugin module was found when the file was written (a fallback on sys.path)
EMBEDDED = False  # True in a written file: the scenario's functions are this module's own


def scenario():
    """The module with the case's ``run_rank``/``judge_across``: this file itself once written."""
    if EMBEDDED:
        return sys.modules[__name__]
    return importlib.import_module(f"harness.scenarios.{CASE.scenario}")


def load_factory():
    """The implementation's class or factory, loaded as the harness loads it."""
    if KIND == "torch":
        return torch.nn.SyncBatchNorm
    if KIND == "apex":
        from apex.parallel import SyncBatchNorm

        return SyncBatchNorm
    if KIND == "reference":  # not standalone: the harness's own SyncBN needs the harness and its C++ kernels
        importlib.import_module("harness.kernels.extension").load()
        return importlib.import_module("harness.impls.reference").SyncBatchNorm
    try:
        mod = importlib.import_module(PLUGIN_MODULE)
    except ImportError:
        if not (FOUND_IN and os.path.isdir(FOUND_IN)):
            raise
        print(f"repro: {PLUGIN_MODULE} is not importable; using {FOUND_IN} (where it was found)", file=sys.stderr)
        sys.path.insert(0, FOUND_IN)
        mod = importlib.import_module(PLUGIN_MODULE)
    return getattr(mod, PLUGIN_ATTR)


class ReproImpl:
    """The implementation under test, in the shape the scenario's rank code expects of an adapter."""

    mode = "native"
    mode_notes = ()

    @property
    def name(self) -> str:
        return IMPL_NAME

    def version(self):
        mod = sys.modules.get(PLUGIN_MODULE) if PLUGIN_MODULE else None
        return getattr(mod, "__version__", None) if mod else torch.__version__

    def build(self, case, process_group, device):
        if KIND == "apex":
            return construct_apex(load_factory(), case, process_group)
        return construct_like_syncbn(load_factory(), case, process_group)

    def convert(self, model, process_group):
        if KIND == "apex":
            return convert_apex(model, process_group)
        return load_factory().convert_sync_batchnorm(model, process_group)

    def forward(self, module, input):
        if KIND == "apex":
            return apex_forward(module, input)
        return module(input)

    ddp_note = None

    def ddp_guard(self):
        """DistributedDataParallel wraps the model as it does for any user (nothing to get past here)."""
        return contextlib.nullcontext()

    def before_compile(self):
        """Nothing of this file's adapter runs from the dispatcher, so nothing to hide from dynamo."""

    def shipped(self, model):
        """Nothing of this file answers for the layers: they always run as shipped."""
        return contextlib.nullcontext()


class ReproContext(RankContext):
    """A rank's context whose only implementation is the one under test."""

    def impl(self, key, device):
        return ReproImpl()


def one_rank(rank: int, world_size: int) -> RankResult:
    install_recorder()
    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    task = Task(case=CASE.to_dict(), impl=IMPL_NAME, device=DEVICE)
    return run_task(ReproContext(rank, world_size), task, scenario=scenario())


def _rank_entry(rank: int, world_size: int, port: int, outdir: str) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if BACKEND != NO_GROUP:  # a case without a process group: torch.distributed stays uninitialized
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, False, timeout=timeout)
        if BACKEND == NAME:
            register()
        elif BACKEND == LIST_NAME:
            register_list_contract()
        dist.init_process_group(BACKEND, store=store, rank=rank, world_size=world_size, timeout=timeout)
    try:
        result = one_rank(rank, world_size)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(result.to_dict(), f)


def spawn_ranks() -> tuple[list[RankResult], list[str]]:
    """One process per rank (spawn), a TCPStore on a port the OS picks; every wait bounded."""
    import multiprocessing as mp

    import torch.distributed as dist

    ws = CASE.world_size
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    try:
        store = dist.TCPStore("127.0.0.1", 0, ws + 1, True, wait_for_workers=False, timeout=timeout)
    except TypeError:  # releases without wait_for_workers
        store = dist.TCPStore("127.0.0.1", 0, ws + 1, True, timeout=timeout)
    outdir = tempfile.mkdtemp(prefix="syncbn-repro-")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_entry, args=(r, ws, store.port, outdir), daemon=True) for r in range(ws)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S + 60
    problems = []
    for r, p in enumerate(procs):
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            problems.append(f"rank {r}: hang (still running after {TIMEOUT_S}s)")
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)
    results = []
    for r, p in enumerate(procs):
        path = os.path.join(outdir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(RankResult.from_dict(json.load(f)))
        elif not any(s.startswith(f"rank {r}:") for s in problems):
            problems.append(f"rank {r}: crash (exit code {p.exitcode}, no result)")
    shutil.rmtree(outdir, ignore_errors=True)  # the results are read: leave nothing behind
    return results, problems


def under_torchrun() -> bool:
    """Whether torchrun started this process: it sets all three. RANK and WORLD_SIZE alone may be left in the
    environment by something else (a job script), and would send the file to a rendezvous nobody serves."""
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


def torchrun_rank() -> tuple[list[RankResult], int]:
    import torch.distributed as dist

    ws = int(os.environ["WORLD_SIZE"])
    if ws != CASE.world_size:
        print(f"repro: this case needs {CASE.world_size} ranks, torchrun started {ws}: "
              f"use --nproc-per-node={CASE.world_size}", file=sys.stderr)
        sys.exit(2)
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if BACKEND == NO_GROUP:  # one process, no process group: torchrun's own is not joined
        return [one_rank(0, 1)], 0
    if BACKEND == NAME:
        register()
    elif BACKEND == LIST_NAME:
        register_list_contract()
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    result = one_rank(rank, ws)
    everyone = [None] * ws
    dist.all_gather_object(everyone, result.to_dict())
    dist.destroy_process_group()
    return [RankResult.from_dict(d) for d in everyone], rank


def disagreements(results: list[RankResult], problems: list[str]) -> list[str]:
    """Every way the ranks' results disagree with the oracle, one line each (empty: they agree)."""
    lines = list(problems)
    for res in sorted(results, key=lambda r: r.rank):
        if res.status is RankStatus.ERROR:
            lines.append(f"rank {res.rank}: error {res.exception_type}: {res.message}")
            lines.append(res.traceback or "")
        for name, m in res.metrics.items():
            if not m.ok:
                lines.append(f"rank {res.rank}: {name}: " + (m.problem or (
                    f"max abs err {m.max_abs_err!r} > tol {m.tol!r} ({m.ratio:.4g}x the tolerance), "
                    f"max rel err {m.max_rel_err!r}")))
    if len(results) == CASE.world_size and all(r.status is not RankStatus.ERROR for r in results):
        lines += [f"{name}: {m.describe()}" for name, m in scenario().judge_across(CASE, results) if not m.ok]
    return lines


def verdict(results: list[RankResult], problems: list[str], show: bool = True) -> int:
    """Print (if ``show``) what disagrees with the oracle; 0 when nothing does, 1 otherwise."""
    lines = disagreements(results, problems)
    if not show:
        return 1 if lines else 0
    build = f"torch {torch.__version__} (git {torch.version.git_version}), {DEVICE}/{BACKEND}"
    if lines:
        print(f"FAIL: {IMPL_NAME} disagrees with the float64 oracle on {CASE.id} ({build}):")
        for line in lines:
            print("  " + line)
        return 1
    print(f"PASS: {IMPL_NAME} agrees with the float64 oracle on {CASE.id} ({build})")
    return 0


def main() -> int:
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("repro: this reproduction runs on CUDA and no GPU is visible here", file=sys.stderr)
        return 2
    if DEVICE == "cuda" and torch.cuda.device_count() < CASE.world_size and not under_torchrun():
        print(f"repro: {CASE.world_size} ranks need {CASE.world_size} GPUs, {torch.cuda.device_count()} visible; "
              "nccl cannot share one GPU between ranks", file=sys.stderr)
        return 2
    if under_torchrun():
        results, rank = torchrun_rank()
        return verdict(results, [], show=rank == 0)  # every rank exits with the verdict; rank 0 prints it
    results, problems = spawn_ranks()
    return verdict(results, problems)
