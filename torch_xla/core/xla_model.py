"""torch_xla.core.xla_model: the classic PyTorch/XLA API."""
from __future__ import annotations

import io
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

import torch_xla
from torch_xla import _C
from torch_xla import runtime as xr

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

_step_closures: List[Tuple[Callable, tuple, bool]] = []
_closure_lock = threading.Lock()


def _parse_index(device: Union[str, torch.device]) -> int:
    d = torch.device(device)
    if d.type != "xla":
        raise ValueError(f"not an XLA device: {device}")
    return 0 if d.index is None else d.index


def xla_device(n: Optional[int] = None, devkind: Optional[str] = None) -> torch.device:
    """Returns a given instance of an XLA device."""
    if devkind is not None and devkind.upper() not in ("CPU", "TPU", "CUDA", "GPU", xr.device_type()):
        raise ValueError(f"unknown XLA device kind {devkind!r}")
    return torch_xla.device(n)


def get_xla_supported_devices(devkind: Optional[str] = None, max_devices: Optional[int] = None) -> List[str]:
    n = _C._device_count()
    if max_devices is not None:
        n = min(n, max_devices)
    return [f"xla:{i}" for i in range(n)]


def xla_device_hw(device: Union[str, torch.device]) -> str:
    """Returns the hardware type of the given device ("CPU", "CUDA", "TPU", ...)."""
    idx = _parse_index(device)
    _C._check_device(idx)
    dt = _C._device_type()
    return "CUDA" if dt == "GPU" else dt


def xla_real_devices(devices: Optional[List[Union[str, torch.device]]] = None) -> List[str]:
    if devices is None:
        devices = torch_xla.devices()
    hw = xr.device_type()
    return [f"{hw}:{_parse_index(d)}" for d in devices]


def is_master_ordinal(local: bool = True) -> bool:
    """Checks whether the current process is the master ordinal (0)."""
    return (xr.local_ordinal() if local else xr.global_ordinal()) == 0


def xrt_world_size(defval: int = 1) -> int:
    return xr.world_size()


def get_ordinal(defval: int = 0) -> int:
    return xr.global_ordinal()


def get_local_ordinal(defval: int = 0) -> int:
    return xr.local_ordinal()


def mark_step(wait: bool = False, reset_scope: bool = True):
    """Compiles and runs all pending work (same as torch_xla.sync)."""
    torch_xla.sync(wait)


def wait_device_ops(devices: List[str] = []):
    """Waits for all the async operations on the given devices to complete."""
    _C._wait_device_ops()


def add_step_closure(closure: Callable[..., Any], args: Tuple[Any, ...] = (), run_async: bool = False):
    """Adds a closure to the list of the ones to be run at the end of the step."""
    with _closure_lock:
        _step_closures.append((closure, tuple(args), run_async))


def _run_step_closures_before_sync():
    pass


def _run_step_closures():
    with _closure_lock:
        closures = list(_step_closures)
        _step_closures.clear()
    for fn, args, run_async in closures:
        if run_async:
            threading.Thread(target=fn, args=args, daemon=True).start()
        else:
            fn(*args)


def get_stablehlo(tensors: Optional[List[torch.Tensor]] = None) -> str:
    """StableHLO text of the graph computing ``tensors`` (all pending tensors when empty)."""
    return _C._get_stablehlo(list(tensors or []))


def get_stablehlo_bytecode(tensors: Optional[List[torch.Tensor]] = None) -> bytes:
    """The graph computing ``tensors`` (all pending tensors when empty) as MLIR bytecode.

    XLA (the PJRT plugin) compiles these bytes again. Needs the `jax` and `jaxlib` packages for
    MLIR's bytecode writer.
    """
    text = get_stablehlo(tensors)
    try:
        from jax._src.interpreters import mlir as _jmlir
        from jax._src.lib.mlir import ir as _ir
    except ImportError as e:
        raise RuntimeError("get_stablehlo_bytecode needs MLIR's bytecode writer from jax/jaxlib: "
                           "pip install jax jaxlib") from e
    buf = io.BytesIO()
    with _jmlir.make_ir_context():
        module = _ir.Module.parse(text)
        module.operation.write_bytecode(buf)
    return buf.getvalue()


def get_rng_state(device: Optional[Union[str, torch.device]] = None) -> int:
    """Gets the current running random number generator state."""
    idx = 0 if device is None else _parse_index(device)
    return int(_C._get_seed(idx))


def set_rng_state(seed: int, device: Optional[Union[str, torch.device]] = None):
    """Sets the random number generator state."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    idx = 0 if device is None else _parse_index(device)
    _C._set_seed(seed & 0xFFFFFFFFFFFFFFFF, idx)


def all_reduce(reduce_type: str, inputs, scale: float = 1.0, groups=None, pin_layout: bool = True):
    """Performs an inplace reduce operation on the input tensor(s) (single process: identity * scale)."""
    if reduce_type not in (REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX):
        raise ValueError(f"invalid reduce_type {reduce_type!r}")
    if xr.world_size() > 1:
        raise NotImplementedError("multi-process collectives are not implemented yet in this torch_xla build")
    if isinstance(inputs, torch.Tensor):
        return inputs * scale if scale != 1.0 else inputs.clone()
    if scale != 1.0:
        for t in inputs:
            t.mul_(scale)
    return inputs


def reduce_gradients(optimizer, groups=None, pin_layout: bool = True):
    if xr.world_size() > 1:
        raise NotImplementedError("multi-process collectives are not implemented yet in this torch_xla build")


def optimizer_step(optimizer, barrier: bool = False, optimizer_args: Dict = {}, groups=None,
                   pin_layout: bool = True):
    """Run the provided optimizer step and sync gradients across all devices."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
        mark_step()
    return loss


def _maybe_convert_to_cpu(data: Any, convert: bool = True) -> Any:
    def convert_fn(t):
        return t.cpu() if isinstance(t, torch.Tensor) and t.device.type == "xla" else t
    return _apply(data, convert_fn) if convert else data


def _apply(data, fn):
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return {k: _apply(v, fn) for k, v in data.items()}
    if isinstance(data, (list, tuple)) and not hasattr(data, "_fields"):
        return type(data)(_apply(v, fn) for v in data)
    return data


def save(data: Any, file_or_path, master_only: bool = True, global_master: bool = False):
    """Saves the input data into a file (moved to the CPU first)."""
    should_write = not master_only or is_master_ordinal(local=not global_master)
    cpu_data = _maybe_convert_to_cpu(data)
    if should_write:
        if isinstance(file_or_path, (str, os.PathLike)):
            tmp = f"{file_or_path}.tmp.{os.getpid()}"
            torch.save(cpu_data, tmp)
            os.replace(tmp, file_or_path)
        else:
            torch.save(cpu_data, file_or_path)


def rendezvous(tag: str, payload: bytes = b"", replicas: List[int] = []) -> List[bytes]:
    """Waits for all the mesh clients to reach the named rendezvous (single process: immediate)."""
    if xr.world_size() > 1:
        raise NotImplementedError("multi-process rendezvous is not implemented yet in this torch_xla build")
    return [payload]


def mesh_reduce(tag: str, data, reduce_fn: Callable[..., Any]):
    """Performs an out-of-graph client mesh reduction (single process: reduce_fn([data]))."""
    return reduce_fn([data])


def get_memory_info(device: Optional[torch.device] = None) -> Dict[str, int]:
    """Memory of the device in KB. On CPU this reports the host's memory."""
    total = free = 0
    try:
        with open("/proc/meminfo") as f:
            info = {l.split(":")[0]: int(l.split()[1]) for l in f if len(l.split()) >= 2}
        total, free = info.get("MemTotal", 0), info.get("MemAvailable", 0)
    except OSError:
        pass
    return {"kb_free": free, "kb_total": total, "bytes_used": (total - free) * 1024, "bytes_limit": total * 1024}


# ==== Compatibility additions (issue #8: classic-API names). Kept in one block at the end. ====
import queue as _queue
import sys as _sys
import time as _time


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a tensor on an XLA device."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xla"


def master_print(*args, fd=None, local: bool = False, flush: bool = False):
    """``print`` on the master ordinal only (``local=True``: each host's master); ``fd`` defaults
    to the current ``sys.stdout``."""
    if is_master_ordinal(local=local):
        print(*args, file=_sys.stdout if fd is None else fd, flush=flush)


class RateTracker:
    """Tracks a rate (e.g. samples/second): ``add(count)`` then ``rate()`` (smoothed rate since the
    last ``rate()`` call) or ``global_rate()`` (since creation)."""

    def __init__(self, smooth_factor: Optional[float] = None):
        self._smooth_factor = 0.4 if smooth_factor is None else float(smooth_factor)
        if not 0.0 <= self._smooth_factor <= 1.0:
            raise ValueError(f"smooth_factor must be in [0, 1], got {smooth_factor!r}")
        self._start_time = _time.time()
        self._partial_time = self._start_time
        self._partial_count = 0.0
        self._partial_rate: Optional[float] = None
        self._count = 0.0

    def add(self, count: float):
        self._count += count
        self._partial_count += count

    def rate(self) -> float:
        now = _time.time()
        delta = now - self._partial_time
        current = self._partial_count / delta if delta > 0 else 0.0
        if self._partial_rate is None:
            self._partial_rate = current
        else:
            sf = self._smooth_factor
            self._partial_rate = self._partial_rate * (1.0 - sf) + current * sf
        self._partial_time = now
        self._partial_count = 0.0
        return self._partial_rate

    def global_rate(self) -> float:
        delta = _time.time() - self._start_time
        return self._count / delta if delta > 0 else 0.0


class ToXlaTensorArena:
    """Converts the tensors selected by ``select_fn`` in a nested structure in one batch:
    ``transform(inputs)`` collects them (each distinct tensor once), calls
    ``convert_fn(list_of_tensors) -> list_of_tensors`` and returns the structure rebuilt with the
    converted tensors (lists, tuples, dicts, namedtuples, DataWrapper and plain objects)."""

    def __init__(self, convert_fn: Callable[[List[torch.Tensor]], List[torch.Tensor]],
                 select_fn: Callable[[Any], bool]):
        self._convert_fn = convert_fn
        self._select_fn = select_fn

    def transform(self, inputs):
        from torch_xla.utils import utils as _xu
        collected: List[Any] = []
        index: Dict[int, int] = {}

        def collect(t):
            if id(t) not in index:
                index[id(t)] = len(collected)
                collected.append(t)

        _xu.for_each_instance(inputs, self._select_fn, collect)
        converted = list(self._convert_fn(list(collected))) if collected else []
        if len(converted) != len(collected):
            raise RuntimeError(f"ToXlaTensorArena: convert_fn returned {len(converted)} tensors for "
                               f"{len(collected)} inputs")
        return _xu.for_each_instance_rewrite(inputs, self._select_fn, lambda t: converted[index[id(t)]])


def send_cpu_data_to_device(datas, device, input_sharding=None):
    """Copies every CPU tensor in ``datas`` (any nesting) to ``device``; a lone tensor is returned
    as a one-element list, as in PyTorch/XLA."""
    if input_sharding is not None:
        raise NotImplementedError("send_cpu_data_to_device(input_sharding=...) needs SPMD, which this "
                                  "torch_xla build does not implement yet")
    device = torch.device(device)
    if device.type != "xla":
        raise ValueError(f"send_cpu_data_to_device: not an XLA device: {device}")

    def convert_fn(tensors):
        return [t.to(device) for t in tensors]

    def select_fn(v):
        return type(v) == torch.Tensor and v.device.type == "cpu"

    if type(datas) is torch.Tensor:
        datas = [datas]
    return ToXlaTensorArena(convert_fn, select_fn).transform(datas)


def optimization_barrier_(tensors: List[torch.Tensor]):
    """Blocks XLA from moving computations across this point for ``tensors`` (in place: each
    tensor's value becomes the output of one ``stablehlo.optimization_barrier``; values are
    unchanged)."""
    if isinstance(tensors, torch.Tensor):
        raise TypeError("optimization_barrier_ expects a list of tensors")
    tensors = list(tensors)
    for t in tensors:
        if not is_xla_tensor(t):
            raise ValueError(f"optimization_barrier_ expects XLA tensors, got {type(t).__name__} "
                             f"on {getattr(t, 'device', None)}")
    _C._optimization_barrier(tensors)


def check_view_sharing(obj):
    """Raises if two tensors in ``obj`` (nested) share storage as views (they must not be saved)."""
    seen: Dict[Any, torch.Tensor] = {}
    from torch_xla.utils import utils as _xu

    def check(t):
        base = t._base if t._base is not None else None
        if base is not None:
            raise RuntimeError(f"tensor of shape {list(t.shape)} is a view of another tensor; "
                               "save the base tensor and recreate the view after loading")

    _xu.for_each_instance(obj, lambda x: isinstance(x, torch.Tensor), check)


def do_on_ordinals(target: Callable[..., Any], data=(), ordinals=(0,)):
    """Calls ``target(*data)`` on the given ordinals only (returns None elsewhere)."""
    if get_ordinal() in ordinals:
        return target(*data)
    return None


def unlazy(tensors: List[torch.Tensor]):
    """Materializes ``tensors`` (runs just the graph they need)."""
    _C._sync([t for t in tensors if is_xla_tensor(t)], False, "")


# Step closures: run_async closures run in order on one worker thread; an exception raised by one
# is re-raised by the next torch_xla.sync() (these definitions replace the earlier ones).
_async_closure_queue: "_queue.Queue" = _queue.Queue()
_async_closure_error: List[BaseException] = []
_async_closure_worker: Optional[threading.Thread] = None


def _async_closure_loop():
    while True:
        fn, args = _async_closure_queue.get()
        try:
            fn(*args)
        except BaseException as e:  # noqa: B902 - re-raised on the main thread at the next sync
            with _closure_lock:
                _async_closure_error.append(e)
        finally:
            _async_closure_queue.task_done()


def _submit_async_closure(fn, args):
    global _async_closure_worker
    with _closure_lock:
        if _async_closure_worker is None or not _async_closure_worker.is_alive():
            _async_closure_worker = threading.Thread(target=_async_closure_loop, name="xla-step-closures",
                                                     daemon=True)
            _async_closure_worker.start()
    _async_closure_queue.put((fn, args))


def _raise_async_closure_error():
    with _closure_lock:
        err = _async_closure_error[0] if _async_closure_error else None
        _async_closure_error.clear()
    if err is not None:
        raise RuntimeError(f"an asynchronous step closure raised: {err!r}") from err


def _run_step_closures_before_sync():
    _raise_async_closure_error()


def _run_step_closures():
    with _closure_lock:
        closures = list(_step_closures)
        _step_closures.clear()
    for fn, args, run_async in closures:
        if run_async:
            _submit_async_closure(fn, args)
        else:
            fn(*args)


def _wait_async_step_closures():
    """Waits for queued asynchronous step closures (tests, shutdown)."""
    _async_closure_queue.join()
    _raise_async_closure_error()
