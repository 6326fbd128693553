"""SPMD (issue #10): one program over the 4 CPU devices through XLA's SPMD partitioner.

`use_spmd()` is process-global, so the cases run in fresh interpreters (tests/_spmd_workers.py):
one process per group (basic, training) and two for the persistent cache (cold, warm); each case
is reported here as its own test. Every value is compared with eager PyTorch on the CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _spmd_workers  # noqa: E402

WORKER = os.path.join(HERE, "_spmd_workers.py")


def _run(group: str, *extra: str, timeout: float = 600) -> tuple[dict, str]:
    env = dict(os.environ, CPU_NUM_DEVICES="4", PJRT_DEVICE="CPU")
    env.pop("XLA_USE_BF16", None)
    proc = subprocess.run([sys.executable, WORKER, group, *extra], env=env, cwd="/tmp", capture_output=True,
                          text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("@@RESULTS@@")]
    if not lines:
        raise AssertionError(f"worker {group} failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("@@RESULTS@@"):]), proc.stdout


_results: dict = {}


def _group_results(group: str) -> dict:
    if group not in _results:
        _results[group] = _run(group)[0]
    return _results[group]


def _cases(group):
    return [fn.__name__ for fn in _spmd_workers.GROUPS[group]]


@pytest.mark.parametrize("name", _cases("basic"))
def test_spmd_basic(name):
    result = _group_results("basic")[name]
    assert result == "ok", result


@pytest.mark.parametrize("name", _cases("training"))
def test_spmd_training(name):
    result = _group_results("training")[name]
    assert result == "ok", result


def test_spmd_persistent_cache(tmp_path):
    """A second process loads the SPMD executables from the cache (no compile) and still reads the
    output shardings from them."""
    counters = []
    for _ in range(2):
        results, out = _run("pcache", str(tmp_path / "cache"))
        assert results == {"persistent_cache_keeps_shardings": "ok"}, results
        line = [l for l in out.splitlines() if l.startswith("@@COUNTERS@@")][-1]
        counters.append(tuple(int(v) for v in line[len("@@COUNTERS@@"):].split(",")))
    (hit0, miss0, compiled0), (hit1, miss1, compiled1) = counters
    assert miss0 > 0 and compiled0 > 0 and hit0 == 0
    assert hit1 > 0 and miss1 == 0 and compiled1 == 0


def test_use_spmd_auto_and_state_outside_spmd():
    """In this (non-SPMD) process: auto-sharding raises, mark_sharding asks for use_spmd(), the
    mode stays off."""
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    import torch_xla.distributed.spmd as xs
    with pytest.raises(NotImplementedError, match="auto-sharding"):
        xr.use_spmd(auto=True)
    assert not xr.is_spmd()
    t = torch.ones(4).to(torch_xla.device())
    with pytest.raises(RuntimeError, match="use_spmd"):
        xs.mark_sharding(t, xs.get_1d_mesh(), (0,))
    assert xs.clear_sharding(t) is t
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == ""
    assert xr.global_runtime_device_count() == torch_xla.device_count()
