"""The checkpoint scenario: a converted model saved, and loaded back the ways users load it.

A case's steps run in two phases (``PHASE_A`` steps, then the rest); between
them, the state dict of the converted model (on rank 0) is the checkpoint,
passed to the other ranks as a file would be (``broadcast_object_list``, the
bytes of ``torch.save``). ``Case.checkpoint`` says what happens to it:

- ``resume-W-V``: phase A trains on ranks 0..W-1 (a subgroup when W is
  smaller than the case's world size), phase B loads the checkpoint into a
  freshly built and converted model on ranks 0..V-1 and continues: a
  checkpoint taken at one world size resumes at another;
- ``revert``: rank 0 loads the checkpoint into the plain, unconverted model
  (``load_state_dict(strict=True)``: SyncBN must leave the names alone) and
  evaluates its own batch alone, with no process group (inference after
  training, pytorch#41081);
- ``rank0-ddp``: only rank 0 loads the checkpoint into its fresh model; the
  others keep their fresh weights and buffers, and DistributedDataParallel's
  construction (broadcast from rank 0) must make them agree (pytorch#111138).

The oracle is one float64 unconverted model stepped through both phases (the
checkpoint changes nothing in it): every rank taking part in a step is judged
as in :mod:`harness.scenarios.conversion`, and every rank's buffers must be
bitwise the same in every step.
"""

from __future__ import annotations

import copy
import io
from typing import Optional

import torch
import torch.distributed as dist

from harness.catalog.case import CHECKPOINT_MODES, Case
from harness.catalog.data import DTYPES, materialize
from harness.judge.compare import compare_tensor
from harness.judge.metric import Metric
from harness.judge.network_budget import network_tolerance
from harness.scenarios import user_models
from harness.scenarios.across import Across
from harness.scenarios.conversion import oracle_step, run_step
from harness.scenarios.model import judge_across

__all__ = ["run_rank", "judge_across", "unsupported_reason", "phases", "MODES"]

PHASE_A = 2
MODES = CHECKPOINT_MODES


def phases(case: Case) -> tuple[list[int], list[int]]:
    """The ranks taking part in phase A and in phase B."""
    ws = case.world_size
    if case.checkpoint.startswith("resume-"):
        w, v = (int(n) for n in case.checkpoint.split("-")[1:])
        return list(range(w)), list(range(v))
    return list(range(ws)), list(range(ws))


def unsupported_reason(case: Case, impl, device: str, backend: str) -> Optional[str]:
    """A resume needs both world sizes within the case's; everything else runs anywhere SyncBN runs."""
    if case.checkpoint not in MODES:
        return f"unknown checkpoint round trip {case.checkpoint!r}: one of {', '.join(MODES)}"
    a, b = phases(case)
    if max(len(a), len(b)) != case.world_size:
        return f"{case.checkpoint} needs world size {max(len(a), len(b))}, the case has {case.world_size}"
    return None


def _group(ctx, ranks: list, ws: int):
    """This rank's group for a phase over ``ranks`` (None: the whole world)."""
    if len(ranks) == ws:
        return None
    rest = tuple(r for r in range(ws) if r not in ranks)
    holder = Case(id="checkpoint/phase/ws1", family="checkpoint", batch_sizes=(1,) * ws, spatial=((),) * ws,
                  groups=(tuple(ranks), rest))
    return ctx.process_group(holder)


def _fresh(case: Case, impl, group):
    """The case's model built from another seed (what a new process builds before loading), then converted."""
    pdtype = DTYPES[case.param_dtype]
    model = user_models.build(case.model, case.channels, case.seed + 1, dtype=pdtype, param_dtype=pdtype)
    model.train()
    return impl.convert(model, group)


def _share(state: Optional[dict]) -> dict:
    """Rank 0's checkpoint on every rank, as the bytes of ``torch.save``."""
    blob = [None]
    if dist.get_rank() == 0:
        buf = io.BytesIO()
        torch.save(state, buf)
        blob = [buf.getvalue()]
    dist.broadcast_object_list(blob, src=0)
    return torch.load(io.BytesIO(blob[0]), weights_only=True)


def run_rank(ctx, case: Case, impl, device: str, result, compare_with: Optional[str] = None) -> None:
    """Phase A, the checkpoint, phase B: every step judged against one float64 oracle."""
    rank, ws = ctx.rank, case.world_size
    pdtype = DTYPES[case.param_dtype]
    data = materialize(case)
    oracle = user_models.build(case.model, case.channels, case.seed, dtype=torch.float64, param_dtype=pdtype)
    oracle.train()
    ranks_a, ranks_b = phases(case)
    metrics: list = []
    bitwise: dict[int, dict] = {}
    group_a = _group(ctx, ranks_a, ws)
    model = user_models.build(case.model, case.channels, case.seed, dtype=pdtype, param_dtype=pdtype)
    model.train()
    model = impl.convert(model, group_a).to(device) if rank in ranks_a else None
    for s in range(PHASE_A):
        ctx.mark_step(s)
        xs, gs = ([data.inputs[s][r] for r in ranks_a], [data.grad_outputs[s][r] for r in ranks_a])
        if rank in ranks_a:
            bitwise[s] = run_step(case, impl, device, rank, model, oracle, xs, gs, s, metrics, ranks=ranks_a)
        else:
            oracle_step(oracle, xs, case.steps[s])
    state = _share({k: v.detach().cpu() for k, v in model.state_dict().items()} if rank == 0 else None)
    if case.checkpoint == "revert":
        _revert(case, rank, state, oracle, data, metrics)
    group_b = _group(ctx, ranks_b, ws)
    fresh = _fresh(case, impl, group_b).to(device) if rank in ranks_b else None
    ddp = case.checkpoint == "rank0-ddp"
    if fresh is not None and (rank == 0 or not ddp):
        try:
            fresh.load_state_dict({k: v.to(device) for k, v in state.items()})
        except RuntimeError as exc:
            metrics.append(("checkpoint.load", Metric.failure(f"the checkpoint of world size {len(ranks_a)} does "
                                                              f"not load at world size {len(ranks_b)}: {exc}")))
            fresh = None
    if fresh is not None and ddp:
        from torch.nn.parallel import DistributedDataParallel

        with impl.ddp_guard():
            fresh = DistributedDataParallel(fresh)
    for s in range(PHASE_A, len(case.steps)):
        ctx.mark_step(s)
        xs, gs = ([data.inputs[s][r] for r in ranks_b], [data.grad_outputs[s][r] for r in ranks_b])
        if fresh is not None and rank in ranks_b:
            bitwise[s] = run_step(case, impl, device, rank, fresh, oracle, xs, gs, s, metrics, ranks=ranks_b,
                                      averaged=ddp)
        else:
            oracle_step(oracle, xs, case.steps[s])
    result.across = Across(bitwise=bitwise)
    result.metrics = dict(metrics)


def _revert(case: Case, rank: int, state: dict, oracle, data, metrics: list) -> None:
    """Rank 0: the checkpoint in the plain model, evaluated alone on rank 0's last phase-A batch."""
    if rank != 0:
        return
    pdtype = DTYPES[case.param_dtype]
    plain = user_models.build(case.model, case.channels, case.seed + 1, dtype=pdtype, param_dtype=pdtype)
    try:
        plain.load_state_dict(state)
    except RuntimeError as exc:
        metrics.append(("revert.load", Metric.failure(f"the checkpoint does not load into the plain model: {exc}")))
        return
    plain.eval()
    x = data.inputs[PHASE_A - 1][0]
    truth_model = copy.deepcopy(oracle).eval()
    with torch.no_grad():
        got, true = plain(x), truth_model(x.to(torch.float64))
    tol = network_tolerance(true, case, x.numel() // x.shape[1], 2 * len(user_models.batch_norms(plain)) + 1,
                            PHASE_A)
    metrics.append(("revert.eval.output", compare_tensor(got, true, tol, dtype=DTYPES[case.dtype])))
