"""XLA tensors have no host storage: `data_ptr()` and `untyped_storage()` raise instead of
returning a fake pointer (functionalization's wrappers report 0) or an empty storage.

torch's Tensor methods are wrapped once, at import; for tensors on other devices the wrappers call
the original methods unchanged.
"""
from __future__ import annotations

import functools
import sys

import torch

_MESSAGE = ("{what} of an XLA tensor is not available: its data lives in the XLA runtime, not in host "
            "memory. Use tensor.cpu() to get a CPU copy.")


# torch's own tensor machinery (Dynamo's fake tensors, AOT Autograd, functionalization) reads the
# storage object for aliasing identity and size, never its bytes: it gets the real one.
_INTERNAL = ("/torch/_subclasses/", "/torch/_dynamo/", "/torch/_functorch/", "/torch/_guards",
             "/torch/fx/", "/torch/_prims_common/")


def _torch_internal_caller() -> bool:
    f = sys._getframe(2).f_code.co_filename
    return any(p in f for p in _INTERNAL)


def _guard(name: str, what: str):
    original = getattr(torch.Tensor, name)
    if getattr(original, "_torch_xla_guard", False):
        return

    @functools.wraps(original)
    def guarded(self, *args, **kwargs):
        if self.device.type == "xla" and not _torch_internal_caller():
            raise RuntimeError(_MESSAGE.format(what=what))
        return original(self, *args, **kwargs)

    guarded._torch_xla_guard = True
    setattr(torch.Tensor, name, guarded)


def install() -> None:
    _guard("data_ptr", "data_ptr()")
    _guard("untyped_storage", "untyped_storage()")
