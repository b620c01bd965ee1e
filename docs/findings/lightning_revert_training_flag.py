#!/usr/bin/env python3
"""lightning TorchSyncBatchNorm.revert: a frozen (eval-mode) BatchNorm comes back in training mode.

Written by hand (a converter). `apply` (torch.nn.SyncBatchNorm.convert_sync_batchnorm) keeps each
BatchNorm's training flag; `revert`, which the strategy runs at teardown after fit, builds a new
_BatchNormXd and does not copy it. A model whose backbone BatchNorms are frozen (eval mode inside a model
in train mode) gets them back training: the next forward in train mode updates their running statistics.

What it runs: one process, no process group: Conv2d + BatchNorm2d (frozen: eval) + Conv2d + BatchNorm2d
(training) in a model in train mode, through the plugin's apply and revert. Expected: the training flags
as before, [False, True] (what a plain module keeps). Severity: silent wrong mode; reach: fine-tuning with
frozen BatchNorms and sync_batchnorm=True, until the next model.eval() / model.train().

The symptom: after revert the frozen layer is training ([True, True]). It agrees when the flags are
[False, True] after apply and after revert.

Upstream: none found (queries "Lightning TorchSyncBatchNorm revert training mode eval frozen BatchNorm",
"LayerSync revert _BatchNormXd training attribute"). Needs only torch and lightning. Exit codes: 1 the
symptom above shows; 0 revert keeps each layer's mode; 2 anything else (reason printed). With lightning
2.6.6 on torch 2.13.0 it exits 1 on CPU.
"""
import sys

import torch

try:
    from lightning.pytorch.plugins import TorchSyncBatchNorm
except ImportError as exc:  # reported by main, exit 2
    TorchSyncBatchNorm, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"

BEFORE = [False, True]  # the BatchNorms' training flags: the first frozen


def flags(model):
    return [m.training for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def main():
    if TorchSyncBatchNorm is None:
        print(f"OTHER: needs lightning ({IMPORT_ERROR})")
        return 2
    try:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 4, 1),
                                    torch.nn.BatchNorm2d(4)).train()
        model[1].eval()  # a frozen layer, as in fine-tuning
        plugin = TorchSyncBatchNorm()
        synced = plugin.apply(model)
        after_apply = flags(synced)
        after_revert = flags(plugin.revert(synced))
    except Exception as exc:  # noqa: BLE001 - any exception is "something else"
        print(f"OTHER: {type(exc).__name__}: {exc}")
        return 2
    facts = f"training flags before {BEFORE}, after apply {after_apply}, after revert {after_revert}"
    if after_apply == BEFORE and after_revert == [True, True]:
        print(f"SYMPTOM SHOWS (mismatch): revert turned the frozen layer back to training: {facts}")
        return 1
    if after_apply == BEFORE and after_revert == BEFORE:
        print(f"no symptom (pass): revert keeps each layer's mode: {facts}")
        return 0
    print(f"OTHER: {facts}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
