"""SPMD step time and memory per device on 1, 2 and 4 XLA:CPU devices.

    python bench/bench_spmd.py [--devices 1,2,4] [--warmup 5] [--steps 20]

For each device count N a fresh process (CPU_NUM_DEVICES=N) calls torch_xla.runtime.use_spmd() and
times, per training step (transfer + forward + backward + optimizer + sync, clock stopped after
xm.wait_device_ops()):
  * mlp: a data-parallel MLP (batch 256 x 512, hidden 1024, SGD), the batch sharded over N devices;
  * gpt: the demo GPT (examples/gpt.py, batch 16 x 64, AdamW) FSDP-style: every parameter sharded
    on its first dimension that divides by N, the batch sharded too.
A plain single-device run (no SPMD) of the same steps is the baseline. Then it reports the bytes each
device holds for a 1024 x 1024 f32 parameter, replicated vs sharded over N devices.

The machine these figures come from has two cores: XLA:CPU's devices share them, so more devices
means the same work split into more, smaller programs plus the collectives between them; the figures
show the partitioner's overheads, not speed-ups.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


def _child(n: int, spmd: bool, warmup: int, steps: int) -> dict:
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    import gpt

    if spmd:
        xr.use_spmd()
        import torch_xla.distributed.spmd as xs
        mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    dev = torch_xla.device()

    def shard_batch(x):
        if spmd:
            xs.mark_sharding(x, mesh, ("data",) + (None,) * (x.dim() - 1))
        return x

    def timed(step):
        for _ in range(warmup):
            step()
        xm.wait_device_ops()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        xm.wait_device_ops()
        return (time.perf_counter() - t0) / steps * 1e3

    out = {}
    # data-parallel MLP
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(mlp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)

    def mlp_step():
        x = shard_batch(torch.randn(256, 512, generator=g).to(dev))
        y = shard_batch(torch.randint(0, 10, (256,), generator=g).to(dev))
        loss = torch.nn.functional.cross_entropy(mlp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch_xla.sync()
    out["mlp_ms"] = timed(mlp_step)

    # demo GPT, FSDP-style
    _, vocab, data = gpt.load_corpus()
    torch.manual_seed(0)
    model = gpt.make_model(len(vocab)).to(dev)
    if spmd:
        for p in model.parameters():
            dim = next((d for d, s in enumerate(p.shape) if s % n == 0), None)
            if dim is not None:
                xs.mark_sharding(p, mesh, tuple("data" if d == dim else None for d in range(p.dim())))
    gopt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def gpt_step():
        x, y = gpt.get_batch(data, 16, model.cfg.block_size, gen)
        _, loss = model(shard_batch(x.to(dev)), shard_batch(y.to(dev)))
        gopt.zero_grad(set_to_none=True)
        loss.backward()
        gopt.step()
        torch_xla.sync()
    out["gpt_ms"] = timed(gpt_step)

    if spmd:
        from torch_xla import _XLAC
        w = torch.randn(1024, 1024).to(dev)
        out["replicated_bytes_per_device"] = _XLAC._xla_get_spmd_device_bytes(w)[0]
        xs.mark_sharding(w, mesh, ("data", None))
        out["sharded_bytes_per_device"] = _XLAC._xla_get_spmd_device_bytes(w)[0]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        n, spmd = args.child.split(":")
        print("@@" + json.dumps(_child(int(n), spmd == "1", args.warmup, args.steps)), flush=True)
        return

    def run(n, spmd):
        env = dict(os.environ, CPU_NUM_DEVICES=str(n), PJRT_DEVICE="CPU")
        p = subprocess.run([sys.executable, __file__, "--child", f"{n}:{int(spmd)}", "--warmup", str(args.warmup),
                            "--steps", str(args.steps)], env=env, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("@@")]
        if not line:
            raise SystemExit(f"child {n} failed:\n{p.stdout}\n{p.stderr[-3000:]}")
        return json.loads(line[-1][2:])

    base = run(1, False)
    print(f"{'run':<22}{'MLP ms/step':>12}{'GPT ms/step':>13}  {'1024x1024 f32 param, bytes per device'}")
    print(f"{'1 device, no SPMD':<22}{base['mlp_ms']:>12.1f}{base['gpt_ms']:>13.1f}  4,194,304")
    for n in [int(v) for v in args.devices.split(",")]:
        r = run(n, True)
        mem = f"{r['replicated_bytes_per_device']:,} replicated / {r['sharded_bytes_per_device']:,} sharded"
        print(f"{f'SPMD, {n} device(s)':<22}{r['mlp_ms']:>12.1f}{r['gpt_ms']:>13.1f}  {mem}")


if __name__ == "__main__":
    main()
