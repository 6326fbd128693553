"""Step time of the demo GPT through the real Lightning vs a plain torch_xla loop, one process.

    PJRT_DEVICE=CPU .venv/bin/python bench/bench_lightning.py [--batch-size 16] [--warmup 5] [--steps 30] [--repeat 3]

Both train examples/gpt.py with AdamW on the same pre-sampled CPU batches. The plain loop is
`x.to(device)`, forward, backward, `opt.step()`, `torch_xla.sync()`. Lightning runs
`Trainer(accelerator="tpu", devices=1)` (SingleDeviceXLAStrategy: Lightning moves each batch,
runs its loop, hooks and XLAPrecision.optimizer_step, which ends each step with xm.mark_step())
with no logger, progress bar, checkpointing or model summary. Each is timed over `--steps` steps
after `--warmup` untimed ones, the clock stopped after xm.wait_device_ops(); the best of
`--repeat` runs of each is reported, alternating the two.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt  # noqa: E402


def batches(data, args):
    g = torch.Generator().manual_seed(0)
    block = gpt.GPTConfig().block_size
    xs, ys = zip(*[gpt.get_batch(data, args.batch_size, block, g) for _ in range(args.warmup + args.steps)])
    return torch.stack(xs), torch.stack(ys)


def plain(vocab, xs, ys, args) -> float:
    device = torch_xla.device()
    torch.manual_seed(0)
    model = gpt.make_model(vocab).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    t0 = None
    for i in range(len(xs)):
        if i == args.warmup:
            xm.wait_device_ops()
            t0 = time.perf_counter()
        _, loss = model(xs[i].to(device), ys[i].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch_xla.sync()
    xm.wait_device_ops()
    return (time.perf_counter() - t0) / args.steps * 1e3


def lightning(vocab, xs, ys, args) -> float:
    import lightning as L

    class LitGPT(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.model = gpt.make_model(vocab)

        def training_step(self, batch, batch_idx):
            return self.model(batch[0], batch[1])[1]

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01)

    class Clock(L.Callback):
        t0 = t1 = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == args.warmup:
                xm.wait_device_ops()
                self.t0 = time.perf_counter()

        def on_train_end(self, trainer, pl_module):
            xm.wait_device_ops()
            self.t1 = time.perf_counter()

    clock = Clock()
    trainer = L.Trainer(accelerator="tpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[clock])
    loader = DataLoader(TensorDataset(xs, ys), batch_size=None)  # each item is one whole batch
    trainer.fit(LitGPT(), loader)
    return (clock.t1 - clock.t0) / args.steps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    _, vocab, data = gpt.load_corpus()
    xs, ys = batches(data, args)
    p, l = [], []
    for _ in range(args.repeat):
        p.append(plain(len(vocab), xs, ys, args))
        l.append(lightning(len(vocab), xs, ys, args))
    print(f"demo GPT, batch {args.batch_size}x{gpt.GPTConfig().block_size}, AdamW, 1 process, {args.steps} timed steps")
    print(f"  plain torch_xla loop : {min(p):7.2f} ms/step  (runs: {', '.join(f'{v:.1f}' for v in p)})")
    print(f"  Lightning Trainer    : {min(l):7.2f} ms/step  (runs: {', '.join(f'{v:.1f}' for v in l)})")
    print(f"  ratio Lightning/plain: {min(l) / min(p):.2f}x")


if __name__ == "__main__":
    main()
