"""Shared fixtures for the torch_xla integration tests (test_training, test_cache, test_views_inplace,
test_api, test_errors)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

# NB: no top-level `import torch` here: test_runtime.py runs the core without torch.

# The reference: eager's portable library paths. Many tests compare with eager bit for bit, and on
# some CPUs eager itself picks kernels whose roundings are the machine's own: on Intel CPUs with AMX
# oneDNN's bf16 GEMM accumulates in another order, with AVX512-FP16 its float16 eltwise kernels
# (gelu) compute in half precision, and MKL's AVX-512 code paths give a float64 sqrt that is not
# correctly rounded (sqrt(2.0) = 1.414213562373095) and an LU that leaves a ~1e-8 pivot on an
# exactly singular matrix (det -2.7e-07 instead of 0). Capping oneDNN at AVX512_CORE_BF16 and MKL
# at its conditional-numerical-reproducibility mode gives the results eager computes on AMD EPYC
# and older Intel CPUs on every machine (ours do not change: XLA's code is the same everywhere;
# host kernels run the same capped libraries). README "Known gaps" says what differs without the
# caps. TXLA_TEST_NATIVE_EAGER=1 compares with eager's native paths instead (expect the failures
# above on such CPUs). Set before torch loads MKL/oneDNN; worker subprocesses inherit them.
if os.environ.get("TXLA_TEST_NATIVE_EAGER", "0") != "1":
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    os.environ.setdefault("MKL_CBWR", "COMPATIBLE")


def _to(obj, device):
    """Moves tensors (also inside lists/tuples/dicts) to `device`; leaves other values alone."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def assert_close_tree(actual, expected, rtol=1e-5, atol=1e-6, what="result"):
    """Compares nested outputs; xla tensors are brought back with .cpu()."""
    import torch

    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual)}"
        assert actual.device.type == "xla", f"{what}: expected an xla tensor, got {actual.device}"
        torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{what}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close_tree(a, e, rtol, atol, f"{what}[{i}]")
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


def run_on_cpu_and_xla(fn, *inputs, rtol=1e-5, atol=1e-6, sync=True):
    """Runs fn(*inputs) on fresh CPU copies and on fresh xla copies of `inputs` (built on the CPU),
    then compares the returned values AND the (possibly mutated) inputs. Returns (cpu_out, xla_out)."""
    import torch
    import torch_xla

    dev = torch_xla.device()
    cpu_in = [_to(i, "cpu").clone() if isinstance(i, torch.Tensor) else i for i in inputs]
    xla_in = [_to(i, dev) for i in inputs]
    cpu_out = fn(*cpu_in)
    xla_out = fn(*xla_in)
    if sync:
        torch_xla.sync()
    assert_close_tree(xla_out, cpu_out, rtol, atol, "output")
    for k, (a, e) in enumerate(zip(xla_in, cpu_in)):
        assert_close_tree(a, e, rtol, atol, f"input {k} after fn")
    return cpu_out, xla_out


@pytest.fixture(autouse=True)
def _drop_failed_test_frames():
    """pytest keeps the last failure's traceback (sys.last_*), hence its frames and their xla tensors.
    A live tensor whose graph failed to compile makes every later sync fail, so one failing (or
    xfailing) test would poison the rest of the session: drop those frames after such a test."""
    yield
    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        sys.last_type = sys.last_value = sys.last_traceback = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()


@pytest.fixture
def clean_metrics():
    """Flushes pending work, then clears all counters/metrics so a test sees only its own."""
    import torch_xla
    import torch_xla.debug.metrics as met

    torch_xla.sync(wait=True)
    met.clear_all()
    yield met


def run_python(code: str, env_overrides: dict | None = None, timeout: float = 120):
    """Runs `code` in a fresh interpreter (the runtime reads its env vars once, at start).
    Returns CompletedProcess; stdout/stderr as text."""
    env = dict(os.environ)
    for k, v in (env_overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, "-c", code], env=env, cwd="/tmp", capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def python_subprocess():
    return run_python


@pytest.fixture
def cpu_xla_check():
    """The run_on_cpu_and_xla helper, as a fixture."""
    return run_on_cpu_and_xla
