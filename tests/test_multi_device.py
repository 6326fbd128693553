"""In-process tests that need several devices of one process, run again with CPU_NUM_DEVICES=4.

The CPU plugin has 1 device by default (upstream's default, see torch_xla/_internal/plugins.py), so
in the main test process these tests skip their multi-device parts; here a fresh pytest process with
4 CPU devices runs them in full (tensors on xla:1, copies between devices, two devices mixed in one
op, spawn's fork check, devices listed by the runtime, a mesh over every device).
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

NODES = [
    "test_api.py::test_default_devices",
    "test_api.py::test_tensor_on_second_device",
    "test_api.py::test_copy_both_ways",
    "test_distributed.py::test_spawn_rejects_bad_arguments",
    "test_never_wrong.py::test_raises_as_eager[two_xla_devices]",
    "test_compat_surface.py::test_step_context_syncs_and_real_devices",
    "test_compat_surface.py::test_runtime_set_device_type",
    "test_compat_surface.py::test_xlac_hooks",
    "test_compat_surface.py::test_spmd_mesh_works_sharding_needs_use_spmd",
]


def test_multi_device_tests_with_4_cpu_devices():
    env = dict(os.environ, CPU_NUM_DEVICES="4", PJRT_DEVICE="CPU")
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCH_XLA_SPAWNED"):
        env.pop(k, None)
    code = ("import sys, torch_xla, pytest\n"
            "assert torch_xla.device_count() == 4, torch_xla.device_count()\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rs', *sys.argv[1:]]))\n")
    r = subprocess.run([sys.executable, "-c", code, *NODES], cwd=HERE, env=env, capture_output=True, text=True,
                       timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert f"{len(NODES)} passed" in out and "skipped" not in out, out[-3000:]
