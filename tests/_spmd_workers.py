"""SPMD cases, run in fresh interpreters by tests/test_spmd.py (use_spmd() is process-global).

`python tests/_spmd_workers.py GROUP [ARG]` runs every case of GROUP in order (later cases rely on
SPMD mode being on) and prints one line `@@RESULTS@@{json}`: case name -> "ok" or the traceback.
Every result is compared with eager PyTorch on the CPU.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")

GROUPS = {"basic": [], "training": [], "pcache": []}


def case(group):
    def deco(fn):
        GROUPS[group].append(fn)
        return fn
    return deco


def _close(a, b, rtol=1e-5, atol=1e-6, what=""):
    import torch
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _counter(name):
    import torch_xla.debug.metrics as met
    return met.counter_value(name) or 0


def _raises(exc, fragment, fn):
    try:
        fn()
    except exc as e:
        assert fragment in str(e), f"{exc.__name__} without {fragment!r}: {e}"
        return
    raise AssertionError(f"expected {exc.__name__} ({fragment!r})")


# ------------------------------------------------------------------------------------- basic
@case("basic")
def use_spmd_replicates_existing_tensors():
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    from torch_xla import _XLAC
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    kept = base.to("xla:0") * 2  # pending when use_spmd() is called
    other = base.to("xla:1")
    assert not xr.is_spmd()
    _raises(NotImplementedError, "auto-sharding", lambda: xr.use_spmd(auto=True))
    _raises(RuntimeError, "xla:1", xr.use_spmd)
    assert not xr.is_spmd()
    del other
    gc.collect()
    xr.use_spmd()
    assert xr.is_spmd()
    assert torch_xla.device() == torch.device("xla", 0)
    assert torch_xla.device_count() == 1 and xr.addressable_device_count() == 1
    assert xr.global_runtime_device_count() == 4 and xr.addressable_runtime_device_count() == 4
    _raises(IndexError, "out of range", lambda: torch.ones(2, device="xla:1"))
    _close((kept + 1).cpu(), base * 2 + 1, what="moved tensor")
    assert _XLAC._get_xla_sharding_spec(kept) == ""
    shards = _XLAC._get_local_shards(kept)
    assert [d for _, _, d in shards] == [0, 1, 2, 3]
    for data, offsets, _ in shards:  # replicated: every device holds the whole tensor
        _close(data, base * 2, what="replica")
        assert offsets == [0, 0]
    xr.use_spmd()  # idempotent


def _mesh1d():
    import numpy as np
    import torch_xla.distributed.spmd as xs
    return xs.Mesh(np.arange(4), (4,), ("x",))


def _mesh2d():
    import numpy as np
    import torch_xla.distributed.spmd as xs
    return xs.Mesh(np.arange(4), (2, 2), ("data", "model"))


@case("basic")
def sharding_strings_1d_mesh():
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    mesh = _mesh1d()
    cpu = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    for spec, text, shard in [((0, None), "{devices=[4,1]0,1,2,3}", (2, 4)),
                              (("x", None), "{devices=[4,1]0,1,2,3}", (2, 4)),
                              ((None, 0), "{devices=[1,4]0,1,2,3}", (8, 1)),
                              (((0,), None), "{devices=[4,1]0,1,2,3}", (2, 4)),
                              ((None, None), "{replicated}", (8, 4))]:
        t = cpu.to(torch_xla.device())
        st = xs.mark_sharding(t, mesh, spec)
        assert isinstance(st, xs.XLAShardedTensor) and st.global_tensor is t
        assert _XLAC._get_xla_sharding_spec(t) == text, (spec, _XLAC._get_xla_sharding_spec(t))
        assert st.sharding_spec == text
        shards = st.local_shards
        assert len(shards) == 4
        for sh in shards:
            assert tuple(sh.data.shape) == shard, (spec, sh.data.shape)
            _close(sh.data, cpu[sh.indices] if sh.indices is not ... else cpu, what=f"shard {spec}")
        _close(t.cpu(), cpu, what=f"assembled {spec}")
        _close((st + 1).global_tensor.cpu() if isinstance(st + 1, xs.XLAShardedTensor) else (st + 1).cpu(), cpu + 1,
               what="XLAShardedTensor op")
    assert xs.mark_sharding(cpu.to(torch_xla.device()), mesh, (0, None)).sharding_type == xs.ShardingType.TILED
    assert xs.mark_sharding(cpu.to(torch_xla.device()), mesh, (None, None)).sharding_type == xs.ShardingType.REPLICATED
    v = torch.arange(8.0).to(torch_xla.device())
    assert _XLAC._get_xla_sharding_spec(xs.mark_sharding(v, mesh, (0,)).global_tensor) == "{devices=[4]0,1,2,3}"
    # a custom device order: device 3 holds the first rows
    rev = xs.Mesh([3, 2, 1, 0], (4,))
    t = cpu.to(torch_xla.device())
    st = xs.mark_sharding(t, rev, (0, None))
    assert st.sharding_spec == "{devices=[4,1]3,2,1,0}"
    by_device = {sh.device: sh for sh in st.local_shards}
    _close(by_device[3].data, cpu[0:2], what="device 3's shard")
    _close(by_device[0].data, cpu[6:8], what="device 0's shard")
    _close(t.cpu(), cpu, what="assembled custom order")


@case("basic")
def sharding_strings_2d_mesh_and_partial_replication():
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    mesh = _mesh2d()
    cpu = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    table = [((0, 1), "{devices=[2,2]0,1,2,3}", (4, 4), xs.ShardingType.TILED),
             (("data", "model"), "{devices=[2,2]0,1,2,3}", (4, 4), xs.ShardingType.TILED),
             ((1, 0), "{devices=[2,2]0,2,1,3}", (4, 4), xs.ShardingType.TILED),
             ((("data", "model"), None), "{devices=[4,1]0,1,2,3}", (2, 8), xs.ShardingType.TILED),
             ((("model", "data"), None), "{devices=[4,1]0,2,1,3}", (2, 8), xs.ShardingType.TILED),
             ((0, None), "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", (4, 8), xs.ShardingType.PARTIAL),
             ((None, "model"), "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}", (8, 4), xs.ShardingType.PARTIAL),
             ((None, None), "{replicated}", (8, 8), xs.ShardingType.REPLICATED)]
    for spec, text, shard, kind in table:
        t = cpu.to(torch_xla.device())
        st = xs.mark_sharding(t, mesh, spec)
        assert st.sharding_spec == text, (spec, st.sharding_spec)
        assert st.sharding_type == kind, (spec, st.sharding_type)
        shards = st.local_shards
        for sh in shards:
            assert tuple(sh.data.shape) == shard
            _close(sh.data, cpu[sh.indices] if sh.indices is not ... else cpu, what=f"shard {spec}")
        if kind == xs.ShardingType.PARTIAL:  # two copies of each shard
            assert sorted(sh.replica_id for sh in shards) == [0, 0, 1, 1]
        _close(t.cpu(), cpu, what=f"assembled {spec}")
    # model-parallel matmul over the 2-D mesh equals eager
    w = torch.randn(8, 6)
    xt, wt = cpu.to(torch_xla.device()), w.to(torch_xla.device())
    xs.mark_sharding(xt, mesh, ("data", None))
    xs.mark_sharding(wt, mesh, (None, "model"))
    _close((xt @ wt).cpu(), cpu @ w, rtol=1e-5, atol=1e-4, what="sharded matmul")


@case("basic")
def intermediate_annotation():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    mesh = _mesh1d()
    a, w = torch.randn(8, 16), torch.randn(16, 8)
    x = a.to(torch_xla.device())
    xs.mark_sharding(x, mesh, (0, None))
    y = torch.relu(x @ w.to(torch_xla.device()))
    st = xs.mark_sharding(y, mesh, (None, 0))  # pending: an annotation inside the graph
    assert _XLAC._get_xla_sharding_spec(y) == "{devices=[1,4]0,1,2,3}"
    text = xm.get_stablehlo([y])
    # MLIR's pretty form (jaxlib's printer) or our generic text when jax is missing
    assert ('stablehlo.custom_call @Sharding' in text
            or ('"stablehlo.custom_call"' in text and 'call_target_name = "Sharding"' in text)), text
    assert 'mhlo.sharding = "{devices=[1,4]0,1,2,3}"' in text
    assert 'mhlo.sharding = "{devices=[4,1]0,1,2,3}"' in text  # the sharded argument
    z = y * 2
    torch_xla.sync()
    assert _XLAC._get_xla_sharding_spec(y) == "{devices=[1,4]0,1,2,3}"  # kept by the result
    assert [tuple(s.data.shape) for s in st.local_shards] == [(8, 2)] * 4
    _close(y.cpu(), torch.relu(a @ w), atol=1e-5, what="annotated intermediate")
    _close(z.cpu(), 2 * torch.relu(a @ w), atol=1e-5, what="its user")


@case("basic")
def clear_sharding_and_reannotation():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    mesh = _mesh1d()
    cpu = torch.randn(8, 8)
    t = cpu.to(torch_xla.device())
    xs.mark_sharding(t, mesh, (0, None))
    back = xs.clear_sharding(t)
    assert back is t and _XLAC._get_xla_sharding_spec(t) == ""
    assert all(tuple(d.shape) == (8, 8) for d, _, _ in _XLAC._get_local_shards(t))
    _close(t.cpu(), cpu, what="cleared")
    st = xs.mark_sharding(t, mesh, (0, None))
    assert xs.clear_sharding(st) is t  # an XLAShardedTensor unwraps
    p = t + 1  # pending annotation, then cleared
    xs.mark_sharding(p, mesh, (0, None))
    xs.clear_sharding(p)
    assert "Sharding" not in xm.get_stablehlo([p]) and _XLAC._get_xla_sharding_spec(p) == ""
    _close(p.cpu(), cpu + 1, what="cleared pending")
    # in-place re-annotation: a new sharding is a new graph (one compile), the same one is cached
    import torch_xla.debug.metrics as met

    def step():
        out = (t * 3).sum(0)
        torch_xla.sync()
        return out
    xs.mark_sharding(t, mesh, (0, None))
    step()
    c0 = _counter("UncachedCompile")
    _close(step().cpu(), (cpu * 3).sum(0), atol=1e-5, what="rows sharded")
    assert _counter("UncachedCompile") == c0
    xs.mark_sharding(t, mesh, (None, 0))
    assert _XLAC._get_xla_sharding_spec(t) == "{devices=[1,4]0,1,2,3}"
    _close(step().cpu(), (cpu * 3).sum(0), atol=1e-5, what="columns sharded")
    assert _counter("UncachedCompile") == c0 + 1
    step()
    assert _counter("UncachedCompile") == c0 + 1
    del met


@case("basic")
def errors_name_the_problem():
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    mesh = _mesh2d()
    t = torch.zeros(8, 8).to(torch_xla.device())
    _raises(ValueError, "rank 2", lambda: xs.mark_sharding(t, mesh, (0,)))
    _raises(ValueError, "rank 2", lambda: xs.mark_sharding(t, mesh, (0, 1, None)))
    _raises(ValueError, "unknown mesh axis name 'tensor'", lambda: xs.mark_sharding(t, mesh, ("tensor", None)))
    _raises(ValueError, "out of range", lambda: xs.mark_sharding(t, mesh, (2, None)))
    _raises(ValueError, "used twice", lambda: xs.mark_sharding(t, mesh, (0, 0)))
    _raises(ValueError, "used twice", lambda: xs.mark_sharding(t, mesh, ("data", ("model", "data"))))
    _raises(ValueError, "does not divide", lambda: xs.mark_sharding(torch.zeros(6, 8).to(torch_xla.device()),
                                                                  _mesh1d(), (0, None)))
    _raises(ValueError, "outside this process", lambda: xs.mark_sharding(t, xs.Mesh([0, 1, 2, 7], (4,)), (0, None)))
    _raises(ValueError, "all 4 devices", lambda: xs.mark_sharding(t, xs.Mesh([0, 1], (2,)), (0, None)))
    _raises(ValueError, "XLA tensor", lambda: xs.mark_sharding(torch.zeros(8, 8), mesh, (0, None)))
    _raises(ValueError, "unique", lambda: xs.Mesh([0, 0, 1, 2], (4,)))
    _raises(ValueError, "do not fill", lambda: xs.Mesh(np.arange(4), (2, 3)))
    _raises(ValueError, "unique", lambda: xs.Mesh(np.arange(4), (2, 2), ("x", "x")))
    # the tensor is unchanged by a refused annotation
    from torch_xla import _XLAC
    assert _XLAC._get_xla_sharding_spec(t) == ""
    _raises(ValueError, "does not divide", lambda: _XLAC._xla_mark_sharding_text(
        torch.zeros(8, 6).to(torch_xla.device()), "{devices=[1,4]0,1,2,3}"))
    _raises(ValueError, "all 4 devices", lambda: _XLAC._xla_mark_sharding_text(t, "{devices=[2,1]0,1}"))


@case("basic")
def meshes():
    import numpy as np
    import torch_xla.distributed.spmd as xs
    m = xs.get_1d_mesh("data")
    assert m.mesh_shape == (4,) and m.axis_names == ("data",) and m.size() == 4
    h = xs.HybridMesh(ici_mesh_shape=(2, 2), axis_names=("data", "model"))
    assert list(h.shape().items()) == [("data", 2), ("model", 2)] and h.dcn_mesh_shape == (1, 1)
    assert h.get_logical_mesh().tolist() == [[0, 1], [2, 3]] and h.get_axis_name_idx("model") == 1
    xs.set_global_mesh(h)
    assert xs.get_global_mesh() is h
    import torch
    import torch_xla
    t = torch.randn(4, 4).to(torch_xla.device())
    assert xs.mark_sharding(t, xs.get_global_mesh(), ("model", "data")).sharding_spec == "{devices=[2,2]0,2,1,3}"
    del np


@case("basic")
def stablehlo_and_cache():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    mesh = _mesh1d()
    w_cpu = torch.randn(16, 4)
    w = w_cpu.to(torch_xla.device())
    xs.mark_sharding(w, mesh, (0, None))

    def step(x_cpu):
        x = x_cpu.to(torch_xla.device())
        xs.mark_sharding(x, mesh, (None, 0))
        out = x @ w
        return out

    out = step(torch.randn(2, 16))
    text = xm.get_stablehlo([out])
    assert "mhlo.num_partitions = 4" in text and "mhlo.num_replicas = 1" in text
    assert text.count('mhlo.sharding = "{devices=[4,1]0,1,2,3}"') == 1
    assert text.count('mhlo.sharding = "{devices=[1,4]0,1,2,3}"') == 1
    torch_xla.sync()
    before = _counter("UncachedCompile")
    cached = _counter("CachedCompile")
    x2 = torch.randn(2, 16)
    out2 = step(x2)
    torch_xla.sync()
    assert _counter("UncachedCompile") == before, "a cached second step compiled"
    assert _counter("CachedCompile") > cached
    assert _counter("ExecuteReplicated") > 0
    _close(out2.cpu(), x2 @ w_cpu, atol=1e-5, what="second step")


@case("basic")
def eager_mode_and_compile():
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    mesh = _mesh1d()
    cpu = torch.randn(8, 4)
    torch_xla.experimental.eager_mode(True)
    try:
        t = cpu.to(torch_xla.device())
        xs.mark_sharding(t, mesh, (0, None))
        y = torch.tanh(t) * 2
        assert _XLAC._get_xla_sharding_spec(y) == "{devices=[4,1]0,1,2,3}"  # ran at once, kept sharded
        _close(y.cpu(), torch.tanh(cpu) * 2, what="eager mode")
    finally:
        torch_xla.experimental.eager_mode(False)

    @torch_xla.compile(full_graph=True)
    def f(a):
        return (a.exp() + 1).sum(1)

    t = cpu.to(torch_xla.device())
    xs.mark_sharding(t, mesh, (0, None))
    _close(f(t).cpu(), (cpu.exp() + 1).sum(1), atol=1e-5, what="torch_xla.compile")


@case("basic")
def loader_input_sharding():
    import torch
    import torch_xla
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    mesh = _mesh1d()
    data = [(torch.randn(8, 3), torch.arange(8)) for _ in range(3)]
    loader = pl.MpDeviceLoader(data, torch_xla.device(), input_sharding=xs.ShardingSpec(mesh, (0, None)))
    seen = 0
    for (x, y), (cx, cy) in zip(loader, data):
        assert _XLAC._get_xla_sharding_spec(x) == "{devices=[4,1]0,1,2,3}"
        assert _XLAC._get_xla_sharding_spec(y) == ""  # rank 1: the spec does not fit, replicated
        assert [tuple(d.shape) for d, _, _ in _XLAC._get_local_shards(x)] == [(2, 3)] * 4
        _close(x.cpu(), cx, what="loader batch")
        assert torch.equal(y.cpu(), cy)
        seen += 1
    assert seen == 3
    import torch_xla.core.xla_model as xm
    cx = torch.randn(8, 5)
    (moved,) = xm.send_cpu_data_to_device([cx], torch_xla.device(), input_sharding=xs.ShardingSpec(mesh, (0, None)))
    assert _XLAC._get_xla_sharding_spec(moved) == "{devices=[4,1]0,1,2,3}"
    _close(moved.cpu(), cx, what="send_cpu_data_to_device")


@case("basic")
def state_dict_round_trip_and_optimizer_step():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    mesh = _mesh2d()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ref.load_state_dict(model.state_dict())
    model.to(torch_xla.device())
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    loss = torch.nn.functional.mse_loss(model(x.to(torch_xla.device())), y.to(torch_xla.device()))
    loss.backward()
    xm.optimizer_step(opt)
    torch_xla.sync()
    rl = torch.nn.functional.mse_loss(ref(x), y)
    rl.backward()
    ropt.step()
    sd = {k: v.cpu() for k, v in model.state_dict().items()}
    for k, v in ref.state_dict().items():
        _close(sd[k], v, atol=1e-6, what=f"state_dict {k}")
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    fresh.load_state_dict(sd)
    for k, v in fresh.state_dict().items():
        _close(v, ref.state_dict()[k], what=f"loaded {k}")
    # loading back into the sharded model keeps working
    model.load_state_dict(fresh.state_dict())
    torch_xla.sync()
    _close(model(x.to(torch_xla.device())).cpu(), fresh(x), atol=1e-5, what="reloaded model")


@case("basic")
def sharded_parameter_memory_per_device():
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    mesh = _mesh1d()
    w = torch.randn(256, 64).to(torch_xla.device())
    full = 256 * 64 * 4
    assert _XLAC._xla_get_spmd_device_bytes(w) == [full] * 4  # replicated
    xs.mark_sharding(w, mesh, (0, None))
    assert _XLAC._xla_get_spmd_device_bytes(w) == [full // 4] * 4
    w2 = w * 2  # an output keeps the sharding XLA chose, no gathering
    torch_xla.sync()
    assert _XLAC._get_xla_sharding_spec(w2) == "{devices=[4,1]0,1,2,3}"
    assert _XLAC._xla_get_spmd_device_bytes(w2) == [full // 4] * 4


# ---------------------------------------------------------------------------------- training
def _train(model, make_opt, batches, device, shard=None, input_spec=None, mesh=None):
    """Trains `model` on `batches`; returns (losses, model, compiles after each step)."""
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    model.to(device)
    if shard is not None:
        shard(model)
    opt = make_opt(model.parameters())
    losses, compiles = [], []
    for x, y, loss_fn in batches:
        x, y = x.to(device), y.to(device)
        if input_spec is not None:
            xs.mark_sharding(x, mesh, input_spec)
        loss = loss_fn(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device != "cpu":
            torch_xla.sync()
            compiles.append(_counter("UncachedCompile"))
        losses.append(loss.detach())
    return [float(l.cpu()) for l in losses], model, compiles


def _compare(cpu_model, xla_model, cpu_losses, xla_losses, compiles, rtol, atol):
    import torch
    _close(torch.tensor(xla_losses), torch.tensor(cpu_losses), rtol=rtol, atol=atol, what="losses")
    ref = dict(cpu_model.named_parameters())
    for name, p in xla_model.named_parameters():
        _close(p.detach().cpu(), ref[name].detach(), rtol=rtol, atol=atol, what=f"parameter {name}")
    assert compiles[3] == compiles[-1], f"compiles grew after step 3: {compiles}"


def _mlp_setup(steps=20):
    import torch
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g),
                lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y)) for _ in range(steps)]

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))
    return make, batches


@case("training")
def data_parallel_mlp_matches_one_device():
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    xr.use_spmd()
    make, batches = _mlp_setup()
    opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    cpu_losses, cpu_model, _ = _train(make(), opt, batches, "cpu")
    mesh = xs.Mesh(np.arange(4), (4,), ("data",))
    xla_losses, xla_model, compiles = _train(make(), opt, batches, torch_xla.device(), input_spec=("data", None),
                                             mesh=mesh)
    _compare(cpu_model, xla_model, cpu_losses, xla_losses, compiles, rtol=1e-5, atol=1e-5)
    # the parameters stayed replicated (XLA all-reduced the gradients)
    for p in xla_model.parameters():
        assert _XLAC._get_xla_sharding_spec(p) in ("", "{replicated}"), _XLAC._get_xla_sharding_spec(p)


@case("training")
def tensor_parallel_mlp_matches_one_device():
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    make, batches = _mlp_setup()
    opt = lambda p: torch.optim.Adam(p, lr=1e-2)  # noqa: E731
    cpu_losses, cpu_model, _ = _train(make(), opt, batches, "cpu")
    mesh = xs.Mesh(np.arange(4), (2, 2), ("data", "model"))

    def shard(m):
        xs.mark_sharding(m[0].weight, mesh, ("model", None))
        xs.mark_sharding(m[0].bias, mesh, ("model",))
        xs.mark_sharding(m[2].weight, mesh, (None, "model"))
    xla_losses, xla_model, compiles = _train(make(), opt, batches, torch_xla.device(), shard=shard,
                                             input_spec=("data", None), mesh=mesh)
    _compare(cpu_model, xla_model, cpu_losses, xla_losses, compiles, rtol=1e-5, atol=1e-5)
    w = xla_model[0].weight
    assert _XLAC._get_xla_sharding_spec(w) == "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
    shards = xs.wrap_as_sharded_tensor(w).local_shards
    assert [tuple(s.data.shape) for s in shards] == [(16, 12)] * 4  # each device: half the rows
    assert _XLAC._xla_get_spmd_device_bytes(w) == [16 * 12 * 4] * 4


@case("training")
def fsdp_style_gpt_matches_one_device():
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    sys.path.insert(0, EXAMPLES)
    import gpt
    _, vocab, data = gpt.load_corpus()
    block, batch = 32, 8

    def make():
        torch.manual_seed(0)
        return gpt.make_model(len(vocab), block_size=block, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
    g = torch.Generator().manual_seed(7)
    lm = lambda m, x, y: m(x, y)[1]  # noqa: E731
    batches = [(*gpt.get_batch(data, batch, block, g), lm) for _ in range(20)]
    opt = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    cpu_losses, cpu_model, _ = _train(make(), opt, batches, "cpu")
    mesh = xs.Mesh(np.arange(4), (4,), ("fsdp",))
    specs = {}

    def shard(m):  # every parameter on its first dimension (the first that divides by 4)
        for name, p in m.named_parameters():
            dim = next((d for d, s in enumerate(p.shape) if s % 4 == 0), None)
            spec = tuple("fsdp" if d == dim else None for d in range(p.dim()))
            xs.mark_sharding(p, mesh, spec)
            specs[name] = (dim, spec)
    xla_losses, xla_model, compiles = _train(make(), opt, batches, torch_xla.device(), shard=shard,
                                             input_spec=("fsdp", None), mesh=mesh)
    _compare(cpu_model, xla_model, cpu_losses, xla_losses, compiles, rtol=1e-4, atol=1e-5)
    sharded = 0
    for name, p in xla_model.named_parameters():
        dim, _ = specs[name]
        if dim is None:
            continue
        sharded += 1
        full = p.numel() * p.element_size()
        assert _XLAC._xla_get_spmd_device_bytes(p) == [full // 4] * 4, (name, _XLAC._get_xla_sharding_spec(p))
    assert sharded == len(specs), specs  # every parameter had a dimension dividing by 4


# ----------------------------------------------------------------------------- persistent cache
@case("pcache")
def persistent_cache_keeps_shardings():
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    import torch_xla.distributed.spmd as xs
    from torch_xla import _XLAC
    xr.initialize_cache(sys.argv[2])
    xr.use_spmd()
    mesh = xs.Mesh(np.arange(4), (4,), ("x",))
    cpu = torch.randn(8, 8)
    t = cpu.to(torch_xla.device())
    xs.mark_sharding(t, mesh, (0, None))
    y = t @ t.T + 1
    torch_xla.sync()
    assert _XLAC._get_xla_sharding_spec(y) == "{devices=[4,1]0,1,2,3}", _XLAC._get_xla_sharding_spec(y)
    _close(y.cpu(), cpu @ cpu.T + 1, atol=1e-5, what="cached program")
    print(f"@@COUNTERS@@{_counter('PersistentCacheHit')},{_counter('PersistentCacheMiss')},{_counter('UncachedCompile')}")


def main():
    group = sys.argv[1]
    results = {}
    for fn in GROUPS[group]:
        try:
            fn()
            results[fn.__name__] = "ok"
        except BaseException:  # noqa: B902 - every failure is reported per case
            results[fn.__name__] = traceback.format_exc()
    print("@@RESULTS@@" + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
