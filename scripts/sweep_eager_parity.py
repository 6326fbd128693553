"""Sweeps that compare our results with eager CPU over whole families of ops (issue #7).

Each prints the cases that differ (op, dtype, inputs, ours, eager's) and a count; none is a test:
run them after changing lowerings, and turn what they find into regression tests.

  .venv/bin/python scripts/sweep_eager_parity.py NAME [NAME ...]   (or: all)
  denormal-inputs      every unary/binary ufunc OpInfo on denormal inputs (f32/bf16/f16/f64) vs eager
  denormal-results     ufuncs on inputs whose eager results are denormal (exp, erfc, softplus, ...)
  int-extremes         ufuncs over each integer dtype with its min/max, -1, 0 and shift-sized values
  strides              result strides of every OpInfo's first samples (contiguous inputs) vs eager
  zero-dim-promotion   binary ufuncs over dtype pairs with 0-dim operands: dtype, values, exception type
"""
import sys
import warnings

import torch
import torch_xla

warnings.filterwarnings("ignore")

def denormal_inputs():
    from torch.testing._internal.common_methods_invocations import unary_ufuncs, binary_ufuncs
    d = torch_xla.device()
    TINY = {torch.float32: [1e-40, -1e-40, 3e-39, 1e-45, 1.1e-38, -5e-39],
            torch.float64: [1e-310, -1e-310, 3e-320, 5e-324, 2e-308],
            torch.bfloat16: [1e-39, -1e-39, 5e-40, 1e-38],
            torch.float16: [3e-6, -3e-6, 6e-8, 5e-5]}
    TOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 1e-2, torch.float16: 1e-3}
    def cmp(a, b, dt):
        if a.dtype != b.dtype or a.shape != b.shape: return False
        if a.dtype.is_floating_point:
            return torch.allclose(a.double(), b.double(), rtol=TOL[dt], atol=0, equal_nan=True)
        return torch.equal(a, b)
    bad = []
    for op in unary_ufuncs:
        for dt in TINY:
            if dt not in op.supported_dtypes('cpu'): continue
            c = torch.tensor(TINY[dt], dtype=dt)
            try:
                b = op.op(c)
            except Exception: continue
            try:
                a = op.op(c.to(d))
            except Exception as e:
                bad.append((op.name, str(dt), 'ERR ' + str(e)[:80])); continue
            if isinstance(b, tuple): b, a = b[0], a[0]
            a = a.cpu()
            if not cmp(a, b, dt):
                bad.append((op.name, str(dt), a.tolist(), b.tolist()))
    for op in binary_ufuncs:
        for dt in TINY:
            if dt not in op.supported_dtypes('cpu'): continue
            c = torch.tensor(TINY[dt], dtype=dt)
            for other in [torch.full_like(c, 2.0), torch.full_like(c, -0.5), c.flip(0)]:
                try:
                    b = op.op(c, other)
                except Exception: continue
                try:
                    a = op.op(c.to(d), other.to(d))
                except Exception as e:
                    bad.append((op.name, str(dt), 'ERR ' + str(e)[:80])); continue
                a = a.cpu()
                if not cmp(a, b, dt):
                    bad.append((op.name, str(dt), other[0].item(), a.tolist(), b.tolist()))
    for x in bad: print(x)
    print(len(bad), 'bad')

def denormal_results():
    from torch.testing._internal.common_methods_invocations import unary_ufuncs, binary_ufuncs
    d = torch_xla.device()
    grid = torch.cat([torch.linspace(-110, 110, 2201, dtype=torch.float64), torch.tensor([1e-20, 3e-20, -1e-20, 1e-39, 1e-30, 1e-25, 1e-19])])
    TINYN = {torch.float32: 2.0**-126, torch.float64: 2.0**-1022, torch.bfloat16: 2.0**-126}
    def check(name, a, b, dt):
        b = b.double(); a = a.double()
        den = (b.abs() < TINYN[dt]) & (b != 0)
        bad = den & ~torch.isclose(a, b, rtol=2e-2 if dt == torch.bfloat16 else 1e-4, atol=0)
        if bad.any():
            i = bad.nonzero()[0].item()
            print(name, dt, int(bad.sum()), 'e.g. idx', i, a[i].item(), b[i].item())
    for op in unary_ufuncs:
        if op.name.startswith('_refs'): continue
        for dt in [torch.float32, torch.bfloat16, torch.float64]:
            if dt not in op.supported_dtypes('cpu'): continue
            c = grid.to(dt) if dt != torch.float64 else grid * 8
            try: b = op.op(c)
            except Exception: continue
            if isinstance(b, tuple) or not b.dtype.is_floating_point: continue
            try: a = op.op(c.to(d)).cpu()
            except Exception as e: print(op.name, dt, 'ERR', str(e)[:60]); continue
            check(op.name, a, b, dt)
    g2 = torch.tensor([1e-20, 3e-21, 2.0, -2.0, 0.5, 1e-10, 1e-30, 7.0, 1e20, 1e-38, 1e-35], dtype=torch.float64)
    A, B = torch.meshgrid(g2, g2, indexing='ij')
    for op in binary_ufuncs:
        if op.name.startswith('_refs'): continue
        for dt in [torch.float32, torch.bfloat16]:
            if dt not in op.supported_dtypes('cpu'): continue
            a0, b0 = A.to(dt).flatten(), B.to(dt).flatten()
            try: r = op.op(a0, b0)
            except Exception: continue
            if not r.dtype.is_floating_point: continue
            try: x = op.op(a0.to(d), b0.to(d)).cpu()
            except Exception as e: print(op.name, dt, 'ERR', str(e)[:60]); continue
            check(op.name, x, r, dt)
    print('done')

def int_extremes():
    from torch.testing._internal.common_methods_invocations import unary_ufuncs, binary_ufuncs, op_db
    d = torch_xla.device()
    INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
    def vals(dt):
        info = torch.iinfo(dt)
        v = [info.min, info.min + 1, -1, 0, 1, 2, 7, info.max - 1, info.max, 63, 64, 31, 32, 8, 100, -100]
        v = [x for x in v if info.min <= x <= info.max]
        return torch.tensor(v, dtype=dt)
    bad = []
    def cmp(a, b):
        if a.dtype != b.dtype or a.shape != b.shape: return False
        if a.is_floating_point():
            return torch.allclose(a.double(), b.double(), rtol=1e-5, atol=0, equal_nan=True)
        return torch.equal(a, b)
    for op in unary_ufuncs:
        if op.name.startswith('_refs'): continue
        for dt in INTS:
            if dt not in op.supported_dtypes('cpu'): continue
            c = vals(dt)
            try: b = op.op(c)
            except Exception as e: b = e
            try: a = op.op(c.to(d)); a = a.cpu() if isinstance(a, torch.Tensor) else a
            except Exception as e: a = e
            if isinstance(b, Exception) or isinstance(a, Exception):
                if type(a) != type(b): bad.append((op.name, str(dt), 'exc', type(b).__name__, type(a).__name__, str(a)[:80]))
                continue
            if isinstance(b, tuple): continue
            if not cmp(a, b):
                m = ~(a == b) if a.shape == b.shape else None
                bad.append((op.name, str(dt), c[m].tolist()[:4] if m is not None else '', a[m].tolist()[:4] if m is not None else a.dtype, b[m].tolist()[:4] if m is not None else b.dtype))
    for op in binary_ufuncs:
        if op.name.startswith('_refs'): continue
        for dt in INTS:
            if dt not in op.supported_dtypes('cpu'): continue
            c = vals(dt)
            A, B = torch.meshgrid(c, c, indexing='ij')
            A, B = A.flatten(), B.flatten()
            keep = ~((A == torch.iinfo(dt).min) & (B == -1))  # eager's CPU kernels trap (SIGFPE) there
            if op.name in ('lcm', 'gcd'):
                keep = keep & (A != torch.iinfo(dt).min) & (B != torch.iinfo(dt).min)
            A, B = A[keep], B[keep]
            try: b = op.op(A, B)
            except Exception as e: b = e
            try: a = op.op(A.to(d), B.to(d)); a = a.cpu()
            except Exception as e: a = e
            if isinstance(b, Exception) or isinstance(a, Exception):
                if type(a) != type(b): bad.append((op.name, str(dt), 'exc', type(b).__name__, type(a).__name__, str(a)[:80]))
                continue
            if not cmp(a, b):
                if a.shape != b.shape or a.dtype != b.dtype: bad.append((op.name, str(dt), a.dtype, b.dtype)); continue
                m = ~(torch.isclose(a.double(), b.double(), rtol=1e-5, atol=0, equal_nan=True) if a.is_floating_point() else (a == b))
                bad.append((op.name, str(dt), int(m.sum()), list(zip(A[m].tolist()[:3], B[m].tolist()[:3])), a[m].tolist()[:3], b[m].tolist()[:3]))
    for x in bad: print(x)
    print(len(bad), 'bad')

def strides():
    from torch.testing._internal.common_methods_invocations import op_db
    d = torch_xla.device()
    def to(x, dev):
        if isinstance(x, torch.Tensor): return x.to(dev)
        if isinstance(x, (list, tuple)): return type(x)(to(y, dev) for y in x)
        if isinstance(x, dict): return {k: to(v, dev) for k, v in x.items()}
        return x
    def outs(r):
        if isinstance(r, torch.Tensor): return [r]
        if isinstance(r, (list, tuple)): return [t for t in r if isinstance(t, torch.Tensor)]
        return []
    bad = []
    for op in op_db:
        if op.name.startswith('_refs') or 'sparse' in op.name: continue
        if torch.float32 not in op.supported_dtypes('cpu'): continue
        try:
            samples = list(op.sample_inputs('cpu', torch.float32))[:4]
        except Exception: continue
        for s in samples:
            try:
                torch.manual_seed(0)
                r = op(s.input, *s.args, **s.kwargs)
            except Exception: continue
            try:
                torch.manual_seed(0)
                rx = op(to(s.input, d), *to(s.args, d), **to(s.kwargs, d))
            except Exception: continue
            for a, b in zip(outs(rx), outs(r)):
                if a.dim() != b.dim() or a.numel() <= 1: continue
                if a.shape != b.shape: continue
                if a.stride() != b.stride():
                    # only count when the difference is observable: contiguity or view legality
                    bad.append((op.name, tuple(b.shape), b.stride(), a.stride()))
                    break
            else:
                continue
            break
    seen = set()
    for x in bad:
        print(x)
    print(len(bad))

def zero_dim_promotion():
    from torch.testing._internal.common_methods_invocations import binary_ufuncs
    d = torch_xla.device()
    DT = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64]
    def mk(dt, shape):
        if dt == torch.bool: return (torch.arange(torch.Size(shape).numel()) % 2 == 0).reshape(shape)
        return (torch.arange(torch.Size(shape).numel()) % 5 + 1).to(dt).reshape(shape)
    bad = []
    for op in binary_ufuncs:
        if op.name.startswith('_refs'): continue
        for A in DT:
            for B in DT:
                for sa, sb in [((4,), ()), ((), (4,)), ((), ())]:
                    a, b = mk(A, sa), mk(B, sb)
                    try: r = op.op(a, b)
                    except Exception as e: r = e
                    try: x = op.op(a.to(d), b.to(d)); x = x.cpu()
                    except Exception as e: x = e
                    if isinstance(r, Exception) or isinstance(x, Exception):
                        if type(r) != type(x): bad.append((op.name, A, B, sa, sb, 'exc', type(r).__name__, type(x).__name__, str(x)[:60]))
                        continue
                    if r.dtype != x.dtype or r.shape != x.shape:
                        bad.append((op.name, A, B, sa, sb, 'dtype', r.dtype, x.dtype)); continue
                    if r.is_floating_point():
                        ok = torch.allclose(r.double(), x.double(), rtol=1e-2, atol=1e-3, equal_nan=True)
                    else:
                        ok = torch.equal(r, x)
                    if not ok: bad.append((op.name, A, B, sa, sb, 'val', r.tolist(), x.tolist()))
    for b in bad: print(b)
    print(len(bad))

SWEEPS = {"denormal-inputs": denormal_inputs, "denormal-results": denormal_results, "int-extremes": int_extremes, "strides": strides, "zero-dim-promotion": zero_dim_promotion}

if __name__ == "__main__":
    names = sys.argv[1:] or ["all"]
    if names == ["all"]:
        names = list(SWEEPS)
    for n in names:
        if n not in SWEEPS:
            sys.exit(f"unknown sweep {n!r}; known: {', '.join(SWEEPS)}")
    for n in names:
        print(f"=== {n}", flush=True)
        SWEEPS[n]()
