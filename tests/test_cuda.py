"""PJRT_DEVICE=CUDA (issue #14).

Everywhere: plugin discovery, and the error paths (no plugin installed; a plugin installed but no
GPU) raise a clear Python exception, never an abort. On a GPU machine (PJRT_DEVICE=CUDA and a GPU, as
scripts/gpu_check.sh runs it): the device kind, memory figures from PJRT and bf16/f16 results against
eager CPU.
"""
from __future__ import annotations

import os
import re

import pytest

from torch_xla._internal import cuda_libs, plugins

SUBPROCESS_TIMEOUT = 180


def _cuda_plugin() -> str | None:
    for candidate in plugins._DEVICES["CUDA"].candidates:
        path = plugins._locate(candidate)
        if path is not None:
            return path
    return None


def _gpu_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


ON_CUDA = os.environ.get("PJRT_DEVICE", "").strip().upper() in ("CUDA", "GPU") and _gpu_present()
_CLEAN = {"PJRT_PLUGIN_LIBRARY_PATH": None, "TORCH_XLA_PLUGIN_PATH": None, "GPU_NUM_DEVICES": None}

_NO_ABORT = ("import torch, torch_xla\n"
             "try:\n    torch_xla.device()\nexcept Exception as e:\n"
             "    print('RAISED', type(e).__name__, '|', str(e).replace(chr(10), ' '))\n"
             "try:\n    torch.ones(2, device='xla')\nexcept Exception as e:\n"
             "    print('RAISED2', type(e).__name__)\n"
             "print('ALIVE')\n")


@pytest.mark.parametrize("name", ["CUDA", "GPU", "cuda"])
def test_no_cuda_plugin_installed_names_the_wheel(python_subprocess, name):
    """With no CUDA plugin installed, PJRT_DEVICE=CUDA/GPU says what to pip install."""
    code = ("import torch_xla._internal.plugins as p\n"
            "p._locate = lambda candidate: None\n" + _NO_ABORT)
    r = python_subprocess(code, {"PJRT_DEVICE": name, **_CLEAN}, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"^RAISED (\w+) \| (.*)$", r.stdout, re.M)
    assert m, r.stdout + r.stderr[-2000:]
    assert m.group(1) == "RuntimeError"
    assert "PJRT_DEVICE=CUDA" in m.group(2) and "pip install xla-cuda13-pjrt" in m.group(2)
    assert "jax-cuda13-pjrt" in m.group(2) and "PJRT_PLUGIN_LIBRARY_PATH" in m.group(2)
    assert "RAISED2 RuntimeError" in r.stdout and "ALIVE" in r.stdout


def test_cuda_plugin_discovery_finds_installed_wheel():
    path = _cuda_plugin()
    if path is None:
        pytest.skip("no CUDA PJRT plugin wheel installed (jax-cuda13-pjrt or xla-cuda13-pjrt)")
    assert os.path.basename(path) in ("xla_cuda_plugin.so", "xla_gpu_pjrt.so")
    got, canonical = plugins.plugin_for("GPU")
    assert canonical == "CUDA" and os.path.isfile(got)


@pytest.mark.skipif(_gpu_present(), reason="a GPU is present: the no-GPU error path cannot be shown here")
@pytest.mark.parametrize("name", ["CUDA", "GPU"])
def test_cuda_plugin_without_gpu_raises_plugin_reason(python_subprocess, name):
    """A CUDA plugin installed on a machine with no GPU: the plugin's own reason comes back as a
    Python RuntimeError naming the plugin; the process lives on (no abort)."""
    path = _cuda_plugin()
    if path is None:
        pytest.skip("no CUDA PJRT plugin wheel installed: pip install jax-cuda13-pjrt (or xla-cuda13-pjrt)")
    r = python_subprocess(_NO_ABORT, {"PJRT_DEVICE": name, **_CLEAN}, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    m = re.search(r"^RAISED (\w+) \| (.*)$", r.stdout, re.M)
    assert m, r.stdout + r.stderr[-2000:]
    assert m.group(1) == "RuntimeError", m.group(0)
    msg = m.group(2)
    assert os.path.basename(path) in msg, msg  # names the plugin it tried
    assert re.search(r"cuda|gpu|device", msg, re.I), msg  # and the plugin's reason
    assert "ALIVE" in r.stdout


@pytest.mark.skipif(_gpu_present(), reason="a GPU is present: the no-GPU error path cannot be shown here")
def test_cpu_num_devices_does_not_reach_the_cuda_plugin(python_subprocess):
    """CPU_NUM_DEVICES left in the env must not become a create option of the CUDA plugin (which
    refuses option names it does not know): the error stays the plugin's no-GPU reason."""
    if _cuda_plugin() is None:
        pytest.skip("no CUDA PJRT plugin wheel installed")
    r = python_subprocess(_NO_ABORT, {"PJRT_DEVICE": "CUDA", "CPU_NUM_DEVICES": "4", **_CLEAN}, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RAISED RuntimeError" in r.stdout and "Unexpected option" not in r.stdout, r.stdout


@pytest.mark.skipif(_gpu_present(), reason="a GPU is present: the no-GPU error path cannot be shown here")
def test_cuda_client_options_pass_the_plugins_validation(monkeypatch):
    """Every create option we derive from env (names and types) is one the CUDA plugin accepts: it
    validates them before it looks for a GPU, so the error is about the GPU, not an option."""
    path = _cuda_plugin()
    if path is None:
        pytest.skip("no CUDA PJRT plugin wheel installed")
    from torch_xla import _core

    rt = _core.runtime
    for var, value in (("PJRT_ALLOCATOR_PREALLOCATE", "1"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5"),
                       ("PJRT_ALLOCATOR_CUDA_ASYNC", "1"), ("GPU_NUM_DEVICES", "1")):
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TORCH_XLA_SPAWNED", raising=False)
    opts = plugins.client_options("CUDA")
    assert set(opts) == {"preallocate", "memory_fraction", "allocator", "visible_devices"}
    with pytest.raises(RuntimeError) as info:
        rt.Client.create(path, options=opts)
    assert "Unexpected option" not in str(info.value) and "GPU" in str(info.value), str(info.value)
    with pytest.raises(RuntimeError, match="Unexpected option name"):  # the validation is real
        rt.Client.create(path, options={"cpu_device_count": 4})


def test_cuda_libs_preload_is_harmless_without_nvidia_wheels(tmp_path, monkeypatch):
    # A fake nvidia tree with a file that is no library: skipped, no exception.
    lib = tmp_path / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudnn.so.9").write_bytes(b"not an ELF file")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cuda_libs, "_loaded", {})
    assert str(lib) in cuda_libs._nvidia_lib_dirs()
    loaded = cuda_libs.preload()
    # (a machine with the real nvidia wheels loads its own libcudnn.so.9, from its own folder)
    assert loaded.get("libcudnn.so.9") != str(lib / "libcudnn.so.9")


_PLATFORM_PRECISION = r"""
import torch, torch_xla, torch_xla.core.xla_model as xm
from torch_xla import _C, backends
dev = torch_xla.device()
_C._set_platform_f32_mat_mul_precision(2)  # what the runtime sets on CUDA
f32, bf16 = torch.randn(8, 8, device=dev), torch.randn(8, 8, device=dev).bfloat16()
w = torch.randn(1, 1, 3, 3, device=dev)
conv = lambda x, w: torch.nn.functional.conv2d(x.reshape(1, 1, 8, 8), w)
H = "precision = [HIGHEST, HIGHEST]"
assert backends.get_mat_mul_precision() == "default"  # nothing chosen by the user
assert H in xm.get_stablehlo([f32 @ f32]), "f32 dot"
assert "#stablehlo<precision HIGHEST>" in xm.get_stablehlo([conv(f32, w)]), "f32 conv"
assert "precision" not in xm.get_stablehlo([bf16 @ bf16]), "bf16 dot"
d = torch_xla._XLAC._xla_dot_general(f32, f32, (([1], [0]), ([], [])), precision_config="high")
assert "precision = [HIGH, HIGH]" in xm.get_stablehlo([d]), "_xla_dot_general's own precision"
assert H in xm.get_stablehlo([f32 @ f32]), "after _xla_dot_general: still unset"
backends.set_mat_mul_precision("default")  # the user's choice wins: TF32 allowed
assert "precision" not in xm.get_stablehlo([f32 @ f32]), "explicit default"
backends.set_mat_mul_precision("high")
assert "precision = [HIGH, HIGH]" in xm.get_stablehlo([f32 @ f32]), "explicit high"
torch.testing.assert_close((f32 @ f32).cpu(), f32.cpu() @ f32.cpu())
print("OK")
"""


def test_platform_f32_mat_mul_precision(python_subprocess):
    """On CUDA the runtime makes float32 dots and convolutions HIGHEST until the user chooses a
    precision (XLA:GPU's DEFAULT is TF32; eager's float32 matmuls are full float32). Checked here on
    the CPU plugin by setting the platform's precision as the CUDA runtime does."""
    try:
        plugins.plugin_for("CPU")
    except RuntimeError:
        pytest.skip("needs the CPU plugin (xla-cpu-pjrt), which a GPU machine may lack")
    # (no host kernels: on CUDA convolutions are always XLA's)
    r = python_subprocess(_PLATFORM_PRECISION, {"PJRT_DEVICE": "CPU", "TORCH_XLA_HOST_KERNELS": "0"}, SUBPROCESS_TIMEOUT)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]

# ------------------------------------------------------------------ on a GPU (PJRT_DEVICE=CUDA)

gpu = pytest.mark.skipif(not ON_CUDA, reason="needs PJRT_DEVICE=CUDA and a GPU (scripts/gpu_check.sh)")


@gpu
def test_device_hw_is_cuda():
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    dev = torch_xla.device()
    assert xm.xla_device_hw(dev) == "CUDA"
    assert xr.device_type() in ("CUDA", "GPU")
    assert torch_xla.device_count() >= 1


@gpu
def test_memory_info_from_pjrt_stats():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    before = xm.get_memory_info(dev)
    x = torch.ones(64, 1024, 1024, device=dev)  # 256 MiB
    torch_xla.sync()
    after = xm.get_memory_info(dev)
    assert after["bytes_limit"] > 0 and after["kb_total"] == after["bytes_limit"] // 1024
    assert after["bytes_used"] >= before["bytes_used"] + 200 * 2**20
    assert after["peak_bytes_used"] >= after["bytes_used"]
    del x


@gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32"])
def test_low_precision_matches_eager_cpu(dtype_name):
    import torch
    import torch.nn.functional as F
    import torch_xla

    dtype = getattr(torch, dtype_name)
    dev = torch_xla.device()
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(128, 256, generator=g).to(dtype), torch.randn(256, 64, generator=g).to(dtype))
    ref = F.softmax(F.gelu(a @ b), dim=-1).sum(0)
    got = F.softmax(F.gelu(a.to(dev) @ b.to(dev)), dim=-1).sum(0).cpu()
    assert got.dtype == dtype
    tol = {"bfloat16": 3e-2, "float16": 5e-3, "float32": 1e-4}[dtype_name]
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


# ------------------------------------------------------------------ scripts/gpu_check.sh's summary


def test_gpu_check_summary(tmp_path):
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "gpu_check_util", os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "gpu_check_util.py"))
    util = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(util)
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "stages.tsv").write_text("build\t0\t61.5\t240\ntests:test_models\t124\t90.0\t90\n")
    (work / "tests_test_cache.log").write_text(
        "..F.s\nFAILED tests/test_cache.py::test_x - AssertionError\n1 failed, 3 passed, 1 skipped in 9.1s\n")
    (out / "bench_gpu.json").write_text(json.dumps({"results": [{"model": "gpt2", "status": "ok"}]}))
    rep = util.summary(str(out), str(work))
    assert rep["stages"][0] == {"stage": "build", "rc": 0, "seconds": 61.5, "limit_s": 240.0, "timed_out": False}
    assert rep["stages"][1]["timed_out"] is True and rep["ok"] is False
    assert rep["tests"]["test_cache"] == {"failed": 1, "passed": 3, "skipped": 1,
                                          "failed_ids": ["tests/test_cache.py::test_x"]}
    assert rep["bench"]["results"][0]["model"] == "gpt2"
    assert json.loads((out / "gpu_check.json").read_text())["tests"]["test_cache"]["passed"] == 3
