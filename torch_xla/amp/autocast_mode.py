"""torch_xla.amp.autocast: torch.autocast for XLA devices."""
from __future__ import annotations

from typing import Optional

import torch


def _default_dtype(hw: str) -> torch.dtype:
    # float16 on GPUs (as torch.cuda.amp), bfloat16 on TPU and CPU.
    return torch.float16 if hw in ("CUDA", "GPU") else torch.bfloat16


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast`` for the XLA device ``device`` (a ``torch.device``, "xla" or "xla:N").

    Args:
      device: the XLA device the region runs on.
      enabled: whether autocasting is on in the region.
      dtype: the low-precision dtype (default: float16 on CUDA, bfloat16 elsewhere).
      cache_enabled: torch.autocast's weight-cast cache.
    """

    def __init__(self, device, enabled: bool = True, dtype: Optional[torch.dtype] = None,
                 cache_enabled: Optional[bool] = None):
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        if dev.type != "xla":
            raise ValueError(f"torch_xla.amp.autocast expects an XLA device, got {dev}; use torch.autocast "
                             f"for {dev.type}")
        if dtype is None:
            from torch_xla import runtime as xr
            dtype = _default_dtype(xr.device_type())
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"autocast dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        self._xla_device = dev
        kwargs = {} if cache_enabled is None else {"cache_enabled": cache_enabled}
        super().__init__("xla", enabled=enabled, dtype=dtype, **kwargs)
