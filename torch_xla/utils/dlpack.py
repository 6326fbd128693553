"""torch_xla.utils.dlpack: DLPack exchange for XLA tensors, through host memory.

The PJRT plugins' device buffers are not exported as DLPack here: ``to_dlpack`` copies the
tensor to the CPU and exports that copy; ``from_dlpack`` imports a capsule or any object with
``__dlpack__`` and uploads it to the XLA device. Values are exact; the result never aliases the
source's memory (a write to one is not seen by the other).
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.utils.dlpack as _tdl


def to_dlpack(xla_tensor: torch.Tensor):
    """A DLPack capsule holding a CPU copy of ``xla_tensor``."""
    if not isinstance(xla_tensor, torch.Tensor):
        raise TypeError(f"to_dlpack expects a tensor, got {type(xla_tensor).__name__}")
    if xla_tensor.device.type != "xla":
        raise ValueError(f"to_dlpack expects an XLA tensor, got one on {xla_tensor.device}")
    return _tdl.to_dlpack(xla_tensor.detach().cpu().contiguous())


def from_dlpack(ext_data: Any, device: Optional[Union[str, torch.device]] = None) -> torch.Tensor:
    """An XLA tensor (on ``device``, default the current XLA device) with the data of a DLPack
    capsule or of an object implementing ``__dlpack__``."""
    if not (hasattr(ext_data, "__dlpack__") or type(ext_data).__name__ == "PyCapsule"):
        raise TypeError(f"from_dlpack expects a DLPack capsule or an object with __dlpack__, "
                        f"got {type(ext_data).__name__}")
    cpu = _tdl.from_dlpack(ext_data)
    if cpu.device.type != "cpu":
        cpu = cpu.cpu()
    if device is None:
        import torch_xla
        device = torch_xla.device()
    device = torch.device(device)
    if device.type != "xla":
        raise ValueError(f"from_dlpack: device must be an XLA device, got {device}")
    return cpu.to(device)
