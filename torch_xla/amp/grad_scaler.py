"""torch_xla.amp.GradScaler: loss scaling whose bookkeeping stays on the XLA device."""
from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Dict

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` for XLA devices.

    Unscaling, the inf/NaN check and the scale update are traced ops (torch's versions are aten
    ops with no XLA lowering, which would read values on the host every step). With an optimizer
    whose ``step`` takes ``found_inf`` (``torch_xla.amp.syncfree``) the skip decision is made on
    the device; with any other optimizer ``step`` reads ``found_inf`` on the host, as torch does.

    Args: as ``torch.amp.GradScaler``; ``use_zero_grad`` is accepted for PyTorch/XLA compatibility
    (it has no effect: non-finite gradients never reach a syncfree optimizer's update).
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, use_zero_grad: bool = False):
        super().__init__("xla", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
        self.use_zero_grad = use_zero_grad

    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool) -> Dict[torch.device, torch.Tensor]:
        nonfinite: Dict[torch.device, torch.Tensor] = {}
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    if not allow_fp16 and grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    if grad.is_sparse:
                        raise NotImplementedError("torch_xla.amp.GradScaler: sparse gradients are not supported")
                    bad = torch.logical_not(torch.isfinite(grad)).any()
                    dev = grad.device
                    nonfinite[dev] = bad if dev not in nonfinite else torch.logical_or(nonfinite[dev], bad)
                    grad.mul_(inv_scale.to(dev).reshape(()))
            out = {}
            for dev, bad in nonfinite.items():
                fi = found_inf.to(dev)
                fi.copy_(bad.to(fi.dtype).reshape(fi.shape))
                out[dev] = fi
        return out

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        if "found_inf" in inspect.signature(optimizer.step).parameters:
            found = [v for v in optimizer_state["found_inf_per_device"].values()]
            total = found[0]
            for v in found[1:]:
                total = total + v.to(total.device)
            kwargs["found_inf"] = total
            return optimizer.step(*args, **kwargs)
        return super()._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)

    def update(self, new_scale=None) -> None:
        if not self._enabled:
            return
        if new_scale is not None:
            return super().update(new_scale)
        scale, tracker = self._check_scale_growth_tracker("update")
        found_infs = [fi.to(scale.device) for state in self._per_optimizer_states.values()
                      for fi in state["found_inf_per_device"].values()]
        if not found_infs:
            raise AssertionError("No inf checks were recorded prior to update.")
        found = found_infs[0]
        for fi in found_infs[1:]:
            found = found + fi
        with torch.no_grad():
            skipped = found > 0
            successful = tracker + 1
            grown = scale * self._growth_factor
            grow = torch.logical_and(successful >= self._growth_interval, torch.isfinite(grown))
            new = torch.where(skipped, scale * self._backoff_factor, torch.where(grow, grown, scale))
            reset = torch.logical_or(skipped, successful >= self._growth_interval)
            new_tracker = torch.where(reset, torch.zeros_like(tracker), successful)
            scale.copy_(new)
            tracker.copy_(new_tracker)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
