"""torch_xla.utils.checkpoint: activation (gradient) checkpointing for XLA tensors.

``checkpoint(function, *args)`` is ``torch.utils.checkpoint.checkpoint`` made to work on XLA:

* torch's own version fails on XLA tensors when saving the RNG state (there is no ``torch.xla``
  device module); here the XLA generator's seed (and the CPU generator's state) is saved at the
  forward and restored for the recomputation, so dropout masks match;
* the recomputation's inputs go through ``xm.optimization_barrier_`` first, so XLA cannot merge
  the recomputed forward with the original one (which would keep the activations alive and undo
  the memory saving).

Saving the XLA seed reads it on the host once per checkpointed call (``preserve_rng_state=False``
avoids that when the function draws no random numbers).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils.checkpoint as _tcp

__all__ = ["checkpoint"]


def _xla_device_index(args) -> int:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "xla":
            return a.device.index or 0
    return 0


class _RngState:
    """CPU generator state + XLA seed of one device, saved at the forward."""

    def __init__(self, device: int, enabled: bool):
        from torch_xla.core import xla_model as xm
        self.enabled = enabled
        self.device = f"xla:{device}"
        if enabled:
            self.cpu = torch.get_rng_state()
            self.seed = xm.get_rng_state(self.device)

    def run(self, fn, *a, **k):
        from torch_xla.core import xla_model as xm
        if not self.enabled:
            return fn(*a, **k)
        current_cpu = torch.get_rng_state()
        current_seed = xm.get_rng_state(self.device)
        torch.set_rng_state(self.cpu)
        xm.set_rng_state(self.seed, self.device)
        try:
            return fn(*a, **k)
        finally:
            torch.set_rng_state(current_cpu)
            xm.set_rng_state(current_seed, self.device)


def _barrier(tensors) -> None:
    from torch_xla.core import xla_model as xm
    xla = [t for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "xla"]
    if xla:
        xm.optimization_barrier_(xla)


class _CheckpointFunction(torch.autograd.Function):
    """Reentrant checkpoint: forward without grad, recompute with grad in backward."""

    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        ctx.run_function = run_function
        ctx.rng = _RngState(_xla_device_index(args), preserve_rng_state)
        ctx.autocast = (torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"))
        ctx.tensor_indices, ctx.others, tensors = [], [], []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                ctx.tensor_indices.append(i)
                tensors.append(a)
                ctx.others.append(None)
            else:
                ctx.others.append(a)
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("checkpoint: .grad() is not supported with use_reentrant=True; use .backward() "
                               "or use_reentrant=False")
        args = list(ctx.others)
        for i, t in zip(ctx.tensor_indices, ctx.saved_tensors):
            d = t.detach()
            d.requires_grad_(t.requires_grad)
            args[i] = d
        _barrier(args)
        enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast("xla", enabled=enabled, dtype=dtype):
            outputs = ctx.rng.run(ctx.run_function, *args)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        outs, grads = [], []
        for o, g in zip(outputs, grad_outputs):
            if isinstance(o, torch.Tensor) and o.requires_grad:
                outs.append(o)
                grads.append(g)
        if not outs:
            raise RuntimeError("checkpoint: none of the function's outputs requires grad")
        torch.autograd.backward(outs, grads)
        return (None, None) + tuple(a.grad if isinstance(a, torch.Tensor) else None for a in args)


def checkpoint(function: Callable[..., Any], *args, use_reentrant: bool = None, preserve_rng_state: bool = True,
               **kwargs):
    """Runs ``function(*args, **kwargs)`` without keeping its activations; they are recomputed
    during backward. ``use_reentrant`` defaults to True (as in PyTorch/XLA); the reentrant form
    takes no keyword arguments for ``function``. Other keyword arguments of
    ``torch.utils.checkpoint.checkpoint`` (``context_fn``, ``determinism_check``, ``debug``) are
    accepted with ``use_reentrant=False``, which runs torch's non-reentrant checkpoint (it looks up
    ``torch.xla``, the device module ``import torch_xla`` registers)."""
    if not callable(function):
        raise TypeError(f"checkpoint expects a callable, got {type(function).__name__}")
    if use_reentrant is None:
        use_reentrant = True
    if use_reentrant:
        if kwargs:
            raise ValueError(f"checkpoint(use_reentrant=True) takes no keyword arguments for the function, got "
                             f"{sorted(kwargs)}")
        return _CheckpointFunction.apply(function, preserve_rng_state, *args)
    if not hasattr(torch, "xla"):
        raise NotImplementedError(
            "checkpoint(use_reentrant=False) runs torch's non-reentrant checkpoint, which looks up a 'torch.xla' "
            "device module; register one first (torch._register_device_module('xla', torch_xla)) or use "
            "use_reentrant=True")
    rng = {}

    def run(*a, **k):
        if "state" not in rng:  # the forward
            rng["state"] = _RngState(_xla_device_index(a), preserve_rng_state)
            return function(*a, **k)
        _barrier(a)  # a recomputation during backward
        return rng["state"].run(function, *a, **k)

    return _tcp.checkpoint(run, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)
