#!/usr/bin/env python3
"""apex.parallel.convert_syncbn_model makes a frozen BatchNorm trainable and training again.

One process, no GPU and no process group needed: a model in training mode holds a BatchNorm2d frozen the
usual way (eval mode, weight and bias with requires_grad=False). apex's converter builds a new SyncBatchNorm
for it and copies only the parameters' values (apex/parallel/__init__.py), so the converted layer is in
training mode and its weight and bias require grad: in training it normalizes with batch statistics and
updates its running statistics. torch.nn.SyncBatchNorm.convert_sync_batchnorm keeps both (the training flag
since pytorch#111998, torch 2.2), and is shown beside it.

Seen: apex e13873de (both its optimized and its Python-fallback SyncBatchNorm share the converter), torch
2.11.0+cu130 and 2.13.0. Needs torch and apex. Exit 1: the symptom shows; 0: it does not (fixed).
"""
import sys

import torch
try:
    from apex.parallel import convert_syncbn_model
except ImportError as exc:  # reported by main, exit 2
    convert_syncbn_model, IMPORT_ERROR = None, f"{type(exc).__name__}: {exc}"


def frozen_model():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)).train()
    model[1].eval()
    model[1].weight.requires_grad_(False)
    model[1].bias.requires_grad_(False)
    return model


def flags(layer):
    return {"training": layer.training, "weight.requires_grad": layer.weight.requires_grad,
            "bias.requires_grad": layer.bias.requires_grad}


def main():
    if convert_syncbn_model is None:
        print(f"OTHER: needs apex ({IMPORT_ERROR})")
        return 2
    want = flags(frozen_model()[1])
    apex_got = flags(convert_syncbn_model(frozen_model())[1])
    torch_got = flags(torch.nn.SyncBatchNorm.convert_sync_batchnorm(frozen_model())[1])
    print(f"before conversion:      {want}")
    print(f"after apex's converter: {apex_got}")
    print(f"after torch's:          {torch_got}")
    lost = [k for k in want if apex_got[k] != want[k]]
    if lost:
        print(f"SYMPTOM SHOWS (mismatch): apex's converter changed {', '.join(lost)}")
        return 1
    print("no symptom: the frozen layer stays frozen")
    return 0


if __name__ == "__main__":
    sys.exit(main())
