"""torch_xla.compile: trace a function into one graph, compiled by XLA and run at the end of the call."""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Dict, Optional, Set

from . import _C

_UNEXPECTED = "Unexpected execution happens inside the compiled function, exiting"
_lock = threading.Lock()
# Graph hashes seen per compiled-function name (for num_different_graphs_allowed).
_graphs_by_name: Dict[str, Set[str]] = {}


class _CompiledRegion(contextlib.ContextDecorator):
    """Context manager and decorator: everything traced inside runs as one graph at exit."""

    def __init__(self, full_graph: bool, name: Optional[str], num_different_graphs_allowed: Optional[int]):
        if num_different_graphs_allowed is not None:
            if (not isinstance(num_different_graphs_allowed, int) or isinstance(num_different_graphs_allowed, bool)
                    or num_different_graphs_allowed < 1):
                raise ValueError("num_different_graphs_allowed must be a positive int (or None), got "
                                 f"{num_different_graphs_allowed!r}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self.full_graph = bool(full_graph)
        self.name = name
        self.num_different_graphs_allowed = num_different_graphs_allowed
        self._graphs: Set[str] = set()

    def _graph_name(self) -> str:
        return self.name or "torch_xla_compile"

    def __enter__(self):
        import torch_xla
        torch_xla.sync()  # pending work from before the region is not part of it
        _C._enter_compiled_region()
        if self.full_graph:
            _C._set_execution_forbidden(
                f"{_UNEXPECTED} (torch_xla.compile(full_graph=True) on '{self._graph_name()}': the function "
                "needs a value before its end, e.g. .item(), print() or a CPU fallback)")
        return self

    def __exit__(self, exc_type, exc, tb):
        _C._set_execution_forbidden("")
        _C._exit_compiled_region()
        if exc_type is not None:
            return False
        hashes = _C._sync_hashes(self._graph_name())
        from .debug import metrics as _met
        _met._core.increment_counter("MarkStep")
        if self.num_different_graphs_allowed is not None and hashes:
            with _lock:
                seen = _graphs_by_name.setdefault(self._graph_name(), set()) if self.name else self._graphs
                seen.update(hashes)
                n = len(seen)
            if n > self.num_different_graphs_allowed:
                raise RuntimeError(
                    f"torch_xla.compile: '{self._graph_name()}' has produced {n} different graphs, more than "
                    f"num_different_graphs_allowed={self.num_different_graphs_allowed}. Inputs of new shapes or "
                    "dtypes, or Python control flow on values, change the traced graph; set PT_XLA_DEBUG=1 to see "
                    "what differs.")
        return False


def compile(f: Optional[Callable] = None, full_graph: Optional[bool] = False, name: Optional[str] = None,
            num_different_graphs_allowed: Optional[int] = None):
    if f is None:
        return _CompiledRegion(bool(full_graph), name, num_different_graphs_allowed)
    if not callable(f):
        raise TypeError(f"torch_xla.compile expects a callable, got {type(f).__name__}")
    region = _CompiledRegion(bool(full_graph), name or getattr(f, "__name__", None), num_different_graphs_allowed)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        with region:
            return f(*args, **kwargs)

    return wrapper
