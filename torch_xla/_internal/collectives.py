"""Cross-process collectives behind one interface, one implementation per platform.

``backend()`` picks the implementation for this process:

* :class:`HostGlooBackend` (implemented; the default everywhere). The XLA:CPU plugin has no
  cross-process collectives, so values travel through the host: a collective first runs just the
  pending work its inputs need (one graph for all of them, ``_C._sync(inputs)``), reads them to
  the CPU, exchanges them with torch.distributed's gloo backend and gives back device tensors.
  Lists of tensors travel as ONE flat buffer per dtype, in one gloo call per dtype.
* :class:`InGraphBackend`: collectives lowered into the graph as StableHLO (all_reduce,
  all_gather, reduce_scatter, all_to_all; broadcast through all_gather) over the replicas of a multi-process PJRT client (NCCL on GPU, ICI on
  TPU). Running it across processes still needs the plugin's multi-process client options
  (``node_id``, ``num_nodes``, kv-store callbacks) and replica-mode compilation;
  ``TORCH_XLA_COLLECTIVE_BACKEND=ingraph`` selects it.

Every backend exchanges with the ranks of one *group* (a tuple of global ranks, the world when
``groups`` is None). Results are ordered by position in the group. Rendezvous (bytes) goes through
the job's TCPStore and is shared by all backends.

A collective that waits more than 20 ms records its arrival (its per-group sequence number) in the
store; when gloo fails (timeout, peer gone) the error names the operation and the ranks that had not
arrived. On the CPU plugin device buffers are host memory: reads to the host copy them on the
calling thread, and a sum of one large tensor over two ranks sends straight from the device buffer
(``HostGlooBackend._pair_sum``) instead of copying it to a staging buffer first.
"""
from __future__ import annotations

import datetime
import os
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import world

REDUCE_OPS = ("sum", "mul", "and", "or", "min", "max")


class CollectiveBackend:
    """What a platform's collective implementation provides. All tensor arguments are tensors of
    one device (XLA or CPU); results are new tensors on that device, in input order. ``group`` is
    a tuple of global ranks holding this rank."""

    name = "abstract"
    # True when a collective reads its inputs' values on the host (so the pending graph runs first).
    needs_host_values = True

    def all_reduce(self, reduce_type: str, tensors: List[torch.Tensor], scale: float,
                   group: Tuple[int, ...]) -> List[torch.Tensor]:
        raise NotImplementedError

    def all_gather(self, tensors: List[torch.Tensor], dim: int, group: Tuple[int, ...]) -> List[torch.Tensor]:
        raise NotImplementedError

    def reduce_scatter(self, reduce_type: str, tensors: List[torch.Tensor], scale: float, scatter_dim: int,
                       group: Tuple[int, ...]) -> List[torch.Tensor]:
        raise NotImplementedError

    def all_to_all(self, tensor: torch.Tensor, split_dimension: int, concat_dimension: int,
                   group: Tuple[int, ...]) -> torch.Tensor:
        raise NotImplementedError

    def broadcast(self, tensors: List[torch.Tensor], root: int, group: Tuple[int, ...]) -> List[torch.Tensor]:
        raise NotImplementedError


class InGraphBackend(CollectiveBackend):
    """Collectives as StableHLO ops inside the graph, over the replicas of the computation (the
    processes of a multi-process PJRT client on GPU/TPU: NCCL/ICI do the exchange, no host copy).

    Every collective is lazy: it adds ``stablehlo.all_reduce`` / ``all_gather`` /
    ``reduce_scatter`` / ``all_to_all`` with the job's ``replica_groups`` (all groups of the
    partition, replica id = global rank, one device per process) to the pending graph; broadcast
    is an all_gather followed by taking the root's slice (exact for every value and dtype).
    StableHLO needs groups of equal size: other partitions raise NotImplementedError naming the
    host backend. On the CPU plugin, which has no cross-process collectives, a multi-process job
    cannot use this backend (the constructor says so); the same graphs compiled for N replicas of
    one process run on XLA:CPU's in-process collectives, which is how the tests check them.
    """

    name = "ingraph"
    needs_host_values = False

    def __init__(self):
        if world.world_size() > 1 and os.environ.get("PJRT_DEVICE", "CPU").strip().upper() in ("", "CPU"):
            raise NotImplementedError(
                "in-graph collectives need a PJRT plugin with cross-process collectives (GPU, TPU); the CPU "
                "plugin has none: unset TORCH_XLA_COLLECTIVE_BACKEND to use the host (gloo) collectives")

    @staticmethod
    def _groups(what: str, group) -> List[List[int]]:
        partition = getattr(group, "partition", None) or (tuple(group),)
        if len({len(g) for g in partition}) != 1:
            raise NotImplementedError(
                f"in-graph {what} needs groups of equal size (StableHLO replica_groups), got "
                f"{[list(g) for g in partition]}; use the host backend (TORCH_XLA_COLLECTIVE_BACKEND=host)")
        return [list(g) for g in partition]

    def all_reduce(self, reduce_type, tensors, scale, group):
        from torch_xla import _C
        if not tensors:
            return []
        for t in tensors:
            if reduce_type in ("and", "or") and (t.dtype.is_floating_point or t.dtype.is_complex):
                raise ValueError(f"all_reduce {reduce_type!r} needs integer or bool tensors, got {t.dtype}")
        groups = self._groups("all_reduce", group)
        if reduce_type in ("and", "or"):
            # XLA's all-reduce (CPU, and NCCL on GPU) combines only with add/mul/min/max: bitwise
            # and/or gather every member's value and combine them in the graph.
            fn = torch.bitwise_and if reduce_type == "and" else torch.bitwise_or
            out = []
            for t in tensors:
                parts = _C._all_gather_ingraph([t.unsqueeze(0)], 0, groups)[0].unbind(0)
                r = parts[0]
                for p in parts[1:]:
                    r = fn(r, p)
                out.append(r if scale == 1.0 else (r.to(torch.float64) * scale).to(t.dtype))
            return out
        return list(_C._all_reduce_ingraph(list(tensors), reduce_type, float(scale), groups))

    def all_gather(self, tensors, dim, group):
        from torch_xla import _C
        if not tensors:
            return []
        groups = self._groups("all_gather", group)
        # a 0-dim tensor gathers into a 1-dim one, as the host backend stacks them
        shaped = [t.reshape(1) if t.dim() == 0 else t for t in tensors]
        return [_C._all_gather_ingraph([t], dim if t.dim() else 0, groups)[0] for t in shaped]

    def reduce_scatter(self, reduce_type, tensors, scale, scatter_dim, group):
        from torch_xla import _C
        if not tensors:
            return []
        n = len(group)
        for t in tensors:
            if t.dim() == 0 or t.shape[scatter_dim] % n:
                raise ValueError(f"reduce_scatter: dimension {scatter_dim} of shape {tuple(t.shape)} is not divisible "
                                 f"by the group size {n}")
        return list(_C._reduce_scatter_ingraph(list(tensors), reduce_type, float(scale), scatter_dim,
                                               self._groups("reduce_scatter", group)))

    def all_to_all(self, tensor, split_dimension, concat_dimension, group):
        from torch_xla import _C
        n = len(group)
        if tensor.dim() == 0 or tensor.shape[split_dimension] % n:
            raise ValueError(f"all_to_all: dimension {split_dimension} of shape {tuple(tensor.shape)} is not "
                             f"divisible by split_count {n}")
        return _C._all_to_all_ingraph([tensor], split_dimension, concat_dimension,
                                      self._groups("all_to_all", group))[0]

    def broadcast(self, tensors, root, group):
        if not tensors:
            return []
        k = list(group).index(root)
        gathered = self.all_gather([t.unsqueeze(0) for t in tensors], 0, group)
        return [g[k] for g in gathered]


# --------------------------------------------------------------------------------------------------
# Host staging: device tensors <-> CPU tensors


def _stage_to_host(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """CPU copies of ``tensors``; pending XLA work they need runs first, as one graph."""
    xla = [t for t in tensors if t.device.type == "xla"]
    if xla:
        from torch_xla import _C
        _C._sync(xla, False, "")
    return [t.detach().cpu().contiguous() if t.device.type == "xla" else t.detach().contiguous()
            for t in tensors]


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t if device.type == "cpu" else t.to(device)


def _staging_buffer(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A host buffer from the staging pool (csrc/util/host_pool.cc): its memory goes back to the
    pool when the last holder lets go (this tensor, or the device buffer that adopted it), so the
    next collective of the same size reads into memory that is already mapped."""
    from torch_xla import _C
    return _C._pooled_empty(numel, dtype)


def _stage_flat(tensors: Sequence[torch.Tensor], scratch: bool = True):
    """Host copies of ``tensors`` as ONE flat buffer per dtype.

    Returns (shapes, {dtype: (flat, indices in order)}). Pending XLA work the inputs need runs
    first, as one graph. XLA tensors are read straight into the flat buffer (a reused staging
    buffer when ``scratch``); CPU tensors are copied, never aliased.
    """
    xla = [t for t in tensors if t.device.type == "xla"]
    from torch_xla import _C
    if xla:
        _C._sync(xla, False, "")
    shapes = [tuple(t.shape) for t in tensors]
    by: Dict[torch.dtype, List[int]] = {}
    for i, t in enumerate(tensors):
        by.setdefault(t.dtype, []).append(i)
    out = {}
    for dt, idx in by.items():
        total = sum(tensors[i].numel() for i in idx)
        on_xla = all(tensors[i].device.type == "xla" for i in idx)
        flat = _staging_buffer(dt, total) if scratch and on_xla else torch.empty(total, dtype=dt)
        off = 0
        for i in idx:
            t = tensors[i]
            n = t.numel()
            if t.device.type == "xla":
                _C._to_host_into(t.detach(), flat[off:off + n])
            else:
                flat[off:off + n].copy_(t.detach().reshape(-1))
            off += n
        out[dt] = (flat, idx)
    return shapes, out


def _upload_owned(flat: torch.Tensor, device) -> torch.Tensor:
    """``flat`` (a contiguous CPU tensor nobody else holds, never written again) on ``device``. On
    XLA the device buffer takes over its memory (no copy on the CPU plugin)."""
    if device.type == "cpu":
        return flat.clone()
    if device.type != "xla" or os.environ.get("TORCH_XLA_COLLECTIVE_ZERO_COPY", "1") == "0":
        return flat.to(device)
    from torch_xla import _C
    return _C._from_cpu_adopt(flat, device.index or 0)


def _unflatten(flat: torch.Tensor, idx: List[int], shapes, device, results: list):
    """Splits ``flat`` back into tensors of ``shapes`` on ``device`` (one upload per dtype)."""
    if len(idx) == 1:  # upload in its final shape: no pending view op on the result
        i = idx[0]
        results[i] = _upload_owned(flat.view(shapes[i]), device)
        return
    dev_flat = _upload_owned(flat, device)
    off = 0
    for i in idx:
        n = 1
        for d in shapes[i]:
            n *= d
        results[i] = dev_flat[off:off + n].view(shapes[i])
        off += n


def _apply_scale(flat: torch.Tensor, scale: float) -> torch.Tensor:
    if scale == 1.0:
        return flat
    if flat.is_floating_point() or flat.is_complex():
        return flat.mul_(scale)
    return (flat * scale).to(flat.dtype)


# --------------------------------------------------------------------------------------------------
# gloo groups


# How long a collective waits before recording its arrival in the store (see _Group.run).
# None: record before every exchange.
_RECORD_AFTER: Optional[datetime.timedelta] = datetime.timedelta(milliseconds=20)


# Sum of one tensor over two ranks (the common data-parallel case): an out-of-place exchange that
# reads the device buffer in place (HostGlooBackend._pair_sum) instead of copying it to the host and
# calling gloo's in-place all-reduce. TORCH_XLA_PAIR_ALLREDUCE=0 turns it off; both settings must
# agree on all ranks.
_PAIR_SUM = os.environ.get("TORCH_XLA_PAIR_ALLREDUCE", "1") != "0"
# Below ~8 MB the copy + gloo's all-reduce was as fast or faster on the 2-core VM (bench/README).
_PAIR_MIN_BYTES = world._env_int("TORCH_XLA_PAIR_ALLREDUCE_MIN_BYTES", 8 << 20)
_PAIR_SEGMENT_BYTES = world._env_int("TORCH_XLA_PAIR_ALLREDUCE_SEGMENT_BYTES", 1 << 62)  # pieces per half
_PAIR_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                torch.int16, torch.int8, torch.uint8)


class _Group:
    """A gloo process group over ``members`` (global ranks), created on first use."""

    def __init__(self, members: Tuple[int, ...]):
        import torch.distributed as dist

        self.members = members
        self.size = len(members)
        me = world.rank()
        self.rank = members.index(me)
        self.key = "world" if members == tuple(range(world.world_size())) else "g" + "-".join(map(str, members))
        self.seq = 0
        self._watching: Optional[int] = None  # the send/recv exchange in flight (run_steps)
        self._watch_cv = threading.Condition()
        self._watcher: Optional[threading.Thread] = None
        self.store = world.store()
        self.timeout = world.timeout_s()
        started = time.monotonic()
        try:
            self.pg = dist.ProcessGroupGloo(dist.PrefixStore(f"pg/{self.key}/", self.store), self.rank, self.size,
                                            world.timeout_delta())
        except Exception as e:
            raise world.CollectiveTimeoutError(
                f"torch_xla: rank {me} could not connect the gloo group {list(members)} within "
                f"{time.monotonic() - started:.1f} s (timeout {self.timeout:g} s): {e}", "connect", []) from e

    def run(self, op: str, call):
        """Runs ``call(pg)`` (returns a Work), waits; failures name the op and absent ranks.

        The arrival record (this rank's sequence number in the store, read by ``_diagnose``) is
        written only when the exchange does not finish within ``_RECORD_AFTER`` (a store round
        trip costs 0.03-2.5 ms, most of a small collective's overhead): a collective that never
        completes leaves every rank that reached it blocked, so each of them records its arrival
        long before gloo's timeout fires, and a rank that never came keeps an older number."""
        self.seq += 1
        seq = self.seq
        started = time.monotonic()
        try:
            if _RECORD_AFTER is None:  # record first (the bench's A/B switch)
                self._record(seq)
                call(self.pg).wait()
                return
            work = call(self.pg)
            try:
                work.wait(_RECORD_AFTER)
            except Exception:
                # Our short timeout, or gloo's own error. The work may also have completed just
                # after the timeout fired: the second wait returns at once then, or raises gloo's
                # error again.
                if not work.is_completed():
                    self._record(seq)  # still waiting for someone: say we are here
                work.wait()
        except Exception as e:
            self._record(seq)
            raise self._diagnose(f"{op}#{seq}", seq, started, e) from e

    def run_steps(self, op: str, steps):
        """Like ``run`` for an exchange of several gloo operations (send/recv): ``steps(pg)``
        posts and waits for them. A timed wait would fail a gloo send/recv, so a watcher thread
        records the arrival when the exchange is still running after ``_RECORD_AFTER``."""
        self.seq += 1
        seq = self.seq
        started = time.monotonic()
        if _RECORD_AFTER is None:
            self._record(seq)
        else:
            self._watch(seq)
        try:
            return steps(self.pg)
        except Exception as e:
            self._record(seq)
            raise self._diagnose(f"{op}#{seq}", seq, started, e) from e
        finally:
            self._watching = None

    def _watch(self, seq: int):
        with self._watch_cv:
            self._watching = seq
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_loop, name="torch_xla-arrival", daemon=True)
                self._watcher.start()
            self._watch_cv.notify()

    def _watch_loop(self):
        wait_s = _RECORD_AFTER.total_seconds() if _RECORD_AFTER is not None else 0.02
        recorded = 0
        while True:
            with self._watch_cv:
                while self._watching is None:
                    self._watch_cv.wait()
                seq = self._watching
                self._watch_cv.wait(wait_s)  # a new exchange wakes it early
                still = self._watching == seq
            if still and recorded < seq:
                self._record(seq)
                recorded = seq

    def _record(self, seq: int):
        try:
            self.store.set(f"arr/{self.key}/{world.rank()}", str(seq))
        except Exception:  # the store is gone (the launcher died): gloo's error says enough
            pass

    def _diagnose(self, tag: str, seq: int, started: float, err: Exception) -> Exception:
        me = world.rank()
        missing, ahead = [], []
        try:
            for r in self.members:
                if r == me:
                    continue
                k = f"arr/{self.key}/{r}"
                v = int(self.store.get(k)) if self.store.check([k]) else 0
                if v < seq:
                    missing.append(r)
                elif v > seq:
                    ahead.append(r)
        except Exception:  # the store itself is gone (the launcher died): report what we know
            pass
        waited = time.monotonic() - started
        msg = (f"torch_xla collective {tag!r} on rank {me} over ranks {list(self.members)} failed after "
               f"{waited:.1f} s (timeout {self.timeout:g} s, TORCH_XLA_COLLECTIVE_TIMEOUT_S)")
        if missing:
            msg += f": rank(s) {missing} did not arrive"
        if ahead:
            msg += f"; rank(s) {ahead} are already at a later collective (mismatched collective calls)"
        msg += f" [gloo: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}]"
        return world.CollectiveTimeoutError(msg, tag, missing)


class HostGlooBackend(CollectiveBackend):
    """Host-side collectives through torch.distributed's gloo (see the module docstring)."""

    name = "host-gloo"

    def __init__(self):
        self._groups: Dict[Tuple[int, ...], _Group] = {}
        self._lock = threading.Lock()

    def group(self, members: Tuple[int, ...]) -> _Group:
        with self._lock:
            g = self._groups.get(members)
            if g is None:
                g = self._groups[members] = _Group(members)
            return g

    @staticmethod
    def _reduce_op(reduce_type: str, dtype: torch.dtype):
        import torch.distributed as dist
        if reduce_type in ("and", "or") and (dtype.is_floating_point or dtype.is_complex):
            raise ValueError(f"all_reduce {reduce_type!r} needs integer or bool tensors, got {dtype}")
        return {"sum": dist.ReduceOp.SUM, "mul": dist.ReduceOp.PRODUCT, "and": dist.ReduceOp.BAND,
                "or": dist.ReduceOp.BOR, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[reduce_type]

    def all_reduce(self, reduce_type, tensors, scale, group):
        import torch.distributed as dist
        if not tensors:
            return []
        device = tensors[0].device
        if (len(group) == 2 and reduce_type == "sum" and len(tensors) == 1 and _PAIR_SUM
                and tensors[0].dtype in _PAIR_DTYPES
                and tensors[0].numel() * tensors[0].element_size() >= _PAIR_MIN_BYTES):
            # (every condition is the same on both ranks: both take this path)
            flat = _apply_scale(self._pair_sum(tensors[0], self.group(group)), scale)
            return [_upload_owned(flat.view(tensors[0].shape), device)]
        ops = {t.dtype: self._reduce_op(reduce_type, t.dtype) for t in tensors}
        shapes, flats = _stage_flat(tensors)
        results: list = [None] * len(tensors)
        g = self.group(group) if len(group) > 1 else None
        for dt, (flat, idx) in flats.items():
            if g is not None:
                opts = dist.AllreduceOptions()
                opts.reduceOp = ops[dt]
                g.run("all_reduce", lambda pg: pg.allreduce([flat], opts))
            flat = _apply_scale(flat, scale)
            _unflatten(flat, idx, shapes, device, results)
        return results

    @staticmethod
    def _pair_sum(t: torch.Tensor, g: "_Group") -> torch.Tensor:
        """Sum of ``t`` over a group of two, without copying ``t`` to the host first.

        On the CPU plugin ``t``'s device buffer is host memory (``_C._host_view``, read-only), so
        gloo sends straight from it: each rank owns one half, receives the peer's values of that
        half and adds them to its own into a fresh staging buffer, then the two ranks swap their
        reduced halves (gloo's ring all-reduce for two ranks, out of place). Each half is summed
        once, so both ranks hold identical results (a + b == b + a). Where ``t`` cannot be viewed
        (pending views, sharded, narrowed storage) it is staged first; the exchange is the same.
        Returns the flat result (a pooled host buffer nobody else holds)."""
        from torch_xla import _C
        src = None
        if t.device.type == "xla":
            _C._sync([t], False, "")
            src = _C._host_view(t.detach())
            if src is None:
                src = _staging_buffer(t.dtype, t.numel())
                _C._to_host_into(t.detach(), src)
        else:
            src = t.detach().contiguous()
        src = src.reshape(-1)
        n = src.numel()
        me, peer = g.rank, 1 - g.rank
        bounds = (0, n // 2, n)
        mine = slice(bounds[me], bounds[me + 1])
        theirs = slice(bounds[peer], bounds[peer + 1])
        out = _staging_buffer(t.dtype, n)
        part = _staging_buffer(t.dtype, mine.stop - mine.start)  # the peer's values of my half

        def pieces(half: slice):  # the same split on both ranks (it depends on the length only)
            length = half.stop - half.start
            k = max(1, min(16, length * src.element_size() // _PAIR_SEGMENT_BYTES))
            return [(half.start + length * i // k, half.start + length * (i + 1) // k) for i in range(k)]

        def steps(pg):
            base = mine.start
            sends = [pg.send([src[a:b]], peer, i) for i, (a, b) in enumerate(pieces(theirs))]
            recvs = [pg.recv([part[a - base:b - base]], peer, i) for i, (a, b) in enumerate(pieces(mine))]
            backs = [pg.recv([out[a:b]], peer, 1000 + i) for i, (a, b) in enumerate(pieces(theirs))]
            for i, ((a, b), r) in enumerate(zip(pieces(mine), recvs)):
                r.wait()  # add each piece as it arrives, and send it back at once
                torch.add(src[a:b], part[a - base:b - base], out=out[a:b])
                sends.append(pg.send([out[a:b]], peer, 1000 + i))
            for w in sends + backs:
                w.wait()

        g.run_steps("all_reduce", steps)
        del src  # lets go of the device buffer
        return out

    def all_gather(self, tensors, dim, group):
        if not tensors:
            return []
        device = tensors[0].device
        shapes, flats = _stage_flat(tensors)
        results: list = [None] * len(tensors)
        g = self.group(group) if len(group) > 1 else None
        for dt, (flat, idx) in flats.items():
            if g is not None:
                outs = [torch.empty_like(flat) for _ in range(g.size)]
                g.run("all_gather", lambda pg: pg.allgather([outs], [flat]))
            else:
                outs = [flat.clone()]
            off = 0
            for i in idx:
                shape = shapes[i]
                n = tensors[i].numel()
                parts = [o[off:off + n].view(shape) for o in outs]
                gathered = torch.cat(parts, dim=dim % len(shape)) if shape else torch.stack(parts)
                results[i] = _to_device(gathered, device)
                off += n
        return results

    def reduce_scatter(self, reduce_type, tensors, scale, scatter_dim, group):
        import torch.distributed as dist
        if not tensors:
            return []
        device = tensors[0].device
        n = len(group)
        for t in tensors:
            if t.dim() == 0 or t.shape[scatter_dim] % n:
                raise ValueError(f"reduce_scatter: dimension {scatter_dim} of shape {tuple(t.shape)} is not divisible "
                                 f"by the group size {n}")
        ops = {t.dtype: self._reduce_op(reduce_type, t.dtype) for t in tensors}
        # Put the scattered dimension first, so rank k's shard of every tensor is a contiguous
        # block; then one buffer per dtype laid out [shard 0 of all tensors | shard 1 | ...].
        host = [h.movedim(scatter_dim, 0).contiguous() for h in _stage_to_host(tensors)]
        results: list = [None] * len(host)
        g = self.group(group) if n > 1 else None
        by: Dict[torch.dtype, List[int]] = {}
        for i, h in enumerate(host):
            by.setdefault(h.dtype, []).append(i)
        for dt, idx in by.items():
            if len(idx) == 1:
                flat = host[idx[0]].reshape(-1)
            else:
                flat = torch.cat([host[i].reshape(n, -1)[k] for k in range(n) for i in idx])
            shard = torch.empty(flat.numel() // n, dtype=dt)
            if g is not None:
                opts = dist.ReduceScatterOptions()
                opts.reduceOp = ops[dt]
                g.run("reduce_scatter", lambda pg: pg._reduce_scatter_base(shard, flat, opts))
            else:
                shard.copy_(flat)
            shard = _apply_scale(shard, scale)
            off = 0
            for i in idx:
                h = host[i]
                m = h.numel() // n
                shape = (h.shape[0] // n,) + tuple(h.shape[1:])
                results[i] = _to_device(shard[off:off + m].view(shape).movedim(0, scatter_dim).contiguous(), device)
                off += m
        return results

    def all_to_all(self, tensor, split_dimension, concat_dimension, group):
        import torch.distributed as dist
        n = len(group)
        device = tensor.device
        (h,) = _stage_to_host([tensor])
        if h.shape[split_dimension] % n:
            raise ValueError(f"all_to_all: dimension {split_dimension} of shape {tuple(h.shape)} is not divisible by "
                             f"split_count {n}")
        send = torch.stack(torch.chunk(h, n, dim=split_dimension)).contiguous()
        recv = torch.empty_like(send)
        if n > 1:
            g = self.group(group)
            g.run("all_to_all", lambda pg: pg.alltoall_base(recv, send, [], [], dist.AllToAllOptions()))
        else:
            recv.copy_(send)
        return _to_device(torch.cat(list(recv.unbind(0)), dim=concat_dimension), device)

    def broadcast(self, tensors, root, group):
        import torch.distributed as dist
        if not tensors:
            return []
        device = tensors[0].device
        shapes, flats = _stage_flat(tensors)
        results: list = [None] * len(tensors)
        g = self.group(group) if len(group) > 1 else None
        for dt, (flat, idx) in flats.items():
            if g is not None:
                opts = dist.BroadcastOptions()
                opts.rootRank = group.index(root)
                opts.rootTensor = 0
                g.run("broadcast", lambda pg: pg.broadcast([flat], opts))
            _unflatten(flat, idx, shapes, device, results)
        return results


# --------------------------------------------------------------------------------------------------
# Backend choice


_backend: Optional[CollectiveBackend] = None
_backend_lock = threading.Lock()


def backend() -> CollectiveBackend:
    """The collective implementation of this process (``TORCH_XLA_COLLECTIVE_BACKEND``: ``host``,
    the default on every platform, or ``ingraph``: StableHLO collectives inside the graph)."""
    global _backend
    with _backend_lock:
        if _backend is None:
            choice = os.environ.get("TORCH_XLA_COLLECTIVE_BACKEND", "host").strip().lower() or "host"
            if choice in ("host", "gloo", "host-gloo"):
                _backend = HostGlooBackend()
            elif choice in ("ingraph", "in-graph", "xla"):
                _backend = InGraphBackend()
            else:
                raise ValueError(f"TORCH_XLA_COLLECTIVE_BACKEND={choice!r}: expected 'host' or 'ingraph'")
        return _backend


# --------------------------------------------------------------------------------------------------
# Rendezvous through the store (all backends)

_rdv_gen: Dict[Tuple[str, str], int] = {}
_rdv_lock = threading.Lock()


def rendezvous(tag: str, payload: bytes, replicas: Sequence[int]) -> List[bytes]:
    """Every participating rank's payload, in rank order (order of ``replicas`` when given)."""
    if not isinstance(tag, str):
        raise TypeError(f"rendezvous tag must be a str, got {type(tag).__name__}")
    if isinstance(payload, str):
        payload = payload.encode()
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"rendezvous payload must be bytes, got {type(payload).__name__}")
    payload = bytes(payload)
    n = world.world_size()
    me = world.rank()
    if replicas:
        members = list(replicas)
        for r in members:
            if not isinstance(r, int) or isinstance(r, bool) or r < 0 or r >= n:
                raise ValueError(f"rendezvous replicas {list(replicas)!r}: {r!r} is not a rank of the world (size {n})")
        if len(set(members)) != len(members):
            raise ValueError(f"rendezvous replicas {list(replicas)!r} has duplicates")
        if me not in members:
            raise ValueError(f"rank {me} called rendezvous {tag!r} but is not in replicas {members}")
    else:
        members = list(range(n))
    if len(members) == 1:
        return [payload]
    gkey = "all" if not replicas else "-".join(map(str, members))
    with _rdv_lock:
        gen = _rdv_gen.get((tag, gkey), 0) + 1
        _rdv_gen[(tag, gkey)] = gen
    base = f"rdv/{gkey}/{len(tag)}:{tag}/"
    st = world.store()
    st.set(f"{base}{gen}/{me}", payload)
    keys = [f"{base}{gen}/{r}" for r in members]
    timeout = world.timeout_s()
    started = time.monotonic()
    try:
        st.wait(keys, world.timeout_delta())
    except Exception as e:
        missing = []
        try:
            missing = [r for r in members if not st.check([f"{base}{gen}/{r}"])]
        except Exception:
            pass
        if missing or time.monotonic() - started < timeout:
            raise world.CollectiveTimeoutError(
                f"torch_xla rendezvous {tag!r} on rank {me} timed out after {time.monotonic() - started:.1f} s "
                f"(timeout {timeout:g} s, TORCH_XLA_COLLECTIVE_TIMEOUT_S): rank(s) {missing} of {members} did not "
                f"arrive [{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}]",
                tag, missing) from e
    values = [st.get(k) for k in keys]
    if gen > 1:
        try:  # everyone has finished generation gen-1 (they all reached gen)
            st.delete_key(f"{base}{gen - 1}/{me}")
        except Exception:
            pass
    return [bytes(v) for v in values]
