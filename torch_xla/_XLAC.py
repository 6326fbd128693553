"""torch_xla._XLAC: the low-level hooks PyTorch/XLA scripts call, backed by this build's core.

Upstream PyTorch/XLA exposes its C++ extension as ``torch_xla._XLAC``. Here the extension is
``torch_xla._C`` (the aten bridge) plus ``torch_xla._core`` (runtime and metrics); this module
gives scripts the upstream names on top of them. Every function works on real state (the lazy
tensors, the metrics registry, the runtime); names this build does not provide raise
``AttributeError`` naming the missing hook, as a missing attribute of the extension would.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence

import torch

from . import _C
from ._core import metrics as _met

_PRECISIONS = ("default", "high", "highest")


def _xla_tensors(tensors: Sequence[torch.Tensor], what: str) -> List[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{what} expects a list of tensors, got a single tensor")
    out = list(tensors)
    for t in out:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} expects tensors, got {type(t).__name__}")
        if t.device.type != "xla":
            raise ValueError(f"{what} expects XLA tensors, got one on {t.device}")
    return out


# ---- matmul precision ------------------------------------------------------------------------

def _xla_set_mat_mul_precision(precision: str) -> None:
    """Precision of matmuls and convolutions traced from now on: 'default', 'high' or 'highest'."""
    if precision not in _PRECISIONS:
        raise ValueError(f"mat mul precision must be one of {_PRECISIONS}, got {precision!r}")
    _C._set_mat_mul_precision(_PRECISIONS.index(precision))


def _xla_get_mat_mul_precision() -> str:
    return _PRECISIONS[_C._get_mat_mul_precision()]


def _xla_set_use_full_mat_mul_precision(use_full_mat_mul_precision: bool = True) -> None:
    _xla_set_mat_mul_precision("highest" if use_full_mat_mul_precision else "default")


# ---- graph inspection ------------------------------------------------------------------------

def _get_xla_tensors_text(tensors: Sequence[torch.Tensor]) -> str:
    """The pending IR graph computing ``tensors``, as text."""
    return _C._dump_ir(_xla_tensors(tensors, "_get_xla_tensors_text"))


def _get_xla_tensors_hlo(tensors: Sequence[torch.Tensor]) -> str:
    """The StableHLO module computing ``tensors`` (this build lowers to StableHLO, not HLO)."""
    return _C._get_stablehlo(_xla_tensors(tensors, "_get_xla_tensors_hlo"))


def _get_ir_debug(tensors: Optional[Sequence[torch.Tensor]] = None) -> str:
    """The pending IR of ``tensors`` (all live pending tensors when None or empty)."""
    return _C._dump_ir(_xla_tensors(tensors or [], "_get_ir_debug"))


def _get_graph_hash(tensors: Sequence[torch.Tensor]) -> bytes:
    """A 16-byte hash of the graph computing ``tensors``: its StableHLO text (structure, shapes,
    dtypes; Python scalars are graph inputs, so their values do not change the hash)."""
    text = _C._get_stablehlo(_xla_tensors(tensors, "_get_graph_hash"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _get_xla_tensor_debug_info(tensor: torch.Tensor) -> str:
    (tensor,) = _xla_tensors([tensor], "_get_xla_tensor_debug_info")
    info = _C._tensor_info(tensor)
    lines = [
        "XLATensor {",
        f"TensorID: {info['id']}",
        f"Device: xla:{info['device']}",
        f"XLA Shape: {info['shape']}",
        f"ValueIR: {info['pending_op'] + ' (pending)' if info['has_pending'] else 'None'}",
        f"XLAData: {'present' if info['has_data'] else 'None'}",
    ]
    if info["error"]:
        lines.append(f"Error: {info['error']}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _get_xla_tensor_dimension_size(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """Size of ``dim`` as an int32 XLA tensor (shapes are static in this build)."""
    (tensor,) = _xla_tensors([tensor], "_get_xla_tensor_dimension_size")
    size = tensor.size(dim)  # raises IndexError for a bad dim, as eager does
    return torch.tensor(size, dtype=torch.int32, device=tensor.device)


def _xla_get_tensor_id(tensor: torch.Tensor) -> int:
    (tensor,) = _xla_tensors([tensor], "_xla_get_tensor_id")
    return int(_C._tensor_id(tensor))


# ---- devices and runtime ---------------------------------------------------------------------

def _init_computation_client() -> None:
    """Starts the PJRT client (normally started by the first device use)."""
    _C._device_count()


def _xla_runtime_is_initialized() -> bool:
    return bool(_C._client_started())


def _xla_get_default_device() -> str:
    return "xla:0"


def _xla_get_all_devices() -> List[str]:
    return _xla_real_devices([f"xla:{i}" for i in range(_C._device_count())])


def _xla_get_devices() -> List[str]:
    return [f"xla:{i}" for i in range(_C._device_count())]


def _xla_real_devices(devices: Optional[Sequence] = None) -> List[str]:
    """Runtime device names ("CPU:0", "CUDA:1", ...) of XLA devices ("xla:0", ...)."""
    n = _C._device_count()
    if devices is None:
        devices = [f"xla:{i}" for i in range(n)]
    hw = _C._device_type()
    hw = "CUDA" if hw == "GPU" else hw
    out = []
    for d in devices:
        d = torch.device(d)
        if d.type != "xla":
            raise ValueError(f"not an XLA device: {d}")
        idx = 0 if d.index is None else d.index
        _C._check_device(idx)
        out.append(f"{hw}:{idx}")
    return out


def _xla_get_device_hw_type(device=None) -> str:
    return _xla_real_devices([device or "xla:0"])[0].split(":")[0]


# ---- sync ------------------------------------------------------------------------------------

def _xla_sync_multi(tensors: Sequence[torch.Tensor], devices: Sequence = (), wait: bool = True,
                    sync_xla_data: bool = True) -> None:
    """Materializes ``tensors`` (runs only the graph they need)."""
    ts = _xla_tensors(tensors, "_xla_sync_multi")
    _C._sync(ts, bool(wait), "")


# ---- dot_general ---------------------------------------------------------------------------------

def _xla_dot_general(lhs: torch.Tensor, rhs: torch.Tensor, dim_numbers, precision_config=None,
                     preferred_element_type: Optional[torch.dtype] = None) -> torch.Tensor:
    """``stablehlo.dot_general`` of two XLA tensors. ``dim_numbers`` is
    ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))``; the result holds the batch
    dimensions, then lhs's free dimensions, then rhs's. ``precision_config`` is a mat mul precision
    ('default', 'high', 'highest') or None for the current one."""
    lhs, rhs = _xla_tensors([lhs, rhs], "_xla_dot_general")
    try:
        (lc, rc), (lb, rb) = dim_numbers
    except (TypeError, ValueError):
        raise ValueError("_xla_dot_general: dim_numbers must be ((lhs_contracting, rhs_contracting), "
                         f"(lhs_batch, rhs_batch)), got {dim_numbers!r}") from None
    if precision_config is None:
        precision = -1
    elif precision_config in _PRECISIONS:
        precision = _PRECISIONS.index(precision_config)
    else:
        raise ValueError(f"precision_config must be one of {_PRECISIONS} or None, got {precision_config!r}")
    return _C._dot_general(lhs, rhs, list(lc), list(rc), list(lb), list(rb), precision, preferred_element_type)


# ---- buffer donation ---------------------------------------------------------------------------

def _set_buffer_donation(tensor: torch.Tensor, should_donate: bool) -> bool:
    """Marks ``tensor``'s device buffer for donation to the next graph that reads it (at a full sync
    always, at ``_xla_sync_multi`` when the alias-with-buffer-donor config is on): the graph may reuse
    the buffer for a result of the same shape and dtype, and ``tensor`` then has no value (reading it
    raises). Returns False (nothing marked) when the tensor holds no device buffer of its own yet
    (pending computation) or shares a cached scalar input."""
    (tensor,) = _xla_tensors([tensor], "_set_buffer_donation")
    return bool(_C._set_buffer_donation(tensor, bool(should_donate)))


def _get_buffer_donation(tensor: torch.Tensor) -> bool:
    (tensor,) = _xla_tensors([tensor], "_get_buffer_donation")
    return bool(_C._get_buffer_donation(tensor))


def _xla_set_enable_alias_with_buffer_donor_config(should_alias: bool) -> None:
    """With True, syncs of listed tensors (``_xla_sync_multi``) also donate marked buffers, and
    ``_get_graph_hash``/``_get_xla_tensors_hlo`` show the aliasing such a sync would use."""
    _C._set_alias_with_buffer_donor_config(bool(should_alias))


def _xla_get_enable_alias_with_buffer_donor_config() -> bool:
    return bool(_C._get_alias_with_buffer_donor_config())


def _is_placecholder(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` gave its buffer away (donation) and holds no value (upstream's spelling)."""
    (tensor,) = _xla_tensors([tensor], "_is_placecholder")
    return bool(_C._buffer_donated(tensor))


_is_placeholder = _is_placecholder


def _xla_sync_live_tensors(device: str = "", devices: Sequence = (), wait: bool = True) -> None:
    _C._sync(None, bool(wait), "")


def _xla_step_marker(device: str = "", devices: Sequence = (), wait: bool = True, reset_scope: bool = True) -> None:
    import torch_xla
    torch_xla.sync(bool(wait))


def _xla_wait_device_ops(devices: Sequence = ()) -> None:
    _C._wait_device_ops()


def _set_allow_execution(allow: bool) -> None:
    """With ``False``, any graph execution (sync, host read) raises until allowed again."""
    _C._set_execution_forbidden("" if allow else
                                "execution is not allowed: torch_xla._XLAC._set_allow_execution(False) is in effect")


def _xla_optimization_barrier_(tensors: Sequence[torch.Tensor]) -> None:
    _C._optimization_barrier(_xla_tensors(tensors, "_xla_optimization_barrier_"))


# ---- RNG -------------------------------------------------------------------------------------

def _xla_get_rng_seed(device: str = "") -> int:
    idx = 0 if not device else (torch.device(device).index or 0)
    return int(_C._get_seed(idx))


def _xla_set_rng_seed(seed: int, device: str = "") -> None:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    idx = 0 if not device else (torch.device(device).index or 0)
    _C._set_seed(seed & 0xFFFFFFFFFFFFFFFF, idx)


# ---- metrics ---------------------------------------------------------------------------------

def _xla_increment_counter(name: str, value: int = 1) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("counter name must be a non-empty str")
    _met.increment_counter(name, int(value))


def _xla_counter_value(name: str) -> Optional[int]:
    return _met.counter_value(name)


def _xla_counter_names() -> List[str]:
    return list(_met.counter_names())


def _xla_metric_names() -> List[str]:
    return list(_met.metric_names())


def _xla_metric_data(name: str):
    return _met.metric_data(name)


def _xla_metrics_report() -> str:
    return _met.metrics_report(None, None)


def _clear_xla_counters() -> None:
    _met.clear_counters()


def _clear_xla_metrics() -> None:
    _met.clear_metrics()


def _get_executed_fallback_ops() -> List[str]:
    """aten ops that ran on the CPU fallback, as "aten::name"."""
    return [n for n in _met.counter_names() if n.startswith("aten::")]


def _get_git_revs() -> Dict[str, str]:
    import torch_xla
    return {"torch": getattr(torch.version, "git_version", "") or "", "xla": torch_xla.__version__}


def _xla_tensors_report(nodes_threshold: int = 0, device: str = "") -> str:
    return _C._dump_ir([])


def _xla_tensors_from_aten(tensors: Sequence[torch.Tensor], devices: Sequence,
                           shardings: Optional[Sequence] = None) -> List[torch.Tensor]:
    """Copies CPU tensors to XLA devices (``devices[i]`` for ``tensors[i]``, or one device for all).
    ``shardings`` (upstream: OpSharding protos per tensor) must be None or all None here: shard
    with ``torch_xla.distributed.spmd.mark_sharding`` or ``xm.send_cpu_data_to_device(...,
    input_sharding=...)``."""
    if shardings is not None and any(s is not None for s in shardings):
        raise NotImplementedError("_xla_tensors_from_aten: OpSharding protos are not supported; use "
                                  "torch_xla.distributed.spmd.mark_sharding on the result")
    tensors = list(tensors)
    devices = list(devices)
    if len(devices) == 1 and len(tensors) > 1:
        devices = devices * len(tensors)
    if len(devices) != len(tensors):
        raise ValueError(f"_xla_tensors_from_aten: {len(tensors)} tensors but {len(devices)} devices")
    out = []
    for t, d in zip(tensors, devices):
        d = torch.device(d)
        if d.type != "xla":
            raise ValueError(f"not an XLA device: {d}")
        out.append(t.to(d))
    return out


def _xla_memory_info(device: str = "xla:0") -> Dict[str, int]:
    from .core import xla_model as xm
    return xm.get_memory_info(torch.device(device))


def _xla_get_replication_devices_count() -> int:
    """Devices taking part in the current replication (0: not replicated in this build)."""
    return 0


def _run_stablehlo(stablehlo: str, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Compiles (once) and runs a StableHLO module on the inputs' XLA device: MLIR text, MLIR
    bytecode or a StableHLO portable artifact (bytes), all handed to PJRT's compiler as is."""
    if isinstance(stablehlo, (bytearray, memoryview)):
        stablehlo = bytes(stablehlo)
    if not isinstance(stablehlo, (str, bytes)):
        raise TypeError(f"_run_stablehlo: expected StableHLO text (str) or bytecode (bytes), got "
                        f"{type(stablehlo).__name__}")
    return _C._run_stablehlo(stablehlo, _xla_tensors(inputs, "_run_stablehlo"), 0)


def _is_xla_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xla"


def __getattr__(name: str):
    raise AttributeError(
        f"torch_xla._XLAC has no attribute {name!r}: this torch_xla build (own C++ core) does not "
        "provide that upstream hook; see the compatibility table in the README")


# ---- SPMD (torch_xla.distributed.spmd) ---------------------------------------------------------

def _get_xla_sharding_spec(t: torch.Tensor) -> str:
    """XLA's sharding text of ``t`` (``{devices=[2,1]0,1}``, ``{replicated}``); "" when it has none."""
    from .distributed.spmd.xla_sharding import _unwrap
    t = _unwrap(t)
    if not isinstance(t, torch.Tensor) or t.device.type != "xla":
        raise ValueError("_get_xla_sharding_spec expects an XLA tensor")
    return _C._get_xla_sharding_spec(t)


def _get_xla_sharding_type(t: torch.Tensor):
    """Upstream's ShardingType number of ``t``'s sharding, or None when it has none."""
    from .distributed.spmd.xla_sharding import _unwrap
    return _C._get_xla_sharding_type(_unwrap(t))


def _xla_mark_sharding_text(t: torch.Tensor, sharding: str) -> None:
    """Annotates ``t`` with a sharding given as XLA's text."""
    _C._xla_mark_sharding_text(t, sharding)


def _xla_clear_sharding(t: torch.Tensor) -> None:
    from .distributed.spmd.xla_sharding import _unwrap
    _C._xla_clear_sharding(_unwrap(t))


def _get_local_shards(t: torch.Tensor):
    """[(cpu shard, offsets, device)] of every device."""
    from .distributed.spmd.xla_sharding import _unwrap
    return _C._get_local_shards(_unwrap(t))


def _xla_get_spmd_device_bytes(t: torch.Tensor):
    """Bytes each device holds for ``t`` (PJRT's on-device sizes)."""
    from .distributed.spmd.xla_sharding import _unwrap
    return _C._spmd_device_bytes(_unwrap(t))
