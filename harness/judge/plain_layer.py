"""What ``nn.BatchNorm`` itself refuses, on CPU and on CUDA: a SyncBN error the layer it replaces raises too is no
defect.

A SyncBN is a drop-in for ``nn.BatchNorm``. Where the plain layer of this torch
refuses the case's dtypes (float32 input with float64 parameters on CPU:
"mixed dtype (CPU): expect parameter to have scalar type of Float"), a SyncBN
that raises the very same error is behaving as documented: rule 3 of
:mod:`harness.judge.verdict` makes its record ``unsupported``, not an ``error``.

- **CPU, by probing** (:func:`refusal`): ``nn.BatchNorm{1,2,3}d`` runs on a
  tiny input of the case's dtype with parameters of its parameter dtype, in
  the modes the case's steps use (training, evaluation); what it raises is
  ``"Type: message"``. Only layer cases are probed (a model's other layers
  refuse for their own reasons).
- **CUDA, from a model of its kernels** (:func:`refusal_on_cuda`): probing
  would start a CUDA context in the parent, so the path the layer takes
  (cuDNN or ATen's native kernel) and what each accepts is written down.
  :mod:`harness.impls.cuda_plan` uses it before a case runs: torch's CUDA
  refusals that ``nn.BatchNorm`` shares make the case ``unsupported``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

from harness.catalog.case import STEP_KINDS
from harness.judge.verdict import LayerRefusal

_BATCHNORM = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}  # by the input's ndim
# The accumulation type of CUDA's kernels for each input dtype, as c10 names it in its messages.
_ACC_C10 = {"float64": "Double", "float32": "Float", "float16": "Float", "bfloat16": "Float"}
_ACC = {"float64": "float64", "float32": "float32", "float16": "float32", "bfloat16": "float32"}


@lru_cache(maxsize=64)
def _probe(dtype: str, param_dtype: str, affine: bool, track_running_stats: bool, ndim: int,
           mode: str) -> Optional[str]:
    import torch

    layer = getattr(torch.nn, _BATCHNORM[ndim])
    bn = layer(2, affine=affine, track_running_stats=track_running_stats).to(getattr(torch, param_dtype))
    bn.train(mode == "train")
    x = torch.arange(4 * 2 * 2 ** (ndim - 2), dtype=torch.float64).reshape(4, 2, *[2] * (ndim - 2))
    try:
        with torch.no_grad():
            bn(x.to(getattr(torch, dtype)))
    except Exception as exc:  # noqa: BLE001 - whatever the layer raises is what is compared
        return f"{type(exc).__name__}: {exc}"
    return None


def refusal(case, device: str) -> Optional[LayerRefusal]:
    """What ``nn.BatchNorm`` raises on ``case``'s dtypes in one of its steps' modes, on CPU (None: it accepts)."""
    if device != "cpu" or case.scenario != "layer":
        return None
    for mode in dict.fromkeys(STEP_KINDS[s] for s in case.steps):
        said = _probe(case.dtype, case.param_dtype, case.affine, case.track_running_stats, case.ndim, mode)
        if said:
            return LayerRefusal(device, case.dtype, case.param_dtype, said)
    return None


def refusal_on_cuda(dtype: str, param_dtype: str, affine: bool, ndim: int) -> Optional[str]:
    """Why ``nn.BatchNorm`` on CUDA refuses this combination in training (None: it accepts it).

    Its path: cuDNN where the input is not bfloat16, half input comes with float32 parameters, the layer is
    affine, and the input has 3 dims or more; cuDNN requires input and weight of one dtype except for half input.
    Otherwise ATen's native kernel, which reads the weight as the input's dtype or, mixed, as acc(input).
    """
    cudnn = (affine and "bfloat16" not in (dtype, param_dtype) and (dtype != "float16" or param_dtype == "float32")
             and ndim >= 3)
    if cudnn and dtype != "float16" and param_dtype != dtype:
        return "its cuDNN path requires input and weight of one dtype: cudnn_batch_norm raises RuntimeError"
    if not cudnn and affine and param_dtype not in (dtype, _ACC[dtype]):
        return f"its native elementwise kernel reads a {param_dtype} weight as {_ACC_C10[dtype]} and raises"
    return None
