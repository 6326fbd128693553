"""Trains the demo GPT (examples/gpt.py) through the real Lightning on torch_xla, 2 processes.

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 .venv/bin/python examples/train_lightning.py [--steps 60]

Lightning's unchanged `Trainer(accelerator="tpu", strategy="xla", devices="auto")`: it detects
torch_xla (PJRT_DEVICE set), forks one process per device with xmp.spawn, wraps the data loader
in MpDeviceLoader, averages gradients with xm.reduce_gradients, and shows its progress bar.
PJRT_DEVICE and CPU_NUM_DEVICES default to CPU and 2 here when unset.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "2")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import lightning as L  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402


class Windows(Dataset):
    """`n` random (x, y) windows of the corpus, fixed by the seed (the same on every rank)."""

    def __init__(self, data: torch.Tensor, block: int, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = gpt.get_batch(data, n, block, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class LitGPT(L.LightningModule):
    def __init__(self, vocab_size: int, lr: float = 3e-3):
        super().__init__()
        torch.manual_seed(0)
        self.model = gpt.make_model(vocab_size)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        _, loss = self.model(x, y)
        self.log("loss", loss, prog_bar=True, sync_dist=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        _, loss = self.model(x, y)
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps (global batches)")
    ap.add_argument("--batch-size", type=int, default=16, help="global batch size")
    args = ap.parse_args()
    _, vocab, data = gpt.load_corpus()
    block = gpt.GPTConfig().block_size
    devices = int(os.environ["CPU_NUM_DEVICES"]) if os.environ["PJRT_DEVICE"] == "CPU" else "auto"
    world = devices if isinstance(devices, int) else 1
    train = DataLoader(Windows(data, block, args.steps * args.batch_size, seed=1), batch_size=args.batch_size // world)
    val = DataLoader(Windows(data, block, 4 * args.batch_size, seed=2), batch_size=args.batch_size // world)
    trainer = L.Trainer(accelerator="tpu", strategy="xla" if world > 1 else "auto", devices=devices, max_epochs=1,
                        logger=False, enable_checkpointing=False, val_check_interval=1.0)
    model = LitGPT(len(vocab))
    trainer.fit(model, train, val)
    print(f"final metrics: " + ", ".join(f"{k}={float(v):.4f}" for k, v in trainer.callback_metrics.items()))


if __name__ == "__main__":
    main()
