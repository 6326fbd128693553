"""torch_xla.core.functions: collectives with autograd."""
from __future__ import annotations

import torch

from torch_xla.core import xla_model as xm


class _AllGather(torch.autograd.Function):

    @staticmethod
    def forward(ctx, value, dim, groups):
        ctx.dim = dim
        ctx.groups = groups
        from torch_xla._internal import world
        ctx.group_size = len(world.my_group(groups))
        return xm.all_gather(value, dim=dim, groups=groups)

    @staticmethod
    def backward(ctx, grad_output):
        # Every rank's output took this rank's slice: its gradient is the sum over the group of
        # that slice of the output gradients.
        grad = xm.reduce_scatter(xm.REDUCE_SUM, grad_output.contiguous(), 1.0, ctx.dim, ctx.group_size,
                                 groups=ctx.groups)
        return grad, None, None


def all_gather(value: torch.Tensor, dim: int = 0, groups=None) -> torch.Tensor:
    """xm.all_gather that autograd differentiates: the backward gives each rank its slice of the
    gradient summed over the group."""
    return _AllGather.apply(value, dim, groups)
