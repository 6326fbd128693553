"""Workers for tests/test_xla_backend.py, run by xmp.spawn on 2 processes.

``backend_worker`` does everything in one process pair (each start costs seconds on this machine):
the classic upstream DDP script (``init_process_group("xla", init_method="xla://")``, DDP with
``gradient_as_bucket_view=True``, SGD on per-rank data; final parameters saved for the parent to
compare with a single-process CPU run), then every collective through ``dist.*`` against a CPU
reference computed from both ranks' inputs, then the unsupported ops' errors.
"""
from __future__ import annotations

import os
import sys

import torch

STEPS = 4
LOCAL_BATCH = 8
LR = 0.1


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def make_data(world_size):
    """The whole batch of every step, (STEPS, world_size * LOCAL_BATCH, ...); rank r takes rows r*B:(r+1)*B."""
    g = torch.Generator().manual_seed(99)
    x = torch.randn(STEPS, world_size * LOCAL_BATCH, 6, generator=g)
    y = torch.randint(0, 3, (STEPS, world_size * LOCAL_BATCH), generator=g)
    return x, y


def _inp(rank, dtype, shape=(4, 3)):
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n).reshape(shape) % 5) + 2 * rank + 1).to(dtype)


def _eq(actual, expected, what):
    assert actual.device.type == "xla", f"{what}: result on {actual.device}"
    a = actual.cpu()
    assert a.dtype == expected.dtype, f"{what}: dtype {a.dtype} != {expected.dtype}"
    assert a.shape == expected.shape, f"{what}: shape {tuple(a.shape)} != {tuple(expected.shape)}"
    if expected.is_floating_point():
        torch.testing.assert_close(a, expected, rtol=1e-6, atol=1e-6, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(a, expected), f"{what}: {a} != {expected}"


def _ddp(rank, world, out_dir, bucket_view=True):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import torch_xla
    import torch_xla.core.xla_model as xm

    import torch_xla.distributed.xla_backend as xb

    calls = {"allreduce": 0, "broadcast": 0}
    for name in calls if bucket_view else ():  # count what DDP's C++ reducer calls on our Python group
        orig = getattr(xb.ProcessGroupXla, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            calls[_name] += 1
            return _orig(self, *a, **k)
        setattr(xb.ProcessGroupXla, name, counted)
    device = xm.xla_device()
    model = make_model()
    if rank == 1:  # DDP must broadcast rank 0's initial weights
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = DDP(model.to(device), gradient_as_bucket_view=bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    x, y = make_data(world)
    losses = []
    import torch_xla.debug.metrics as met
    met.clear_counters()
    for s in range(STEPS):
        xs = x[s, rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH].to(device)
        ys = y[s, rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH].to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(xs), ys)
        loss.backward()
        opt.step()
        torch_xla.sync()
        losses.append(loss.item())
    assert not bucket_view or (calls["broadcast"] >= 1 and calls["allreduce"] >= STEPS), calls
    params = {k: v.detach().cpu() for k, v in ddp.module.state_dict().items()}
    # DDP's bucket views (as_strided reads and writes of the flat bucket) are lowered: no CPU fallback
    fallbacks = sorted(set(met.executed_fallback_ops()) - {"aten::_local_scalar_dense"})
    torch.save({"params": params, "losses": losses, "fallbacks": fallbacks},
               os.path.join(out_dir, f"ddp{rank}_{int(bucket_view)}.pt"))


def _collectives(rank, world):
    import torch.distributed as dist
    import torch_xla.core.xla_model as xm

    dev = xm.xla_device()
    R = dist.ReduceOp
    # all_reduce: every supported op, f32 and i64
    for dtype in (torch.float32, torch.int64):
        ins = [_inp(r, dtype) for r in range(world)]
        for op, ref in ((R.SUM, lambda a, b: a + b), (R.PRODUCT, lambda a, b: a * b), (R.MIN, torch.minimum),
                        (R.MAX, torch.maximum)):
            t = ins[rank].to(dev)
            assert dist.all_reduce(t, op=op) is None
            expected = ins[0]
            for i in ins[1:]:
                expected = ref(expected, i)
            _eq(t, expected.to(dtype), f"all_reduce {op} {dtype}")
    ins = [_inp(r, torch.float32) for r in range(world)]
    t = ins[rank].to(dev)
    dist.all_reduce(t, op=R.AVG)
    _eq(t, sum(ins) / world, "all_reduce AVG")
    ins_i = [_inp(r, torch.int64) for r in range(world)]
    for op, fn in ((R.BAND, torch.bitwise_and), (R.BOR, torch.bitwise_or)):
        t = ins_i[rank].to(dev)
        dist.all_reduce(t, op=op)
        _eq(t, fn(ins_i[0], ins_i[1]), f"all_reduce {op}")
    # async_op: a completed Work
    t = ins[rank].to(dev)
    work = dist.all_reduce(t, async_op=True)
    assert work.is_completed() and work.wait() is True
    _eq(t, sum(ins), "all_reduce async_op")
    fut = work.get_future()
    assert fut.done()

    # all_gather (list) and all_gather_into_tensor (concatenated and stacked outputs)
    outs = [torch.zeros(4, 3, device=dev) for _ in range(world)]
    dist.all_gather(outs, ins[rank].to(dev))
    for r in range(world):
        _eq(outs[r], ins[r], f"all_gather[{r}]")
    cat = torch.zeros(world * 4, 3, device=dev)
    dist.all_gather_into_tensor(cat, ins[rank].to(dev))
    _eq(cat, torch.cat(ins), "all_gather_into_tensor (cat)")
    st = torch.zeros(world, 4, 3, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(st, ins_i[rank].to(dev))
    _eq(st, torch.stack(ins_i), "all_gather_into_tensor (stack, i64)")

    # broadcast from each root
    for root in range(world):
        t = ins[rank].to(dev)
        dist.broadcast(t, src=root)
        _eq(t, ins[root], f"broadcast src={root}")

    # reduce: only dst gets the result
    t = ins[rank].to(dev)
    dist.reduce(t, dst=1, op=R.MAX)
    _eq(t, torch.maximum(ins[0], ins[1]) if rank == 1 else ins[rank], "reduce dst=1")

    # reduce_scatter (list) and reduce_scatter_tensor
    big = [torch.arange(world * 4 * 3, dtype=torch.float32).reshape(world * 4, 3) * (r + 1) for r in range(world)]
    total = sum(big)
    out = torch.zeros(4, 3, device=dev)
    dist.reduce_scatter(out, list(big[rank].to(dev).chunk(world)))
    _eq(out, total.chunk(world)[rank], "reduce_scatter")
    out = torch.zeros(4, 3, device=dev)
    dist.reduce_scatter_tensor(out, big[rank].to(dev))
    _eq(out, total.chunk(world)[rank], "reduce_scatter_tensor SUM")
    out = torch.zeros(4, 3, device=dev)
    dist.reduce_scatter_tensor(out, big[rank].to(dev), op=R.AVG)
    _eq(out, (total / world).chunk(world)[rank], "reduce_scatter_tensor AVG")

    # all_to_all_single with equal splits
    src = [torch.arange(world * 2 * 3, dtype=torch.float32).reshape(world * 2, 3) + 100 * r for r in range(world)]
    out = torch.zeros(world * 2, 3, device=dev)
    dist.all_to_all_single(out, src[rank].to(dev))
    _eq(out, torch.cat([src[r].chunk(world)[rank] for r in range(world)]), "all_to_all_single")

    dist.barrier()

    # a sub-group (one member each): collectives inside it are identities
    g0, g1 = dist.new_group([0]), dist.new_group([1])
    mine = g0 if rank == 0 else g1
    t = ins[rank].to(dev)
    dist.all_reduce(t, group=mine)
    _eq(t, ins[rank], "all_reduce in a one-rank sub-group")
    assert dist.get_backend(mine) == "xla"

    # not supported: a clear NotImplementedError naming the op
    def raises(what, fn):
        try:
            fn()
        except NotImplementedError as e:
            assert what in str(e), f"{what}: message {e}"
        else:
            raise AssertionError(f"{what} did not raise NotImplementedError")

    t = torch.ones(2, device=dev)
    raises("send", lambda: dist.send(t, dst=1 - rank))
    raises("recv", lambda: dist.recv(t, src=1 - rank))
    raises("gather", lambda: dist.gather(t, [torch.ones(2, device=dev) for _ in range(world)] if rank == 0 else None,
                                         dst=0))
    raises("scatter", lambda: dist.scatter(t, [torch.ones(2, device=dev) for _ in range(world)] if rank == 0 else None,
                                           src=0))
    raises("reduce op", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64, device=dev), op=R.BXOR))
    raises("unequal split", lambda: dist.all_to_all_single(torch.zeros(3, device=dev), torch.zeros(3, device=dev),
                                                           [1, 2], [2, 1]))
    # wrong device: a clear error
    try:
        dist.all_reduce(torch.ones(2))
    except (ValueError, RuntimeError) as e:
        assert "xla" in str(e), e
    else:
        raise AssertionError("all_reduce of a CPU tensor did not raise")
    dist.barrier()


def backend_worker(index, out_dir):
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401  (registers "xla" and xla://)
    import torch_xla.runtime as xr

    dist.init_process_group("xla", init_method="xla://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (rank, world) == (xr.global_ordinal(), xr.world_size()) == (index, 2), (rank, world, index)
    assert dist.get_backend() == "xla", dist.get_backend()
    _ddp(rank, world, out_dir, bucket_view=True)
    _ddp(rank, world, out_dir, bucket_view=False)
    _collectives(rank, world)
    dist.destroy_process_group()
    open(os.path.join(out_dir, f"ok{rank}"), "w").close()


def torchrun_worker(out_dir):
    """Under torchrun (no xmp.spawn): xla:// takes torchrun's rank, world size and store."""
    import torch.distributed as dist
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_backend  # noqa: F401
    import torch_xla.runtime as xr

    dist.init_process_group("xla", init_method="xla://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (rank, world) == (xr.global_ordinal(), xr.world_size()) == (int(os.environ["RANK"]), 2)
    dev = xm.xla_device()
    t = _inp(rank, torch.float32).to(dev)
    dist.all_reduce(t)
    _eq(t, _inp(0, torch.float32) + _inp(1, torch.float32), "torchrun all_reduce")
    t = _inp(rank, torch.int64).to(dev)
    dist.broadcast(t, src=1)
    _eq(t, _inp(1, torch.int64), "torchrun broadcast")
    dist.barrier()
    dist.destroy_process_group()
    open(os.path.join(out_dir, f"torchrun_ok{rank}"), "w").close()


if __name__ == "__main__":
    # python tests/_xla_backend_workers.py <worker> <out_dir>   (torchrun_worker: under torchrun)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _xla_backend_workers as w
    if sys.argv[1] == "torchrun_worker":
        w.torchrun_worker(sys.argv[2])
    else:
        import torch_xla.distributed.xla_multiprocessing as xmp
        xmp.spawn(getattr(w, sys.argv[1]), args=(sys.argv[2],))
        print("SPAWN OK", flush=True)
