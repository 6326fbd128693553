"""torch_xla.distributed.spmd: device meshes and sharding annotations (SPMD).

After ``torch_xla.runtime.use_spmd()``, ``torch_xla.device()`` is one virtual device standing for
every device of the process. ``mark_sharding(t, mesh, partition_spec)`` annotates tensors; XLA's
SPMD partitioner compiles each graph into one program per device with the collectives it needs.
"""
from .xla_sharding import (HybridMesh, Mesh, PartitionSpec, ShardingSpec, ShardingType, clear_sharding,
                           disable_manual_sharding, enable_manual_sharding, get_1d_mesh, get_global_mesh,
                           mark_sharding, set_global_mesh, wrap_as_sharded_tensor)
from .xla_sharded_tensor import XLAShard, XLAShardedTensor

__all__ = ["Mesh", "HybridMesh", "get_1d_mesh", "set_global_mesh", "get_global_mesh", "mark_sharding",
           "clear_sharding", "XLAShardedTensor", "XLAShard", "ShardingSpec", "ShardingType", "PartitionSpec",
           "wrap_as_sharded_tensor", "enable_manual_sharding", "disable_manual_sharding"]
