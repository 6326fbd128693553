"""Graph compilation cache: a graph is compiled once per structure (ops + shapes + dtypes) and reused.

Counters: UncachedCompile (+1 per new compilation), CachedCompile (+1 per cache hit at sync).
"""

from __future__ import annotations

import pytest
import torch

import torch_xla
import torch_xla.core.xla_model as xm


def _counts(met):
    return (met.counter_value("UncachedCompile") or 0, met.counter_value("CachedCompile") or 0)


def _step(x, w, lr):
    """A tiny 'training step' style graph: matmul, nonlinearity, reduction, in-place update."""
    y = torch.tanh(x @ w).sum(0)
    w.sub_(lr * y.unsqueeze(0) * 1e-3)
    return y


def test_identical_steps_compile_once(clean_metrics):
    met = clean_metrics
    g = torch.Generator().manual_seed(0)
    x_cpu, w_cpu = torch.randn(8, 4, generator=g), torch.randn(4, 4, generator=g)
    dev = torch_xla.device()
    x, w = x_cpu.to(dev), w_cpu.to(dev)
    torch_xla.sync()
    base = _counts(met)
    history = []
    for _ in range(6):
        y = _step(x, w, 0.5)
        y_cpu = _step(x_cpu, w_cpu, 0.5)
        torch_xla.sync()
        history.append(_counts(met))
        torch.testing.assert_close(y.cpu(), y_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.cpu(), w_cpu, rtol=1e-5, atol=1e-5)
    # The first step compiles (once); every later step is exactly one cache hit and no compilation.
    assert history[0][0] == base[0] + 1, history
    for i in range(1, len(history)):
        assert history[i][0] == history[0][0], f"step {i} recompiled: {history}"
        assert history[i][1] == history[i - 1][1] + 1, f"step {i} not a single cache hit: {history}"


def test_sync_with_nothing_pending_compiles_nothing(clean_metrics):
    met = clean_metrics
    before = _counts(met)
    torch_xla.sync()
    xm.mark_step()
    assert _counts(met) == before
    assert met.counter_value("MarkStep") == 2


def test_changed_shape_recompiles_once(clean_metrics):
    met = clean_metrics
    dev = torch_xla.device()

    def run(n):
        cpu = torch.arange(n, dtype=torch.float32)
        out = (cpu.to(dev) * 3 - 1).relu()
        torch_xla.sync()
        torch.testing.assert_close(out.cpu(), (cpu * 3 - 1).relu())
        return _counts(met)

    a1 = run(5)
    a2 = run(5)
    assert a2 == (a1[0], a1[1] + 1)
    b1 = run(7)  # new shape: exactly one new compilation
    assert b1 == (a2[0] + 1, a2[1])
    b2 = run(7)  # same new shape again: cached
    assert b2 == (b1[0], b1[1] + 1)
    a3 = run(5)  # the old shape is still cached
    assert a3 == (b2[0], b2[1] + 1)


def test_changed_dtype_recompiles(clean_metrics):
    met = clean_metrics
    dev = torch_xla.device()
    a = torch.ones(4, device=dev) + 1
    torch_xla.sync()
    u0 = _counts(met)[0]
    b = torch.ones(4, device=dev, dtype=torch.float64) + 1
    torch_xla.sync()
    assert _counts(met)[0] == u0 + 1
    assert a.cpu().dtype == torch.float32 and b.cpu().dtype == torch.float64
    torch.testing.assert_close(b.cpu(), torch.full((4,), 2.0, dtype=torch.float64))


def test_dead_tensors_are_not_computed(clean_metrics):
    """A result dropped before sync is not part of any graph (nothing to compile)."""
    met = clean_metrics
    torch.ones(3, device=torch_xla.device()) * 5  # noqa: B018  (result discarded on purpose)
    torch_xla.sync()
    assert _counts(met) == (0, 0)


def test_python_scalar_change_does_not_recompile(clean_metrics):
    """`x * lr` with a different Python float each step is one graph: the scalar is graph input
    data, not a baked-in constant. (0.0 and 1.0 are avoided on purpose: like upstream PyTorch/XLA,
    this implementation may special-case those two values as constants.)"""
    met = clean_metrics
    dev = torch_xla.device()
    x_cpu = torch.linspace(-1, 1, 12).reshape(3, 4)
    x = x_cpu.to(dev)
    torch_xla.sync()
    results = []
    for lr in [0.1, 0.2, 0.35, 0.5, 2.5, -0.75]:
        y = x * lr + lr
        torch_xla.sync()
        results.append(_counts(met))
        torch.testing.assert_close(y.cpu(), x_cpu * lr + lr)
    assert all(r[0] == results[0][0] for r in results), results
    assert results[-1][1] == results[0][1] + len(results) - 1


def test_inplace_scalar_change_does_not_recompile(clean_metrics):
    """SGD-like in-place update `p.add_(g, alpha=-lr)` with a changing learning rate."""
    met = clean_metrics
    dev = torch_xla.device()
    p_cpu, g_cpu = torch.ones(5), torch.arange(5.0)
    p, grad = p_cpu.to(dev), g_cpu.to(dev)
    torch_xla.sync()
    uncached = []
    for lr in [0.3, 0.25, 0.125, 0.0625]:
        p.add_(grad, alpha=-lr)
        p_cpu.add_(g_cpu, alpha=-lr)
        torch_xla.sync()
        uncached.append(_counts(met)[0])
    torch.testing.assert_close(p.cpu(), p_cpu)
    assert len(set(uncached)) == 1, uncached


def test_manual_seed_reproduces_and_does_not_recompile(clean_metrics):
    met = clean_metrics
    dev = torch_xla.device()

    def draw(seed):
        torch_xla.manual_seed(seed)
        r = torch.rand(16, device=dev)
        n = torch.randn(2, 3, device=dev)
        torch_xla.sync()
        return r.cpu(), n.cpu(), _counts(met)

    r1, n1, c1 = draw(123)
    r2, n2, c2 = draw(456)
    r3, n3, c3 = draw(123)
    # Same seed -> the same numbers; a different seed -> different numbers.
    assert torch.equal(r1, r3) and torch.equal(n1, n3)
    assert not torch.equal(r1, r2)
    # Distribution sanity against the CPU contract: rand in [0, 1), finite randn.
    assert (r1 >= 0).all() and (r1 < 1).all() and torch.isfinite(n1).all()
    # New seeds are runtime data: the same graph is reused.
    assert c2[0] == c1[0] and c3[0] == c1[0], (c1, c2, c3)
    assert c3[1] == c1[1] + 2


def test_rng_advances_within_and_across_steps():
    dev = torch_xla.device()
    torch_xla.manual_seed(7)
    a = torch.rand(8, device=dev)
    b = torch.rand(8, device=dev)  # same graph as `a`
    torch_xla.sync()
    c = torch.rand(8, device=dev)  # next graph
    torch_xla.sync()
    a, b, c = a.cpu(), b.cpu(), c.cpu()
    assert not torch.equal(a, b) and not torch.equal(b, c) and not torch.equal(a, c)
    # Splitting the same draws over different syncs gives the same stream.
    torch_xla.manual_seed(7)
    a2 = torch.rand(8, device=dev)
    torch_xla.sync()
    b2 = torch.rand(8, device=dev)
    c2 = torch.rand(8, device=dev)
    torch_xla.sync()
    assert torch.equal(a, a2.cpu()) and torch.equal(b, b2.cpu()) and torch.equal(c, c2.cpu())


def test_xm_rng_state_roundtrip():
    dev = torch_xla.device()
    xm.set_rng_state(2024)
    assert xm.get_rng_state() == 2024
    x = torch.randn(4, device=dev)
    torch_xla.sync()
    xm.set_rng_state(2024)
    y = torch.randn(4, device=dev)
    torch_xla.sync()
    assert torch.equal(x.cpu(), y.cpu())
    with pytest.raises(TypeError):
        xm.set_rng_state("not a seed")


RNG_OPS = {
    "rand": lambda d: torch.rand(64, device=d),
    "randn": lambda d: torch.randn(64, device=d),
    "randint": lambda d: torch.randint(0, 1000, (64,), device=d),
    "normal_": lambda d: torch.empty(64, device=d).normal_(),
    "uniform_": lambda d: torch.empty(64, device=d).uniform_(-2, 2),
    "dropout": lambda d: torch.nn.functional.dropout(torch.ones(64, device=d), 0.5),
    "bernoulli": lambda d: torch.bernoulli(torch.full((64,), 0.5, device=d)),
}


@pytest.mark.parametrize("name", list(RNG_OPS))
def test_manual_seed_controls_rng_op(name):
    dev = torch_xla.device()
    draws = []
    for seed in (5, 5, 6):
        torch.manual_seed(1000 + len(draws))  # the CPU generator must not matter
        torch_xla.manual_seed(seed)
        r = RNG_OPS[name](dev)
        torch_xla.sync()
        draws.append(r.cpu())
    assert draws[0].shape == RNG_OPS[name]("cpu").shape
    assert torch.equal(draws[0], draws[1]), "same torch_xla seed, different numbers"
    assert not torch.equal(draws[0], draws[2]), "different torch_xla seed, same numbers"
