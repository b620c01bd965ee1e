"""Run a selection: (case x implementation) through warm pools, one record each.

:func:`run_selection` is the plain function behind ``run``, ``check`` and the
pytest plugin. It yields records as cases finish, so callers can store and
print them one by one. Cases are grouped by world size; one pool per world
size is started when first needed and closed when its cases are done (or on
any exception, Ctrl-C included).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

from harness.buildinfo import BuildInfo, build_info
from harness.case import Case
from harness.errors import ImplUnavailable, UsageError
from harness.impls import Impl, builtin_names, resolve
from harness.pool import Pool, TaskOutcome
from harness.records import PEER_FAILED, RankOutcome, Record, Status
from harness.worker import judge_sums

DEFAULT_TIMEOUT_S = 120.0


@dataclass
class RunOptions:
    """How to run: device, backend and the per-case time limit."""

    device: str = "cpu"
    backend: Optional[str] = None
    timeout: float = DEFAULT_TIMEOUT_S
    # (A, B): A's records also say how A differs from B on the same inputs (``--compare A,B``).
    compare: Optional[tuple[str, str]] = None
    on_pool_start: Optional[Callable[[Pool], None]] = field(default=None, repr=False)

    @property
    def resolved_backend(self) -> str:
        return self.backend or ("nccl" if self.device == "cuda" else "gloo")


def default_impls() -> list[str]:
    """Every built-in implementation (those absent here are recorded as skipped)."""
    return builtin_names()


def resolve_impls(names: Iterable[str]) -> list[Impl]:
    """Adapters for ``names``; a plugin that cannot be imported is an error, not a skip."""
    impls = []
    for name in names:
        impl = resolve(name)
        if name not in builtin_names():
            impl.check_available()  # raises ImplUnavailable naming the module and the exception
        impls.append(impl)
    if len({i.name for i in impls}) != len(impls):
        raise UsageError(f"an implementation is selected twice: {[i.name for i in impls]}")
    return impls


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _record(case: Case, impl: Impl, info: BuildInfo, opts: RunOptions, status: Status, message: str,
            **kw) -> Record:
    from harness.known_issues import annotate

    return annotate(Record(case=case.id, family=case.family, params=case.params(), impl=impl.name, status=status,
                  message=message, impl_version=kw.pop("impl_version", None) or _safe_version(impl),
                  mode=kw.pop("mode", None) or impl.mode, torch_version=info.torch_version,
                  torch_git_version=info.torch_git_version, cuda_version=info.cuda_version, device=opts.device,
                  backend=opts.resolved_backend, world_size=case.world_size, host=info.host,
                  started_at=kw.pop("started_at", None) or _now(), **kw))


def _safe_version(impl: Impl) -> Optional[str]:
    try:
        return impl.version()
    except Exception:  # noqa: BLE001 - an unreadable version is not a failure of the case
        return None


class Session:
    """Warm pools kept across calls (one per world size), for running (case, impl) one at a time.

    ``run_selection`` uses one per world size and closes it when that size is
    done; the pytest plugin keeps one for a whole pytest session (per xdist worker).
    """

    def __init__(self, impls: list[Impl], opts: RunOptions, info: Optional[BuildInfo] = None):
        self.opts = opts
        self.info = info or build_info()
        self.impls = impls
        self.unavailable: dict[str, str] = {}
        for impl in impls:
            try:
                impl.check_available_on(opts.device)
            except ImplUnavailable as exc:
                self.unavailable[impl.name] = str(exc)
        if opts.device == "cuda" and not self.info.cuda_available:
            for impl in impls:
                self.unavailable.setdefault(impl.name, "no CUDA device on this machine")
        self._setup = tuple(i.key for i in impls if i.name not in self.unavailable)
        self.pools: dict[int, Pool] = {}

    def run_one(self, case: Case, impl: Impl) -> Record:
        """The record of one (case, impl): skipped, unsupported, or run in the warm pool of its world size."""
        opts, info = self.opts, self.info
        if impl.name in self.unavailable:
            return _record(case, impl, info, opts, Status.SKIPPED, self.unavailable[impl.name])
        reason = impl.unsupported_reason(case, opts.device)
        if reason:
            return _record(case, impl, info, opts, Status.UNSUPPORTED, reason)
        pool = self.pools.get(case.world_size)
        if pool is None:
            pool = self.pools[case.world_size] = Pool(case.world_size, backend=opts.resolved_backend,
                                                      device=opts.device, setup_impls=self._setup)
        started, t0 = _now(), time.perf_counter()
        if not pool.alive:
            pool.start()
            if opts.on_pool_start:
                opts.on_pool_start(pool)
        task = {"case": case.to_dict(), "impl": impl.key, "device": opts.device}
        if opts.compare and impl.name == opts.compare[0]:
            task["compare"] = opts.compare[1]
        outcome = pool.run(task, timeout=opts.timeout)
        return _from_outcome(case, impl, info, opts, outcome, started, time.perf_counter() - t0)

    def close(self, world_size: Optional[int] = None, *, kill: bool = False) -> None:
        """Stop the pool of one world size (or all): politely, or at once with ``kill``."""
        sizes = [world_size] if world_size is not None else list(self.pools)
        for ws in sizes:
            pool = self.pools.pop(ws, None)
            if pool is not None and kill:
                pool.kill()
            elif pool is not None:
                pool.close()


def run_selection(cases: list[Case], impls: list[Impl], opts: RunOptions,
                  info: Optional[BuildInfo] = None) -> Iterator[Record]:
    """Yield one record per (case, impl), running what can run in warm pools (one world size at a time)."""
    session = Session(impls, opts, info)
    by_ws: dict[int, list[Case]] = {}
    for case in cases:
        by_ws.setdefault(case.world_size, []).append(case)
    try:
        for ws in sorted(by_ws):
            for case in by_ws[ws]:
                for impl in impls:
                    yield session.run_one(case, impl)
            session.close(ws)
    except BaseException:
        # Ctrl-C, SIGTERM, a closed generator or a bug: ranks may be busy or stuck, do not wait for them.
        session.close(kill=True)
        raise


def _from_outcome(case: Case, impl: Impl, info: BuildInfo, opts: RunOptions, outcome: TaskOutcome,
                  started: str, duration: float) -> Record:
    results = [r for r in outcome.results if r is not None]
    metrics: dict = {}
    for res in results:
        for name, m in res.get("metrics", {}).items():
            metrics[f"rank{res['rank']}.{name}"] = m
    status = outcome.status
    message = _message(outcome.ranks)
    if status == Status.PASS or status == Status.MISMATCH:
        if len(results) == case.world_size and case.affine:
            sum_metrics, problems = judge_sums(results)
            metrics.update(sum_metrics)
            if problems:
                status = Status.MISMATCH
                message = "; ".join(filter(None, [message, *problems[:3]]))
    first = results[0] if results else {}
    return _record(case, impl, info, opts, status, message, ranks=outcome.ranks, metrics=metrics,
                   duration_s=round(duration, 4), started_at=started, impl_version=first.get("impl_version"),
                   mode=first.get("mode"), compare=_merge_compare(results))


def _merge_compare(results: list[dict]) -> Optional[dict]:
    """The ranks' implementation-vs-implementation differences: the largest per tensor over ranks."""
    parts = [r["compare"] for r in results if r.get("compare")]
    if not parts:
        return None
    merged = {"with": parts[0]["with"], "max_abs_diff": {}, "error": next((p["error"] for p in parts if p["error"]),
                                                                          None)}
    for p in parts:
        for name, v in p["max_abs_diff"].items():
            merged["max_abs_diff"][name] = max(v, merged["max_abs_diff"].get(name, 0.0))
    return merged


def _message(ranks: list[RankOutcome]) -> str:
    """Who did what, culprits first: ``rank 1: crash (killed by SIGSEGV)``."""
    parts = []
    for o in ranks:
        if o.status in (Status.PASS.value, PEER_FAILED):
            continue
        what = o.message.splitlines()[0] if o.message else ""
        if o.exception_type:
            what = f"{o.exception_type}: {what}"
        parts.append(f"rank {o.rank}: {o.status}" + (f" ({what})" if what else ""))
    peers = [o.rank for o in ranks if o.status == PEER_FAILED]
    if peers:
        parts.append(f"ranks {peers} {PEER_FAILED}")
    return "; ".join(parts)[:2000]


def execute_run(cases: list[Case], impls: list[Impl], opts: RunOptions, *, store_dir, resume: bool = False,
                on_record: Optional[Callable[[Record], None]] = None) -> tuple[list[Record], bool]:
    """``run``: records of the selection, each appended to the store as it finishes.

    Locally, this process drives warm pools. Under torchrun it is one rank;
    only rank 0 gets records and writes them (the second value says whether
    this process is the writer).
    """
    from harness import torchrun
    from harness.store import Store, build_key, completed

    if not cases:
        raise UsageError("the selection is empty: no case matches (see `syncbn-harness list cases`)")
    store = Store(store_dir) if store_dir else None
    info = build_info()
    is_writer = True
    if torchrun.under_torchrun():
        import os

        is_writer = os.environ.get("RANK") == "0"
        stream = torchrun.run_as_rank(cases, impls, opts)
    else:
        if resume and store is not None:
            key = build_key(info.torch_version, info.torch_git_version, opts.device, opts.resolved_backend)
            done = completed(store.read(key) if key in store.builds() else [])
            cases = [c for c in cases if any((c.id, i.name) not in done for i in impls)]
            impls_by_case = {c.id: [i for i in impls if (c.id, i.name) not in done] for c in cases}
            stream = _resumed(cases, impls_by_case, opts, info)
        else:
            stream = run_selection(cases, impls, opts, info)
    out = []
    for record in stream:
        if store is not None:
            store.append(record)
        out.append(record)
        if on_record:
            on_record(record)
    return out, is_writer


def _resumed(cases, impls_by_case, opts, info) -> Iterator[Record]:
    """Run only the (case, impl) pairs the store does not hold yet, one pool per world size still."""
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        key = tuple(i.name for i in impls_by_case[c.id])
        groups.setdefault(key, []).append(c)
    for _, group in groups.items():
        yield from run_selection(group, impls_by_case[group[0].id], opts, info)
