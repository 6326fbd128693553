"""torch_xla.debug.metrics: counters and metrics kept by the C++ core."""
from __future__ import annotations

import importlib
from typing import List, Optional, Tuple

from .. import _C  # noqa: F401  (loads the shared core the metrics live in)
from .._core import metrics as _met

_core = _met

_SHORT_COUNTERS = ["CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"]
_SHORT_METRICS = ["CompileTime", "ExecuteTime", "ExecuteReplicatedTime", "TransferToDeviceTime",
                  "TransferFromDeviceTime"]


def counter_names() -> List[str]:
    """Retrieves all the currently active counter names."""
    return list(_met.counter_names())


def counter_value(name: str) -> Optional[int]:
    """Returns the value of an active counter, or None if it does not exist."""
    return _met.counter_value(name)


def metric_names() -> List[str]:
    """Retrieves all the currently active metric names."""
    return list(_met.metric_names())


def metric_data(name: str) -> Optional[Tuple[int, float, list]]:
    """Returns (total_samples, accumulator, samples) of a metric, or None if it does not exist."""
    return _met.metric_data(name)


def metrics_report() -> str:
    """Retrieves a string containing the full metrics and counters report."""
    return _met.metrics_report(None, None)


def short_metrics_report(counter_names: Optional[List[str]] = None,
                         metric_names: Optional[List[str]] = None) -> str:
    """Retrieves a string containing the short metrics and counters report (aten:: counters always)."""
    if counter_names is None:
        counter_names = _SHORT_COUNTERS
    if metric_names is None:
        metric_names = _SHORT_METRICS
    return _met.metrics_report(list(counter_names), list(metric_names))


def clear_counters():
    _met.clear_counters()


def clear_metrics():
    _met.clear_metrics()


def clear_all():
    _met.clear_counters()
    _met.clear_metrics()


def executed_fallback_ops() -> List[str]:
    """Names of the aten ops that ran on the CPU fallback, as PyTorch/XLA reports them
    ("aten::nonzero", ...)."""
    return [n for n in counter_names() if n.startswith("aten::")]
