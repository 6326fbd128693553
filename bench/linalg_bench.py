"""Compile and run time of the lowered linear algebra rows on the XLA device vs eager CPU.

Usage: .venv/bin/python bench/linalg_bench.py
Prints, per op and matrix size, the first call (trace + compile + run) and the median of 5 further
calls (graph cached) on XLA, and eager CPU's median.
"""
import statistics
import time

import torch
import torch_xla


def _time(fn, reps=5):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    dev = torch_xla.device()
    torch.manual_seed(0)
    print(f"{'op':<28}{'n':>5}{'xla first (s)':>15}{'xla cached (ms)':>17}{'eager (ms)':>12}")
    for n in (8, 16, 64):
        a = torch.randn(16, n, n, dtype=torch.float32)
        spd = a @ a.mT + n * torch.eye(n)
        b = torch.randn(16, n, 4)
        cases = {
            "linalg.cholesky": (lambda x, y: torch.linalg.cholesky(x), spd),
            "linalg.solve_triangular": (lambda x, y: torch.linalg.solve_triangular(x, y, upper=False), spd),
            "linalg.inv": (lambda x, y: torch.linalg.inv(x), a),
            "linalg.solve": (lambda x, y: torch.linalg.solve(x, y), a),
            "linalg.det": (lambda x, y: torch.linalg.det(x), a),
        }
        for name, (f, m) in cases.items():
            mx, bx = m.to(dev), b.to(dev)
            t0 = time.perf_counter()
            f(mx, bx).cpu()
            first = time.perf_counter() - t0
            cached = _time(lambda: f(mx, bx).cpu())
            eager = _time(lambda: f(m, b))
            print(f"{name:<28}{n:>5}{first:>15.2f}{cached * 1e3:>17.2f}{eager * 1e3:>12.2f}")


if __name__ == "__main__":
    main()
