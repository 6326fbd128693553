"""Differential tests of the op table against eager CPU PyTorch, driven by PyTorch's OpInfo database.

One pytest case per (OpInfo, dtype). Rule for each case:
  * samples: ``op.sample_inputs("cpu", dtype, requires_grad=<float32 and op supports autograd>)``
    under a fixed seed; of that list at most ``MAX_SAMPLES`` (4) are used, evenly spaced from first to
    last (so later samples with other kwargs, e.g. reductions/weights, are not always cut off).
  * the op runs on CPU and on ``xla`` (every tensor in input/args/kwargs moved with ``.to("xla")``,
    kept a leaf with the same ``requires_grad``); outputs are compared with
    ``torch.testing.assert_close`` (values, dtypes, shapes; NaNs equal; strides ignored).
  * float32 differentiable ops also compare gradients: backward of ``sum(out * w)`` over every
    floating output, ``w`` a fixed random weight, then every input's ``.grad``.
  * dtypes: float32 always (when the OpInfo supports it), plus bfloat16 / int64 / bool where
    ``op.supported_dtypes("cpu")`` has them and the op is meaningful for them (``NO_EXTRA_DTYPES``).
  * fallbacks: a case fails if the CPU fallback ran for one of its own rows' aten names
    (counter ``aten::<row base name>`` grew); any other fallback seen is recorded and printed
    in a summary when the module ends.
The last test (``test_zz_coverage``) checks that every row of ``torch_xla._C._lowered_ops()`` was
exercised (its ``xla::<base>`` counter > 0) or is listed in ``EXEMPT`` with a reason.
Random ops are checked by ``test_random_ops`` for shape/dtype/range only.
"""

from __future__ import annotations

import collections
import zlib

import pytest
import torch
import torch.utils._pytree as pytree
import torch_xla
import torch_xla.debug.metrics as met
from torch.testing._internal.common_methods_invocations import op_db

MAX_SAMPLES = 4
XLA = "xla"

# (OpInfo name, variant_test_name) -> op-table rows it is meant to exercise. The rows' aten base names
# are the "main op": the case fails if their CPU fallback ran (e.g. an unlowered sibling overload).
OPINFO_ROWS: dict[tuple[str, str], tuple[str, ...]] = {
    # ---- elementwise arithmetic
    ("add", ""): ("add.Tensor", "add.Scalar"),
    ("sub", ""): ("sub.Tensor", "sub.Scalar"),
    ("rsub", ""): ("rsub.Tensor", "rsub.Scalar"),
    ("mul", ""): ("mul.Tensor", "mul.Scalar"),
    ("div", "no_rounding_mode"): ("div.Tensor", "div.Scalar"),
    ("div", "trunc_rounding"): ("div.Tensor_mode",),
    ("div", "floor_rounding"): ("div.Tensor_mode",),
    ("true_divide", ""): ("div.Tensor",),
    ("pow", ""): ("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar"),
    ("maximum", ""): ("maximum",),
    ("minimum", ""): ("minimum",),
    ("max", "binary"): ("maximum",),
    ("min", "binary"): ("minimum",),
    ("lerp", ""): ("lerp.Scalar",),
    ("addcmul", ""): ("addcmul",),
    ("addcdiv", ""): ("addcdiv",),
    ("where", ""): ("where.self",),
    ("masked_fill", ""): ("masked_fill.Scalar", "masked_fill.Tensor"),
    ("clamp", ""): ("clamp", "clamp.Tensor"),
    ("clamp_min", ""): ("clamp_min",),
    ("clamp_max", ""): ("clamp_max",),
    # ---- unary
    ("neg", ""): ("neg",),
    ("abs", ""): ("abs",),
    ("exp", ""): ("exp",),
    ("expm1", ""): ("expm1",),
    ("log", ""): ("log",),
    ("log1p", ""): ("log1p",),
    ("sqrt", ""): ("sqrt",),
    ("rsqrt", ""): ("rsqrt",),
    ("sin", ""): ("sin",),
    ("cos", ""): ("cos",),
    ("tan", ""): ("tan",),
    ("tanh", ""): ("tanh", "tanh_backward"),
    ("erf", ""): ("erf",),
    ("sigmoid", ""): ("sigmoid", "sigmoid_backward"),
    ("floor", ""): ("floor",),
    ("ceil", ""): ("ceil",),
    ("round", ""): ("round",),
    ("sign", ""): ("sign",),
    ("reciprocal", ""): ("reciprocal",),
    ("logical_not", ""): ("logical_not",),
    ("bitwise_not", ""): ("bitwise_not",),
    ("nn.functional.relu", ""): ("relu", "threshold_backward"),
    ("nn.functional.gelu", ""): ("gelu", "gelu_backward"),
    ("nn.functional.silu", ""): ("silu", "silu_backward"),
    # ---- comparisons / logical
    ("eq", ""): ("eq.Tensor", "eq.Scalar"),
    ("ne", ""): ("ne.Tensor", "ne.Scalar"),
    ("lt", ""): ("lt.Tensor", "lt.Scalar"),
    ("le", ""): ("le.Tensor", "le.Scalar"),
    ("gt", ""): ("gt.Tensor", "gt.Scalar"),
    ("ge", ""): ("ge.Tensor", "ge.Scalar"),
    ("logical_and", ""): ("logical_and",),
    ("logical_or", ""): ("logical_or",),
    # ---- reductions
    ("sum", ""): ("sum", "sum.dim_IntList"),
    ("mean", ""): ("mean", "mean.dim"),
    ("amax", ""): ("amax",),
    ("amin", ""): ("amin",),
    ("argmax", ""): ("argmax",),
    ("argmin", ""): ("argmin",),
    ("max", "reduction_no_dim"): ("max",),
    ("min", "reduction_no_dim"): ("min",),
    ("max", "reduction_with_dim"): ("max.dim",),
    ("min", "reduction_with_dim"): ("min.dim",),
    ("cumsum", ""): ("cumsum",),
    # ---- matrix products
    ("mm", ""): ("mm",),
    ("bmm", ""): ("bmm",),
    ("addmm", ""): ("addmm",),
    ("addmm", "decomposed"): ("addmm",),
    ("dot", ""): ("dot",),
    ("matmul", ""): ("mm", "bmm", "_unsafe_view"),
    ("nn.functional.linear", ""): ("addmm", "mm"),
    # ---- nn
    ("softmax", ""): ("_softmax", "_softmax_backward_data"),
    ("softmax", "with_dtype"): ("_softmax", "_softmax_backward_data"),
    ("_softmax_backward_data", ""): ("_softmax_backward_data",),
    ("log_softmax", ""): ("_log_softmax", "_log_softmax_backward_data"),
    ("log_softmax", "with_dtype"): ("_log_softmax", "_log_softmax_backward_data"),
    ("nn.functional.layer_norm", ""): ("native_layer_norm", "native_layer_norm_backward"),
    ("native_layer_norm", ""): ("native_layer_norm", "native_layer_norm_backward"),
    ("nn.functional.embedding", ""): ("embedding", "embedding_dense_backward"),
    ("nn.functional.nll_loss", ""): ("nll_loss_forward", "nll_loss_backward"),
    ("nn.functional.cross_entropy", ""): ("_log_softmax", "nll_loss_forward", "nll_loss_backward"),
    ("native_dropout_backward", ""): ("native_dropout_backward",),
    # ---- shape / views (functionalization turns views into *_copy ops)
    ("view", ""): ("view_copy",),
    ("view_copy", ""): ("view_copy",),
    ("reshape", ""): ("view_copy", "_unsafe_view", "_reshape_alias_copy"),
    ("flatten", ""): ("view_copy",),
    ("permute", ""): ("permute_copy",),
    ("permute_copy", ""): ("permute_copy",),
    ("transpose", ""): ("transpose_copy.int",),
    ("transpose_copy", ""): ("transpose_copy.int",),
    ("t", ""): ("t_copy",),
    ("t_copy", ""): ("t_copy",),
    ("expand", ""): ("expand_copy",),
    ("expand_copy", ""): ("expand_copy",),
    ("narrow", ""): ("slice_copy.Tensor",),
    ("__getitem__", ""): ("slice_copy.Tensor", "select_copy.int"),
    ("select", ""): ("select_copy.int",),
    ("squeeze", ""): ("squeeze_copy", "squeeze_copy.dim"),
    ("squeeze", "multiple"): ("squeeze_copy.dims",),
    ("squeeze_copy", ""): ("squeeze_copy", "squeeze_copy.dim"),
    ("unsqueeze", ""): ("unsqueeze_copy",),
    ("unsqueeze_copy", ""): ("unsqueeze_copy",),
    ("alias_copy", ""): ("alias_copy",),
    ("clone", ""): ("clone",),
    ("select_scatter", ""): ("select_scatter",),
    ("slice_scatter", ""): ("slice_scatter",),
    ("split", ""): ("split_copy.Tensor",),
    ("split", "list_args"): ("split_with_sizes_copy",),
    ("split_with_sizes", ""): ("split_with_sizes_copy",),
    ("split_with_sizes_copy", ""): ("split_with_sizes_copy",),
    ("chunk", ""): ("split_copy.Tensor",),
    ("unbind", ""): ("unbind_copy.int",),
    ("cat", ""): ("cat",),
    ("stack", ""): ("stack",),
    ("flip", ""): ("flip",),
    ("index_select", ""): ("index_select",),
    # ---- factories / fills
    ("arange", ""): ("arange.start_step", "arange.start_out"),
    ("full", ""): ("full",),
    ("full_like", ""): ("full",),
    ("new_full", ""): ("full",),
    ("zeros", ""): ("full",),
    ("fill", ""): ("fill.Scalar", "fill.Tensor"),
    ("zero_", ""): ("zero",),
    ("empty", ""): ("empty.memory_format",),
    ("new_empty_strided", ""): ("empty_strided",),
}

# Ops whose output values are unspecified: compare shape and dtype only.
SHAPE_ONLY = {"empty", "new_empty_strided"}

# OpInfos tested in float32 only (extra dtypes add compile time without exercising anything new:
# pure data movement, or dtype-generic lowering already covered by a sibling case).
NO_EXTRA_DTYPES = {
    "view", "view_copy", "reshape", "flatten", "permute_copy", "transpose_copy", "t", "t_copy",
    "expand_copy", "narrow", "squeeze_copy", "unsqueeze_copy", "alias_copy", "split_with_sizes",
    "split_with_sizes_copy", "chunk", "true_divide", "addmm", "dot", "nn.functional.linear", "full_like",
    "new_full", "zeros", "new_empty_strided", "empty",
}
EXTRA_DTYPES = (torch.bfloat16, torch.int64, torch.bool)

# Tolerances (rtol, atol). float32: XLA:CPU evaluates transcendental functions with its own
# polynomial approximations and may reassociate reductions/dots, a few ulp off eager (1 ulp ~ 6e-8),
# so 1e-5 leaves headroom without hiding real bugs. bfloat16 (1 ulp ~ 7.8e-3 relative): eager rounds
# once from a float32 computation while XLA may round intermediates of a composite, so allow ~2 ulp.
# Integers and bools must match exactly.
TOLS = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}
# Gradients of float32 ops go through several ops (and reductions), allow a bit more.
GRAD_TOLS = (1e-5, 2e-5)
# Per-(OpInfo, dtype) overrides, each with a reason.
TOL_OVERRIDES: dict[tuple[str, torch.dtype], tuple[float, float]] = {}

# Known failures outside ops/ (bridge/graph/lowering): (name, variant, dtype) -> reason.
XFAILS: dict[tuple[str, str, torch.dtype], str] = {}


def _base(row: str) -> str:
    return row.split(".", 1)[0]


_OPS = {(o.name, o.variant_test_name): o for o in op_db}


def _dtypes(op) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    out = [torch.float32] if torch.float32 in supported else []
    if op.name not in NO_EXTRA_DTYPES:
        out += [d for d in EXTRA_DTYPES if d in supported]
    return out


def _cases():
    cases = []
    for key in OPINFO_ROWS:
        op = _OPS[key]
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        for dt in _dtypes(op):
            marks = []
            reason = XFAILS.get((op.name, op.variant_test_name, dt))
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            cases.append(pytest.param(key, dt, id=f"{name}-{str(dt).removeprefix('torch.')}", marks=marks))
    return cases


# ------------------------------------------------------------------------------- fallback log
OTHER_FALLBACKS: dict[str, set[str]] = collections.defaultdict(set)  # aten::op -> case ids


@pytest.fixture(autouse=True, scope="module")
def _fallback_summary():
    yield
    if OTHER_FALLBACKS:
        print("\n[test_ops_opinfo] CPU fallbacks seen (not failures; ops outside the table):")
        for name in sorted(OTHER_FALLBACKS):
            cases = sorted(OTHER_FALLBACKS[name])
            more = f" (+{len(cases) - 4} more)" if len(cases) > 4 else ""
            print(f"  {name}: {', '.join(cases[:4])}{more}")


def _aten_counters() -> dict[str, int]:
    return {n: met.counter_value(n) for n in met.counter_names() if n.startswith("aten::")}


# ------------------------------------------------------------------------------- helpers
def _pick(samples: list) -> list:
    n = len(samples)
    if n <= MAX_SAMPLES:
        return samples
    idx = sorted({round(i * (n - 1) / (MAX_SAMPLES - 1)) for i in range(MAX_SAMPLES)})
    return [samples[i] for i in idx]


def _leaf(t: torch.Tensor, device) -> torch.Tensor:
    r = t.detach().clone() if device == "cpu" else t.detach().to(device)  # never alias the sample
    return r.requires_grad_(t.requires_grad)


def _move(sample, device):
    def f(x):
        if isinstance(x, torch.Tensor):
            return _leaf(x, device)
        return x

    inp, args, kwargs = pytree.tree_map(f, (sample.input, sample.args, dict(sample.kwargs)))
    if "device" in kwargs:
        kwargs["device"] = device
    return inp, args, kwargs


def _to_cpu(out):
    return pytree.tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, out)


def _grad_leaves(tree) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor) and x.requires_grad]


def _backward(out, weights, device) -> bool:
    outs = [o for o in pytree.tree_leaves(out)
            if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad]
    if not outs:
        return False
    loss = sum((o * w.to(device)).sum() for o, w in zip(outs, weights(outs)))
    loss.backward()
    return True


def _weights_for(seed: int):
    cache: list[torch.Tensor] = []

    def weights(outs):
        if not cache:
            g = torch.Generator().manual_seed(seed)
            cache.extend(torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs)
        return cache

    return weights


def _compare(actual, expected, rtol, atol, what, shape_only=False):
    actual = _to_cpu(actual)
    if shape_only:
        a, e = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
        assert [(x.shape, x.dtype) for x in a] == [(x.shape, x.dtype) for x in e], what
        return
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_stride=False,
                               msg=lambda m: f"{what}: {m}")


def _describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"T{list(x.shape)}:{str(x.dtype).removeprefix('torch.')}"
        return repr(x)

    inp, args, kwargs = pytree.tree_map(d, (sample.input, sample.args, dict(sample.kwargs)))
    return f"input={inp} args={args} kwargs={kwargs}"


# ------------------------------------------------------------------------------- the cases
@pytest.mark.parametrize("key,dtype", _cases())
def test_op(key, dtype, request):
    op = _OPS[key]
    main = {f"aten::{_base(r)}" for r in OPINFO_ROWS[key]}
    seed = zlib.crc32(request.node.callspec.id.encode())
    torch.manual_seed(seed)
    with_grad = dtype == torch.float32 and op.supports_autograd
    samples = _pick(list(op.sample_inputs("cpu", dtype, requires_grad=with_grad)))
    assert samples, "no samples"
    rtol, atol = TOL_OVERRIDES.get((op.name, dtype), TOLS.get(dtype, (0, 0)))
    for k, sample in enumerate(samples):
        what = f"sample {k}: {_describe(sample)}"
        x_inp, x_args, x_kwargs = _move(sample, XLA)
        c_inp, c_args, c_kwargs = _move(sample, "cpu")
        before = _aten_counters()

        expected = op(c_inp, *c_args, **c_kwargs)
        actual = op(x_inp, *x_args, **x_kwargs)
        _compare(actual, expected, rtol, atol, what, shape_only=op.name in SHAPE_ONLY)

        c_leaves, x_leaves = _grad_leaves((c_inp, c_args, c_kwargs)), _grad_leaves((x_inp, x_args, x_kwargs))
        if with_grad and c_leaves:
            weights = _weights_for(seed + k)
            if _backward(expected, weights, "cpu"):
                assert _backward(actual, weights, XLA), f"{what}: xla output does not require grad"
                for i, (c, x) in enumerate(zip(c_leaves, x_leaves)):
                    if c.grad is None:
                        assert x.grad is None, f"{what}: grad {i} should be None"
                    else:
                        assert x.grad is not None, f"{what}: grad {i} missing on xla"
                        _compare(x.grad, c.grad, *GRAD_TOLS, f"{what}: grad of input {i}")

        after = _aten_counters()
        grown = {n for n, v in after.items() if v > before.get(n, 0)}
        assert not grown & main, f"{what}: ran on the CPU fallback: {sorted(grown & main)}"
        for n in grown:
            OTHER_FALLBACKS[n].add(request.node.callspec.id)


# ------------------------------------------------------------------------------- random ops
def test_random_ops():
    """Random rows cannot be compared with eager: check shape, dtype and range only."""
    torch.manual_seed(0)
    x = torch.empty(64, 32, device=XLA)
    u = x.uniform_(-2.0, 3.0).cpu()
    assert u.shape == (64, 32) and u.dtype == torch.float32
    assert u.min() >= -2.0 and u.max() < 3.0 and u.std() > 0.5
    n = torch.empty(64, 32, device=XLA).normal_(1.0, 2.0).cpu()
    assert abs(n.mean().item() - 1.0) < 0.3 and 1.6 < n.std().item() < 2.4
    r = torch.empty(4096, dtype=torch.int64, device=XLA).random_(3, 9).cpu()
    assert r.dtype == torch.int64 and r.min() == 3 and r.max() == 8
    r = torch.empty(4096, dtype=torch.int64, device=XLA).random_(5).cpu()
    assert r.min() == 0 and r.max() == 4
    b = torch.empty(4096, device=XLA).bernoulli_(0.25).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and 0.2 < b.mean().item() < 0.3
    s = torch.empty_strided((3, 4), (4, 1), device=XLA)
    assert s.shape == (3, 4)
    # native_dropout / native_dropout_backward (train mode) via nn.functional.dropout.
    a = torch.ones(4096, device=XLA, requires_grad=True)
    y = torch.nn.functional.dropout(a, p=0.5, training=True)
    y.sum().backward()
    yc, gc = y.detach().cpu(), a.grad.cpu()
    assert set(yc.unique().tolist()) <= {0.0, 2.0} and 0.4 < (yc > 0).float().mean().item() < 0.6
    torch.testing.assert_close(gc, yc)  # grad = mask * 1/(1-p) == y for x == 1


# ------------------------------------------------------------------------------- coverage
# Rows not exercised by the cases above, each with a reason.
EXEMPT: dict[str, str] = {}


def test_opinfo_mapping_is_valid():
    rows = set(torch_xla._C._lowered_ops())
    for key, rs in OPINFO_ROWS.items():
        assert key in _OPS, f"no OpInfo {key}"
        assert set(rs) <= rows, f"{key}: not rows: {set(rs) - rows}"
    assert set(EXEMPT) <= rows, f"EXEMPT lists non-rows: {set(EXEMPT) - rows}"


def test_zz_coverage():
    rows = torch_xla._C._lowered_ops()
    missing = [r for r in rows if not (met.counter_value(f"xla::{_base(r)}") or 0) and r not in EXEMPT]
    assert not missing, f"rows neither exercised nor EXEMPT: {missing}"
