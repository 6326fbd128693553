"""torch_xla.debug.profiler: PyTorch/XLA's profiler API.

This build has no profiler backend (the PJRT CPU plugin exposes none), so the server and trace
capture are documented no-ops: ``start_server`` returns a server object that records nothing,
``trace``/``trace_detached``/``start_trace``/``stop_trace`` capture nothing and write no files.
The annotations keep their semantics: ``Trace`` and ``trace_me`` are context manager /
decorator wrappers that run the code unchanged, and ``StepTrace`` marks a training step, so, as in
PyTorch/XLA, leaving it syncs the pending graph (``torch_xla.sync()``). Scripts written for the
profiler run unchanged; nothing is profiled.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional

__all__ = ["start_server", "trace", "trace_detached", "start_trace", "stop_trace", "Trace",
           "StepTrace", "trace_me", "ProfilerServer"]

_warned = False


def _note_no_backend(what: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"torch_xla.debug.profiler.{what}: this torch_xla build has no profiler backend; "
                      "nothing is captured", stacklevel=3)


class ProfilerServer:
    """What ``start_server`` returns (no profiler backend: it serves nothing)."""

    def __init__(self, port: int):
        self.port = port

    def __repr__(self):
        return f"ProfilerServer(port={self.port}, backend=None)"


def start_server(port: int, only_on_master: bool = True) -> Optional[ProfilerServer]:
    """Starts the profiler server on ``port`` (no-op here; returns a placeholder server object)."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
    _note_no_backend("start_server")
    return ProfilerServer(port)


def trace(service_addr: str, logdir: str, duration_ms: int = 1000, num_tracing_attempts: int = 3,
          host_tracer_level: int = 2, device_tracer_level: int = 1, delay_ms: int = 0, **kwargs) -> None:
    """Captures a profile from ``service_addr`` into ``logdir`` (no-op here: nothing is written)."""
    if not isinstance(service_addr, str) or not isinstance(logdir, str):
        raise TypeError("trace(service_addr, logdir): both must be str")
    _note_no_backend("trace")


def trace_detached(service_addr: str, logdir: str, duration_ms: int = 1000, num_tracing_attempts: int = 3,
                   host_tracer_level: int = 2, device_tracer_level: int = 1, delay_ms: int = 0, **kwargs) -> None:
    """``trace`` in a background thread (no-op here)."""
    trace(service_addr, logdir, duration_ms, num_tracing_attempts, host_tracer_level, device_tracer_level,
          delay_ms, **kwargs)


_tracing = False


def start_trace(log_dir: str, create_perfetto_link: bool = False, create_perfetto_trace: bool = False) -> None:
    """Starts an in-process trace (no-op here). Raises if one is already running, as upstream."""
    global _tracing
    if _tracing:
        raise RuntimeError("a trace is already running: call stop_trace() first")
    _note_no_backend("start_trace")
    _tracing = True


def stop_trace() -> None:
    """Stops the trace started by ``start_trace``."""
    global _tracing
    if not _tracing:
        raise RuntimeError("no trace is running: call start_trace() first")
    _tracing = False


class Trace:
    """Context manager annotating a region of host code as ``name`` (runs the region unchanged)."""

    def __init__(self, name: str, **kwargs: Any):
        if not isinstance(name, str):
            raise TypeError(f"Trace name must be a str, got {type(name).__name__}")
        self.name = name
        self.kwargs = kwargs

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False


class StepTrace(Trace):
    """Annotates one training step; leaving it runs the pending graph (``torch_xla.sync()``)."""

    def __init__(self, name: str, step_num: Optional[int] = None, **kwargs: Any):
        super().__init__(name, **kwargs)
        self.step_num = step_num

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            import torch_xla
            torch_xla.sync()
        return False


def trace_me(name: str) -> Callable:
    """Decorator annotating each call of the function as ``name`` (calls it unchanged)."""
    if not isinstance(name, str):
        raise TypeError(f"trace_me name must be a str, got {type(name).__name__}")

    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with Trace(name):
                return fn(*args, **kwargs)
        return wrapper

    return decorator
