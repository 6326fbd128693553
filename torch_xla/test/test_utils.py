"""torch_xla.test.test_utils: printing and summary helpers used by PyTorch/XLA's example scripts."""
from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from typing import Any, Dict, Optional

import torch


def now(format: str = "%H:%M:%S") -> str:
    return datetime.now().strftime(format)


def _value(v: Any):
    if isinstance(v, torch.Tensor):
        return v.item()
    return v


def print_training_update(device, step, loss, rate, global_rate, epoch=None, summary_writer=None):
    """Prints one training-progress line (reads ``loss`` if it is a tensor: a sync)."""
    update = ["Training", f"Device={device}", f"Epoch={epoch}" if epoch is not None else None,
              f"Step={step}", f"Loss={_value(loss):.5f}", f"Rate={rate:.2f}", f"GlobalRate={global_rate:.2f}",
              f"Time={now()}"]
    print("|", " ".join(u for u in update if u is not None), flush=True)
    if summary_writer is not None:
        write_to_summary(summary_writer, step, {"loss": _value(loss), "rate": rate, "global_rate": global_rate})


def print_test_update(device, accuracy, epoch=None, step=None):
    """Prints one evaluation line."""
    update = ["Test", f"Device={device}", f"Step={step}" if step is not None else None,
              f"Epoch={epoch}" if epoch is not None else None, f"Accuracy={_value(accuracy):.2f}",
              f"Time={now()}"]
    print("|", " ".join(u for u in update if u is not None), flush=True)


def get_summary_writer(logdir: Optional[str]):
    """A TensorBoard ``SummaryWriter`` for ``logdir`` on the master ordinal; None when ``logdir``
    is None, on other ordinals, or when tensorboard is not installed."""
    if not logdir:
        return None
    from torch_xla import runtime as xr
    if xr.global_ordinal() != 0:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard missing
        print(f"get_summary_writer: tensorboard is not installed; not writing to {logdir}", file=sys.stderr)
        return None
    return SummaryWriter(log_dir=logdir)


def write_to_summary(summary_writer, global_step: Optional[int] = None, dict_to_write: Dict[str, Any] = {},
                     write_xla_metrics: bool = False) -> None:
    """Writes scalars (and optionally the XLA metrics) to a summary writer (no-op when None)."""
    if summary_writer is None:
        return
    for k, v in dict_to_write.items():
        summary_writer.add_scalar(k, _value(v), global_step)
    if write_xla_metrics:
        import torch_xla.debug.metrics as met
        for name in met.metric_names():
            data = met.metric_data(name)
            if data is not None:
                summary_writer.add_scalar(f"xla/metrics/{name}/total_samples", data[0], global_step)
                summary_writer.add_scalar(f"xla/metrics/{name}/accumulator", data[1], global_step)
        for name in met.counter_names():
            summary_writer.add_scalar(f"xla/counters/{name}", met.counter_value(name), global_step)


def close_summary_writer(summary_writer) -> None:
    if summary_writer is not None:
        summary_writer.flush()
        summary_writer.close()


def mp_test(func):
    """Decorator for tests run under multiprocessing: exits the process with 0/1 (pass/fail) so
    that the launcher sees the result."""
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            func(*args, **kwargs)
        except Exception as e:
            print(f"{func.__name__} failed: {e!r}", file=sys.stderr)
            sys.exit(1)
        sys.exit(0)

    return wrapper
