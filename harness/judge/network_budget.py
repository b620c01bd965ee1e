"""The budget of a whole network's tensors (model, conversion and checkpoint scenarios).

A layer's tensors get per-tensor budgets built from the oracle's statistics
(:mod:`harness.judge.budget`); a network's outputs, gradients and parameters
after a few layers and steps have no closed form to build them from, so their
budget grows with the rounding the network does: the layers it passes through,
the terms each reduces and the steps taken. The same constants (``K``, the unit
roundoffs, ``gamma``) as the layer's policy, from :mod:`harness.judge.budget`.
"""

from __future__ import annotations

import torch

from harness.catalog.case import Case
from harness.catalog.data import DTYPES
from harness.judge.budget import UNIT_ROUNDOFF, K, gamma


def network_tolerance(truth: torch.Tensor, case: Case, reduction: int, depth: int, step: int,
                      normwise: bool = False) -> torch.Tensor:
    """Model tensors: K (u_in + u_a gamma(N)) depth (step + 1) (|t| + mean|t|), elementwise.

    A network's result passes through ``depth`` layers, each rounding its output to the input dtype (u_in)
    and reducing at most ``N`` terms in the accumulation dtype (u_a), and ``step + 1`` updates;
    ``mean|t|`` keeps elements near 0 from getting no budget. Defects move results by percent; this budget
    is 1e-5 relative for float32 networks of a few layers, 1e-2 for half inputs. ``normwise``: every element
    gets the budget of the tensor's largest, ``max|t|`` in place of ``|t| + mean|t|`` (autocast, where every
    product in a reduction is rounded to 8 or 11 bits and an element that cancels keeps their error).
    """
    both64 = case.dtype == "float64" and case.param_dtype == "float64"
    u_a = UNIT_ROUNDOFF[torch.float64 if both64 else torch.float32]
    u_in = UNIT_ROUNDOFF[DTYPES[case.dtype]]
    t = truth.abs()
    if normwise:
        scale = torch.full_like(t, float(t.max()) if t.numel() else 0.0)
    else:
        scale = t + (t.mean() if t.numel() else 0.0)
    return K * (u_in + u_a * gamma(reduction)) * depth * (step + 1) * scale
