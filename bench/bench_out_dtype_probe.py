#!/usr/bin/env python3
"""Cost of the eager out= dtype probe (csrc/bridge/out_dtype_check.cc), XLA tracing per op on 8
floats, min of 5 x n calls, with TXLA_OUT_DTYPE_PROBE=1 and =0 in alternating child processes:
  plain     x.mul(y)                          (no out=: never reaches the check)
  same      torch.mul(x, y, out=o)            (out's dtype equals the inputs': no meta, no probe)
  widen     torch.add(x, 1, out=o64)          (float32 into float64: meta + cached probe verdict)
  first     the first torch.neg(x, out=o64) of the process (meta + uncached probe, then raises)
  scalar    torch.add(x, s, out=o64) with a Python float s that changes at every call (a decaying
            learning rate): keyed by value, every call missed the cache and paid the probe; keyed by
            its value class (csrc/bridge/out_dtype_check.cc ValueClass), it pays it once.
            TXLA_OUT_PROBE_VALUE_KEYS=1 measures the value keys.

    .venv/bin/python bench/bench_out_dtype_probe.py [--runs 3]
"""
import argparse
import os
import subprocess
import sys
import time


def measure():
    import torch
    import torch_xla

    d = torch_xla.device()
    x, y = torch.ones(8, device=d), torch.ones(8, device=d)
    o, o64 = torch.ones(8, device=d), torch.ones(8, dtype=torch.float64, device=d)

    def bench(f, n=3000):
        for _ in range(100):
            f()
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            best = min(best, (time.perf_counter() - t0) / n)
            torch_xla.sync()
        return best * 1e6

    res = [bench(lambda: x.mul(y)), bench(lambda: torch.mul(x, y, out=o)), bench(lambda: torch.add(x, 1, out=o64))]
    lr = [0.1]

    def decaying():
        lr[0] *= 0.999
        torch.add(x, lr[0], out=o64)

    t0 = time.perf_counter()
    try:
        torch.neg(x, out=o64)
    except RuntimeError:
        pass
    res.append((time.perf_counter() - t0) * 1e6)
    res.append(bench(decaying, n=300))  # after `first`: with value keys its probes would warm the CPU path
    print(" ".join(f"{r:.3f}" for r in res))


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
            env = dict(os.environ, TXLA_OUT_DTYPE_PROBE=v)
            out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True,
                                 check=True).stdout.split()
            res[v].append(tuple(map(float, out[-5:])))
    for v, name in (("1", "probe on "), ("0", "probe off")):
        m = [min(r[i] for r in res[v]) for i in range(5)]
        print(f"{name}: plain {m[0]:.2f} us, same-dtype out= {m[1]:.2f} us, widening out= {m[2]:.2f} us, "
              f"first refused out= {m[3]:.0f} us, widening out= with a changing scalar {m[4]:.1f} us "
              f"(min of {args.runs} runs)")


if __name__ == "__main__":
    sys.exit(main())
