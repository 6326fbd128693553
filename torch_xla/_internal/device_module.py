"""``torch.xla``: this package registered as torch's device module for the "xla" device type.

torch looks device modules up by name: ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``
calls ``getattr(torch, "xla")`` and raised ``AttributeError: module 'torch' has no attribute 'xla'``
for XLA tensors; ``torch.random.fork_rng(device_type="xla")`` and ``torch.get_device_module("xla")``
need it too. PyTorch/XLA does not register one, so scripts do it themselves, often unguarded
(``torch._register_device_module("xla", torch_xla)``), which torch refuses once a module is
registered. So ``torch._register_device_module`` is wrapped: registering "xla" again is accepted
(the same package: nothing to do; another module: it replaces ours, as it would have been the only
one under PyTorch/XLA). Every other device type goes to torch's function unchanged.
"""
from __future__ import annotations

import functools
import sys

import torch


def install() -> None:
    import torch_xla

    original = torch._register_device_module
    if getattr(original, "_txla_wrapped", False):
        return

    @functools.wraps(original)
    def register(device_type, module):
        if torch.device(device_type).type == "xla" and getattr(torch, "xla", None) is not None:
            if module is not torch.xla:
                setattr(torch, "xla", module)
                sys.modules["torch.xla"] = module
            return
        return original(device_type, module)

    register._txla_wrapped = True
    torch._register_device_module = register
    if getattr(torch, "xla", None) is None:
        original("xla", torch_xla)
