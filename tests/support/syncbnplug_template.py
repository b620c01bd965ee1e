"""Source of a small plugin package, ``syncbnplug``, whose versions the bisect, bisect-script and repro tests build.

``PLUGIN.format(version=..., biased=..., broken=...)`` gives one version's module: a plain-torch
SyncBatchNorm (differentiable all_reduce) whose running variance is biased when ``biased`` is True,
and which fails to import when ``broken`` holds a raising statement.
"""

import textwrap

PLUGIN = textwrap.dedent('''
    """A SyncBatchNorm in plain torch (test package for the bisect command), version {version}."""
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnnf
    from torch import nn

    __version__ = "{version}"
    BIASED = {biased}
    {broken}

    class SyncBatchNorm(nn.Module):
        def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                     process_group=None):
            super().__init__()
            self.num_features, self.eps, self.momentum = num_features, eps, momentum
            self.affine, self.track_running_stats, self.process_group = affine, track_running_stats, process_group
            if affine:
                self.weight = nn.Parameter(torch.ones(num_features))
                self.bias = nn.Parameter(torch.zeros(num_features))
            if track_running_stats:
                self.register_buffer("running_mean", torch.zeros(num_features))
                self.register_buffer("running_var", torch.ones(num_features))
                self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

        @classmethod
        def convert_sync_batchnorm(cls, module, process_group=None):
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                          process_group)
                if module.affine:
                    out.weight, out.bias = module.weight, module.bias
                if module.track_running_stats:
                    for name in ("running_mean", "running_var", "num_batches_tracked"):
                        out.register_buffer(name, getattr(module, name))
                return out.train(module.training)
            for name, child in list(module.named_children()):
                setattr(module, name, cls.convert_sync_batchnorm(child, process_group))
            return module

        def forward(self, x):
            c = self.num_features
            shape = (1, c) + (1,) * (x.dim() - 2)
            x64 = x.double()
            flat = x64.transpose(0, 1).reshape(c, -1)
            use_batch = self.training or not self.track_running_stats
            if use_batch:
                stats = torch.cat([flat.sum(1), (flat * flat).sum(1),
                                   torch.full((1,), float(flat.shape[1]), dtype=torch.float64)])
                if self.training and dist.is_initialized():
                    group = self.process_group or dist.group.WORLD
                    stats = dnnf.all_reduce(stats, group=group)
                n = stats[-1]
                mean = stats[:c] / n
                var = stats[c:2 * c] / n - mean * mean
                if self.training and self.track_running_stats:
                    with torch.no_grad():
                        self.num_batches_tracked += 1
                        f = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                        unbiased = var if BIASED else var * n / (n - 1)
                        self.running_mean.mul_(1 - f).add_(f * mean.to(self.running_mean.dtype))
                        self.running_var.mul_(1 - f).add_(f * unbiased.to(self.running_var.dtype))
            else:
                mean, var = self.running_mean.double(), self.running_var.double()
            y = (x64 - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
            if self.affine:
                y = y * self.weight.double().view(shape) + self.bias.double().view(shape)
            return y.to(x.dtype)
''')
