"""torch_xla.core.functions: differentiable helpers on XLA tensors (collectives with autograd, nms)."""
from __future__ import annotations

import torch


def _check(value: torch.Tensor, what: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} expects a tensor, got {type(value).__name__}")


def nms(boxes: torch.Tensor, scores: torch.Tensor, score_threshold: float, iou_threshold: float,
        output_size: int):
    """Non-maximal suppression (PyTorch/XLA's fixed-size variant).

    Returns ``(selected_indices, num_valid)``: ``output_size`` box indices (descending score,
    padded with zeros) and how many of them are valid. Boxes are ``(y1, x1, y2, x2)``.
    """
    _check(boxes, "nms")
    _check(scores, "nms")
    if boxes.dim() != 2 or boxes.size(1) != 4:
        raise ValueError(f"nms: boxes must have shape [N, 4], got {list(boxes.shape)}")
    if scores.dim() != 1 or scores.size(0) != boxes.size(0):
        raise ValueError(f"nms: scores must have shape [{boxes.size(0)}], got {list(scores.shape)}")
    device = boxes.device
    b = boxes.detach().cpu().double()
    s = scores.detach().cpu().double()
    y1 = torch.minimum(b[:, 0], b[:, 2]); y2 = torch.maximum(b[:, 0], b[:, 2])
    x1 = torch.minimum(b[:, 1], b[:, 3]); x2 = torch.maximum(b[:, 1], b[:, 3])
    area = (y2 - y1) * (x2 - x1)
    order = torch.argsort(s, descending=True, stable=True)
    keep = []
    for i in order.tolist():
        if s[i] <= score_threshold or len(keep) >= output_size:
            continue
        ok = True
        for j in keep:
            iy = (torch.minimum(y2[i], y2[j]) - torch.maximum(y1[i], y1[j])).clamp(min=0)
            ix = (torch.minimum(x2[i], x2[j]) - torch.maximum(x1[i], x1[j])).clamp(min=0)
            inter = iy * ix
            union = area[i] + area[j] - inter
            if union > 0 and inter / union > iou_threshold:
                ok = False
                break
        if ok:
            keep.append(i)
    out = torch.zeros(output_size, dtype=torch.int32)
    if keep:
        out[:len(keep)] = torch.tensor(keep, dtype=torch.int32)
    return out.to(device), torch.tensor(len(keep), dtype=torch.int32).to(device)


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


class _AllReduce(torch.autograd.Function):

    @staticmethod
    def forward(ctx, value, reduce_type, scale, groups):
        ctx.reduce_type = reduce_type
        ctx.scale = scale
        ctx.groups = groups
        out = xm.all_reduce(reduce_type, value, scale=scale, groups=groups)
        ctx.save_for_backward(value, out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        # PyTorch/XLA's convention: the gradient of this rank's output with respect to this rank's
        # input (no exchange of gradients here; data-parallel training all-reduces the parameters'
        # gradients afterwards).
        value, out = ctx.saved_tensors
        grad = grad_output * ctx.scale if ctx.scale != 1.0 else grad_output
        if ctx.reduce_type == xm.REDUCE_SUM:
            return grad, None, None, None
        if ctx.reduce_type == xm.REDUCE_MUL:
            # out = scale * prod(inputs): d out / d value = scale * the product of the others' inputs
            # (gathered: out / value would be NaN where value is 0)
            from torch_xla._internal import world
            members = list(world.my_group(ctx.groups))
            i = members.index(world.rank())
            if len(members) == 1:
                return grad, None, None, None
            every = xm.all_gather(value.detach().unsqueeze(0), dim=0, groups=ctx.groups)
            others = torch.cat([every[:i], every[i + 1:]]).prod(0)
            return grad * others, None, None, None
        if ctx.reduce_type in (xm.REDUCE_MIN, xm.REDUCE_MAX):
            return grad * (value == out).to(grad.dtype), None, None, None
        raise RuntimeError(f"functions.all_reduce: {ctx.reduce_type!r} has no gradient")


def all_reduce(reduce_type: str, value: torch.Tensor, scale: float = 1.0, groups=None) -> torch.Tensor:
    """xm.all_reduce of one tensor that autograd differentiates (as PyTorch/XLA's: the backward
    gives each rank the gradient of its own output with respect to its input: ``scale`` times the
    output gradient for sum, times the product of the other ranks' inputs for mul, masked to
    where the input holds the result for min and max)."""
    _check(value, "all_reduce")
    return _AllReduce.apply(value, reduce_type, scale, groups)
