"""F.scaled_dot_product_attention on XLA: eager CPU's fused kernel where eager runs it.

Eager CPU runs `_scaled_dot_product_flash_attention_for_cpu` for 4-d float q/k/v without mask or
dropout; XLA tensors now run the same op (one op-table row forward, one backward) instead of the
math decomposition. Values, gradients, dtypes, layouts and autograd nodes are compared with eager's;
every other case keeps torch's composite and eager's results.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_xla
import torch_xla.debug.metrics as met

DEV = torch_xla.device()
TOL = {torch.float32: (2e-5, 2e-5), torch.float64: (1e-12, 1e-12), torch.bfloat16: (2e-2, 2e-2),
       torch.float16: (2e-3, 2e-3)}


def _qkv(shape_q, shape_kv, dtype, transposed, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in (shape_q, shape_kv, shape_kv):
        if transposed:  # [B, L, H, E] memory seen as [B, H, L, E], as a model's split heads
            b, h, t, e = s
            t_ = torch.randn(b, t, h, e, generator=g, dtype=torch.float64).to(dtype).transpose(1, 2)
        else:
            t_ = torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
        out.append(t_)
    return out


def _run(q, k, v, device, **kw):
    """Eager CPU's output and gradients (device is always "cpu": the reference)."""
    assert device == "cpu"
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, **kw)
    g = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape).to(o.dtype)
    o.backward(g)
    return o, [t.grad for t in leaves]


def _to_xla_like(t):
    """t on the device with t's strides (a transposed CPU tensor stays transposed)."""
    if t.is_contiguous():
        return t.to(DEV)
    # transposed [B, L, H, E] -> [B, H, L, E]
    return t.transpose(1, 2).contiguous().to(DEV).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("shapes", [((2, 3, 5, 8), (2, 3, 7, 8)), ((1, 2, 9, 4), (1, 2, 4, 4)),
                                    ((2, 4, 16, 32), (2, 4, 16, 32))])
def test_fused_sdpa_matches_eager(dtype, causal, transposed, shapes):
    q, k, v = _qkv(*shapes, dtype, transposed)
    ref_o, ref_g = _run(q, k, v, "cpu", is_causal=causal)
    leaves = [_to_xla_like(t).detach().requires_grad_() for t in (q, k, v)]
    met.clear_counters()
    o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    assert type(o.grad_fn).__name__ == type(ref_o.grad_fn).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0"
    g = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape).to(dtype)
    o.backward(g.to(DEV))
    rtol, atol = TOL[dtype]
    assert o.dtype == ref_o.dtype and o.shape == ref_o.shape and o.stride() == ref_o.stride()
    torch.testing.assert_close(o.cpu(), ref_o, rtol=rtol, atol=atol)
    for a, b in zip(leaves, ref_g):
        assert a.grad.dtype == b.dtype and a.grad.shape == b.shape and a.grad.stride() == b.stride()
        torch.testing.assert_close(a.grad.cpu(), b, rtol=rtol, atol=atol)
    assert not [n for n in met.counter_names() if n.startswith("aten::")], met.counter_names()


def test_fused_sdpa_scale_argument():
    q, k, v = _qkv((2, 2, 6, 8), (2, 2, 6, 8), torch.float32, False)
    ref, ref_g = _run(q, k, v, "cpu", is_causal=True, scale=0.3)
    leaves = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=True, scale=0.3)
    o.backward(torch.linspace(-1, 1, o.numel()).reshape(o.shape).to(DEV))
    torch.testing.assert_close(o.cpu(), ref)
    for a, b in zip(leaves, ref_g):
        torch.testing.assert_close(a.grad.cpu(), b)


@pytest.mark.parametrize("case", ["bool_mask", "float_mask", "dropout_eval", "gqa", "value_head_dim", "broadcast_batch",
                                  "three_d"])
def test_other_sdpa_calls_keep_eagers_results(case):
    g = torch.Generator().manual_seed(1)
    rnd = lambda *s: torch.randn(*s, generator=g)
    kw = {}
    q, k, v = rnd(2, 4, 5, 8), rnd(2, 4, 6, 8), rnd(2, 4, 6, 8)
    if case == "bool_mask":
        kw["attn_mask"] = torch.rand(5, 6, generator=g) > 0.3
        kw["attn_mask"][:, 0] = True
    elif case == "float_mask":
        kw["attn_mask"] = rnd(2, 1, 5, 6)
    elif case == "dropout_eval":
        kw["dropout_p"] = 0.0
        kw["is_causal"] = True
    elif case == "gqa":
        k, v = rnd(2, 2, 6, 8), rnd(2, 2, 6, 8)
        kw["enable_gqa"] = True
    elif case == "value_head_dim":
        v = rnd(2, 4, 6, 3)
    elif case == "broadcast_batch":
        k, v = rnd(1, 4, 6, 8), rnd(1, 4, 6, 8)
    elif case == "three_d":
        q, k, v = rnd(4, 5, 8), rnd(4, 6, 8), rnd(4, 6, 8)
    ref, ref_g = _run(q, k, v, "cpu", **kw)
    xkw = {n: (t.to(DEV) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    leaves = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, **xkw)
    o.backward(torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape).float().to(DEV))
    torch.testing.assert_close(o.cpu(), ref, rtol=2e-5, atol=2e-5)
    for a, b in zip(leaves, ref_g):
        torch.testing.assert_close(a.grad.cpu(), b, rtol=2e-5, atol=2e-5)


def test_dropout_keeps_the_math_path_and_its_masks():
    q = torch.randn(2, 2, 8, 4).to(DEV)
    torch_xla.manual_seed(3)
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    torch_xla.manual_seed(3)
    b = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    c = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert torch.equal(a.cpu(), b.cpu()) and not torch.equal(a.cpu(), c.cpu())


def test_direct_call_errors_match_eager():
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(RuntimeError, match="Currently do not support dropout > 0"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.1, False)
    with pytest.raises(RuntimeError, match="Currently do not support dropout > 0"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q.to(DEV), q.to(DEV), q.to(DEV), 0.1, False)
    v = torch.randn(1, 1, 4, 3)
    with pytest.raises(RuntimeError, match="Q/K/V should have the same head size"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, v, 0.0, False)
    with pytest.raises(RuntimeError, match="Q/K/V should have the same head size"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q.to(DEV), q.to(DEV), v.to(DEV), 0.0, False)


def test_forward_ad_and_inference_mode():
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    t = torch.randn_like(q)
    f = lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True)
    # eager CPU's fused kernel has no forward-mode formula (eager raises); XLA takes the math path,
    # compared with eager's math path
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.func.jvp(f, (q,), (t,))
    got = torch.func.jvp(f, (q.to(DEV),), (t.to(DEV),))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.cpu(), b)
    with torch.inference_mode():
        torch.testing.assert_close(f(q.to(DEV)).cpu(), f(q))
    with torch.no_grad():
        torch.testing.assert_close(f(q.to(DEV)).cpu(), f(q))


def test_fused_sdpa_off_switch():
    code = (
        "import torch, torch_xla, torch.nn.functional as F\n"
        "q = torch.randn(1, 2, 4, 8, device=torch_xla.device(), requires_grad=True)\n"
        "o = F.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
        "print(type(o.grad_fn).__name__)\n"
    )
    env = dict(os.environ, TXLA_FUSED_SDPA="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Flash" not in out.stdout.strip().splitlines()[-1]
