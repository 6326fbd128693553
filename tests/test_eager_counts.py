"""EagerOpCompileTime / EagerOpExecuteTime sample counts in eager mode, as upstream PyTorch/XLA's
eager-mode tests expect them: one compile per new op signature, one execution per op (randn: its
zero-filled empty and the fill), optimization_barrier_ runs as one op, native_batch_norm and svd
run their outputs (and the running statistics) in one graph."""
import pytest
import torch
import torch.nn as nn

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

DEV = torch_xla.device()


def _counts():
    c = met.metric_data("EagerOpCompileTime")
    e = met.metric_data("EagerOpExecuteTime")
    return (c[0] if c else 0), (e[0] if e else 0)


@pytest.fixture
def eager():
    torch_xla.experimental.eager_mode(True)
    try:
        yield
    finally:
        torch_xla.experimental.eager_mode(False)


def test_eager_basic(eager):
    xm.wait_device_ops()
    met.clear_all()
    t1 = torch.randn(5, 5, device=DEV)
    xm.wait_device_ops()
    assert _counts() == (2, 2)
    t1 *= 5
    xm.wait_device_ops()
    assert _counts() == (3, 3)


def test_eager_recompile(eager):
    t1 = torch.randn(5, 5, device=DEV)
    xm.wait_device_ops()
    met.clear_all()
    t2 = torch.logsumexp(t1, 0)
    xm.wait_device_ops()
    assert _counts() == (1, 1)
    t3 = torch.logsumexp(t1, 0)
    xm.wait_device_ops()
    assert _counts() == (1, 2)  # no recompilation
    torch.testing.assert_close(t3.cpu(), torch.logsumexp(t1.cpu(), 0))


def test_eager_optimization_barrier(eager):
    t1 = torch.randn(5, 5, device=DEV)
    xm.wait_device_ops()
    met.clear_all()
    xm.optimization_barrier_([t1])
    xm.wait_device_ops()
    assert _counts() == (1, 1)
    assert not torch_xla._C._has_pending(t1)


def test_eager_random_seed_no_recompile(eager):
    met.clear_all()
    t1 = torch.randn(12, 13, device=DEV)
    xm.wait_device_ops()
    c = _counts()[0]
    t2 = torch.randn(12, 13, device=DEV)
    xm.wait_device_ops()
    assert _counts()[0] == c
    assert not torch.allclose(t1.cpu(), t2.cpu())


def test_eager_batch_norm_runs_once_with_running_stats(eager):
    m = nn.BatchNorm2d(16).to(DEV)
    m.train()
    x = torch.randn(8, 16, 8, 32).to(DEV)
    xm.wait_device_ops()
    met.clear_all()
    m(x)
    assert "xla::native_batch_norm" in met.counter_names()
    assert _counts()[1] <= 4
    assert not torch_xla._C._has_pending(m.running_mean)  # materialized with the outputs
    ref = nn.BatchNorm2d(16).train()
    ref(x.cpu())
    torch.testing.assert_close(m.running_mean.cpu(), ref.running_mean, rtol=1e-5, atol=1e-6)


def test_eager_svd_runs_once(eager):
    a = torch.randn(5, 3).to(DEV)
    xm.wait_device_ops()
    met.clear_all()
    u, s, v = torch.svd(a)
    assert "xla::_linalg_svd" in met.counter_names()
    assert _counts()[1] <= 4
    assert not torch_xla._C._has_pending(u)
    torch.testing.assert_close(s.cpu(), torch.linalg.svdvals(a.cpu()), rtol=1e-5, atol=1e-5)
