"""torch_xla.backends: process-wide settings of the XLA backend.

``set_mat_mul_precision`` chooses the precision XLA uses for matrix multiplications and
convolutions (``stablehlo.dot_general`` / ``stablehlo.convolution`` ``precision_config``):

* ``'default'``: the fastest the device offers (on TPU: one bf16 pass for f32 inputs);
* ``'high'``: more passes (on TPU: bf16_3x);
* ``'highest'``: full f32 precision (on TPU: bf16_6x).

The CPU plugin always computes in full precision, so on CPU the three give the same values. The
setting applies to ops traced after the call; it is part of each op's IR node, hence of the
graph cache key, so changing it compiles a new graph instead of reusing one built with the old
precision.
"""
from __future__ import annotations

from typing import Literal

_PRECISIONS = ("default", "high", "highest")

__all__ = ["set_mat_mul_precision", "get_mat_mul_precision"]


def set_mat_mul_precision(precision: Literal["default", "high", "highest"]) -> None:
    """Sets the precision of matmuls and convolutions traced from now on."""
    if precision not in _PRECISIONS:
        raise ValueError(f"Invalid precision: {precision!r}; must be one of {_PRECISIONS}")
    from .. import _XLAC
    _XLAC._xla_set_mat_mul_precision(precision)


def get_mat_mul_precision() -> Literal["default", "high", "highest"]:
    """The current precision of matmuls and convolutions ('default', 'high' or 'highest')."""
    from .. import _XLAC
    return _XLAC._xla_get_mat_mul_precision()
