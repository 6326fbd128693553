"""torch_xla.core.xla_model: the classic PyTorch/XLA API."""
from __future__ import annotations

import io
import re
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
    """StableHLO text of the graph computing ``tensors`` (all pending tensors when empty).

    Printed as the MLIR printer prints it (``stablehlo.concatenate %0, %1, dim = 1``; with
    ``XLA_HLO_DEBUG=1`` Python source locations as ``#loc`` aliases), through the MLIR bindings of
    jax/jaxlib; without them, the generic form this build's lowering emits.
    """
    return _pretty_stablehlo(_C._get_stablehlo(list(tensors or [])))


_LOC_FROM_PARSER = re.compile(r'loc\("-":\d+:\d+\)')


def _pretty_stablehlo(text: str) -> str:
    try:
        from jax._src.interpreters import mlir as _jmlir
        from jax._src.lib.mlir import ir as _ir
    except ImportError:
        return text
    debug = os.environ.get("XLA_HLO_DEBUG", "0") not in ("", "0")
    try:
        with _jmlir.make_ir_context():
            module = _ir.Module.parse(text)
            pretty = module.operation.get_asm(enable_debug_info=debug)
    except Exception:  # noqa: BLE001 - a printer problem must never hide the module
        return text
    # Ops without a Python source location would show the parser's own position in our text.
    return _LOC_FROM_PARSER.sub("loc(unknown)", pretty) if debug else pretty


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


# --------------------------------------------------------------------------------------------------
# Collectives. Between processes they run on the backend of torch_xla._internal.collectives (host
# gloo on CPU); within a group of one process they stay lazy (identity semantics, no host read).


def _group_of(groups) -> Tuple[int, ...]:
    from torch_xla._internal import world
    return world.my_group(groups)


def _collectives():
    from torch_xla._internal import collectives
    return collectives.backend()


_REDUCE_TYPES = (REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX)


def _check_reduce(reduce_type: str, tensors):
    if reduce_type not in _REDUCE_TYPES:
        raise ValueError(f"invalid reduce_type {reduce_type!r}; expected one of {', '.join(_REDUCE_TYPES)}")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected tensors, got {type(t).__name__}")
        if reduce_type in (REDUCE_AND, REDUCE_OR) and (t.is_floating_point() or t.is_complex()):
            raise ValueError(f"all_reduce {reduce_type!r} needs integer or bool tensors, got {t.dtype}")


def all_reduce(reduce_type: str, inputs, scale: float = 1.0, groups=None, pin_layout: bool = True):
    """Performs an inplace reduce operation on the input tensor(s).

    A single tensor gives a new tensor holding the reduced value; a list/tuple is reduced in place
    and returned. ``groups`` (a list of lists of ranks partitioning the world) reduces within each
    group. ``pin_layout`` is accepted for compatibility (host collectives have no layouts).
    """
    single = isinstance(inputs, torch.Tensor)
    tensors = [inputs] if single else list(inputs)
    _check_reduce(reduce_type, tensors)
    group = _group_of(groups)
    if len(group) == 1:
        if single:
            return inputs * scale if scale != 1.0 else inputs.clone()
        if scale != 1.0:
            with torch.no_grad():
                for t in tensors:
                    t.mul_(scale)
        return inputs
    results = _collectives().all_reduce(reduce_type, tensors, float(scale), group)
    if single:
        return results[0]
    with torch.no_grad():
        for t, r in zip(tensors, results):
            t.copy_(r)
    return inputs


def all_gather(value: torch.Tensor, dim: int = 0, groups=None, output: Optional[torch.Tensor] = None,
               pin_layout: bool = True):
    """Performs an all-gather operation along a given dimension (results ordered by rank in group)."""
    single = isinstance(value, torch.Tensor)
    tensors = [value] if single else list(value)
    group = _group_of(groups)
    if len(group) == 1:
        results = [t.clone() if t.dim() else t.reshape(1).clone() for t in tensors]
    else:
        results = _collectives().all_gather(tensors, dim, group)
    return _deliver(results, single, output)


def _deliver(results, single: bool, output):
    """Collective results: copied into ``output`` (a tensor or a list) when given, else returned."""
    if output is not None:
        outs = [output] if single else list(output)
        with torch.no_grad():
            for o, r in zip(outs, results):
                o.copy_(r)
        return output
    return results[0] if single else results


def reduce_scatter(reduce_type: str, input, scale: float, scatter_dim: int, shard_count: int, groups=None,
                   output=None, pin_layout: bool = True):
    """Reduces ``input`` over the group, then gives each member its shard along ``scatter_dim``
    (``shard_count`` must equal the group size)."""
    single = isinstance(input, torch.Tensor)
    tensors = [input] if single else list(input)
    _check_reduce(reduce_type, tensors)
    group = _group_of(groups)
    if shard_count != len(group):
        raise ValueError(f"reduce_scatter: shard_count={shard_count} but the group has {len(group)} member(s)")
    if len(group) == 1:
        results = [t * scale if scale != 1.0 else t.clone() for t in tensors]
    else:
        results = _collectives().reduce_scatter(reduce_type, tensors, float(scale), scatter_dim, group)
    return _deliver(results, single, output)


def all_to_all(value: torch.Tensor, split_dimension: int, concat_dimension: int, split_count: int, groups=None,
               pin_layout: bool = True) -> torch.Tensor:
    """Splits ``value`` into ``split_count`` chunks along ``split_dimension``, sends chunk k to the
    k-th member of the group and concatenates the received chunks along ``concat_dimension``."""
    group = _group_of(groups)
    if split_count != len(group):
        raise ValueError(f"all_to_all: split_count={split_count} but the group has {len(group)} member(s)")
    if len(group) == 1:
        return value.clone()
    return _collectives().all_to_all(value, split_dimension, concat_dimension, group)


def collective_broadcast(tensors: List[torch.Tensor], root_ordinal: int = 0, groups=None, pin_layout: bool = True):
    """Copies the root's values into ``tensors`` on every member of the group (in place)."""
    tensors = list(tensors)
    group = _group_of(groups)
    if root_ordinal not in group:
        raise ValueError(f"collective_broadcast: root_ordinal {root_ordinal} is not in this rank's group {list(group)}")
    if len(group) == 1 or not tensors:
        return
    results = _collectives().broadcast(tensors, root_ordinal, group)
    with torch.no_grad():
        for t, r in zip(tensors, results):
            t.copy_(r)


def broadcast_master_param(model: torch.nn.Module) -> None:
    """Broadcasts the parameters and buffers of rank 0's ``model`` to every process."""
    tensors = list(model.parameters()) + list(model.buffers())
    collective_broadcast(tensors)
    mark_step()


def _grads(optimizer) -> List[torch.Tensor]:
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def reduce_gradients(optimizer, groups=None, pin_layout: bool = True):
    """Averages the gradients of ``optimizer``'s parameters over the group (all processes by default)."""
    group = _group_of(groups)
    if len(group) == 1:
        return
    grads = _grads(optimizer)
    if not grads:
        return
    # Host collectives read the gradients: the backward pass (and the loss) run now as one graph,
    # not once for the gradients and again at the next sync for the rest. In-graph ones stay lazy.
    if _collectives().needs_host_values:
        _C._sync(None, False, "")
    all_reduce(REDUCE_SUM, grads, scale=1.0 / len(group), groups=groups, pin_layout=pin_layout)


def optimizer_step(optimizer, barrier: bool = False, optimizer_args: Dict = {}, groups=None,
                   pin_layout: bool = True):
    """Run the provided optimizer step and sync gradients across all devices."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
        mark_step()
    return loss


def _xla_tensors_in(data, out: List[torch.Tensor], seen=None):
    if seen is None:
        seen = set()
    if id(data) in seen:
        return out
    if isinstance(data, torch.Tensor):
        if data.device.type == "xla":
            seen.add(id(data))
            out.append(data)
    elif isinstance(data, dict):
        for v in data.values():
            _xla_tensors_in(v, out, seen)
    elif isinstance(data, (list, tuple, set, frozenset)):
        for v in data:
            _xla_tensors_in(v, out, seen)
    return out


def _maybe_convert_to_cpu(data: Any, convert: bool = True) -> Any:
    """Runs the pending work of every XLA tensor in ``data`` (one graph); with ``convert`` returns
    a copy of ``data`` whose XLA tensors are CPU tensors (a tensor shared twice stays shared)."""
    xla = _xla_tensors_in(data, [])
    if xla:
        _C._sync(xla, False, "")
    if not convert:
        return data
    memo: Dict[int, torch.Tensor] = {}

    def convert_fn(t):
        if t.device.type != "xla":
            return t
        if id(t) not in memo:
            memo[id(t)] = t.cpu()
        return memo[id(t)]
    return _apply(data, convert_fn)


def _apply(data, fn):
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        items = [(k, _apply(v, fn)) for k, v in data.items()]
        try:
            return type(data)(items)
        except TypeError:
            return dict(items)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(_apply(v, fn) for v in data))
    if isinstance(data, (list, tuple, set, frozenset)):
        return type(data)(_apply(v, fn) for v in data)
    return data


_SAVE_TAG = "torch_xla.core.xla_model.save"


def _atomic_torch_save(obj, path):
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}.{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save(data: Any, file_or_path, master_only: bool = True, global_master: bool = False):
    """Saves the input data into a file (tensors moved to the CPU first).

    Every process calls it; with ``master_only`` only the (local, or global with
    ``global_master``) master writes. A path is written atomically (temporary file in the same
    folder, then ``os.replace``). All processes then meet at the rendezvous
    ``"torch_xla.core.xla_model.save"`` (a process that never arrives makes the others raise a
    timeout error naming that tag).
    """
    should_write = not master_only or is_master_ordinal(local=not global_master)
    cpu_data = _maybe_convert_to_cpu(data, convert=should_write)
    if should_write:
        if isinstance(file_or_path, (str, os.PathLike)):
            _atomic_torch_save(cpu_data, file_or_path)
        else:
            torch.save(cpu_data, file_or_path)
    rendezvous(_SAVE_TAG)


def rendezvous(tag: str, payload: bytes = b"", replicas: List[int] = []) -> List[bytes]:
    """Waits for all the mesh clients to reach the named rendezvous.

    Returns every participant's payload (bytes), the payload of ordinal i at position i (the order
    of ``replicas`` when given). Raises a TimeoutError naming the tag and the ranks that did not
    arrive after TORCH_XLA_COLLECTIVE_TIMEOUT_S seconds.
    """
    from torch_xla._internal import collectives, world
    if world.world_size() == 1 and not replicas:
        if not isinstance(tag, str):
            raise TypeError(f"rendezvous tag must be a str, got {type(tag).__name__}")
        return [bytes(payload.encode() if isinstance(payload, str) else payload)]
    return collectives.rendezvous(tag, payload, replicas)


def mesh_reduce(tag: str, data, reduce_fn: Callable[..., Any]):
    """Performs an out-of-graph client mesh reduction: ``reduce_fn`` gets the list of every
    process's ``data`` (any picklable value; XLA tensors arrive as CPU tensors)."""
    from torch_xla._internal import world
    if world.world_size() == 1:
        return reduce_fn([data])
    cpu_data = _maybe_convert_to_cpu(data)
    buf = io.BytesIO()
    torch.save(cpu_data, buf)
    payloads = rendezvous(tag, buf.getvalue())
    return reduce_fn([torch.load(io.BytesIO(p), weights_only=False) for p in payloads])


def get_memory_info(device: Optional[torch.device] = None) -> Dict[str, int]:
    """Retrieves the device memory usage.

    Keys ``bytes_used``, ``bytes_limit``, ``peak_bytes_used`` (and ``kb_free``, ``kb_total``).
    Taken from the PJRT plugin's memory statistics where it reports them; XLA:CPU does not, so
    on CPU they describe the host: limit = MemTotal, used = MemTotal - MemAvailable, peak = the
    highest ``used`` seen by this process's calls (at least this process's peak RSS).
    """
    from torch_xla._internal import memory
    return memory.memory_info(0 if device is None else _parse_index(device))


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
    device = torch.device(device)
    if device.type != "xla":
        raise ValueError(f"send_cpu_data_to_device: not an XLA device: {device}")
    if input_sharding is not None:  # SPMD: a ShardingSpec; each tensor is uploaded into its shards
        from torch_xla.distributed.spmd import ShardingSpec
        if not isinstance(input_sharding, ShardingSpec):
            raise TypeError(f"input_sharding must be a torch_xla.distributed.spmd.ShardingSpec, got "
                            f"{type(input_sharding).__name__}")

    def convert_fn(tensors):
        if input_sharding is not None:
            return [input_sharding.upload(t) if input_sharding.can_apply(t) else t.to(device) for t in tensors]
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
    # The previous step's asynchronous closures finish before this sync, so an exception one of them
    # raised is re-raised here, every time (not only when the worker thread happened to be done).
    if threading.current_thread() is not _async_closure_worker:
        _async_closure_queue.join()
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
