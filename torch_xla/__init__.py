"""PyTorch/XLA's Python API on a C++ core.

Aten ops on ``xla`` tensors are recorded lazily; :func:`sync` compiles the pending graph to
StableHLO and runs it with XLA through a PJRT plugin (CPU by default, ``PJRT_DEVICE`` picks
another). Importing this package is cheap: the runtime starts on first device use.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
from importlib import metadata as _metadata
from typing import Callable, List, Optional

import torch

from . import _C  # registers the XLA kernels with the dispatcher
from ._internal import custom_ops as _custom_ops

_custom_ops.install()  # composite custom ops run under functionalization on XLA tensors
from ._internal import plugins as _plugins
from ._internal import storage as _storage

_storage.install()

from . import _dynamo as _dynamo_backends  # noqa: E402

_dynamo_backends.install()  # torch.compile(backend="openxla") settings, applied when torch loads it

try:
    __version__ = _metadata.version("torch_xla")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "2.9.0+txla"


def _resolve_runtime():
    path, device_type = _plugins.plugin_for(None)
    _plugins.default_xla_flags()
    _plugins.validate_xla_flags(path)
    if device_type == "CUDA":
        from ._internal import cuda_libs

        cuda_libs.preload()  # cuBLAS/cuDNN/... from the nvidia.* wheels, as JAX does (see cuda_libs.py)
        # XLA:GPU's DEFAULT precision runs float32 dots and convolutions in TF32; eager's float32 matmuls
        # run in full float32. Until the user chooses (torch_xla.backends.set_mat_mul_precision;
        # 'default' allows TF32), float32 dots and convolutions on CUDA are HIGHEST.
        _C._set_platform_f32_mat_mul_precision(2)
    # CPU_NUM_DEVICES is the CPU plugin's option only: the CUDA plugin refuses unknown option names.
    count = _plugins.cpu_device_count() if device_type == "CPU" else -1
    if device_type == "CPU" and (os.environ.get("TORCH_XLA_SPAWNED") == "1"
                                 or os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1")):
        count = 1  # one process per device: each process of a multi-process job sees one device
    return path, device_type, count, _plugins.client_options(device_type)


_C._set_config_resolver(_resolve_runtime)

import atexit as _atexit

from ._internal import autograd_exit as _autograd_exit

_atexit.register(_autograd_exit.drain)


def _check_index(index: int) -> int:
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"device index must be an int, got {type(index).__name__}")
    n = _C._device_count()
    if index < 0 or index >= n:
        raise IndexError(f"XLA device index {index} is out of range: this process has {n} device(s)")
    return index


def device(index: Optional[int] = None) -> torch.device:
    """Returns a given instance of an XLA device (the default device when ``index`` is None)."""
    if index is None:
        _C._device_count()  # starts the runtime; raises if the plugin is missing
        return torch.device("xla", 0)
    return torch.device("xla", _check_index(index))


def devices() -> List[torch.device]:
    """Returns all devices available in the current process."""
    return [torch.device("xla", i) for i in range(_C._device_count())]


def device_count() -> int:
    """Returns number of addressable devices in the current process."""
    return _C._device_count()


_METRICS_FILE = bool(os.environ.get("XLA_METRICS_FILE", "").strip())


def sync(wait: bool = False):
    """Launches all pending graph operations.

    Args:
      wait: whether to block the current process until the execution finished.
    """
    from .core import xla_model as _xm
    _xm._run_step_closures_before_sync()
    _C._sync(None, wait, "")
    from .debug import metrics as _met
    _met._core.increment_counter("MarkStep")
    if _METRICS_FILE:
        from .debug import metrics_saver
        metrics_saver.save_metrics()
    _xm._run_step_closures()


def manual_seed(seed, device=None):
    """Set the seed for generating random numbers for the current XLA device."""
    from .core import xla_model as _xm
    _xm.set_rng_state(seed, device)


# The device-module protocol. This package is torch's "xla" device module (`torch.xla`, registered at
# import below; PyTorch/XLA leaves that to scripts, which write `torch._register_device_module("xla",
# torch_xla)` so that torch.utils.checkpoint accepts XLA tensors). checkpoint and
# torch.random.fork_rng save and restore the device's random number generator through
# `_initialized`, `get_rng_state` and `set_rng_state`. Without them checkpoint skipped the XLA
# generator and the recomputed forward drew new dropout masks: wrong gradients.
_initialized = True


def _rng_device_index(device) -> int:
    if device is None:
        # inside `with torch_xla.device(i):` (what checkpoint does) the default device is xla:i
        d = torch.get_default_device()
        return (d.index or 0) if d.type == "xla" else 0
    if isinstance(device, int) and not isinstance(device, bool):
        return _check_index(device)
    from .core import xla_model as _xm
    return _xm._parse_index(device)


def get_rng_state(device=None) -> torch.Tensor:
    """Returns the XLA device's random number generator state as a 0-dim uint64 XLA tensor.

    Reading it runs nothing (the state may still be pending); `set_rng_state` takes it back, so
    random ops after it repeat what followed `get_rng_state` (``xm.get_rng_state`` returns the seed
    as an int instead, running what is pending).
    """
    return _C._rng_state(_rng_device_index(device))


def set_rng_state(new_state, device=None) -> None:
    """Sets the XLA device's random number generator state: a state from `get_rng_state`, or an int
    seed (as ``xm.set_rng_state``)."""
    idx = _rng_device_index(device)
    if isinstance(new_state, torch.Tensor) and new_state.device.type == "xla":
        _C._set_rng_state(new_state, idx)
        return
    if isinstance(new_state, torch.Tensor):
        if new_state.numel() != 1:
            raise ValueError(f"set_rng_state: expected a state from torch_xla.get_rng_state(), got a tensor of "
                             f"shape {tuple(new_state.shape)}")
        new_state = int(new_state.item())
    if not isinstance(new_state, int) or isinstance(new_state, bool):
        raise TypeError(f"set_rng_state: expected a state from torch_xla.get_rng_state() or an int, got "
                        f"{type(new_state).__name__}")
    _C._set_seed(new_state & 0xFFFFFFFFFFFFFFFF, idx)


def compile(f: Optional[Callable] = None, full_graph: Optional[bool] = False, name: Optional[str] = None,
            num_different_graphs_allowed: Optional[int] = None):
    """Optimizes given model/function using torch_xla's LazyTensor tracing mode.

    The function is traced into one graph, which is compiled and run at the end of the call.
    Works as a decorator (``@torch_xla.compile()``), a wrapper (``torch_xla.compile(fn)``) and a
    context manager (``with torch_xla.compile(): ...``).
    """
    from ._compile import compile as _compile
    return _compile(f, full_graph=full_graph, name=name, num_different_graphs_allowed=num_different_graphs_allowed)


def launch(fn: Callable, args: tuple = (), start_method: str = "spawn", debug_single_process: bool = False):
    """Runs ``fn(index, *args)`` in one process per device (``xmp.spawn``), or, under torchrun
    (``TORCHELASTIC_RUN_ID``/``LOCAL_RANK`` set), directly in this process with its global index."""
    if os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("TORCH_XLA_SPAWNED") == "1" or (
            "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ):
        from . import runtime as _xr
        fn(_xr.global_ordinal(), *args)
        return None
    from .distributed import xla_multiprocessing as _xmp
    return _xmp.spawn(fn, args=args, nprocs=1 if debug_single_process else None, start_method=start_method)


@contextlib.contextmanager
def step():
    """Marks one step: pending work is synced on entry, and everything traced inside runs when the
    block exits (``with torch_xla.step(): loss = train_step(batch)``)."""
    sync()
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        if failed:
            try:
                sync()
            except Exception:  # the original exception is the one to report
                pass
        else:
            sync()


def real_devices() -> List[str]:
    """Runtime names of this process's devices ("CPU:0", "CUDA:0", "TPU:0", ...)."""
    from . import _XLAC
    return _XLAC._xla_real_devices()


if os.environ.get("XLA_METRICS_FILE", "").strip():  # upstream appends the report at every step
    from .debug import metrics_saver as _metrics_saver
    atexit.register(_metrics_saver.save_metrics)

from . import _XLAC  # noqa: E402  (upstream's low-level hooks; pure Python over _C)
from . import experimental  # noqa: E402,F401
from ._internal import device_module as _device_module  # noqa: E402

_device_module.install()  # torch.xla: torch's non-reentrant checkpoint looks it up

__all__ = ["device", "devices", "device_count", "sync", "compile", "manual_seed", "step", "real_devices",
           "launch", "__version__"]
