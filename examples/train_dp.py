"""Data-parallel training of a small MLP, one process per device.

  .venv/bin/python examples/train_dp.py [out.pt [start_method]]       # xmp.spawn: CPU_NUM_DEVICES processes
  .venv/bin/torchrun --nproc-per-node 2 examples/train_dp.py [out.pt] # the same under torchrun

Every process trains on its slice of each global batch; xm.optimizer_step averages the gradients
(host gloo collectives on CPU), so all processes hold the same weights, equal to one process
training on the whole batch. Rank 0 saves the final weights and losses with xm.save.
"""
import sys

import torch

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

GLOBAL_BATCH, STEPS = 32, 10


def _mp_fn(index, out_path):
    n, rank = xr.world_size(), xr.global_ordinal()
    assert GLOBAL_BATCH % n == 0
    dev = torch_xla.device()
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(STEPS, GLOBAL_BATCH, 16, generator=g)
    y_all = (x_all @ torch.randn(16, 4, generator=g)).argmax(-1)  # a learnable labelling
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    xm.broadcast_master_param(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    per = GLOBAL_BATCH // n
    losses = []
    for step in range(STEPS):
        x = x_all[step, rank * per:(rank + 1) * per].to(dev)
        y = y_all[step, rank * per:(rank + 1) * per].to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        xm.optimizer_step(opt)
        torch_xla.sync()
        losses.append(xm.mesh_reduce("loss", loss.item(), lambda v: sum(v) / len(v)))
    if rank == 0:
        print(f"world size {n}: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    xm.save({"state": model.state_dict(), "losses": losses}, out_path)


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=(sys.argv[1] if len(sys.argv) > 1 else "/tmp/train_dp.pt",),
                     start_method=sys.argv[2] if len(sys.argv) > 2 else "spawn")
