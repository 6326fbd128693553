"""The in-memory compile cache is bounded: by entries (XLA_COMPILATION_CACHE_SIZE, as upstream) and by
the process's memory mappings (each XLA:CPU executable maps its kernels; past vm.max_map_count an
XLA compile fails and took the interpreter down: the full test suite hit it after ~1,400 cached
executables). Evicted graphs compile again and give the same values."""
import json

from conftest import run_python

_PROGRAM = r"""
import json, torch, torch_xla
import torch_xla.debug.metrics as met
from torch_xla import _C
d = torch_xla.device()
sizes = list(range(1, N + 1)) + [1, 2, 3]   # the first graphs again at the end (evicted by then)
bad = []
for i in sizes:
    x = torch.arange(float(i * 3)).reshape(i, 3)
    got = (x.to(d).sin() * 2).sum(0).cpu()
    want = (x.sin() * 2).sum(0)
    if not torch.allclose(got, want, atol=1e-5):
        bad.append(i)
print(json.dumps({"bad": bad, "size": int(_C._compile_cache_size()),
                  "evict": met.counter_value("CompileCacheEvictions") or 0,
                  "pressure": met.counter_value("CompileCacheMapPressureEvictions") or 0,
                  "uncached": met.counter_value("UncachedCompile") or 0}))
"""


def _run(n, **env):
    r = run_python(_PROGRAM.replace("N + 1", str(n + 1)), env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_entry_bound_evicts_least_recently_used():
    out = _run(10, XLA_COMPILATION_CACHE_SIZE="4")
    assert out["bad"] == []
    assert out["size"] == 4
    # 10 graphs, then graphs 1-3 again: evicted long ago, so compiled again (13 compiles, 9 evictions).
    assert out["uncached"] == 13
    assert out["evict"] == 9
    assert out["pressure"] == 0


def test_mapping_pressure_sheds_half_the_cache():
    # A pretend limit of 600 mappings: an interpreter with torch and the plugin loaded already holds
    # more than half of it, so every check (the 1st compile, then every 32nd) sheds the older half.
    out = _run(40, TXLA_MAX_MAP_COUNT="600")
    assert out["bad"] == []
    assert out["pressure"] > 0
    assert out["size"] < 40
