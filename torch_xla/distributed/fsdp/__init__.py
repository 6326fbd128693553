"""torch_xla.distributed.fsdp: PyTorch/XLA's fully sharded data parallel wrappers.

Not implemented in this build: FSDP shards parameters across devices with XLA collectives
(all-gather / reduce-scatter inside the graph), which need multi-device graphs this build does
not run yet. The names import so that scripts load; instantiating a wrapper raises
``NotImplementedError`` instead of silently training unsharded. Use plain data parallelism
(``xmp.spawn`` + ``xm.optimizer_step``) meanwhile.
"""
from __future__ import annotations

_REASON = ("torch_xla.distributed.fsdp.{name} is not implemented in this torch_xla build: sharding "
           "parameters needs in-graph collectives across devices, which this build does not run yet")


class _Unsupported:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_REASON.format(name=type(self).__name__))


class XlaFullyShardedDataParallel(_Unsupported):
    """Fully sharded data parallel wrapper (not implemented; raises when instantiated)."""


class SpmdFullyShardedDataParallel(_Unsupported):
    """SPMD-based fully sharded data parallel wrapper (not implemented; raises when instantiated)."""


def checkpoint_module(module):
    raise NotImplementedError(_REASON.format(name="checkpoint_module"))


def consolidate_sharded_model_checkpoints(*args, **kwargs):
    raise NotImplementedError(_REASON.format(name="consolidate_sharded_model_checkpoints"))


def consolidate_sharded_state_dicts(*args, **kwargs):
    raise NotImplementedError(_REASON.format(name="consolidate_sharded_state_dicts"))


__all__ = ["XlaFullyShardedDataParallel", "SpmdFullyShardedDataParallel", "checkpoint_module",
           "consolidate_sharded_model_checkpoints", "consolidate_sharded_state_dicts"]
