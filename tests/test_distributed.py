"""Multi-process data parallel (issue #9): xmp.spawn, topology, collectives, rendezvous, checkpoints,
MpDeviceLoader, faults, torchrun; plus the single-process (world size 1) semantics.

The multi-process tests run tests/_mp_workers.py in a fresh interpreter (the launcher must not have
started the XLA runtime for start_method='fork'), with few processes and tiny models: the machine
has 2 cores. Each spawn checks many things at once; a failing check raises in a child, and spawn()
raises in the parent with that rank's traceback, which the test shows.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
import numpy as np
import torch

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKERS = os.path.join(HERE, "_mp_workers.py")


def _procs_with_marker(marker):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _launch(args, nprocs, tmp_path, extra_env=None, timeout=240):
    """Runs `args` in a fresh interpreter with CPU_NUM_DEVICES=nprocs; checks no process of it
    (children included) outlives it. Returns (CompletedProcess, seconds)."""
    marker = f"TXLA_TEST_MARKER={uuid.uuid4().hex}"
    env = dict(os.environ, CPU_NUM_DEVICES=str(nprocs), TXLA_TEST_MARKER=marker.split("=")[1])
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCH_XLA_SPAWNED"):
        env.pop(k, None)
    env.update(extra_env or {})
    t0 = time.monotonic()
    r = subprocess.run(args, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    deadline = time.monotonic() + 5
    while _procs_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _procs_with_marker(marker), "processes of the job outlived it"
    return r, took


def _spawn_worker(worker, nprocs, tmp_path, start_method, extra_env=None, out=True):
    args = [sys.executable, WORKERS, worker, str(tmp_path) if out else "-", start_method]
    return _launch(args, nprocs, tmp_path, extra_env)


def _ok(r):
    assert r.returncode == 0 and "SPAWN OK" in r.stdout, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-6000:]}"


# ---- multi-process -------------------------------------------------------------------------------


def test_collectives_2_processes_fork(tmp_path):
    r, _ = _spawn_worker("collectives_worker", 2, tmp_path, "fork")
    _ok(r)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ok0", "ok1"]


def test_collectives_4_processes_spawn(tmp_path):
    r, _ = _spawn_worker("collectives_worker", 4, tmp_path, "spawn")
    _ok(r)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ok0", "ok1", "ok2", "ok3"]


def test_data_parallel_4_processes_equals_whole_batch(tmp_path):
    """MLP, 2 epochs x 10 steps: 4 processes each a quarter of the batch (MpDeviceLoader over a
    DataLoader with DistributedSampler, xm.optimizer_step) == eager CPU on the whole batch, losses
    and weights within rtol 1e-4 / atol 1e-5; compiles flat after step 4."""
    r, _ = _spawn_worker("train_dp", 4, tmp_path, "fork")
    _ok(r)
    assert "steps=20" in (tmp_path / "dp.txt").read_text()


def test_rank_that_raises_stops_everyone(tmp_path):
    r, took = _spawn_worker("raise_on_rank_1", 2, tmp_path, "forkserver", out=False)
    assert r.returncode != 0
    assert "Process 1 terminated with the following error" in r.stderr, r.stderr[-3000:]
    assert "ValueError: boom from rank 1" in r.stderr
    assert took < 30, took


def test_missing_rank_times_out_naming_tag_and_rank(tmp_path):
    r, _ = _spawn_worker("timeouts_worker", 2, tmp_path, "fork", {"TORCH_XLA_COLLECTIVE_TIMEOUT_S": "1"})
    _ok(r)
    msg = (tmp_path / "timeout_msg.txt").read_text()
    assert "rendezvous 'skipme'" in msg and "all_reduce#2" in msg and "rank(s) [1] did not arrive" in msg, msg


def test_late_rank_all_reduce_records_arrival_and_reads_in_place(tmp_path):
    r, _ = _spawn_worker("late_arrival_worker", 2, tmp_path, "fork")
    _ok(r)
    assert sorted(os.listdir(tmp_path)) == ["ok0", "ok1"]


def test_pair_sum_reads_the_device_buffer_and_matches_gloo(tmp_path):
    r, _ = _spawn_worker("pair_sum_worker", 2, tmp_path, "fork")
    _ok(r)
    assert sorted(os.listdir(tmp_path)) == ["ok0", "ok1"]


def test_missing_rank_in_a_pair_sum_times_out_naming_it(tmp_path):
    r, _ = _spawn_worker("pair_timeout_worker", 2, tmp_path, "fork", {"TORCH_XLA_COLLECTIVE_TIMEOUT_S": "1"})
    _ok(r)
    assert os.listdir(tmp_path) == ["ok0"]


def test_save_with_a_rank_that_never_arrives_fails_cleanly(tmp_path):
    r, took = _spawn_worker("save_missing_rank", 2, tmp_path, "fork", {"TORCH_XLA_COLLECTIVE_TIMEOUT_S": "2"})
    assert r.returncode != 0
    assert "Process 0 terminated" in r.stderr and "'torch_xla.core.xla_model.save'" in r.stderr, r.stderr[-3000:]
    assert "rank(s) [1]" in r.stderr
    assert os.path.exists(tmp_path / "m.pt") and not [f for f in os.listdir(tmp_path) if ".tmp." in f]
    assert took < 30


def test_spawn_join_false_returns_the_process_context(tmp_path):
    r, _ = _spawn_worker("touch", 2, tmp_path, "fork", {"TXLA_TEST_JOIN_FALSE": "1"})
    _ok(r)
    assert sorted(os.listdir(tmp_path)) == ["touched0-of-2", "touched1-of-2"]


def test_children_exit_when_the_launcher_dies(tmp_path):
    r, took = _spawn_worker("orphan", 2, tmp_path, "fork")  # _launch checks no process outlives it
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])
    pids = [int((tmp_path / f"pid{k}").read_text()) for k in range(2)]
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids), "children outlived their launcher"


def test_torchrun_equals_spawn(tmp_path):
    script = os.path.join(ROOT, "examples", "train_dp.py")
    r1, _ = _launch([sys.executable, script, str(tmp_path / "spawn.pt"), "fork"], 2, tmp_path)
    assert r1.returncode == 0, r1.stderr[-3000:]
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    r2, _ = _launch([torchrun, "--nproc-per-node", "2", script, str(tmp_path / "torchrun.pt")], 2, tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    a, b = torch.load(tmp_path / "spawn.pt"), torch.load(tmp_path / "torchrun.pt")
    assert a["losses"] == b["losses"] and a["losses"][-1] < a["losses"][0]
    for k in a["state"]:
        assert torch.equal(a["state"][k], b["state"][k]), k


# ---- launcher checks in this process ------------------------------------------------------------


def _record(index, out):
    out.append(index)


def test_spawn_nprocs_1_runs_in_process():
    out = []
    assert xmp.spawn(_record, args=(out,), nprocs=1) is None
    assert out == [0]


def test_spawn_rejects_bad_arguments():
    torch_xla.device()  # this process's runtime is started
    n = torch_xla.device_count()
    with pytest.raises(ValueError, match="nprocs=3"):
        xmp.spawn(_record, args=([],), nprocs=3 if n != 3 else 2)
    with pytest.raises(ValueError, match="start_method"):
        xmp.spawn(_record, args=([],), start_method="thread")
    if n > 1:  # with one device (the default) spawn runs fn in this process: nothing is forked
        with pytest.raises(RuntimeError, match="fork"):
            xmp.spawn(_record, args=([],), start_method="fork")


# ---- world size 1: identity semantics, lazily ----------------------------------------------------


def test_single_process_collectives_are_identities():
    d = torch_xla.device()
    x = torch.arange(6.0).reshape(2, 3).to(d)
    assert xr.world_size() == 1 and xr.global_ordinal() == 0 and xm.is_master_ordinal()
    torch.testing.assert_close(xm.all_reduce("sum", x, scale=2.0).cpu(), torch.arange(6.0).reshape(2, 3) * 2)
    xs = [x.clone(), torch.ones(2, dtype=torch.int64, device=d)]
    assert xm.all_reduce("max", xs) is xs
    torch.testing.assert_close(xm.all_gather(x, dim=1).cpu(), x.cpu())
    out = torch.zeros(2, 3, device=d)
    assert xm.all_gather(x, output=out) is out and torch.equal(out.cpu(), x.cpu())
    torch.testing.assert_close(xm.reduce_scatter("sum", x, 0.5, 0, 1).cpu(), x.cpu() * 0.5)
    torch.testing.assert_close(xm.all_to_all(x, 1, 0, 1).cpu(), x.cpu())
    ts = [x.clone()]
    xm.collective_broadcast(ts)
    torch.testing.assert_close(ts[0].cpu(), x.cpu())
    assert xm.rendezvous("") == [b""] and xm.rendezvous("t", b"abc") == [b"abc"]
    assert xm.mesh_reduce("m", 5, lambda v: v) == [5]
    import torch_xla.core.functions as xf
    y = x.clone().requires_grad_()
    xf.all_gather(y).sum().backward()
    torch.testing.assert_close(y.grad.cpu(), torch.ones(2, 3))
    y = x.clone().requires_grad_()
    r = xf.all_reduce(xm.REDUCE_MUL, y, scale=2.0)
    (r * 3).sum().backward()
    torch.testing.assert_close(r.detach().cpu(), x.cpu() * 2)
    torch.testing.assert_close(y.grad.cpu(), torch.full((2, 3), 6.0))
    for bad in ([[0, 1]], [[1]], [[0], [0]], [[]]):
        with pytest.raises(ValueError):
            xm.all_reduce("sum", x, groups=bad)
    with pytest.raises(ValueError, match="integer or bool"):
        xm.all_reduce("and", x)
    with pytest.raises(ValueError, match="shard_count"):
        xm.reduce_scatter("sum", x, 1.0, 0, 2)
    # nothing above read a value back mid-graph: still one pending graph away
    model = torch.nn.Linear(3, 2).to(d)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).sum().backward()
    def executions():
        return (met.metric_data("ExecuteTime") or (0,))[0]
    before = executions()
    xm.optimizer_step(opt)
    assert executions() == before
    torch_xla.sync()
    assert executions() == before + 1


def test_in_graph_all_reduce_stablehlo_and_single_replica_run(monkeypatch):
    """The in-graph backend lowers all_reduce to stablehlo.all_reduce with replica_groups; one
    replica compiles and runs it (sum over one replica = the input, scaled)."""
    from torch_xla._internal import collectives
    monkeypatch.setenv("TORCH_XLA_COLLECTIVE_BACKEND", "ingraph")
    monkeypatch.setattr(collectives, "_backend", None)
    b = collectives.backend()
    assert isinstance(b, collectives.InGraphBackend)
    d = torch_xla.device()
    x = torch.arange(6.0, device=d).view(2, 3)
    i = torch.tensor([3, 5], device=d)
    (rx, ri) = b.all_reduce("sum", [x, i], 0.5, (0,))
    (mx,) = b.all_reduce("max", [x], 1.0, (0,))
    text = xm.get_stablehlo([rx, ri, mx])
    assert text.count('stablehlo.all_reduce') == 3, text
    # the MLIR printer folds the splat group: dense<0> : tensor<1x1xi64> (generic text: dense<[[0]]>)
    assert "replica_groups = dense<0> : tensor<1x1xi64>" in text
    assert "replica_groups = dense<[[0]]> : tensor<1x1xi64>" in torch_xla._XLAC._get_xla_tensors_hlo([rx])
    torch.testing.assert_close(rx.cpu(), torch.arange(6.0).view(2, 3) * 0.5)
    torch.testing.assert_close(ri.cpu(), torch.tensor([1, 2]))  # int scale truncates, as the host path
    torch.testing.assert_close(mx.cpu(), torch.arange(6.0).view(2, 3))
    with pytest.raises(ValueError):
        b.all_reduce("and", [x], 1.0, (0,))
    monkeypatch.setenv("TORCH_XLA_COLLECTIVE_BACKEND", "host")
    monkeypatch.setattr(collectives, "_backend", None)
    assert isinstance(collectives.backend(), collectives.HostGlooBackend)


def _reduce_np(kind, arrays):
    fn = {"sum": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
          "and": np.bitwise_and, "or": np.bitwise_or}[kind]
    out = arrays[0]
    for a in arrays[1:]:
        out = fn(out, a)
    return out


@pytest.mark.parametrize("partition", [((0, 1, 2, 3),), ((0, 1), (2, 3)), ((3, 1), (0, 2))])
def test_in_graph_collectives_run_on_four_replicas(partition):
    """Every in-graph collective, traced as one process would trace it, then compiled for 4 replicas
    and run on XLA:CPU's in-process collectives (one replica per device, each with its own input):
    each replica's results equal a reference computed with numpy from all replicas' inputs."""
    from torch_xla import _core
    from torch_xla._internal import collectives, plugins, world
    client = _core.runtime.Client.create(plugins.plugin_for("CPU")[0], cpu_device_count=4)
    b = collectives.InGraphBackend()
    d = torch_xla.device()
    f = torch.zeros(4, 8, device=d)
    i = torch.zeros(4, 8, dtype=torch.int32, device=d)
    torch_xla.sync()
    groups = {r: world.Group(g, partition) for g in partition for r in g}
    root_pos = 1
    cases = []  # (name, output tensor, reference(rank, f_inputs, i_inputs))
    G = groups[0]  # replica groups don't depend on the rank: every rank traces the same graph
    n = len(G)

    def grp(r):
        return groups[r]

    def chunk(a, axis, pos):
        return np.split(a, n, axis=axis)[pos]

    for kind in ("sum", "mul", "max", "min"):
        (out,) = b.all_reduce(kind, [f], 0.5 if kind == "sum" else 1.0, G)
        cases.append((f"all_reduce {kind}", out, lambda r, F, I, kind=kind: _reduce_np(
            kind, [F[m] for m in grp(r)]) * (0.5 if kind == "sum" else 1.0)))
    for kind in ("and", "or", "sum"):
        (out,) = b.all_reduce(kind, [i], 1.0, G)
        cases.append((f"all_reduce {kind} i32", out, lambda r, F, I, kind=kind: _reduce_np(kind, [I[m] for m in grp(r)])))
    (out,) = b.all_reduce("sum", [i], 0.5, G)  # integer scale truncates, as the host path
    cases.append(("all_reduce sum i32 scaled", out,
                  lambda r, F, I: (_reduce_np("sum", [I[m] for m in grp(r)]).astype(np.float64) * 0.5).astype(np.int32)))
    for dim in (0, 1, -1):
        (out,) = b.all_gather([f], dim, G)
        cases.append((f"all_gather {dim}", out, lambda r, F, I, dim=dim: np.concatenate([F[m] for m in grp(r)], axis=dim)))
    (out,) = b.all_gather([i[0, 0]], 0, G)  # 0-dim gathers into 1-dim
    cases.append(("all_gather 0-dim", out, lambda r, F, I: np.stack([I[m][0, 0] for m in grp(r)])))
    for kind, dim in (("sum", 0), ("max", 1), ("mul", 0)):
        (out,) = b.reduce_scatter(kind, [f], 2.0 if kind == "sum" else 1.0, dim, G)
        cases.append((f"reduce_scatter {kind} {dim}", out, lambda r, F, I, kind=kind, dim=dim: chunk(
            _reduce_np(kind, [F[m] for m in grp(r)]) * (2.0 if kind == "sum" else 1.0), dim, grp(r).index(r))))
    for split, concat in ((0, 1), (1, 0), (0, 0)):
        out = b.all_to_all(f, split, concat, G)
        cases.append((f"all_to_all {split}->{concat}", out, lambda r, F, I, split=split, concat=concat: np.concatenate(
            [chunk(F[m], split, grp(r).index(r)) for m in grp(r)], axis=concat)))
    (bf, bi) = b.broadcast([f, i], G[root_pos], G)
    cases.append(("broadcast f32", bf, lambda r, F, I: F[grp(r)[root_pos]]))
    cases.append(("broadcast i32", bi, lambda r, F, I: I[grp(r)[root_pos]]))

    outs = [c[1] for c in cases]
    text = xm.get_stablehlo(outs)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert f'stablehlo.{op}' in text, op
    groups_attr = ", ".join("[" + ", ".join(map(str, g)) + "]" for g in partition)
    assert f"replica_groups = dense<[{groups_attr}]>" in text
    rng = np.random.RandomState(0)
    F = [rng.randn(4, 8).astype(np.float32) for _ in range(4)]
    F[1][0, 0] = -0.0
    I = [rng.randint(-50, 50, size=(4, 8)).astype(np.int32) for _ in range(4)]
    # the graph's parameters are f then i (or only one of them), in first-use order
    params = text.split("@main(")[1].split(")")[0]
    order = ["f" if "f32" in p else "i" for p in params.split(", ")]
    exe = client.compile(text, num_replicas=4, device_assignment=[[0], [1], [2], [3]])
    args = [[client.to_device(F[r] if o == "f" else I[r], r) for o in order] for r in range(4)]
    results = client.execute_replicated(exe, args, [0, 1, 2, 3])
    for r in range(4):
        for (name, t, ref), got in zip(cases, results[r]):
            want = ref(r, F, I)
            assert got.to_numpy().shape == tuple(t.shape), (name, r)
            np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6, err_msg=f"{name} on replica {r}")
    # the broadcast is exact: the root's -0.0 stays -0.0
    bpos = len(cases) - 2
    assert np.signbit(results[0][bpos].to_numpy()[0, 0]) == np.signbit(F[groups[0][root_pos]][0, 0])


def test_in_graph_collectives_errors():
    from torch_xla._internal import collectives, world
    b = collectives.InGraphBackend()
    d = torch_xla.device()
    x = torch.zeros(3, 4, device=d)
    with pytest.raises(NotImplementedError, match="equal size"):
        b.all_reduce("sum", [x], 1.0, world.Group((0, 1, 2), [(0, 1, 2), (3,)]))
    with pytest.raises(ValueError, match="not divisible"):
        b.reduce_scatter("sum", [x], 1.0, 0, world.Group((0, 1), [(0, 1)]))
    with pytest.raises(ValueError, match="not divisible"):
        b.all_to_all(x, 0, 1, world.Group((0, 1), [(0, 1)]))
    with pytest.raises(ValueError, match="integer or bool"):
        b.all_reduce("or", [x], 1.0, world.Group((0, 1), [(0, 1)]))


def test_maybe_convert_to_cpu_and_atomic_save(tmp_path):
    d = torch_xla.device()
    t = torch.ones(3, device=d) * 2
    data = {"a": t, "b": [t, 3, "s"], "c": (torch.zeros(1),)}
    cpu = xm._maybe_convert_to_cpu(data)
    assert cpu["a"].device.type == "cpu" and cpu["b"][0] is cpu["a"] and cpu["b"][1:] == [3, "s"]
    assert xm._maybe_convert_to_cpu(data, convert=False) is data
    path = tmp_path / "x.pt"
    xm.save(data, str(path))
    assert torch.equal(torch.load(path)["a"], torch.full((3,), 2.0))
    assert os.listdir(tmp_path) == ["x.pt"]


def test_get_memory_info_keys():
    info = xm.get_memory_info(torch_xla.device())
    for k in ("bytes_used", "bytes_limit", "peak_bytes_used", "kb_free", "kb_total"):
        assert isinstance(info[k], int) and info[k] >= 0, (k, info)
    assert 0 < info["bytes_used"] <= info["bytes_limit"] and info["peak_bytes_used"] >= info["bytes_used"] // 2
    assert info["kb_total"] * 1024 == info["bytes_limit"]


# ---- MpDeviceLoader / ParallelLoader in one process ----------------------------------------------


def test_mp_device_loader_single_process():
    d = torch_xla.device()
    ds = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    dl = pl.MpDeviceLoader(loader, d, loader_prefetch_size=2, device_prefetch_size=1,
                           host_to_device_transfer_threads=1, batches_per_execution=1)
    assert len(dl) == 5 and dl._loader is loader and dl.dataset is ds and dl.batch_sampler is loader.batch_sampler
    for _ in range(2):  # iterating twice works
        marks = met.counter_value("MarkStep") or 0
        got = []
        for x, y in dl:
            assert x.device.type == "xla" and y.device.type == "xla"
            got.append(y.cpu())
        assert torch.equal(torch.cat(got), torch.arange(20))
        assert (met.counter_value("MarkStep") or 0) - marks == 6  # one per batch, one at the end
    dl.dataset = "replaced"
    dl.batch_sampler = None
    assert dl.dataset == "replaced" and dl.batch_sampler is None
    para = pl.ParallelLoader(loader, [d])
    per = para.per_device_loader(d)
    assert len(per) == 5 and sum(1 for _ in per) == 5
    for _ in pl.MpDeviceLoader(loader, d):  # leaving early stops the threads
        break


class _Boom(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError("bad sample 5")
        return torch.tensor([float(i)])


def test_loader_exception_reaches_training_loop():
    dl = pl.MpDeviceLoader(torch.utils.data.DataLoader(_Boom(), batch_size=2), torch_xla.device())
    seen = 0
    with pytest.raises(KeyError, match="bad sample 5"):
        for _ in dl:
            seen += 1
    assert seen == 2


def test_children_see_one_device_on_every_platform(monkeypatch):
    """What each spawned child's environment narrows its plugin to: one device, as xla:0."""
    from torch_xla.distributed import xla_multiprocessing as xmp_mod
    env = xmp_mod._one_device_env
    assert env("CPU", 2, 4) == {"CPU_NUM_DEVICES": "1"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert env("CUDA", 3, 4) == {"CUDA_VISIBLE_DEVICES": "3", "GPU_NUM_DEVICES": "1"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert env("CUDA", 1, 4)["CUDA_VISIBLE_DEVICES"] == "5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(ValueError, match="names 2 GPU"):
        env("CUDA", 0, 4)
    tpu = env("TPU", 2, 4)
    assert tpu["TPU_VISIBLE_CHIPS"] == "2" and tpu["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
    assert tpu["TPU_PROCESS_BOUNDS"] == "2,2,1" and tpu["TPU_PROCESS_PORT"] == "8478"
    assert tpu["TPU_PROCESS_ADDRESSES"].split(",")[3] == "localhost:8479"
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        env("TPU", 0, 3)


def test_zero_copy_upload_keeps_the_memory_alive():
    """Host collectives hand their private result buffers to the device (the CPU plugin aliases
    them instead of copying); the memory stays valid after Python drops the CPU tensor, until the
    device buffer and every computation using it are gone."""
    import gc
    from torch_xla import _C
    d = torch_xla.device()
    ref = torch.arange(4096.0).reshape(64, 64)
    c = ref.clone()
    x = _C._from_cpu_adopt(c, 0)
    y = x * 2  # pending work that reads the adopted buffer
    del c
    gc.collect()
    _ = [torch.rand(64, 64) for _ in range(50)]  # reuse freed host memory if it had been released
    torch.testing.assert_close(y.cpu(), ref * 2)
    torch.testing.assert_close(x.cpu(), ref)
    with pytest.raises(RuntimeError, match="contiguous"):
        _C._from_cpu_adopt(torch.ones(4, 4).t(), 0)
