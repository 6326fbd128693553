"""End-to-end training on `xla` vs eager CPU: same seed, same data, per-step losses must agree.

Tolerance: everything is float32. XLA fuses elementwise chains, and reorders/tiles reductions
(matmul accumulation, softmax/log-sum-exp, LayerNorm means, the loss mean) differently from
ATen's CPU kernels, so each step differs by a few ulps and training then feeds those differences
back through 20 optimizer updates. Measured max relative loss difference over 20 steps
(torch 2.13 CPU, XLA CPU plugin): MLP+SGD(momentum) 1.3e-7, MLP+AdamW (both foreach modes) 2.2e-7,
GPT+AdamW 1.5e-7, i.e. ~1-2 ulp; final MLP weights differ by <2e-7 abs.
We assert rtol=1e-4 (~500x margin), still far below what a real bug (a wrong gradient, a wrong
optimizer-state update, a dropped in-place op) does to the loss (>=1e-2 relative).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_xla
import torch_xla.debug.metrics as met

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt  # noqa: E402

LOSS_RTOL = 1e-4
LOSS_ATOL = 1e-6
STEPS = 20
WARMUP = 3  # steps after which no new graph may be compiled


def _aten_fallbacks():
    # .item() reads count as aten::_local_scalar_dense (as PyTorch/XLA): a host read, not an op
    return sorted(n for n in met.counter_names() if n.startswith("aten::") and n != "aten::_local_scalar_dense")


def _train(make_model, make_opt, batches, device, clip=None, lr_decay=None):
    """Trains from the same CPU-initialised weights; returns (losses, UncachedCompile after each step)."""
    model = make_model().to(device)
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_decay ** s) if lr_decay else None
    losses, uncached = [], []
    for inputs, target, loss_fn in batches:
        inputs, target = inputs.to(device), target.to(device)
        opt.zero_grad()
        loss = loss_fn(model, inputs, target)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()  # a new Python-float lr every step: must not recompile
        if device != "cpu":
            torch_xla.sync()
            uncached.append(met.counter_value("UncachedCompile") or 0)
        losses.append(loss.item())
    return losses, uncached, model


def _check(cpu_losses, xla_losses, uncached):
    assert len(xla_losses) == len(cpu_losses) == STEPS
    torch.testing.assert_close(torch.tensor(xla_losses, dtype=torch.float64),
                               torch.tensor(cpu_losses, dtype=torch.float64),
                               rtol=LOSS_RTOL, atol=LOSS_ATOL)
    # Training actually made progress (guards against e.g. an optimizer step that is a no-op on both).
    assert sum(xla_losses[-5:]) < sum(xla_losses[:5])
    # After warm-up the graph is structurally identical every step: no more compilations.
    assert uncached[WARMUP - 1] >= 1
    assert uncached[WARMUP - 1:] == [uncached[WARMUP - 1]] * (STEPS - WARMUP + 1), uncached
    assert _aten_fallbacks() == [], f"CPU fallback ops during training: {_aten_fallbacks()}"


# ----------------------------------------------------------------------------- MLP


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _mlp_batches():
    g = torch.Generator().manual_seed(1234)
    ce = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    teacher = torch.randn(16, 4, generator=g)  # learnable labels, so the loss must go down
    out = []
    for _ in range(STEPS):
        x = torch.randn(32, 16, generator=g)
        out.append((x, (x @ teacher).argmax(1), ce))
    return out


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01, foreach=False),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01, foreach=True),
}


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_mlp_training_matches_cpu(opt_name, clean_metrics):
    batches = _mlp_batches()
    make_opt = OPTIMIZERS[opt_name]
    cpu_losses, _, cpu_model = _train(_mlp, make_opt, batches, "cpu")
    xla_losses, uncached, xla_model = _train(_mlp, make_opt, batches, torch_xla.device())
    _check(cpu_losses, xla_losses, uncached)
    # Final weights agree too (20 updates of accumulated ulp noise; measured <2e-7 abs).
    for (name, pc), px in zip(cpu_model.named_parameters(), xla_model.parameters()):
        torch.testing.assert_close(px.cpu(), pc, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_mlp_clip_grad_norm_and_lr_schedule_match_cpu(clean_metrics):
    batches = _mlp_batches()
    make_opt = OPTIMIZERS["sgd_momentum"]
    kw = dict(clip=0.5, lr_decay=0.93)
    cpu_losses, _, _ = _train(_mlp, make_opt, batches, "cpu", **kw)
    xla_losses, uncached, _ = _train(_mlp, make_opt, batches, torch_xla.device(), **kw)
    _check(cpu_losses, xla_losses, uncached)


# ----------------------------------------------------------------------------- GPT


@pytest.fixture(scope="module")
def corpus():
    _, vocab, data = gpt.load_corpus()
    return len(vocab), data


def test_gpt_training_matches_cpu(corpus, clean_metrics):
    vocab_size, data = corpus
    block, batch = 32, 8

    def make_model():
        torch.manual_seed(0)
        return gpt.make_model(vocab_size, block_size=block, n_layer=2, n_head=4, n_embd=64, dropout=0.0)

    g = torch.Generator().manual_seed(7)
    lm = lambda m, x, y: m(x, y)[1]  # noqa: E731
    batches = [(*gpt.get_batch(data, batch, block, g), lm) for _ in range(STEPS)]
    make_opt = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731

    cpu_losses, _, _ = _train(make_model, make_opt, batches, "cpu")
    xla_losses, uncached, _ = _train(make_model, make_opt, batches, torch_xla.device())
    _check(cpu_losses, xla_losses, uncached)


def test_gpt_eval_logits_match_cpu(corpus):
    """Forward only, no training: logits for one batch agree elementwise."""
    vocab_size, data = corpus
    torch.manual_seed(0)
    model = gpt.make_model(vocab_size, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0).eval()
    x, y = gpt.get_batch(data, 4, 32, torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref_logits, ref_loss = model(x, y)
        model.to(torch_xla.device())
        logits, loss = model(x.to(torch_xla.device()), y.to(torch_xla.device()))
        torch_xla.sync()
    torch.testing.assert_close(logits.cpu(), ref_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6)
