"""Issue #11: the real Lightning (PyPI `lightning` 2.6.x, unchanged) trains on torch_xla.

Trainer(accelerator="tpu", strategy="xla") with PJRT_DEVICE=CPU on 1 and 4 processes, and Fabric's
XLA strategy on 4, against the same module on Trainer(accelerator="cpu"). Each job runs in a fresh
interpreter (tests/_lightning_workers.py): Lightning forks its workers, so the launching process
must not have started the XLA runtime, and XLA_USE_BF16 is read when a runtime starts. The 4-process
jobs are few and each checks many things at once (the machine has 2 cores).

Tolerances: float32 weights after 24-32 SGD steps agree to 1e-5 (only the summation order of the
gradient average differs between 1 and 4 processes); bf16-true weights to 0.05 of the float32 CPU
run (bf16 has 8 significant bits).
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("lightning")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "_lightning_workers.py")
TOL = 1e-5


def _run(mode, out, *extra, xla=True, timeout=240, check=True):
    env = dict(os.environ)
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCH_XLA_SPAWNED",
              "XLA_USE_BF16", "XLA_USE_F16", "PT_XLA_DEBUG", "CPU_NUM_DEVICES", "PJRT_DEVICE"):
        env.pop(k, None)
    if xla:
        # 4 CPU devices, as a user sets them for a multi-device job on the CPU (the default is 1).
        env["PJRT_DEVICE"], env["CPU_NUM_DEVICES"] = "CPU", "4"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, WORKERS, mode, str(out), *map(str, extra)], env=env, cwd=str(out),
                       capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    if check and r.returncode != 0:
        raise AssertionError(f"job {mode} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}")
    return r, took


def _load(path):
    return torch.load(path, weights_only=False)


def _maxdiff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning")
    _run("cpu_ref", out, xla=False)
    _run("xla4", out)
    _run("xla1", out, out / "ckpt" / "last.ckpt")
    return out


def test_plain_trainer_stays_on_cpu(jobs):
    ref = _load(jobs / "cpu_ref.pt")
    assert ref["plain_accelerator"] == "CPUAccelerator"
    assert ref["xla_available"] is False and ref["xla_count"] == 0
    assert ref["gates"] == {"available": True, "ge_2_1": True, "ge_2_5": True}


def test_detection_and_one_device(jobs):
    x1 = _load(jobs / "xla1.pt")
    assert x1["xla_available"] is True and x1["xla_count"] == 4 and x1["using_pjrt"] is True
    assert x1["auto_devices"] == 4
    assert x1["strategy"] == "SingleDeviceXLAStrategy"
    # Lightning's own refusal of strategy="xla" on one device (as on a TPU), unchanged.
    assert "does not support running on a single device" in x1["xla_one_device"]


def test_one_process_matches_cpu(jobs):
    ref, x1 = _load(jobs / "cpu_ref.pt"), _load(jobs / "xla1.pt")
    assert x1["device"] == "xla:0" and x1["tied"] is True
    assert _maxdiff(x1["weights"], ref["weights"]) < TOL
    for k, v in ref["fit_metrics"].items():
        assert x1["fit_metrics"][k] == pytest.approx(v, abs=TOL), k
    assert x1["validate"][0]["val_loss"] == pytest.approx(ref["validate"][0]["val_loss"], abs=TOL)
    assert x1["test"][0]["test_loss"] == pytest.approx(ref["test"][0]["test_loss"], abs=TOL)
    assert (x1["predict"] - ref["predict"]).abs().max() < TOL
    # Manual optimization with clip_gradients(by value).
    assert _maxdiff(x1["manual"], ref["manual"]) < TOL


def test_four_processes_match_one(jobs):
    ref, x4 = _load(jobs / "cpu_ref.pt"), _load(jobs / "xla4.pt")
    assert x4["num_devices"] == 4 and x4["strategy"] == "XLAStrategy"
    # EarlyStopping(patience=2) on a metric that never improves ends the fit after 3 epochs on all
    # ranks; the loss went through all_gather(sync_grads=True), so the 4-process gradient is the
    # whole global batch's: the weights equal the CPU run's.
    assert _maxdiff(x4["weights"], ref["weights"]) < TOL
    m = x4["fit_metrics"]
    assert m["train_loss"] == pytest.approx(ref["fit_metrics"]["train_loss"], abs=TOL)  # sync_dist mean
    assert m["val_loss"] == pytest.approx(ref["fit_metrics"]["val_loss"], abs=TOL)
    assert m["rank_sum"] == 8 * (0 + 1 + 2 + 3)  # sync_dist with reduce_fx="sum": 8 steps, ranks 0..3
    assert x4["validate"][0]["val_loss"] == pytest.approx(ref["validate"][0]["val_loss"], abs=TOL)
    assert x4["test"][0]["test_loss"] == pytest.approx(ref["test"][0]["test_loss"], abs=TOL)
    # Predictions: Lightning returns none with a forking strategy; every rank gathered all of them.
    assert x4["predict_returned"] is None
    for r in range(4):
        preds = _load(jobs / f"pred_rank{r}.pt")
        idx = torch.cat([p["idx"] for p in preds])
        pred = torch.cat([p["pred"] for p in preds])
        assert sorted(idx.tolist()) == list(range(64))
        assert (pred[idx.argsort()] - ref["predict"]).abs().max() < TOL


def test_strategy_collectives_every_rank(jobs):
    for r in range(4):
        s = _load(jobs / f"seen_rank{r}.pt")
        assert s["world"] == 4 and s["device"] == "xla:0" and s["tied"] is True
        assert s["broadcast_obj"] == {"from": 0, "x": [1, 2]}
        assert s["broadcast_t"].tolist() == [1.5]  # from rank 1
        assert s["reduce_sum"] == 10.0 and s["reduce_mean"] == 2.5
        assert s["gather_2d"].shape == (8, 3)
        assert s["gather_2d"][:, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
        # self.all_gather of the validation indices: XLAStrategy calls xm.all_gather, which concatenates
        # along dim 0 (upstream's behaviour on TPU too), in rank order.
        g = s["val_gathered"][0]
        assert g.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_checkpoints_written_once_and_resumed(jobs):
    ref, x4, x1 = _load(jobs / "cpu_ref.pt"), _load(jobs / "xla4.pt"), _load(jobs / "xla1.pt")
    # save_top_k=1 removed the worse epochs' files (remove_checkpoint); last.ckpt and the best remain.
    assert x4["ckpt_files"] == ["eepoch=2.ckpt", "last.ckpt"], x4["ckpt_files"]
    assert os.path.basename(x4["best"]) == "eepoch=2.ckpt"
    assert not glob.glob(str(jobs / "ckpt" / "*.tmp*"))
    ck = torch.load(jobs / "ckpt" / "last.ckpt", weights_only=False)
    assert ck["epoch"] == 2 and ck["global_step"] == 24
    for k, v in ck["state_dict"].items():
        assert v.device.type == "cpu" and v.dtype == torch.float32, k
        assert (v - ref["weights"][k]).abs().max() < TOL, k
    assert ck["optimizer_states"][0]["state"], "optimizer state (momentum) saved"
    # Resumed with one process for a fourth epoch: the CPU run's 4-epoch weights.
    assert _maxdiff(x1["resumed"], ref["weights_4"]) < TOL


def test_bf16_true(jobs):
    ref = _load(jobs / "cpu_ref.pt")
    _run("bf16", jobs)
    b = _load(jobs / "bf16.pt")
    assert b["bf16_env"] == "1"  # Lightning's XLAPrecision set XLA_USE_BF16 ...
    assert b["env_after"] is None  # ... and removed it at teardown
    for k, w in b["weights"].items():
        assert w.dtype == torch.float32  # reads back as float32 ...
        assert torch.equal(w, w.bfloat16().float()), k  # ... holding bf16 values (computed in bf16)
        assert (w - ref["weights"][k]).abs().max() < 0.05, k
    assert _maxdiff(b["weights"], ref["weights"]) > 1e-4  # not float32 arithmetic


def test_fabric_four_processes(jobs):
    ref = _load(jobs / "cpu_ref.pt")
    _run("fabric4", jobs)
    for r in range(4):
        f = _load(jobs / f"fabric_rank{r}.pt")
        assert f["rank"] == r and f["world"] == 4 and f["device"] == "xla:0"
        assert f["mp_loader"] is True
        assert _maxdiff(f["weights"], ref["fabric"]) < TOL
        assert f["all_reduce_sum"].tolist() == [10.0] and f["all_reduce_mean"].tolist() == [2.5]
        assert f["all_gather"].tolist() == [0, 0, 1, 10, 2, 20, 3, 30]
        assert f["broadcast"] == {"who": 2} and f["broadcast_t"].tolist() == [9.0]
        assert f["loaded_step"] == 7 and f["loaded_equal"] is True
    ck = torch.load(jobs / "fabric.ckpt", weights_only=False)
    assert ck["step"] == 7 and all(v.device.type == "cpu" for v in ck["model"].values())


def test_failing_rank_ends_fit(jobs):
    # strategy="xla_debug" (PT_XLA_DEBUG on in the workers) and rank 2 raising at its second step.
    r, took = _run("fail4", jobs, check=False, timeout=120)
    assert r.returncode != 0
    assert "ValueError: rank 2 failed on purpose" in r.stderr
    assert "Process 2 terminated with the following error" in r.stderr
    assert "[PT_XLA_DEBUG] compile" in r.stderr + r.stdout
    assert took < 30, took


def test_surface_lightning_reads():
    """What Lightning 2.6 reads from torch_xla, in this (non-XLA-configured) process."""
    import importlib.metadata

    import torch_xla.core.xla_model as xm
    import torch_xla.debug.profiler as xp
    import torch_xla.distributed.fsdp  # noqa: F401  (XLAFSDPStrategy imports it)
    import torch_xla.runtime as xr
    from torch_xla._internal import tpu

    assert importlib.metadata.version("torch_xla") == "2.9.0+txla"
    assert isinstance(tpu.num_available_devices(), int)
    env = tpu.get_tpu_env()
    assert {"ACCELERATOR_TYPE", "TYPE"} <= env.keys()
    assert xr.device_type() is not None
    info = xm.get_memory_info(torch.device("xla", 0))
    assert info["kb_total"] > 0 and 0 <= info["kb_free"] <= info["kb_total"]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert xp.start_server(9231) is not None
    with xp.Trace("training_step"):
        pass
    with xp.StepTrace("validation_step", step_num=1):
        pass


def test_example_train_lightning(tmp_path):
    """examples/train_lightning.py: the demo GPT through Lightning with 2 processes (a few steps)."""
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="2")
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCH_XLA_SPAWNED"):
        env.pop(k, None)
    ex = os.path.join(os.path.dirname(HERE), "examples", "train_lightning.py")
    r = subprocess.run([sys.executable, ex, "--steps", "4", "--batch-size", "8"], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-6000:]
    assert "Epoch 0: 100%" in r.stdout + r.stderr  # Lightning's progress bar
    assert "final metrics: loss=" in r.stdout and "val_loss=" in r.stdout
