"""torch.library custom ops on XLA tensors, against eager CPU.

A custom op's default (composite) kernel used to run below functionalization on our raw tensors: its
views were copies made by the CPU fallback, so writes through them were lost. torch_xla now runs such
composites under functionalization (torch_xla/_internal/custom_ops.py).
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_xla
import torch_xla.debug.metrics as met

DEV = torch_xla.device()


def _fallen_back():
    return [k for k in met.counter_names() if k.startswith("aten::") and k != "aten::_local_scalar_dense"]


@torch.library.custom_op("txla_test::chunked_scale", mutates_args=())
def chunked_scale(x: torch.Tensor, w: torch.Tensor, chunk: int) -> torch.Tensor:
    """Writes its result chunk by chunk through narrow views and out= (as torch.nn's chunked
    linear_cross_entropy does)."""
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    acc = torch.zeros(w.shape[0], dtype=x.dtype, device=x.device)
    for s in range(0, x.shape[0], chunk):
        rows = out.narrow(0, s, min(chunk, x.shape[0] - s))
        torch.mm(x.narrow(0, s, rows.shape[0]), w.t(), out=rows)
        rows.mul_(2).add_(1)
        acc.add_(rows.sum(0))
    out.view(-1)[::3] = -1.0
    return out + acc


@chunked_scale.register_fake
def _(x, w, chunk):
    return x.new_empty(x.shape[0], w.shape[0])


def test_composite_custom_op_with_view_writes_as_eager():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(7, 5, generator=g), torch.randn(3, 5, generator=g)
    want = chunked_scale(x, w, 3)
    met.clear_counters()
    got = chunked_scale(x.to(DEV), w.to(DEV), 3)
    torch.testing.assert_close(got.cpu(), want)
    assert _fallen_back() == [], _fallen_back()


def test_custom_op_defined_after_import_with_autograd():
    lib = torch.library.Library("txla_test2", "FRAGMENT")
    lib.define("cumsum_rows(Tensor x) -> Tensor")

    def impl(x):
        out = torch.zeros_like(x)
        run = torch.zeros_like(x[0])
        for i in range(x.shape[0]):
            run.add_(x[i])
            out[i].copy_(run)
        return out

    lib.impl("cumsum_rows", impl, "CompositeExplicitAutograd")
    x = torch.arange(12.0).reshape(4, 3)
    want = torch.ops.txla_test2.cumsum_rows(x)
    met.clear_counters()
    got = torch.ops.txla_test2.cumsum_rows(x.to(DEV))
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(want, x.cumsum(0))
    assert _fallen_back() == [], _fallen_back()


def test_chunked_linear_cross_entropy_as_eager():
    """torch.nn.functional.linear_cross_entropy with chunking options (torch 2.13): losses and
    gradients (it precomputes gradients in its forward, writing them through narrow views)."""
    from torch.nn import LinearCrossEntropyOptions
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(9, 6, generator=g), torch.randn(11, 6, generator=g)
    b = torch.randn(11, generator=g)
    t = torch.randint(0, 11, (9,), generator=g)
    t[2] = -100
    for reduction in ("mean", "sum", "none"):
        opts = LinearCrossEntropyOptions(batch_chunk_size=4)
        xs = [x.clone().requires_grad_(), x.to(DEV).requires_grad_()]
        ws = [w.clone().requires_grad_(), w.to(DEV).requires_grad_()]
        bs = [b.clone().requires_grad_(), b.to(DEV).requires_grad_()]
        outs = [F.linear_cross_entropy(xs[i], ws[i], t.to(xs[i].device), linear_bias=bs[i], reduction=reduction,
                                       options=opts) for i in range(2)]
        for o in outs:
            (o * torch.arange(1.0, o.numel() + 1, device=o.device).reshape(o.shape)).sum().backward()
        torch.testing.assert_close(outs[1].detach().cpu(), outs[0].detach(), rtol=1e-5, atol=1e-5)
        for p in (xs, ws, bs):
            torch.testing.assert_close(p[1].grad.cpu(), p[0].grad, rtol=1e-5, atol=1e-5)


def test_custom_op_defined_before_import_and_user_xla_kernel():
    """An op defined before `import torch_xla` is covered at import; a kernel the user registers for
    "xla" afterwards replaces ours."""
    code = textwrap.dedent("""
        import torch

        @torch.library.custom_op("txla_pre::fill_diag", mutates_args=())
        def fill_diag(x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            y.diagonal().fill_(7.0)
            return y

        import torch_xla
        d = torch_xla.device()
        x = torch.zeros(3, 3)
        assert torch.equal(fill_diag(x.to(d)).cpu(), fill_diag(x)), fill_diag(x.to(d)).cpu()

        @fill_diag.register_kernel("xla")
        def _(x):
            return x + 1
        assert torch.equal(fill_diag(x.to(d)).cpu(), torch.ones(3, 3))
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PJRT_DEVICE="CPU"))
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


@torch.library.custom_op("txla_test::kv_update", mutates_args=("cache",))
def _kv_update(cache: torch.Tensor, new: torch.Tensor, pos: int) -> None:
    cache[:, pos:pos + new.shape[1]].copy_(new)


@torch.library.custom_op("txla_test::scale_both", mutates_args=("a", "b"))
def _scale_both(a: torch.Tensor, b: torch.Tensor, s: float) -> torch.Tensor:
    a.mul_(s)
    b.add_(1)
    return a + b


def test_mutating_custom_op_as_eager():
    """A composite custom op that writes its arguments in place (`mutates_args=...`): functionalization's
    fallback refused it on XLA tensors ("Found a custom (non-ATen) operator whose output has alias
    annotations"); an AutogradXLA kernel runs its composite on the functional tensors, below autograd
    as eager's kernel for an op without an autograd formula: values, views of the written tensors and
    a written view's base as eager, and gradients of the surrounding ops as eager's (the write itself
    is not recorded, as eager)."""
    res = []
    for dev in ("cpu", DEV):
        cache = torch.zeros(2, 6, device=dev)
        row = cache[1]
        _kv_update(cache, torch.arange(4.0, device=dev).view(2, 2), 3)
        a, b = torch.ones(3, device=dev), torch.zeros(3, device=dev)
        r = _scale_both(a, b, 3.0)
        base = torch.arange(4.0, device=dev)
        _scale_both(base[1:3], torch.zeros(2, device=dev), 2.0)
        x = torch.arange(3.0, device=dev).requires_grad_()
        y = x * 2
        _scale_both(y, torch.zeros(3, device=dev), 5.0)
        (y * x).sum().backward()
        res.append([t.detach().cpu() for t in (cache, row, a, b, r, base, y, x.grad)])
    for e, o in zip(*res):
        assert torch.equal(e, o), (e, o)
