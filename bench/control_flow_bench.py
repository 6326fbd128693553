"""Structured control flow: first call (trace + compile + run) and cached call of a loop written as
fori_loop (one stablehlo.while) vs the same Python loop unrolled into the graph, and the LU-based
linear algebra above 16 x 16 (a While over the columns). The trip count of fori_loop is a graph
input (a cached scalar), so a new trip count reuses the executable: only the first line's "first"
includes a compile. Eager times are the best of 3 calls. Usage:

    .venv/bin/python bench/control_flow_bench.py
"""
import time

import torch
import torch_xla
from torch_xla.experimental.fori_loop import fori_loop

DEV = torch_xla.device()


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    w = torch.randn(64, 64, device=DEV) * 0.1

    def body(x):
        return torch.tanh(x @ w) + x

    for n in (10, 100, 1000):
        def rolled():
            _, y = fori_loop(n, 0, body, torch.ones(8, 64, device=DEV))
            y.cpu()

        def unrolled():
            y = torch.ones(8, 64, device=DEV)
            for _ in range(n):
                y = body(y)
            y.cpu()

        first, again = timed(rolled), timed(rolled)
        line = f"trip count {n:5d}: fori_loop first {first:6.2f} s, cached {again * 1e3:7.1f} ms"
        if n <= 100:
            ufirst, uagain = timed(unrolled), timed(unrolled)
            line += f" | unrolled first {ufirst:6.2f} s, cached {uagain * 1e3:7.1f} ms"
        print(line, flush=True)
    for n in (32, 64, 128):
        a = torch.randn(4, n, n, dtype=torch.float64) + n * torch.eye(n, dtype=torch.float64)
        b = torch.randn(4, n, 2, dtype=torch.float64)
        ax, bx = a.to(DEV), b.to(DEV)
        for name, f, fe in [("inv", lambda: torch.linalg.inv(ax).cpu(), lambda: torch.linalg.inv(a)),
                            ("solve", lambda: torch.linalg.solve(ax, bx).cpu(), lambda: torch.linalg.solve(a, b)),
                            ("det", lambda: torch.linalg.det(ax).cpu(), lambda: torch.linalg.det(a)),
                            ("qr", lambda: torch.linalg.qr(ax)[1].cpu(), lambda: torch.linalg.qr(a))]:
            first, again, eager = timed(f), timed(f), min(timed(fe) for _ in range(3))
            print(f"n = {n:3d} {name:5s}: first {first:5.2f} s, cached {again * 1e3:7.1f} ms, eager {eager * 1e3:6.2f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
