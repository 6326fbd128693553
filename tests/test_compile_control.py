"""Compilation under the user's control (issue #4): torch_xla.compile, eager mode, device RNG seeds,
the persistent compilation cache, StableHLO text/bytecode export, PT_XLA_DEBUG compile reasons."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr
from torch_xla.experimental import eager_mode, is_eager_mode

DEV = torch_xla.device()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _counter(name):
    return met.counter_value(name) or 0


def _run(code, env=None, timeout=120):
    """Runs code in a fresh interpreter (a new process: a cold in-memory compile cache)."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=timeout, cwd=REPO)
    return p


def foo2(x):
    return torch.sin(x) + torch.cos(x)


# ------------------------------------------------------------------ torch_xla.compile
def test_compile_forms_agree_with_eager():
    cpu = torch.randn(5, 3)
    x = cpu.to(DEV)

    @torch_xla.compile()
    def foo(t):
        return torch.sin(t) + torch.cos(t)

    a = foo(x)
    b = torch_xla.compile(foo2)(x)
    with torch_xla.compile():
        c = foo2(x)
    for r in (a, b, c):
        torch.testing.assert_close(r.cpu(), foo2(cpu))


def test_compile_runs_one_graph_at_exit():
    x = torch.randn(4, 4, device=DEV)
    torch_xla.sync()
    before = met.metric_data("ExecuteTime")[0]

    @torch_xla.compile()
    def step(t):
        for _ in range(5):
            t = t @ t * 0.5
        return t

    out = step(x)
    assert not torch_xla._C._has_pending(out)
    assert met.metric_data("ExecuteTime")[0] == before + 1


def test_full_graph_raises_on_execution_inside():
    x = torch.randn(3, device=DEV)
    torch_xla.sync()

    @torch_xla.compile(full_graph=True)
    def needs_value(t):
        y = t * 2
        if y.sum().item() > 0:  # forces an execution inside the function
            return y
        return -y

    with pytest.raises(RuntimeError, match="Unexpected execution happens inside the compiled function"):
        needs_value(x)
    # The runtime still works afterwards.
    torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)


def test_full_graph_allows_single_graph():
    x = torch.randn(3, device=DEV)
    out = torch_xla.compile(foo2, full_graph=True)(x)
    torch.testing.assert_close(out.cpu(), foo2(x.cpu()))


def test_num_different_graphs_allowed():
    f = torch_xla.compile(lambda t: t * 2 + 1, num_different_graphs_allowed=1, name="limited_fn")
    f(torch.ones(2, device=DEV))
    f(torch.ones(2, device=DEV))  # same graph: fine
    with pytest.raises(RuntimeError, match="num_different_graphs_allowed=1"):
        f(torch.ones(3, device=DEV))  # a new shape: a second graph


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_num_different_graphs_allowed_must_be_positive(bad):
    with pytest.raises(ValueError, match="num_different_graphs_allowed"):
        torch_xla.compile(foo2, num_different_graphs_allowed=bad)


def test_compile_name_in_debug_output():
    p = _run("""
        import torch, torch_xla
        x = torch.randn(4, device=torch_xla.device())
        torch_xla.sync()
        torch_xla.compile(lambda t: t.exp(), name="my_named_graph")(x)
    """, env={"PT_XLA_DEBUG": "1"})
    assert p.returncode == 0, p.stderr
    assert "my_named_graph" in p.stderr


# ------------------------------------------------------------------ eager mode
def test_eager_mode_runs_each_op_and_compiled_regions_trace():
    x = torch.randn(4, device=DEV)
    torch_xla.sync()
    eager_mode(True)
    try:
        assert is_eager_mode()
        n0 = (met.metric_data("EagerOpExecuteTime") or (0,))[0]
        y = x * 3 + 1
        assert not torch_xla._C._has_pending(y)
        assert met.metric_data("EagerOpExecuteTime")[0] >= n0 + 2
        assert met.metric_data("EagerOpCompileTime")[0] >= 1
        torch.testing.assert_close(y.cpu(), x.cpu() * 3 + 1)
        # Same op signature again: no new eager compile.
        c0 = met.metric_data("EagerOpCompileTime")[0]
        z = x * 3 + 1
        assert met.metric_data("EagerOpCompileTime")[0] == c0
        # A compiled region is still one graph.
        e0 = met.metric_data("ExecuteTime")[0]
        with torch_xla.compile():
            w = torch.sin(x) * 2 + torch.cos(x)
            assert torch_xla._C._has_pending(w)
        assert met.metric_data("ExecuteTime")[0] == e0 + 1
        torch.testing.assert_close(w.cpu(), torch.sin(x.cpu()) * 2 + torch.cos(x.cpu()))
        del z
    finally:
        eager_mode(False)
    assert not is_eager_mode()


# ------------------------------------------------------------------ RNG
def test_same_seed_same_numbers_new_seed_no_recompile():
    torch_xla.manual_seed(1234)
    a = torch.rand(8, device=DEV)
    torch_xla.sync()
    a = a.cpu()
    torch_xla.manual_seed(1234)
    b = torch.rand(8, device=DEV).cpu()
    assert torch.equal(a, b)
    uncached = _counter("UncachedCompile")
    for seed in (1, 2, 3):
        torch_xla.manual_seed(seed)
        c = torch.rand(8, device=DEV)
        torch_xla.sync()
        assert not torch.equal(c.cpu(), a)
    assert _counter("UncachedCompile") == uncached
    xm.set_rng_state(7)
    s = xm.get_rng_state()
    assert isinstance(s, int)


# ------------------------------------------------------------------ persistent cache
_CACHE_JOB = """
    import torch, torch_xla, torch_xla.runtime as xr, torch_xla.debug.metrics as met
    xr.initialize_cache({path!r}, readonly={ro})
    d = torch_xla.device()
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(d)
    y = (x @ x.t()).relu().sum(0) * 0.5
    print("RESULT", y.cpu().tolist())
    print("COUNTS", met.counter_value("UncachedCompile") or 0, met.counter_value("PersistentCacheHit") or 0,
          met.counter_value("PersistentCacheMiss") or 0)
"""


def _cache_job(path, ro=False):
    p = _run(_CACHE_JOB.format(path=str(path), ro=ro))
    assert p.returncode == 0, p.stderr[-2000:]
    res = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][0]
    counts = [int(v) for v in [l for l in p.stdout.splitlines() if l.startswith("COUNTS")][0].split()[1:]]
    return res, counts


def test_persistent_cache_warm_process_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    res1, (unc1, hit1, miss1) = _cache_job(cache)
    assert unc1 >= 1 and miss1 >= 1 and hit1 == 0
    files = sorted(os.listdir(cache))
    assert files and all(f.endswith(".xlaexe") for f in files)
    res2, (unc2, hit2, miss2) = _cache_job(cache)
    assert res2 == res1
    assert unc2 == 0 and miss2 == 0 and hit2 == miss1


def test_persistent_cache_readonly_never_writes(tmp_path):
    cache = tmp_path / "ro"
    cache.mkdir()
    res, (unc, hit, miss) = _cache_job(cache, ro=True)
    assert unc >= 1 and miss >= 1
    assert os.listdir(cache) == []


def test_persistent_cache_corrupt_entry_recovers(tmp_path):
    cache = tmp_path / "c"
    res1, _ = _cache_job(cache)
    for f in os.listdir(cache):  # truncate every entry
        with open(cache / f, "r+b") as fh:
            fh.truncate(10)
    res2, (unc, hit, miss) = _cache_job(cache)
    assert res2 == res1 and unc >= 1 and hit == 0
    res3, (unc3, hit3, miss3) = _cache_job(cache)  # replaced entries are good again
    assert res3 == res1 and unc3 == 0 and hit3 >= 1


def test_initialize_cache_too_late_and_bad_paths(tmp_path):
    p = _run("""
        import torch, torch_xla, torch_xla.runtime as xr
        (torch.ones(2, device=torch_xla.device()) + 1).cpu()
        try:
            xr.initialize_cache("/tmp/never_used_cache")
        except RuntimeError as e:
            print("LATE", e)
    """)
    assert "LATE" in p.stdout and "before any computation" in p.stdout
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    p = _run(f"""
        import torch_xla.runtime as xr
        for path, ro in [({str(not_dir)!r}, False), ({str(tmp_path / 'missing')!r}, True)]:
            try:
                xr.initialize_cache(path, readonly=ro)
            except ValueError as e:
                print("BAD", e)
    """)
    assert p.stdout.count("BAD") == 2, p.stdout + p.stderr
    if os.geteuid() != 0:  # root can write anywhere
        ro_dir = tmp_path / "nowrite"
        ro_dir.mkdir(mode=0o500)
        p = _run(f"import torch_xla.runtime as xr\ntry:\n xr.initialize_cache({str(ro_dir)!r})\nexcept ValueError as e:\n print('BAD', e)")
        assert "not writable" in p.stdout


# ------------------------------------------------------------------ StableHLO export
def test_get_stablehlo_text_and_all_pending():
    x = torch.randn(3, 3, device=DEV)
    torch_xla.sync()
    y = (x @ x).tanh()
    text = xm.get_stablehlo([y])
    assert "func.func public @main" in text and "stablehlo.dot_general" in text and "stablehlo.tanh" in text
    all_text = xm.get_stablehlo()
    assert "stablehlo.tanh" in all_text


def test_get_stablehlo_bytecode_compiles_again():
    pytest.importorskip("jax")
    from torch_xla import _core
    from torch_xla._internal import plugins
    cpu = torch.randn(3, 4)
    x = cpu.to(DEV)
    torch_xla.sync()
    y = torch.nn.functional.gelu(x).sum(0).softmax(0)
    bc = xm.get_stablehlo_bytecode([y])
    assert isinstance(bc, bytes) and bc[:4] == b"ML\xefR"  # MLIR bytecode magic
    try:
        cpu_plugin = plugins.plugin_for("CPU")[0]
    except RuntimeError:
        pytest.skip("needs the CPU plugin (xla-cpu-pjrt), which a GPU machine may lack")
    client = _core.runtime.Client.create(cpu_plugin)
    exe = client.compile(bc)
    out = client.execute(exe, [client.to_device(cpu.numpy())])[0].to_numpy()
    torch.testing.assert_close(torch.from_numpy(out), y.cpu())


def test_hlo_debug_adds_source_locations():
    p = _run("""
        import torch, torch_xla, torch_xla.core.xla_model as xm
        x = torch.ones(2, device=torch_xla.device())
        torch_xla.sync()
        y = x.exp()
        print(xm.get_stablehlo([y]))
    """, env={"XLA_HLO_DEBUG": "1"})
    assert p.returncode == 0, p.stderr
    assert 'loc("<string>":5:0)' in p.stdout


# ------------------------------------------------------------------ PT_XLA_DEBUG
def test_debug_reason_names_changed_op_and_line():
    script = textwrap.dedent("""
        import torch, torch_xla
        x = torch.randn(4, device=torch_xla.device())
        torch_xla.sync()
        for i in range(3):
            y = x * 2
            if i == 2:
                y = y.exp()
            torch_xla.sync()
    """)
    p = _run(script, env={"PT_XLA_DEBUG": "1"})
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stderr.splitlines() if "[PT_XLA_DEBUG] compile" in l]
    assert "first compile" in lines[0]
    last = lines[-1]
    assert "exponential" in last and "<string>:8" in last, last
    assert "compiles of 'SyncTensorsGraph' so far" in last


def test_debug_reports_fallback_ops():
    p = _run("""
        import torch, torch_xla
        x = torch.tensor([1.0, 0.0, 2.0], device=torch_xla.device())
        print(torch.nonzero(x).cpu())
    """, env={"PT_XLA_DEBUG": "1"})
    assert p.returncode == 0, p.stderr
    assert "aten::nonzero is not lowered" in p.stderr


# ------------------------------------------------------------------ metrics API
def test_metrics_api():
    x = torch.randn(2, device=DEV)
    (x + 1).cpu()
    torch_xla.sync()
    assert met.counter_value("NoSuchCounter") is None
    assert met.metric_data("NoSuchMetric") is None
    total, acc, samples = met.metric_data("ExecuteTime")
    assert total >= 1 and acc > 0 and len(samples) >= 1
    assert "ExecuteTime" in met.metric_names() and "MarkStep" in met.counter_names()
    report = met.metrics_report()
    assert "Metric: ExecuteTime\n  TotalSamples: " in report and "Counter: MarkStep\n  Value: " in report
    short = met.short_metrics_report()
    assert "CompileTime" in short and "Counter: CachedCompile" in short or "Counter: MarkStep" in short
    assert "InboundData" not in short
    custom = met.short_metrics_report(counter_names=["MarkStep"], metric_names=["ExecuteTime"])
    assert "Metric: ExecuteTime" in custom and "Metric: CompileTime" not in custom
    met.clear_all()
    assert met.counter_value("MarkStep") is None and met.metric_data("ExecuteTime") is None
