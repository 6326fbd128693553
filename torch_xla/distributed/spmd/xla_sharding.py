"""Device meshes and sharding annotations for SPMD (``torch_xla.distributed.spmd``).

``mark_sharding(t, mesh, partition_spec)`` annotates a tensor; XLA's SPMD partitioner turns the
graph into one program per device with the collectives it needs (we never partition graphs
ourselves). Requires ``torch_xla.runtime.use_spmd()``.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from enum import IntEnum
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from torch_xla import _C

PartitionSpec = Tuple[Union[Tuple[Union[int, str], ...], int, str, None], ...]


class Mesh:
    """Logical device topology: ``device_ids`` (raveled, C order) arranged as ``mesh_shape`` with
    optional ``axis_names``."""

    def __init__(self, device_ids: Union[np.ndarray, Sequence[int]], mesh_shape: Tuple[int, ...],
                 axis_names: Optional[Tuple[str, ...]] = None):
        ids = np.asarray(device_ids).ravel()
        mesh_shape = tuple(int(d) for d in mesh_shape)
        if any(d <= 0 for d in mesh_shape):
            raise ValueError(f"mesh_shape must be positive, got {mesh_shape}")
        if ids.size != math.prod(mesh_shape):
            raise ValueError(f"{ids.size} device ids do not fill a mesh of shape {mesh_shape}")
        if len(set(ids.tolist())) != ids.size:
            raise ValueError("device ids must be unique")
        if axis_names is not None:
            axis_names = tuple(axis_names)
            if len(axis_names) != len(mesh_shape):
                raise ValueError(f"{len(axis_names)} axis names for a {len(mesh_shape)}-d mesh")
            if len(set(axis_names)) != len(axis_names):
                raise ValueError("axis names must be unique")
        self.device_ids = ids
        self.mesh_shape = mesh_shape
        self.axis_names = axis_names

    def size(self) -> int:
        return int(self.device_ids.size)

    def shape(self) -> "OrderedDict[str, int]":
        names = self.axis_names if self.axis_names is not None else tuple(range(len(self.mesh_shape)))
        return OrderedDict(zip(names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> Optional[int]:
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    def __eq__(self, other) -> bool:
        return (isinstance(other, Mesh) and self.mesh_shape == other.mesh_shape and
                self.axis_names == other.axis_names and np.array_equal(self.device_ids, other.device_ids))

    def __repr__(self) -> str:
        return f"Mesh(device_ids={self.device_ids.tolist()}, mesh_shape={self.mesh_shape}, axis_names={self.axis_names})"


class HybridMesh(Mesh):
    """Mesh over ICI-connected devices (``ici_mesh_shape``) times DCN-connected slices
    (``dcn_mesh_shape``); on one host/slice it is the ICI mesh."""

    def __init__(self, *, ici_mesh_shape: Tuple[int, ...], dcn_mesh_shape: Optional[Tuple[int, ...]] = None,
                 axis_names: Optional[Tuple[str, ...]] = None):
        ici = tuple(ici_mesh_shape)
        dcn = tuple(dcn_mesh_shape) if dcn_mesh_shape is not None else (1,) * len(ici)
        if len(dcn) != len(ici):
            raise ValueError("ici_mesh_shape and dcn_mesh_shape must have the same length")
        shape = tuple(a * b for a, b in zip(ici, dcn))
        super().__init__(np.arange(math.prod(shape)), shape, axis_names)
        self.ici_mesh_shape, self.dcn_mesh_shape = ici, dcn


def get_1d_mesh(axis_name: Optional[str] = None) -> Mesh:
    """All devices in one dimension (``axis_name`` names it)."""
    from torch_xla import runtime as xr
    n = xr.global_runtime_device_count()
    return Mesh(np.arange(n), (n,), (axis_name,) if axis_name is not None else None)


_global_mesh: Optional[Mesh] = None


def set_global_mesh(mesh: Mesh) -> None:
    global _global_mesh
    if not isinstance(mesh, Mesh):
        raise TypeError(f"expected a Mesh, got {type(mesh).__name__}")
    _global_mesh = mesh


def get_global_mesh() -> Optional[Mesh]:
    return _global_mesh


class ShardingType(IntEnum):
    """Upstream's numbering of XLA sharding kinds."""
    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


def _runtime_device_count() -> int:
    return _C._runtime_device_count()


def _require_spmd(what: str) -> None:
    if not _C._is_spmd():
        raise RuntimeError(f"{what} needs SPMD mode: call torch_xla.runtime.use_spmd() first")


def _mesh_axis(mesh: Mesh, axis, partition_spec) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, str, np.integer)):
        raise ValueError(f"partition_spec {partition_spec!r}: {axis!r} is neither a mesh axis index nor an axis name")
    if isinstance(axis, str):
        idx = mesh.get_axis_name_idx(axis)
        if idx is None:
            raise ValueError(f"partition_spec {partition_spec!r}: unknown mesh axis name {axis!r} "
                             f"(the mesh's axes are {mesh.axis_names})")
        return idx
    axis = int(axis)
    if not 0 <= axis < len(mesh.mesh_shape):
        raise ValueError(f"partition_spec {partition_spec!r}: mesh axis {axis} is out of range for a "
                         f"{len(mesh.mesh_shape)}-d mesh")
    return axis


def _tile_assignment(mesh: Mesh, partition_spec, shape: Sequence[int]):
    """(tile dims, device ids, replicate_last) of ``partition_spec`` over ``mesh`` for a tensor of
    ``shape``: tensor dim i is split over the mesh axes of entry i (major to minor); mesh axes no
    entry uses replicate the tiles (a last tile dimension, XLA's ``last_tile_dim_replicate``)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a Mesh, got {type(mesh).__name__}")
    if not isinstance(partition_spec, (tuple, list)):
        raise TypeError(f"partition_spec must be a tuple, got {type(partition_spec).__name__}")
    rank = len(shape)
    if len(partition_spec) != rank:
        raise ValueError(f"partition_spec {tuple(partition_spec)!r} has {len(partition_spec)} entries but the tensor "
                         f"has rank {rank} (one entry per dimension, None for a replicated one)")
    n = _runtime_device_count()
    ids = mesh.device_ids.tolist()
    outside = [d for d in ids if not 0 <= d < n]
    if outside:
        raise ValueError(f"the mesh names devices {outside} outside this process (devices 0..{n - 1})")
    if len(ids) != n:
        raise ValueError(f"the mesh has {len(ids)} devices but SPMD runs on all {n} devices of the process; "
                         f"build the mesh over every device")
    used: List[int] = []
    dims_axes = []
    for entry in partition_spec:
        if entry is None:
            dims_axes.append(())
            continue
        group = tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)
        axes = []
        for a in group:
            if a is None:
                continue
            idx = _mesh_axis(mesh, a, tuple(partition_spec))
            if idx in used:
                raise ValueError(f"partition_spec {tuple(partition_spec)!r}: mesh axis {a!r} is used twice")
            used.append(idx)
            axes.append(idx)
        dims_axes.append(tuple(axes))
    tile_dims = [math.prod(mesh.mesh_shape[a] for a in axes) for axes in dims_axes]
    for i, (size, tiles) in enumerate(zip(shape, tile_dims)):
        if size % tiles != 0:
            raise ValueError(f"partition_spec {tuple(partition_spec)!r}: dimension {i} of size {size} does not divide "
                             f"into {tiles} shards")
    unused = [a for a in range(len(mesh.mesh_shape)) if a not in used]
    perm = [a for axes in dims_axes for a in axes] + unused
    devices = mesh.get_logical_mesh().transpose(perm).ravel().tolist()
    replicas = math.prod(mesh.mesh_shape[a] for a in unused)
    return tile_dims + [replicas], [int(d) for d in devices], True


def _unwrap(t):
    from .xla_sharded_tensor import XLAShardedTensor
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def _check_xla_tensor(t, what: str) -> torch.Tensor:
    t = _unwrap(t)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} expects a tensor, got {type(t).__name__}")
    if t.device.type != "xla":
        raise ValueError(f"{what} expects an XLA tensor, got one on {t.device}")
    return t


def mark_sharding(t: Union[torch.Tensor, "XLAShardedTensor"], mesh: Mesh, partition_spec: PartitionSpec,
                  use_dynamo_custom_op: bool = False) -> "XLAShardedTensor":
    """Annotates ``t`` (in place) with the sharding ``partition_spec`` over ``mesh`` and returns it
    wrapped as an :class:`XLAShardedTensor`.

    ``partition_spec`` has one entry per dimension of ``t``: a mesh axis index, an axis name, a tuple
    of them (the dimension is split over all those axes, major to minor) or ``None`` (not split).
    Mesh axes no entry uses replicate the shards (partial replication). A tensor holding data is
    re-laid out at once (each device then holds only its shard); a pending value (an intermediate)
    gets a sharding annotation inside its graph. Annotating a tensor again with a different sharding
    changes the graphs that use it, so they compile again. ``use_dynamo_custom_op`` is accepted for
    compatibility (there is no dynamo bridge here).
    """
    _require_spmd("mark_sharding()")
    from .xla_sharded_tensor import XLAShardedTensor
    t = _check_xla_tensor(t, "mark_sharding()")
    tile_dims, devices, replicate_last = _tile_assignment(mesh, partition_spec, tuple(t.shape))
    _C._xla_mark_sharding(t, tile_dims, devices, replicate_last)
    return XLAShardedTensor(t, mesh_shape=mesh.mesh_shape, partition_spec=tuple(partition_spec))


def clear_sharding(t: Union[torch.Tensor, "XLAShardedTensor"]) -> torch.Tensor:
    """Removes ``t``'s sharding annotation in place (its data becomes replicated on every device) and
    returns the plain tensor."""
    if not isinstance(_unwrap(t), torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    t = _unwrap(t)
    if t.device.type == "xla" and _C._is_spmd():
        _C._xla_clear_sharding(t)
    return t


def wrap_as_sharded_tensor(t: Union[torch.Tensor, "XLAShardedTensor"], mesh_shape=None, partition_spec=None):
    from .xla_sharded_tensor import XLAShardedTensor
    if isinstance(t, XLAShardedTensor):
        return t
    return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)


class ShardingSpec:
    """A mesh and a partition spec, applied to tensors later (e.g. ``MpDeviceLoader(input_sharding=)``)."""

    def __init__(self, mesh: Mesh, partition_spec: PartitionSpec, minibatch: Optional[bool] = False):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a Mesh, got {type(mesh).__name__}")
        if minibatch:
            raise NotImplementedError("ShardingSpec(minibatch=True) is for multi-host input pipelines (not supported)")
        self.mesh = mesh
        self.partition_spec = tuple(partition_spec)
        self.minibatch = minibatch

    def apply(self, t: torch.Tensor) -> None:
        mark_sharding(t, self.mesh, self.partition_spec)

    def upload(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor -> an XLA tensor laid out in its shards (each device receives only its own)."""
        _require_spmd("ShardingSpec.upload()")
        tile_dims, devices, replicate_last = _tile_assignment(self.mesh, self.partition_spec, tuple(t.shape))
        return _C._xla_tensor_from_cpu_sharded(t, tile_dims, devices, replicate_last)

    def can_apply(self, t: torch.Tensor) -> bool:
        return isinstance(t, torch.Tensor) and t.dim() == len(self.partition_spec)


def enable_manual_sharding(t, partition_spec, *, mesh: Optional[Mesh] = None, **kwargs):
    raise NotImplementedError("manual sharding (enable_manual_sharding) is not supported: annotate with mark_sharding")


def disable_manual_sharding(t, partition_spec, full_shape, *, mesh: Optional[Mesh] = None, **kwargs):
    raise NotImplementedError("manual sharding (disable_manual_sharding) is not supported: annotate with mark_sharding")
