"""Host collectives between processes on XLA:CPU.

  .venv/bin/python bench/bench_collectives.py [--runs 3] [--no-dp]

1. all_reduce (sum) of 1, 16 and 64 MB of float32 between 2 processes: xm.all_reduce on an XLA
   tensor (read to the host, gloo, back to the device) vs plain torch.distributed gloo
   all_reduce on a CPU tensor, in the same processes. Median of several runs.
2. One data-parallel training step of a small MLP (1.3 M parameters, batch 64 per process,
   SGD) with 1, 2 and 4 processes: step time and the share of it spent in the gradient all-reduce
   (xm.reduce_gradients). On this 2-core machine 4 processes oversubscribe the cores.
"""
import os
import statistics
import sys
import time

import torch


def _median_ms(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _allreduce_fn(index, out):
    import torch.distributed as dist
    import torch_xla
    import torch_xla.core.xla_model as xm
    dist.init_process_group("gloo")  # the same TCPStore (xmp.spawn's), a separate gloo group
    dev = torch_xla.device()
    rows = []
    for mb, iters in ((1, 40), (16, 25), (64, 8)):
        n = mb * 1024 * 1024 // 4
        cpu = torch.rand(n)
        x = cpu.to(dev)
        torch_xla.sync(wait=True)

        def ours():
            r = xm.all_reduce(xm.REDUCE_SUM, x)
            torch_xla.sync(wait=True)  # nothing pending: the result is already on the device
            return r

        def plain():  # in place, as torch.distributed users call it
            dist.all_reduce(cpu)
            return cpu

        xm.rendezvous(f"start {mb}")
        for f in (ours, plain, ours, plain):  # warm-up
            f()
        a, b = [], []
        for _ in range(iters):  # alternate, so a busy moment of the machine hits both alike
            t0 = time.perf_counter()
            ours()
            t1 = time.perf_counter()
            plain()
            t2 = time.perf_counter()
            a.append(t1 - t0)
            b.append(t2 - t1)
        rows.append((mb, statistics.median(a) * 1e3, statistics.median(b) * 1e3))
    dist.destroy_process_group()
    if index == 0:
        with open(out, "w") as f:
            for row in rows:
                f.write(" ".join(f"{v:.3f}" for v in row) + "\n")


def _dp_fn(index, out):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    from torch_xla import _C
    dev = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256).to(dev)
    y = torch.randint(0, 10, (64,)).to(dev)
    steps, comm = [], []
    for i in range(25):
        xm.rendezvous("step") if xr.world_size() > 1 else None
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        _C._sync(None, True, "")  # forward + backward
        t1 = time.perf_counter()
        xm.reduce_gradients(opt)
        t2 = time.perf_counter()
        opt.step()
        torch_xla.sync(wait=True)
        t3 = time.perf_counter()
        if i >= 5:
            steps.append(t3 - t0)
            comm.append(t2 - t1)
    if index == 0:
        with open(out, "w") as f:
            f.write(f"{statistics.median(steps) * 1e3:.3f} {statistics.median(comm) * 1e3:.3f}\n")


def _run(fn, nprocs, out):
    import torch_xla.distributed.xla_multiprocessing as xmp
    os.environ["CPU_NUM_DEVICES"] = str(nprocs)
    xmp.spawn(fn, args=(out,), nprocs=nprocs if nprocs > 1 else 1, start_method="fork")
    with open(out) as f:
        return f.read().split()


if __name__ == "__main__":
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp()
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="all_reduce runs (fresh process pairs)")
    ap.add_argument("--no-dp", action="store_true", help="skip the data-parallel step")
    opts = ap.parse_args()
    print(f"all_reduce sum, float32, 2 processes (median ms of each run; {opts.runs} runs, ratio: median [min-max])")
    print(f"{'size':>6} {'xm.all_reduce':>14} {'gloo on CPU':>12} {'ratio':>22}")
    import bench_collectives as me  # picklable functions for the children
    per_size = {}
    for run in range(opts.runs):
        rows = _run(me._allreduce_fn, 2, os.path.join(tmp, "ar.txt"))
        for i in range(0, len(rows), 3):
            mb, ours, plain = (float(v) for v in rows[i:i + 3])
            per_size.setdefault(int(mb), []).append((ours, plain))
    for mb, runs in per_size.items():
        ratios = sorted(o / p for o, p in runs)
        ours = statistics.median(o for o, _ in runs)
        plain = statistics.median(p for _, p in runs)
        print(f"{mb:>4}MB {ours:>14.2f} {plain:>12.2f} {statistics.median(ratios):>9.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]")
    if opts.no_dp:
        sys.exit(0)
    print("\ndata-parallel step, MLP 256-1024-1024-10 (1.3 M params), batch 64/process, SGD (median ms)")
    print(f"{'procs':>5} {'step':>8} {'all-reduce':>11} {'share':>6}")
    for n in (2, 4, 1):  # 1 last: it runs in this process and starts its runtime
        step, comm = (float(v) for v in _run(me._dp_fn, n, os.path.join(tmp, f"dp{n}.txt")))
        print(f"{n:>5} {step:>8.2f} {comm:>11.2f} {comm / step * 100:>5.0f}%")
