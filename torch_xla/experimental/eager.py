"""Eager mode: outside compiled regions each op runs at once (compiled once per op signature)."""
from __future__ import annotations

import contextlib

from .. import _C


def eager_mode(enable: bool):
    """Configure torch_xla's default execution mode.

    With eager mode on, every op outside ``torch_xla.compile`` regions is compiled (once per op
    signature, then cached) and run at once; regions under ``torch_xla.compile`` are still traced
    as one graph.
    """
    if not isinstance(enable, bool):
        raise TypeError(f"eager_mode expects a bool, got {type(enable).__name__}")
    if enable:
        import torch_xla
        torch_xla.sync()  # what was traced lazily before runs now
    _C._set_eager_mode(enable)


def is_eager_mode() -> bool:
    return _C._eager_mode()


@contextlib.contextmanager
def eager_mode_context(enable: bool):
    saved = is_eager_mode()
    eager_mode(enable)
    try:
        yield
    finally:
        eager_mode(saved)
