"""Differential tests of the op table against eager CPU PyTorch, driven by PyTorch's OpInfo database.

One pytest case per (OpInfo, dtype); ``OPINFO_ROWS`` maps each OpInfo to the rows it exercises.
  * samples: ``op.sample_inputs("cpu", dtype, requires_grad=<float32 and op supports autograd>)``
    under a seed derived from the case id. Rule: of that list at most ``MAX_SAMPLES`` (4) are used,
    evenly spaced from first to last (so later samples with other kwargs are not always cut off),
    plus the few hand-written ``EXTRA_SAMPLES`` for overloads the picks never reach.
  * each sample runs on CPU and on ``xla`` (every tensor in input/args/kwargs moved with
    ``.to("xla")``, kept a leaf with the same ``requires_grad``; ``device=`` kwargs become xla);
    outputs are compared with ``torch.testing.assert_close`` (values, dtypes, shapes; NaNs equal;
    strides ignored) at tolerances picked by the compared tensor's dtype (``TOLS``).
  * float32 differentiable ops also compare gradients: backward of ``sum(out * w)`` over every
    floating output, ``w`` a fixed random weight, then every input's ``.grad``.
  * float32 cases also compare the in-place variant (``op_``, served by the same row) on the first
    sample the CPU accepts.
  * dtypes: float32 always (when the OpInfo supports it), plus bfloat16 / int64 / bool where
    ``op.supported_dtypes("cpu")`` has them, except for ``NO_EXTRA_DTYPES``.
  * fallbacks: a case fails if the CPU fallback ran for one of its own rows' aten names
    (counter ``aten::<row base name>`` grew, i.e. an unlowered sibling overload); any other fallback
    is recorded and printed in a summary when the module ends (run with ``-s`` to see it).
  * a case also fails unless at least one of its own rows ran (counter ``xla::<row base name>``
    grew; rows in ``EXEMPT`` aside).
``test_random_ops`` checks random rows (shape/dtype/range only), ``test_direct_rows`` calls rows no
OpInfo reaches, ``test_row_keeps_autograd`` flags rows that shadow CompositeImplicitAutograd ops, and ``test_zz_coverage`` (last) checks that every row of
``torch_xla._C._lowered_ops()`` was exercised (its ``xla::<base>`` counter > 0) or is in ``EXEMPT``.
"""

from __future__ import annotations

import collections
import zlib

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
import torch_xla
import torch_xla.debug.metrics as met
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import SampleInput

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
    ("lerp", ""): ("lerp.Scalar", "lerp.Tensor"),
    ("addcmul", ""): ("addcmul",),
    ("addcdiv", ""): ("addcdiv",),
    ("where", ""): ("where.self",),
    ("masked_fill", ""): ("masked_fill.Scalar", "masked_fill.Tensor"),
    ("clamp", ""): ("clamp", "clamp.Tensor"),
    ("clamp_min", ""): ("clamp_min", "clamp_min.Tensor"),
    ("clamp_max", ""): ("clamp_max", "clamp_max.Tensor"),
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
    ("nn.functional.silu", ""): ("silu",),
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
    ("reshape", ""): ("view_copy",),
    ("flatten", ""): ("view_copy",),
    ("permute", ""): ("permute_copy",),
    ("permute_copy", ""): ("permute_copy",),
    ("transpose", ""): ("transpose_copy.int",),
    ("transpose_copy", ""): ("transpose_copy.int",),
    ("t", ""): ("t_copy",),
    ("t_copy", ""): ("t_copy",),
    ("expand", ""): ("expand_copy",),
    ("expand_copy", ""): ("expand_copy",),
    ("narrow", ""): ("slice_copy.Tensor", "slice_backward"),
    ("slice", ""): ("slice_copy.Tensor", "slice_backward"),
    ("__getitem__", ""): ("slice_copy.Tensor", "select_copy.int", "slice_backward", "index.Tensor", "_index_put_impl"),
    ("select", ""): ("select_copy.int", "select_backward"),
    ("diagonal", ""): ("diagonal_copy", "diagonal_scatter"),
    ("diagonal_copy", ""): ("diagonal_copy",),
    ("squeeze", ""): ("squeeze_copy", "squeeze_copy.dim"),
    ("squeeze", "multiple"): ("squeeze_copy.dims",),
    ("squeeze_copy", ""): ("squeeze_copy", "squeeze_copy.dim"),
    ("unsqueeze", ""): ("unsqueeze_copy",),
    ("unsqueeze_copy", ""): ("unsqueeze_copy",),
    ("unfold", ""): ("unfold_copy",),
    ("unfold_copy", ""): ("unfold_copy",),
    ("angle", ""): ("angle",),
    ("nonzero_static", ""): ("nonzero_static",),
    ("logcumsumexp", ""): ("_logcumsumexp",),
    ("isin", ""): ("isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor"),
    ("cdist", ""): ("_cdist_forward", "_cdist_backward"),
    ("nn.functional.pdist", ""): ("_pdist_forward", "_pdist_backward"),
    ("nn.functional.unfold", ""): ("im2col",),
    ("alias_copy", ""): ("alias_copy",),
    ("clone", ""): ("clone",),
    ("select_scatter", ""): ("select_scatter",),
    ("slice_scatter", ""): ("slice_scatter",),
    # as_strided reads the storage of the view's base (functionalization), as_strided_copy; its
    # backward writes through an as_strided view of zeros, as_strided_scatter (rows_as_strided.cc).
    # Not "partial_views": its samples are views into larger storages, which moving them copies away.
    ("as_strided", ""): ("as_strided_copy", "as_strided_scatter"),
    ("as_strided_copy", ""): ("as_strided_copy",),
    ("as_strided_scatter", ""): ("as_strided_scatter",),
    ("diagonal_scatter", ""): ("diagonal_scatter",),
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
    ("full_like", ""): ("empty_strided", "fill.Scalar"),
    ("new_full", ""): ("empty.memory_format", "fill.Scalar"),
    ("zeros", ""): ("empty.memory_format", "zero"),
    ("fill", ""): ("fill.Scalar", "fill.Tensor"),
    ("zero_", ""): ("zero",),
    ("empty", ""): ("empty.memory_format",),
    # ---- indexing, sorting, more elementwise/reductions (rows_index.cc)
    ("bitwise_and", ""): ("bitwise_and.Tensor", "bitwise_and.Scalar"),
    ("bitwise_or", ""): ("bitwise_or.Tensor", "bitwise_or.Scalar"),
    ("bitwise_xor", ""): ("bitwise_xor.Tensor", "bitwise_xor.Scalar"),
    ("logical_xor", ""): ("logical_xor",),
    ("fmod", ""): ("fmod.Tensor", "fmod.Scalar"),
    ("remainder", ""): ("remainder.Tensor", "remainder.Scalar"),
    ("isnan", ""): ("isnan",),
    ("isinf", ""): ("isinf",),
    ("isneginf", ""): ("isneginf",),
    ("isposinf", ""): ("isposinf",),
    ("nan_to_num", ""): ("nan_to_num",),
    ("log2", ""): ("log2",),
    ("nn.functional.hardtanh", ""): ("hardtanh",),
    ("nn.functional.leaky_relu", ""): ("leaky_relu",),
    ("all", ""): ("all", "all.dim"),
    ("any", ""): ("any", "any.dim"),
    ("prod", ""): ("prod", "prod.dim_int"),
    ("std", ""): ("std.correction",),
    ("var", ""): ("var.correction",),
    ("linalg.vector_norm", ""): ("linalg_vector_norm",),
    ("norm", ""): ("norm.Scalar", "norm.ScalarOpt_dim", "norm.ScalarOpt_dim_dtype", "linalg_vector_norm"),
    ("norm", "inf"): ("norm.Scalar", "norm.ScalarOpt_dim", "linalg_vector_norm"),
    ("sort", ""): ("sort", "sort.stable"),
    ("topk", ""): ("topk",),
    ("median", ""): ("median", "median.dim"),
    ("nanmedian", ""): ("nanmedian", "nanmedian.dim"),
    ("erfinv", ""): ("erfinv",),
    ("nn.functional.mish", ""): ("mish",),
    ("nn.functional.glu", ""): ("glu",),
    ("nn.functional.binary_cross_entropy", ""): ("binary_cross_entropy", "binary_cross_entropy_backward"),
    ("nn.functional.smooth_l1_loss", ""): ("smooth_l1_loss",),
    ("take", ""): ("take",),
    ("count_nonzero", ""): ("count_nonzero.dim_IntList",),
    ("index_fill", ""): ("index_fill.int_Scalar", "index_fill.int_Tensor"),
    ("kthvalue", ""): ("kthvalue",),
    ("floor_divide", ""): ("floor_divide",),
    ("vdot", ""): ("vdot",),
    ("linalg.cross", ""): ("linalg_cross",),
    # ---- rows_math.cc (ops the OpInfo fallback survey found on the CPU: scripts/opinfo_fallbacks.py)
    ("asin", ""): ("asin",),
    ("acos", ""): ("acos",),
    ("atan", ""): ("atan",),
    ("sinh", ""): ("sinh",),
    ("cosh", ""): ("cosh",),
    ("asinh", ""): ("asinh",),
    ("acosh", ""): ("acosh",),
    ("atanh", ""): ("atanh",),
    ("atan2", ""): ("atan2",),
    ("log10", ""): ("log10",),
    ("exp2", ""): ("exp2",),
    ("trunc", ""): ("trunc",),
    ("frac", ""): ("frac",),
    ("sgn", ""): ("sgn",),
    ("fmax", ""): ("fmax",),
    ("fmin", ""): ("fmin",),
    ("hypot", ""): ("hypot",),
    ("logaddexp", ""): ("logaddexp",),
    ("logaddexp2", ""): ("logaddexp2",),
    ("xlogy", ""): ("xlogy.Tensor",),
    ("nn.functional.hardsigmoid", ""): ("hardsigmoid",),
    ("nn.functional.hardswish", ""): ("hardswish",),
    ("nn.functional.hardshrink", ""): ("hardshrink",),
    ("nn.functional.softshrink", ""): ("softshrink",),
    ("nn.functional.elu", ""): ("elu",),
    ("logit", ""): ("logit",),
    ("nn.functional.logsigmoid", ""): ("log_sigmoid_forward", "log_sigmoid_backward"),
    ("nn.functional.threshold", ""): ("threshold",),
    ("round", "decimals_3"): ("round.decimals",),
    ("round", "decimals_neg_3"): ("round.decimals",),
    ("trace", ""): ("trace",),
    ("eye", ""): ("eye", "eye.m"),
    ("nansum", ""): ("nansum",),
    ("cumprod", ""): ("cumprod",),
    ("var_mean", ""): ("var_mean.correction",),
    ("std_mean", ""): ("std_mean.correction",),
    ("gather", ""): ("gather",),
    ("scatter", ""): ("scatter.src", "scatter.value"),
    ("scatter_add", ""): ("scatter_add",),
    ("index_put", ""): ("index_put",),
    ("roll", ""): ("roll",),
    ("repeat", ""): ("repeat",),
    ("tril", ""): ("tril",),
    ("triu", ""): ("triu",),
    ("linspace", ""): ("linspace",),
    # ---- convolution, pooling, normalization, padding, resampling (rows_conv.cc)
    ("nn.functional.conv1d", ""): ("convolution", "convolution_backward"),
    ("nn.functional.conv2d", ""): ("convolution", "convolution_backward"),
    ("nn.functional.conv_transpose2d", ""): ("convolution", "convolution_backward"),
    ("nn.functional.max_pool2d", ""): ("max_pool2d_with_indices", "max_pool2d_with_indices_backward"),
    ("nn.functional.avg_pool2d", ""): ("avg_pool2d", "avg_pool2d_backward"),
    ("nn.functional.adaptive_avg_pool2d", ""): ("_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward"),
    ("nn.functional.batch_norm", ""): ("native_batch_norm", "native_batch_norm_backward"),
    ("native_batch_norm", ""): ("native_batch_norm", "native_batch_norm_backward"),
    ("_native_batch_norm_legit", ""): ("_native_batch_norm_legit_functional", "_native_batch_norm_legit.no_stats"),
    ("_batch_norm_with_update", ""): ("_batch_norm_with_update_functional", "batch_norm_backward"),
    ("nn.functional.pad", "constant"): ("constant_pad_nd",),
    ("nn.functional.pad", "reflect"): ("reflection_pad1d", "reflection_pad2d", "reflection_pad3d"),
    ("nn.functional.pad", "replicate"): ("replication_pad1d", "replication_pad2d", "replication_pad3d"),
    ("nn.functional.interpolate", "nearest"): ("upsample_nearest2d", "upsample_nearest2d_backward", "upsample_nearest1d",
                                               "upsample_nearest1d_backward"),
    ("nn.functional.interpolate", "nearest-exact"): ("_upsample_nearest_exact2d", "_upsample_nearest_exact2d_backward",
                                                     "_upsample_nearest_exact1d", "_upsample_nearest_exact1d_backward"),
    # ---- issue #8: ops upstream lowers
    ("nn.functional.mse_loss", ""): ("mse_loss", "mse_loss_backward"),
    ("nn.functional.softplus", ""): ("softplus", "softplus_backward"),
    ("logsumexp", ""): ("logsumexp",),
    ("baddbmm", ""): ("baddbmm",),
    ("addmv", ""): ("addmv",),
    ("index_add", ""): ("index_add",),
    ("bitwise_left_shift", ""): ("bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar"),
    ("bitwise_right_shift", ""): ("bitwise_right_shift.Tensor", "bitwise_right_shift.Tensor_Scalar"),
    ("nn.functional.interpolate", "bilinear"): ("upsample_bilinear2d", "upsample_bilinear2d_backward"),
    # ---- issue #8, op-lowering remainder: rows_special.cc
    ("lgamma", ""): ("lgamma",),
    ("digamma", ""): ("digamma",),
    ("mvlgamma", "mvlgamma_p_1"): ("lgamma",),
    ("mvlgamma", "mvlgamma_p_3"): ("lgamma",),
    ("erfc", ""): ("erfc",),
    ("signbit", ""): ("signbit",),
    ("copysign", ""): ("copysign.Tensor",),
    ("heaviside", ""): ("heaviside",),
    ("sinc", ""): ("sinc",),
    ("special.entr", ""): ("special_entr",),
    ("special.xlog1py", ""): ("special_xlog1py",),
    ("nextafter", ""): ("nextafter",),
    ("gcd", ""): ("gcd",),
    ("lcm", ""): ("lcm",),
    # rows_index.cc / rows_extra.cc / rows_reduce.cc
    ("scatter_reduce", "sum"): ("scatter_reduce.two",),
    ("scatter_reduce", "prod"): ("scatter_reduce.two",),
    ("scatter_reduce", "mean"): ("scatter_reduce.two",),
    ("scatter_reduce", "amax"): ("scatter_reduce.two",),
    ("scatter_reduce", "amin"): ("scatter_reduce.two",),
    ("index_reduce", "prod"): ("index_reduce",),
    ("index_reduce", "mean"): ("index_reduce",),
    ("index_reduce", "amax"): ("index_reduce",),
    ("index_reduce", "amin"): ("index_reduce",),
    ("index_copy", ""): ("index_copy",),
    ("put", ""): ("put",),
    ("masked_scatter", ""): ("masked_scatter",),
    ("renorm", ""): ("renorm",),
    ("cummax", ""): ("cummax",),
    ("cummin", ""): ("cummin",),
    ("aminmax", ""): ("aminmax",),
    ("diag_embed", ""): ("diag_embed",),
    ("nn.functional.huber_loss", ""): ("huber_loss", "huber_loss_backward"),
    ("nn.functional.pixel_shuffle", ""): ("pixel_shuffle",),
    ("nn.functional.pixel_unshuffle", ""): ("pixel_unshuffle",),
    ("nn.functional.channel_shuffle", ""): ("channel_shuffle",),
    ("addbmm", ""): ("addbmm",),
    # pooling and resampling in 1-d/3-d (rows_conv.cc, rows_index.cc)
    ("nn.functional.max_pool3d", ""): ("max_pool3d_with_indices", "max_pool3d_with_indices_backward"),
    ("nn.functional.avg_pool3d", ""): ("avg_pool3d", "avg_pool3d_backward"),
    ("nn.functional.adaptive_avg_pool3d", ""): ("_adaptive_avg_pool3d", "_adaptive_avg_pool3d_backward"),
    ("nn.functional.adaptive_max_pool2d", ""): ("adaptive_max_pool2d", "adaptive_max_pool2d_backward"),
    ("nn.functional.interpolate", "linear"): ("upsample_linear1d", "upsample_linear1d_backward"),
    ("nn.functional.interpolate", "trilinear"): ("upsample_trilinear3d", "upsample_trilinear3d_backward"),
    ("nn.functional.interpolate", "bicubic"): ("upsample_bicubic2d", "upsample_bicubic2d_backward"),
    ("nn.functional.group_norm", ""): ("native_group_norm_backward",),
    ("frexp", ""): ("frexp.Tensor",),
    ("grid_sampler_2d", ""): ("grid_sampler_2d", "grid_sampler_2d_backward"),
    ("nn.functional.prelu", ""): ("_prelu_kernel", "_prelu_kernel_backward"),
    ("narrow_copy", ""): ("narrow_copy",),
    ("nn.functional.grid_sample", ""): ("grid_sampler_2d", "grid_sampler_2d_backward"),
    ("bucketize", ""): ("bucketize.Tensor",),
    ("searchsorted", ""): ("searchsorted.Tensor", "searchsorted.Scalar"),
    ("nn.functional.max_unpool2d", ""): ("max_unpool2d",),
    ("nn.functional.max_unpool2d", "grad"): ("max_unpool2d",),
    ("nn.functional.max_unpool3d", ""): ("max_unpool3d",),
    ("nn.functional.max_unpool3d", "grad"): ("max_unpool3d",),
    # ---- rows_linalg.cc (stablehlo.cholesky / stablehlo.triangular_solve)
    ("linalg.cholesky", ""): ("linalg_cholesky_ex",),
    ("linalg.cholesky_ex", ""): ("linalg_cholesky_ex",),
    ("linalg.solve_triangular", ""): ("linalg_solve_triangular",),
    ("triangular_solve", ""): ("triangular_solve",),
    ("cholesky_solve", ""): ("_cholesky_solve_helper",),
    ("cholesky_inverse", ""): ("cholesky_inverse",),
    ("linalg.lu_factor", ""): ("linalg_lu_factor_ex",),
    ("linalg.lu_factor_ex", ""): ("linalg_lu_factor_ex",),
    ("linalg.inv", ""): ("linalg_inv_ex",),
    ("linalg.inv_ex", ""): ("linalg_inv_ex",),
    ("linalg.det", ""): ("_linalg_det",),
    ("linalg.slogdet", ""): ("_linalg_slogdet",),
    ("logdet", ""): ("_linalg_slogdet",),
    ("linalg.solve", ""): ("_linalg_solve_ex",),
    ("linalg.solve_ex", ""): ("_linalg_solve_ex",),
    ("linalg.lu_solve", ""): ("linalg_lu_solve",),
    ("linalg.qr", ""): ("linalg_qr",),
    # eigenvalues / singular values and what torch builds on them (vectors: tests/test_eigh_svd.py,
    # their signs are the solver's)
    ("linalg.eigvalsh", ""): ("_linalg_eigh",),
    ("linalg.svdvals", ""): ("_linalg_svd",),
    ("linalg.pinv", ""): ("linalg_pinv.atol_rtol_tensor",),
    ("linalg.pinv", "hermitian"): ("linalg_pinv.atol_rtol_tensor",),
    ("linalg.matrix_rank", ""): ("_linalg_svd",),
    ("linalg.matrix_rank", "hermitian"): ("_linalg_eigh",),
    ("linalg.cond", ""): ("_linalg_svd",),
    ("linalg.matrix_norm", ""): ("_linalg_svd", "linalg_vector_norm"),
    # ---- rows_bessel.cc
    ("i0", ""): ("i0",),
    ("special.i0e", ""): ("special_i0e",),
    ("special.i1", ""): ("special_i1",),
    ("special.i1e", ""): ("special_i1e",),
    # ---- rows_histc.cc
    ("histc", ""): ("histc",),
}

# Ops whose output values are unspecified: compare shape and dtype only.
SHAPE_ONLY = {"empty"}
# (values, indices) ops where the order of tied elements is unspecified (topk; sort unless stable=True):
# values must match, and xla's indices must point at those values (input.gather(dim, indices)).
TIE_ORDER_OPS = {"sort": 0, "topk": 1, "kthvalue": 1}  # name -> position of dim in args

# OpInfos tested in float32 only (extra dtypes add compile time without exercising anything new:
# pure data movement, or dtype-generic lowering already covered by a sibling case).
NO_EXTRA_DTYPES = {
    "view", "view_copy", "reshape", "flatten", "permute_copy", "transpose_copy", "t", "t_copy",
    "expand_copy", "narrow", "diagonal", "diagonal_copy", "squeeze_copy", "unsqueeze_copy", "alias_copy", "split_with_sizes",
    "split_with_sizes_copy", "chunk", "true_divide", "addmm", "dot", "nn.functional.linear", "full_like",
    "new_full", "zeros", "empty",
    "nn.functional.group_norm",  # its row is the backward, run for float32 (gradients) only
    "grid_sampler_2d", "nn.functional.grid_sample",  # rows for float32/float64 only (see SAMPLE_FILTER)
}
EXTRA_DTYPES = (torch.bfloat16, torch.int64, torch.bool)

# Tolerances (rtol, atol), chosen by the dtype of each compared tensor (output or grad).
# float32: XLA:CPU evaluates transcendental functions with its own polynomial approximations and may
# reassociate reductions/dots, a few ulp off eager (1 ulp ~ 6e-8), so 1e-5 leaves headroom without
# hiding real bugs. bfloat16 (1 ulp ~ 7.8e-3 relative): eager computes in float32 and rounds once per
# op, as the rows do, but XLA:CPU may still fuse/reassociate; allow ~2 ulp. float64 appears only via
# dtype= kwargs (softmax with_dtype): torch's defaults. Integers and bools must match exactly.
TOLS = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2), torch.float64: (1e-7, 1e-7)}
# Gradients go through several ops (and reductions against random weights): a bit more atol.
GRAD_TOLS = {torch.float32: (1e-5, 2e-5)}
# (OpInfo name, "out" | "grad") -> (rtol, atol), each with a reason.
TOL_OVERRIDES: dict[tuple[str, str], tuple[float, float]] = {
    # A sample normalizes over a single element: x - mean is rounding noise, amplified by
    # rstd = 1/sqrt(eps) ~ 316; eager's input grad is ~3e-5 of noise where XLA gets exactly 0.
    ("nn.functional.layer_norm", "grad"): (1e-5, 1e-4),
}


# Hand-written samples appended to the OpInfo ones, for rows the picked OpInfo samples never reach
# (OpInfo clamp_min/clamp_max pass tensor bounds only; the Scalar overloads are separate rows).
def _extra_clamp(dtype):
    if dtype == torch.bool:  # eager: "clamp_min_scalar_cpu" not implemented for 'Bool'
        return []
    x = torch.linspace(-3, 3, 12).reshape(3, 4).to(dtype)
    return [SampleInput(x, args=(1 if dtype == torch.int64 else 0.5,))]


def _extra_getitem(dtype):  # the evenly spaced OpInfo picks are all advanced indexing
    x = torch.linspace(-3, 3, 60).reshape(3, 4, 5).to(dtype)
    if dtype == torch.float32:
        x.requires_grad_(True)
    return [SampleInput(x, args=((slice(1, 3), 2, slice(0, 5, 2)),))]


def _extra_pad3d(mode):
    def samples(dtype):  # the OpInfo picks stop at 2-d padding
        x = torch.linspace(-3, 3, 120).reshape(1, 2, 3, 4, 5).to(dtype)
        if dtype == torch.float32:
            x.requires_grad_(True)
        return [SampleInput(x, args=((1, 1, 2, 0, 1, 1), mode))]

    return samples


def _extra_where(dtype):  # where(cond, x, scalar): aten where.ScalarOther (composite, -> where.self)
    x = torch.linspace(-3, 3, 12).reshape(3, 4).to(dtype)
    if dtype == torch.float32:
        x.requires_grad_(True)
    return [SampleInput(x, args=(x.detach() > 0, 0))]


# Samples a row leaves on the CPU fallback by design (correct there), skipped: key -> predicate.
def _grid_sample_lowered(sample):  # bilinear/nearest with zeros/border padding (no bicubic, no reflection)
    if len(sample.args) >= 4:  # aten.grid_sampler_2d(input, grid, mode, padding, align_corners)
        return sample.args[1] in (0, 1) and sample.args[2] in (0, 1)
    kw = sample.kwargs
    return kw.get("mode", "bilinear") in ("bilinear", "nearest") and kw.get("padding_mode", "zeros") in ("zeros", "border")


SAMPLE_FILTER = {
    ("grid_sampler_2d", ""): _grid_sample_lowered,
    ("nn.functional.grid_sample", ""): _grid_sample_lowered,
}

EXTRA_SAMPLES = {
    ("where", ""): _extra_where,
    ("clamp_min", ""): _extra_clamp,
    ("clamp_max", ""): _extra_clamp,
    ("__getitem__", ""): _extra_getitem,
    ("nn.functional.pad", "reflect"): _extra_pad3d("reflect"),
    ("nn.functional.pad", "replicate"): _extra_pad3d("replicate"),
}

# Known failures in code this suite does not own (bridge/graph/lowering, and rows_index.cc /
# rows_conv.cc, which were being written while this suite was): (name, variant, dtype) -> reason.
_F32, _BF16, _I64, _BOOL = torch.float32, torch.bfloat16, torch.int64, torch.bool
XFAILS: dict[tuple[str, str, torch.dtype], str] = {
    **{("index_put", "", d): "index_put with a boolean-mask index runs on the CPU fallback (aten::index_put): "
                             "the row hands value-dependent (mask) indices to the fallback instead of lowering "
                             "them (e.g. as a where() for a broadcastable value)" for d in (_F32, _BF16, _I64, _BOOL)},
    **{("index_reduce", r, _BF16): "bfloat16/float16 index_reduce prod/mean: eager rounds after every step "
                                   "(tests/test_never_wrong.py); the row leaves them to the CPU fallback" for r in ("prod", "mean")},
}


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
INPLACE_CHECKED: list[str] = []  # case ids whose in-place variant was compared


@pytest.fixture(autouse=True, scope="module")
def _fallback_summary():
    yield
    print(f"\n[test_ops_opinfo] in-place variants compared: {len(INPLACE_CHECKED)}")
    if OTHER_FALLBACKS:
        print("\n[test_ops_opinfo] CPU fallbacks seen (not failures; ops outside the table):")
        for name in sorted(OTHER_FALLBACKS):
            cases = sorted(OTHER_FALLBACKS[name])
            more = f" (+{len(cases) - 6} more)" if len(cases) > 6 else ""
            print(f"  {name}: {', '.join(cases[:6])}{more}")


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


def _tol(op, dtype, kind):
    return TOL_OVERRIDES.get((op.name, kind)) or (GRAD_TOLS if kind == "grad" else TOLS).get(dtype) \
        or TOLS.get(dtype, (0.0, 0.0))


def _compare_ties(op, sample, actual, expected, what):
    args, kwargs = sample.args, sample.kwargs
    pos = TIE_ORDER_OPS[op.name]
    dim = kwargs.get("dim", args[pos] if len(args) > pos else -1)
    values, indices = _to_cpu(actual)
    _compare(op, values, expected[0], f"{what} (values)")
    assert indices.dtype == expected[1].dtype and indices.shape == expected[1].shape, f"{what}: indices"
    inp = sample.input.detach()
    if inp.dim() > 0:
        want = expected[0]
        if indices.dim() < inp.dim():  # a reduced dim (kthvalue, keepdim=False)
            indices, want = indices.unsqueeze(dim), want.unsqueeze(dim)
        torch.testing.assert_close(inp.gather(dim, indices), want, rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m: f"{what}: xla indices do not point at the values: {m}")


def _compare(op, actual, expected, what, kind="out"):
    a, e = pytree.tree_leaves(_to_cpu(actual)), pytree.tree_leaves(expected)
    assert len(a) == len(e), f"{what}: {len(a)} outputs, expected {len(e)}"
    for i, (x, y) in enumerate(zip(a, e)):
        where = f"{what}: {kind} {i}"
        if not isinstance(y, torch.Tensor):
            assert x == y, where
        elif op.name in SHAPE_ONLY:
            assert (x.shape, x.dtype) == (y.shape, y.dtype), where
        else:
            rtol, atol = _tol(op, y.dtype, kind)
            torch.testing.assert_close(x, y, rtol=rtol, atol=atol, equal_nan=True, check_stride=False,
                                       msg=lambda m, w=where: f"{w}: {m}")


def _describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"T{list(x.shape)}:{str(x.dtype).removeprefix('torch.')}"
        return repr(x)

    inp, args, kwargs = pytree.tree_map(d, (sample.input, sample.args, dict(sample.kwargs)))
    return f"input={inp} args={args} kwargs={kwargs}"


# ------------------------------------------------------------------------------- the cases
def _check_inplace(op, sample, what):
    """float32 only, first sample the CPU accepts: the in-place variant (served by the same row)."""
    c_inp, c_args, c_kwargs = pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t,
                                              (sample.input, sample.args, dict(sample.kwargs)))
    x_inp, x_args, x_kwargs = pytree.tree_map(lambda t: t.detach().to(XLA) if isinstance(t, torch.Tensor) else t,
                                              (c_inp, c_args, c_kwargs))
    try:
        expected = op.inplace_variant(c_inp, *c_args, **c_kwargs)
    except (RuntimeError, TypeError):  # e.g. the result would broadcast or change dtype
        return False
    actual = op.inplace_variant(x_inp, *x_args, **x_kwargs)
    _compare(op, (actual, x_inp), (expected, c_inp), f"{what} (in-place)")
    return True


@pytest.mark.parametrize("key,dtype", _cases())
def test_op(key, dtype, request):
    op = _OPS[key]
    main = {f"aten::{_base(r)}" for r in OPINFO_ROWS[key]}
    seed = zlib.crc32(request.node.callspec.id.encode())
    torch.manual_seed(seed)
    with_grad = dtype == torch.float32 and op.supports_autograd
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=with_grad))
    if key in SAMPLE_FILTER:
        samples = [s for s in samples if SAMPLE_FILTER[key](s)]
    samples = _pick(samples)
    if key in EXTRA_SAMPLES:
        samples += EXTRA_SAMPLES[key](dtype)
    assert samples, "no samples"
    inplace_done = dtype != torch.float32 or op.inplace_variant is None
    own = {f"xla::{_base(r)}" for r in OPINFO_ROWS[key] if r not in EXEMPT}  # must run (counter grows)
    own_before = {n: met.counter_value(n) or 0 for n in own}
    for k, sample in enumerate(samples):
        what = f"sample {k}: {_describe(sample)}"
        before = _aten_counters()
        x_inp, x_args, x_kwargs = _move(sample, XLA)
        c_inp, c_args, c_kwargs = _move(sample, "cpu")

        expected = op(c_inp, *c_args, **c_kwargs)
        try:
            actual = op(x_inp, *x_args, **x_kwargs)
        except Exception as e:
            raise AssertionError(f"{what}: xla raised {type(e).__name__}: {e}") from e
        if op.name in TIE_ORDER_OPS and not sample.kwargs.get("stable", False):
            _compare_ties(op, sample, actual, expected, what)
        else:
            _compare(op, actual, expected, what)

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
                        _compare(op, x.grad, c.grad, f"{what}: input {i}", kind="grad")
        if not inplace_done and _check_inplace(op, sample, what):
            inplace_done = True
            INPLACE_CHECKED.append(request.node.callspec.id)

        after = _aten_counters()
        grown = {n for n, v in after.items() if v > before.get(n, 0)}
        assert not grown & main, f"{what}: ran on the CPU fallback: {sorted(grown & main)}"
        for n in grown:
            OTHER_FALLBACKS[n].add(request.node.callspec.id)
    fired = {n for n in own if (met.counter_value(n) or 0) > own_before[n]}
    assert fired or not own, f"none of the case's rows ran (counters {sorted(own)} did not grow)"


def test_direct_rows():
    """Rows that no OpInfo reaches through the public API, called as aten ops."""
    x = torch.arange(6.0)
    xx = x.to(XLA)
    torch.testing.assert_close(torch.ops.aten._reshape_alias(xx, [2, 3], [3, 1]).cpu(), x.reshape(2, 3))
    # _conj_copy: functionalization's copy of z.conj() (complex only in eager).
    z = torch.randn(5, dtype=torch.complex64)
    torch.testing.assert_close(torch.ops.aten._conj_copy(z.to(XLA)).cpu(), torch.ops.aten._conj_copy(z))
    torch.testing.assert_close(torch.conj_physical(z.to(XLA)).cpu(), torch.conj_physical(z))  # _conj_physical
    # nll_loss2d (F.nll_loss / cross_entropy of [N, C, H, W]): forward and backward, every reduction.
    inp, tgt, w = torch.randn(2, 5, 3, 4), torch.randint(0, 5, (2, 3, 4)), torch.rand(5)
    tgt[0, 0, 0] = -100
    for red in (0, 1, 2):
        ref = torch.ops.aten.nll_loss2d_forward(inp, tgt, w, red, -100)
        out = torch.ops.aten.nll_loss2d_forward(inp.to(XLA), tgt.to(XLA), w.to(XLA), red, -100)
        torch.testing.assert_close(_to_cpu(out), ref)
        g = torch.randn(ref[0].shape)
        ref = torch.ops.aten.nll_loss2d_backward(g, inp, tgt, w, red, -100, ref[1])
        out = torch.ops.aten.nll_loss2d_backward(g.to(XLA), inp.to(XLA), tgt.to(XLA), w.to(XLA), red, -100,
                                                 out[1])
        torch.testing.assert_close(out.cpu(), ref)
    # embedding_renorm_ (nn.Embedding(max_norm=...)): rows named (once or twice) and over the norm only.
    wt, ids = torch.randn(10, 4) * 2, torch.tensor([[1, 3], [3, 9]])
    for p in (2.0, 1.0, 3.0, float("inf")):
        ref = torch.embedding_renorm_(wt.clone(), ids, 1.5, p)
        out = torch.embedding_renorm_(wt.to(XLA), ids.to(XLA), 1.5, p)
        torch.testing.assert_close(out.cpu(), ref)
    # Index ops as torch's decompositions emit them (no bounds/negative-index checks in _unsafe_*).
    t = torch.arange(12.0).reshape(3, 4)
    i = torch.tensor([2, 0, 2])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for fn in (lambda a, j, w: torch.ops.aten._unsafe_index(a, [j]),
               lambda a, j, w: torch.ops.aten._unsafe_index_put(a, [j], w, True),
               lambda a, j, w: torch.ops.aten._index_put_impl_(a.clone(), [j], w, True, True)):
        torch.testing.assert_close(fn(t.to(XLA), i.to(XLA), v.to(XLA)).cpu(), fn(t, i, v))
    # Batch norm overloads only reached in eval mode / by compile-time decompositions.
    x = torch.randn(4, 3, 5)
    w, b, rm, rv = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    for fn in (lambda *a: torch.ops.aten._native_batch_norm_legit_no_training(*a, 0.1, 1e-5),
               lambda *a: torch.ops.aten._batch_norm_no_update(*a, 0.1, 1e-5)):
        out = fn(*(t.to(XLA) for t in (x, w, b, rm, rv)))
        torch.testing.assert_close(_to_cpu(out), fn(x, w, b, rm, rv), rtol=1e-5, atol=1e-5)
    # polygamma: its OpInfo samples mix orders, and n >= 2 stays on the CPU (tests/test_ops_remainder.py).
    y = torch.randn(4, 5) * 3
    for n in (0, 1):
        torch.testing.assert_close(torch.polygamma(n, y.to(XLA)).cpu(), torch.polygamma(n, y), rtol=1e-5, atol=1e-5)
    # The backend-overridable convolution entry points (the public API reaches the convolution rows).
    x, w, b = torch.randn(2, 4, 6, 5), torch.randn(6, 2, 3, 3), torch.randn(6)
    conv = (w.shape[0], [2, 1], [1, 0], [1, 2], False, [0, 0], 2)  # groups=2, stride, padding, dilation
    ref = torch.ops.aten.convolution(x, w, b, *conv[1:])
    out = torch.ops.aten.convolution_overrideable(x.to(XLA), w.to(XLA), b.to(XLA), *conv[1:])
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    g = torch.randn(ref.shape)
    ref = torch.ops.aten.convolution_backward(g, x, w, [conv[0]], *conv[1:], [True, True, True])
    out = torch.ops.aten.convolution_backward_overrideable(g.to(XLA), x.to(XLA), w.to(XLA), *conv[1:],
                                                           [True, True, True])
    torch.testing.assert_close(_to_cpu(out), ref, rtol=1e-5, atol=2e-5)
    # The fused attention rows (F.scaled_dot_product_attention, tests/test_attention.py) and ldexp.
    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))
    qx, kx, vx = (t.detach().to(XLA).requires_grad_() for t in (q, k, v))
    ref, out = F.scaled_dot_product_attention(q, k, v, is_causal=True), F.scaled_dot_product_attention(qx, kx, vx, is_causal=True)
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    ref.sum().backward()
    out.sum().backward()
    for c, x in ((q, qx), (k, kx), (v, vx)):
        torch.testing.assert_close(x.grad.cpu(), c.grad, rtol=1e-4, atol=1e-5)
    m, e = torch.randn(6), torch.randint(-4, 5, (6,))
    torch.testing.assert_close(torch.ldexp(m.to(XLA), e.to(XLA)).cpu(), torch.ldexp(m, e))
    # index_reduce checks its indices as eager does (no negative wrapping).
    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(IndexError, match="index out of range in self"):
            torch.ones(3, 2).to(XLA).index_reduce(0, torch.tensor(bad).to(XLA), torch.randn(2, 2).to(XLA), "amax").cpu()
    # logcumsumexp through infinities, NaN and a tiny start (eager's log-add-exp rules).
    inf = float("inf")
    vals = torch.tensor([[-1000., 0., 3., -inf, -inf, inf, 2., float("nan"), 1.], [-inf, -inf, -inf, 5., inf, inf, -inf, 1., 1e30]])
    for t in (torch.float32, torch.float64, torch.bfloat16):
        for dim in (0, 1):
            ref = torch.logcumsumexp(vals.to(t), dim)
            torch.testing.assert_close(torch.logcumsumexp(vals.to(t).to(XLA), dim).cpu(), ref, equal_nan=True)
    # isin with a scalar on either side; col2im (F.fold, im2col's gradient) with padding, stride, dilation.
    e, tst = torch.tensor([[1, 5, 3], [7, 3, 0]]), torch.tensor([3, 7, 9])
    for fn in (lambda a, b: torch.isin(a, 3), lambda a, b: torch.isin(3, b), lambda a, b: torch.isin(9.5, b),
               lambda a, b: torch.isin(a, 2.0, invert=True), lambda a, b: torch.isin(a, b, invert=True)):
        ref, out = fn(e, tst), fn(e.to(XLA), tst.to(XLA))
        assert out.dtype == ref.dtype and out.shape == ref.shape
        torch.testing.assert_close(out.cpu(), ref)
    for kw in ({"output_size": (4, 5), "kernel_size": (2, 3), "padding": (1, 1), "stride": (1, 2)},
               {"output_size": (5, 7), "kernel_size": (2, 3), "dilation": (2, 1), "stride": (2, 3), "padding": (1, 2)}):
        n_cols = F.unfold(torch.zeros(1, 1, *kw["output_size"]), **{k: v for k, v in kw.items() if k != "output_size"}).shape[-1]
        cols = torch.randn(2, 3 * 2 * 3, n_cols)
        ref = F.fold(cols, **kw)
        torch.testing.assert_close(F.fold(cols.to(XLA), **kw).cpu(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(F.fold(cols[0].to(XLA), **kw).cpu(), F.fold(cols[0], **kw), rtol=1e-5, atol=1e-5)


# Rows for CompositeImplicitAutograd ops take the op away from autograd's decomposition: unless the
# op is not differentiable, gradients silently vanish. Allowed ones, with the reason:
_CIA = ("row {} shadows a CompositeImplicitAutograd op: autograd sees no formula and the input grad "
        "is None")
CIA_OK = {
    # an AutogradXLA kernel (csrc/bridge/autograd_xla_overrides.cc) runs torch's decomposition whenever
    # a gradient of silu_backward itself is wanted (test_silu_double_backward_as_eager); mish_backward too
    "silu_backward", "mish_backward",
}


def _cia_rows():
    return [row for row in torch_xla._C._lowered_ops()
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{row}", "CompositeImplicitAutograd")]


@pytest.mark.parametrize("row", _cia_rows())
def test_row_keeps_autograd(row):
    assert row in CIA_OK, _CIA.format(row)


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
    b = torch.empty(4096, device=XLA).bernoulli_(0.25).cpu()  # functionalized: bernoulli.p
    assert set(b.unique().tolist()) <= {0.0, 1.0} and 0.2 < b.mean().item() < 0.3
    b = torch.bernoulli(torch.full((4096,), 0.75, device=XLA)).cpu()  # bernoulli
    assert b.dtype == torch.float32 and set(b.unique().tolist()) <= {0.0, 1.0} and 0.7 < b.mean().item() < 0.8
    p = torch.tensor([0.0, 1.0], device=XLA).repeat(2048)
    b = torch.empty(4096, device=XLA).bernoulli_(p).cpu()  # functionalized: bernoulli.Tensor
    torch.testing.assert_close(b, p.cpu())  # p in {0, 1}: the draw is determined
    s = torch.empty_strided((3, 4), (4, 1), device=XLA)
    assert s.shape == (3, 4)
    # native_dropout / native_dropout_backward (train mode). F.dropout only takes the fused
    # native_dropout path on CUDA-like devices, so call it directly.
    a = torch.ones(4096, device=XLA, requires_grad=True)
    y, mask = torch.native_dropout(a, 0.5, True)
    y.sum().backward()
    yc, mc, gc = y.detach().cpu(), mask.cpu(), a.grad.cpu()
    assert mc.dtype == torch.bool and 0.4 < mc.float().mean().item() < 0.6
    torch.testing.assert_close(yc, mc.float() * 2)
    torch.testing.assert_close(gc, yc)  # grad = mask * 1/(1-p) == y for x == 1
    # F.dropout on xla: bernoulli_ + mul (not a row of its own, but must agree with its mask).
    y = torch.nn.functional.dropout(torch.ones(4096, device=XLA), p=0.5, training=True).cpu()
    assert set(y.unique().tolist()) <= {0.0, 2.0} and 0.4 < (y > 0).float().mean().item() < 0.6


# ------------------------------------------------------------------------------- coverage
# Rows not exercised by the cases above, each with a reason.
_RANDOM_INPLACE = "random, checked in tests/test_cache.py and test_api.py for seed reproducibility"
EXEMPT: dict[str, str] = {
    "lift_fresh_copy": "functionalization turns aten.lift_fresh_copy into clone before the backend; "
                       "the row serves graphs traced below functionalization",
    # In-place random fills: functionalization turns the public calls into the functional rows
    # (normal_functional, uniform, bernoulli, random); these serve calls made below it (randn_like).
    **{r: _RANDOM_INPLACE for r in ("normal_", "uniform_", "bernoulli_.float", "bernoulli_.Tensor",
                                    "random_.from", "random_.to")},
    **{r: "Python's << and >> operators; checked in tests/test_never_wrong.py::test_shift_operators"
       for r in ("__lshift__.Tensor", "__lshift__.Scalar", "__rshift__.Tensor", "__rshift__.Scalar")},
    **{r: "random, checked (distribution, dtype, errors) in tests/test_ops_remainder.py"
       for r in ("exponential", "cauchy", "geometric", "log_normal", "multinomial", "normal.Tensor_float",
                 "normal.float_Tensor", "normal.Tensor_Tensor")},
    "new_empty_strided": "uninitialized values in eager: shape/dtype checked in tests/test_ops_remainder.py",
    # Dead rows: bridge.cc registers no kernel for a CompositeImplicitAutograd op (the decomposition
    # runs: isfinite -> abs/eq/ne/mul, silu_backward -> sigmoid/mul/sub/add), so nothing reaches these.
}


def test_opinfo_mapping_is_valid():
    rows = set(torch_xla._C._lowered_ops())
    for key, rs in OPINFO_ROWS.items():
        assert key in _OPS, f"no OpInfo {key}"
        assert set(rs) <= rows, f"{key}: not rows: {set(rs) - rows}"
    assert set(EXEMPT) <= rows, f"EXEMPT lists non-rows: {set(EXEMPT) - rows}"


def test_zz_coverage():
    rows = torch_xla._C._lowered_ops()
    # Foreach rows run the per-tensor rows above for each element (csrc/ops/rows_foreach.cc); their
    # argument mapping is checked against eager in tests/test_foreach.py.
    missing = [r for r in rows if not (met.counter_value(f"xla::{_base(r)}") or 0) and r not in EXEMPT
               and not r.startswith("_foreach_")]
    assert not missing, f"rows neither exercised nor EXEMPT: {missing}"
