"""Host allocator choice (issue #12, host time): torch_xla/_allocator.py picks a fast malloc
(mimalloc from the cmeel-mimalloc wheel setup installs, or jemalloc/tcmalloc) that spawned workers
preload; results stay equal to eager's on it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from torch_xla import _allocator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_FAST = _allocator._find("mimalloc") or _allocator._find("jemalloc") or _allocator._find("tcmalloc")


def _name(path):
    return next(n for n in ("mimalloc", "jemalloc", "tcmalloc") if n in os.path.basename(path))


def _env(**kv):
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "TORCH_XLA_ALLOCATOR", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
              "MASTER_PORT", "TORCH_XLA_SPAWNED"):
        env.pop(k, None)
    env.update({k: v for k, v in kv.items() if v is not None})
    return env


def test_choice_rules(monkeypatch):
    for off in ("glibc", "0", "off"):
        monkeypatch.setenv("TORCH_XLA_ALLOCATOR", off)
        assert _allocator.library() is None
        assert "LD_PRELOAD" not in _allocator.child_env({"PATH": "/bin"})
    monkeypatch.setenv("TORCH_XLA_ALLOCATOR", "nosuchmalloc")
    with pytest.raises(ValueError, match="TORCH_XLA_ALLOCATOR='nosuchmalloc'"):
        _allocator.library()
    monkeypatch.setenv("TORCH_XLA_ALLOCATOR", "/no/such/libfast.so")
    with pytest.raises(ValueError, match="no such file"):
        _allocator.library()
    monkeypatch.setattr(_allocator, "_find", lambda name: None)
    monkeypatch.setenv("TORCH_XLA_ALLOCATOR", "jemalloc")
    with pytest.raises(ValueError, match="libjemalloc2"):
        _allocator.library()
    monkeypatch.setenv("TORCH_XLA_ALLOCATOR", "auto")
    assert _allocator.library() is None  # nothing installed: glibc


def test_child_env_keeps_existing_preload(monkeypatch, tmp_path):
    lib = tmp_path / "libmyalloc.so"
    lib.write_bytes(b"")
    monkeypatch.setenv("TORCH_XLA_ALLOCATOR", str(lib))
    env = _allocator.child_env({"LD_PRELOAD": "/x/libother.so"})
    assert env["LD_PRELOAD"] == f"{lib}:/x/libother.so"
    assert _allocator.child_env(env)["LD_PRELOAD"] == env["LD_PRELOAD"]  # not added twice
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with _allocator.preloaded_children():
        assert os.environ["LD_PRELOAD"] == str(lib)
    assert "LD_PRELOAD" not in os.environ


_TRAIN = textwrap.dedent("""
    import torch, torch_xla, torch.nn as nn
    from torch_xla import _allocator
    print("ACTIVE", _allocator.active())
    def run(device):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
        x = torch.randn(8, 16).to(device); y = torch.randint(0, 4, (8,)).to(device)
        for _ in range(5):
            opt.zero_grad(); loss = nn.functional.cross_entropy(m(x), y); loss.backward(); opt.step()
            if device != "cpu": torch_xla.sync()
        return [p.detach().cpu() for p in m.parameters()]
    a, b = run(torch_xla.device()), run("cpu")
    assert all(torch.allclose(p, q, rtol=1e-5, atol=1e-6) for p, q in zip(a, b))
    print("SAME")
""")


@pytest.mark.skipif(not HAVE_FAST, reason="no fast allocator installed (scripts/setup.sh installs cmeel-mimalloc)")
def test_training_on_preloaded_allocator_matches_eager():
    lib = _allocator.library()
    r = subprocess.run([sys.executable, "-c", _TRAIN], env=_env(LD_PRELOAD=lib, CPU_NUM_DEVICES="1"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SAME" in r.stdout
    assert f"ACTIVE {_name(lib)}" in r.stdout


_SPAWN = textwrap.dedent("""
    import os, sys
    import torch_xla.distributed.xla_multiprocessing as xmp
    def fn(index, out):
        from torch_xla import _allocator
        open(os.path.join(out, f"rank{index}"), "w").write(_allocator.active())
    if __name__ == "__main__":
        xmp.spawn(fn, args=(sys.argv[1],), nprocs=2)
        print("SPAWN OK", os.environ.get("LD_PRELOAD"))
""")


@pytest.mark.skipif(not HAVE_FAST, reason="no fast allocator installed (scripts/setup.sh installs cmeel-mimalloc)")
@pytest.mark.parametrize("choice", ["auto", "glibc"])
def test_spawned_workers_preload_the_allocator(tmp_path, choice):
    script = tmp_path / "spawn_alloc.py"
    script.write_text(_SPAWN)
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=str(tmp_path),
                       env=_env(CPU_NUM_DEVICES="2", TORCH_XLA_ALLOCATOR=choice), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "SPAWN OK None" in r.stdout, r.stderr[-3000:]  # the parent's env is restored
    want = "glibc" if choice == "glibc" else _name(_allocator.library())
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}").read_text() == want
