"""torch.inference_mode on XLA tensors, against eager CPU under inference_mode.

Inference mode skips autograd, where CompositeImplicitAutograd ops (matmul, einsum, linear,
clip_, ...) normally decompose above functionalization. They used to reach functionalization's
fallback instead: their inner views ran on the CPU fallback one by one (a host round trip each;
multi_head_attention_forward raised), and every in-place or out= composite raised "Found a custom
(non-ATen) operator whose output has alias annotations". csrc/bridge/functionalize.cc
(CompositeBelowAutograd) decomposes them under functionalization, as autograd would have."""
import sys
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_xla
import torch_xla.debug.metrics as met

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import models  # noqa: E402

DEV = torch_xla.device()
g = torch.Generator().manual_seed(0)
X = torch.randn(2, 3, 4, 6, generator=g)
W = torch.randn(5, 6, generator=g)


def _diff_out(x):
    out = torch.empty(2, 3, 4, 5, device=x.device)
    torch.diff(x, out=out)
    return out


def _iand(x):
    b = x > 0
    b &= b.flip(0)
    return b


def _mha(x):
    q = x[0].transpose(0, 1).reshape(4, 3, 6)
    w_in = torch.linspace(-1, 1, 108).reshape(18, 6).to(x.device)
    w_out = torch.linspace(-1, 1, 36).reshape(6, 6).to(x.device)
    return F.multi_head_attention_forward(q, q, q, 6, 2, w_in, None, None, None, False, 0.0, w_out, None,
                                          training=False, need_weights=False)[0]


CASES = {
    "matmul": lambda x: x @ x.transpose(-1, -2),
    "matmul_broadcast": lambda x: x @ W.t().to(x.device),
    "einsum": lambda x: torch.einsum("abcd,abed->abce", x, x),
    "linear": lambda x: F.linear(x, W.to(x.device)),
    "tensordot": lambda x: torch.tensordot(x, x, dims=([2, 3], [2, 3])),
    "sdpa": lambda x: F.scaled_dot_product_attention(x, x, x),
    "sdpa_causal": lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True),
    "mha": _mha,
    "clip_": lambda x: x.clip_(0, 0.5),
    "fill_diagonal_": lambda x: x[0, 0].fill_diagonal_(3.0),
    "float_power_": lambda x: x.abs().double().float_power_(2),
    "diff_out": _diff_out,
    "matmul_out": lambda x: torch.matmul(x[0, 0], x[0, 0].t(), out=torch.empty(4, 4, device=x.device)),
    "iand": _iand,
    "flatten_write": lambda x: (lambda v: (v.mul_(2), x)[1])(x.flatten(1)),
    "chunk": lambda x: x.chunk(2, -1)[1] * 2,
}


def _fallbacks():
    return {k for k in met.counter_names() if k.startswith("aten::")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inference_mode_matches_eager(name):
    fn = CASES[name]
    with torch.inference_mode():
        ref = fn(X.clone())
        met.clear_counters()
        got = fn(X.clone().to(DEV))
        assert got.device.type == "xla"
        got = got.cpu()
    assert _fallbacks() == set(), f"ops on the CPU fallback: {sorted(_fallbacks())}"
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_inference_mode_writes_reach_the_base():
    """An in-place composite on a view under inference_mode writes through to its base."""
    with torch.inference_mode():
        ref = X.clone()
        ref[0].clip_(-0.1, 0.1)
        got = X.clone().to(DEV)
        got[0].clip_(-0.1, 0.1)
        torch.testing.assert_close(got.cpu(), ref)


def test_inference_mode_models():
    torch.manual_seed(0)
    gpt = models.GPT2(vocab=64, block=16, d=32, heads=4, layers=2).eval()
    resnet = models.ResNet(width=8).eval()
    tok = torch.randint(0, 64, (2, 16), generator=g)
    img = torch.randn(2, 3, 16, 16, generator=g)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2).eval()
    seq = torch.randn(2, 10, 32, generator=g)
    for model, inp in ((gpt, tok), (resnet, img), (enc, seq)):
        with torch.inference_mode():
            ref = model(inp)
            ref = ref[0] if isinstance(ref, tuple) else ref
        model_x = model.to(DEV)
        met.clear_counters()
        with torch.inference_mode():
            got = model_x(inp.to(DEV))
            got = (got[0] if isinstance(got, tuple) else got).cpu()
        model.cpu()
        assert _fallbacks() == set(), f"{type(model).__name__}: ops on the CPU fallback: {sorted(_fallbacks())}"
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)


def test_cpu_functionalize_unchanged():
    """Functional tensors of other devices (torch.func.functionalize) keep their behaviour."""
    def f(x):
        y = x @ x.t()
        y.add_(1)
        return torch.einsum("ij,jk->ik", y, x)

    x = torch.randn(3, 3, generator=g)
    with torch.inference_mode():
        torch.testing.assert_close(torch.func.functionalize(f)(x.clone()), f(x.clone()))
        ref = x.clone().clip_(0, 0.5)
        torch.testing.assert_close(torch.func.functionalize(lambda t: t.clip_(0, 0.5))(x.clone()), ref)


VIEWS = {
    "t": lambda w: w[0].t(),
    "view": lambda w: w.view(72),
    "transpose": lambda w: w.transpose(0, 1),
    "getitem": lambda w: w[0],
    "reshape": lambda w: w.reshape(12, 6),
    "detach": lambda w: w.detach(),
    "split": lambda w: w.split(2, 1)[1],
    "unbind": lambda w: w.unbind(0)[2],
    "expand": lambda w: w[:, :1].expand(3, 5, 6),
    "unfold": lambda w: w.unfold(2, 2, 2),
    "as_strided": lambda w: w.as_strided((2, 2), (1, 6)),
    "diagonal": lambda w: w[0].diagonal(),
    "view_of_view": lambda w: w[1].view(24).view(4, 6)[1:],
    "permute": lambda w: w.permute(2, 0, 1),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_of_normal_tensors(name):
    """A view of a tensor made outside inference_mode (a parameter, a batch) is a normal tensor, as in
    eager; it used to raise "Cannot set version_counter for inference tensor"."""
    wc = torch.randn(3, 4, 6, generator=g)
    w = wc.to(DEV)
    with torch.inference_mode():
        ref, got = VIEWS[name](wc), VIEWS[name](w)
        assert got.is_inference() == ref.is_inference() is False
        torch.testing.assert_close(got.cpu(), ref)
        # a view of that view, and of a fresh (inference) result
        torch.testing.assert_close(got.flatten()[1:].cpu(), ref.flatten()[1:])
        torch.testing.assert_close(VIEWS[name](w * 2).cpu(), VIEWS[name](wc * 2))


def test_kv_cache_written_in_inference_mode():
    """A buffer made outside inference_mode, written slice by slice inside it (a KV cache)."""
    cache_c = torch.zeros(2, 5, 3)
    cache = cache_c.to(DEV)
    with torch.inference_mode():
        for pos in range(5):
            k = torch.full((2, 3), float(pos + 1))
            cache[:, pos] = k.to(DEV)
            cache_c[:, pos] = k
            torch.testing.assert_close(cache[:, : pos + 1].sum(-1).cpu(), cache_c[:, : pos + 1].sum(-1))
        cache.add_(1)
        cache_c.add_(1)
    torch.testing.assert_close(cache.cpu(), cache_c)
    assert not cache.is_inference()
