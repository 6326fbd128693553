"""Issue #12: host kernels. On the CPU plugin, large dots and every float convolution (forward and
backward) run ATen's own CPU kernels as XLA FFI custom calls inside the compiled executable
(csrc/bridge/host_kernels.cc). They are eager's exact routines, so results must equal eager's
bit for bit where eager calls the same kernel (mm, bmm, convolution, convolution_backward), and to
float rounding elsewhere; shapes, dtypes and gradients as eager's.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_xla
import torch_xla._XLAC as XLAC
from torch_xla import _C

DEV = torch_xla.device()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not any(_C._host_kernels()), reason="this build or plugin has no host kernels")


@pytest.fixture(autouse=True, scope="module")
def _dots_and_convs():
    """Both kinds on for these tests (the default is convolutions only)."""
    before = _C._host_kernels()
    _C._set_host_kernels(True, True)
    yield
    _C._set_host_kernels(*before)


def _hlo(t):
    return XLAC._get_xla_tensors_hlo([t])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_mm_family_equals_eager_bitwise(dtype):
    torch.manual_seed(0)
    a, b = torch.randn(64, 96, dtype=dtype), torch.randn(96, 80, dtype=dtype)
    bt = torch.randn(80, 96, dtype=dtype)
    ba, bb = torch.randn(3, 40, 50, dtype=dtype), torch.randn(3, 50, 70, dtype=dtype)
    cases = {
        "mm": (lambda x, y: x @ y, (a, b)),
        "mm_t": (lambda x, y: x @ y.t(), (a, bt)),           # transposed operand folded in place
        "t_mm": (lambda x, y: x.t() @ y, (a.t().contiguous(), b)),
        "bmm": (torch.bmm, (ba, bb)),
        "matmul_bcast": (torch.matmul, (ba, bb[0])),
    }
    for name, (fn, args) in cases.items():
        want = fn(*args)
        got_t = fn(*[x.to(DEV) for x in args])
        assert "txla_aten_dot" in _hlo(got_t), name
        got = got_t.cpu()
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), (name, (got.float() - want.float()).abs().max())


def test_linear_and_einsum_match_eager():
    torch.manual_seed(1)
    x, w, bias = torch.randn(5, 7, 64), torch.randn(48, 64), torch.randn(48)
    torch.testing.assert_close(F.linear(x.to(DEV), w.to(DEV), bias.to(DEV)).cpu(), F.linear(x, w, bias))
    p, q = torch.randn(4, 32, 6, 24), torch.randn(6, 24, 4, 40)
    eq = "bkhd,hdbn->bhkn"  # batch dims in the middle, contraction over two dims
    got = torch.einsum(eq, p.to(DEV), q.to(DEV))
    assert "txla_aten_dot" in _hlo(got)
    torch.testing.assert_close(got.cpu(), torch.einsum(eq, p, q))


def test_small_and_integer_dots_stay_xla():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    got = a.to(DEV) @ b.to(DEV)
    assert "txla_aten_dot" not in _hlo(got) and "dot_general" in _hlo(got)
    torch.testing.assert_close(got.cpu(), a @ b)
    ia, ib = torch.randint(-5, 5, (64, 64)), torch.randint(-5, 5, (64, 64))
    gi = ia.to(DEV) @ ib.to(DEV)
    assert "txla_aten_dot" not in _hlo(gi)
    assert torch.equal(gi.cpu(), ia @ ib)


def test_dot_gradients_match_eager():
    torch.manual_seed(2)
    a, b = torch.randn(33, 65, requires_grad=True), torch.randn(65, 47, requires_grad=True)
    (a @ b).sin().sum().backward()
    ad, bd = a.detach().to(DEV).requires_grad_(), b.detach().to(DEV).requires_grad_()
    (ad @ bd).sin().sum().backward()
    torch.testing.assert_close(ad.grad.cpu(), a.grad)
    torch.testing.assert_close(bd.grad.cpu(), b.grad)


CONVS = [
    # (dims, N, Cin, Cout, size, kernel, stride, padding, dilation, groups)
    (1, 2, 4, 6, 17, 3, 2, 1, 1, 1),
    (2, 2, 3, 8, 12, 3, 1, 1, 1, 1),
    (2, 2, 8, 8, 11, 3, 2, 2, 2, 4),
    (2, 1, 6, 4, 9, 1, 1, 0, 1, 2),
    (3, 1, 2, 4, 6, 3, 1, 1, 1, 1),
]


@pytest.mark.parametrize("case", CONVS, ids=[f"conv{c[0]}d-{i}" for i, c in enumerate(CONVS)])
@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_forward_backward_equal_eager(case, transposed):
    nd, n, cin, cout, size, k, s, p, d, g = case
    torch.manual_seed(3)
    x = torch.randn(n, cin, *([size] * nd), requires_grad=True)
    if transposed:
        w = torch.randn(cin, cout // g, *([k] * nd), requires_grad=True)
        fn = getattr(F, f"conv_transpose{nd}d")
        kw = dict(stride=s, padding=p, dilation=d, groups=g, output_padding=1 if s > 1 else 0)
    else:
        w = torch.randn(cout, cin // g, *([k] * nd), requires_grad=True)
        fn = getattr(F, f"conv{nd}d")
        kw = dict(stride=s, padding=p, dilation=d, groups=g)
    bias = torch.randn(w.shape[1] * g if transposed else cout, requires_grad=True)
    y = fn(x, w, bias, **kw)
    gy = torch.randn_like(y)
    y.backward(gy)
    xd, wd, bd = (t.detach().to(DEV).requires_grad_() for t in (x, w, bias))
    yd = fn(xd, wd, bd, **kw)
    assert "txla_aten_conv" in _hlo(yd)
    yd.backward(gy.to(DEV))
    assert yd.shape == y.shape and yd.dtype == y.dtype
    # Eager adds the bias inside its kernel, we add it after: float rounding apart.
    torch.testing.assert_close(yd.cpu(), y, rtol=1e-5, atol=1e-5)
    assert torch.equal(xd.grad.cpu(), x.grad)
    assert torch.equal(wd.grad.cpu(), w.grad)
    torch.testing.assert_close(bd.grad.cpu(), bias.grad)


def test_conv_bf16_and_weight_only_gradient():
    torch.manual_seed(4)
    x = torch.randn(2, 4, 10, 10, dtype=torch.bfloat16)
    w = torch.randn(6, 4, 3, 3, dtype=torch.bfloat16, requires_grad=True)
    F.conv2d(x, w, padding=1).float().square().sum().backward()
    wd = w.detach().to(DEV).requires_grad_()
    yd = F.conv2d(x.to(DEV), wd, padding=1)
    yd.float().square().sum().backward()  # input needs no gradient: the weight-only mask
    assert yd.dtype == torch.bfloat16
    torch.testing.assert_close(wd.grad.cpu().float(), w.grad.float(), rtol=2e-2, atol=1e-1)


_HEADER = "import torch, torch_xla, torch_xla._XLAC as X\nfrom torch_xla import _C\n"
# A 64x64 matmul that must stay XLA's dot_general, with eager's values.
_XLA_DOT = (
    "d = torch_xla.device(); torch.manual_seed(0)\n"
    "a, b = torch.randn(64, 64), torch.randn(64, 64)\n"
    "r = a.to(d) @ b.to(d)\n"
    "assert _C._host_kernels() == (False, False), _C._host_kernels()\n"
    "assert 'txla_aten' not in X._get_xla_tensors_hlo([r])\n"
    "torch.testing.assert_close(r.cpu(), a @ b)\n")


def _run(code, **env_changes):
    """Runs code in a fresh process (TORCH_XLA_HOST_KERNELS unset unless given); returns it."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_XLA_HOST_KERNELS"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code + "print('ok')\n"], env=env, capture_output=True, text=True,
                          timeout=300)


def _assert_ok(out):
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_disabled_by_env_gives_xla_ops_and_same_values():
    _assert_ok(_run(_HEADER + _XLA_DOT, TORCH_XLA_HOST_KERNELS="0"))


def test_spmd_graphs_keep_xla_dots_even_when_use_spmd_comes_first():
    code = _HEADER + "import torch_xla.runtime as xr\nxr.use_spmd()\n" + _XLA_DOT
    _assert_ok(_run(code, TORCH_XLA_HOST_KERNELS="all"))


def test_default_is_convolutions_only_and_a_bad_kind_is_refused():
    _assert_ok(_run(_HEADER + "assert _C._host_kernels() == (False, True), _C._host_kernels()\n"
                    "assert _C._host_reductions() and _C._host_big_dots()\n"))
    _assert_ok(_run(_HEADER + "assert not _C._host_big_dots()\n", TORCH_XLA_HOST_KERNELS="conv,reduce"))
    _assert_ok(_run(_HEADER + "assert _C._host_kernels() == (False, True) and not _C._host_reductions()\n",
                    TORCH_XLA_HOST_KERNELS="conv"))
    _assert_ok(_run(_HEADER + "assert _C._host_kernels() == (False, False) and _C._host_reductions()\n",
                    TORCH_XLA_HOST_KERNELS="reduce"))
    out = _run("import torch, torch_xla\ntorch.zeros(2).to(torch_xla.device())\n", TORCH_XLA_HOST_KERNELS="gemm")
    assert out.returncode != 0 and "TORCH_XLA_HOST_KERNELS: unknown kind 'gemm'" in out.stderr, out.stderr[-2000:]


def test_export_is_portable_stablehlo():
    from torch_xla.stablehlo import exported_program_to_stablehlo
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    x = torch.randn(2, 3, 8, 8)
    shlo = exported_program_to_stablehlo(torch.export.export(m, (x,)))
    text = shlo.get_stablehlo_text()
    assert "txla_aten" not in text and "convolution" in text
    assert _C._host_kernels() == (True, True)  # restored
    assert _C._host_reductions() and _C._host_big_dots()
    got = shlo(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got.cpu(), m(x), rtol=1e-4, atol=1e-5)


def test_transposed_only_rule_sends_just_x_at_w_t_to_aten():
    """Kind "tdot": only dots whose right operand is contracted along its minor dimension (F.linear,
    x @ W.t(), q @ k.transpose(-1, -2)) call ATen; the others stay XLA's dots. Values equal eager's."""
    torch.manual_seed(2)
    x, w, wt = torch.randn(64, 96), torch.randn(80, 96), torch.randn(96, 80)
    q, k = torch.randn(3, 40, 32), torch.randn(3, 50, 32)
    before = _C._host_dots_transposed_only()
    _C._set_host_dots_transposed_only(True)
    try:
        cases = {  # name: (fn, args, host call expected)
            "linear": (lambda a, b: F.linear(a, b), (x, w), True),
            "mm_t": (lambda a, b: a @ b.t(), (x, w), True),
            "qk_t": (lambda a, b: a @ b.transpose(-1, -2), (q, k), True),
            "mm": (lambda a, b: a @ b, (x, wt), False),
            "t_mm": (lambda a, b: a.t() @ b, (x, x), False),
        }
        for name, (fn, args, host) in cases.items():
            want = fn(*args)
            got_t = fn(*[a.to(DEV) for a in args])
            assert ("txla_aten_dot" in _hlo(got_t)) == host, name
            got = got_t.cpu()
            if host:
                assert torch.equal(got, want), (name, (got - want).abs().max())
            else:
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        # gradients of a linear layer: the forward is a host call, its backward dots are XLA's
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        F.linear(xs, ws).square().sum().backward()
        xd, wd = x.to(DEV).requires_grad_(), w.to(DEV).requires_grad_()
        F.linear(xd, wd).square().sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), xs.grad, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(wd.grad.cpu(), ws.grad, rtol=1e-4, atol=1e-3)
    finally:
        _C._set_host_dots_transposed_only(before)


def test_tdot_kind_and_kernel_threads_from_env():
    code = (_HEADER +
            "d = torch_xla.device(); n0 = torch.get_num_threads()\n"
            "assert _C._host_kernels() == (True, True) and _C._host_dots_transposed_only()\n"
            "import torch.nn.functional as F\n"
            "x, w = torch.randn(64, 96), torch.randn(80, 96)\n"
            "want = F.linear(x, w)\n"
            "got = F.linear(x.to(d), w.to(d)).cpu()\n"
            "assert torch.equal(got, want), (got - want).abs().max()\n"
            "assert torch.get_num_threads() == n0, (torch.get_num_threads(), n0)  # the caller's setting kept\n")
    _assert_ok(_run(code, TORCH_XLA_HOST_KERNELS="conv,tdot", TORCH_XLA_HOST_KERNEL_THREADS="1"))
    out = _run("import torch, torch_xla\ntorch.zeros(2).to(torch_xla.device())\n", TORCH_XLA_HOST_KERNEL_THREADS="two")
    assert out.returncode != 0 and "TORCH_XLA_HOST_KERNEL_THREADS=two" in out.stderr, out.stderr[-2000:]


@pytest.fixture
def _reductions_on():
    before = _C._host_reductions()
    _C._set_host_reductions(True)
    yield
    _C._set_host_reductions(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_column_sums_run_aten_and_equal_eager_bitwise(dtype, _reductions_on):
    """Kind "reduce": a large floating sum that keeps the minor dimension (bias and norm-weight
    gradients) runs ATen's sum kernel, so it equals eager's sum bit for bit."""
    torch.manual_seed(3)
    cases = {
        "rows of a matrix": (lambda t: t.sum(0), torch.randn(1024, 512, dtype=dtype)),
        "two leading dims": (lambda t: t.sum((0, 1)), torch.randn(16, 64, 256, dtype=dtype)),
        "middle dim, keepdim": (lambda t: t.sum(1, keepdim=True), torch.randn(8, 300, 40, dtype=dtype)),
        "negative dims": (lambda t: t.sum((-3, -2)), torch.randn(4, 33, 65, 16, dtype=dtype)),
        "of a product": (lambda t: (t * t).sum(0), torch.randn(512, 128, dtype=dtype)),
    }
    for name, (fn, x) in cases.items():
        got_t = fn(x.to(DEV))
        assert "txla_aten_sum" in _hlo(got_t), name
        got, want = got_t.cpu(), fn(x)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), (name, (got - want).abs().max())


def test_linear_bias_gradient_equals_eager_bitwise(_reductions_on):
    torch.manual_seed(4)
    x, w, b, g = torch.randn(256, 96), torch.randn(128, 96), torch.randn(128), torch.randn(256, 128)
    bc = b.clone().requires_grad_()
    (F.linear(x, w, bc) * g).sum().backward()
    bd = b.to(DEV).requires_grad_()
    (F.linear(x.to(DEV), w.to(DEV), bd) * g.to(DEV)).sum().backward()
    assert torch.equal(bd.grad.cpu(), bc.grad)


def test_fused_row_small_and_integer_sums_stay_xla(_reductions_on):
    """A sum over the minor dimension stays XLA's (it fuses its producer, which a host call would
    write out first); small, integer and size-1 sums too."""
    torch.manual_seed(5)
    cases = {
        "over the minor dim": (lambda t: t.sum(1), torch.randn(1024, 512)),
        "over the minor dim, fused": (lambda t: (t + 1).sum(1), torch.randn(1024, 512)),
        "over everything": (lambda t: t.sum(), torch.randn(1024, 512)),
        "BatchNorm dims": (lambda t: t.sum((0, 2, 3)), torch.randn(16, 8, 16, 16)),
        "small": (lambda t: t.sum(0), torch.randn(64, 32)),
        "int": (lambda t: t.sum(0), torch.randint(0, 9, (1024, 512))),
        "size-1 dim": (lambda t: t.sum(0), torch.randn(1, 65536)),
    }
    for name, (fn, x) in cases.items():
        got = fn(x.to(DEV))
        assert "txla_aten_sum" not in _hlo(got), name
        want = fn(x)
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)


def test_host_reductions_switch_off():
    before = _C._host_reductions()
    _C._set_host_reductions(False)
    try:
        x = torch.randn(1024, 512)
        got = x.to(DEV).sum(0)
        assert "txla_aten_sum" not in _hlo(got)
        torch.testing.assert_close(got.cpu(), x.sum(0), rtol=1e-4, atol=1e-4)  # XLA's order of additions
    finally:
        _C._set_host_reductions(before)


@pytest.fixture
def _norms_on():
    before = _C._host_norms()
    _C._set_host_norms(True)
    yield
    _C._set_host_norms(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(8, 6, 10, 12), (5, 4, 7), (6, 3)])
@pytest.mark.parametrize("affine,track", [(True, True), (False, True), (True, False)])
def test_batch_norm_runs_aten_and_equals_eager_bitwise(dtype, shape, affine, track, _norms_on):
    """Kind "norm" (opt-in): training-mode batch norm forward and backward run eager's CPU kernels,
    so the output, the running statistics and every gradient equal eager's bit for bit."""
    import copy
    torch.manual_seed(6)
    bn_c = (torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d)(
        shape[1], affine=affine, track_running_stats=track).to(dtype)
    if affine:
        with torch.no_grad():
            bn_c.weight.uniform_(0.5, 1.5)
            bn_c.bias.uniform_(-1, 1)
    bn_x = copy.deepcopy(bn_c).to(DEV)
    x, g = torch.randn(*shape, dtype=dtype) * 3 + 1, torch.randn(*shape, dtype=dtype)
    xc, xx = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    for _ in range(2):  # the second step reads the first one's running statistics
        yc = bn_c(xc)
        yc.backward(g)
        yx = bn_x(xx)
        assert "txla_aten_bn" in _hlo(yx)
        yx.backward(g.to(DEV))
    torch_xla.sync()
    assert yx.dtype == yc.dtype and torch.equal(yx.cpu(), yc)
    assert torch.equal(xx.grad.cpu(), xc.grad)
    if affine:
        assert torch.equal(bn_x.weight.grad.cpu(), bn_c.weight.grad)
        assert torch.equal(bn_x.bias.grad.cpu(), bn_c.bias.grad)
    if track:
        assert torch.equal(bn_x.running_mean.cpu(), bn_c.running_mean)
        assert torch.equal(bn_x.running_var.cpu(), bn_c.running_var)
        assert bn_x.num_batches_tracked.item() == 2


def test_batch_norm_eval_bf16_and_default_stay_xla(_norms_on):
    torch.manual_seed(7)
    bn = torch.nn.BatchNorm2d(4)
    x = torch.randn(3, 4, 5, 5)
    bn.eval()
    got = bn.to(DEV)(x.to(DEV))
    assert "txla_aten_bn" not in _hlo(got)  # inference: elementwise, XLA fuses it
    torch.testing.assert_close(got.cpu(), bn.cpu()(x))
    bn.train()
    got = torch.nn.functional.batch_norm(x.bfloat16().to(DEV), None, None, training=True)
    assert "txla_aten_bn" not in _hlo(got)
    torch.testing.assert_close(got.cpu(), torch.nn.functional.batch_norm(x.bfloat16(), None, None, training=True))
    _C._set_host_norms(False)
    got = bn.to(DEV)(x.to(DEV))
    assert "txla_aten_bn" not in _hlo(got)
    torch.testing.assert_close(got.cpu(), bn.cpu()(x), rtol=1e-5, atol=1e-5)


def test_norm_kind_is_opt_in():
    _assert_ok(_run(_HEADER + "assert not _C._host_norms()\n"))
    _assert_ok(_run(_HEADER + "assert _C._host_norms() and _C._host_kernels() == (False, True)\n",
                    TORCH_XLA_HOST_KERNELS="conv,norm"))


def test_onednn_host_dots_match_eager():
    """TXLA_HOST_DOT_ONEDNN=1: f32 host dots through oneDNN's matmul (another accumulation order than
    eager's MKL GEMM: equal within float rounding); f64 keeps at::mm."""
    code = (_HEADER + "d = torch_xla.device(); torch.manual_seed(0)\n"
            "a, w, b = torch.randn(128, 784), torch.randn(1024, 784), torch.randn(3, 40, 50)\n"
            "for f, args in [(lambda x, y: x @ y.t(), (a, w)), (lambda x, y: x.t() @ y, (a, a)),\n"
            "                (torch.bmm, (b, b.transpose(1, 2)))]:\n"
            "    got_t = f(*[t.to(d) for t in args])\n"
            "    assert 'txla_aten_dot' in X._get_xla_tensors_hlo([got_t])\n"
            "    torch.testing.assert_close(got_t.cpu(), f(*args), rtol=1e-5, atol=1e-4)\n"
            "a64, w64 = a.double(), w.double()\n"
            "got = a64.to(d) @ w64.t().to(d)\n"
            "assert 'txla_aten_dot' in X._get_xla_tensors_hlo([got])\n"
            "torch.testing.assert_close(got.cpu(), a64 @ w64.t())\n")
    _assert_ok(_run(code, TORCH_XLA_HOST_KERNELS="conv,dot", TXLA_HOST_DOT_ONEDNN="1"))


_BIG_DOTS = (_HEADER + "d = torch_xla.device(); torch.manual_seed(0)\n"
             "x, w = torch.randn(128, 1024), torch.randn(1024, 1024)\n"
             "assert _C._host_kernels() == (False, True) and _C._host_big_dots()\n"
             # 128*1024*1024 multiply-adds (over 10^8): oneDNN's matmul, forward and both gradients
             "xd, wd = x.to(d).requires_grad_(), w.to(d).requires_grad_()\n"
             "y = xd @ wd.t()\n"
             "assert 'txla_aten_dot' in X._get_xla_tensors_hlo([y])\n"
             "y.sum().backward()\n"
             "assert 'txla_aten_dot' in X._get_xla_tensors_hlo([xd.grad, wd.grad])\n"
             "xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()\n"
             "yc = xc @ wc.t(); yc.sum().backward()\n"
             "for got, want in ((y, yc), (xd.grad, xc.grad), (wd.grad, wc.grad)):\n"
             "    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=2e-4)\n"
             # below the threshold, bf16 and f64 dots stay XLA's
             "for t in (x[:64].to(d) @ w.to(d).t(), x.bfloat16().to(d) @ w.bfloat16().to(d).t(),\n"
             "          x.double().to(d) @ w.double().to(d).t()):\n"
             "    assert 'txla_aten_dot' not in X._get_xla_tensors_hlo([t]) and 'dot_general' in X._get_xla_tensors_hlo([t])\n"
             # a precision the user chose must reach XLA's dot
             "import torch_xla.backends as B\nB.set_mat_mul_precision('highest')\n"
             "assert 'txla_aten_dot' not in X._get_xla_tensors_hlo([x.to(d) @ w.to(d).t()])\n"
             "B.set_mat_mul_precision('default')\n"
             "_C._set_host_big_dots(False)\n"
             "assert 'txla_aten_dot' not in X._get_xla_tensors_hlo([x.to(d) @ w.to(d).t()])\n")


def test_big_f32_dots_run_onednn_by_default():
    """Kind "bigdot" (default): f32 dots of at least 10^8 multiply-adds run oneDNN's matmul through
    ATen (equal to eager within float rounding: another accumulation order); smaller, bf16 and f64
    dots, and dots at a precision the user set, stay XLA's; _set_host_big_dots switches it."""
    _assert_ok(_run(_BIG_DOTS))
