"""Linear algebra and special-function rows (csrc/ops/rows_linalg.cc) against eager CPU: values, dtypes,
shapes, gradients, LAPACK's info codes and eager's errors for matrices that are not positive-definite."""

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met

DEV = torch_xla.device()


def _pd(*batch, n=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*batch, n, n, dtype=dtype, generator=g)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)


def _no_fallback(before, *names):
    for n in names:
        assert met.counter_value("aten::" + n) == before.get(n), f"{n} ran on the CPU fallback"


def _counts(*names):
    return {n: met.counter_value("aten::" + n) for n in names}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_values(dtype, upper):
    a = _pd(3, 2, n=6, dtype=dtype)
    before = _counts("linalg_cholesky_ex")
    l, info = torch.linalg.cholesky_ex(a.to(DEV), upper=upper)
    el, einfo = torch.linalg.cholesky_ex(a, upper=upper)
    torch.testing.assert_close(l.cpu(), el)
    assert info.dtype == einfo.dtype and torch.equal(info.cpu(), einfo)
    _no_fallback(before, "linalg_cholesky_ex")


def test_cholesky_ex_info_not_positive_definite():
    a = _pd(6, n=7)
    a[1, 2, 2] = -5          # minor of order 3 fails
    a[2, 0, 0] = -1          # order 1
    a[3, 6, 6] = -100        # order 7 (the last)
    a[4, 3, 3] = float("nan")  # NaN on the diagonal: LAPACK stops there
    a[5, 4, 4] = 0.0
    a[5, 4, :4] = 0.0
    a[5, :4, 4] = 0.0        # an exactly zero pivot of order 5
    for upper in (False, True):
        _, einfo = torch.linalg.cholesky_ex(a, upper=upper)
        _, info = torch.linalg.cholesky_ex(a.to(DEV), upper=upper)
        assert info.cpu().tolist() == einfo.tolist()
    assert einfo.tolist() == [0, 3, 1, 7, 4, 5]


def test_cholesky_raises_linalg_error():
    a = _pd(n=4)
    a[2, 2] = -3
    with pytest.raises(torch.linalg.LinAlgError) as exc:
        torch.linalg.cholesky(a)
    with pytest.raises(torch.linalg.LinAlgError) as xexc:
        torch.linalg.cholesky(a.to(DEV))
    assert str(xexc.value) == str(exc.value)


def test_cholesky_grad():
    a = _pd(2, n=4)
    w = torch.randn(2, 4, 4, dtype=torch.float64)
    for upper in (False, True):
        x = a.clone().requires_grad_()
        (torch.linalg.cholesky(x, upper=upper) * w).sum().backward()
        xx = a.to(DEV).requires_grad_()
        (torch.linalg.cholesky(xx, upper=upper) * w.to(DEV)).sum().backward()
        torch.testing.assert_close(xx.grad.cpu(), x.grad)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular_broadcast(upper, left, unit):
    a = torch.randn(2, 1, 4, 4, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)
    b = torch.randn(3, 4, 2, dtype=torch.float64)
    if not left:
        b = b.mT
    before = _counts("linalg_solve_triangular")
    x = torch.linalg.solve_triangular(a.to(DEV), b.to(DEV), upper=upper, left=left, unitriangular=unit)
    torch.testing.assert_close(x.cpu(), torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit))
    _no_fallback(before, "linalg_solve_triangular")


@pytest.mark.parametrize("transpose", [False, True])
def test_triangular_solve_and_grad(transpose):
    a = (torch.randn(3, 4, 4) + 4 * torch.eye(4)).requires_grad_()
    b = torch.randn(3, 4, 2).requires_grad_()
    ax = a.detach().to(DEV).requires_grad_()
    bx = b.detach().to(DEV).requires_grad_()
    s, c = torch.triangular_solve(b, a, upper=False, transpose=transpose)
    sx, cx = torch.triangular_solve(bx, ax, upper=False, transpose=transpose)
    torch.testing.assert_close(sx.cpu(), s)
    torch.testing.assert_close(cx.cpu(), c)
    s.sum().backward()
    sx.sum().backward()
    torch.testing.assert_close(ax.grad.cpu(), a.grad)
    torch.testing.assert_close(bx.grad.cpu(), b.grad)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(upper):
    f = torch.linalg.cholesky(_pd(2, n=4), upper=upper)
    b = torch.randn(2, 4, 3, dtype=torch.float64)
    before = _counts("_cholesky_solve_helper", "cholesky_inverse")
    torch.testing.assert_close(torch.cholesky_solve(b.to(DEV), f.to(DEV), upper=upper).cpu(),
                               torch.cholesky_solve(b, f, upper=upper))
    inv = torch.cholesky_inverse(f.to(DEV), upper=upper).cpu()
    torch.testing.assert_close(inv, torch.cholesky_inverse(f, upper=upper))
    assert torch.equal(inv, inv.mT)  # exactly symmetric, as eager's
    _no_fallback(before, "_cholesky_solve_helper", "cholesky_inverse")


def test_empty():
    for shape in [(0, 3, 3), (2, 0, 0)]:
        a = torch.zeros(shape)
        l, info = torch.linalg.cholesky_ex(a.to(DEV))
        el, einfo = torch.linalg.cholesky_ex(a)
        assert l.shape == el.shape and info.shape == einfo.shape and info.dtype == einfo.dtype


# ---- modified Bessel functions (csrc/ops/rows_bessel.cc)
_BESSEL = [torch.i0, torch.special.i0e, torch.special.i1, torch.special.i1e]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", _BESSEL, ids=lambda f: f.__name__)
def test_bessel_values(fn, dtype):
    special = [0.0, -0.0, 19.999, 20.0, 20.001, 88.5, 89.0, 91.0, 709.0, 711.0, 1e10,
               float("inf"), float("-inf"), float("nan")]
    x = torch.cat([torch.linspace(-30, 30, 601, dtype=torch.float64), torch.tensor(special, dtype=torch.float64),
                   -torch.tensor(special[5:], dtype=torch.float64)]).to(dtype)
    before = _counts(fn.__name__)
    got = fn(x.to(DEV)).cpu()
    _no_fallback(before, fn.__name__)
    want = fn(x)
    rtol = {torch.float64: 1e-13, torch.float32: 2e-6}.get(dtype, 1.6e-2)
    torch.testing.assert_close(got, want, rtol=rtol, atol=0, equal_nan=True)
    zero = x == 0
    assert torch.equal(torch.signbit(got[zero]), torch.signbit(want[zero]))  # i1(-0) = +0, as eager


@pytest.mark.parametrize("fn", _BESSEL, ids=lambda f: f.__name__)
def test_bessel_integer_input_and_grad(fn):
    k = torch.arange(-40, 40)
    torch.testing.assert_close(fn(k.to(DEV)).cpu(), fn(k), rtol=2e-6, atol=0)
    x = torch.linspace(-25, 25, 101, dtype=torch.float64).requires_grad_()
    xx = x.detach().to(DEV).requires_grad_()
    fn(x).sum().backward()
    fn(xx).sum().backward()
    torch.testing.assert_close(xx.grad.cpu(), x.grad, rtol=1e-12, atol=0)


# ---- histc (csrc/ops/rows_histc.cc)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_histc_bin_edges(dtype):
    g = torch.Generator().manual_seed(3)
    before = _counts("histc")
    for _ in range(25):
        bins = int(torch.randint(1, 12, (), generator=g))
        lo = float(torch.randn((), generator=g))
        hi = lo + float(torch.rand((), generator=g)) * 3
        # elements exactly on (and next to) the bin edges, where the rounding of eager's division decides
        edges = torch.linspace(lo, hi, bins + 1, dtype=dtype)
        x = torch.cat([edges, torch.nextafter(edges, edges + 1), torch.randn(30, generator=g).to(dtype) * 2])
        for args in [(bins, lo, hi), (bins, 0, 0)]:
            want = torch.histc(x, *args)
            got = torch.histc(x.to(DEV), *args).cpu()
            assert got.dtype == want.dtype and torch.equal(got, want), (args, got, want)
    _no_fallback(before, "histc")


def test_histc_special_cases():
    nan = float("nan")
    for x, args in [(torch.tensor([2.0, 2.0]), (4, 0, 0)), (torch.tensor([]), (4, 0, 0)), (torch.tensor(3.0), (5,)),
                    (torch.tensor([0.1, 0.2, 0.3, 0.7, nan], dtype=torch.float64), (3, 0.1, 0.7)),
                    (torch.randn(3, 4, 5), (13, -0.3, 0.3))]:
        torch.testing.assert_close(torch.histc(x.to(DEV), *args).cpu(), torch.histc(x, *args))
    with pytest.raises(RuntimeError, match="torch.histc: range of"):
        torch.histc(torch.tensor([1.0, float("inf")]).to(DEV), 4).cpu()
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(torch.ones(3).to(DEV), 4, 3, 1)


# ---- LU-based rows (unrolled partial-pivoting LU, n <= 16)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lu_family(dtype):
    g = torch.Generator().manual_seed(5)
    a = torch.randn(3, 6, 6, dtype=dtype, generator=g)
    b = torch.randn(3, 6, 2, dtype=dtype, generator=g)
    names = ("linalg_lu_factor_ex", "linalg_inv_ex", "_linalg_det", "_linalg_solve_ex", "linalg_lu_solve")
    before = _counts(*names)
    ax, bx = a.to(DEV), b.to(DEV)
    lu, piv, info = torch.linalg.lu_factor_ex(a)
    lux, pivx, infox = torch.linalg.lu_factor_ex(ax)
    torch.testing.assert_close(lux.cpu(), lu)
    assert torch.equal(pivx.cpu(), piv) and torch.equal(infox.cpu(), info)
    torch.testing.assert_close(torch.linalg.inv(ax).cpu(), torch.linalg.inv(a))
    torch.testing.assert_close(torch.linalg.det(ax).cpu(), torch.linalg.det(a))
    torch.testing.assert_close(torch.linalg.solve(ax, bx).cpu(), torch.linalg.solve(a, b))
    torch.testing.assert_close(torch.linalg.solve(ax, bx[..., 0]).cpu(), torch.linalg.solve(a, b[..., 0]))
    torch.testing.assert_close(torch.linalg.solve(ax, bx.mT, left=False).cpu(), torch.linalg.solve(a, b.mT, left=False))
    for left in (True, False):
        for adjoint in (True, False):
            rhs = b if left else b.mT
            torch.testing.assert_close(
                torch.linalg.lu_solve(lux, pivx, rhs.to(DEV), left=left, adjoint=adjoint).cpu(),
                torch.linalg.lu_solve(lu, piv, rhs, left=left, adjoint=adjoint))
    # rectangular factorizations
    for shape in [(4, 6), (6, 4)]:
        r = torch.randn(*shape, dtype=dtype, generator=g)
        lu_r, piv_r = torch.linalg.lu_factor(r)
        lux_r, pivx_r = torch.linalg.lu_factor(r.to(DEV))
        torch.testing.assert_close(lux_r.cpu(), lu_r)
        assert torch.equal(pivx_r.cpu(), piv_r)
    _no_fallback(before, *names)


def test_lu_singular_and_errors():
    s = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], dtype=torch.float64)
    lu, piv, info = torch.linalg.lu_factor_ex(s)
    lux, pivx, infox = torch.linalg.lu_factor_ex(s.to(DEV))
    torch.testing.assert_close(lux.cpu(), lu)
    assert torch.equal(pivx.cpu(), piv) and infox.item() == info.item() == 3
    assert torch.linalg.inv_ex(s.to(DEV)).info.item() == 3
    with pytest.raises(torch.linalg.LinAlgError) as exc:
        torch.linalg.inv(s)
    with pytest.raises(torch.linalg.LinAlgError) as xexc:
        torch.linalg.inv(s.to(DEV))
    assert str(xexc.value) == str(exc.value)
    torch.testing.assert_close(torch.linalg.det(s.to(DEV)).cpu(), torch.linalg.det(s))


@pytest.mark.parametrize("fn", ["det", "inv", "solve"])
def test_lu_grads(fn):
    g = torch.Generator().manual_seed(7)
    a = torch.randn(2, 4, 4, dtype=torch.float64, generator=g) + 3 * torch.eye(4, dtype=torch.float64)
    b = torch.randn(2, 4, 3, dtype=torch.float64, generator=g)
    f = {"det": lambda m, r: torch.linalg.det(m), "inv": lambda m, r: torch.linalg.inv(m),
         "solve": lambda m, r: torch.linalg.solve(m, r)}[fn]
    x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
    xx, yx = a.to(DEV).requires_grad_(), b.to(DEV).requires_grad_()
    f(x, y).sum().backward()
    f(xx, yx).sum().backward()
    torch.testing.assert_close(xx.grad.cpu(), x.grad)
    if y.grad is not None:
        torch.testing.assert_close(yx.grad.cpu(), y.grad)


# ---- above 16 x 16 the LU is one stablehlo.while over the columns (ir::ForLoop)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lu_family_large_matrices_in_a_while_loop(dtype):
    g = torch.Generator().manual_seed(11)
    n = 64
    a = torch.randn(2, n, n, dtype=dtype, generator=g)
    b = torch.randn(2, n, 3, dtype=dtype, generator=g)
    names = ("linalg_lu_factor_ex", "linalg_inv_ex", "_linalg_det", "_linalg_solve_ex", "linalg_lu_solve")
    before = _counts(*names)
    ax, bx = a.to(DEV), b.to(DEV)
    lu, piv, info = torch.linalg.lu_factor_ex(a)
    lux, pivx, infox = torch.linalg.lu_factor_ex(ax)
    assert '"stablehlo.while"' in torch_xla._XLAC._get_xla_tensors_hlo([lux])
    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(lux.cpu(), lu, **tol)
    assert torch.equal(pivx.cpu(), piv) and torch.equal(infox.cpu(), info)
    torch.testing.assert_close(torch.linalg.inv(ax).cpu(), torch.linalg.inv(a), **tol)
    torch.testing.assert_close(torch.linalg.det(ax).cpu(), torch.linalg.det(a), rtol=1e-3 if tol else 1e-7, atol=0)
    torch.testing.assert_close(torch.linalg.solve(ax, bx).cpu(), torch.linalg.solve(a, b), **tol)
    torch.testing.assert_close(torch.linalg.lu_solve(lux, pivx, bx).cpu(), torch.linalg.lu_solve(lu, piv, b), **tol)
    torch.testing.assert_close(torch.linalg.lu_solve(lux, pivx, bx, adjoint=True).cpu(),
                               torch.linalg.lu_solve(lu, piv, b, adjoint=True), **tol)
    for shape in [(20, 70), (70, 20)]:  # rectangular
        r = torch.randn(*shape, dtype=dtype, generator=g)
        lu_r, piv_r = torch.linalg.lu_factor(r)
        lux_r, pivx_r = torch.linalg.lu_factor(r.to(DEV))
        torch.testing.assert_close(lux_r.cpu(), lu_r, **tol)
        assert torch.equal(pivx_r.cpu(), piv_r)
    _no_fallback(before, *names)


def test_lu_large_singular_info_and_grad():
    g = torch.Generator().manual_seed(12)
    s = torch.randn(40, 40, dtype=torch.float64, generator=g)
    s[:, 17] = 0  # an exactly zero column: LAPACK's info = 18
    lu, piv, info = torch.linalg.lu_factor_ex(s)
    lux, pivx, infox = torch.linalg.lu_factor_ex(s.to(DEV))
    assert infox.item() == info.item() == 18
    assert torch.equal(pivx.cpu(), piv)
    torch.testing.assert_close(lux.cpu(), lu)
    a = torch.randn(30, 30, dtype=torch.float64, generator=g) + 5 * torch.eye(30, dtype=torch.float64)
    x, xx = a.clone().requires_grad_(), a.to(DEV).requires_grad_()
    torch.linalg.inv(x).sum().backward()
    torch.linalg.inv(xx).sum().backward()
    torch.testing.assert_close(xx.grad.cpu(), x.grad)


def test_lu_beyond_the_loop_limit_falls_back_correctly():
    a = torch.randn(520, 520, dtype=torch.float64) + 30 * torch.eye(520, dtype=torch.float64)
    before = met.counter_value("aten::linalg_inv_ex") or 0
    torch.testing.assert_close(torch.linalg.inv(a.to(DEV)).cpu(), torch.linalg.inv(a))
    assert (met.counter_value("aten::linalg_inv_ex") or 0) == before + 1


# ---- QR: Householder reflectors as LAPACK's geqrf/orgqr (same signs), a While over the columns
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(5, 5), (2, 7, 4), (4, 7), (2, 40, 40), (33, 20)])
def test_qr_equals_lapack(dtype, shape):
    g = torch.Generator().manual_seed(13)
    a = torch.randn(*shape, dtype=dtype, generator=g)
    before = _counts("linalg_qr")
    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for mode in ("reduced", "complete", "r"):
        q, r = torch.linalg.qr(a.to(DEV), mode=mode)
        eq, er = torch.linalg.qr(a, mode=mode)
        assert q.shape == eq.shape and r.shape == er.shape and q.dtype == eq.dtype
        torch.testing.assert_close(r.cpu(), er, **tol)
        torch.testing.assert_close(q.cpu(), eq, **tol)
    _no_fallback(before, "linalg_qr")


def test_qr_special_columns_and_grad():
    # an exactly zero sub-column (LAPACK: tau = 0, H = I, R keeps the entry's sign), a zero column
    a = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 5.0, 0.0]], dtype=torch.float64)
    a[0, 0] = -3.0
    for mode in ("reduced", "complete"):
        q, r = torch.linalg.qr(a.to(DEV), mode=mode)
        eq, er = torch.linalg.qr(a, mode=mode)
        torch.testing.assert_close(r.cpu(), er)
        torch.testing.assert_close(q.cpu(), eq)
    g = torch.Generator().manual_seed(14)
    b = torch.randn(6, 4, dtype=torch.float64, generator=g)
    x, xx = b.clone().requires_grad_(), b.to(DEV).requires_grad_()
    q, r = torch.linalg.qr(x)
    (q.sum() + r.square().sum()).backward()
    q, r = torch.linalg.qr(xx)
    (q.sum() + r.square().sum()).backward()
    torch.testing.assert_close(xx.grad.cpu(), x.grad)
