"""DDP through the ``xla`` torch.distributed backend vs ``xm.optimizer_step`` on 2 processes.

    CPU_NUM_DEVICES=2 .venv/bin/python bench/bench_ddp.py [--steps 30] [--hidden 1024]

Same MLP, same per-rank data, SGD; prints the median step time (after 5 warm-up steps) of each
way on rank 0, the executions per step and the ops that ran on the CPU fallback in the measured
steps. Both end each step with torch_xla.sync().

Before/after for the as_strided lowering: TORCH_XLA_AS_STRIDED_FALLBACK=1 sends as_strided_copy and
as_strided_scatter to the CPU fallback (as before they were lowered); alternate runs with and
without it and compare the medians.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _mp_fn(index, steps, hidden):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_backend  # noqa: F401

    dist.init_process_group("xla", init_method="xla://")
    dev = xm.xla_device()

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                   torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(dev)

    x = torch.randn(64, 256, device=dev)
    y = torch.randint(0, 10, (64,), device=dev)
    import torch_xla.debug.metrics as met
    results, execs, fallbacks = {}, {}, {}
    for way in ("xm.optimizer_step", "DDP(gradient_as_bucket_view=True)", "DDP()"):
        m = model()
        if way.startswith("DDP"):
            m = DDP(m, gradient_as_bucket_view="True" in way)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        times = []
        for s in range(steps):
            if s == 5:
                e0 = (met.metric_data("ExecuteTime") or (0,))[0]
                met.clear_counters()
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            if way.startswith("DDP"):
                opt.step()
            else:
                xm.optimizer_step(opt)
            torch_xla.sync()
            xm.wait_device_ops()
            times.append(time.perf_counter() - t0)
        results[way] = statistics.median(times[5:])
        execs[way] = ((met.metric_data("ExecuteTime") or (0,))[0] - e0) / (steps - 5)
        fallbacks[way] = sorted(set(met.executed_fallback_ops()) - {"aten::_local_scalar_dense"})
    nparams = sum(p.numel() for p in model().parameters())
    if index == 0:
        print(f"2 processes, MLP {nparams / 1e6:.2f} M params, batch 64/rank, {steps} steps:")
        for way, t in results.items():
            print(f"  {way:36s} {t * 1e3:8.2f} ms/step (median), {execs[way]:.1f} executions/step, "
                  f"CPU fallback: {', '.join(fallbacks[way]) or 'none'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=1024)
    a = ap.parse_args()
    import torch_xla.distributed.xla_multiprocessing as xmp
    xmp.spawn(_mp_fn, args=(a.steps, a.hidden))
