#!/usr/bin/env python3
"""lightning.pytorch.plugins.TorchSyncBatchNorm.revert: a frozen (eval-mode) layer comes back in training mode.

`apply` (torch.nn.SyncBatchNorm.convert_sync_batchnorm) keeps each BatchNorm's training flag; `revert`,
which the strategy runs at teardown after fit, builds a new _BatchNormXd and does not copy it. A model
whose backbone BatchNorms are frozen (eval mode inside a model in train mode) gets them back training:
the next forward updates their running statistics. One process, no distributed setup needed.

Seen: lightning 2.6.6 on torch 2.13.0+cpu (the conversion family of syncbn-harness; written by hand).
Needs only torch and lightning. Exit 1: the symptom shows; 0: it does not (fixed).
"""
import sys

import torch
from lightning.pytorch.plugins import TorchSyncBatchNorm


def main():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.Conv2d(4, 4, 1),
                                torch.nn.BatchNorm2d(4))
    model.train()
    model[1].eval()  # a frozen layer, as in fine-tuning
    plugin = TorchSyncBatchNorm()
    synced = plugin.apply(model)
    kept_by_apply = [m.training for m in synced.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    reverted = plugin.revert(synced)
    after = [m.training for m in reverted.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    print(f"training flags of the BatchNorms: before [False, True], after apply {kept_by_apply}, after revert {after}")
    if after != [False, True]:
        print("SYMPTOM SHOWS: revert turned the frozen layer back to training")
        return 1
    print("no symptom: revert keeps each layer's mode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
