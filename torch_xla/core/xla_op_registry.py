"""Register Python-built ops (upstream PyTorch/XLA's ``torch_xla.core.xla_op_registry``).

``op = xor.register("my_op", fn)`` where ``fn(*ops, **kwargs)`` builds the result from
:class:`torch_xla.core.xla_builder.Op` values; ``op(*xla_tensors, **kwargs)`` runs it. The body is
recorded into our IR like any other traced code (lazily, fused with the rest of the step, compiled
once per shape), without autograd, as upstream's user computations.
"""
from __future__ import annotations

import threading

import torch

from torch_xla.core import xla_builder as xb

__all__ = ["Op", "register"]


class Op:
    def __init__(self, name, opfn):
        if not callable(opfn):
            raise TypeError(f"xla_op_registry.register({name!r}, ...): opfn must be callable")
        self._name = name
        self._opfn = opfn
        self._lock = threading.Lock()

    @property
    def name(self):
        return self._name

    def __call__(self, *args, **kwargs):
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or a.device.type != "xla":
                raise TypeError(f"xla_op_registry op {self._name!r}: argument {i} must be a tensor on an XLA device, "
                                f"got {type(a).__name__}" + (f" on {a.device}" if isinstance(a, torch.Tensor) else ""))
        comp = xb.Computation(self._name, self._opfn, [xb.Shape.create(xb._XLA.get(a.dtype), a.shape) for a in args])
        with torch.no_grad():
            out = comp(*[a.detach() for a in args], **kwargs)
        return out


def register(name, opfn):
    """Registers ``opfn`` (built with xla_builder) as an op callable on XLA tensors."""
    return Op(name, opfn)
