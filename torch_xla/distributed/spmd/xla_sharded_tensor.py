"""XLAShardedTensor: a torch.Tensor view of a sharded XLA tensor (``mark_sharding``'s result)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import torch
from torch.utils._pytree import tree_map

from torch_xla import _C


@dataclass
class XLAShard:
    """One device's shard: its data (a CPU tensor), where it sits in the global tensor (a list of
    slices, or ``...`` when the tensor is replicated), and which copy of that shard it is."""
    data: torch.Tensor
    indices: Union[type(Ellipsis), List[slice]]
    replica_id: int
    device: int = 0

    @property
    def unpadded_data(self) -> torch.Tensor:
        return self.data  # shards are never padded here (uneven shardings are refused)


class XLAShardedTensor(torch.Tensor):
    """Wraps an XLA tensor (``global_tensor``) annotated with a sharding. Torch operations on it run
    on the global tensor (XLA handles the shards) and return ``XLAShardedTensor`` results."""

    __slots__ = ["global_tensor", "mesh_shape", "partition_spec"]

    @staticmethod
    def __new__(cls, elem: torch.Tensor, *args, mesh_shape=None, partition_spec=None, **kwargs):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(),
                                                storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                layout=elem.layout, device=elem.device,
                                                requires_grad=kwargs.get("requires_grad", elem.requires_grad))
        r.global_tensor = elem
        r.mesh_shape = mesh_shape
        r.partition_spec = partition_spec
        return r

    @property
    def sharding_spec(self) -> str:
        """XLA's sharding text (``{devices=[4,1]0,1,2,3}``, ``{replicated}``; "" when none)."""
        return _C._get_xla_sharding_spec(self.global_tensor)

    @property
    def sharding_type(self):
        from .xla_sharding import ShardingType
        k = _C._get_xla_sharding_type(self.global_tensor)
        return ShardingType.REPLICATED if k is None else ShardingType(k)

    @property
    def local_shards(self) -> List[XLAShard]:
        """Each device's shard as a CPU tensor (runs pending work first), in device order."""
        shards = _C._get_local_shards(self.global_tensor)
        replicated = self.sharding_type == 0
        seen = {}
        out = []
        for data, offsets, device in shards:
            key = tuple(offsets)
            replica = seen.get(key, 0)
            seen[key] = replica + 1
            idx = ... if replicated else [slice(o, o + s) for o, s in zip(offsets, data.shape)]
            out.append(XLAShard(data, idx, replica, device))
        return out

    def __repr__(self) -> str:
        return f"XLAShardedTensor({self.global_tensor!r}, sharding_spec={self.sharding_spec!r})"

    # Operations are unwrapped at the Python level (__torch_function__), before the dispatcher: the
    # global tensor then runs through functionalization and autograd like any XLA tensor (inside
    # __torch_dispatch__ those keys are already passed).
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def unwrap(e):
            return e.global_tensor if isinstance(e, XLAShardedTensor) else e

        def wrap(e):
            return XLAShardedTensor(e) if isinstance(e, torch.Tensor) and not isinstance(e, XLAShardedTensor) \
                and e.device.type == "xla" else e

        if func in (torch.Tensor.__repr__, torch.Tensor.__str__, torch.Tensor.__format__):
            return func(*args, **(kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        if func is torch.Tensor.__getattribute__ or getattr(func, "__name__", "") in ("__get__", "__set__"):
            return out
        return tree_map(wrap, out)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(e):
            return e.global_tensor if isinstance(e, XLAShardedTensor) else e

        # Reached only by calls made below Python (e.g. autograd's engine); functionalization is
        # skipped from here, so the global tensors' functional wrappers are re-entered explicitly.
        exclude = torch._C._dispatch_tls_local_exclude_set().remove(torch._C.DispatchKey.Functionalize)
        with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude):
            return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
