"""Public Python API of torch_xla: devices, runtime, version, tensor transfer/factories/dtypes,
StableHLO dump and the metrics report. Values are always checked against eager CPU."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
import torch
import torch.nn as nn

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr

SUBPROCESS_TIMEOUT = 120


# Subprocess env overrides: drop any variable that would change the runtime's configuration.
DEFAULT_ENV = {"CPU_NUM_DEVICES": None, "PJRT_DEVICE": None, "PJRT_PLUGIN_LIBRARY_PATH": None}


# ----------------------------------------------------------------------------- devices / runtime


def test_default_devices():
    assert torch_xla.device() == torch.device("xla", 0)
    n = torch_xla.device_count()
    assert n >= 1
    assert torch_xla.devices() == [torch.device("xla", i) for i in range(n)]
    assert torch_xla.device(n - 1) == torch.device("xla", n - 1)
    assert xm.xla_device() == torch.device("xla", 0)
    assert xm.xla_device(n - 1) == torch.device("xla", n - 1)
    assert xm.xla_device_hw(torch_xla.device()) == "CPU"
    assert xm.xla_device_hw("xla:0") == "CPU"
    assert xr.device_type() == "CPU"


def test_cpu_has_1_device_by_default(python_subprocess):
    """Upstream's default (CPU_NUM_DEVICES unset: 1 device), not the plugin's own 4 (see plugins.py)."""
    env = DEFAULT_ENV
    code = ("import torch_xla, torch_xla.runtime as xr\n"
            "import torch_xla.distributed.xla_multiprocessing as xmp\n"
            "print('N', torch_xla.device_count(), xr.global_runtime_device_count(), xmp._devices_per_host())\n")
    r = python_subprocess(code, env, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "N 1 1 1" in r.stdout, r.stdout


def test_cpu_num_devices_env(python_subprocess):
    env = dict(DEFAULT_ENV, CPU_NUM_DEVICES="2")
    code = ("import torch, torch_xla\n"
            "print('N', torch_xla.device_count(), len(torch_xla.devices()))\n"
            "print('T', (torch.ones(2, device='xla:1') + 1).cpu().tolist())\n"
            "try:\n    torch_xla.device(2)\nexcept IndexError:\n    print('IDX ok')\n")
    r = python_subprocess(code, env, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "N 2 2" in r.stdout and "T [2.0, 2.0]" in r.stdout and "IDX ok" in r.stdout, r.stdout


def test_import_does_not_start_runtime(python_subprocess):
    code = ("import torch_xla, torch_xla.core.xla_model, torch_xla.debug.metrics, torch_xla.runtime\n"
            "print('STARTED', torch_xla._C._client_started())\n"
            "torch_xla.device_count()\n"
            "print('AFTER', torch_xla._C._client_started())\n")
    r = python_subprocess(code, DEFAULT_ENV, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "STARTED False" in r.stdout and "AFTER True" in r.stdout, r.stdout


def test_tensor_on_second_device():
    if torch_xla.device_count() < 2:
        pytest.skip("needs 2 devices")
    d1 = torch_xla.device(1)
    x = torch.arange(4.0, device=d1) * 2
    torch_xla.sync()
    assert x.device == d1
    torch.testing.assert_close(x.cpu(), torch.arange(4.0) * 2)


# ----------------------------------------------------------------------------- version


def _parse_release(v: str):
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", v)
    assert m, f"not a version: {v!r}"
    return tuple(int(g or 0) for g in m.groups())


def test_version_is_pep440_and_recent():
    v = torch_xla.__version__
    assert isinstance(v, str)
    try:
        from packaging.version import Version
    except ImportError:  # pragma: no cover - packaging is in the venv
        assert re.match(r"^\d+\.\d+(\.\d+)?([ab]|rc)?\d*(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9.]+)?$", v), v
        assert _parse_release(v) >= (2, 5, 0)
    else:
        parsed = Version(v)  # raises InvalidVersion if not PEP 440
        assert parsed >= Version("2.5")
    assert importlib.metadata.version("torch_xla") == v


# ----------------------------------------------------------------------------- transfers


def test_to_cpu_item_repr_roundtrip():
    dev = torch_xla.device()
    c = torch.tensor([[1.5, -2.0], [3.25, 4.0]])
    x = c.to(dev)
    assert x.device.type == "xla" and x.dtype == c.dtype and x.shape == c.shape
    torch.testing.assert_close(x.cpu(), c)
    torch.testing.assert_close(x.to("cpu"), c)
    assert (x.sum()).item() == c.sum().item()
    assert torch.tensor(7, device=dev).item() == 7
    r = repr(x + 1)
    assert "device='xla:0'" in r and "2.5000" in r and "5.0000" in r
    assert str(x + 1) == r
    # .to(device) of an xla tensor is a no-op alias, .to(dtype) converts
    assert x.to(dev) is x
    torch.testing.assert_close(x.to(torch.float64).cpu(), c.double())


def test_copy_both_ways():
    dev = torch_xla.device()
    src = torch.arange(6.0).reshape(2, 3)
    x = torch.zeros(2, 3, device=dev)
    x.copy_(src)  # cpu -> xla
    x.mul_(2)
    out = torch.empty(2, 3)
    out.copy_(x)  # xla -> cpu
    torch.testing.assert_close(out, src * 2)
    # broadcasting + dtype conversion in copy_
    y = torch.zeros(2, 3, dtype=torch.int32, device=dev)
    y.copy_(torch.tensor([1.7, -2.2, 3.0]))
    torch.testing.assert_close(y.cpu(), torch.zeros(2, 3, dtype=torch.int32).copy_(torch.tensor([1.7, -2.2, 3.0])))
    # xla -> xla on another device
    if torch_xla.device_count() > 1:
        z = torch.empty(2, 3, device=torch_xla.device(1))
        z.copy_(x)
        torch.testing.assert_close(z.cpu(), src * 2)


def test_module_to_device():
    torch.manual_seed(0)
    m_cpu = nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Tanh(), nn.Linear(5, 2))
    m_xla = nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Tanh(), nn.Linear(5, 2))
    m_xla.load_state_dict(m_cpu.state_dict())
    dev = torch_xla.device()
    assert m_xla.to(dev) is m_xla
    assert all(p.device.type == "xla" for p in m_xla.parameters())
    inp = torch.linspace(-1, 1, 12).reshape(4, 3)
    torch.testing.assert_close(m_xla(inp.to(dev)).cpu(), m_cpu(inp), rtol=1e-5, atol=1e-5)
    sd = m_xla.state_dict()
    assert all(v.device.type == "xla" for v in sd.values())
    for k, v in m_cpu.state_dict().items():
        torch.testing.assert_close(sd[k].cpu(), v)
    back = m_xla.to("cpu")
    assert all(p.device.type == "cpu" for p in back.parameters())
    torch.testing.assert_close(back(inp), m_cpu(inp))


def test_batchnorm_running_stats_match_cpu():
    torch.manual_seed(0)
    bn_cpu, bn_xla = nn.BatchNorm1d(3), nn.BatchNorm1d(3).to(torch_xla.device())
    inp = torch.linspace(-1, 1, 12).reshape(4, 3)
    out_cpu, out_xla = bn_cpu(inp), bn_xla(inp.to(torch_xla.device()))
    torch_xla.sync()
    torch.testing.assert_close(out_xla.cpu(), out_cpu)
    assert bn_xla.num_batches_tracked.item() == 1
    torch.testing.assert_close(bn_xla.running_mean.cpu(), bn_cpu.running_mean)
    torch.testing.assert_close(bn_xla.running_var.cpu(), bn_cpu.running_var)


# ----------------------------------------------------------------------------- factories


DETERMINISTIC_FACTORIES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones_i64": lambda d: torch.ones(4, dtype=torch.int64, device=d),
    "full": lambda d: torch.full((2, 2), 7.5, device=d),
    "full_int": lambda d: torch.full((3,), 4, device=d),
    "empty_fill": lambda d: torch.empty(3, 2, device=d).fill_(-1.25),
    "arange": lambda d: torch.arange(10, device=d),
    "arange_float_step": lambda d: torch.arange(0.0, 2.0, 0.25, device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2, 2, dtype=torch.int32, device=d)),
    "ones_like": lambda d: torch.ones_like(torch.zeros(3, device=d)),
    "full_like": lambda d: torch.full_like(torch.zeros(2, 3, device=d), 3.0),
    "empty_like_fill": lambda d: torch.empty_like(torch.zeros(2, 3, device=d)).fill_(9),
    "eye": lambda d: torch.eye(3, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "tensor": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
}


@pytest.mark.parametrize("name", list(DETERMINISTIC_FACTORIES))
def test_factories_match_cpu(name):
    make = DETERMINISTIC_FACTORIES[name]
    ref = make("cpu")
    x = make(torch_xla.device())
    assert x.device.type == "xla"
    assert x.dtype == ref.dtype and x.shape == ref.shape
    torch.testing.assert_close(x.cpu(), ref)


RANDOM_FACTORIES = {
    "rand": (lambda d, like: torch.rand(500, device=d), (0.0, 1.0), torch.float32),
    "randn": (lambda d, like: torch.randn(500, device=d), None, torch.float32),
    "randint": (lambda d, like: torch.randint(3, 9, (500,), device=d), (3, 8), torch.int64),
    "rand_like": (lambda d, like: torch.rand_like(like), (0.0, 1.0), torch.float32),
    "randn_like": (lambda d, like: torch.randn_like(like), None, torch.float32),
}


@pytest.mark.parametrize("name", list(RANDOM_FACTORIES))
def test_random_factories(name):
    """Random values cannot match CPU bit-for-bit; check dtype/shape/range/moments, and that the
    same torch_xla seed reproduces them."""
    make, bounds, dtype = RANDOM_FACTORIES[name]
    dev = torch_xla.device()
    like = torch.zeros(500, device=dev)
    torch_xla.manual_seed(11)
    a = make(dev, like).cpu()
    torch_xla.manual_seed(11)
    b = make(dev, like).cpu()
    ref = make("cpu", torch.zeros(500))
    assert a.dtype == ref.dtype == dtype and a.shape == ref.shape
    assert torch.equal(a, b)
    assert a.unique().numel() > 4
    if bounds is not None:
        lo, hi = bounds
        assert a.min() >= lo and a.max() <= hi
        if dtype == torch.float32:
            assert a.max() < hi and abs(a.mean().item() - 0.5) < 0.1
        else:
            assert set(a.unique().tolist()) == set(range(lo, hi + 1))
    else:
        assert abs(a.mean().item()) < 0.2 and abs(a.std().item() - 1.0) < 0.15


# ----------------------------------------------------------------------------- dtypes


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).replace("torch.", "") for d in DTYPES])
def test_dtype_roundtrip_and_arith(dtype):
    dev = torch_xla.device()
    base = torch.tensor([0, 1, 2, 3, 5, 7, 100, 127])
    if dtype == torch.bool:
        c = base % 2 == 1
    elif dtype.is_complex:
        c = torch.complex(base.float(), -base.float() / 2).to(dtype)
    else:
        c = base.to(dtype)
    x = c.to(dev)
    assert x.dtype == dtype
    back = x.cpu()
    assert back.dtype == dtype and torch.equal(back, c)
    # A computation that stays in the dtype, compared with eager CPU.
    if dtype == torch.bool:
        fn = lambda t: (t | t.flip(0)) & ~t.roll(1)  # noqa: E731
    else:
        fn = lambda t: t * 2 + t.flip(0) - t  # noqa: E731  (wraps identically for small ints)
    got = fn(x).cpu()
    assert got.dtype == fn(c).dtype
    torch.testing.assert_close(got, fn(c))


COMPLEX_OPS = {
    "ones": lambda d: torch.ones(2, dtype=torch.complex64, device=d),
    "zeros": lambda d: torch.zeros(2, dtype=torch.complex64, device=d),
    "complex": lambda d: torch.complex(torch.ones(2, device=d), torch.full((2,), -2.0, device=d)),
    "conj_physical": lambda d: torch.tensor([1 + 2j, 3 - 1j], device=d).conj_physical(),
    "abs": lambda d: torch.tensor([3 + 4j, -1j], device=d).abs(),
    "mul_conj": lambda d: torch.tensor([1 + 2j, 3 - 1j], device=d) * torch.tensor([1 + 2j, 3 - 1j], device=d).conj(),
    "view_as_real": lambda d: torch.view_as_real(torch.tensor([1 + 2j, 3 - 1j], device=d)) * 2,
    "real_imag": lambda d: torch.tensor([1 + 2j, 3 - 1j], device=d).real - torch.tensor([1 + 2j], device=d).imag,
}


@pytest.mark.parametrize("name", list(COMPLEX_OPS))
def test_complex64_ops_match_cpu(name):
    fn = COMPLEX_OPS[name]
    ref = fn("cpu")
    got = fn(torch_xla.device())
    torch_xla.sync()
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got.cpu(), ref)


def test_dtype_conversions_match_cpu():
    dev = torch_xla.device()
    c = torch.tensor([-2.7, -0.5, 0.0, 0.49, 1.5, 2.5, 300.0])
    x = c.to(dev)
    for dt in [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float64, torch.bool]:
        torch.testing.assert_close(x.to(dt).cpu(), c.to(dt), msg=lambda m: f"{dt}: {m}")
    torch.testing.assert_close((x.to(torch.int32) + 1).cpu(), c.to(torch.int32) + 1)


def test_type_promotion_matches_cpu():
    dev = torch_xla.device()
    a, b = torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([0.5, 1.5, 2.5], dtype=torch.float16)
    for fn in (lambda p, q: p + q, lambda p, q: p * 2.5, lambda p, q: p / 2, lambda p, q: q + 1.0,
               lambda p, q: p + torch.tensor(3, dtype=torch.int64, device=p.device)):
        ref = fn(a, b)
        got = fn(a.to(dev), b.to(dev))
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got.cpu(), ref)


# ----------------------------------------------------------------------------- stablehlo / metrics


def test_get_stablehlo():
    dev = torch_xla.device()
    x = torch.ones(2, 3, device=dev)
    text = xm.get_stablehlo([x * 2 + 1])
    assert isinstance(text, str)
    assert "stablehlo" in text and "func.func" in text
    assert "2x3xf32" in text
    # Dumping does not execute or lose the pending computation.
    y = x * 2 + 1
    xm.get_stablehlo([y])
    torch.testing.assert_close(y.cpu(), torch.full((2, 3), 3.0))


def test_metrics_report_format(clean_metrics):
    met = clean_metrics
    dev = torch_xla.device()
    x = torch.arange(4.0, device=dev) * 3
    torch_xla.sync()
    torch.testing.assert_close(x.cpu(), torch.arange(4.0) * 3)
    report = met.metrics_report()
    assert "Metric: CompileTime\n  TotalSamples:" in report
    assert "Counter: MarkStep\n  Value:" in report
    assert met.counter_value("MarkStep") == 1
    assert met.counter_value("NoSuchCounter") is None
    data = met.metric_data("CompileTime")
    assert data is not None and data[0] >= 1 and data[1] > 0
    assert "MarkStep" in met.counter_names() and "CompileTime" in met.metric_names()
    short = met.short_metrics_report()
    assert "Counter: MarkStep" in short and "Metric: CompileTime" in short
    met.clear_all()
    assert met.counter_value("MarkStep") in (None, 0)
    assert "Counter: MarkStep\n  Value: 1" not in met.metrics_report()


def test_wait_device_ops_and_sync_wait():
    dev = torch_xla.device()
    x = torch.ones(3, device=dev).cumsum(0)
    torch_xla.sync(wait=True)
    xm.wait_device_ops()
    xm.mark_step()
    torch.testing.assert_close(x.cpu(), torch.tensor([1.0, 2.0, 3.0]))
