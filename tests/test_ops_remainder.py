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


# ---------------------------------------------------------------- indexing and reductions
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.bool])
def test_scatter_reduce(reduce, include_self, dtype):
    if dtype == torch.bool and reduce == "mean":
        pytest.skip("eager: not implemented for Bool")
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(6, 4, generator=g) * 5).to(dtype)
    src = (torch.randn(5, 4, generator=g) * 5).to(dtype)
    if dtype == torch.float32:
        x[0, 0], src[1, 2], src[2, 3] = math.nan, math.nan, -0.0
    idx = torch.tensor([[0, 1, 0, 5], [0, 1, 2, 5], [3, 3, 2, 1], [0, 0, 0, 0], [4, 1, 2, 0]])
    check(lambda a, i, s: a.scatter_reduce(0, i, s, reduce, include_self=include_self), x, idx, src,
          rtol=1e-5, atol=1e-5, no_fallback=("scatter_reduce",))
    check(lambda a, i, s: a.scatter_reduce(1, i[:, :2] % 4, s, reduce, include_self=include_self), x, idx, src,
          rtol=1e-5, atol=1e-5, no_fallback=("scatter_reduce",))


def test_scatter_reduce_mean_floor_and_grad():
    x = torch.tensor([-7, 7, -1, 0])
    check(lambda a: a.scatter_reduce(0, torch.tensor([0, 0, 1, 2], device=a.device),
                                     torch.tensor([2, -4, 1, -6], device=a.device), "mean"), x, exact=True)
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        x = torch.randn(5, 3)
        src = torch.randn(4, 3)
        idx = torch.tensor([[0, 1, 2], [0, 1, 4], [3, 3, 2], [1, 0, 0]])
        grads = []
        for dev in ("cpu", X):
            a, s = x.to(dev).requires_grad_(), src.to(dev).requires_grad_()
            out = a.scatter_reduce(0, idx.to(dev), s, reduce, include_self=False)
            grads.append([t.cpu() for t in torch.autograd.grad(out.sum(), (a, s))])
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="index"):
        torch.zeros(3, device=X).scatter_reduce(0, torch.tensor([3], device=X), torch.ones(1, device=X), "sum").cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_cummax_cummin(dtype):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, math.nan, 5.0, math.nan, 0.0], [0.0, -0.0, 0.0, -1.0, -1.0, 4.0, 4.0, -5.0]])
    if dtype != torch.float32:
        x = x.nan_to_num(7.0).to(dtype)
    for fn in (torch.cummax, torch.cummin):
        for d in (0, 1, -1):
            check(lambda t: fn(t, d), x, exact=True, no_fallback=(fn.__name__,))
    check(lambda t: torch.cummax(t, 0), torch.tensor(3.0).to(dtype), exact=True)
    if dtype == torch.float32:
        y = torch.randn(4, 6)
        for fn in (torch.cummax, torch.cummin):
            a, b = y.clone().requires_grad_(), y.to(X).requires_grad_()
            ga = torch.autograd.grad(fn(a, 1)[0].sum(), a)[0]
            gb = torch.autograd.grad(fn(b, 1)[0].sum(), b)[0].cpu()
            torch.testing.assert_close(gb, ga)


def test_aminmax():
    x = torch.tensor([[1.0, math.nan, -2.0], [0.5, 4.0, -0.0]])
    check(torch.aminmax, x, exact=True, no_fallback=("aminmax",))
    check(lambda t: torch.aminmax(t, dim=1, keepdim=True), x, exact=True, no_fallback=("aminmax",))
    check(lambda t: torch.aminmax(t, dim=0), torch.tensor([[True, False], [True, True]]), exact=True,
          no_fallback=("aminmax",))
    with pytest.raises(RuntimeError):
        torch.aminmax(torch.zeros(0, 3, device=X))


def test_index_copy_put_masked_scatter():
    x = torch.randn(5, 3)
    check(lambda t: t.index_copy(0, torch.tensor([4, 0], device=t.device), torch.ones(2, 3, device=t.device)), x,
          exact=True, no_fallback=("index_copy",))
    check(lambda t: t.index_copy(1, torch.tensor([2], device=t.device), torch.ones(5, 1, device=t.device)), x,
          exact=True, no_fallback=("index_copy",))
    with pytest.raises(IndexError, match="index_copy"):
        x.to(X).index_copy(0, torch.tensor([5], device=X), torch.ones(1, 3, device=X)).cpu()
    idx, src = torch.tensor([[0, -1], [3, 3]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    check(lambda t, i, s: t.put(i, s, accumulate=True), x, idx, src, exact=True, no_fallback=("put",))
    check(lambda t, i, s: t.put(i[:, :1].flatten(), s[:, 0]), x, idx, src, exact=True, no_fallback=("put",))
    y = x.to(X)
    y.put_(torch.tensor([-15, 14], device=X), torch.tensor([9.0, 8.0], device=X))
    torch.testing.assert_close(y.cpu(), x.clone().put_(torch.tensor([-15, 14]), torch.tensor([9.0, 8.0])))
    with pytest.raises(IndexError):
        x.to(X).put(torch.tensor([15], device=X), torch.tensor([1.0], device=X)).cpu()
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True], [False, True, False],
                         [False, False, False]])
    src = torch.arange(10.0).reshape(2, 5)
    check(lambda t, m, s: t.masked_scatter(m, s), x, mask, src, exact=True, no_fallback=("masked_scatter",))
    check(lambda t, m, s: t.masked_scatter(m, s), x[0], mask, src, exact=True, no_fallback=("masked_scatter",))
    with pytest.raises(RuntimeError, match="masked_scatter"):
        x.to(X).masked_scatter(mask.to(X), torch.ones(3, device=X)).cpu()


def test_renorm_diag_embed_addbmm():
    x = torch.randn(4, 3, 5) * 3
    for p, dim, mx in ((2.0, 0, 2.0), (1.0, 1, 5.0), (math.inf, -1, 1.0), (3.0, 2, 0.5)):
        check(lambda t: torch.renorm(t, p, dim, mx), x, rtol=1e-5, atol=1e-5, no_fallback=("renorm",))
    for off, d1, d2 in ((0, -2, -1), (2, 0, 2), (-1, 1, 0), (-3, 3, 1)):
        check(lambda t: torch.diag_embed(t, off, d1, d2), x, exact=True, no_fallback=("diag_embed",))
    m, b1, b2 = torch.randn(3, 5), torch.randn(4, 3, 2), torch.randn(4, 2, 5)
    check(lambda a, b, c: torch.addbmm(a, b, c, beta=0.5, alpha=2), m, b1, b2, rtol=1e-5, atol=1e-5,
          no_fallback=("addbmm",))
    check(lambda a, b, c: torch.addbmm(a, b, c, beta=0), m * math.nan, b1, b2, rtol=1e-5, atol=1e-5,
          no_fallback=("addbmm",))


def test_huber_pixel_channel_shuffle():
    x, t = torch.randn(4, 5) * 3, torch.randn(4, 5)
    for red in ("none", "mean", "sum"):
        for delta in (0.5, 1.0, 2.5):
            f = lambda a, b: torch.nn.functional.huber_loss(a, b, reduction=red, delta=delta)  # noqa: E731
            check(f, x, t, rtol=1e-5, atol=1e-5, no_fallback=("huber_loss",))
            a, b = x.clone().requires_grad_(), x.to(X).requires_grad_()
            ga = torch.autograd.grad(f(a, t).sum(), a)[0]
            gb = torch.autograd.grad(f(b, t.to(X)).sum(), b)[0].cpu()
            torch.testing.assert_close(gb, ga)
    y = torch.randn(2, 18, 3, 4)
    check(lambda v: torch.nn.functional.pixel_shuffle(v, 3), y, exact=True, no_fallback=("pixel_shuffle",))
    check(lambda v: torch.nn.functional.pixel_unshuffle(v, 2), y.reshape(2, 9, 6, 4), exact=True,
          no_fallback=("pixel_unshuffle",))
    check(lambda v: torch.nn.functional.channel_shuffle(v, 3), y, exact=True, no_fallback=("channel_shuffle",))


# ---------------------------------------------------------------- pooling and resampling
def _grad_check(fn, x, rtol=1e-5, atol=2e-5):
    outs = []
    for dev in ("cpu", X):
        a = x.detach().clone().to(dev).requires_grad_()
        y = fn(a)
        w = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(dev)
        outs.append((y.detach().cpu(), torch.autograd.grad((y * w).sum(), a)[0].cpu()))
    torch.testing.assert_close(outs[1], outs[0], rtol=rtol, atol=atol, equal_nan=True)


def test_pool3d_and_adaptive():
    F = torch.nn.functional
    x = torch.randn(2, 3, 7, 6, 5)
    x[0, 0, 1, 1, 1] = math.nan
    x[1, 2, 3, 3, 3] = math.inf
    check(lambda t: F.max_pool3d(t, 3, 2, 1, return_indices=True), x, exact=True,
          no_fallback=("max_pool3d_with_indices",))
    check(lambda t: F.max_pool3d(t, (2, 3, 2), (1, 2, 2), 0, 2, ceil_mode=True), x, exact=True)
    y = torch.randn(2, 3, 7, 6, 5)
    _grad_check(lambda t: F.max_pool3d(t, 3, 2, 1), y)
    for kw in (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, ceil_mode=True, count_include_pad=False),
               dict(kernel_size=3, stride=1, padding=1, divisor_override=5)):
        check(lambda t: F.avg_pool3d(t, **kw), y, rtol=1e-5, atol=1e-5, no_fallback=("avg_pool3d",))
        _grad_check(lambda t: F.avg_pool3d(t, **kw), y)
    for os in ((3, 2, 4), (7, 6, 5), (1, 1, 1), (2, 4, 3)):
        check(lambda t: F.adaptive_avg_pool3d(t, os), y, rtol=1e-5, atol=1e-5, no_fallback=("_adaptive_avg_pool3d",))
        _grad_check(lambda t: F.adaptive_avg_pool3d(t, os), y)
    z = torch.randn(2, 3, 7, 9)
    z[0, 0, 2, 2] = math.nan
    z[1, 1, :, :] = 1.0  # ties: the first position wins
    for os in ((3, 4), (7, 9), (1, 1), (5, 2)):
        check(lambda t: F.adaptive_max_pool2d(t, os, return_indices=True), z, exact=True,
              no_fallback=("adaptive_max_pool2d",))
        _grad_check(lambda t: F.adaptive_max_pool2d(t, os), torch.randn(2, 3, 7, 9))


def test_upsample_linear_trilinear_bicubic():
    F = torch.nn.functional
    x1, x3, x2 = torch.randn(2, 3, 7), torch.randn(1, 2, 3, 4, 5), torch.randn(2, 3, 5, 6)
    for ac in (False, True):
        for size in (4, 11):
            f = lambda t: F.interpolate(t, size=size, mode="linear", align_corners=ac)  # noqa: E731
            check(f, x1, rtol=1e-5, atol=1e-5, no_fallback=("upsample_linear1d",))
            _grad_check(f, x1)
        f = lambda t: F.interpolate(t, size=(5, 3, 8), mode="trilinear", align_corners=ac)  # noqa: E731
        check(f, x3, rtol=1e-5, atol=1e-5, no_fallback=("upsample_trilinear3d",))
        _grad_check(f, x3)
        for size in ((9, 4), (3, 13)):
            f = lambda t: F.interpolate(t, size=size, mode="bicubic", align_corners=ac)  # noqa: E731
            check(f, x2, rtol=1e-5, atol=1e-5, no_fallback=("upsample_bicubic2d",))
            _grad_check(f, x2)
    f = lambda t: F.interpolate(t, scale_factor=1.7, mode="bicubic")  # noqa: E731
    check(f, x2, rtol=1e-5, atol=1e-5, no_fallback=("upsample_bicubic2d",))
    x2[0, 0, 2, 2] = math.inf  # eager's arithmetic: a zero weight times inf is NaN, as on the CPU
    check(lambda t: F.interpolate(t, size=(10, 12), mode="bicubic"), x2, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- random fills
def test_random_fills_distributions():
    torch.manual_seed(0)
    before = {n: met.counter_value(f"aten::{n}") or 0 for n in ("exponential", "cauchy", "geometric", "log_normal")}
    e = torch.empty(20000, device=X).exponential_(2.0).cpu()
    assert e.min() >= 0 and abs(e.mean().item() - 0.5) < 0.03
    c = torch.empty(20000, device=X).cauchy_(1.0, 2.0).cpu()
    assert abs(c.median().item() - 1.0) < 0.1 and abs((c - 1).abs().median().item() - 2.0) < 0.15
    g = torch.empty(20000, device=X, dtype=torch.int64).geometric_(0.25).cpu()
    assert g.dtype == torch.int64 and g.min() >= 1 and abs(g.float().mean().item() - 4.0) < 0.15
    ln = torch.empty(20000, device=X, dtype=torch.float64).log_normal_(0.5, 0.3).cpu()
    assert ln.dtype == torch.float64 and abs(ln.log().mean().item() - 0.5) < 0.02 and abs(ln.log().std().item() - 0.3) < 0.02
    for n, v in before.items():
        assert (met.counter_value(f"aten::{n}") or 0) == v, f"aten::{n} ran on the CPU fallback"
    for bad, msg in ((lambda t: t.exponential_(-1.0), "lambda > 0"), (lambda t: t.geometric_(1.5), r"p to be in \(0, 1\)"),
                     (lambda t: t.log_normal_(1.0, -1.0), "std > 0"), (lambda t: t.cauchy_(0.0, 0.0), "sigma > 0")):
        with pytest.raises(RuntimeError, match=msg):
            bad(torch.empty(3, device=X))
    with pytest.raises(RuntimeError, match="floating point"):
        torch.empty(3, dtype=torch.int64, device=X).exponential_()


def test_multinomial():
    torch.manual_seed(0)
    before = met.counter_value("aten::multinomial") or 0
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    m = torch.multinomial(p.to(X), 20000, True).cpu()
    assert m.dtype == torch.int64 and m.shape == (20000,)
    torch.testing.assert_close(torch.bincount(m, minlength=4) / 20000, p, atol=0.015, rtol=0)
    m = torch.multinomial(torch.stack([p] * 4000).to(X), 3).cpu()
    assert m.shape == (4000, 3) and all(len(set(r)) == 3 for r in m.tolist())
    first = torch.bincount(m[:, 0], minlength=4) / 4000
    torch.testing.assert_close(first, p, atol=0.025, rtol=0)
    assert (met.counter_value("aten::multinomial") or 0) == before
    with pytest.raises(RuntimeError, match="element < 0"):
        torch.multinomial(torch.tensor([1.0, -1.0], device=X), 1).cpu()
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        torch.multinomial(torch.zeros(3, device=X), 1, True).cpu()
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(torch.ones(3, device=X), 4)


# ---------------------------------------------------------------- search, unpool, group norm backward
def test_bucketize_searchsorted():
    b = torch.tensor([1.0, 2.0, 2.0, 3.0])
    x = torch.tensor([[math.nan, 2.0, 0.0], [5.0, -math.inf, 3.0]])
    for right in (False, True):
        for int32 in (False, True):
            check(lambda t, s: torch.bucketize(t, s, right=right, out_int32=int32), x, b, exact=True,
                  no_fallback=("bucketize",))
            check(lambda s, t: torch.searchsorted(s, t, right=right, out_int32=int32), b, x, exact=True,
                  no_fallback=("searchsorted",))
    seq = torch.sort(torch.randn(3, 6), dim=1).values
    vals = torch.randn(3, 4)
    check(lambda s, t: torch.searchsorted(s, t, side="right"), seq, vals, exact=True, no_fallback=("searchsorted",))
    perm = torch.argsort(torch.randn(3, 6), dim=1)
    unsorted = seq.gather(1, torch.argsort(perm, dim=1))
    check(lambda s, t, p: torch.searchsorted(s, t, sorter=p), unsorted, vals, perm, exact=True,
          no_fallback=("searchsorted",))
    check(lambda s: torch.searchsorted(s, 2), b, exact=True, no_fallback=("searchsorted",))
    check(lambda s: torch.searchsorted(s, 2.5, right=True), torch.tensor([1, 2, 3, 4]), exact=True)


def test_max_unpool():
    F = torch.nn.functional
    x = torch.randn(2, 3, 6, 8)
    y, i = F.max_pool2d(x, 2, return_indices=True)
    check(lambda a, b: F.max_unpool2d(a, b, 2), y, i, exact=True, no_fallback=("max_unpool2d",))
    check(lambda a, b: F.max_unpool2d(a, b, 2, output_size=(7, 9)), y, i, exact=True, no_fallback=("max_unpool2d",))
    x3 = torch.randn(1, 2, 4, 4, 6)
    y3, i3 = F.max_pool3d(x3, 2, return_indices=True)
    check(lambda a, b: F.max_unpool3d(a, b, 2), y3, i3, exact=True, no_fallback=("max_unpool3d",))
    with pytest.raises(RuntimeError, match="invalid max index"):
        F.max_unpool2d(y.to(X), (i + 100).to(X), 2).cpu()


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_backward(affine):
    x = torch.randn(3, 6, 5, 4) * 2 + 1
    gn = torch.nn.GroupNorm(3, 6, affine=affine)
    if affine:
        with torch.no_grad():
            gn.weight.normal_()
            gn.bias.normal_()
    before = met.counter_value("aten::native_group_norm_backward") or 0
    res = []
    for dev in ("cpu", X):
        m = gn.to(dev)
        a = x.to(dev).requires_grad_()
        out = m(a)
        w = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(dev)
        params = [a] + ([m.weight, m.bias] if affine else [])
        res.append([g.cpu() for g in torch.autograd.grad((out * w).sum(), params)])
    torch.testing.assert_close(res[1], res[0], rtol=1e-5, atol=2e-5)
    assert (met.counter_value("aten::native_group_norm_backward") or 0) == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_frexp_exact_including_denormals(dtype):
    x = torch.tensor([0.0, -0.0, 1.0, -3.5, math.inf, -math.inf, math.nan, 1e-40, -1e-45, 3e38, 0.75, 6e-5, 1e-7])
    check(torch.frexp, x.to(dtype), exact=True, no_fallback=("frexp",))
    a = torch.randn(8, requires_grad=True)
    b = a.detach().to(X).requires_grad_()
    torch.testing.assert_close(torch.autograd.grad(torch.frexp(b)[0].sum(), b)[0].cpu(),
                               torch.autograd.grad(torch.frexp(a)[0].sum(), a)[0])


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(mode, padding_mode, align_corners):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 7, generator=g)
    grid = torch.rand(2, 4, 6, 2, generator=g) * 2.6 - 1.3  # some points outside [-1, 1]
    f = lambda a, b: torch.nn.functional.grid_sample(a, b, mode=mode, padding_mode=padding_mode,  # noqa: E731
                                                     align_corners=align_corners)
    check(f, x, grid, rtol=1e-5, atol=1e-5, no_fallback=("grid_sampler_2d",))
    res = []
    for dev in ("cpu", X):
        a, b = x.to(dev).requires_grad_(), grid.to(dev).requires_grad_()
        out = f(a, b)
        w = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(dev)
        res.append([t.cpu() for t in torch.autograd.grad((out * w).sum(), (a, b))])
    torch.testing.assert_close(res[1], res[0], rtol=1e-5, atol=2e-5)


def test_grid_sample_reflection_stays_on_cpu():
    x, grid = torch.randn(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1
    before = met.counter_value("aten::grid_sampler_2d") or 0
    check(lambda a, b: torch.nn.functional.grid_sample(a, b, padding_mode="reflection", align_corners=False),
          x, grid, rtol=1e-5, atol=1e-5)
    assert (met.counter_value("aten::grid_sampler_2d") or 0) == before + 1


# ---------------------------------------------------------------- rows upstream lowers (its yaml)
def test_prelu_kernel_and_backward():
    x = torch.tensor([[-2.0, -0.0, 0.0, 3.0], [math.nan, -math.inf, math.inf, -1.0]]).reshape(2, 4, 1)
    for w in (torch.tensor([0.25]), torch.tensor([0.1, -0.5, 2.0, 0.0])):
        check(torch.nn.functional.prelu, x, w, exact=True, no_fallback=("_prelu_kernel",))
        y = torch.randn(3, 4, 5)
        res = []
        for dev in ("cpu", X):
            a, b = y.to(dev).requires_grad_(), w.to(dev).requires_grad_()
            out = torch.nn.functional.prelu(a, b)
            res.append([t.cpu() for t in torch.autograd.grad((out * out).sum(), (a, b))])
        torch.testing.assert_close(res[1], res[0], rtol=1e-5, atol=1e-5)


def test_normal_tensor_overloads_narrow_copy_new_empty_strided():
    torch.manual_seed(0)
    before = met.counter_value("aten::normal") or 0
    mean = torch.linspace(-5, 5, 4).repeat(5000).to(X)
    std = torch.tensor([0.5, 1.0, 2.0, 0.0]).repeat(5000).to(X)
    for out, m, s in ((torch.normal(mean, 2.0), mean, torch.full((20000,), 2.0)),
                      (torch.normal(1.5, std), torch.full((20000,), 1.5), std),
                      (torch.normal(mean, std), mean, std)):
        z = out.cpu().reshape(5000, 4)
        torch.testing.assert_close(z.mean(0), m.cpu()[:4], atol=0.1, rtol=0)
        torch.testing.assert_close(z.std(0), s.cpu()[:4], atol=0.06, rtol=0.05)
    assert (met.counter_value("aten::normal") or 0) == before
    with pytest.raises(RuntimeError, match="std >= 0"):
        torch.normal(mean, -std - 1).cpu()
    x = torch.randn(4, 6)
    check(lambda t: torch.narrow_copy(t, 1, 2, 3), x, exact=True, no_fallback=("narrow_copy",))
    check(lambda t: torch.narrow_copy(t, 0, -2, 2), x, exact=True, no_fallback=("narrow_copy",))
    e = x.to(X).new_empty_strided((2, 3), (1, 2), dtype=torch.float64)
    assert e.shape == (2, 3) and e.dtype == torch.float64 and e.device.type == "xla"


def test_integer_dtypes_eager_refuses_raise_as_eager():
    F = torch.nn.functional
    x = torch.arange(2 * 3 * 4 * 4 * 4).reshape(2, 3, 4, 4, 4)
    for f in (lambda t: F.adaptive_avg_pool3d(t, 2), lambda t: F.adaptive_max_pool2d(t[0], 2),
              lambda t: F.max_unpool2d(t[0], torch.zeros(3, 4, 4, 4, dtype=torch.long, device=t.device), 2),
              lambda t: F.huber_loss(t, t)):
        with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
            f(x)
        with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
            f(x.to(X))
    check(lambda t: F.max_pool3d(t, 2), x, exact=True)
    check(lambda t: F.avg_pool3d(t, 2), x, exact=True, no_fallback=("avg_pool3d",))
    check(lambda t: F.avg_pool3d(t, 3, 2, 1), x - 50, exact=True, no_fallback=("avg_pool3d",))  # truncation
