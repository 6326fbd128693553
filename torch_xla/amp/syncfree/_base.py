"""Shared pieces of the syncfree optimizers."""
from __future__ import annotations

from typing import Optional

import torch


def keep_mask(found_inf: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """0-dim bool tensor, True when the step must be applied (no inf/NaN found); None: always."""
    if found_inf is None:
        return None
    if not isinstance(found_inf, torch.Tensor):
        raise TypeError(f"found_inf must be a tensor, got {type(found_inf).__name__}")
    if found_inf.numel() != 1:
        raise ValueError(f"found_inf must have one element, got shape {list(found_inf.shape)}")
    return found_inf.reshape(()) == 0


def assign(dst: torch.Tensor, new: torch.Tensor, keep: Optional[torch.Tensor]) -> None:
    """dst <- new (where keep is True, else dst unchanged)."""
    if keep is None:
        dst.copy_(new)
    else:
        dst.copy_(torch.where(keep.to(dst.device), new, dst))


def check_positive(name: str, value, allow_zero: bool = True) -> None:
    if not isinstance(value, (int, float)) or (value < 0 if allow_zero else value <= 0):
        raise ValueError(f"Invalid {name}: {value!r}")


def run_closure(closure):
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
