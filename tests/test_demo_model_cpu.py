"""The demo GPT (examples/gpt.py) and its training script on plain CPU torch.

No torch_xla needed: these check the model/data helpers that the xla demo and
benchmarks are built on, so backend failures are not confused with model bugs.
"""

import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)
import gpt  # noqa: E402


@pytest.fixture(scope="module")
def corpus():
    text, vocab, data = gpt.load_corpus()
    return text, vocab, data


def test_corpus_and_vocab(corpus):
    text, vocab, data = corpus
    assert 40_000 <= len(text.encode("ascii")) <= 80_000
    assert data.dtype == torch.long and data.numel() == len(text)
    assert vocab.decode(data[:200].tolist()) == text[:200]


def test_get_batch_is_deterministic_and_shifted(corpus):
    _, _, data = corpus
    x1, y1 = gpt.get_batch(data, 4, 16, torch.Generator().manual_seed(3))
    x2, y2 = gpt.get_batch(data, 4, 16, torch.Generator().manual_seed(3))
    assert x1.shape == y1.shape == (4, 16) and x1.device.type == "cpu"
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # y is x shifted by one character


def test_three_steps_finite_loss(corpus, monkeypatch):
    _, vocab, data = corpus
    # The attention must stay explicit (no fused SDPA) for the xla backend.
    monkeypatch.setattr(F, "scaled_dot_product_attention", None)
    torch.manual_seed(0)
    model = gpt.make_model(len(vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, y = gpt.get_batch(data, 8, model.cfg.block_size, gen)
        logits, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        assert logits.shape == (8, model.cfg.block_size, len(vocab))
        assert math.isfinite(loss.item())
    # Untrained loss should be near log(vocab) (uniform prediction).
    assert abs(loss.item() - math.log(len(vocab))) < 1.5


def test_overfits_one_batch(corpus):
    _, vocab, data = corpus
    torch.manual_seed(0)
    model = gpt.make_model(len(vocab), dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    x, y = gpt.get_batch(data, 8, model.cfg.block_size, torch.Generator().manual_seed(1))
    losses = []
    for _ in range(30):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.75 * losses[0], losses
    assert sum(losses[-5:]) < sum(losses[:5]), losses


def test_attention_is_causal(corpus):
    _, vocab, _ = corpus
    torch.manual_seed(0)
    model = gpt.make_model(len(vocab)).eval()
    idx = torch.randint(0, len(vocab), (2, 20))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % len(vocab)  # alter only the future
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_head_tied_to_embedding(corpus):
    _, vocab, _ = corpus
    model = gpt.make_model(len(vocab))
    with torch.no_grad():
        model.tok_emb.weight.zero_()
        logits, _ = model(torch.zeros(1, 4, dtype=torch.long))
    assert torch.count_nonzero(logits) == 0


def test_train_script_cpu_main():
    had_xla = "torch_xla" in sys.modules
    import train_gpt

    stats = train_gpt.main(["--device", "cpu", "--steps", "8", "--batch-size", "4", "--log-every", "2"])
    assert stats["compiles"] is None and stats["tokens_per_s"] > 0
    assert stats["loss_steps"] == [1, 2, 4, 6, 8]
    assert all(math.isfinite(v) for v in stats["losses"])
    if not had_xla:
        assert "torch_xla" not in sys.modules  # --device cpu must not import torch_xla
