"""torch_xla.amp: automatic mixed precision on XLA devices.

* ``autocast(device, enabled=True, dtype=None, cache_enabled=None)``: ``torch.autocast`` for the
  ``xla`` device type (this build registers the AutocastXLA kernels: matmuls and convolutions run
  in the low-precision dtype, precision-sensitive ops in float32, as torch's CPU policy).
  ``torch.autocast(device_type="xla")`` works as well.
* ``GradScaler``: ``torch.amp.GradScaler`` for XLA whose unscale, inf/NaN check and scale
  update are traced ops (no host reads); with the ``syncfree`` optimizers the skipped-step decision
  is made on the device too, so a training step needs no value on the host.
* ``syncfree.SGD/Adam/AdamW``: optimizers taking ``found_inf`` in ``step``.
"""
from .autocast_mode import autocast  # noqa: F401
from .grad_scaler import GradScaler  # noqa: F401
from . import syncfree  # noqa: F401

__all__ = ["autocast", "GradScaler", "syncfree"]
