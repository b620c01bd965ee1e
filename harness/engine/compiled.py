"""Compiled runs: a case's scenario under ``torch.compile``, beside the same scenario run eagerly.

Protocol (rank side; :func:`run_compiled`, called by ``run_task`` for a case with ``Case.compile``):

1. The case's scenario runs eagerly through a :class:`Recorder`: every output and input gradient the
   implementation produced, and at the end the state of every module it was called with, are kept. Its
   verdicts are dropped (the eager run is what other families judge).
2. Dynamo is reset (no cache entry, counter or guard failure of an earlier case in this process survives)
   and the scenario runs again on the same inputs, with torch.distributed's own functions in place of the
   harness's recording wrappers (dynamo puts collectives in its graphs by knowing those functions; the
   eager pass's collectives are the ones recorded), every module it calls compiled with the case's backend
   (``eager``, ``aot_eager``, ``inductor``), ``fullgraph`` and ``dynamic=True`` or dynamo's default. This
   pass is the one judged against the float64 oracle, with the scenario's usual tolerances.
3. The recordings are compared tensor by tensor: bitwise equal or not, and the largest difference. With
   the ``eager`` backend dynamo only replays the graphs it captured, op for op, so anything but bitwise
   equality is a defect (metric ``compile.vs_eager``); ``aot_eager`` and ``inductor`` may reorder or fuse
   arithmetic, and their difference is reported, judged through the oracle only.
4. What dynamo did on this rank goes to ``result.compile`` (:class:`DynamoLog`): graphs compiled (counted
   by a backend in front of the named one), graph breaks (reason and where, counted), frames dynamo gave up
   on and ran eagerly (a break inside a loop, as over ``nn.Sequential``'s layers, skips the whole frame),
   recompiles (the guard that failed). It is written even when the compiled pass raises: fullgraph's refusal
   is an ``error`` whose message is dynamo's reason, and the graphs compiled before it still count.

Inductor writes what it compiles under the harness's cache, one folder per torch build (set up when a rank
process starts: :func:`harness.engine.rank.use_inductor_cache`), so a later run of an inductor case loads its
kernels instead of compiling them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

import torch

from harness.engine.collectives import suspended
from harness.engine.messages import RankResult
from harness.judge.invariants import bits
from harness.judge.metric import Metric
from harness.results.compile_stats import portable

SHOWN = 6  # differing tensors named in a record


def compile_options(case) -> dict:
    """``torch.compile`` keyword arguments of the case (besides the backend)."""
    return {"fullgraph": "fullgraph" in case.compile, "dynamic": True if "dynamic" in case.compile else None}



def lookup_backend(name: str):
    """The compiler function dynamo registers under ``name`` (``torch._dynamo.lookup_backend`` from torch 2.1;
    torch 2.0 has it only in ``torch._dynamo.backends.registry``)."""
    import torch._dynamo

    found = getattr(torch._dynamo, "lookup_backend", None)
    if found is None:
        from torch._dynamo.backends.registry import lookup_backend as found
    return found(name)

class Recorder:
    """An adapter in front of ``impl`` that records what its modules produce, optionally compiling them.

    Everything but :meth:`forward` is the wrapped adapter's (attributes are looked up on it), so the
    scenario builds, converts and wraps modules exactly as it would without the recorder.
    """

    def __init__(self, impl, compile_with=None):
        self.__dict__.update(impl=impl, compile_with=compile_with, outputs=[], grads={}, modules=[], compiled={})

    def __getattr__(self, name):
        return getattr(self.impl, name)

    def __setattr__(self, name, value):
        setattr(self.impl, name, value)  # what a scenario sets on its adapter, the adapter keeps

    def forward(self, module, input):
        """Call ``module`` (compiled, when compiling) through the adapter; keep its output and input gradient."""
        if not any(m is module for m in self.modules):
            self.modules.append(module)
        call = module
        if self.compile_with is not None:
            key = id(module)
            if key not in self.compiled:
                self.compiled[key] = torch.compile(module, **self.compile_with)
            call = self.compiled[key]
        output = self.impl.forward(call, input)
        index = len(self.outputs)
        self.outputs.append(output.detach().cpu().clone())
        if input.requires_grad and torch.is_grad_enabled():
            # An undefined gradient (None: an empty rank's, from some implementations) is recorded as none.
            input.register_hook(lambda g: self.grads.__setitem__(index, None if g is None
                                                                 else g.detach().cpu().clone()))
        return output

    def tensors(self) -> dict[str, torch.Tensor]:
        """Everything recorded, by name: ``forward<i>.output``, ``forward<i>.grad_input``, ``state.<module>.<k>``."""
        out = {f"forward{i}.output": y for i, y in enumerate(self.outputs)}
        out.update({f"forward{i}.grad_input": g for i, g in sorted(self.grads.items())})
        for k, m in enumerate(self.modules):
            for name, t in m.state_dict().items():
                if torch.is_tensor(t):
                    out[f"state.{k}.{name}"] = t.detach().cpu().clone()
        return out


def compare_with_eager(eager: dict[str, torch.Tensor], compiled: dict[str, torch.Tensor]) -> dict:
    """Which tensors of the compiled pass differ from the eager pass's, and by how much at most."""
    differs, worst = [], 0.0
    for name in sorted(set(eager) | set(compiled), key=_natural):
        a, b = eager.get(name), compiled.get(name)
        if a is None and b is None or (a is None or b is None) and (a if a is not None else b).numel() == 0:
            continue  # an empty rank's gradient: undefined in one pass, empty in the other, the same nothing
        if a is None or b is None:
            differs.append(f"{name} ({'only compiled' if a is None else 'only eager'})")
            continue
        if a.dtype != b.dtype or a.shape != b.shape:
            differs.append(f"{name} ({b.dtype}{list(b.shape)}, eager {a.dtype}{list(a.shape)})")
            continue
        if bits(a) == bits(b):
            continue
        d = float((a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max()) if a.is_floating_point() \
            else float((a.long() - b.long()).abs().max())
        worst = max(worst, d)
        differs.append(f"{name} (by {d:.3g})")
    return {"bitwise": not differs, "compared": len(set(eager) | set(compiled)), "differs": differs[:SHOWN],
            "differing": len(differs), "max_abs_diff": worst}


def _natural(name: str):
    head, _, rest = name.partition(".")
    digits = "".join(c for c in head if c.isdigit())
    return (head.rstrip("0123456789"), int(digits) if digits else -1, rest)


class DynamoLog:
    """What dynamo does from :meth:`start` on in this process: graphs, graph breaks, recompiles."""

    def __init__(self, backend: str):
        self.name, self.graphs, self.ops = backend, 0, 0

    def start(self) -> None:
        """Forget every compiled frame and counter of earlier cases (their cache entries would be reused)."""
        import torch._dynamo

        contract = sys.modules.get("harness.engine.nccl_contract")  # loaded where an nccl-contract group exists
        if contract is not None:
            contract.hide_from_dynamo()
        list_only = sys.modules.get("harness.engine.list_contract")  # and where a list-contract group exists
        if list_only is not None:
            list_only.hide_list_group_from_dynamo()
        torch._dynamo.reset()
        from torch._dynamo import utils

        utils.counters.clear()
        for name in ("guard_failures", "graph_break_reasons"):
            getattr(utils, name, {}).clear()

    def backend(self):
        """The named backend, behind a counter of the graphs it is given."""
        named = lookup_backend(self.name)

        def counting(gm, example_inputs):
            self.graphs += 1
            self.ops += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
            return named(gm, example_inputs)

        return counting

    def summary(self) -> dict:
        """Graphs, ops in them, graph breaks (reason, where, count), frames dynamo gave up on and ran eagerly
        (reason, count), and recompiles (the guard that failed, count)."""
        from torch._dynamo import utils

        breaks: dict[tuple, int] = {}
        reasons = getattr(utils, "graph_break_reasons", None)
        if reasons is not None:
            for r in reasons:
                key = (short_reason(r.reason), _where(getattr(r, "user_stack", None)))
                breaks[key] = breaks.get(key, 0) + 1
        else:
            for reason, n in utils.counters.get("graph_break", {}).items():
                breaks[(short_reason(reason), "")] = breaks.get((short_reason(reason), ""), 0) + n
        skipped: dict[str, int] = {}
        for reason, n in utils.counters.get("unimplemented", {}).items():
            skipped[short_reason(reason)] = skipped.get(short_reason(reason), 0) + n
        recompiles: dict[str, int] = {}
        for failures in getattr(utils, "guard_failures", {}).values():
            for reason in failures:
                text = short_reason(str(reason).split(": ", 1)[-1])
                recompiles[text] = recompiles.get(text, 0) + 1
        return {"graphs": self.graphs, "ops": self.ops,
                "graph_breaks": [{"reason": k[0], "where": k[1], "count": n} for k, n in breaks.items()],
                "skipped_frames": [{"reason": k, "count": n} for k, n in skipped.items()],
                "recompiles": [{"reason": k, "count": n} for k, n in recompiles.items()]}


CHAINED = "*** While handling this graph break, another graph break occurred: ***"


def short_reason(text: str) -> str:
    """Dynamo's reason in one line: each part's first line and developer context, paths cut to file names.

    Messages that chain several reasons (a break while handling another) keep each, joined by `` -> ``.
    """
    parts = []
    for part in str(text).split(CHAINED):
        lines = [ln.strip() for ln in part.splitlines() if ln.strip()]
        if not lines:
            continue
        first = lines[0]
        context = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Developer debug context:")),
                       "")
        parts.append(f"{first} ({context})" if context and context not in first else first)
    text = portable(" -> ".join(parts) or "unknown")
    return re.sub(r"(?:/[^\s/()'\"]+)+/([^\s/()'\"]+\.py)", r"\1", text)


def _where(stack) -> str:
    if not stack:
        return ""
    frame = stack[-1]
    return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"


def run_compiled(scenario, ctx, case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Run ``case`` eagerly, then compiled, with ``scenario``; judge the compiled pass and compare the two."""
    eager = Recorder(impl)
    scenario.run_rank(ctx, case, eager, device, RankResult(rank=ctx.rank))
    backend = case.compile[0]
    impl.before_compile()
    log = DynamoLog(backend)
    log.start()
    compiled = Recorder(impl, compile_with={"backend": log.backend(), **compile_options(case)})
    try:
        with suspended():
            scenario.run_rank(ctx, case, compiled, device, result, compare_with)
    finally:
        result.compile = {"backend": backend, **compile_options(case), **log.summary()}
    versus = compare_with_eager(eager.tensors(), compiled.tensors())
    result.compile["vs_eager"] = versus
    if backend == "eager" and not versus["bitwise"]:
        result.metrics["compile.vs_eager"] = Metric.failure(
            f"backend eager differs from eager in {versus['differing']} of {versus['compared']} tensors: "
            + ", ".join(versus["differs"][:3]))

