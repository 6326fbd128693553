"""Tracing cost per op on the lazy XLA device vs one eager CPU op.

    python bench/bench_tracing.py [--device xla|cpu] [--ops 1000] [--size 128] [--repeats 3]

On xla, a chain of `--ops` elementwise aten ops (alternating `y * 1.0001` and
`y + 0.5`) on a size x size float tensor is recorded WITHOUT syncing; the time
divided by the number of ops is the host-side cost of tracing one op. The
pending graph is then cut by torch_xla.sync() outside the timed region (that
compile/execute time is reported separately, for information).
The same ops run eagerly on the CPU give the baseline. With --device cpu only
the CPU figure is printed and torch_xla is never imported.
"""

from __future__ import annotations

import argparse
import time
import timeit

import torch


def trace_chain(y: torch.Tensor, n_ops: int) -> torch.Tensor:
    """n_ops elementwise aten ops, alternating mul and add (one aten op each)."""
    for i in range(n_ops):
        y = y * 1.0001 if i % 2 == 0 else y + 0.5
    return y


def eager_us_per_op(size: int, reps: int) -> float:
    """Mean µs of one eager CPU elementwise op (same mix of mul/add, same shape)."""
    y = torch.randn(size, size)
    timer = timeit.Timer(lambda: trace_chain(y, 2))
    timer.timeit(number=max(1, reps // 10))  # warm up
    best = min(timer.repeat(repeat=3, number=reps))
    return best / (2 * reps) * 1e6


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["xla", "cpu"], default="xla")
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="timed traces on xla (best is reported)")
    p.add_argument("--eager-reps", type=int, default=2000)
    args = p.parse_args(argv)

    cpu_us = eager_us_per_op(args.size, args.eager_reps)
    print(f"eager CPU   : {cpu_us:8.2f} us/op  ({args.size}x{args.size} float32, best of 3 x {args.eager_reps} op pairs)")
    result = {"cpu_us_per_op": cpu_us}
    if args.device == "cpu":
        return result

    import torch_xla

    device = torch_xla.device()
    y0 = torch.randn(args.size, args.size).to(device)
    torch_xla.sync()
    trace_chain(y0, 50)  # warm up the Python/C++ tracing path once
    torch_xla.sync()

    trace_us, sync_s = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        y = trace_chain(y0, args.ops)  # recorded only, nothing executes
        t1 = time.perf_counter()
        torch_xla.sync()  # outside the timed region: clears the pending graph
        y.cpu()  # wait for the result so the next trace starts from an idle device
        t2 = time.perf_counter()
        trace_us.append((t1 - t0) / args.ops * 1e6)
        sync_s.append(t2 - t1)

    best = min(trace_us)
    print(f"xla tracing : {best:8.2f} us/op  (best of {args.repeats}: "
          + ", ".join(f"{v:.2f}" for v in trace_us) + f"; chain of {args.ops} ops)")
    print("xla sync    : " + ", ".join(f"{s * 1e3:.1f}" for s in sync_s)
          + " ms per sync+fetch (first includes compile, later ones should hit the cache)")
    print(f"ratio       : tracing one op costs {best / cpu_us:.1f}x an eager CPU op")
    result.update(xla_trace_us_per_op=best, ratio=best / cpu_us, sync_s=sync_s)
    return result


if __name__ == "__main__":
    main()
