"""Bad input must give a clear Python exception (no abort, no hang), and the runtime must keep
working afterwards. Subprocess cases run with a timeout."""

from __future__ import annotations

import re

import pytest
import torch

import torch_xla

SUBPROCESS_TIMEOUT = 120


@pytest.fixture
def pending_and_check():
    """Leaves a pending (un-synced) computation around the erroring call, then checks that the
    runtime still traces, compiles and runs: the pending value and a fresh op are correct."""
    dev = torch_xla.device()
    pending = torch.arange(4.0, device=dev) * 2
    yield
    fresh = torch.ones(3, device=dev).cumsum(0)
    torch_xla.sync()
    torch.testing.assert_close(pending.cpu(), torch.arange(4.0) * 2)
    torch.testing.assert_close(fresh.cpu(), torch.tensor([1.0, 2.0, 3.0]))


# ----------------------------------------------------------------------------- devices


def test_unknown_pjrt_device(python_subprocess):
    code = ("import torch, torch_xla\n"
            "try:\n    torch_xla.device()\nexcept ValueError as e:\n    print('VE1', e)\n"
            "try:\n    torch.ones(2, device='xla')\nexcept ValueError as e:\n    print('VE2', e)\n"
            "print('ALIVE')\n")
    r = python_subprocess(code, {"PJRT_DEVICE": "NOPE", "PJRT_PLUGIN_LIBRARY_PATH": None}, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"^VE1 .*NOPE", r.stdout, re.M), r.stdout
    assert re.search(r"^VE2 .*NOPE", r.stdout, re.M), r.stdout
    assert "ALIVE" in r.stdout


@pytest.mark.parametrize("index", [99, -1, 10**6])
def test_device_index_out_of_range(index, pending_and_check):
    with pytest.raises(IndexError, match=str(index)):
        torch_xla.device(index)


def test_device_index_wrong_type():
    with pytest.raises(TypeError):
        torch_xla.device("0")


def test_tensor_on_missing_device(pending_and_check):
    with pytest.raises(IndexError, match="99"):
        torch.ones(2, device="xla:99")


def test_xla_and_cpu_tensor_mixed(pending_and_check):
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(2, device=torch_xla.device()) + torch.ones(2)


# ----------------------------------------------------------------------------- shapes


SHAPE_ERRORS = {
    # name: (fn, regex that must appear in the message (sizes named))
    "add_broadcast": (lambda d: torch.ones(2, 3, device=d) + torch.ones(4, device=d), r"3.*4"),
    "mm_inner_dims": (lambda d: torch.mm(torch.ones(2, 3, device=d), torch.ones(4, 5, device=d)),
                      r"2.*3.*4.*5|3.*4"),
    "matmul_vec": (lambda d: torch.ones(2, 3, device=d) @ torch.ones(4, device=d), r"3.*4|4"),
    "cat_sizes": (lambda d: torch.cat([torch.ones(2, 3, device=d), torch.ones(2, 4, device=d)]), r"3.*4"),
    "view_numel": (lambda d: torch.ones(2, 3, device=d).view(4), r"\[4\].*6"),
    "inplace_broadcast": (lambda d: torch.ones(3, device=d).add_(torch.ones(2, 3, device=d)), r"3"),
    "index_oob": (lambda d: torch.ones(3, device=d)[5], r"5.*3"),
}


@pytest.mark.parametrize("name", list(SHAPE_ERRORS))
def test_shape_error_names_sizes(name, pending_and_check):
    fn, pattern = SHAPE_ERRORS[name]
    with pytest.raises(Exception) as cpu_err:
        fn("cpu")
    with pytest.raises((RuntimeError, IndexError)) as xla_err:
        fn(torch_xla.device())
        torch_xla.sync()
    msg = str(xla_err.value)
    assert re.search(pattern, msg, re.S), f"xla message does not name the sizes: {msg!r}"
    assert "Check failed" not in msg and "INTERNAL" not in msg, msg
    del cpu_err


@pytest.mark.parametrize("name", list(SHAPE_ERRORS))
def test_shape_error_same_exception_type_as_cpu(name):
    fn, _ = SHAPE_ERRORS[name]
    with pytest.raises(Exception) as cpu_err:
        fn("cpu")
    with pytest.raises(Exception) as xla_err:
        fn(torch_xla.device())
        torch_xla.sync()
    assert isinstance(xla_err.value, type(cpu_err.value)), (type(xla_err.value), type(cpu_err.value))


# ----------------------------------------------------------------------------- dtypes


# float8_e4m3fn and float8_e5m2 are supported (tests/test_float8.py); the fnuz variants are not.
UNSUPPORTED = [torch.complex32, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


@pytest.mark.parametrize("dtype", UNSUPPORTED, ids=[str(d).replace("torch.", "") for d in UNSUPPORTED])
@pytest.mark.parametrize("how", ["factory", "to_device", "cast_on_device"])
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_unsupported_dtype(dtype, how, pending_and_check):
    dev = torch_xla.device()
    dtype_name = {torch.complex32: r"ComplexHalf|complex32|chalf",
                  torch.float8_e4m3fnuz: r"(?i)float8_e4m3fnuz", torch.float8_e5m2fnuz: r"(?i)float8_e5m2fnuz"}[dtype]
    with pytest.raises((TypeError, RuntimeError), match=dtype_name):
        if how == "factory":
            torch.zeros(2, dtype=dtype, device=dev)
        elif how == "to_device":
            torch.zeros(2).to(dtype).to(dev)
        else:
            torch.ones(2, device=dev).to(dtype)
        torch_xla.sync()


# ----------------------------------------------------------------------------- recovery


def test_runtime_recovers_after_many_errors():
    dev = torch_xla.device()
    w = torch.arange(6.0).reshape(2, 3)
    wx = w.to(dev)
    for i in range(5):
        with pytest.raises(RuntimeError):
            torch.mm(wx, torch.ones(2, 2, device=dev))
        wx = wx * 2 + i  # keep building on the same lazy tensor between errors
        w = w * 2 + i
    torch_xla.sync()
    torch.testing.assert_close(wx.cpu(), w)


def test_error_in_backward_leaves_runtime_usable():
    dev = torch_xla.device()
    x = torch.ones(3, device=dev, requires_grad=True)
    y = (x * 2).sum()
    with pytest.raises(RuntimeError):
        y.backward(torch.ones(5, device=dev))  # wrong grad_output shape
    (x * 3).sum().backward()
    torch_xla.sync()
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 3.0))
