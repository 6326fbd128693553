"""XLA_METRICS_FILE: the metrics report appended to a file at every step, as upstream PyTorch/XLA.

``XLA_METRICS_FILE=<path>`` appends ``[MetricsData; step=N]`` and the report of
``torch_xla.debug.metrics.metrics_report()`` at every ``torch_xla.sync()`` / ``xm.mark_step()``
(and once more when the process exits). With several processes each writes ``<path>.<ordinal>``.
``STDOUT`` / ``STDERR`` print the block there instead. Each block is one ``write`` to a file opened
for appending, so concurrent writers never interleave inside a block.
"""
import os
import sys
import threading

__all__ = ["save_metrics"]

_LOCK = threading.Lock()
_step = 0


def _metrics_file():
    path = os.environ.get("XLA_METRICS_FILE", "").strip()
    if not path or path in ("STDOUT", "STDERR"):
        return path or None
    try:
        from torch_xla import runtime as xr
        if xr.world_size() > 1:
            path = f"{path}.{xr.local_ordinal()}"
    except Exception:  # before the runtime exists: one process
        pass
    return path


def save_metrics(metrics_file=None):
    """Appends this step's metrics report to ``metrics_file`` (default: $XLA_METRICS_FILE)."""
    global _step
    if metrics_file is None:
        metrics_file = _metrics_file()
    if not metrics_file:
        return
    from torch_xla.debug import metrics as met
    with _LOCK:
        data = f"[MetricsData; step={_step}]\n{met.metrics_report()}\n"
        _step += 1
    if metrics_file == "STDOUT":
        print(data)
    elif metrics_file == "STDERR":
        print(data, file=sys.stderr)
    else:
        try:
            with open(metrics_file, "a") as f:
                f.write(data)
        except OSError as e:
            print(f"[torch_xla] XLA_METRICS_FILE: cannot write {metrics_file}: {e}", file=sys.stderr)
