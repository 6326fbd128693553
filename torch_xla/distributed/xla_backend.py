"""The ``xla`` backend of torch.distributed, as upstream PyTorch/XLA's DDP scripts use it::

    import torch_xla.distributed.xla_backend
    torch.distributed.init_process_group("xla", init_method="xla://")
    model = DDP(model.to(torch_xla.device()), gradient_as_bucket_view=True)

Importing this module registers the backend name ``xla`` (device type ``xla``) and the ``xla://``
rendezvous, which gives rank = ``xr.global_ordinal()``, world size = ``xr.world_size()`` and the
job's TCPStore (the one ``xmp.spawn`` / ``torch_xla.launch`` / ``torchrun`` set up, see
``torch_xla._internal.world``). :class:`ProcessGroupXla` runs every collective on the
``torch_xla.core.xla_model`` collectives (host gloo exchange on the CPU plugin, in-graph with
``TORCH_XLA_COLLECTIVE_BACKEND=ingraph``) and returns a completed :class:`WorkXla`.

Supported: allreduce (SUM, PRODUCT, MIN, MAX, AVG; BAND/BOR on integers), allgather,
allgather_into_tensor (``_allgather_base``), broadcast, reduce, reduce_scatter,
reduce_scatter_tensor (``_reduce_scatter_base``), alltoall_base with equal splits, barrier.
Everything else (send/recv, gather, scatter, alltoall of lists, unequal splits, BXOR, PREMUL_SUM,
coalesced variants) raises NotImplementedError naming the operation.
"""
from __future__ import annotations

import datetime
import os
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp

import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch_xla._internal import world

BACKEND_NAME = "xla"
_SYNC_BEFORE_ALLREDUCE = os.environ.get("TORCH_XLA_DDP_SYNC_BEFORE_ALLREDUCE", "1").strip() != "0"
RENDEZVOUS_SCHEME = "xla"


class WorkXla(dist.Work):
    """An already completed collective (our collectives finish, or are recorded in the lazy graph,
    before they return): ``wait()`` returns True, ``result()`` the output tensors."""

    def __init__(self, result: Sequence[torch.Tensor] = ()):
        super().__init__()
        self._result = list(result)

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> List[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut


def _unsupported(op: str, why: str = ""):
    raise NotImplementedError(f"ProcessGroupXla does not support {op}" + (f": {why}" if why else ""))


def _red(op) -> str:
    """torch.distributed ReduceOp -> xm reduce_type (AVG is handled by the caller)."""
    for kind, name in ((ReduceOp.SUM, "sum"), (ReduceOp.AVG, "sum"), (ReduceOp.PRODUCT, "mul"),
                       (ReduceOp.MIN, "min"), (ReduceOp.MAX, "max"), (ReduceOp.BAND, "and"),
                       (ReduceOp.BOR, "or")):
        if op == kind:
            return name
    _unsupported(f"reduce op {op}", "supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR")


def _is_avg(op) -> bool:
    return op == ReduceOp.AVG


class ProcessGroupXla(ProcessGroup):
    """A torch.distributed process group whose collectives are torch_xla's (see the module doc).

    ``ranks`` are the global ranks of the group's members (the world for the default group).
    """

    def __init__(self, prefix_store, rank: int, size: int, timeout, ranks: Optional[Sequence[int]] = None):
        super().__init__(rank, size)
        self.prefix_store = prefix_store
        self.timeout = timeout
        ws = world.world_size()
        if ranks is None:
            if size != ws:
                raise ValueError(f"ProcessGroupXla of {size} ranks in a world of {ws} needs its global ranks")
            ranks = range(ws)
        self._ranks: Tuple[int, ...] = tuple(int(r) for r in ranks)
        if len(self._ranks) != size or self._ranks[rank] != world.rank():
            raise ValueError(f"ProcessGroupXla: group ranks {list(self._ranks)} do not match rank {rank} of size {size} "
                             f"(this process is global rank {world.rank()})")
        self._is_world = self._ranks == tuple(range(ws))
        self._barriers = 0

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    # ---- plumbing: the world through xm.* (groups=None); a sub-group through the backend -----------

    def _groups(self):
        if self._is_world:
            return None
        # xm's groups must partition the world: the members, then every other rank alone.
        others = [[r] for r in range(world.world_size()) if r not in self._ranks]
        return [list(self._ranks)] + others

    def _scale(self, op, n: int) -> float:
        return 1.0 / n if _is_avg(op) else 1.0

    def _run_pending(self):
        """Host collectives read their inputs' values, which runs just the graph those need; DDP's
        all-reduce of a bucket happens mid-backward, so the rest of the step (the loss, other
        buckets' producers) would be traced again and recomputed at the next sync. As
        ``xm.reduce_gradients`` does, run all pending work first (one graph). In-graph collectives
        stay lazy. ``TORCH_XLA_DDP_SYNC_BEFORE_ALLREDUCE=0`` turns it off."""
        if self.size() == 1 or not _SYNC_BEFORE_ALLREDUCE:
            return
        from torch_xla._internal import collectives
        if collectives.backend().needs_host_values:
            from torch_xla import _C
            _C._sync(None, False, "")

    @staticmethod
    def _check(op: str, tensors):
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"ProcessGroupXla.{op}: expected tensors, got {type(t).__name__}")
            if t.device.type != "xla":
                raise ValueError(f"ProcessGroupXla.{op}: tensors must be on the xla device, got one on {t.device} "
                                 "(move it with .to(torch_xla.device()))")

    # ---- collectives -----------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        self._check("allreduce", tensors)
        kind = _red(op)
        if _is_avg(op):
            for t in tensors:
                if not (t.is_floating_point() or t.is_complex()):
                    raise ValueError(f"ProcessGroupXla.allreduce: AVG needs floating-point tensors, got {t.dtype}")
        self._run_pending()
        xm.all_reduce(kind, list(tensors), scale=self._scale(op, self.size()), groups=self._groups())
        return WorkXla(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(list(tensors), _AllreduceOpts(opts.reduceOp if opts is not None else ReduceOp.SUM))

    def allgather(self, output_tensors_lists, input_tensors, opts=None):
        self._check("allgather", input_tensors)
        if len(output_tensors_lists) != len(input_tensors):
            raise ValueError("ProcessGroupXla.allgather: one output list per input tensor expected")
        n = self.size()
        stacked = [t.reshape((1,) + tuple(t.shape)) for t in input_tensors]
        gathered = xm.all_gather(stacked, dim=0, groups=self._groups())
        with torch.no_grad():
            for outs, g, t in zip(output_tensors_lists, gathered, input_tensors):
                if len(outs) != n:
                    raise ValueError(f"ProcessGroupXla.allgather: output list of {len(outs)} tensors for a group of {n}")
                self._check("allgather", outs)
                for i, o in enumerate(outs):
                    o.copy_(g[i])
        return WorkXla([o for outs in output_tensors_lists for o in outs])

    def _allgather_base(self, output, input, opts=None):
        self._check("allgather_into_tensor", [output, input])
        n = self.size()
        if output.numel() != n * input.numel():
            raise ValueError(f"ProcessGroupXla.allgather_into_tensor: output of {output.numel()} elements for "
                             f"{n} x {input.numel()}")
        g = xm.all_gather(input.reshape((1,) + tuple(input.shape)), dim=0, groups=self._groups())
        with torch.no_grad():
            output.copy_(g.reshape(output.shape))
        return WorkXla([output])

    allgather_into_tensor = _allgather_base
    all_gather_single = _allgather_base  # torch >= 2.12's name (dist.all_gather_into_tensor)

    def broadcast(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        self._check("broadcast", tensors)
        root = opts.rootRank if opts is not None else 0
        if getattr(opts, "rootTensor", 0):
            _unsupported("broadcast with rootTensor != 0")
        xm.collective_broadcast(list(tensors), root_ordinal=self._ranks[root], groups=self._groups())
        return WorkXla(tensors)

    def reduce(self, tensors, opts=None):
        # An all-reduce; only the root's tensor is written (the others are left as they were).
        self._check("reduce", tensors)
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0
        results = [xm.all_reduce(_red(op), t, scale=self._scale(op, self.size()), groups=self._groups())
                   for t in tensors]
        if self.rank() == root:
            with torch.no_grad():
                for t, r in zip(tensors, results):
                    t.copy_(r)
        return WorkXla(tensors)

    def reduce_scatter(self, output_tensors, input_tensors_lists, opts=None):
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        n = self.size()
        self._check("reduce_scatter", output_tensors)
        inputs = []
        for out, ins in zip(output_tensors, input_tensors_lists):
            if len(ins) != n:
                raise ValueError(f"ProcessGroupXla.reduce_scatter: input list of {len(ins)} tensors for a group of {n}")
            self._check("reduce_scatter", ins)
            inputs.append(torch.cat([i.reshape((1,) + tuple(out.shape)) for i in ins], dim=0))
        results = xm.reduce_scatter(_red(op), inputs, scale=self._scale(op, n), scatter_dim=0, shard_count=n,
                                    groups=self._groups())
        with torch.no_grad():
            for out, r in zip(output_tensors, results):
                out.copy_(r.reshape(out.shape))
        return WorkXla(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        self._check("reduce_scatter_tensor", [output, input])
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        n = self.size()
        if input.numel() != n * output.numel():
            raise ValueError(f"ProcessGroupXla.reduce_scatter_tensor: input of {input.numel()} elements for "
                             f"{n} x {output.numel()}")
        r = xm.reduce_scatter(_red(op), input.reshape((n,) + tuple(output.shape)), scale=self._scale(op, n),
                              scatter_dim=0, shard_count=n, groups=self._groups())
        with torch.no_grad():
            output.copy_(r.reshape(output.shape))
        return WorkXla([output])

    reduce_scatter_tensor = _reduce_scatter_base
    reduce_scatter_single = _reduce_scatter_base  # torch >= 2.12's name (dist.reduce_scatter_tensor)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._check("alltoall_base", [output, input])
        n = self.size()
        if output_split_sizes or input_split_sizes:
            sizes = set(output_split_sizes or []) | set(input_split_sizes or [])
            if len(sizes) != 1:
                _unsupported("alltoall_base with unequal split sizes", "only equal splits (all_to_all_single)")
        if input.shape[0] % n:
            raise ValueError(f"ProcessGroupXla.alltoall_base: dimension 0 of {tuple(input.shape)} is not divisible by "
                             f"the group size {n}")
        r = xm.all_to_all(input, 0, 0, n, groups=self._groups())
        with torch.no_grad():
            output.copy_(r.reshape(output.shape))
        return WorkXla([output])

    all_to_all_single = alltoall_base  # torch >= 2.12's name (dist.all_to_all_single)

    def barrier(self, opts=None):
        self._barriers += 1
        xm.rendezvous(f"torch_xla.distributed.xla_backend.barrier/{'-'.join(map(str, self._ranks))}/{self._barriers}",
                      b"", [] if self._is_world else list(self._ranks))
        return WorkXla([])

    # ---- not supported: say so, never a silent no-op ----------------------------------------------

    def send(self, *args, **kwargs):
        _unsupported("send", "point-to-point is not implemented")

    def recv(self, *args, **kwargs):
        _unsupported("recv", "point-to-point is not implemented")

    def recv_anysource(self, *args, **kwargs):
        _unsupported("recv_anysource", "point-to-point is not implemented")

    def gather(self, *args, **kwargs):
        _unsupported("gather", "use all_gather")

    def scatter(self, *args, **kwargs):
        _unsupported("scatter", "use broadcast")

    def alltoall(self, *args, **kwargs):
        _unsupported("alltoall (list form)", "use all_to_all_single with equal splits")

    def allgather_coalesced(self, *args, **kwargs):
        _unsupported("allgather_coalesced")

    def allgather_into_tensor_coalesced(self, *args, **kwargs):
        _unsupported("allgather_into_tensor_coalesced")

    def reduce_scatter_tensor_coalesced(self, *args, **kwargs):
        _unsupported("reduce_scatter_tensor_coalesced")

    def all_gather_single_coalesced(self, *args, **kwargs):
        _unsupported("all_gather_single_coalesced")

    def reduce_scatter_single_coalesced(self, *args, **kwargs):
        _unsupported("reduce_scatter_single_coalesced")

    def monitored_barrier(self, *args, **kwargs):
        _unsupported("monitored_barrier", "use barrier")


class _AllreduceOpts:
    def __init__(self, op):
        self.reduceOp = op


def _create_xla_process_group(opts, pg_options=None):
    """Creator for ``dist.Backend.register_backend`` (extended API: knows the group's global ranks)."""
    ranks = getattr(opts, "global_ranks_in_group", None) or None
    return ProcessGroupXla(opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks=ranks)


def _xla_rendezvous_handler(url: str, timeout: datetime.timedelta = None, **kwargs):
    """``xla://``: this process's global ordinal and the world size of the job, with its TCPStore."""
    rank, size = xr.global_ordinal(), xr.world_size()
    # init_process_group(rank=, world_size=) arrive as a query ("xla://?rank=0&world_size=2"):
    # they must agree with the job's topology.
    from urllib.parse import parse_qs, urlparse
    query = parse_qs(urlparse(url).query)
    for key, ours in (("rank", rank), ("world_size", size)):
        if key in query:
            given = int(query[key][-1])
            if given != ours:
                raise ValueError(f"init_process_group(init_method='xla://'): {key}={given} but this process is "
                                 f"{key} {ours} of the job (xr.global_ordinal() / xr.world_size())")
    store = dist.PrefixStore("xla_backend/", world.store())
    yield (store, rank, size)
    raise RuntimeError("the xla:// rendezvous cannot be restarted (the job's ranks are fixed)")


def _register():
    if BACKEND_NAME.upper() not in getattr(dist.Backend, "_plugins", {}):
        dist.Backend.register_backend(BACKEND_NAME, _create_xla_process_group, extended_api=True, devices=["xla"])
    try:
        dist.register_rendezvous_handler(RENDEZVOUS_SCHEME, _xla_rendezvous_handler)
    except RuntimeError:  # already registered (module reloaded)
        pass


_register()
