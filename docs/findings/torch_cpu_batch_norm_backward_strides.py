#!/usr/bin/env python3
"""torch.nn.BatchNorm2d/3d on CPU (plain BatchNorm's own kernel, not SyncBatchNorm's): wrong grad_input for a
channels-last view whose size-1 dims hide its layout, with a contiguous grad_output.

What it runs: nn.BatchNorm2d and nn.BatchNorm3d (float32, CPU, one process, no process group), in training and
in eval, on inputs that are dense views laid out channels-last but whose size-1 dims make
suggest_memory_format() say "contiguous":
  - the transpose of a contiguous (W, C, 1, 1) tensor: shape (1, C, 1, W), strides (1, 1, 1, C);
  - a 2-D (W, C) feature viewed as x.t()[None, :, None, :]: shape (1, C, 1, W), strides (C, 1, W*C, C);
  - BatchNorm3d on the transpose of a contiguous (W, C, 1, 1, 1) tensor, and on x.t()[None, :, None, None, :].
The upstream gradient is a plain contiguous tensor. Expected: grad_input equal to float64 BatchNorm on a
contiguous copy of the same values (relative error ~1e-7). Actual (torch 2.13.0+cpu and 2.14.1+cu130 on CPU):
relative errors of 1.06 (training) and 1.3 (eval) for every one of these views; the forward is right. The
same values made with .contiguous(memory_format=torch.channels_last) (the control) are right, and so are views
whose gradient has the input's layout.

Mechanism (ATen, aten/src/ATen/native/Normalization.cpp, batch_norm_backward_cpu_template): the fast path is
taken when `is_contiguous(input) && is_contiguous(grad_out_) && input.suggest_memory_format() ==
grad_out_.suggest_memory_format()`; the file-local is_contiguous() accepts channels-last (and channels-last-3d)
density, which ignores size-1 dims, while suggest_memory_format() returns Contiguous for these views, as for
the contiguous grad_out, so the check passes although the two tensors are laid out differently. The kernel
(aten/src/ATen/native/cpu/batch_norm_kernel.cpp, batch_norm_cpu_backward_kernel) then picks
batch_norm_cpu_backward_channels_last_impl from the input's layout and walks grad_output's memory as if it
were channels-last too.

Severity: silent wrong value (grad_input). Reach: rare: CPU, a BatchNorm whose input has N = 1 and size-1
spatial dims between C and the one non-trivial spatial dim, as a view (a transposed or unsqueezed 2-D
feature). SyncBatchNorm reaches it where it calls F.batch_norm (eval, no process group).

This file exits 1 on CPU (torch 2.13.0+cpu and 2.14.1+cu130); a past version (the transposed 4-D view
only) exited 1 on CUDA (H200, torch 2.11.0+cu130, the 2026-11-28 suite; the tensors are on the CPU there too).
Needs only torch. Exit 1: the symptom shows (grad_input off by more than 1e-3 relative for a view while the
channels-last control is right); 0: every view's grad_input agrees with float64 BatchNorm (within 1e-5);
2: anything else (the control wrong, an error in between, an exception).
"""
import sys

import torch

C, W = 8, 5
SHOWS, AGREES = 1e-3, 1e-5  # relative error in grad_input; float32 gives ~1e-7


def views():
    """(name, BatchNorm class, builder) for each view and the channels-last control: builder(values) gives
    a tensor with the values of `values` (a contiguous (1, C, ...) float32 tensor) in that layout."""
    def transposed(v):  # contiguous (W, C, 1, 1[, 1]) transposed to (1, C, 1, [1,] W)
        return v.transpose(0, -1).contiguous().transpose(0, -1)

    def of_2d(v):  # a (W, C) feature, t() and unsqueezed to (1, C, 1, [1,] W)
        flat = v.reshape(C, W).t().contiguous()
        return flat.t()[(None, slice(None)) + (None,) * (v.dim() - 3) + (slice(None),)]

    def control(v):
        return v.contiguous(memory_format=torch.channels_last)

    return [("(W, C, 1, 1) transposed", torch.nn.BatchNorm2d, 4, transposed),
            ("(W, C).t()[None, :, None, :]", torch.nn.BatchNorm2d, 4, of_2d),
            ("BatchNorm3d: (W, C, 1, 1, 1) transposed", torch.nn.BatchNorm3d, 5, transposed),
            ("BatchNorm3d: (W, C).t()[None, :, None, None, :]", torch.nn.BatchNorm3d, 5, of_2d),
            ("control: .contiguous(channels_last)", torch.nn.BatchNorm2d, 4, control)]


def grad_input_error(cls, dim, build, training):
    """Relative max error of grad_input against float64 BatchNorm on the same values; and the view's strides."""
    g = torch.Generator().manual_seed(0)
    shape = (1, C) + (1,) * (dim - 3) + (W,)
    values = torch.randn(shape, generator=g)
    grad = torch.randn(shape, generator=g)  # contiguous, as autograd passes a loss's gradient
    bn = cls(C).train(training)
    with torch.no_grad():
        bn.running_mean.normal_(generator=g), bn.running_var.uniform_(0.5, 1.5, generator=g)
        bn.weight.uniform_(0.5, 1.5, generator=g), bn.bias.normal_(generator=g)
    reference = cls(C).double().train(training)
    reference.load_state_dict(bn.state_dict())

    x = build(values).detach().requires_grad_()
    assert torch.equal(x, values)
    bn(x).backward(grad)
    x64 = values.double().requires_grad_()
    reference(x64).backward(grad.double())
    rel = float((x.grad.double() - x64.grad).abs().max() / x64.grad.abs().max())
    return rel, x.stride()


def main():
    try:
        results = []
        for name, cls, dim, build in views():
            for training in (True, False):
                rel, strides = grad_input_error(cls, dim, build, training)
                results.append((name, training, rel))
                print(f"{name:48} {'train' if training else 'eval ':5} strides {str(strides):18} "
                      f"grad_input max rel err {rel:.3g}")
    except Exception as e:  # noqa: BLE001 - any exception is "something else"
        print(f"OTHER: {type(e).__name__}: {e}")
        return 2
    control = max(rel for name, _, rel in results if name.startswith("control"))
    shown = [(name, tr, rel) for name, tr, rel in results if not name.startswith("control") and rel > SHOWS]
    worst = max(rel for _, _, rel in results)
    if control > AGREES:
        print(f"OTHER: the channels-last control is off too (relative error {control:.3g})")
        return 2
    if shown:
        which = sorted({name for name, _, _ in shown})
        print(f"SYMPTOM SHOWS (wrong value): grad_input off by up to {max(r for _, _, r in shown):.3g} relative "
              f"(> {SHOWS:g}) in {len(shown)} of {len(results) - 2} view/mode runs ({'; '.join(which)}); "
              f"the channels-last control {control:.2g}")
        return 1
    if worst <= AGREES:
        print(f"no symptom (pass): every view's grad_input agrees with float64 BatchNorm (max rel err {worst:.2g})")
        return 0
    print(f"OTHER: a view's grad_input is off by {worst:.3g}, between {AGREES:g} and {SHOWS:g}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
