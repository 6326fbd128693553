// Op table rows: views (as functionalization's *_copy ops), scatters back into bases, joins.
#include <algorithm>
#include <numeric>

#include "ops/rows.h"

namespace txla::ops {

using ir::Op;
using V = std::vector<Value>;

namespace {

Value Identity(OpArgs& a) { return a.V(0); }

struct SliceSpec { int64_t dim, start, end, step, len; };

SliceSpec ResolveSlice(const Value& x, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
                       int64_t step) {
  if (x.rank() == 0) throw ir::ShapeError("slice() cannot be applied to a 0-dim tensor.");
  dim = ir::NormalizeDim(dim, x.rank());
  int64_t n = x.rank() == 0 ? 1 : x.dims()[dim];
  if (step <= 0) throw ir::ShapeError("slice step must be positive");
  int64_t s = start.value_or(0), e = end.value_or(n);
  if (s < 0) s += n;
  if (e < 0) e += n;
  s = std::clamp<int64_t>(s, 0, n);
  e = std::clamp<int64_t>(e, s, n);
  return {dim, s, e, step, (e - s + step - 1) / step};
}

Value SliceDim(const Value& x, const SliceSpec& sp) {
  std::vector<int64_t> st(x.rank(), 0), lim = x.dims(), str(x.rank(), 1);
  st[sp.dim] = sp.start;
  lim[sp.dim] = sp.start + std::max<int64_t>(sp.len - 1, 0) * sp.step + (sp.len > 0 ? 1 : 0);
  if (sp.len == 0) lim[sp.dim] = sp.start;
  str[sp.dim] = sp.step;
  return ir::Slice(x, st, lim, str);
}

// Writes src into self at the slice; everything else keeps self.
Value ScatterSlice(const Value& self, const Value& src_in, const SliceSpec& sp) {
  Value src = Cast(src_in, self.dtype());
  if (sp.len == 0) return self;
  int r = self.rank();
  std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
  lo[sp.dim] = sp.start;
  int64_t last = sp.start + (sp.len - 1) * sp.step;
  hi[sp.dim] = self.dims()[sp.dim] - last - 1;
  in[sp.dim] = sp.step - 1;
  Value padded = ir::Pad(src, ir::Constant(0, src.dtype()), lo, hi, in);
  Value mask = ir::Pad(ir::Full(1, ir::Shape(DType::kPred, src.dims())), ir::Constant(0, DType::kPred), lo, hi, in);
  return ir::Select(mask, padded, self);
}

Value Unsqueeze(const Value& x, int64_t dim) {
  dim = ir::NormalizeDim(dim, x.rank() + 1);
  std::vector<int64_t> d = x.dims();
  d.insert(d.begin() + dim, 1);
  return ir::Reshape(x, d);
}

Value SelectDim(const Value& x, int64_t dim, int64_t index) {
  dim = ir::NormalizeDim(dim, x.rank());
  int64_t n = x.dims()[dim];
  if (index < -n || index >= n) {
    throw ir::ShapeError("select(): index " + std::to_string(index) + " out of range for tensor of size " +
                         ir::DimsToString(x.dims()) + " at dimension " + std::to_string(dim));
  }
  if (index < 0) index += n;
  Value s = SliceDim(x, {dim, index, index + 1, 1, 1});
  std::vector<int64_t> d = x.dims();
  d.erase(d.begin() + dim);
  return ir::Reshape(s, d);
}

Value Expand(const Value& x, std::vector<int64_t> size) {
  int off = static_cast<int>(size.size()) - x.rank();
  if (off < 0) throw ir::ShapeError("expand: the number of sizes provided (" + std::to_string(size.size()) +
                                    ") must be greater or equal to the number of dimensions in the tensor (" +
                                    std::to_string(x.rank()) + ")");
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == -1) {
      if (static_cast<int>(i) < off) throw ir::ShapeError("expand: -1 is not allowed in a leading, non-existing dimension");
      size[i] = x.dims()[i - off];
    }
  }
  return BroadcastTo(x, size);
}

V SplitBySizes(const Value& x, const std::vector<int64_t>& sizes, int64_t dim) {
  dim = ir::NormalizeDim(dim, x.rank());
  V out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(SliceDim(x, {dim, start, start + s, 1, s}));
    start += s;
  }
  if (start != x.dims()[dim]) {
    throw ir::ShapeError("split_with_sizes expects split_sizes to sum exactly to " + std::to_string(x.dims()[dim]));
  }
  return out;
}

Value Squeeze(const Value& x, std::vector<int64_t> dims) {
  dims = ir::NormalizeDims(dims, x.rank());
  std::vector<int64_t> out;
  for (int i = 0; i < x.rank(); ++i) {
    bool listed = std::find(dims.begin(), dims.end(), i) != dims.end();
    if (!(listed && x.dims()[i] == 1)) out.push_back(x.dims()[i]);
  }
  return ir::Reshape(x, out);
}

}  // namespace

void AddShapeRows(std::vector<OpRow>& rows) {
  auto view = [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {ir::Reshape(x, InferViewShape(a.Ints(1), x.shape().numel()))};
  };
  rows.push_back({"view_copy", view});
  rows.push_back({"_unsafe_view", view});
  rows.push_back({"_reshape_alias_copy", view});
  rows.push_back({"permute_copy", [](OpArgs& a) -> V { return {PermuteDims(a.V(0), a.Ints(1))}; }});
  rows.push_back({"transpose_copy.int", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.rank() == 0) return {x};
    std::vector<int64_t> perm(x.rank());
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[ir::NormalizeDim(a.Int(1), x.rank())], perm[ir::NormalizeDim(a.Int(2), x.rank())]);
    return {ir::Transpose(x, perm)};
  }});
  rows.push_back({"t_copy", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.rank() > 2) a.Fail("t() expects a tensor with <= 2 dimensions, but self is " + std::to_string(x.rank()) + "D");
    return {x.rank() < 2 ? x : ir::Transpose(x, {1, 0})};
  }});
  rows.push_back({"expand_copy", [](OpArgs& a) -> V { return {Expand(a.V(0), a.Ints(1))}; }});
  rows.push_back({"slice_copy.Tensor", [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {SliceDim(x, ResolveSlice(x, a.Int(1), a.OptInt(2), a.OptInt(3), a.Int(4)))};
  }});
  rows.push_back({"select_copy.int", [](OpArgs& a) -> V { return {SelectDim(a.V(0), a.Int(1), a.Int(2))}; }});
  rows.push_back({"squeeze_copy", [](OpArgs& a) -> V {
    std::vector<int64_t> all(a.V(0).rank());
    std::iota(all.begin(), all.end(), 0);
    return {Squeeze(a.V(0), all)};
  }});
  rows.push_back({"squeeze_copy.dim", [](OpArgs& a) -> V {
    if (a.V(0).rank() == 0) return {a.V(0)};
    return {Squeeze(a.V(0), {a.Int(1)})};
  }});
  rows.push_back({"squeeze_copy.dims", [](OpArgs& a) -> V {
    if (a.V(0).rank() == 0) return {a.V(0)};
    return {Squeeze(a.V(0), a.Ints(1))};
  }});
  rows.push_back({"unsqueeze_copy", [](OpArgs& a) -> V { return {Unsqueeze(a.V(0), a.Int(1))}; }});
  rows.push_back({"alias_copy", [](OpArgs& a) -> V { return {Identity(a)}; }});
  rows.push_back({"detach_copy", [](OpArgs& a) -> V { return {Identity(a)}; }});
  rows.push_back({"clone", [](OpArgs& a) -> V { return {Identity(a)}; }});
  rows.push_back({"lift_fresh_copy", [](OpArgs& a) -> V { return {Identity(a)}; }});
  rows.push_back({"copy", [](OpArgs& a) -> V {
    Value self = a.V(0);
    return {BroadcastTo(Cast(a.V(1), self.dtype()), self.dims())};
  }});
  rows.push_back({"slice_scatter", [](OpArgs& a) -> V {
    Value self = a.V(0);
    return {ScatterSlice(self, a.V(1), ResolveSlice(self, a.Int(2), a.OptInt(3), a.OptInt(4), a.Int(5)))};
  }});
  // slice's backward. Without a row its CompositeExplicitAutograd kernel runs below functionalization and
  // writes through an as_strided view, which the CPU fallback cannot do: the gradient came back zero.
  rows.push_back({"slice_backward", [](OpArgs& a) -> V {
    Value g = a.V(0);
    Value zeros = ir::Full(0, ir::Shape(g.dtype(), a.Ints(1)));
    return {ScatterSlice(zeros, g, ResolveSlice(zeros, a.Int(2), a.OptInt(3), a.OptInt(4), a.Int(5)))};
  }});
  rows.push_back({"select_backward", [](OpArgs& a) -> V {  // (grad, input_sizes, dim, index)
    Value g = a.V(0);
    std::vector<int64_t> sizes = a.Ints(1);
    int64_t dim = ir::NormalizeDim(a.Int(2), static_cast<int>(sizes.size()));
    int64_t idx = a.Int(3), n = sizes[dim];
    if (idx < 0) idx += n;
    Value zeros = ir::Full(0, ir::Shape(g.dtype(), sizes));
    return {ScatterSlice(zeros, Unsqueeze(g, dim), {dim, idx, idx + 1, 1, 1})};
  }});
  rows.push_back({"select_scatter", [](OpArgs& a) -> V {
    Value self = a.V(0);
    int64_t dim = ir::NormalizeDim(a.Int(2), self.rank());
    int64_t idx = a.Int(3), n = self.dims()[dim];
    if (idx < 0) idx += n;
    return {ScatterSlice(self, Unsqueeze(a.V(1), dim), {dim, idx, idx + 1, 1, 1})};
  }});
  rows.push_back({"split_copy.Tensor", [](OpArgs& a) -> V {
    Value x = a.V(0);
    int64_t dim = ir::NormalizeDim(a.Int(2), x.rank()), n = x.dims()[dim], s = a.Int(1);
    std::vector<int64_t> sizes;
    for (int64_t st = 0; st < n; st += s) sizes.push_back(std::min(s, n - st));
    if (sizes.empty()) sizes.push_back(0);
    return SplitBySizes(x, sizes, dim);
  }});
  rows.push_back({"split_with_sizes_copy", [](OpArgs& a) -> V { return SplitBySizes(a.V(0), a.Ints(1), a.Int(2)); }});
  rows.push_back({"unbind_copy.int", [](OpArgs& a) -> V {
    Value x = a.V(0);
    int64_t dim = ir::NormalizeDim(a.Int(1), x.rank());
    V out;
    for (int64_t i = 0; i < x.dims()[dim]; ++i) out.push_back(SelectDim(x, dim, i));
    return out;
  }});
  rows.push_back({"cat", [](OpArgs& a) -> V {
    const auto& tl = a.TL(0);
    std::vector<const TensorArg*> ts;
    for (auto& t : tl) ts.push_back(&t);
    DType t = ResultType(ts);
    V xs;
    for (auto& x : tl) {
      if (x.v.rank() == 1 && x.v.dims()[0] == 0) continue;  // legacy: skip 1-D empty tensors
      xs.push_back(Cast(x.v, t));
    }
    if (xs.empty()) return {Cast(tl[0].v, t)};
    return {ir::Concatenate(xs, ir::NormalizeDim(a.Int(1), xs[0].rank()))};
  }});
  rows.push_back({"stack", [](OpArgs& a) -> V {
    const auto& tl = a.TL(0);
    if (tl.empty()) a.Fail("stack expects a non-empty TensorList");
    std::vector<const TensorArg*> ts;
    for (auto& t : tl) ts.push_back(&t);
    DType t = ResultType(ts);
    int64_t dim = ir::NormalizeDim(a.Int(1), tl[0].v.rank() + 1);
    V xs;
    for (auto& x : tl) {
      if (x.v.dims() != tl[0].v.dims()) a.Fail("stack expects each tensor to be equal size");
      xs.push_back(Unsqueeze(Cast(x.v, t), dim));
    }
    return {ir::Concatenate(xs, dim)};
  }});
  rows.push_back({"flip", [](OpArgs& a) -> V { return {ir::Reverse(a.V(0), a.Ints(1))}; }});
  // Tensor.unfold's value (functionalization runs unfold_copy for every unfold view): the windows
  // x[..., i*step : i*step+size, ...] along `dim`, each laid out along a new last dimension. One
  // gather of the window elements (indices i*step + j from iotas), reshaped and transposed.
  rows.push_back({"unfold_copy", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const int rank = x.rank();
    const int64_t dim = ir::NormalizeDim(a.Int(1), std::max(rank, 1));
    const int64_t size = a.Int(2), step = a.Int(3);
    const int64_t len = rank == 0 ? 1 : x.dims()[dim];
    if (size < 0) a.Fail("size is " + std::to_string(size) + " but must be >= 0");
    if (size > len) {
      a.Fail("maximum size for tensor at dimension " + std::to_string(dim) + " is " + std::to_string(len) +
             " but size is " + std::to_string(size));
    }
    if (step <= 0) a.Fail("step is " + std::to_string(step) + " but must be > 0");
    if (rank == 0) return {size == 0 ? ir::Full(0, ir::Shape(x.dtype(), {0})) : ir::Reshape(x, {1})};
    const int64_t n = (len - size) / step + 1;
    std::vector<int64_t> out = x.dims();
    out[dim] = n;
    out.push_back(size);
    if (ir::Shape(x.dtype(), out).numel() == 0) return {ir::Full(0, ir::Shape(x.dtype(), out))};
    ir::Shape is(DType::kS64, {n, size});
    Value idx = Bin(Op::kAdd, Bin(Op::kMul, ir::Iota(is, 0), ir::Full(step, ir::Shape(DType::kS64, {}))), ir::Iota(is, 1));
    idx = ir::Reshape(idx, {n * size, 1});
    std::vector<int64_t> slice = x.dims(), offset;
    slice[dim] = 1;
    for (int d = 0; d < rank; ++d) if (d != dim) offset.push_back(d);
    Value g = ir::Gather(x, idx, offset, {dim}, {dim}, 1, slice);  // [..., n*size, ...]
    std::vector<int64_t> split = x.dims();
    split[dim] = n;
    split.insert(split.begin() + dim + 1, size);
    std::vector<int64_t> perm;
    for (int d = 0; d <= rank; ++d) if (d != dim + 1) perm.push_back(d);
    perm.push_back(dim + 1);
    return {ir::Transpose(ir::Reshape(g, split), perm)};
  }});
  rows.push_back({"index_select", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(2);
    int64_t dim = ir::NormalizeDim(a.Int(1), x.rank());
    if (x.rank() == 0) return {x};
    if (x.dims()[dim] == 0 && idx.shape().numel() > 0) {  // every index is out of range
      if (x.rank() == 1) throw IndexError("index out of range in self");
      a.Fail("index_select(): self indexing axis dim should be positive");
    }
    if (x.shape().numel() == 0 && x.rank() > 1) {
      // Eager's CPU kernel checks every index even though nothing is gathered (RuntimeError).
      a.keep_checks = true;
      CheckIndexRange(idx, 0, x.dims()[dim],
                      "index_select(): INDICES element is out of DATA bounds, axis_dim=" + std::to_string(x.dims()[dim]),
                      a.device, std::nullopt, /*runtime_error=*/true);
    } else if (dim == 1 && x.rank() > 1) {  // eager's CPU kernel for dim 1 raises RuntimeError, not IndexError
      CheckIndexRange(idx, 0, x.dims()[dim],
                      "index_select(): INDICES element is out of DATA bounds, axis_dim=" + std::to_string(x.dims()[dim]),
                      a.device, std::nullopt, /*runtime_error=*/true);
    } else {
      CheckIndexRange(idx, 0, x.dims()[dim], "index_select(): index out of range in self", a.device);
    }
    Value i1 = ir::Reshape(Cast(idx, DType::kS64), {idx.shape().numel(), 1});
    std::vector<int64_t> sizes = x.dims();
    sizes[dim] = 1;
    std::vector<int64_t> offset;
    for (int d = 0; d < x.rank(); ++d) if (d != dim) offset.push_back(d);
    return {ir::Gather(x, i1, offset, {dim}, {dim}, 1, sizes)};
  }});
}

}  // namespace txla::ops
