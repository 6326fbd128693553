"""The ``xla`` backend of torch.distributed (torch_xla.distributed.xla_backend), as upstream DDP scripts
use it: ``dist.init_process_group("xla", init_method="xla://")`` and DDP on the xla device.

One fresh pair of processes (tests/_xla_backend_workers.py, xmp.spawn, CPU_NUM_DEVICES=2) runs DDP
training and every collective through ``dist.*``; the parent checks the DDP result against a
single-process CPU run over the concatenated batch. The single-process tests need no spawn.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import torch_xla
import torch_xla.distributed.xla_backend as xb

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _xla_backend_workers as w  # noqa: E402

WORKERS = os.path.join(HERE, "_xla_backend_workers.py")


def _clean_env(nprocs):
    env = dict(os.environ, CPU_NUM_DEVICES=str(nprocs))
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCH_XLA_SPAWNED", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(k, None)
    return env


def _launch(worker, nprocs, tmp_path, timeout=300):
    r = subprocess.run([sys.executable, WORKERS, worker, str(tmp_path)], env=_clean_env(nprocs), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and "SPAWN OK" in r.stdout, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-6000:]}"
    return r


def _cpu_reference(world):
    """The same training in one process on the CPU, over the whole (concatenated) batch."""
    model = w.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=w.LR)
    x, y = w.make_data(world)
    for s in range(w.STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[s]), y[s]).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_registered():
    assert "xla" in dist.Backend.backend_list
    assert dist.Backend.XLA == "xla"
    assert dist.Backend.default_device_backend_map.get("xla") == "xla"
    assert issubclass(xb.ProcessGroupXla, dist.ProcessGroup)
    assert issubclass(xb.WorkXla, dist.Work)


def test_ddp_and_collectives_2_processes(tmp_path):
    """(a) every collective through dist.* on 2 processes == numpy/torch on the CPU (checked in the
    workers); (b) DDP(gradient_as_bucket_view=True, then False), 4 SGD steps with different data per rank:
    parameters equal on both ranks (bit for bit) and equal to one CPU process over the concatenated
    batch (rtol 1e-5, atol 1e-6: XLA's f32 reductions are ordered differently), with no op on the
    CPU fallback during the steps; (c) unsupported ops raise NotImplementedError naming the op
    (checked in the workers)."""
    _launch("backend_worker", 2, tmp_path)
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("ok")) == ["ok0", "ok1"]
    ref = _cpu_reference(2)
    for bv in (1, 0):  # gradient_as_bucket_view True, then False
        r0 = torch.load(os.path.join(tmp_path, f"ddp0_{bv}.pt"))
        r1 = torch.load(os.path.join(tmp_path, f"ddp1_{bv}.pt"))
        assert r0["params"].keys() == ref.keys()
        # DDP's gradient bucket views run on our IR (as_strided_copy/as_strided_scatter lowered)
        assert r0["fallbacks"] == r1["fallbacks"] == [], (r0["fallbacks"], r1["fallbacks"])
        for k in ref:
            assert torch.equal(r0["params"][k], r1["params"][k]), f"{k} differs between the ranks (bucket view {bv})"
            torch.testing.assert_close(r0["params"][k], ref[k], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"{k} (bucket view {bv}): {m}")
    # the model moved: the test would pass trivially otherwise
    assert not torch.allclose(ref["0.weight"], w.make_model().state_dict()["0.weight"])


def test_unsupported_ops_single_process():
    """World size 1 in this process: the group works (identities) and unsupported ops raise."""
    from torch_xla._internal import world
    pg = xb.ProcessGroupXla(dist.HashStore(), 0, 1, None)
    dev = torch_xla.device()
    t = torch.arange(4.0, device=dev)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    work = pg.allreduce([t], opts)
    assert work.wait() is True and work.is_completed()
    torch.testing.assert_close(t.cpu(), torch.arange(4.0))
    assert pg.getBackendName() == "xla"
    for name, call in (("send", lambda: pg.send([t], 0, 0)), ("recv", lambda: pg.recv([t], 0, 0)),
                       ("gather", lambda: pg.gather([[t]], [t])), ("scatter", lambda: pg.scatter([t], [[t]])),
                       ("alltoall", lambda: pg.alltoall([t], [t])),
                       ("allgather_coalesced", lambda: pg.allgather_coalesced([[t]], [t]))):
        with pytest.raises(NotImplementedError, match=name):
            call()
    opts.reduceOp = dist.ReduceOp.BXOR
    with pytest.raises(NotImplementedError, match="reduce op"):
        pg.allreduce([t.long()], opts)
    with pytest.raises(ValueError, match="xla device"):
        pg.allreduce([torch.ones(2)], dist.AllreduceOptions())
    assert world.world_size() == 1


def test_torchrun_2_processes(tmp_path):
    """The same script under torchrun: xla:// takes torchrun's RANK/WORLD_SIZE and its agent store."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", WORKERS,
                        "torchrun_worker", str(tmp_path)], env=_clean_env(2), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-6000:]}"
    assert sorted(os.listdir(tmp_path)) == ["torchrun_ok0", "torchrun_ok1"]


def test_init_process_group_single_process():
    """Without a launcher (world size 1) the script's init line works too; collectives are identities.
    A rank/world_size that disagrees with the job raises ValueError."""
    import torch_xla.core.xla_model as xm
    with pytest.raises(ValueError, match="world_size=2"):
        dist.init_process_group("xla", init_method="xla://", rank=0, world_size=2)
    dist.init_process_group("xla", init_method="xla://")
    try:
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "xla")
        assert isinstance(dist.distributed_c10d._get_default_group(), xb.ProcessGroupXla)
        t = torch.arange(6.0, device=xm.xla_device())
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        dist.broadcast(t, src=0)
        outs = [torch.zeros(6, device=t.device)]
        dist.all_gather(outs, t)
        dist.barrier()
        torch.testing.assert_close(outs[0].cpu(), torch.arange(6.0))
        with pytest.raises(NotImplementedError, match="gather"):
            dist.gather(t, [torch.zeros(6, device=t.device)], dst=0)
    finally:
        dist.destroy_process_group()
