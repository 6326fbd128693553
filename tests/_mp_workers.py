"""Functions run by xmp.spawn in tests/test_distributed.py (importable by spawned children).

Each worker checks its results against a CPU reference computed from every rank's inputs (all
inputs are deterministic functions of the rank) and raises AssertionError on a mismatch, which
makes spawn() raise in the parent with the rank's traceback.
"""
from __future__ import annotations

import os
import sys
import time

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.int64)


def _base(k, dtype, shape=(4, 6)):
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n).reshape(shape) % 7) + k + 1).to(dtype)


def _mulvals(k, dtype, shape=(4, 6)):
    n = 1
    for s in shape:
        n *= s
    return (((torch.arange(n).reshape(shape) + k) % 2) + 1).to(dtype)


def _eq(actual, expected, what):
    assert actual.device.type == "xla", f"{what}: result on {actual.device}"
    a = actual.cpu()
    assert a.dtype == expected.dtype, f"{what}: dtype {a.dtype} != {expected.dtype}"
    assert a.shape == expected.shape, f"{what}: shape {tuple(a.shape)} != {tuple(expected.shape)}"
    if expected.is_floating_point():
        tol = 1e-2 if expected.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(a, expected, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(a, expected), f"{what}: {a} != {expected}"


def _reduce(op, xs):
    out = xs[0].clone()
    for x in xs[1:]:
        if op == "sum":
            out = out + x
        elif op == "mul":
            out = out * x
        elif op == "min":
            out = torch.minimum(out, x)
        elif op == "max":
            out = torch.maximum(out, x)
        elif op == "and":
            out = out & x
        elif op == "or":
            out = out | x
    return out.to(xs[0].dtype)


def collectives_worker(index, out_dir):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.core.functions as xf
    import torch_xla.runtime as xr

    n = xr.world_size()
    me = xr.global_ordinal()
    dev = torch_xla.device()

    # ---- topology ----
    assert index == me, (index, me)
    assert dev == torch.device("xla", 0), dev
    assert torch_xla.devices() == [torch.device("xla", 0)], torch_xla.devices()
    assert torch_xla.device_count() == 1
    assert xr.local_ordinal() == me and xr.local_process_count() == n
    assert xr.addressable_device_count() == 1 and xr.local_device_count() == n
    assert xr.global_device_count() == n and xr.global_runtime_device_count() == n
    assert xr.host_index() == 0 and xr.get_master_ip() == "127.0.0.1"
    assert xm.is_master_ordinal() == (me == 0) and xm.is_master_ordinal(local=False) == (me == 0)
    assert xm.xrt_world_size() == n and xm.get_ordinal() == me and xm.get_local_ordinal() == me
    assert xm.get_xla_supported_devices() == ["xla:0"], xm.get_xla_supported_devices()
    info = xm.get_memory_info(dev)
    assert {"bytes_used", "bytes_limit", "peak_bytes_used", "kb_free", "kb_total"} <= set(info), info

    ranks = list(range(n))
    # groups: non-contiguous (n=4) or reversed order (n=2)
    groups = [[0, 2], [1, 3]] if n == 4 else [[1, 0]]
    grp = next(g for g in groups if me in g)

    # ---- all_reduce: every op and dtype, scale, groups ----
    for dt in DTYPES:
        for op in ("sum", "mul", "min", "max") + (("and", "or") if not dt.is_floating_point else ()):
            mk = _mulvals if op == "mul" else _base
            x = mk(me, dt).to(dev)
            _eq(xm.all_reduce(op, x), _reduce(op, [mk(k, dt) for k in ranks]), f"all_reduce {op} {dt}")
            _eq(xm.all_reduce(op, x, groups=groups), _reduce(op, [mk(k, dt) for k in grp]),
                f"all_reduce {op} {dt} groups")
        if dt.is_floating_point:
            _eq(xm.all_reduce("sum", _base(me, dt).to(dev), scale=0.5),
                (_reduce("sum", [_base(k, dt) for k in ranks]) * 0.5).to(dt), f"all_reduce scale {dt}")
        x = _base(me, dt).to(dev)
        _eq(x, _base(me, dt), "all_reduce on a single tensor leaves its input alone")
    b = (torch.arange(6) % 2 == me % 2).to(dev)
    _eq(xm.all_reduce("or", b), _reduce("or", [(torch.arange(6) % 2 == k % 2) for k in ranks]), "all_reduce or bool")

    # list form: in place, one flat buffer per dtype
    ins = [_base(me, torch.float32, (3,)), _base(me, torch.bfloat16, (2, 2)), _base(me, torch.int64, (5,)),
           _base(me, torch.float32, (2, 3))]
    xs = [t.to(dev) for t in ins]
    from torch_xla._internal import collectives
    world_group = collectives.backend().group(tuple(ranks))
    calls = world_group.seq
    ret = xm.all_reduce("sum", xs, scale=1.0)
    assert world_group.seq - calls == 3, "one gloo call per dtype (f32, bf16, i64)"
    assert ret is xs
    for i, t in enumerate(xs):
        _eq(t, _reduce("sum", [_base(k, ins[i].dtype, tuple(ins[i].shape)) for k in ranks]), f"all_reduce list [{i}]")
    xs = [t.to(dev) for t in ins[:1] + ins[3:]]
    xm.all_reduce("sum", xs, scale=1.0 / len(grp), groups=groups, pin_layout=False)
    for t, src in zip(xs, ins[:1] + ins[3:]):
        _eq(t, _reduce("sum", [_base(k, src.dtype, tuple(src.shape)) for k in grp]) / len(grp), "all_reduce list groups")

    # ---- all_gather ----
    for dt in DTYPES:
        x = _base(me, dt).to(dev)
        _eq(xm.all_gather(x), torch.cat([_base(k, dt) for k in ranks], 0), f"all_gather {dt}")
        _eq(xm.all_gather(x, dim=1), torch.cat([_base(k, dt) for k in ranks], 1), f"all_gather dim1 {dt}")
        _eq(xm.all_gather(x, dim=1, groups=groups), torch.cat([_base(k, dt) for k in grp], 1), f"all_gather groups {dt}")
        out = torch.zeros(4 * n, 6, dtype=dt, device=dev)
        r = xm.all_gather(x, output=out)
        assert r is out
        _eq(out, torch.cat([_base(k, dt) for k in ranks], 0), f"all_gather output= {dt}")

    # ---- reduce_scatter ----
    for dt in DTYPES:
        x = _base(me, dt, (4 * n, 2)).to(dev)
        full = _reduce("sum", [_base(k, dt, (4 * n, 2)) for k in ranks])
        _eq(xm.reduce_scatter("sum", x, 1.0, 0, n), full.chunk(n, 0)[me].contiguous(), f"reduce_scatter {dt}")
        x = _base(me, dt, (3, 2 * n)).to(dev)
        full = _reduce("max", [_base(k, dt, (3, 2 * n)) for k in ranks])
        _eq(xm.reduce_scatter("max", x, 1.0, 1, n), full.chunk(n, 1)[me].contiguous(), f"reduce_scatter max dim1 {dt}")
    x = _base(me, torch.float32, (2 * len(grp), 3)).to(dev)
    full = _reduce("sum", [_base(k, torch.float32, (2 * len(grp), 3)) for k in grp]) * 0.25
    _eq(xm.reduce_scatter("sum", x, 0.25, 0, len(grp), groups=groups), full.chunk(len(grp), 0)[grp.index(me)].contiguous(),
        "reduce_scatter scale groups")
    xs = [_base(me, torch.float32, (2 * n,)).to(dev), _base(me, torch.float32, (n, 3)).to(dev)]
    rs = xm.reduce_scatter("sum", xs, 1.0, 0, n)
    _eq(rs[0], _reduce("sum", [_base(k, torch.float32, (2 * n,)) for k in ranks]).chunk(n)[me].contiguous(), "rs list 0")
    _eq(rs[1], _reduce("sum", [_base(k, torch.float32, (n, 3)) for k in ranks]).chunk(n)[me].contiguous(), "rs list 1")

    # ---- all_to_all ----
    for dt in DTYPES:
        x = _base(me, dt, (2, 3 * n)).to(dev)
        exp = torch.cat([_base(k, dt, (2, 3 * n)).chunk(n, 1)[me] for k in ranks], 0)
        _eq(xm.all_to_all(x, 1, 0, n), exp, f"all_to_all {dt}")
    x = _base(me, torch.float32, (2 * len(grp), 3)).to(dev)
    exp = torch.cat([_base(k, torch.float32, (2 * len(grp), 3)).chunk(len(grp), 0)[grp.index(me)] for k in grp], 1)
    _eq(xm.all_to_all(x, 0, 1, len(grp), groups=groups), exp, "all_to_all groups")

    # ---- collective_broadcast / broadcast_master_param ----
    ts = [_base(me, torch.float32).to(dev), _base(me, torch.int64, (3,)).to(dev), _base(me, torch.bfloat16, (2,)).to(dev)]
    xm.collective_broadcast(ts, root_ordinal=1)
    _eq(ts[0], _base(1, torch.float32), "broadcast f32")
    _eq(ts[1], _base(1, torch.int64, (3,)), "broadcast i64")
    _eq(ts[2], _base(1, torch.bfloat16, (2,)), "broadcast bf16")
    ts = [_base(me, torch.float32).to(dev)]
    xm.collective_broadcast(ts, root_ordinal=grp[-1], groups=groups)
    _eq(ts[0], _base(grp[-1], torch.float32), "broadcast groups")
    torch.manual_seed(100 + me)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(dev)
    xm.broadcast_master_param(model)
    torch.manual_seed(100)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        _eq(p, q, f"broadcast_master_param {name}")
    assert all(p.requires_grad for p in model.parameters())

    # ---- autograd all_gather ----
    x = (_base(me, torch.float32, (2, 3)) * 0.5).to(dev).requires_grad_()
    y = xf.all_gather(x, dim=0)
    w = torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) * (me + 1)
    (y * w.to(dev)).sum().backward()
    wsum = sum(torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) * (k + 1) for k in ranks)
    _eq(x.grad, wsum[2 * me:2 * me + 2], "functions.all_gather grad")
    _eq(y.detach(), torch.cat([_base(k, torch.float32, (2, 3)) * 0.5 for k in ranks]), "functions.all_gather value")
    # autograd all_reduce (PyTorch/XLA's convention: the local gradient, scaled)
    x = (_base(me, torch.float32, (2, 3)) + 1).to(dev).requires_grad_()
    y = xf.all_reduce(xm.REDUCE_SUM, x, scale=0.5)
    (y * (me + 1)).sum().backward()
    _eq(y.detach(), sum(_base(k, torch.float32, (2, 3)) + 1 for k in ranks) * 0.5, "functions.all_reduce value")
    _eq(x.grad, torch.full((2, 3), 0.5 * (me + 1)), "functions.all_reduce grad")
    x = (_base(me, torch.float32, (2, 3)) + 1).to(dev).requires_grad_()
    xf.all_reduce(xm.REDUCE_MAX, x).sum().backward()
    cpu_max = torch.stack([_base(k, torch.float32, (2, 3)) + 1 for k in ranks]).amax(0)
    _eq(x.grad, ((_base(me, torch.float32, (2, 3)) + 1) == cpu_max).float(), "functions.all_reduce max grad")
    x = (_base(me, torch.float32, (2, 3)) - 2).to(dev).requires_grad_()  # holds zeros
    xf.all_reduce(xm.REDUCE_MUL, x, scale=2.0).sum().backward()
    vals = [_base(k, torch.float32, (2, 3)) - 2 for k in ranks]
    others = torch.stack([v for k, v in zip(ranks, vals) if k != me]).prod(0)
    _eq(x.grad, 2.0 * others, "functions.all_reduce mul grad")

    # ---- bad groups ----
    for bad in ([[0, 1]] if n == 4 else [[0]], [[0, n]] + [[k] for k in range(1, n)], [ranks + [0]]):
        try:
            xm.all_reduce("sum", _base(me, torch.float32).to(dev), groups=bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"groups {bad} did not raise ValueError")

    # ---- rendezvous / mesh_reduce ----
    got = xm.rendezvous("payloads", f"rank{me}".encode())
    assert got == [f"rank{k}".encode() for k in ranks], got
    assert xm.rendezvous("") == [b""] * n
    got = xm.rendezvous("payloads", bytes([me]) * 3)  # same tag again: a new generation
    assert got == [bytes([k]) * 3 for k in ranks], got
    if me in (0, 1):
        got = xm.rendezvous("pair", str(me).encode(), replicas=[1, 0])
        assert got == [b"1", b"0"], got
    red = xm.mesh_reduce("mesh", {"rank": me, "t": torch.full((2,), float(me), device=dev), "s": f"r{me}"},
                         lambda items: (sorted(i["rank"] for i in items), sum(i["t"] for i in items),
                                        "".join(i["s"] for i in items)))
    assert red[0] == ranks and red[2] == "".join(f"r{k}" for k in ranks), red
    assert red[1].device.type == "cpu" and torch.equal(red[1], torch.full((2,), float(sum(ranks)))), red
    import numpy as np
    acc = xm.mesh_reduce("acc", float(me), np.mean)
    assert abs(acc - sum(ranks) / n) < 1e-12, acc

    # ---- xm.save from every rank: one file, atomic, rank 0's data ----
    path = os.path.join(out_dir, "ckpt.pt")
    state = {"w": torch.full((3,), float(me), device=dev), "step": me, "nested": [torch.arange(2, device=dev) + me]}
    xm.save(state, path)
    # after save's rendezvous the file is complete on every rank
    loaded = torch.load(path)
    assert loaded["step"] == 0 and torch.equal(loaded["w"], torch.zeros(3)) and loaded["w"].device.type == "cpu"
    assert torch.equal(loaded["nested"][0], torch.arange(2))
    leftovers = [f for f in os.listdir(out_dir) if f != "ckpt.pt" and not f.startswith("ok")]
    assert not leftovers, leftovers
    xm.rendezvous("checked leftovers")
    xm.save({"r": me}, os.path.join(out_dir, f"own{me}.pt"), master_only=False)
    xm.rendezvous("saved own")
    assert torch.load(os.path.join(out_dir, f"own{(me + 1) % n}.pt"))["r"] == (me + 1) % n
    xm.rendezvous("read own")
    for k in ranks:
        if me == 0:
            os.unlink(os.path.join(out_dir, f"own{k}.pt"))
    xm.rendezvous("done")
    with open(os.path.join(out_dir, f"ok{me}"), "w") as f:
        f.write("ok")


# ------------------------------------------------------------------------------------------------
# Data parallel: 4 processes each a quarter of the batch == one process with the whole batch


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def _dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(320, 8, generator=g)
    y = torch.randint(0, 4, (320,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


EPOCHS, PER_RANK_BATCH, LR = 2, 8, 0.1


def reference_params(n):
    """One process, whole batches (the union of every rank's batch), eager CPU."""
    from torch.utils.data import DistributedSampler
    ds = _dataset()
    torch.manual_seed(1)
    model = _MLP()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for epoch in range(EPOCHS):
        per_rank = []
        for k in range(n):
            s = DistributedSampler(ds, num_replicas=n, rank=k, shuffle=True, seed=3)
            s.set_epoch(epoch)
            idx = list(s)
            per_rank.append([idx[i:i + PER_RANK_BATCH] for i in range(0, len(idx), PER_RANK_BATCH)])
        for step in range(len(per_rank[0])):
            idx = [i for k in range(n) for i in per_rank[k][step]]
            x, y = ds[idx]
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return model.state_dict(), losses


def train_dp(index, out_dir):
    """Data-parallel training with MpDeviceLoader over a DataLoader with a DistributedSampler."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.runtime as xr
    from torch.utils.data import DataLoader, DistributedSampler

    n, me = xr.world_size(), xr.global_ordinal()
    dev = torch_xla.device()
    ds = _dataset()
    sampler = DistributedSampler(ds, num_replicas=n, rank=me, shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=PER_RANK_BATCH, sampler=sampler)
    dl = pl.MpDeviceLoader(loader, dev)
    assert len(dl) == len(loader) == 320 // n // PER_RANK_BATCH
    assert dl._loader is loader and dl.dataset is ds and dl.batch_sampler is loader.batch_sampler
    torch.manual_seed(1)
    model = _MLP()
    torch.manual_seed(50 + me)  # different init per rank: broadcast_master_param aligns them
    for p in model.parameters():
        torch.nn.init.normal_(p) if me else None
    model = model.to(dev)
    xm.broadcast_master_param(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses, compiles = [], []
    steps = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        marks = met.counter_value("MarkStep") or 0
        for x, y in dl:
            assert x.device.type == "xla" and x.shape == (PER_RANK_BATCH, 8)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            xm.optimizer_step(opt)
            losses.append(loss.detach())
            steps += 1
            compiles.append(met.metric_data("CompileTime")[0] if met.metric_data("CompileTime") else 0)
        # one sync per batch plus one at the end of the epoch
        assert (met.counter_value("MarkStep") or 0) - marks == len(dl) + 1, (met.counter_value("MarkStep"), marks)
    # every rank's mean of its quarter, averaged == the whole batch's mean loss
    mean_losses = [xm.all_reduce("sum", l).item() / n for l in losses]
    # compiles flat after the first steps
    assert compiles[-1] == compiles[3], compiles
    if me == 0:
        ref_state, ref_losses = reference_params(n)
        torch.testing.assert_close(torch.tensor(mean_losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
        for (k, v), r in zip(model.state_dict().items(), ref_state.values()):
            torch.testing.assert_close(v.cpu(), r, rtol=1e-4, atol=1e-5, msg=lambda m: f"param {k}: {m}")
        with open(os.path.join(out_dir, "dp.txt"), "w") as f:
            f.write(f"steps={steps} compiles={compiles}\n")
    xm.rendezvous("dp done")


# ------------------------------------------------------------------------------------------------
# Faults


def raise_on_rank_1(index):
    import torch_xla.core.xla_model as xm
    if index == 1:
        time.sleep(2)  # the others are already waiting (and must not die of anything else meanwhile)
        raise ValueError("boom from rank 1")
    xm.rendezvous("never completes")  # the others wait here until the parent stops them
    time.sleep(600)


def timeouts_worker(index, out_dir):
    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla._internal.world import CollectiveTimeoutError
    dev = torch_xla.device()
    timeout = float(os.environ["TORCH_XLA_COLLECTIVE_TIMEOUT_S"])
    xm.all_reduce("sum", torch.ones(2, device=dev)).cpu()  # both ranks connect gloo
    if index == 0:
        msgs = []
        t0 = time.monotonic()
        try:
            xm.rendezvous("skipme")  # rank 1 never calls it
        except CollectiveTimeoutError as e:
            assert "skipme" in str(e) and "[1]" in str(e) and e.missing == [1], str(e)
            msgs.append(str(e))
        else:
            raise AssertionError("rendezvous without rank 1 did not time out")
        try:
            xm.all_reduce("sum", torch.ones(2, device=dev)).cpu()  # rank 1 is asleep
        except CollectiveTimeoutError as e:
            assert "all_reduce" in str(e) and "[1]" in str(e) and e.missing == [1], str(e)
            msgs.append(str(e))
        else:
            raise AssertionError("all_reduce without rank 1 did not time out")
        assert time.monotonic() - t0 < 4 * timeout + 5, time.monotonic() - t0
        os.environ["TORCH_XLA_COLLECTIVE_TIMEOUT_S"] = "60"
        xm.rendezvous("end")
        with open(os.path.join(out_dir, "timeout_msg.txt"), "w") as f:
            f.write("\n".join(msgs))
    else:
        time.sleep(2 * timeout + 2)
        os.environ["TORCH_XLA_COLLECTIVE_TIMEOUT_S"] = "60"
        xm.rendezvous("end")


def pair_timeout_worker(index, out_dir):
    """A rank that skips a large two-rank sum (the send/recv exchange): the other times out naming
    the collective and the absent rank, and its arrival was recorded by the watcher."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla._internal import collectives as C
    from torch_xla._internal.world import CollectiveTimeoutError
    dev = torch_xla.device()
    timeout = float(os.environ["TORCH_XLA_COLLECTIVE_TIMEOUT_S"])
    xm.all_reduce("sum", torch.ones(2, device=dev)).cpu()  # both ranks connect gloo
    C._PAIR_MIN_BYTES = 1 << 20
    if index == 0:
        t0 = time.monotonic()
        try:
            xm.all_reduce("sum", torch.ones(1 << 19, device=dev)).cpu()  # 2 MB: the pair exchange
        except CollectiveTimeoutError as e:
            assert "all_reduce#2" in str(e) and "rank(s) [1] did not arrive" in str(e) and e.missing == [1], str(e)
        else:
            raise AssertionError("pair all_reduce without rank 1 did not time out")
        assert time.monotonic() - t0 < 2 * timeout + 5, time.monotonic() - t0
        assert int(C.backend().group((0, 1)).store.get("arr/world/0")) == 2
        os.environ["TORCH_XLA_COLLECTIVE_TIMEOUT_S"] = "60"
        xm.rendezvous("end")
        with open(os.path.join(out_dir, "ok0"), "w") as f:
            f.write("ok")
    else:
        time.sleep(timeout + 2)
        os.environ["TORCH_XLA_COLLECTIVE_TIMEOUT_S"] = "60"
        xm.rendezvous("end")


def late_arrival_worker(index, out_dir):
    """Host all_reduce when a rank comes late: exact values, the input unchanged, the waiting rank
    recorded its arrival in the store (what the timeout diagnosis reads), and the device buffers
    were read in place (counter HostReadInPlace)."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    def _exact(t, ref, what):
        assert t.device.type == "xla", what
        c = t.cpu()
        assert c.dtype == ref.dtype and torch.equal(c, ref), f"{what}: {c} != {ref}"

    from torch_xla._internal import collectives
    dev = torch_xla.device()
    n = 1 << 20  # 4 MB of f32; integers, so the sum is exact in any order
    base = torch.arange(n, dtype=torch.float32) % 1000
    x = (base * (index + 1)).to(dev)
    torch_xla.sync(wait=True)
    xm.all_reduce("sum", x).cpu()  # both ranks connect gloo
    g = collectives.backend().group((0, 1))
    collectives._PAIR_MIN_BYTES = 1 << 20  # the 4 MB sum below takes the send/recv exchange
    reads = met.counter_value("HostReadInPlace") or 0
    if index == 1:
        time.sleep(0.5)
    r = xm.all_reduce("sum", x)
    _exact(r, base * 3, "late all_reduce")
    _exact(x, base * (index + 1), "input after a single-tensor all_reduce")
    assert (met.counter_value("HostReadInPlace") or 0) > reads
    if index == 0:
        assert int(g.store.get("arr/world/0")) == g.seq, "the waiting rank did not record its arrival"
    # list form, two dtypes, pending inputs: in place, exact
    a, b = x * 2, (torch.arange(10) + index).to(dev)
    out = xm.all_reduce("sum", [a, b])
    assert out[0] is a and out[1] is b
    _exact(a, base * 6, "list all_reduce f32")
    _exact(b, torch.arange(10) * 2 + 1, "list all_reduce i64")
    _exact(x, base * (index + 1), "input of the list form's producer")
    xm.rendezvous("end")
    with open(os.path.join(out_dir, f"ok{index}"), "w") as f:
        f.write("ok")


def pair_sum_worker(index, out_dir):
    """all_reduce sum over two ranks from the device buffer in place (collectives._pair_sum) against
    the staged gloo all-reduce and the CPU: bit-identical for random floats, exact for integers, odd
    sizes, bf16, scale, inputs that cannot be viewed (pending strided views: staged), one rank's
    input viewed and the other's staged, and every input (and the CPU tensor uploaded) unchanged."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla._internal import collectives as C
    dev = torch_xla.device()
    assert C._PAIR_SUM
    C._PAIR_MIN_BYTES = 1 << 20  # small tensors here (both ranks alike)
    g = torch.Generator().manual_seed(100 + index)
    peer_g = torch.Generator().manual_seed(100 + (1 - index))
    n = (1 << 19) + 3  # odd: the halves differ by one element
    mine_cpu = torch.randn(n, generator=g)
    peer_cpu = torch.randn(n, generator=peer_g)
    keep = mine_cpu.clone()
    x = mine_cpu.to(dev)
    torch_xla.sync(wait=True)
    pair = xm.all_reduce("sum", x)
    assert torch.equal(pair.cpu(), mine_cpu + peer_cpu), "pair sum != a + b"
    C._PAIR_SUM = False
    staged = xm.all_reduce("sum", x)
    C._PAIR_SUM = True
    assert torch.equal(pair.cpu(), staged.cpu()), "pair sum differs from gloo's all-reduce"
    C._PAIR_SEGMENT_BYTES = 200_000  # halves in pieces (added and sent back as they arrive)
    pieces = xm.all_reduce("sum", x)
    C._PAIR_SEGMENT_BYTES = 1 << 62
    assert torch.equal(pieces.cpu(), staged.cpu()), "pair sum in pieces differs"
    assert torch.equal(x.cpu(), keep) and torch.equal(mine_cpu, keep), "input changed"
    # scale, 2-d shape, bf16 (exact: small integers), int64
    y = ((torch.arange(1 << 19).reshape(512, 1024) % 50) + index).to(torch.bfloat16).to(dev)
    r = xm.all_reduce("sum", y, scale=0.5)
    ref = (((torch.arange(1 << 19).reshape(512, 1024) % 50) * 2 + 1).float() * 0.5).to(torch.bfloat16)
    assert r.dtype == torch.bfloat16 and r.shape == (512, 1024) and torch.equal(r.cpu(), ref), "bf16 scale"
    z = (torch.arange(1 << 18, dtype=torch.int64) * (index + 1) - 7).to(dev)
    assert torch.equal(xm.all_reduce("sum", z).cpu(), torch.arange(1 << 18, dtype=torch.int64) * 3 - 14), "int64"
    # a pending strided view (staged, not viewed) on rank 0, plain device data on rank 1
    big = torch.arange(2 * n, dtype=torch.float32).to(dev)
    v = big[::2] if index == 0 else torch.arange(0, 2 * n, 2, dtype=torch.float32).to(dev)
    assert torch.equal(xm.all_reduce("sum", v).cpu(), torch.arange(0, 2 * n, 2, dtype=torch.float32) * 2), "mixed"
    assert torch.equal(big.cpu(), torch.arange(2 * n, dtype=torch.float32)), "the view's base changed"
    # the list form of one tensor (in place, through the same exchange) and the same tensor twice
    w = x.clone()
    xm.all_reduce("sum", [w])
    assert torch.equal(w.cpu(), mine_cpu + peer_cpu) and torch.equal(x.cpu(), keep), "list form"
    a = xm.all_reduce("sum", x)
    b = xm.all_reduce("sum", x)
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(x.cpu(), keep), "repeat"
    xm.rendezvous("end")
    with open(os.path.join(out_dir, f"ok{index}"), "w") as f:
        f.write("ok")


def touch(index, out_dir):
    import torch_xla.runtime as xr
    with open(os.path.join(out_dir, f"touched{index}-of-{xr.world_size()}"), "w") as f:
        f.write("ok")


def orphan(index, out_dir):
    """Rank 1 kills the launcher while rank 0 waits in a collective: both must go away."""
    import signal
    import torch_xla
    import torch_xla.core.xla_model as xm
    with open(os.path.join(out_dir, f"pid{index}"), "w") as f:
        f.write(str(os.getpid()))
    xm.all_reduce("sum", torch.ones(1, device=torch_xla.device())).cpu()
    if index == 1:
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(600)
    xm.all_reduce("sum", torch.ones(1, device=torch_xla.device())).cpu()  # blocks: rank 1 never comes


def save_missing_rank(index, out_dir):
    import torch_xla
    import torch_xla.core.xla_model as xm
    if index == 0:
        xm.save({"a": torch.ones(2, device=torch_xla.device())}, os.path.join(out_dir, "m.pt"))


if __name__ == "__main__":
    # python tests/_mp_workers.py <worker> <out_dir> [start_method]
    import torch_xla.distributed.xla_multiprocessing as xmp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _mp_workers as w
    fn = getattr(w, sys.argv[1])
    a = (sys.argv[2],) if len(sys.argv) > 2 and sys.argv[2] != "-" else ()
    method = sys.argv[3] if len(sys.argv) > 3 else "spawn"
    if os.environ.get("TXLA_TEST_JOIN_FALSE") == "1":
        ctx = xmp.spawn(fn, args=a, join=False, start_method=method)
        assert len(ctx.processes) == int(os.environ["CPU_NUM_DEVICES"]), ctx.processes
        while not ctx.join():
            pass
    else:
        xmp.spawn(fn, args=a, start_method=method)
    print("SPAWN OK", flush=True)
