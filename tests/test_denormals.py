"""Denormals on XLA:CPU are kept, as eager keeps them (issue #7, row 10; runtime/fp_env.h).

XLA:CPU runs compiled code with flush-to-zero / denormals-are-zero; every graph now starts with a
custom call that clears them on the executing thread (and once on XLA's intra-op pool), so results
equal eager's bit for bit. torch.set_flush_denormal(True) on the calling thread gives XLA's
flushing back, as it gives it to eager; TORCH_XLA_DENORMALS=flush turns the call off.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_xla
from torch_xla import _C
import torch_xla.debug.metrics as met

DEV = torch_xla.device()
TINY = {torch.float32: 1e-40, torch.float64: 1e-310, torch.bfloat16: 1e-39, torch.float16: 3e-6}


def _on():
    reg, keep, _ = _C._denormals()
    if not reg:
        pytest.skip("this build or plugin has no XLA FFI handler for the floating-point environment")
    return keep


def _same(a, b):
    a = a.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), (a, b)


def test_kept_by_default():
    assert _on()
    assert _C._denormals()[2] >= 1  # the intra-op pool's threads were cleared at start


@pytest.mark.parametrize("dtype", list(TINY), ids=str)
def test_elementwise_and_compare(dtype):
    _on()
    v = TINY[dtype]
    c = torch.tensor([v, -v, 3 * v, 0.0, 1.0], dtype=dtype)
    x = c.to(DEV)
    _same(x > 0, c > 0)
    _same(x * 2, c * 2)
    _same(x / 4, c / 4)
    _same(torch.sign(x), torch.sign(c))
    _same(torch.ceil(x), torch.ceil(c))
    _same(torch.count_nonzero(x), torch.count_nonzero(c))
    _same(torch.logical_not(x), torch.logical_not(c))
    _same(x + x, c + c)


def test_results_that_become_denormal():
    _on()
    c = torch.tensor([1e-30, 3e-20, -2e-35], dtype=torch.float32)
    x = c.to(DEV)
    _same(x * 1e-10, c * 1e-10)
    _same(torch.cumprod(x, 0), torch.cumprod(c, 0))
    _same(torch.exp(torch.tensor([-100.0, -95.0]).to(DEV)), torch.exp(torch.tensor([-100.0, -95.0])))
    z = torch.zeros(3)
    _same(torch.nextafter(z.to(DEV), torch.ones(3).to(DEV)), torch.nextafter(z, torch.ones(3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_exp_and_erfc_into_the_denormal_range(dtype):
    # XLA's exp and f32 erfc give 0 where the result is below the smallest normal number.
    _on()
    lo = -745.0 if dtype == torch.float64 else -104.0
    c = torch.cat([torch.linspace(lo, lo / 1.2, 200), torch.tensor([0.0, 1.0, float("nan"), float("-inf")])]).to(dtype)
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float64: 1e-13}[dtype]
    a, b = torch.exp(c.to(DEV)).cpu(), torch.exp(c)
    # a denormal has fewer bits: compare to within one unit of the smallest denormal as well
    unit = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    torch.testing.assert_close(a, b, rtol=tol, atol=unit, equal_nan=True)
    assert (a[:200] > 0).sum() == (b[:200] > 0).sum() > 0
    if dtype != torch.float64:
        e = torch.linspace(8.5, 10.2, 60).to(dtype)
        torch.testing.assert_close(torch.erfc(e.to(DEV)).cpu(), torch.erfc(e), rtol=1e-4 if dtype == torch.float32
                                   else 8e-3, atol=unit)


def test_large_parallel_graph_every_run():
    # Big enough for XLA to split loops across its intra-op threads; repeated, since a thread that
    # still flushed would show up as zeros in some runs.
    _on()
    c = torch.full((1 << 20,), 1e-40)
    x = c.to(DEV)
    for _ in range(5):
        _same((x * 3 > 0).sum(), torch.tensor(1 << 20))
    _same(x * 3 + x, c * 3 + c)


def test_graph_without_arguments():
    _on()
    n = 1 << 16
    _same(torch.arange(n, device=DEV, dtype=torch.float32) * 1e-44, torch.arange(n, dtype=torch.float32) * 1e-44)
    _same(torch.full((n,), 1e-40, device=DEV) * 3, torch.full((n,), 1e-40) * 3)


def test_gradient_and_training_step():
    _on()
    torch.manual_seed(0)
    w = (torch.randn(8, 4) * 1e-20).requires_grad_()
    xin = torch.randn(16, 8) * 1e-20
    wd = w.detach().to(DEV).requires_grad_()
    F.relu(xin @ w).sum().backward()
    F.relu(xin.to(DEV) @ wd).sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), w.grad, rtol=1e-5, atol=0)
    # relu's gradient at a denormal input is 1, not 0 (flushed: 0 > 0 is False)
    a = torch.tensor([1e-40, -1e-40, 1.0], requires_grad=True)
    ad = a.detach().to(DEV).requires_grad_()
    F.relu(a).sum().backward()
    F.relu(ad).sum().backward()
    _same(ad.grad, a.grad)


def test_convolution_host_kernel_on_denormals():
    # ATen's convolution runs inside the executable: it too sees the kept denormals.
    _on()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8) * 1e-38
    w = torch.randn(4, 3, 3, 3)
    _same(F.conv2d(x.to(DEV), w.to(DEV)) != 0, F.conv2d(x, w) != 0)


def test_set_flush_denormal_follows_eager():
    _on()
    c = torch.tensor([1e-40, 2.0])
    try:
        assert torch.set_flush_denormal(True)
        assert _C._denormals()[1] is False
        eager = c * 3
        _same(c.to(DEV) * 3, eager)
        assert eager[0].item() == 0.0
    finally:
        torch.set_flush_denormal(False)
    assert _C._denormals()[1] is True
    _same(c.to(DEV) * 3, c * 3)


def test_mode_is_part_of_the_cache_key():
    _on()
    x = torch.tensor([1e-40, 1.0], device=DEV)
    f = lambda: torch.atan2(x, x + 1).cumsum(0).cpu()  # a graph no other test builds
    f()
    met.clear_counters()
    f()
    assert met.counter_value("UncachedCompile") in (None, 0)
    try:
        torch.set_flush_denormal(True)
        f()
        assert met.counter_value("UncachedCompile") == 1
    finally:
        torch.set_flush_denormal(False)


def test_switched_off_in_process():
    _on()
    x = torch.tensor([1e-40], device=DEV)
    try:
        _C._set_keep_denormals(False)
        assert (x * 7).cpu().item() == 0.0  # XLA:CPU's own flushing
    finally:
        _C._set_keep_denormals(True)
    assert (x * 7).cpu().item() == (torch.tensor([1e-40]) * 7).item() != 0.0


def _run(env, code):
    e = dict(os.environ, PJRT_DEVICE="CPU", **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)


def test_env_flush_and_bad_value():
    _on()
    code = ("import torch, torch_xla; from torch_xla import _C; d = torch_xla.device(); "
            "print(_C._denormals()[:2], (torch.tensor([1e-40], device=d) > 0).item())")
    r = _run({"TORCH_XLA_DENORMALS": "flush"}, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(False, False) False"
    r = _run({"TORCH_XLA_DENORMALS": "sometimes"}, code)
    assert r.returncode != 0
    assert "TORCH_XLA_DENORMALS=sometimes" in r.stderr and "keep" in r.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("fn", [torch.log, torch.log2, torch.log10, torch.rsqrt, torch.lgamma, torch.logit,
                                torch.special.entr, lambda x: torch.xlogy(x, x)],
                         ids=["log", "log2", "log10", "rsqrt", "lgamma", "logit", "entr", "xlogy"])
def test_log_rsqrt_lgamma_of_denormals(fn, dtype):
    # XLA:CPU's log reads a denormal as the smallest normal number, its rsqrt as zero; the emitter
    # scales such inputs first (lowering/stablehlo.cc EmitDenormalSafe).
    _on()
    v = TINY[dtype]
    c = torch.tensor([v, -v, v / 7, 2 * v, 0.0, -0.0, 1.5, float("nan"), float("inf")], dtype=dtype)
    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float64: 1e-12}[dtype]
    atol = 1e-6 if fn is torch.lgamma else 0  # XLA's lgamma near its zero at 1.5: 3e-7 absolute
    torch.testing.assert_close(fn(c.to(DEV)).cpu(), fn(c), rtol=tol, atol=atol, equal_nan=True)
