"""Symmetric eigendecomposition and SVD on our IR (the _linalg_eigh and _linalg_svd rows,
csrc/ops/rows_linalg.cc: XLA's Jacobi eigensolver through a custom call @Eigh, the SVD through the
eigendecomposition of the symmetric embedding [[0, A], [A^T, 0]]) and what torch builds on them
(eigvalsh, svdvals, pinv, matrix_rank, matrix norms with ord 2 / -2 / 'nuc', cond).

Against eager CPU (LAPACK): eigenvalues and singular values (eigh ascending, svd descending),
reconstruction, orthogonality, eigenvector / singular vector spans (signs are the solver's),
gradients through torch's formulas, batches, f32 / f64, 0-size inputs; no CPU fallback."""
import pytest
import torch

import torch_xla
import torch_xla.debug.metrics as met

DEV = torch_xla.device()
TOL = {torch.float32: 2e-5, torch.float64: 1e-11}


def _no_fallback():
    ops = [n for n in met.executed_fallback_ops() if n != "aten::_local_scalar_dense"]
    assert ops == [], ops


def _grad_matches_eager(loss, a, dtype):
    """loss(a).backward() on the device gives eager's gradient, with no CPU fallback."""
    xa = a.clone().requires_grad_(True)
    loss(xa).backward()
    xb = a.to(DEV).requires_grad_(True)
    met.clear_counters()
    loss(xb).backward()
    g = xb.grad.cpu()
    _no_fallback()
    torch.testing.assert_close(g, xa.grad, rtol=0, atol=(5e-4 if dtype == torch.float32 else 1e-9))


def _sym(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, dtype=dtype, generator=g)
    return a + a.mT


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dtype, generator=g)


def _eye_like(v):
    n = v.shape[-1]
    return torch.eye(n, dtype=v.dtype).expand(v.shape[:-2] + (n, n))


def _scale(a):
    return max(1.0, a.abs().max().item()) if a.numel() else 1.0


# ------------------------------------------------------------------------------------ eigh
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (4, 5, 5), (2, 3, 6, 6), (33, 33)])
def test_eigh_values_vectors(shape, dtype):
    a = _sym(shape, dtype, sum(shape))
    ew, ev = torch.linalg.eigh(a)
    met.clear_counters()
    w, v = torch.linalg.eigh(a.to(DEV))
    w, v = w.cpu(), v.cpu()
    _no_fallback()
    assert w.dtype == ew.dtype and v.dtype == ev.dtype and w.shape == ew.shape and v.shape == ev.shape
    tol = TOL[dtype] * _scale(a)
    torch.testing.assert_close(w, ew, rtol=0, atol=tol)
    assert (w[..., 1:] >= w[..., :-1]).all()  # ascending, as eager
    torch.testing.assert_close(v @ torch.diag_embed(w) @ v.mT, a, rtol=0, atol=tol * 4)
    torch.testing.assert_close(v.mT @ v, _eye_like(v), rtol=0, atol=TOL[dtype] * 4)
    # Distinct eigenvalues (random matrices): each eigenvector equals eager's up to its sign.
    dots = (v * ev).sum(-2).abs()
    torch.testing.assert_close(dots, torch.ones_like(dots), rtol=0, atol=TOL[dtype] * 50 * shape[-1])


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_one_triangle(uplo):
    a = _rand((5, 5), torch.float64, 3)  # not symmetric: only the UPLO triangle counts
    ew = torch.linalg.eigvalsh(a, UPLO=uplo)
    met.clear_counters()
    w = torch.linalg.eigvalsh(a.to(DEV), UPLO=uplo).cpu()
    _no_fallback()
    torch.testing.assert_close(w, ew, rtol=0, atol=1e-12)


def test_eigh_repeated_eigenvalues():
    q, _ = torch.linalg.qr(_rand((6, 6), torch.float64, 1))
    a = q @ torch.diag(torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0, -3.0], dtype=torch.float64)) @ q.T
    a = (a + a.T) / 2
    met.clear_counters()
    w, v = torch.linalg.eigh(a.to(DEV))
    w, v = w.cpu(), v.cpu()
    _no_fallback()
    torch.testing.assert_close(w, torch.linalg.eigvalsh(a), rtol=0, atol=1e-12)
    torch.testing.assert_close(v @ torch.diag(w) @ v.T, a, rtol=0, atol=1e-12)
    torch.testing.assert_close(v.T @ v, torch.eye(6, dtype=torch.float64), rtol=0, atol=1e-12)


def test_eigh_diagonal_and_zero():
    for a in (torch.diag(torch.tensor([3.0, -1.0, 2.0])), torch.zeros(4, 4), torch.eye(3)):
        met.clear_counters()
        w, v = torch.linalg.eigh(a.to(DEV))
        w, v = w.cpu(), v.cpu()
        _no_fallback()
        torch.testing.assert_close(w, torch.linalg.eigvalsh(a), rtol=0, atol=1e-6)
        torch.testing.assert_close(v @ torch.diag(w) @ v.T, a, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", [(0, 0), (3, 0, 0), (0, 4, 4)])
def test_eigh_empty(shape):
    a = torch.zeros(shape)
    ew, ev = torch.linalg.eigh(a)
    met.clear_counters()
    w, v = torch.linalg.eigh(a.to(DEV))
    _no_fallback()
    assert w.shape == ew.shape and v.shape == ev.shape and w.dtype == ew.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eigh_gradients(dtype):
    a = _sym((2, 5, 5), dtype, 7)
    w0 = _rand((2, 5), dtype, 8)
    w1 = _rand((2, 5, 5), dtype, 9)

    def loss(x):
        w, v = torch.linalg.eigh(x)
        # sign-invariant in the eigenvectors: v v^T weighted, and the eigenvalues
        return (w * w0.to(x.device)).sum() + ((v * v) * w1.to(x.device)).sum() + (v[..., :, :2] @ v[..., :, :2].mT).sum()

    _grad_matches_eager(loss, a, dtype)


def test_eigvalsh_gradient():
    a = _sym((4, 4), torch.float64, 11)
    xa = a.clone().requires_grad_(True)
    torch.linalg.eigvalsh(xa).pow(2).sum().backward()
    xb = a.to(DEV).requires_grad_(True)
    met.clear_counters()
    torch.linalg.eigvalsh(xb).pow(2).sum().backward()
    g = xb.grad.cpu()
    _no_fallback()
    torch.testing.assert_close(g, xa.grad, rtol=0, atol=1e-10)


# ------------------------------------------------------------------------------------ svd
SVD_SHAPES = [(1, 1), (5, 3), (3, 5), (4, 6, 2), (2, 3, 4, 7), (40, 24)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("shape", SVD_SHAPES)
def test_svd(shape, full, dtype):
    a = _rand(shape, dtype, sum(shape) + full)
    eu, es, evh = torch.linalg.svd(a, full_matrices=full)
    met.clear_counters()
    u, s, vh = torch.linalg.svd(a.to(DEV), full_matrices=full)
    u, s, vh = u.cpu(), s.cpu(), vh.cpu()
    _no_fallback()
    for x, e in ((u, eu), (s, es), (vh, evh)):
        assert x.dtype == e.dtype and x.shape == e.shape
    tol = TOL[dtype] * _scale(a) * 4
    torch.testing.assert_close(s, es, rtol=0, atol=tol)
    assert (s[..., 1:] <= s[..., :-1]).all() and (s >= 0).all()  # descending, as eager
    k = s.shape[-1]
    torch.testing.assert_close(u[..., :, :k] @ torch.diag_embed(s) @ vh[..., :k, :], a, rtol=0, atol=tol * 2)
    torch.testing.assert_close(u.mT @ u, _eye_like(u.mT @ u), rtol=0, atol=TOL[dtype] * 10)
    torch.testing.assert_close(vh @ vh.mT, _eye_like(vh @ vh.mT), rtol=0, atol=TOL[dtype] * 10)
    # Distinct singular values: the pairs (u_i, v_i) equal eager's up to one common sign.
    du = (u[..., :, :k] * eu[..., :, :k]).sum(-2)
    dv = (vh[..., :k, :] * evh[..., :k, :]).sum(-1)
    torch.testing.assert_close(du.abs(), torch.ones_like(du), rtol=0, atol=TOL[dtype] * 200)
    torch.testing.assert_close(du.sign(), dv.sign(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_svd_rank_deficient(dtype):
    cases = [torch.zeros(3, 4, dtype=dtype),
             torch.outer(torch.arange(1.0, 5.0), torch.arange(1.0, 4.0)).to(dtype),
             _rand((6, 2), dtype, 1) @ _rand((2, 5), dtype, 2)]
    for i, a in enumerate(cases):
        for full in ((False, True) if i == 2 else (False,)):
            es = torch.linalg.svdvals(a)
            met.clear_counters()
            u, s, vh = torch.linalg.svd(a.to(DEV), full_matrices=full)
            u, s, vh = u.cpu(), s.cpu(), vh.cpu()
            _no_fallback()
            tol = TOL[dtype] * _scale(a) * 10
            torch.testing.assert_close(s, es, rtol=0, atol=tol)
            k = s.shape[-1]
            torch.testing.assert_close(u[:, :k] @ torch.diag(s) @ vh[:k], a, rtol=0, atol=tol)
            torch.testing.assert_close(u.T @ u, torch.eye(u.shape[1], dtype=dtype), rtol=0, atol=tol)
            torch.testing.assert_close(vh @ vh.T, torch.eye(vh.shape[0], dtype=dtype), rtol=0, atol=tol)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 4), (0, 3, 3)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_empty(shape, full):
    a = torch.zeros(shape)
    eu, es, evh = torch.linalg.svd(a, full_matrices=full)
    met.clear_counters()
    u, s, vh = torch.linalg.svd(a.to(DEV), full_matrices=full)
    u, s, vh = u.cpu(), s.cpu(), vh.cpu()
    _no_fallback()
    for x, e in ((u, eu), (s, es), (vh, evh)):
        assert x.shape == e.shape and x.dtype == e.dtype
        torch.testing.assert_close(x, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_svd_gradients(dtype):
    a = _rand((2, 5, 3), dtype, 21)
    ws = _rand((2, 3), dtype, 22)

    def loss(x):
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        # invariant under the singular vectors' signs
        return (s * ws.to(x.device)).sum() + (u @ vh).pow(2).sum() + (u[..., :1] @ vh[..., :1, :]).sum()

    _grad_matches_eager(loss, a, dtype)


# ------------------------------------------------------------------------- built on them
def _compare(fn, *args, atol, grad=False):
    expected = fn(*args)
    met.clear_counters()
    xs = [x.to(DEV) if isinstance(x, torch.Tensor) else x for x in args]
    got = fn(*xs).cpu()
    _no_fallback()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)
    if grad:
        xa = args[0].clone().requires_grad_(True)
        fn(xa, *args[1:]).sum().backward()
        xb = args[0].to(DEV).requires_grad_(True)
        met.clear_counters()
        fn(xb, *xs[1:]).sum().backward()
        g = xb.grad.cpu()
        _no_fallback()
        torch.testing.assert_close(g, xa.grad, rtol=0, atol=atol * 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_svdvals_eigvalsh(dtype):
    _compare(torch.linalg.svdvals, _rand((3, 4, 6), dtype, 1), atol=TOL[dtype] * 10, grad=True)
    _compare(torch.linalg.eigvalsh, _sym((3, 5, 5), dtype, 2), atol=TOL[dtype] * 10, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pinv(dtype):
    a = _rand((2, 5, 3), dtype, 3)
    _compare(torch.linalg.pinv, a, atol=TOL[dtype] * 20, grad=True)
    _compare(lambda x: torch.linalg.pinv(x, hermitian=True), _sym((4, 4), dtype, 4) + 8 * torch.eye(4, dtype=dtype),
             atol=TOL[dtype] * 20)
    # rank-deficient: the tolerance cuts the zero singular values off, as eager's
    r = _rand((5, 2), dtype, 5) @ _rand((2, 4), dtype, 6)
    _compare(torch.linalg.pinv, r, atol=TOL[dtype] * 100)
    _compare(torch.pinverse, a[0], atol=TOL[dtype] * 20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matrix_rank(dtype):
    r = torch.stack([_rand((5, 2), dtype, 5) @ _rand((2, 4), dtype, 6), _rand((5, 4), dtype, 7),
                     torch.zeros(5, 4, dtype=dtype)])
    _compare(torch.linalg.matrix_rank, r, atol=0)
    _compare(lambda x: torch.linalg.matrix_rank(x, hermitian=True), _sym((3, 3), dtype, 1), atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ord", [2, -2, "nuc"])
def test_matrix_norms_and_cond(ord, dtype):
    a = _rand((3, 4, 4), dtype, 12)
    _compare(lambda x: torch.linalg.matrix_norm(x, ord=ord), a, atol=TOL[dtype] * 20, grad=True)
    _compare(lambda x: torch.linalg.norm(x, ord=ord, dim=(-2, -1)), a, atol=TOL[dtype] * 20)
    _compare(lambda x: torch.linalg.cond(x, p=ord), a, atol=TOL[dtype] * 2000)
    _compare(torch.linalg.cond, a, atol=TOL[dtype] * 2000)
    if ord == "nuc":
        _compare(lambda x: torch.norm(x, p="nuc"), a[0], atol=TOL[dtype] * 20)


def test_svd_legacy_and_lowrank_entry_points():
    a = _rand((5, 3), torch.float64, 30)
    eu, es, ev = torch.svd(a)
    met.clear_counters()
    u, s, v = (t.cpu() for t in torch.svd(a.to(DEV)))
    _no_fallback()
    torch.testing.assert_close(s, es, rtol=0, atol=1e-12)
    torch.testing.assert_close(u @ torch.diag(s) @ v.T, a, rtol=0, atol=1e-12)
    s2 = torch.svd(a.to(DEV), compute_uv=False)[1].cpu()
    torch.testing.assert_close(s2, es, rtol=0, atol=1e-12)


def test_above_the_lowered_size_runs_lapack():
    """eigh above 64 x 64 and the SVD with m + n above 64 run on the CPU fallback (LAPACK; the
    Jacobi loops would take far longer there): correct and counted."""
    a = _rand((100, 40), torch.float64, 40)
    met.clear_counters()
    s = torch.linalg.svdvals(a.to(DEV)).cpu()
    assert "aten::_linalg_svd" in met.executed_fallback_ops()
    torch.testing.assert_close(s, torch.linalg.svdvals(a), rtol=0, atol=1e-12)
    b = _rand((65, 65), torch.float64, 41)
    b = b + b.mT
    met.clear_counters()
    w = torch.linalg.eigvalsh(b.to(DEV)).cpu()
    assert "aten::_linalg_eigh" in met.executed_fallback_ops()
    torch.testing.assert_close(w, torch.linalg.eigvalsh(b), rtol=0, atol=1e-12)


def test_eigh_nan_raises_as_eager():
    """LAPACK fails to converge on a NaN in the triangle eigh reads (eager raises LinAlgError, a
    RuntimeError); an infinity gives NaN eigenvalues without an error; a NaN in the other triangle
    is not read."""
    a = torch.eye(3)
    a[2, 0] = float("nan")
    with pytest.raises(RuntimeError, match="failed to converge"):
        torch.linalg.eigvalsh(a)
    with pytest.raises(RuntimeError, match="failed to converge"):
        torch.linalg.eigvalsh(a.to(DEV)).cpu()
    torch.testing.assert_close(torch.linalg.eigvalsh(a.to(DEV), UPLO="U").cpu(), torch.linalg.eigvalsh(a, UPLO="U"))
    b = torch.eye(3)
    b[0, 0] = float("inf")
    assert torch.linalg.eigvalsh(b).isnan().all()
    assert torch.linalg.eigvalsh(b.to(DEV)).cpu().isnan().all()
