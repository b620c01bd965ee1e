"""The rank side: a rank process's loop, the state it keeps between tasks, and what it does with one task.

Protocol with the parent (:mod:`harness.engine.pool`), one duplex pipe per
rank, plain dicts only:

    rank -> parent  {"op": "ready"}                     once its process group is up
                    {"op": "failed", "message", "traceback"}   if it could not start
    parent -> rank  {"op": "run", "task": Task.to_dict()}
    rank -> parent  {"op": "result", "result": RankResult.to_dict()}
    parent -> rank  {"op": "stop"}                      leave cleanly

A rank joins the process group over the parent's ``TCPStore`` (by port, with
its rank given explicitly): nothing of the caller's rendezvous environment
reaches it. A pool whose backend is ``no-group`` (``Case.backend``: one rank,
as a single process without ``torch.distributed`` runs) joins nothing: there
``torch.distributed.is_initialized()`` is False, as in a user's process that
never called ``init_process_group``, and a collective raises.

Everything it prints, Python or C++, goes to its log file, which
the parent reads for crash reports; faulthandler writes a crash's traceback
there and dumps every thread's stack there on SIGUSR1 (how the parent asks a
silent rank where it is). Beside the log (:func:`calls_path`) the rank writes
each collective of its current task before issuing it, so the parent knows
what a rank that died or went silent said last. A rank ignores SIGINT (the parent handles Ctrl-C)
and dies with its parent (PR_SET_PDEATHSIG, and a thread polling the parent
id), so a SIGKILLed harness leaves no rank behind. On CUDA, a rank makes
GPU ``rank mod count`` its current device before joining (:func:`gpu_index`),
so ``"cuda"`` means that GPU in everything it runs, and every task on CUDA runs
with TF32 off (:func:`exact_float32`).

:func:`run_task` is the same under torchrun (:mod:`harness.engine.torchrun`):
every rank regenerates the case's inputs from its seed and computes the
float64 oracle itself, so nothing but names and numbers crosses processes. A
case drawn per rank (search's) has each rank make only its own inputs; the
oracle's per-channel sums then cross between the ranks over the harness's own
process groups (:mod:`harness.engine.exchange`).
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Optional

from harness.catalog.case import NO_GROUP, Case
from harness.engine import compiled, list_contract, nccl_contract
from harness.engine.collectives import (begin_task, forbid_collectives, install_recorder, mark_step, recorded,
                                       suspended)
from harness.engine.exchange import Exchange
from harness.engine.messages import RankResult, Task
from harness.errors import EXIT_PARENT_GONE
from harness.impls.registry import resolve
from harness.judge.desync import eval_checks, group_checks
from harness.judge.mode import declared_mode
from harness.judge.verdict import rank_verdict
from harness.scenarios import module as scenario_named

START_TIMEOUT_S = 180.0  # spawn + import torch + init_process_group (+ a kernel build on first use)
PARENT_POLL_S = 0.5


class RankContext:
    """Per-process state kept between tasks: adapters already set up, subgroups already made, the harness's own
    channel to the other ranks (:attr:`exchange`)."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self._impls: dict = {}
        self._groups: dict[tuple, list] = {}
        self.exchange = Exchange(rank, world_size)  # the oracle's sums of a case drawn per rank

    def impl(self, key: str, device: str):
        """The adapter named ``key``, set up for this process once."""
        if key not in self._impls:
            impl = resolve(key)
            impl.setup_rank(device)
            self._impls[key] = impl
        return self._impls[key]

    def mark_step(self, index) -> None:
        """The collectives from now on belong to step ``index`` of the case (None: after the last step)."""
        mark_step(index)

    def forbid_collectives(self, why: str):
        """A context in which any collective raises (``why`` names the step that must not communicate)."""
        return forbid_collectives(why)

    def unrecorded(self):
        """A context for the training system's own communication (FSDP2's parameter all-gathers and gradient
        reduce-scatters), not the implementation's: torch's own functions, neither recorded nor forbidden, as
        DDP's C++ communication is not."""
        return suspended()

    def process_group(self, case):
        """The process group of this rank for ``case`` (None: the default group)."""
        if not case.groups:
            return None
        import torch.distributed as dist

        key = tuple(tuple(g) for g in case.groups)
        if key not in self._groups:
            # new_group is collective over the whole world: every rank creates every group, in order.
            self._groups[key] = [dist.new_group(list(g)) for g in key]
        for ranks, pg in zip(key, self._groups[key]):
            if self.rank in ranks:
                return pg
        raise ValueError(f"rank {self.rank} is in no group of {key}")


def scenario_module(case):
    """The module that runs ``case`` on a rank (see :mod:`harness.scenarios`)."""
    return scenario_named(case.scenario)


def run_task(ctx: RankContext, task: Task, scenario=None) -> RankResult:
    """Run one (case, impl) on this rank and judge it; never raises (an exception becomes an ``error``).

    ``scenario``: the module that runs the case (default: the one the case names).
    """
    t0 = time.perf_counter()
    result = RankResult(rank=ctx.rank)
    begin_task()
    if task.device == "cuda":
        exact_float32()
    try:
        case = Case.from_dict(task.case)
        impl = ctx.impl(task.impl, task.device)
        result.impl_version = impl.version()
        impl.ddp_note = None  # a note of the task before is not this task's
        try:
            runner = scenario or scenario_module(case)
            if case.compile:
                compiled.run_compiled(runner, ctx, case, impl, task.device, result, task.compare)
            else:
                runner.run_rank(ctx, case, impl, task.device, result, task.compare)
        finally:
            result.collectives = recorded()
            result.mode = declared_mode(impl.mode, f"impl {task.impl!r}")
            result.mode_notes = [*impl.mode_notes, *filter(None, [impl.ddp_note])]
        # What the rank said goes first: a wrong collective is the cause of the wrong tensors after it.
        said = eval_checks(case, result.collectives) + group_checks(case, ctx.rank, result.collectives)
        result.metrics = dict(said + [(k, m) for k, m in result.metrics.items() if k not in dict(said)])
        result.status, result.message = rank_verdict(result.metrics)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a rank reports every failure as data
        result.status, result.message = rank_verdict(result.metrics, raised=exc)
        result.exception_type = type(exc).__name__
        result.traceback = traceback.format_exc()[-8000:]
    result.duration_s = time.perf_counter() - t0
    return result


# ---------------------------------------------------------------------- the rank process


def die_with_parent(harness_pid: int) -> None:
    """SIGKILL this process when the harness dies.

    PR_SET_PDEATHSIG covers the process that started this one (the harness, or its forkserver, which exits
    with the harness); a thread also polls the harness's pid, which covers both.
    """
    import ctypes
    import threading

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass

    def gone() -> bool:
        try:
            os.kill(harness_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    if gone():
        os._exit(EXIT_PARENT_GONE)

    def watch():
        while True:
            if gone():
                os._exit(EXIT_PARENT_GONE)
            time.sleep(PARENT_POLL_S)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def exact_float32() -> None:
    """Turn off TF32 in cuDNN's convolutions and cuBLAS's matmuls, for this process.

    torch lets cuDNN convolutions round float32 operands to TF32 (10 mantissa bits) by default on Ampere and
    newer GPUs. The convolutions around a SyncBN in a model case would then differ from the float64 truth by
    about 1e-3 relative, far beyond any budget for the SyncBN's own float32 arithmetic, and a correct SyncBN
    would be judged wrong on CUDA only (seen on an H100 in every float32 conversion case). SyncBN's own
    kernels do not use TF32, so turning it off judges them exactly as on CPU.
    """
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def gpu_index(rank: int, device: str, gpus: int) -> Optional[int]:
    """The GPU rank ``rank`` uses out of ``gpus`` visible ones: round-robin on cuda, None on cpu."""
    if device != "cuda":
        return None
    if gpus < 1:
        raise RuntimeError(f"--device cuda, but rank {rank} sees no GPU (CUDA_VISIBLE_DEVICES or the driver)")
    return rank % gpus


def timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def calls_path(log_path: str) -> str:
    """Where a rank writes its current task's collectives, beside its log (``rank0.log`` -> ``rank0.calls``)."""
    return os.path.splitext(log_path)[0] + ".calls"


def inductor_cache_dir() -> Path:
    """Inductor's cache for this torch build: ``<harness cache>/inductor/torch-<version>-<commit>``."""
    import torch

    from harness.paths import cache_folder

    commit = (getattr(torch.version, "git_version", None) or "unknown")[:12]
    return cache_folder("compile") / f"torch-{torch.__version__.replace('+', '_')}-{commit}"


def thread_lock_for_progress_bars() -> None:
    """Give tqdm a thread lock before anything in this rank makes a progress bar.

    torch.fx's interpreter and inductor's compile waits draw tqdm bars, and tqdm's first bar creates a
    process-shared lock: a POSIX semaphore registered with the run's resource tracker. A rank leaves by
    ``os._exit``, so nothing would release it, and the run ended on "There appear to be N leaked semaphore
    objects" (one per rank that compiled). A rank's bars are never shared with another process.
    """
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def use_inductor_cache() -> None:
    """In a rank process: inductor caches under :func:`inductor_cache_dir` and compiles in the rank itself
    (no pool of compile workers to leave behind), unless the user chose otherwise."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache_dir()))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def share_cores(world_size: int) -> int:
    """This rank's intra-op threads: the CPUs this process may use, shared among the ranks (at least one).

    torch's default (one thread per CPU in every rank) oversubscribes the machine world_size times, and
    OpenMP's spinning threads then wait on each other: on 2 CPUs a 2-rank DDP case ran 2x slower. A user's
    ``OMP_NUM_THREADS`` wins (torch reads it itself).
    """
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        cpus = os.cpu_count() or 1
    threads = max(1, cpus // max(1, world_size))
    torch.set_num_threads(threads)
    return threads


def rank_main(rank: int, world_size: int, port: int, conn, log_path: str, parent_pid: int, backend: str,
              device: str, setup_impls: tuple, environ: dict) -> None:
    """Entry point of a pool's rank process: join, prepare, then serve tasks until told to stop.

    ``environ`` is the parent's environment when it started the pool (a forked rank would otherwise have its
    forkserver's, from whenever that started); its ``PYTHONPATH`` entries go first on ``sys.path``.
    """
    import sys

    from harness.engine import RENDEZVOUS_ENV

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    os.environ.clear()
    os.environ.update(environ)
    for var in RENDEZVOUS_ENV:
        os.environ.pop(var, None)
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    use_inductor_cache()
    thread_lock_for_progress_bars()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import faulthandler

    logfile = open(log_path, "a", buffering=1)
    sys.stdout = sys.stderr = logfile
    faulthandler.enable(file=logfile, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=logfile, all_threads=True)
    logging.basicConfig(level=logging.INFO, stream=logfile,
                        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s")
    try:
        import torch
        import torch.distributed as dist

        share_cores(world_size)
        gpu = gpu_index(rank, device, torch.cuda.device_count() if device == "cuda" else 0)
        if gpu is not None:
            torch.cuda.set_device(gpu)  # before init: nccl binds a rank's communicator to its current device
        if backend != NO_GROUP:  # a pool without a process group: torch.distributed stays uninitialized
            store = dist.TCPStore("127.0.0.1", port, world_size + 1, False, timeout=timedelta(START_TIMEOUT_S))
            if backend == nccl_contract.NAME:
                nccl_contract.register()
            elif backend == list_contract.LIST_NAME:
                list_contract.register_list_contract()
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timedelta(START_TIMEOUT_S))
        install_recorder(sink=calls_path(log_path))
        ctx = RankContext(rank, world_size)
        for key in setup_impls:
            ctx.impl(key, device)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
        conn.send({"op": "failed", "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        os._exit(1)
    conn.send({"op": "ready"})
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg.get("op") == "stop":
            break
        if msg.get("op") == "run":
            conn.send({"op": "result", "result": run_task(ctx, Task.from_dict(msg["task"])).to_dict()})
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        logfile.flush()
        os._exit(0)
