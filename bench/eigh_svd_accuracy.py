"""Accuracy and time of the lowered eigh / SVD rows (XLA device) against eager CPU (LAPACK).

Usage: .venv/bin/python bench/eigh_svd_accuracy.py
Per dtype and size (batch 4 of random matrices; eigh on A + A^T, the SVD of its first 3n/4
columns while m + n <= 128, the lowered size): the largest error of the
eigenvalues / singular values relative to the matrix's largest, the reconstruction residual
max|V diag(w) V^T - A| / max|A| (U diag(S) V^H for the SVD), max|Q^T Q - I| of the vectors, for
ours and for LAPACK's own result; then the first call (trace + compile + run) and the median of 3
cached calls on XLA, and eager's median.
"""
import statistics
import time

import torch
import torch_xla


def _med(fn, reps=3):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _orth(q):
    eye = torch.eye(q.shape[-1], dtype=q.dtype)
    return (q.mT @ q - eye).abs().max().item()


def main():
    dev = torch_xla.device()
    g = torch.Generator().manual_seed(0)
    print(f"{'op':<5}{'dtype':>9}{'n':>5}{'vals err':>11}{'resid':>10}{'lapack':>10}{'orth':>10}{'lapack':>10}"
          f"{'first s':>9}{'cached ms':>11}{'eager ms':>10}")
    for dt in (torch.float32, torch.float64):
        for n in (8, 32, 64, 128):
            a = torch.randn(4, n, n, dtype=dt, generator=g)
            s = a + a.mT
            scale = s.abs().max().item()
            ew, ev = torch.linalg.eigh(s)
            sx = s.to(dev)
            t0 = time.perf_counter()
            w, v = (t.cpu() for t in torch.linalg.eigh(sx))
            first = time.perf_counter() - t0
            cached = _med(lambda: [t.cpu() for t in torch.linalg.eigh(sx)])
            eager = _med(lambda: torch.linalg.eigh(s))
            res = ((v @ torch.diag_embed(w) @ v.mT - s).abs().max() / scale).item()
            lres = ((ev @ torch.diag_embed(ew) @ ev.mT - s).abs().max() / scale).item()
            print(f"{'eigh':<5}{str(dt)[6:]:>9}{n:>5}{((w - ew).abs().max() / ew.abs().max()).item():>11.1e}"
                  f"{res:>10.1e}{lres:>10.1e}{_orth(v):>10.1e}{_orth(ev):>10.1e}{first:>9.2f}{cached * 1e3:>11.1f}"
                  f"{eager * 1e3:>10.2f}")
            m = a[..., :, : n * 3 // 4]  # tall
            if n + n * 3 // 4 > 128:  # above the lowered size: LAPACK on the CPU fallback
                continue
            scale = m.abs().max().item()
            eu, es, evh = torch.linalg.svd(m, full_matrices=False)
            mx = m.to(dev)
            t0 = time.perf_counter()
            u, sv, vh = (t.cpu() for t in torch.linalg.svd(mx, full_matrices=False))
            first = time.perf_counter() - t0
            cached = _med(lambda: [t.cpu() for t in torch.linalg.svd(mx, full_matrices=False)])
            eager = _med(lambda: torch.linalg.svd(m, full_matrices=False))
            res = ((u @ torch.diag_embed(sv) @ vh - m).abs().max() / scale).item()
            lres = ((eu @ torch.diag_embed(es) @ evh - m).abs().max() / scale).item()
            print(f"{'svd':<5}{str(dt)[6:]:>9}{n:>5}{((sv - es).abs().max() / es.max()).item():>11.1e}"
                  f"{res:>10.1e}{lres:>10.1e}{max(_orth(u), _orth(vh.mT)):>10.1e}"
                  f"{max(_orth(eu), _orth(evh.mT)):>10.1e}{first:>9.2f}{cached * 1e3:>11.1f}{eager * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
