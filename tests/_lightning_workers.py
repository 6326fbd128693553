"""Jobs for tests/test_lightning.py: the real Lightning (PyPI) on torch_xla, run in fresh interpreters.

    python tests/_lightning_workers.py MODE OUT_DIR

Each mode writes what it saw to OUT_DIR (torch.save'd dicts, one file per rank where ranks differ);
the test compares them. Lightning is used unchanged: no patching.

The module is BoringModel-style: a small MLP with one tied weight, random data, SGD. The global
batch is 8: batch_size 8 with one process, 2 per rank with four (Lightning's DistributedSampler
hands rank r the samples r, r+4, ...), so one step sees the same eight samples either way.
"""
from __future__ import annotations

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter, EarlyStopping, ModelCheckpoint

GLOBAL_BATCH = 8
N = 64


def data():
    g = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(N, 8, generator=g), torch.randn(N, 2, generator=g), torch.arange(N))


class Boring(L.LightningModule):
    def __init__(self, manual: bool = False, gather_loss: bool = False, record: str = "", tied: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(8, 16)
        self.hid = torch.nn.Linear(16, 16)
        self.hid2 = torch.nn.Linear(16, 16)
        if tied:
            self.hid2.weight = self.hid.weight  # tied parameter
        self.out = torch.nn.Linear(16, 2)
        self.automatic_optimization = not manual
        self.gather_loss = gather_loss
        self.record = record  # directory for per-rank records ("" = none)
        self.seen = {}

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.hid(h))
        h = torch.tanh(self.hid2(h))
        return self.out(h)

    def _loss(self, batch):
        x, y, _ = batch
        out = self(x)
        if self.gather_loss:
            # Every rank computes the loss of the whole global batch through an autograd all_gather:
            # the gradient equals the one-process gradient (checks sync_grads=True).
            out = self.all_gather(out, sync_grads=True).reshape(-1, 2)
            y = self.all_gather(y).reshape(-1, 2)
        return torch.nn.functional.mse_loss(out, y)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        # The per-rank loss of this rank's samples, reduced across ranks (mean of equal-size shards).
        local = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
        self.log("train_loss", local, on_step=False, on_epoch=True, sync_dist=True)
        self.log("rank_sum", float(self.global_rank), on_step=False, on_epoch=True, sync_dist=True,
                 reduce_fx="sum")
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=0.02, gradient_clip_algorithm="value")
            opt.step()
            return None
        if os.environ.get("TXLA_FAIL_RANK") == str(self.global_rank) and batch_idx == 1:
            raise ValueError(f"rank {self.global_rank} failed on purpose")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y, idx = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)
        self.log("es_metric", 1.0, sync_dist=True)  # never improves: EarlyStopping(patience=2)
        g = self.all_gather(idx)
        self.seen.setdefault("val_gathered", []).append(g.cpu())

    def test_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        x, _, idx = batch
        pred = self(x)
        # Predictions of every rank, gathered: rank 0 returns them all.
        return {"idx": self.all_gather(idx).reshape(-1).cpu(), "pred": self.all_gather(pred).reshape(-1, 2).cpu()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.5)

    def on_train_end(self):
        self.seen["tied"] = self.hid2.weight is self.hid.weight
        self.seen["device"] = str(self.inp.weight.device)
        st = self.trainer.strategy
        self.seen["world"] = st.world_size
        self.seen["broadcast_obj"] = st.broadcast({"from": st.global_rank, "x": [1, 2]}, src=0)
        self.seen["broadcast_t"] = st.broadcast(torch.tensor([float(st.global_rank) + 0.5]), src=1
                                                if st.world_size > 1 else 0).cpu()
        st.barrier("txla-test")
        st.barrier()
        self.seen["reduce_sum"] = float(st.reduce(torch.tensor(st.global_rank + 1.0, device=self.device),
                                                  reduce_op="sum"))
        self.seen["reduce_mean"] = float(st.reduce(torch.tensor(st.global_rank + 1.0, device=self.device),
                                                   reduce_op="mean"))
        self.seen["gather_2d"] = st.all_gather(torch.full((2, 3), float(st.global_rank), device=self.device)).cpu()
        self.seen["bf16_env"] = os.environ.get("XLA_USE_BF16")
        if self.record:
            torch.save({k: v for k, v in self.seen.items()},
                       os.path.join(self.record, f"seen_rank{st.global_rank}.pt"))


class PredWriter(BasePredictionWriter):
    """Each rank writes the (gathered) predictions it holds: Lightning returns none from trainer.predict
    with a strategy that forks."""

    def __init__(self, out):
        super().__init__(write_interval="epoch")
        self.out = out

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        torch.save(predictions, os.path.join(self.out, f"pred_rank{trainer.global_rank}.pt"))


def weights(m):
    return {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}


def loaders(world: int):
    """(train, val) loaders. Lightning always gives the training loader of a multi-process run a
    shuffling DistributedSampler (seed 0, reseeded each epoch): one process sees the same global
    batches through a one-replica DistributedSampler with that seed."""
    from torch.utils.data import DistributedSampler
    ds = data()
    bs = GLOBAL_BATCH // world
    if world == 1:
        train = DataLoader(ds, batch_size=bs, sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0))
    else:
        train = DataLoader(ds, batch_size=bs)
    return train, DataLoader(ds, batch_size=bs)


def trainer(**kw):
    base = dict(enable_progress_bar=False, logger=False, enable_model_summary=False, deterministic=False)
    base.update(kw)
    return L.Trainer(**base)


# ----------------------------------------------------------------------------------------- modes
def mode_cpu_ref(out):
    """Reference numbers on Trainer(accelerator="cpu"); also: Trainer() without PJRT_DEVICE is CPU."""
    assert "PJRT_DEVICE" not in os.environ
    from lightning.pytorch.accelerators import CPUAccelerator, XLAAccelerator
    t = L.Trainer(logger=False)
    res = {"plain_accelerator": type(t.accelerator).__name__, "xla_available": XLAAccelerator.is_available(),
           "xla_count": XLAAccelerator.auto_device_count()}
    assert isinstance(t.accelerator, CPUAccelerator)
    m = Boring()
    clip = dict(gradient_clip_val=0.1, gradient_clip_algorithm="norm", enable_checkpointing=False)
    t = trainer(accelerator="cpu", devices=1, max_epochs=3, **clip)
    train, val = loaders(1)
    t.fit(m, train, val)
    res["weights"] = weights(m)
    res["fit_metrics"] = {k: float(v) for k, v in t.callback_metrics.items()}
    res["validate"] = t.validate(m, val, verbose=False)
    res["test"] = t.test(m, val, verbose=False)
    preds = t.predict(m, val)
    res["predict"] = torch.cat([p["pred"] for p in preds])
    m4 = Boring()  # four epochs: what resuming the 3-epoch checkpoint for one more epoch must give
    t = trainer(accelerator="cpu", devices=1, max_epochs=4, **clip)
    t.fit(m4, *loaders(1))
    res["weights_4"] = weights(m4)
    mm = Boring(manual=True)
    t = trainer(accelerator="cpu", devices=1, max_epochs=2, enable_checkpointing=False)
    t.fit(mm, *loaders(1))
    res["manual"] = weights(mm)
    # Fabric's reference: its XLA strategy gives each rank a non-shuffling DistributedSampler, so
    # global batch b is samples 8b..8b+7; a plain loop over batches of 8, two epochs.
    fm = Boring(tied=False)
    fo = torch.optim.SGD(fm.parameters(), lr=0.2, momentum=0.5)
    for _ in range(2):
        for x, y, _i in DataLoader(data(), batch_size=GLOBAL_BATCH):
            loss = torch.nn.functional.mse_loss(fm(x), y)
            fo.zero_grad()
            loss.backward()
            fo.step()
    res["fabric"] = weights(fm)
    from lightning.fabric.accelerators import xla as fx
    res["gates"] = {"available": bool(fx._XLA_AVAILABLE), "ge_2_1": bool(fx._XLA_GREATER_EQUAL_2_1),
                    "ge_2_5": bool(fx._XLA_GREATER_EQUAL_2_5)}
    torch.save(res, os.path.join(out, "cpu_ref.pt"))


def mode_xla4(out):
    """One 4-process fit checking many things at once, then validate/test/predict with 4 processes."""
    ckdir = os.path.join(out, "ckpt")
    m = Boring(gather_loss=True, record=out)
    ck = ModelCheckpoint(dirpath=ckdir, monitor="val_loss", save_top_k=1, save_last=True,
                         filename="e{epoch}")
    es = EarlyStopping(monitor="es_metric", mode="min", patience=2)
    t = trainer(accelerator="tpu", strategy="xla", devices="auto", max_epochs=10, callbacks=[ck, es],
                gradient_clip_val=0.1, gradient_clip_algorithm="norm")
    res = {"num_devices": t.num_devices, "strategy": type(t.strategy).__name__}
    train, val = loaders(4)
    t0 = time.time()
    t.fit(m, train, val)
    res["fit_s"] = time.time() - t0
    res["epochs_run"] = t.current_epoch
    res["weights"] = weights(m)
    res["fit_metrics"] = {k: float(v) for k, v in t.callback_metrics.items()}
    res["best"] = ck.best_model_path
    res["ckpt_files"] = sorted(os.listdir(ckdir))
    t = trainer(accelerator="tpu", strategy="xla", devices=4)
    res["validate"] = t.validate(m, val, verbose=False)
    t = trainer(accelerator="tpu", strategy="xla", devices=4)
    res["test"] = t.test(m, val, verbose=False)
    t = trainer(accelerator="tpu", strategy="xla", devices=4, callbacks=[PredWriter(out)])
    res["predict_returned"] = t.predict(m, val)
    torch.save(res, os.path.join(out, "xla4.pt"))


def mode_xla1(out, ckpt):
    """One process (SingleDeviceXLAStrategy): fit/validate/test/predict, resume from the 4-process
    checkpoint, manual optimization with clipping by value, Lightning's own errors."""
    from lightning.pytorch.accelerators import XLAAccelerator
    from lightning.fabric.accelerators.xla import _using_pjrt
    res = {"xla_available": XLAAccelerator.is_available(), "xla_count": XLAAccelerator.auto_device_count(),
           "using_pjrt": _using_pjrt()}
    t = L.Trainer(accelerator="tpu", strategy="xla", devices="auto", logger=False)
    res["auto_devices"] = t.num_devices
    # Lightning refuses strategy="xla" on one device (as on a TPU): its error, unchanged.
    try:
        t = trainer(accelerator="tpu", strategy="xla", devices=1, max_epochs=1)
        t.fit(Boring(), *loaders(1))
        res["xla_one_device"] = "no error"
    except NotImplementedError as e:
        res["xla_one_device"] = str(e)
    m = Boring()
    t = trainer(accelerator="tpu", devices=1, max_epochs=3, gradient_clip_val=0.1, gradient_clip_algorithm="norm",
                enable_checkpointing=False)
    res["strategy"] = type(t.strategy).__name__
    train, val = loaders(1)
    t.fit(m, train, val)
    res["weights"] = weights(m)
    res["tied"] = m.seen["tied"]
    res["device"] = m.seen["device"]
    res["fit_metrics"] = {k: float(v) for k, v in t.callback_metrics.items()}
    res["validate"] = t.validate(m, val, verbose=False)
    res["test"] = t.test(m, val, verbose=False)
    res["predict"] = torch.cat([p["pred"] for p in t.predict(m, val)])
    # Resume the 4-process run's last checkpoint for a fourth epoch.
    r = Boring()
    t = trainer(accelerator="tpu", devices=1, max_epochs=4, gradient_clip_val=0.1, gradient_clip_algorithm="norm",
                enable_checkpointing=False)
    t.fit(r, train, val, ckpt_path=ckpt)
    res["resumed"] = weights(r)
    mm = Boring(manual=True)
    t = trainer(accelerator="tpu", devices=1, max_epochs=2, enable_checkpointing=False)
    t.fit(mm, *loaders(1))
    res["manual"] = weights(mm)
    torch.save(res, os.path.join(out, "xla1.pt"))


def mode_bf16(out):
    """precision="bf16-true" on one process: XLA_USE_BF16 is set by Lightning before the runtime starts."""
    from lightning.pytorch.profilers import XLAProfiler
    m = Boring()
    t = trainer(accelerator="tpu", devices=1, precision="bf16-true", max_epochs=3, gradient_clip_val=0.1,
                gradient_clip_algorithm="norm", enable_checkpointing=False, profiler=XLAProfiler(port=9229))
    t.fit(m, *loaders(1))
    res = {"weights": weights(m), "bf16_env": m.seen["bf16_env"], "env_after": os.environ.get("XLA_USE_BF16")}
    torch.save(res, os.path.join(out, "bf16.pt"))


def _fabric_fn(fabric, out):
    import torch_xla.distributed.parallel_loader as pl
    rank, world = fabric.global_rank, fabric.world_size
    res = {"rank": rank, "world": world, "device": str(fabric.device)}
    # Untied: moving a module to an XLA device makes new Parameters per module (upstream too), and
    # unlike the Trainer, Fabric does not re-tie shared weights after the move.
    model = Boring(tied=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    model, opt = fabric.setup(model, opt)
    dl = fabric.setup_dataloaders(DataLoader(data(), batch_size=GLOBAL_BATCH // world))
    res["loader"] = type(dl).__name__ if not hasattr(dl, "_dataloader") else type(dl._dataloader).__name__
    res["mp_loader"] = isinstance(getattr(dl, "_dataloader", dl), pl.MpDeviceLoader)
    for epoch in range(2):
        for x, y, _ in dl:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            fabric.backward(loss)
            opt.step()
    res["weights"] = weights(model)
    r = torch.tensor([rank + 1.0], device=fabric.device)
    res["all_reduce_sum"] = fabric.all_reduce(r, reduce_op="sum").cpu()
    res["all_reduce_mean"] = fabric.all_reduce(r, reduce_op="mean").cpu()
    res["all_gather"] = fabric.all_gather(torch.tensor([rank, 10 * rank], device=fabric.device)).cpu()
    res["broadcast"] = fabric.broadcast({"who": rank}, src=2)
    res["broadcast_t"] = fabric.broadcast(torch.tensor([rank * 3.0], device=fabric.device), src=3).cpu()
    fabric.barrier()
    path = os.path.join(out, "fabric.ckpt")
    fabric.save(path, {"model": model, "opt": opt, "step": 7})
    fabric.barrier()
    m2 = Boring(tied=False)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.2, momentum=0.5)
    m2, o2 = fabric.setup(m2, o2)
    state = {"model": m2, "opt": o2, "step": 0}
    fabric.load(path, state)
    res["loaded_step"] = state["step"]
    res["loaded_equal"] = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(model.state_dict().values(),
                                                                          m2.state_dict().values()))
    torch.save(res, os.path.join(out, f"fabric_rank{rank}.pt"))


def mode_fabric4(out):
    fabric = L.Fabric(accelerator="tpu", strategy="xla", devices=4)
    fabric.launch(_fabric_fn, out)


def mode_fail4(out):
    """strategy="xla_debug" (PT_XLA_DEBUG on) and rank 2 raising at its second training step."""
    os.environ["TXLA_FAIL_RANK"] = "2"
    t = trainer(accelerator="tpu", strategy="xla_debug", devices=4, max_epochs=5, enable_checkpointing=False)
    t.fit(Boring(), *loaders(4))


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    fn = globals()["mode_" + mode]
    fn(out, *sys.argv[3:])
