"""Issue #8, op-lowering remainder: special values, integer dtypes and gradients of the rows in
csrc/ops/rows_special.cc (and later groups), compared with eager CPU. Each case also checks that the
op ran natively (no CPU fallback for it)."""

import math

import pytest
import torch
import torch_xla  # noqa: F401
import torch_xla.debug.metrics as met

X = "xla"
SPECIAL = [0.0, -0.0, 1.0, 2.0, -1.0, -2.0, -2.5, 0.5, math.inf, -math.inf, math.nan, 1e-30, 30.0, 1e10, -1e-3,
           171.5, 1e30]


def _sp(dtype=torch.float32):
    return torch.tensor(SPECIAL).to(dtype)


def _to(t):
    return t.to(X) if isinstance(t, torch.Tensor) else t


def _cpu(t):
    if isinstance(t, torch.Tensor):
        return t.cpu()
    return type(t)(_cpu(x) for x in t)


def check(fn, *args, rtol=None, atol=None, exact=False, no_fallback=()):
    """fn on CPU and on xla: same values (NaN positions, signed zeros when exact), dtype, shape."""
    expected = fn(*args)
    before = {n: met.counter_value(f"aten::{n}") or 0 for n in no_fallback}
    actual = _cpu(fn(*[_to(a) for a in args]))
    for n in no_fallback:
        assert (met.counter_value(f"aten::{n}") or 0) == before[n], f"aten::{n} ran on the CPU fallback"
    if exact:
        for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                        expected if isinstance(expected, tuple) else (expected,)):
            assert a.dtype == e.dtype and a.shape == e.shape
            if a.is_floating_point():
                bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
                same = (a.view(bits) == e.view(bits)) | (a.isnan() & e.isnan())
                assert bool(same.all()), f"{a} != {e}"
            else:
                assert torch.equal(a, e), f"{a} != {e}"
        return
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("name", ["lgamma", "digamma", "erfc", "sinc", "special.entr"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool])
def test_unary_special_values(name, dtype):
    fn = eval(f"torch.{name}")
    base = name.split(".")[-1]
    x = _sp() if dtype not in (torch.int64, torch.bool) else torch.arange(-4, 5)
    x = x.to(dtype)
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    check(fn, x, no_fallback=(base,), **tol)
    if dtype == torch.float32:
        check(fn, torch.randn(200) * 6, no_fallback=(base,), rtol=1e-5, atol=1e-5)


def test_digamma_poles_signed_zero():
    check(torch.digamma, torch.tensor([0.0, -0.0, -1.0, -7.0, -math.inf, math.inf]), exact=True,
          no_fallback=("digamma",))
    check(torch.lgamma, torch.tensor([0.0, -0.0, -1.0, -7.0, -math.inf, math.inf, 1.0, 2.0]), exact=True,
          no_fallback=("lgamma",))


@pytest.mark.parametrize("n", [0, 1])
def test_polygamma(n):
    x = torch.cat([torch.randn(100) * 5, _sp()])
    check(lambda t: torch.polygamma(n, t), x, rtol=1e-5, atol=1e-5, no_fallback=("polygamma",))
    check(lambda t: torch.special.polygamma(n, t), torch.arange(-3, 4), rtol=1e-5, atol=1e-5,
          no_fallback=("polygamma",))
    y = torch.rand(5) + 0.5
    ref = y.clone().polygamma_(n)
    got = y.to(X).polygamma_(n).cpu()  # argument order differs from polygamma's: functionalized by hand
    torch.testing.assert_close(got, ref)


def test_polygamma_higher_orders_on_cpu():
    # n >= 2 needs eager's Hurwitz zeta for x <= 0 (CHLO's is NaN there): the CPU fallback, same values.
    x = torch.randn(50) * 4
    check(lambda t: torch.polygamma(3, t), x, rtol=1e-5, atol=1e-5)


def test_gradients_lgamma_digamma():
    x = torch.rand(20) * 5 + 0.1
    for fn in (torch.lgamma, torch.digamma, torch.erfc, torch.sinc):
        c = x.clone().requires_grad_()
        g = torch.autograd.grad(fn(c).sum(), c)[0]
        xx = x.to(X).requires_grad_()
        gx = torch.autograd.grad(fn(xx).sum(), xx)[0].cpu()
        torch.testing.assert_close(gx, g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.uint8, torch.bool])
def test_signbit(dtype):
    x = torch.cat([_sp(), -torch.tensor([math.nan])]) if dtype.is_floating_point else torch.arange(-3, 4).to(dtype)
    check(torch.signbit, x.to(dtype), exact=True, no_fallback=("signbit",))


def test_copysign():
    nan_neg = -torch.tensor([math.nan])
    x = _sp()
    check(torch.copysign, x, x.flip(0), exact=True, no_fallback=("copysign",))
    check(torch.copysign, x, nan_neg, exact=True, no_fallback=("copysign",))
    check(lambda a: torch.copysign(a, -0.0), x, exact=True, no_fallback=("copysign",))
    check(lambda a: torch.copysign(a, -3.14), x.bfloat16(), exact=True, no_fallback=("copysign",))
    check(torch.copysign, torch.arange(-3, 3), torch.tensor(-1.0), exact=True, no_fallback=("copysign",))
    a = torch.randn(6, requires_grad=True)
    b = torch.randn(6)
    ax = a.detach().to(X).requires_grad_()
    torch.autograd.grad(torch.copysign(a, b).sum(), a)[0]
    torch.testing.assert_close(torch.autograd.grad(torch.copysign(ax, b.to(X)).sum(), ax)[0].cpu(),
                               torch.autograd.grad(torch.copysign(a, b).sum(), a)[0])


def test_heaviside_xlog1py_entr_nextafter():
    x = _sp()
    check(torch.heaviside, x, torch.tensor([7.0]), exact=True, no_fallback=("heaviside",))
    check(torch.heaviside, torch.arange(-3, 3), torch.tensor([7]), exact=True, no_fallback=("heaviside",))
    check(torch.heaviside, torch.tensor([True, False]), torch.tensor([True, True]), exact=True,
          no_fallback=("heaviside",))
    with pytest.raises(RuntimeError, match="different dtypes"):
        torch.heaviside(x.to(X), torch.tensor([7]).to(X))
    check(torch.special.xlog1py, x, x.flip(0), rtol=1e-5, atol=1e-5, no_fallback=("special_xlog1py",))
    check(lambda a: torch.special.xlog1py(a, 2.0), x, rtol=1e-5, atol=1e-5, no_fallback=("special_xlog1py",))
    check(lambda a: torch.special.xlog1py(3, a), x, rtol=1e-5, atol=1e-5, no_fallback=("special_xlog1py",))
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        check(torch.nextafter, x.to(dt), x.flip(0).to(dt), exact=True, no_fallback=("nextafter",))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_lcm(dtype):
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype == torch.uint8 else -1000
    a, b = torch.randint(lo, 1000, (200,), generator=g), torch.randint(lo, 1000, (200,), generator=g)
    b[:5] = 0
    a[3:8] = 0
    check(torch.gcd, a.to(dtype), b.to(dtype), exact=True, no_fallback=("gcd",))
    check(torch.lcm, a.to(dtype), b.to(dtype), exact=True, no_fallback=("lcm",))


def test_gcd_worst_case_and_extremes():
    fib = [1, 1]
    while fib[-1] + fib[-2] < 2**63:
        fib.append(fib[-1] + fib[-2])
    f = torch.tensor(fib)
    check(torch.gcd, f[1:], f[:-1], exact=True, no_fallback=("gcd",))  # the longest Euclid runs
    check(torch.gcd, torch.tensor([2**62 + 1, 2**61 * 3, -2**63]), torch.tensor([2**62, 2**60 * 5, 6]), exact=True)
    with pytest.raises(RuntimeError, match="not implemented"):
        torch.gcd(torch.ones(2, device=X), torch.ones(2, device=X))
