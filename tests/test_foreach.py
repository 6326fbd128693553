"""Foreach ops (issue #12, host time): `torch._foreach_*` on xla tensors is one dispatch per list
(csrc/ops/rows_foreach.cc), not one per tensor, with eager CPU's values, dtypes and errors."""
import pytest
import torch

import torch_xla
import torch_xla.debug.metrics as met

D = torch_xla.device()


def _lists(dtype=torch.float32, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (5,), ()][:n]
    if dtype.is_floating_point:
        return [torch.randn(s, generator=g).to(dtype) for s in shapes]
    return [torch.randint(-5, 6, s, generator=g).to(dtype) for s in shapes]


def _x(ts):
    return [t.to(D) for t in ts]


def _same(got, want, dtype=None):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.device.type == "xla"
        tol = dict(rtol=1.6e-2, atol=1e-2) if b.dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a.cpu(), b, equal_nan=True, **tol)


CASES = [
    # (name, builder(lists, scalars) -> args)
    ("_foreach_add.Scalar", lambda a, b, c: (a, 2.5)),
    ("_foreach_add.ScalarList", lambda a, b, c: (a, [1.0, -2.0, 0.5])),
    ("_foreach_add.List", lambda a, b, c: (a, b)),
    ("_foreach_add.List_alpha", lambda a, b, c: (a, b, dict(alpha=-0.5))),
    ("_foreach_sub.Scalar", lambda a, b, c: (a, 1.5)),
    ("_foreach_sub.List", lambda a, b, c: (a, b, dict(alpha=2))),
    ("_foreach_mul.Scalar", lambda a, b, c: (a, 0.9)),
    ("_foreach_mul.ScalarList", lambda a, b, c: (a, [2.0, 3.0, -1.0])),
    ("_foreach_mul.List", lambda a, b, c: (a, b)),
    ("_foreach_div.Scalar", lambda a, b, c: (a, 3.0)),
    ("_foreach_div.ScalarList", lambda a, b, c: (a, [2.0, 4.0, -8.0])),
    ("_foreach_div.List", lambda a, b, c: (a, b)),
    ("_foreach_maximum.List", lambda a, b, c: (a, b)),
    ("_foreach_minimum.Scalar", lambda a, b, c: (a, 0.1)),
    ("_foreach_clamp_min.Scalar", lambda a, b, c: (a, -0.2)),
    ("_foreach_pow.Scalar", lambda a, b, c: (a, 2.0)),
    ("_foreach_lerp.Scalar", lambda a, b, c: (a, b, 0.3)),
    ("_foreach_lerp.List", lambda a, b, c: (a, b, c)),
    ("_foreach_addcmul.Scalar", lambda a, b, c: (a, b, c, dict(value=0.25))),
    ("_foreach_addcmul.ScalarList", lambda a, b, c: (a, b, c, [0.5, -1.0, 2.0])),
    ("_foreach_addcdiv.Scalar", lambda a, b, c: (a, b, c, dict(value=-0.1))),
    ("_foreach_addcdiv.ScalarList", lambda a, b, c: (a, b, c, [0.5, -1.0, 2.0])),
    ("_foreach_sqrt", lambda a, b, c: ([t.abs() for t in a],)),
    ("_foreach_neg", lambda a, b, c: (a,)),
    ("_foreach_reciprocal", lambda a, b, c: (a,)),
    ("_foreach_exp", lambda a, b, c: (a,)),
    ("_foreach_abs", lambda a, b, c: (a,)),
    ("_foreach_sign", lambda a, b, c: (a,)),
]


def _call(fn, args):
    kw = args[-1] if args and isinstance(args[-1], dict) else {}
    pos = args[:-1] if kw else args
    return fn(*pos, **kw)


def _to(args, f):
    out = []
    for a in args:
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            out.append(f(a))
        else:
            out.append(a)
    return tuple(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_foreach_functional_and_inplace_match_eager(name, dtype):
    build = dict(CASES)[name]
    a, b, c = _lists(dtype, seed=1), _lists(dtype, seed=2), [t.abs() + 0.5 for t in _lists(dtype, seed=3)]
    args = build(a, b, c)
    base = name.split(".")[0]
    want = _call(getattr(torch, base), args)
    got = _call(getattr(torch, base), _to(args, _x))
    _same(got, want)
    # in place, through functionalization
    inplace = getattr(torch, base + "_", None)
    if inplace is None:
        return
    cpu_args = _to(args, lambda l: [t.clone() for t in l])
    xla_args = _to(args, _x)
    _call(inplace, cpu_args)
    _call(inplace, xla_args)
    _same(xla_args[0], cpu_args[0])


def test_one_dispatch_per_list():
    a, b = _x(_lists(n=3)), _x(_lists(n=3, seed=5))
    torch_xla.sync()
    before_fe, before_add = met.counter_value("xla::_foreach_add") or 0, met.counter_value("xla::add") or 0
    torch._foreach_add_(a, b, alpha=0.5)
    assert (met.counter_value("xla::_foreach_add") or 0) == before_fe + 1
    assert (met.counter_value("xla::add") or 0) == before_add  # no per-tensor dispatch
    torch_xla.sync()


def test_integer_lists_and_promotion():
    a = _lists(torch.int64)
    _same(torch._foreach_add(_x(a), 2), torch._foreach_add(a, 2))
    _same(torch._foreach_mul(_x(a), 0.5), torch._foreach_mul(a, 0.5))  # int * float -> float
    assert torch._foreach_mul(_x(a), 0.5)[0].dtype == torch.float32
    _same(torch._foreach_div(_x(a), 2), torch._foreach_div(a, 2))


def test_errors_match_eager():
    a, b = _lists(), _lists(n=2)
    with pytest.raises(RuntimeError) as e_cpu:
        torch._foreach_add(a, b)
    with pytest.raises(RuntimeError) as e_xla:
        torch._foreach_add(_x(a), _x(b))
    assert "same number of" in str(e_cpu.value) and "same number of" in str(e_xla.value)
    ints = _lists(torch.int64)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_add_(ints, 0.5)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_add_(_x(ints), 0.5)


def test_list_with_a_cpu_scalar_uses_the_per_tensor_kernel():
    a = _lists()
    cpu_scalar = torch.tensor(3.0)
    xs = _x(a[:2]) + [cpu_scalar.clone()]
    want = torch._foreach_add(a[:2] + [cpu_scalar], 1.0)
    got = torch._foreach_add(xs, 1.0)
    assert got[2].device.type == "cpu" and got[0].device.type == "xla"
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_foreach_norm_and_clip_grad_norm():
    a = _lists(seed=7)
    _same(torch._foreach_norm(_x(a)), torch._foreach_norm(a))
    _same(torch._foreach_norm(_x(a), 1), torch._foreach_norm(a, 1))
    ps_cpu = [torch.nn.Parameter(t.clone()) for t in a]
    ps_xla = [torch.nn.Parameter(t.to(D)) for t in a]
    for p, q in zip(ps_cpu, ps_xla):
        p.grad = p.detach() * 3
        q.grad = q.detach() * 3
    # torch lists no foreach support for xla devices (as with upstream), so the default path is per tensor
    n_cpu = torch.nn.utils.clip_grad_norm_(ps_cpu, 1.0)
    n_xla = torch.nn.utils.clip_grad_norm_(ps_xla, 1.0)
    torch.testing.assert_close(n_xla.cpu(), n_cpu)
    _same([q.grad for q in ps_xla], [p.grad for p in ps_cpu])


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_foreach_optimizers_match_eager(opt):
    def run(device):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)
        o = (torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True) if opt == "adamw"
             else torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                  foreach=True))
        x = torch.randn(4, 8).to(device)
        for _ in range(4):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
            if device != "cpu":
                torch_xla.sync()
        return [p.detach().cpu() for p in m.parameters()]
    for p, q in zip(run(D), run("cpu")):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# ---- the in-place foreach Functionalize kernel (csrc/bridge/functionalize.cc): the meta replay is
# skipped for a call whose metadata passed before; everything else is the generated kernel's.

def test_inplace_errors_come_back_every_call():
    ints = _x(_lists(torch.int64))
    for _ in range(3):  # a refused call is never remembered
        with pytest.raises(RuntimeError, match="can't be cast"):
            torch._foreach_add_(ints, 0.5)
    a, b = _x(_lists()), _x(_lists(n=2))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="same number of"):
            torch._foreach_add_(a, b)
    # a broadcast that would resize self: eager refuses the in-place op, every time
    small, big = [torch.ones(3).to(D)], [torch.ones(2, 3).to(D)]
    ok = [torch.ones(2, 3).to(D)]
    torch._foreach_add_(ok, small)  # accepted and remembered
    for _ in range(2):
        with pytest.raises(RuntimeError):
            torch._foreach_add_(small, big)
    with pytest.raises(RuntimeError):
        torch._foreach_add_([torch.ones(3)], [torch.ones(2, 3)])  # eager's refusal too
    torch.testing.assert_close(ok[0].cpu(), torch.full((2, 3), 2.0))


def test_inplace_same_metadata_then_another_dtype():
    a = _lists()
    xa = _x(a)
    for k in range(3):
        torch._foreach_mul_(xa, 0.5)
        torch._foreach_mul_(a, 0.5)
    _same(xa, a)
    # the same shapes in float64 promote differently with an int list argument: a new key
    d = [t.double() for t in _lists()]
    xd = _x(d)
    ints = _lists(torch.int64)
    torch._foreach_add_(xd, _x(ints))
    torch._foreach_add_(d, ints)
    _same(xd, d)
    assert xd[0].dtype == torch.float64
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_add_(_x(ints), xd)  # int self, float64 other: refused


def test_inplace_on_parameters_and_their_aliases():
    base = [torch.randn(4, 3), torch.randn(5)]
    xb = _x(base)
    ps = [torch.nn.Parameter(t) for t in xb]  # detach views of xb
    with torch.no_grad():
        for _ in range(2):
            torch._foreach_mul_(ps, 2.0)
            torch._foreach_addcdiv_(ps, xb, [t.abs() + 1 for t in xb], value=0.1)
    want = [t.clone() for t in base]
    for _ in range(2):
        torch._foreach_mul_(want, 2.0)
        torch._foreach_addcdiv_(want, want, [t.abs() + 1 for t in want], value=0.1)
    _same(ps, want)
    _same(xb, want)  # the base sees every write through its parameter
    torch.testing.assert_close(ps[0].cpu().stride(), (3, 1))


def test_inplace_non_dense_and_overlapping_self():
    # a transposed self keeps eager's values; an expanded (overlapping) self is refused as in eager
    t = torch.randn(3, 4)
    xt = t.to(D)
    v, xv = t.t(), xt.t()
    torch._foreach_add_([v], [torch.ones(4, 3)])
    torch._foreach_add_([xv], [torch.ones(4, 3).to(D)])
    torch.testing.assert_close(xt.cpu(), t)
    e_cpu, e_xla = torch.zeros(1, 3).expand(2, 3), torch.zeros(1, 3).to(D).expand(2, 3)
    with pytest.raises(RuntimeError) as cpu_err:
        torch._foreach_add_([e_cpu], 1.0)
    for _ in range(2):
        with pytest.raises(RuntimeError) as xla_err:
            torch._foreach_add_([e_xla], 1.0)
    assert "memory location" in str(cpu_err.value) and "memory location" in str(xla_err.value)


def test_inplace_foreach_kernel_off_gives_the_same(tmp_path):
    import subprocess, sys, textwrap
    code = textwrap.dedent("""
        import torch, torch_xla
        D = torch_xla.device()
        g = torch.Generator().manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(4, 3, generator=g).to(D)) for _ in range(3)]
        st = [torch.zeros(4, 3).to(D) for _ in range(3)]
        with torch.no_grad():
            for i in range(3):
                torch._foreach_lerp_(st, ps, 0.1)
                torch._foreach_mul_(ps, 0.99)
                torch._foreach_addcdiv_(ps, st, [s.abs() + 1 for s in st], value=-0.01)
        torch_xla.sync()
        print(repr([p.cpu().tolist() for p in ps]))
    """)
    outs = []
    for env in ("1", "0"):
        import os
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "TXLA_FOREACH_FUNCTIONALIZE": env}, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout.strip().splitlines()[-1])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_lerp_number_weight_bit_equal(dtype):
    # lerp with a number weight picks eager's branch (|w| < 0.5) on the host: bit-equal to eager
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(500, generator=g) * 10).to(dtype), (torch.randn(500, generator=g) * 10).to(dtype)
    for w in (-0.7, 0.3, 0.49999997, 0.5, 0.75, 1.5, 1 / 3, float("nan")):
        want = torch.lerp(a, b, w)
        got = torch.lerp(a.to(D), b.to(D), w).cpu()
        assert torch.equal(want.nan_to_num(), got.nan_to_num()), (dtype, w)
        assert torch.equal(want.isnan(), got.isnan())
        want_l = torch._foreach_lerp([a, b], [b, a], w)
        got_l = torch._foreach_lerp([a.to(D), b.to(D)], [b.to(D), a.to(D)], w)
        for x, y in zip(got_l, want_l):
            assert torch.equal(x.cpu().nan_to_num(), y.nan_to_num()), (dtype, w)
