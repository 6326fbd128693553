"""A/B of one host-kernel kind inside one process: the setting alternates step by step.

On a shared 2-core machine, separate processes (even interleaved rounds) see the load move by
+-30% between them; here both settings run in the same process, step after step, so a slow
minute slows both. Each step is traced, synced and waited for (the device is idle before the
next), so the figures are a step's full latency, not its pipelined throughput (bench_interleaved.py
measures that). Both graphs are compiled during warm-up; the kind's switch only changes which graph
the next trace builds (the setting is part of the graph).

Kinds: dots (every large f32/f64/bf16 dot through ATen; TXLA_HOST_DOT_ONEDNN=1 for oneDNN's matmul),
convs, reductions (large column sums), norms (training batch norm).

Usage: .venv/bin/python bench/ab_host_kernels.py --model mlp|gpt2|resnet --kind dots|convs|reductions|norms
       [--steps 40]   (run with LD_PRELOAD=$(.venv/bin/python -m torch_xla._allocator) as the benchmarks do)
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, HERE)

import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
from torch_xla import _C  # noqa: E402
from profile_xla_kernels import _step_fn  # noqa: E402


def setter(kind):
    if kind == "dots":
        convs = _C._host_kernels()[1]
        return lambda on: _C._set_host_kernels(on, convs)
    if kind == "convs":
        dots = _C._host_kernels()[0]
        return lambda on: _C._set_host_kernels(dots, on)
    if kind == "reductions":
        return _C._set_host_reductions
    return _C._set_host_norms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["mlp", "gpt2", "resnet"], default="mlp")
    ap.add_argument("--kind", choices=["dots", "convs", "reductions", "norms"], default="dots")
    ap.add_argument("--steps", type=int, default=40, help="steps per setting")
    args = ap.parse_args()
    if not any(_C._host_kernels()) and not _C._host_reductions() and not _C._host_norms():
        sys.exit("host kernels are not available here (TORCH_XLA_HOST_KERNELS=0, or no FFI headers at build time)")
    switch = setter(args.kind)
    train_step = _step_fn(args.model)  # the same models and steps as the kernel profile

    def step():
        train_step()
        xm.wait_device_ops()

    for i in range(6):  # compiles both graphs
        switch(i % 2 == 0)
        step()
    wall = {True: [], False: []}
    cpu = {True: [], False: []}
    for i in range(2 * args.steps):
        on = i % 2 == 0
        switch(on)
        t, c = time.perf_counter(), time.process_time()
        step()
        wall[on].append((time.perf_counter() - t) * 1e3)
        cpu[on].append((time.process_time() - c) * 1e3)
    print(f"{args.model}, host {args.kind} off/on alternated, {args.steps} steps each "
          f"(ms per step; device idle before each step; process CPU = every thread)")
    for on in (False, True):
        w = sorted(wall[on])
        q = len(w) // 4
        print(f"  {args.kind} {'on ' if on else 'off'}: wall median {statistics.median(w):6.2f} "
              f"[p25 {w[q]:6.2f}, p75 {w[-q - 1]:6.2f}]  process CPU median {statistics.median(cpu[on]):6.2f}")
    ratio = statistics.median(wall[True]) / statistics.median(wall[False])
    print(f"  on/off wall ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
