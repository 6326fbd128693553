"""torch_xla.compile: trace a function into one graph and run it at the end of the call."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Optional

from . import _C


class _CompiledRegion(contextlib.ContextDecorator):
    def __init__(self, full_graph: bool, name: Optional[str], num_different_graphs_allowed: Optional[int]):
        if num_different_graphs_allowed is not None and num_different_graphs_allowed < 1:
            raise ValueError(
                f"num_different_graphs_allowed must be a positive int, got {num_different_graphs_allowed}")
        self.full_graph = full_graph
        self.name = name
        self.num_different_graphs_allowed = num_different_graphs_allowed

    def __enter__(self):
        import torch_xla
        torch_xla.sync()  # pending work outside the region is not part of it
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            _C._sync(None, False, self.name or "")
            from .debug import metrics as _met
            _met._core.increment_counter("MarkStep")
        return False


def compile(f: Optional[Callable] = None, full_graph: Optional[bool] = False, name: Optional[str] = None,
            num_different_graphs_allowed: Optional[int] = None):
    if f is None:
        return _CompiledRegion(bool(full_graph), name, num_different_graphs_allowed)
    region = _CompiledRegion(bool(full_graph), name or getattr(f, "__name__", None), num_different_graphs_allowed)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        with region:
            return f(*args, **kwargs)

    return wrapper
