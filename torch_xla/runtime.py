"""torch_xla.runtime: the PJRT runtime as PyTorch/XLA exposes it."""
from __future__ import annotations

import os
from typing import Optional

from . import _C
from ._internal import plugins as _plugins
from ._internal import world as _world

_cache_path: Optional[str] = None
_spmd = False


def device_type() -> Optional[str]:
    """Returns the current PjRt device type (selects the default, CPU, if none is configured)."""
    return _plugins.device_type_from_env()


def local_process_count() -> int:
    """Returns the number of processes running on this host."""
    return _world.local_world_size()


def local_device_count() -> int:
    """Returns the total number of devices on this host."""
    return local_process_count() * addressable_device_count()


def addressable_device_count() -> int:
    """Returns the number of devices visible to this process."""
    return _C._device_count()


def global_device_count() -> int:
    """Returns the total number of devices across all processes/hosts."""
    return world_size() * addressable_device_count()


def global_runtime_device_count() -> int:
    """Returns the total number of runtime devices across all processes/hosts, especially useful
    for SPMD (where ``torch_xla.device()`` is one virtual device standing for all of them)."""
    return world_size() * _C._runtime_device_count()


def world_size() -> int:
    """Returns the total number of processes participating in the job."""
    return _world.world_size()


def global_ordinal() -> int:
    """Returns global ordinal of this thread within all processes (one device per process)."""
    return _world.rank()


def local_ordinal() -> int:
    """Returns local ordinal of this thread within this host."""
    return _world.local_rank()


def process_index() -> int:
    return global_ordinal()


def host_index() -> int:
    """Index of this host (torchrun's GROUP_RANK, or TORCH_XLA_HOST_INDEX under xmp.spawn)."""
    return _world.host_index()


def get_master_ip() -> str:
    """Retrieve the master worker IP for the runtime."""
    return os.environ.get("MASTER_ADDR", "127.0.0.1")


def use_spmd(auto: Optional[bool] = False):
    """API to enable SPMD mode. This is a recommended way to enable SPMD.

    Afterwards ``torch_xla.device()`` (xla:0) is one virtual device standing for every device of
    the process; tensors created on it are replicated on every device unless annotated with
    ``torch_xla.distributed.spmd.mark_sharding``. Each graph is compiled once for all devices by
    XLA's SPMD partitioner. This forces SPMD mode if some tensors are already initialized on xla:0:
    their data is replicated across the devices (pending work runs first). Tensors living on other
    devices (xla:1, ...) have no place in SPMD mode: the call raises ``RuntimeError`` naming them.
    SPMD mode lasts for the rest of the process.

    Args:
      auto (bool): Whether to enable the auto-sharding. Not available here: raises
        ``NotImplementedError`` (the PJRT plugin exposes no auto-sharding pass).
    """
    global _spmd
    if auto:
        raise NotImplementedError(
            "use_spmd(auto=True): XLA's auto-sharding pass is not reachable through this PJRT plugin; "
            "call use_spmd() and annotate tensors with torch_xla.distributed.spmd.mark_sharding")
    _C._use_spmd()
    _spmd = True


def is_spmd() -> bool:
    """Returns if SPMD is set for execution."""
    return _spmd or _C._is_spmd()


def initialize_cache(path: str, readonly: bool = False):
    """Initializes the persistent compilation cache. Must be called before any computation.

    Compiled executables are serialized (PJRT) into ``path``, one file per graph, keyed by the
    StableHLO text, the compile options, the plugin and its version, XLA_FLAGS and the devices.
    Writes are atomic; an unreadable entry is recompiled and replaced. With ``readonly=True`` the
    cache is read and never written.

    Args:
      path: the folder of the cache (created if missing, unless readonly).
      readonly: whether this worker may only read the cache.
    """
    global _cache_path
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str, got {type(path).__name__}")
    path = os.path.abspath(os.fspath(path))
    if _C._any_computation_ran():
        raise RuntimeError("initialize_cache() must be called before any computation has been performed")
    if _cache_path is not None and _cache_path != path:
        raise RuntimeError(f"the persistent cache is already initialized at {_cache_path}")
    _C._initialize_cache(path, bool(readonly))
    _cache_path = path


# ==== Compatibility additions (issue #8). ====
def set_device_type(pjrt_device: str) -> None:
    """Sets the PJRT device type (PJRT_DEVICE) to use; must be called before the runtime starts."""
    if not isinstance(pjrt_device, str) or not pjrt_device.strip():
        raise ValueError(f"pjrt_device must be a non-empty str, got {pjrt_device!r}")
    canonical = _plugins._canonical(pjrt_device) if _plugins._override_path() is None else pjrt_device.upper()
    if _C._client_started():
        current = _C._device_type()
        if current != canonical:
            raise RuntimeError(f"the runtime already started with device type {current}; "
                               f"set_device_type({pjrt_device!r}) must be called before any device use")
        return
    os.environ["PJRT_DEVICE"] = pjrt_device.strip().upper()


def using_pjrt() -> bool:
    """Always True: PJRT is the only runtime (kept for scripts written for the XRT transition)."""
    return True


def is_bf16_supported() -> bool:
    """Whether the device computes in bfloat16 (every PJRT plugin here does)."""
    return True


def process_count() -> int:
    """Number of processes in the job (same as world_size())."""
    return world_size()


def addressable_runtime_device_count() -> int:
    """Runtime devices this process can address (in SPMD mode, all those the virtual device spans)."""
    return _C._runtime_device_count()


def runtime_device_attributes(device) -> dict:
    """Attributes of one runtime device: ``{"name", "device_kind", "platform", "index"}``."""
    import torch
    d = torch.device(device) if not isinstance(device, int) else torch.device("xla", device)
    if d.type != "xla":
        raise ValueError(f"not an XLA device: {device}")
    idx = 0 if d.index is None else d.index
    _C._check_device(idx)
    platform = _C._platform()[0]
    return {"name": f"{_C._device_type()}:{idx}", "device_kind": _C._device_kind(idx), "platform": platform,
            "index": idx}


def global_runtime_device_attributes() -> list:
    """``runtime_device_attributes`` of every device (this process's devices: single host)."""
    return [runtime_device_attributes(i) for i in range(addressable_device_count())]


def get_num_cached_compilation_graph() -> int:
    """Number of compiled graphs held by the in-memory compile cache."""
    return int(_C._compile_cache_size())
