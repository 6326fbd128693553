#!/usr/bin/env python3
"""Cost of the in-place overlap check (csrc/bridge/inplace_overlap.cc): `x.mul_(y)` on 8 floats, on
the CPU (eager: the check's kernel only adds a call and a device test) and on the XLA device (tracing
only; one sync per repetition), with TXLA_INPLACE_OVERLAP_CHECK=1 and =0, alternating runs. Also the
out= dtype check (csrc/bridge/out_dtype_check.cc): `torch.mul(x, y, out=o)` with
TXLA_OUT_DTYPE_CHECK=1 and =0.

    .venv/bin/python bench/bench_inplace_overlap.py [--runs 3]
"""
import argparse
import os
import subprocess
import sys
import time


def measure():
    import torch
    import torch_xla

    def bench(dev, n, out=False):
        x = torch.ones(8, device=dev)
        y = torch.ones(8, device=dev)
        o = torch.ones(8, device=dev)
        f = (lambda: torch.mul(x, y, out=o)) if out else (lambda: x.mul_(y))
        for _ in range(200):
            f()
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter() - t0) / n)
            if dev != "cpu":
                torch_xla.sync()
        return best * 1e6

    print(f"{bench('cpu', 20000):.3f} {bench(torch_xla.device(), 5000):.3f} "
          f"{bench('cpu', 20000, True):.3f} {bench(torch_xla.device(), 5000, True):.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return measure()
    res = {"1": [], "0": []}
    for _ in range(args.runs):
        for v in ("1", "0"):
            env = dict(os.environ, TXLA_INPLACE_OVERLAP_CHECK=v, TXLA_OUT_DTYPE_CHECK=v)
            out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True,
                                 check=True).stdout.split()
            res[v].append(tuple(map(float, out[-4:])))
    for v, name in (("1", "check on "), ("0", "check off")):
        cpu = min(r[0] for r in res[v])
        xla = min(r[1] for r in res[v])
        print(f"{name}: x.mul_(y) CPU {cpu:.2f} us, XLA tracing {xla:.2f} us (min of {args.runs} runs)")
        cpu = min(r[2] for r in res[v])
        xla = min(r[3] for r in res[v])
        print(f"{name}: torch.mul(x, y, out=o) CPU {cpu:.2f} us, XLA tracing {xla:.2f} us")


if __name__ == "__main__":
    main()
