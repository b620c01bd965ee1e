"""The cuda_graph scenario: a SyncBN training step captured in a CUDA graph, replayed once per step, judged.

Why: torch's SyncBN could not be captured at all (pytorch#78549: dropping
empty ranks' rows with a boolean mask is a host sync); pytorch#78666 skips
that mask while the stream is capturing, so under capture the gathered rows
of empty ranks (count 0) reach ``batch_norm_gather_stats_with_counts``, whose
kernels must then give those rows no weight (pytorch#78656). Eager runs never
take that path; only a capture does.

Protocol, per rank (the parent only sends cases it can run:
:func:`unsupported_reason`):
1. Inputs, upstream gradients and the float64 oracle, exactly as in the layer
   scenario (every step must be ``train``: a graph replays one fixed step).
2. The implementation's module on this rank's GPU, with the case's
   parameters and running statistics; static input (requiring grad) and
   gradient buffers on the GPU in the case's dtypes and layouts, holding
   step 0's data.
3. Warm-up: ``WARMUP_STEPS`` forward+backward on a side stream (the nccl
   communicator, library handles and the allocator are set up outside the
   capture, as the CUDA graphs notes of torch require); then parameters,
   buffers and num_batches_tracked are restored in place and gradients
   dropped, so the graph starts from the case's initial state.
4. Capture of one forward+backward (``capture_error_mode="thread_local"``
   where torch has it: the nccl watchdog thread keeps querying events while
   this thread captures). Gradients are allocated inside the capture and
   overwritten by every replay, like a step after ``zero_grad(set_to_none)``.
5. Per step: copy the step's input and gradient into the static buffers,
   replay, synchronize, read output, input gradient, weight and bias
   gradients, running statistics and num_batches_tracked.
6. Judged like the layer scenario: every tensor of every step against the
   oracle on each rank, and in the parent the sums over ranks of the
   grad_weight and grad_bias shares.

Needs ``--device cuda`` and ``--backend nccl`` (gloo runs its collectives on
the host, which a graph cannot hold) with one GPU per rank, and an
implementation whose capabilities allow capture (``graph_capture``).
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

from harness.catalog.case import Case
from harness.catalog.data import DTYPES
from harness.judge.budget import sum_tolerance
from harness.judge.compare import judge_rank, judge_sums
from harness.scenarios import prepared
from harness.scenarios.across import Across

WARMUP_STEPS = 3


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """Why this scenario cannot run ``impl`` on ``device`` over ``backend`` (None: it can)."""
    if device != "cuda":
        return f"capture in a CUDA graph needs --device cuda (and --backend nccl), not --device {device}"
    if backend != "nccl":
        return (f"capture in a CUDA graph needs --backend nccl: {backend} runs its collectives on the host, "
                "which a graph cannot capture")
    if not impl.capabilities.graph_capture:
        return f"{impl.name} does not support capture in a CUDA graph (its capabilities say graph_capture=False)"
    return None


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Capture ``case``'s training step with ``impl`` on this rank, replay it per step, fill ``result``."""
    if device != "cuda" or any(kind != "train" for kind in case.steps) or case.model:
        raise ValueError(f"case {case.id}: the cuda_graph scenario replays training steps of one layer on cuda "
                         f"(got device {device}, steps {case.steps}, model {case.model})")
    if compare_with:
        raise ValueError("--compare is not supported by the cuda_graph scenario: run each implementation alone")
    rank = ctx.rank
    torch.manual_seed(case.seed)
    data, truths = prepared.prepare(case, rank)  # read-only here: the replay copies what it uses
    observed = replay_steps(case, impl, rank, data, ctx.process_group(case))
    if case.affine:
        result.across = Across(shares={str(s): {which: _floats(obs[which], case.channels)
                                                for which in ("grad_weight", "grad_bias")}
                                       for s, obs in enumerate(observed)})
        if rank == 0:
            result.across.sum_truth = {
                str(s): {which: {"true": getattr(truths[s], f"{which}_sum").tolist(),
                                 "tol": sum_tolerance(case, data, truths, s, which).tolist()}
                         for which in ("grad_weight", "grad_bias")}
                for s in range(len(observed))}
    result.metrics = dict(judge_rank(case, rank, data, truths, observed))


def judge_across(case: Case, results: list) -> list:
    """The sums over ranks of the grad_weight/grad_bias shares against the oracle's sums."""
    if not case.affine or len(results) != case.world_size:
        return []
    sum_truth = next((r.across.sum_truth for r in results if r.across.sum_truth), None)
    if not sum_truth or not all(r.across.shares is not None for r in results):
        return []
    return judge_sums(sum_truth, [r.across.shares for r in results])


def replay_steps(case: Case, impl, rank: int, data, group) -> list[dict]:
    """Build the module, warm up, capture one forward+backward, replay it once per step; what each replay gave."""
    module = impl.build(case, group, "cuda").to(device="cuda", dtype=DTYPES[case.param_dtype])
    with torch.no_grad():
        if case.affine:
            module.weight.copy_(data.weight)
            module.bias.copy_(data.bias)
        if case.track_running_stats:
            module.running_mean.copy_(data.running_mean)
            module.running_var.copy_(data.running_var)
    module.train(True)
    x = data.inputs[0][rank].to("cuda").detach().clone().requires_grad_(True)
    dy = data.grad_outputs[0][rank].to("cuda").clone()
    initial = {name: t.detach().clone() for name, t in module.state_dict().items()}

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            impl.forward(module, x).backward(dy)
            module.zero_grad(set_to_none=True)
            x.grad = None
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        for name, t in module.state_dict().items():
            t.copy_(initial[name])
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, **_capture_options()):
        y = impl.forward(module, x)
        y.backward(dy)

    observed = []
    for s in range(len(case.steps)):
        with torch.no_grad():
            x.copy_(data.inputs[s][rank])
            dy.copy_(data.grad_outputs[s][rank])
        graph.replay()
        torch.cuda.synchronize()
        observed.append({
            "output": y.detach().cpu().clone(),
            "grad_input": _host(x.grad),
            "grad_weight": _host(module.weight.grad) if case.affine else None,
            "grad_bias": _host(module.bias.grad) if case.affine else None,
            "running_mean": _host(module.running_mean) if case.track_running_stats else None,
            "running_var": _host(module.running_var) if case.track_running_stats else None,
            "num_batches_tracked": int(module.num_batches_tracked) if case.track_running_stats else None,
        })
    return observed


def _capture_options() -> dict:
    """``capture_error_mode="thread_local"`` where ``torch.cuda.graph`` takes it (torch >= 2.1)."""
    if "capture_error_mode" in inspect.signature(torch.cuda.graph).parameters:
        return {"capture_error_mode": "thread_local"}
    return {}


def _host(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().cpu().clone()


def _floats(t: Optional[torch.Tensor], n: int) -> list:
    if t is None:
        return [0.0] * n
    return [float(v) for v in t.double().reshape(-1)]
