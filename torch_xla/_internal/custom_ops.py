"""Custom ops whose kernel is a composite (a Python function registered as CompositeExplicitAutograd:
every ``torch.library.custom_op`` without ``device_types``, and ``Library.impl(...,
"CompositeExplicitAutograd")``) run on XLA tensors under functionalization.

Functionalization hands such an op our raw device tensors and its composite kernel runs below it: the
kernel's views (``narrow``, ``view``, ``as_strided``...) reached the CPU fallback one by one, and a
view on the fallback is a copy, so in-place writes and ``out=`` writes through them were lost
(``F.linear_cross_entropy(..., options=LinearCrossEntropyOptions(...))`` gave wrong losses and
gradients). For each such op an XLA kernel is registered that runs the same composite on functional
wrappers (``_C._functionalize_composite``, C++): ops defined before ``import torch_xla`` when it is
imported, later ones when their composite is registered. An XLA kernel the user registers for the op
replaces it.
"""
from __future__ import annotations

import functools

import torch

from .. import _C


def _qualname(lib, name) -> str:
    if hasattr(name, "_schema"):  # an OpOverload
        s = name._schema
        return s.name + ("." + s.overload_name if s.overload_name else "")
    name = str(name)
    return name if "::" in name else f"{lib.ns}::{name}"


def install() -> None:
    lib_cls = torch.library.Library
    if getattr(lib_cls.impl, "_txla_wrapped", False):
        return
    original = lib_cls.impl

    @functools.wraps(original)
    def impl(self, op_name, fn=None, dispatch_key="", *args, **kwargs):
        result = original(self, op_name, fn, dispatch_key, *args, **kwargs)
        key = dispatch_key or getattr(self, "dispatch_key", "")
        if key == "CompositeExplicitAutograd":
            try:
                _C._functionalize_composite(_qualname(self, op_name))
            except Exception:  # noqa: BLE001  (never break the user's registration)
                pass
        return result

    impl._txla_wrapped = True
    lib_cls.impl = impl
    # ops defined before torch_xla was imported
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # pragma: no cover
        return
    for qualname in list(OPDEFS.keys()):
        _C._functionalize_composite(qualname)
