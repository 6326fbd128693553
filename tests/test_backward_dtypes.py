"""Every ``*_backward`` op-table row called with a grad of one floating dtype and an input of another
(f32 / bf16 / f16), against eager CPU: the result dtype and values where eager computes (it promotes
for the activation backwards, keeps the input's or the grad's dtype for others), and the exception
type where eager refuses the mix (most kernels check that grad and input share their dtype)."""
import pytest
import torch

import torch_xla

DEV = torch_xla.device()
A = torch.ops.aten
DTS = [torch.float32, torch.bfloat16, torch.float16]
MIXED = [(g, x) for g in DTS for x in DTS if g != x]


def mk(shape, dt, seed, lo=-2.0, hi=2.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=gen) * (hi - lo) + lo).to(dt)


def _maxpool(g, x, d):
    X = mk((1, 1, 4, 4), x, 2).to(d)
    idx = A.max_pool2d_with_indices(X, [2, 2], [2, 2])[1]
    return A.max_pool2d_with_indices_backward(mk((1, 1, 2, 2), g, 1).to(d), X, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)


def _adamax(g, x, d):
    X = mk((1, 1, 4, 4), x, 2).to(d)
    return A.adaptive_max_pool2d_backward(mk((1, 1, 2, 2), g, 1).to(d), X, A.adaptive_max_pool2d(X, [2, 2])[1])


def _flash_attention(g, x, d):
    q, k, v = (mk((1, 2, 3, 4), x, s).to(d) for s in (2, 3, 4))
    out, lse = A._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    return A._scaled_dot_product_flash_attention_for_cpu_backward(mk((1, 2, 3, 4), g, 1).to(d), q, k, v, out, lse,
                                                                   0.0, True)


def _batch_norm(g, x, d):
    return A.native_batch_norm_backward(
        mk((2, 3, 4), g, 1).to(d), mk((2, 3, 4), x, 2).to(d), mk(3, x, 3).to(d), None, None, mk(3, x, 4).to(d),
        mk(3, x, 5, 0.5, 1.5).to(d), True, 1e-5, [True, True, True])


# row name -> fn(grad dtype, input dtype, device): the grad is the first argument, the other
# floating tensors take the input's dtype.
CASES = {
    "gelu_backward": lambda g, x, d: A.gelu_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d)),
    "gelu_backward[tanh]": lambda g, x, d: A.gelu_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d), approximate="tanh"),
    "sigmoid_backward": lambda g, x, d: A.sigmoid_backward(mk(5, g, 1).to(d), mk(5, x, 2, 0, 1).to(d)),
    "tanh_backward": lambda g, x, d: A.tanh_backward(mk(5, g, 1).to(d), mk(5, x, 2, -1, 1).to(d)),
    "silu_backward": lambda g, x, d: A.silu_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d)),
    "mish_backward": lambda g, x, d: A.mish_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d)),
    "threshold_backward": lambda g, x, d: A.threshold_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d), 0.1),
    "log_sigmoid_backward": lambda g, x, d: A.log_sigmoid_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d),
                                                                   mk(5, x, 3, 0, 1).to(d)),
    "softplus_backward": lambda g, x, d: A.softplus_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d), 1.0, 20.0),
    "mse_loss_backward": lambda g, x, d: A.mse_loss_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d), mk(5, x, 3).to(d), 0),
    "mse_loss_backward[mean]": lambda g, x, d: A.mse_loss_backward(mk((), g, 1).to(d), mk(5, x, 2).to(d),
                                                                   mk(5, x, 3).to(d), 1),
    "huber_loss_backward": lambda g, x, d: A.huber_loss_backward(mk(5, g, 1).to(d), mk(5, x, 2).to(d),
                                                                 mk(5, x, 3).to(d), 0, 1.0),
    "binary_cross_entropy_backward": lambda g, x, d: A.binary_cross_entropy_backward(
        mk(5, g, 1).to(d), mk(5, x, 2, 0.1, 0.9).to(d), mk(5, x, 3, 0, 1).to(d), None, 0),
    "_softmax_backward_data": lambda g, x, d: A._softmax_backward_data(mk((2, 3), g, 1).to(d),
                                                                       mk((2, 3), x, 2, 0, 1).to(d), 1, x),
    "_log_softmax_backward_data": lambda g, x, d: A._log_softmax_backward_data(mk((2, 3), g, 1).to(d),
                                                                               mk((2, 3), x, 2, -2, 0).to(d), 1, x),
    "nll_loss_backward": lambda g, x, d: A.nll_loss_backward(
        mk((), g, 1).to(d), mk((2, 3), x, 2).to(d), torch.tensor([0, 2]).to(d), None, 1, -100,
        torch.tensor(2.0, dtype=x).to(d)),
    "nll_loss2d_backward": lambda g, x, d: A.nll_loss2d_backward(
        mk((), g, 1).to(d), mk((1, 3, 2, 2), x, 2).to(d), torch.tensor([[[0, 2], [1, 1]]]).to(d), None, 1, -100,
        torch.tensor(4.0, dtype=x).to(d)),
    "native_layer_norm_backward": lambda g, x, d: A.native_layer_norm_backward(
        mk((2, 4), g, 1).to(d), mk((2, 4), x, 2).to(d), [4], mk((2, 1), x, 3).to(d), mk((2, 1), x, 4, 0.5, 1.5).to(d),
        mk(4, x, 5).to(d), mk(4, x, 6).to(d), [True, True, True]),
    "native_group_norm_backward": lambda g, x, d: A.native_group_norm_backward(
        mk((2, 4, 3), g, 1).to(d), mk((2, 4, 3), x, 2).to(d), mk((2, 2), x, 3).to(d), mk((2, 2), x, 4, 0.5, 1.5).to(d),
        mk(4, x, 5).to(d), 2, 4, 3, 2, [True, True, True]),
    "native_batch_norm_backward": _batch_norm,
    "batch_norm_backward": lambda g, x, d: A.batch_norm_backward(
        mk((2, 3, 4), g, 1).to(d), mk((2, 3, 4), x, 2).to(d), mk(3, x, 3).to(d), None, None, mk(3, x, 4).to(d),
        mk(3, x, 5, 0.5, 1.5).to(d), True, 1e-5, [True, True, True], torch.empty(0, dtype=torch.uint8).to(d)),
    "native_dropout_backward": lambda g, x, d: A.native_dropout_backward(
        mk(5, g, 1).to(d), (mk(5, torch.float32, 2) > 0).to(d), 2.0),
    "_prelu_kernel_backward": lambda g, x, d: A._prelu_kernel_backward(mk((2, 3), g, 1).to(d), mk((2, 3), x, 2).to(d),
                                                                       mk(3, x, 3).to(d)),
    "grid_sampler_2d_backward": lambda g, x, d: A.grid_sampler_2d_backward(
        mk((1, 1, 2, 2), g, 1).to(d), mk((1, 1, 3, 3), x, 2).to(d), mk((1, 2, 2, 2), x, 3, -1, 1).to(d), 0, 0, False,
        [True, True]),
    "convolution_backward": lambda g, x, d: A.convolution_backward(
        mk((1, 2, 3, 3), g, 1).to(d), mk((1, 1, 5, 5), x, 2).to(d), mk((2, 1, 3, 3), x, 3).to(d), [2], [1, 1], [0, 0],
        [1, 1], False, [0, 0], 1, [True, True, True]),
    "max_pool2d_with_indices_backward": _maxpool,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _flash_attention,
    "avg_pool2d_backward": lambda g, x, d: A.avg_pool2d_backward(
        mk((1, 1, 2, 2), g, 1).to(d), mk((1, 1, 4, 4), x, 2).to(d), [2, 2], [2, 2], [0, 0], False, True, None),
    "avg_pool3d_backward": lambda g, x, d: A.avg_pool3d_backward(
        mk((1, 1, 1, 2, 2), g, 1).to(d), mk((1, 1, 2, 4, 4), x, 2).to(d), [2, 2, 2], [2, 2, 2], [0, 0, 0], False, True,
        None),
    "_adaptive_avg_pool2d_backward": lambda g, x, d: A._adaptive_avg_pool2d_backward(mk((1, 1, 2, 2), g, 1).to(d),
                                                                                     mk((1, 1, 4, 4), x, 2).to(d)),
    "_adaptive_avg_pool3d_backward": lambda g, x, d: A._adaptive_avg_pool3d_backward(
        mk((1, 1, 1, 2, 2), g, 1).to(d), mk((1, 1, 2, 4, 4), x, 2).to(d)),
    "adaptive_max_pool2d_backward": _adamax,
    "embedding_dense_backward": lambda g, x, d: A.embedding_dense_backward(
        mk((3, 4), g, 1).to(d), torch.tensor([0, 2, 0]).to(d), 5, -1, False),
    "_cdist_backward": lambda g, x, d: A._cdist_backward(mk((2, 3), g, 1).to(d), mk((2, 4), x, 2).to(d),
                                                         mk((3, 4), x, 3).to(d), 2.0, mk((2, 3), x, 4, 0.5, 1.5).to(d)),
    "_pdist_backward": lambda g, x, d: A._pdist_backward(mk(3, g, 1).to(d), mk((3, 4), x, 2).to(d), 2.0,
                                                         mk(3, x, 4, 0.5, 1.5).to(d)),
}

# Backward rows with a single floating tensor argument (no grad/input mix to make), or covered by a
# sibling row's case (same code, another spatial rank).
SINGLE_TENSOR = {"slice_backward", "select_backward", "upsample_nearest2d_backward", "upsample_linear1d_backward",
                 "upsample_bilinear2d_backward", "upsample_bicubic2d_backward", "upsample_trilinear3d_backward",
                 "upsample_nearest1d_backward", "upsample_nearest3d_backward", "_upsample_nearest_exact1d_backward",
                 "_upsample_nearest_exact2d_backward"}
SIBLINGS = {"convolution_backward_overrideable": "convolution_backward",
            "max_pool3d_with_indices_backward": "max_pool2d_with_indices_backward"}


def _eager_gap(e):
    """Eager CPU kernel gaps (no bf16/f16 kernel, oneDNN refusing a mixed pair) that XLA does not share."""
    s = str(e)
    return "not implemented for" in s or "could not create a primitive descriptor" in s


def _run(fn, g, x, d):
    out = fn(g, x, d)
    out = out if isinstance(out, tuple) else (out,)
    return tuple(None if t is None else t.cpu() for t in out)


def _tol(*dts):
    """The tolerance of the least precise operand: with a bf16/f16 operand eager's CPU kernels (oneDNN
    for gelu) may round intermediates to it even when the result is f32; XLA computes in f32."""
    if torch.bfloat16 in dts:
        return dict(atol=2e-2, rtol=2e-2)
    if torch.float16 in dts:
        return dict(atol=4e-3, rtol=4e-3)
    return dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gx", MIXED, ids=lambda p: f"{str(p[0])[6:]}-{str(p[1])[6:]}")
@pytest.mark.parametrize("name", sorted(CASES))
def test_mixed_dtype_backward(name, gx):
    g, x = gx
    fn = CASES[name]
    try:
        ref, ref_exc = _run(fn, g, x, "cpu"), None
    except Exception as e:  # eager's refusal is part of the contract
        ref, ref_exc = None, e
    if ref_exc is not None and _eager_gap(ref_exc) and name.startswith("gelu_backward"):
        # oneDNN's f16/bf16 gelu gap: the tanh form (and TensorIterator's rule) promotes; compare with
        # eager on the promoted dtype.
        ref, ref_exc = _run(fn, torch.promote_types(g, x), torch.promote_types(g, x), "cpu"), None
    if ref_exc is not None:
        with pytest.raises(Exception) as info:
            _run(fn, g, x, DEV)
        want = RuntimeError if _eager_gap(ref_exc) else type(ref_exc)
        assert isinstance(info.value, want), f"eager raised {type(ref_exc).__name__}: {ref_exc}; we {info.value!r}"
        return
    got = _run(fn, g, x, DEV)
    assert len(got) == len(ref)
    for r, o in zip(ref, got):
        if r is None:
            assert o is None
            continue
        assert o.dtype == r.dtype and o.shape == r.shape
        torch.testing.assert_close(o.float(), r.float(), **_tol(g, x, r.dtype), equal_nan=True)


def test_sweep_covers_every_backward_row():
    rows = {r.split(".")[0] for r in torch_xla._C._lowered_ops()
            if r.split(".")[0].endswith("_backward") or r.split(".")[0].endswith("_backward_data")}
    covered = {n.split("[")[0] for n in CASES} | SINGLE_TENSOR | set(SIBLINGS)
    assert rows - covered == set(), f"backward rows without a mixed-dtype case: {sorted(rows - covered)}"


@pytest.mark.parametrize("name", sorted(SIBLINGS))
def test_sibling_rows_refuse_mixed(name):
    """Rows eager has no CPU kernel for (overrideable conv) or shares a check with a swept sibling:
    a bf16 grad of an f32 input raises as the sibling does."""
    g, x = torch.bfloat16, torch.float32
    fns = {
        "convolution_backward_overrideable": lambda d: A.convolution_backward_overrideable(
            mk((1, 2, 3, 3), g, 1).to(d), mk((1, 1, 5, 5), x, 2).to(d), mk((2, 1, 3, 3), x, 3).to(d), [1, 1], [0, 0],
            [1, 1], False, [0, 0], 1, [True, True, True]),
        "max_pool3d_with_indices_backward": lambda d: (lambda X: A.max_pool3d_with_indices_backward(
            mk((1, 1, 1, 2, 2), g, 1).to(d), X, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False,
            A.max_pool3d_with_indices(X, [2, 2, 2], [2, 2, 2])[1]))(mk((1, 1, 2, 4, 4), x, 2).to(d)),
    }
    with pytest.raises(RuntimeError, match="expected scalar type"):
        r = fns[name](DEV)
        [t.cpu() for t in (r if isinstance(r, tuple) else (r,)) if t is not None]
