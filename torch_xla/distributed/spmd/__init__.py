"""torch_xla.distributed.spmd: device meshes and sharding annotations.

The mesh API is implemented (``Mesh``, ``HybridMesh``, ``get_1d_mesh``, ``set_global_mesh`` /
``get_global_mesh``): meshes are plain descriptions of device ids. Sharding itself is not
implemented in this build: SPMD needs graphs partitioned across devices, which the runtime does
not run yet. ``mark_sharding`` and the other sharding calls raise ``NotImplementedError`` instead
of silently leaving tensors replicated; ``clear_sharding`` returns its (never sharded) tensor.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch

_REASON = ("SPMD sharding is not implemented in this torch_xla build (graphs are not partitioned across "
           "devices yet); {name} cannot run. Use data parallelism (one process per device) meanwhile")

__all__ = ["Mesh", "HybridMesh", "get_1d_mesh", "set_global_mesh", "get_global_mesh", "mark_sharding",
           "clear_sharding", "XLAShardedTensor", "enable_manual_sharding", "disable_manual_sharding",
           "ShardingType"]


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


class ShardingType:
    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


class XLAShardedTensor(torch.Tensor):
    """A tensor sharded across devices (not implemented: creating one raises)."""

    def __new__(cls, *args, **kwargs):
        raise NotImplementedError(_REASON.format(name="XLAShardedTensor"))


def mark_sharding(t, mesh: Mesh, partition_spec, **kwargs):
    """Annotates ``t`` with a sharding (not implemented: raises NotImplementedError)."""
    raise NotImplementedError(_REASON.format(name="mark_sharding"))


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Removes ``t``'s sharding: tensors are never sharded in this build, so ``t`` is returned."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    return t


def enable_manual_sharding(t, partition_spec, *, mesh: Optional[Mesh] = None, **kwargs):
    raise NotImplementedError(_REASON.format(name="enable_manual_sharding"))


def disable_manual_sharding(t, partition_spec, full_shape, *, mesh: Optional[Mesh] = None, **kwargs):
    raise NotImplementedError(_REASON.format(name="disable_manual_sharding"))
