"""XLA tensors have no host storage: `data_ptr()` and `untyped_storage()` raise instead of
returning a fake pointer (functionalization's wrappers report 0) or an empty storage.

torch's Tensor methods are wrapped once, at import; for tensors on other devices the wrappers call
the original methods unchanged.
"""
from __future__ import annotations

import functools

import torch

_MESSAGE = ("{what} of an XLA tensor is not available: its data lives in the XLA runtime, not in host "
            "memory. Use tensor.cpu() to get a CPU copy.")


def _guard(name: str, what: str):
    original = getattr(torch.Tensor, name)
    if getattr(original, "_torch_xla_guard", False):
        return

    @functools.wraps(original)
    def guarded(self, *args, **kwargs):
        if self.device.type == "xla":
            raise RuntimeError(_MESSAGE.format(what=what))
        return original(self, *args, **kwargs)

    guarded._torch_xla_guard = True
    setattr(torch.Tensor, name, guarded)


def install() -> None:
    _guard("data_ptr", "data_ptr()")
    _guard("untyped_storage", "untyped_storage()")
