// Op table rows: triangles, norms and moments, gather/scatter and advanced indexing, sorting,
// padding, resampling and assorted elementwise ops used by common models.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "graph/graph.h"
#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

std::vector<int64_t> AllDims(int rank) {
  std::vector<int64_t> d(rank);
  std::iota(d.begin(), d.end(), 0);
  return d;
}

Value Triangle(const Value& x, int64_t diag, bool lower) {
  int r = x.rank();
  if (r < 2) throw ir::ShapeError("tril/triu: input tensor must have at least 2 dimensions");
  ir::Shape is(DType::kS64, {x.dims()[r - 2], x.dims()[r - 1]});
  Value i = ir::Iota(is, 0), j = ir::Iota(is, 1);
  Value jd = ir::Binary(Op::kSub, j, ir::Full(static_cast<double>(diag), is));
  Value keep = ir::Compare(lower ? CompareDir::kLE : CompareDir::kGE, jd, i);
  Value kb = ir::BroadcastInDim(keep, x.dims(), {r - 2, r - 1});
  return ir::Select(kb, x, ir::Full(0, x.shape()));
}

// Index tensor for gather/scatter along `dim`: [numel, rank] coordinates where coordinate `dim`
// comes from `index` and the others from the positions.
Value FullCoordinates(const Value& index, int64_t dim) {
  int r = index.rank();
  int64_t n = index.shape().numel();
  std::vector<Value> cols;
  ir::Shape is(DType::kS64, index.dims());
  for (int d = 0; d < r; ++d) {
    Value c = d == dim ? Cast(index, DType::kS64) : ir::Iota(is, d);
    cols.push_back(ir::Reshape(c, {n, 1}));
  }
  return ir::Concatenate(cols, 1);
}

void CheckDim(const Value& x, int64_t dim, const Value& index, const char* op, int device) {
  int64_t n = x.rank() == 0 ? 1 : x.dims()[dim];
  CheckIndexRange(index, 0, n, std::string(op) + "(): index {index} is out of bounds for dimension " + std::to_string(dim) +
                  " with size " + std::to_string(n), device, std::nullopt, /*runtime_error=*/true);
}

Value GatherDim(const Value& x, int64_t dim, const Value& index) {
  if (index.shape().numel() == 0) return ir::Full(0, ir::Shape(x.dtype(), index.dims()));
  if (index.rank() != x.rank() && !(x.rank() == 0 && index.rank() <= 1)) {
    throw ir::ShapeError("Index tensor must have the same number of dimensions as input tensor");
  }
  if (x.rank() == 0) return ir::Reshape(x, index.dims());
  int r = x.rank();
  for (int d = 0; d < r; ++d) {
    if (d != dim && index.dims()[d] > x.dims()[d]) {
      throw ir::ShapeError("Size does not match at dimension " + std::to_string(d) + " expected index " +
                           ir::DimsToString(index.dims()) + " to be no larger than self " + ir::DimsToString(x.dims()) +
                           " apart from dimension " + std::to_string(dim));
    }
  }
  int64_t n = index.shape().numel();
  Value coords = FullCoordinates(index, dim);
  std::vector<int64_t> ones(r, 1);
  Value g = ir::Gather(x, coords, {}, AllDims(r), AllDims(r), 1, ones);
  return ir::Reshape(g, index.dims());
  (void)n;
}

Value ScatterDim(const Value& self, int64_t dim, const Value& index, const Value& src, bool add);
Value ScatterCombine(const Value& self, int64_t dim, const Value& index, const Value& src, int64_t combine);

// Eager's CPU scatter kernels accumulate float16 / bfloat16 in float32 and round once at the end:
// scatter_add, scatter(reduce="add"/"multiply") and scatter_reduce's sum/prod/mean (and index_add
// where it takes the scatter_add path). Duplicate indices summed in the narrow dtype would round
// after every addition (fuzz seed 51327: a bfloat16 scatter_add 0.016 off, amplified by a matmul).
bool ReducedFloat(DType t) { return t == DType::kF16 || t == DType::kBF16; }

// Runs an accumulating scatter (combine 1 = add, 2 = multiply) of a float16 / bfloat16 self in
// float32 and rounds the result once, as eager.
Value ScatterInF32(const Value& self, int64_t dim, const Value& index, const Value& src, int64_t combine) {
  return Cast(ScatterCombine(Cast(self, DType::kF32), dim, index, Cast(src, DType::kF32), combine), self.dtype());
}

// scatter(..., reduce="add" | "multiply"): combine into self.
Value ScatterReduce(const Value& self, int64_t dim, const Value& index, const Value& src, const std::string& reduce,
                    const OpArgs& a) {
  if (reduce != "add" && reduce != "multiply") a.Fail("reduce argument must be either add or multiply, got " + reduce);
  if (ReducedFloat(self.dtype())) return ScatterInF32(self, dim, index, src, reduce == "add" ? 1 : 2);
  if (reduce == "add") return ScatterDim(self, dim, index, src, true);
  // Multiply: scatter the factors into ones (products of duplicates), then multiply self.
  Value ones = ir::Full(1, self.shape());
  int r = self.rank();
  if (index.shape().numel() == 0) return self;
  if (r == 0) {
    Value one = ScatterReduce(ir::Reshape(self, {1}), 0, ir::Reshape(index, {1}), ir::Reshape(src, {src.shape().numel()}),
                              reduce, a);
    return ir::Reshape(one, {});
  }
  int64_t n = index.shape().numel();
  std::vector<Value> cols;
  ir::Shape is(DType::kS64, index.dims());
  for (int d = 0; d < r; ++d) cols.push_back(ir::Reshape(d == dim ? Cast(index, DType::kS64) : ir::Iota(is, d), {n, 1}));
  Value coords = ir::Concatenate(cols, 1);
  Value s = src;
  if (s.dims() != index.dims()) {
    std::vector<int64_t> st(r, 0), lim = index.dims(), str(r, 1);
    s = ir::Slice(s, st, lim, str);
  }
  std::vector<int64_t> all(r);
  std::iota(all.begin(), all.end(), 0);
  Value factors = ir::Scatter(ones, coords, ir::Reshape(Cast(s, self.dtype()), {n}), {}, all, all, 1, 2);
  return ir::Binary(Op::kMul, self, factors);
}

// scatter with combine (see ir::Scatter) of src's index-shaped corner into self along dim.
Value ScatterCombine(const Value& self, int64_t dim, const Value& index, const Value& src, int64_t combine) {
  int r = self.rank();
  if (index.shape().numel() == 0) return self;
  if (r == 0) {
    Value one = ScatterCombine(ir::Reshape(self, {1}), 0, ir::Reshape(index, {1}),
                               ir::Reshape(src, {src.shape().numel()}), combine);
    return ir::Reshape(one, {});
  }
  int64_t n = index.shape().numel();
  Value coords = FullCoordinates(index, dim);
  Value s = src;
  if (s.dims() != index.dims()) {
    std::vector<int64_t> st(r, 0), lim = index.dims(), str(r, 1);
    s = ir::Slice(s, st, lim, str);
  }
  Value upd = ir::Reshape(Cast(s, self.dtype()), {n});
  return ir::Scatter(self, coords, upd, {}, AllDims(r), AllDims(r), 1, combine);
}

Value ScatterDim(const Value& self, int64_t dim, const Value& index, const Value& src, bool add) {
  return ScatterCombine(self, dim, index, src, add ? 1 : 0);
}

// The lowest (or highest) value of an integer dtype.
int64_t IntLimit(DType t, bool lowest) {
  switch (t) {
    case DType::kS8: return lowest ? INT8_MIN : INT8_MAX;
    case DType::kS16: return lowest ? INT16_MIN : INT16_MAX;
    case DType::kS32: return lowest ? INT32_MIN : INT32_MAX;
    case DType::kU8: return lowest ? 0 : UINT8_MAX;
    case DType::kU16: return lowest ? 0 : UINT16_MAX;
    case DType::kU32: return lowest ? 0 : static_cast<int64_t>(UINT32_MAX);
    case DType::kU64: return lowest ? 0 : -1;  // all ones
    default: return lowest ? INT64_MIN : INT64_MAX;
  }
}

// scatter_reduce.two: sum / prod / mean / amax / amin, with or without self's values. Positions no
// index reaches keep self; with include_self=False the reached ones start from the reduction's
// identity. mean divides by the count (floor division for integers), as eager.
Value ScatterReduceTwo(const Value& self, int64_t dim, const Value& index, const Value& src,
                       const std::string& reduce, bool include_self) {
  DType t = self.dtype();
  if (index.shape().numel() == 0) return self;
  Value reached = ScatterCombine(ir::Full(0, ir::Shape(DType::kPred, self.dims())), dim, index,
                                 ir::Full(1, ir::Shape(DType::kPred, index.dims())), 0);
  auto start = [&](double identity) {
    return include_self ? self : ir::Select(reached, ir::Full(identity, self.shape()), self);
  };
  double inf = std::numeric_limits<double>::infinity();
  if (reduce == "sum" || reduce == "prod") {
    bool sum = reduce == "sum";
    if (ReducedFloat(t)) return ScatterInF32(start(sum ? 0 : 1), dim, index, src, sum ? 1 : 2);
    return ScatterCombine(start(sum ? 0 : 1), dim, index, src, sum ? 1 : 2);
  }
  if (reduce == "amax" || reduce == "amin") {
    bool mx = reduce == "amax";
    Value base;
    if (include_self) {
      base = self;
    } else if (ir::IsFloating(t)) {
      base = start(mx ? -inf : inf);
    } else {  // integer identities: the dtype's lowest / highest value
      Value lim = ir::ConstantInt(IntLimit(t, mx), t);
      base = ir::Select(reached, ir::BroadcastInDim(lim, self.dims(), {}), self);
    }
    return ScatterCombine(base, dim, index, src, mx ? 3 : 4);
  }
  // mean
  DType ct = OpMath(t);
  Value sum = ScatterCombine(Cast(start(0), ct), dim, index, Cast(src, ct), 1);
  Value cnt = ScatterCombine(ir::Full(include_self ? 1 : 0, ir::Shape(ct, self.dims())), dim, index,
                             ir::Full(1, ir::Shape(ct, index.dims())), 1);
  cnt = ir::Select(ir::Compare(CompareDir::kEQ, cnt, ir::Full(0, cnt.shape())), ir::Full(1, cnt.shape()), cnt);
  if (ReducedFloat(t)) {
    // eager: the sum and the counts are tensors of self's dtype (each accumulated in float32 and
    // rounded once), then divided in that dtype
    sum = Cast(Cast(sum, t), ct);
    cnt = Cast(Cast(cnt, t), ct);
  }
  Value q = ir::Binary(Op::kDiv, sum, cnt);
  if (!ir::IsFloating(t)) {  // floor division (div's rounding_mode='floor'); integer division truncates
    Value r = ir::Binary(Op::kRem, sum, cnt);
    Value fix = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kNE, r, ir::Full(0, r.shape())),
                           ir::Compare(CompareDir::kLT, ir::Binary(Op::kXor, sum, cnt), ir::Full(0, r.shape())));
    q = ir::Select(fix, ir::Binary(Op::kSub, q, ir::Full(1, q.shape())), q);
  }
  return Cast(q, t);
}

// Advanced indexing: self[indices...] with index tensors (None = full slice). Returns the
// gathered value; the result layout follows eager: broadcast index dims replace the indexed dims
// when those are adjacent, else go first.
struct IndexPlan {
  std::vector<int64_t> indexed;  // dims with an index tensor
  std::vector<Value> idx;        // broadcast, i64, normalized (negatives wrapped)
  std::vector<int64_t> bshape;   // broadcast index shape
  bool adjacent = true;
};

IndexPlan PlanIndex(const Value& self, const std::vector<TensorArg>& indices, int device) {
  IndexPlan p;
  ir::Dims shape;
  // Bool masks are not static-shape: the bridge sends those to the fallback (see RowKernel).
  for (size_t d = 0; d < indices.size(); ++d) {
    if (!indices[d].defined()) continue;
    p.indexed.push_back(static_cast<int64_t>(d));
    shape = shape.empty() && p.idx.empty() ? indices[d].v.dims() : BroadcastShapes(shape, indices[d].v.dims());
    p.idx.push_back(indices[d].v);
  }
  if (p.indexed.empty()) throw ir::ShapeError("index: no index tensors");
  for (size_t k = 1; k < p.indexed.size(); ++k) p.adjacent &= p.indexed[k] == p.indexed[k - 1] + 1;
  p.bshape = shape;
  // Eager's AdvancedIndex: an indexed dim of size 0 with a non-empty index shape can only be out of
  // bounds, and raises at the op, even when the result has no elements (fuzz seed 11856: `index_put`
  // into a (0, 1, 4) tensor; `x[idx]` of a (0, 3) tensor failed to compile).
  bool empty_indexed = false;
  for (int64_t d : p.indexed) empty_indexed |= self.dims()[d] == 0;
  if (empty_indexed && std::find(shape.begin(), shape.end(), 0) == shape.end()) {
    throw IndexError("index is out of bounds for dimension with size 0");
  }
  for (size_t k = 0; k < p.idx.size(); ++k) {
    Value i = Cast(BroadcastTo(p.idx[k], shape), DType::kS64);
    int64_t n = self.dims()[p.indexed[k]];
    CheckIndexRange(p.idx[k], -n, n, "index {index} is out of bounds for dimension " + std::to_string(p.indexed[k]) +
                    " with size " + std::to_string(n), device);
    Value neg = ir::Compare(CompareDir::kLT, i, ir::Full(0, i.shape()));
    p.idx[k] = ir::Select(neg, ir::Binary(Op::kAdd, i, ir::Full(static_cast<double>(n), i.shape())), i);
  }
  return p;
}

Value IndexGather(const Value& self, const IndexPlan& p) {
  int r = self.rank();
  int64_t m = 1;
  for (auto d : p.bshape) m *= d;
  std::vector<Value> cols;
  for (auto& i : p.idx) cols.push_back(ir::Reshape(i, {m, 1}));
  Value coords = ir::Concatenate(cols, 1);  // [m, k]
  std::vector<int64_t> slice = self.dims(), offset_dims, rest;
  for (int64_t d : p.indexed) slice[d] = 1;
  for (int d = 0; d < r; ++d) {
    if (std::find(p.indexed.begin(), p.indexed.end(), d) == p.indexed.end()) rest.push_back(d);
  }
  for (size_t k = 0; k < rest.size(); ++k) offset_dims.push_back(static_cast<int64_t>(k) + 1);
  Value g = ir::Gather(self, coords, offset_dims, p.indexed, p.indexed, 1, slice);  // [m, rest...]
  std::vector<int64_t> out = p.bshape;
  for (int64_t d : rest) out.push_back(self.dims()[d]);
  Value res = ir::Reshape(g, out);  // [bshape..., rest...]
  if (!p.adjacent || p.indexed.front() == 0) return res;
  // Move the index dims to where the indexed dims were.
  int64_t before = p.indexed.front();
  int nb = static_cast<int>(p.bshape.size());
  std::vector<int64_t> perm;
  for (int64_t k = 0; k < before; ++k) perm.push_back(nb + k);
  for (int k = 0; k < nb; ++k) perm.push_back(k);
  for (size_t k = before; k < rest.size(); ++k) perm.push_back(nb + static_cast<int64_t>(k));
  return ir::Transpose(res, perm);
}

Value IndexPut(const Value& self, const IndexPlan& p, const Value& values, bool accumulate) {
  int r = self.rank();
  int64_t m = 1;
  for (auto d : p.bshape) m *= d;
  std::vector<Value> cols;
  for (auto& i : p.idx) cols.push_back(ir::Reshape(i, {m, 1}));
  Value coords = ir::Concatenate(cols, 1);
  std::vector<int64_t> rest;
  for (int d = 0; d < r; ++d) {
    if (std::find(p.indexed.begin(), p.indexed.end(), d) == p.indexed.end()) rest.push_back(d);
  }
  // Updates laid out as [m, rest...]: broadcast values to the indexing result shape first.
  std::vector<int64_t> res_shape = p.bshape;
  for (int64_t d : rest) res_shape.push_back(self.dims()[d]);
  Value v = Cast(values, self.dtype());
  if (p.adjacent && p.indexed.front() != 0) {
    // Result layout has index dims in place: broadcast in that layout, then move them first.
    std::vector<int64_t> inplace;
    int64_t before = p.indexed.front();
    for (int64_t k = 0; k < before; ++k) inplace.push_back(self.dims()[rest[k]]);
    for (auto d : p.bshape) inplace.push_back(d);
    for (size_t k = before; k < rest.size(); ++k) inplace.push_back(self.dims()[rest[k]]);
    v = BroadcastTo(v, inplace);
    int nb = static_cast<int>(p.bshape.size());
    std::vector<int64_t> perm;
    for (int k = 0; k < nb; ++k) perm.push_back(before + k);
    for (int64_t k = 0; k < before; ++k) perm.push_back(k);
    for (size_t k = before; k < rest.size(); ++k) perm.push_back(nb + static_cast<int64_t>(k));
    v = ir::Transpose(v, perm);
  } else {
    v = BroadcastTo(v, res_shape);
  }
  std::vector<int64_t> upd_shape{m};
  for (int64_t d : rest) upd_shape.push_back(self.dims()[d]);
  Value upd = ir::Reshape(v, upd_shape);
  std::vector<int64_t> window_dims;
  for (size_t k = 0; k < rest.size(); ++k) window_dims.push_back(static_cast<int64_t>(k) + 1);
  return ir::Scatter(self, coords, upd, window_dims, p.indexed, p.indexed, 1, accumulate ? 1 : 0);
}

// Variance (std: its square root) accumulated in double, as eager's CPU kernels do for every float
// type; the result is rounded once to the output type. In float32, the squared deviations of values
// near 1e19 overflowed to inf (bfloat16: near 1e20; squares below 1e-45 vanished).
Value Moment(const Value& x, std::optional<std::vector<int64_t>> dims_opt, double correction, bool keepdim,
             bool sqrt = false) {
  DType out_t = FloatOf(x.dtype());
  DType t = ir::IsFloating(out_t) ? DType::kF64 : DType::kF32;
  Value xc = Cast(x, t);
  std::vector<int64_t> dims = (!dims_opt || dims_opt->empty()) ? AllDims(x.rank()) : ir::NormalizeDims(*dims_opt, x.rank());
  int64_t n = 1;
  if (x.rank() > 0) for (int64_t d : dims) n *= x.dims()[d];
  Value mean = KeepDims(ir::Reduce(ir::ReduceKind::kSum, xc, dims), x.dims(), dims);
  mean = ir::Binary(Op::kDiv, mean, ir::Full(static_cast<double>(n), mean.shape()));
  Value c = Bin(Op::kSub, xc, mean);
  Value ss = ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kMul, c, c), dims);
  Value v = ir::Binary(Op::kDiv, ss, ir::Full(std::max(0.0, static_cast<double>(n) - correction), ss.shape()));
  if (sqrt) v = ir::Unary(Op::kSqrt, v);
  return Cast(keepdim ? KeepDims(v, x.dims(), dims) : v, out_t);
}

Value PadConstant(const Value& x, const std::vector<int64_t>& pad, const Value& value) {
  int r = x.rank();
  std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    int d = r - 1 - static_cast<int>(k);
    lo[d] = pad[2 * k];
    hi[d] = pad[2 * k + 1];
  }
  // Negative padding crops.
  std::vector<int64_t> st(r, 0), lim = x.dims(), str(r, 1);
  bool crop = false;
  for (int d = 0; d < r; ++d) {
    if (lo[d] < 0) { st[d] = -lo[d]; lo[d] = 0; crop = true; }
    if (hi[d] < 0) { lim[d] += hi[d]; hi[d] = 0; crop = true; }
  }
  Value y = crop ? ir::Slice(x, st, lim, str) : x;
  return ir::Pad(y, value, lo, hi, in);
}

// Reflect/replicate padding of the last pad.size()/2 dims via gathers of computed indices.
Value PadIndexed(const Value& x, const std::vector<int64_t>& pad, bool reflect) {
  Value y = x;
  int r = x.rank();
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    int d = r - 1 - static_cast<int>(k);
    int64_t n = y.dims()[d], lo = pad[2 * k], hi = pad[2 * k + 1];
    if (reflect && (lo >= n || hi >= n)) {
      throw ir::ShapeError("Argument #4: Padding size should be less than the corresponding input dimension");
    }
    int64_t out = n + lo + hi;
    ir::Shape is(DType::kS64, {out});
    Value i = ir::Binary(Op::kSub, ir::Iota(is, 0), ir::Full(static_cast<double>(lo), is));
    Value idx;
    if (reflect) {
      // |i| then mirror past n-1: j = (n-1) - |(n-1) - |i||
      Value ai = ir::Unary(Op::kAbs, i);
      Value m = ir::Full(static_cast<double>(n - 1), is);
      idx = ir::Binary(Op::kSub, m, ir::Unary(Op::kAbs, ir::Binary(Op::kSub, m, ai)));
    } else {
      idx = ir::Clamp(ir::Full(0, is), i, ir::Full(static_cast<double>(n - 1), is));
    }
    std::vector<int64_t> sizes = y.dims();
    sizes[d] = 1;
    std::vector<int64_t> offset;
    for (int q = 0; q < r; ++q) if (q != d) offset.push_back(q);
    y = ir::Gather(y, ir::Reshape(idx, {out, 1}), offset, {d}, {d}, 1, sizes);
  }
  return y;
}

// Source index per output position for nearest upsampling (PyTorch's "nearest": floor(o * scale)).
// eager's source index of output o: floor(o * scale), or for nearest-exact floor((o + 0.5) * scale),
// in float32 with the scale rounded to float32, clamped to in - 1.
Value NearestIndex(int64_t out, int64_t in, std::optional<double> scale, bool exact = false) {
  double s = scale && *scale > 0 ? 1.0 / *scale : static_cast<double>(in) / out;
  ir::Shape fs(DType::kF32, {out});
  Value o = ir::Iota(fs, 0);
  if (exact) o = ir::Binary(Op::kAdd, o, ir::Full(0.5, fs));
  Value src = ir::Unary(Op::kFloor, ir::Binary(Op::kMul, o, ir::Full(s, fs)));
  Value i = ir::Convert(src, DType::kS64);
  return ir::Clamp(ir::Full(0, i.shape()), i, ir::Full(static_cast<double>(in - 1), i.shape()));
}

// Linear resampling along one dim: output o reads input positions i0, i1 [out] (i64) with weights
// l0, l1 [out] (f32), as eager's source-index rule.
struct LinearTaps {
  Value i0, i1, l0, l1;
};
LinearTaps LinearTapsOf(int64_t out, int64_t in, bool align_corners, std::optional<double> scale, DType ft) {
  ir::Shape fs(ft, {out});  // eager's weights are computed in the op's math type (float64 for float64)
  Value o = ir::Iota(fs, 0);
  Value src;
  if (align_corners) {
    double s = out > 1 ? static_cast<double>(in - 1) / (out - 1) : 0.0;
    src = ir::Binary(Op::kMul, o, ir::Full(s, fs));
  } else {
    double s = scale && *scale > 0 ? 1.0 / *scale : static_cast<double>(in) / out;
    src = ir::Binary(Op::kSub, ir::Binary(Op::kMul, ir::Binary(Op::kAdd, o, ir::Full(0.5, fs)), ir::Full(s, fs)),
                     ir::Full(0.5, fs));
    src = ir::Binary(Op::kMax, src, ir::Full(0, fs));
  }
  ir::Shape is(DType::kS64, {out});
  LinearTaps t;
  t.i0 = ir::Binary(Op::kMin, ir::Convert(ir::Unary(Op::kFloor, src), DType::kS64), ir::Full(static_cast<double>(in - 1), is));
  t.i1 = ir::Binary(Op::kMin, ir::Binary(Op::kAdd, t.i0, ir::Full(1, is)), ir::Full(static_cast<double>(in - 1), is));
  t.l1 = ir::Binary(Op::kSub, src, ir::Convert(t.i0, ft));
  t.l0 = ir::Binary(Op::kSub, ir::Full(1, fs), t.l1);
  return t;
}

// [out, in] interpolation matrix for linear resampling along one dim.
Value LinearMatrix(int64_t out, int64_t in, bool align_corners, std::optional<double> scale, DType t) {
  auto [i0, i1, l0, l1] = LinearTapsOf(out, in, align_corners, scale, t == DType::kF64 ? DType::kF64 : DType::kF32);
  ir::Shape ms(DType::kS64, {out, in});
  Value col = ir::Iota(ms, 1);
  auto row = [&](const Value& v) { return ir::BroadcastInDim(v, {out, in}, {0}); };
  ir::Shape mf(l0.dtype(), {out, in});
  Value w0 = ir::Select(ir::Compare(CompareDir::kEQ, col, row(i0)), row(l0), ir::Full(0, mf));
  Value w1 = ir::Select(ir::Compare(CompareDir::kEQ, col, row(i1)), row(l1), ir::Full(0, mf));
  return Cast(ir::Binary(Op::kAdd, w0, w1), t);
}

// Linear resampling along one dim as two gathered taps: out[o] = l0 * x[i0] + l1 * x[i1], where a
// tap of weight 0 contributes exactly 0 (selected out, never 0 * x: an inf next to an exact sample
// point must not turn it into NaN). Same indices and weights as LinearMatrix.
Value Linear1d(const Value& x, int64_t dim, int64_t out, bool align_corners, std::optional<double> scale);

// x gathered along `dim` at positions idx [n] (i64).
Value GatherAlong(const Value& x, int64_t dim, const Value& idx) {
  int r = x.rank();
  int64_t n = idx.dims()[0];
  std::vector<int64_t> sizes = x.dims(), offset;
  sizes[dim] = 1;
  for (int q = 0; q < r; ++q) if (q != dim) offset.push_back(q);
  return ir::Gather(x, ir::Reshape(idx, {n, 1}), offset, {dim}, {dim}, 1, sizes);
}

Value Linear1d(const Value& x, int64_t dim, int64_t out, bool align_corners, std::optional<double> scale) {
  const DType ft = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  auto [i0, i1, l0, l1] = LinearTapsOf(out, x.dims()[dim], align_corners, scale, ft);
  ir::Shape fs(ft, {out});
  std::vector<int64_t> od = x.dims();
  od[dim] = out;
  auto tap = [&](const Value& idx, const Value& w) {
    Value g = GatherAlong(x, dim, idx);  // the gathered dim lands at `dim`
    Value wb = ir::BroadcastInDim(Cast(w, x.dtype()), od, {dim});
    Value nz = ir::BroadcastInDim(ir::Compare(CompareDir::kNE, w, ir::Full(0, fs)), od, {dim});
    return ir::Select(nz, ir::Binary(Op::kMul, g, wb), ir::Full(0, g.shape()));
  };
  return ir::Binary(Op::kAdd, tap(i0, l0), tap(i1, l1));
}

// One-hot selection matrix [out, in] for nearest resampling.
Value NearestMatrix(int64_t out, int64_t in, std::optional<double> scale, DType t, bool exact = false) {
  Value idx = NearestIndex(out, in, scale, exact);
  ir::Shape ms(DType::kS64, {out, in});
  Value eq = ir::Compare(CompareDir::kEQ, ir::Iota(ms, 1), ir::BroadcastInDim(idx, {out, in}, {0}));
  return Cast(eq, t);
}

std::optional<double> OptD(const OpArgs& a, size_t k) { return a.OptDouble(k); }

// upsample_nearest2d's gradient as eager's CPU kernel adds it: each output's gradient into its
// source input, in output order (row-major), in `ct`. The nearest index is nondecreasing, so input i
// of a dim receives outputs first(i) .. first(i) + count(i) - 1: the k-th of them is gathered for
// every input at once and added where it exists. (A product with the 0/1 matrix added in the dot's
// order: float32 gradients differed in the last bit.)
Value NearestBackwardSequential(const Value& g, int64_t in_h, int64_t in_w, std::optional<double> sh,
                                std::optional<double> sw, DType ct, bool exact = false) {
  const int r = g.rank();
  struct Dim { int d; Value first, count; int64_t most; };
  auto dim = [&](int d, int64_t in, std::optional<double> sc) {
    const int64_t out = g.dims()[d];
    ir::Shape ms(DType::kS64, {in, out});
    Value i = ir::Iota(ms, 0), src = ir::BroadcastInDim(NearestIndex(out, in, sc, exact), {in, out}, {1});
    Dim dm{d, ir::Reduce(ir::ReduceKind::kSum, ir::Convert(ir::Compare(CompareDir::kLT, src, i), DType::kS64), {1}),
           ir::Reduce(ir::ReduceKind::kSum, ir::Convert(ir::Compare(CompareDir::kEQ, src, i), DType::kS64), {1}),
           std::min(out, out % in == 0 && !(sc && *sc > 0) ? out / in : out / in + 2)};
    return dm;
  };
  Dim dh = dim(r - 2, in_h, sh), dw = dim(r - 1, in_w, sw);
  std::vector<int64_t> od = g.dims();
  od[r - 2] = in_h, od[r - 1] = in_w;
  auto nth = [&](const Dim& dm, int64_t k, Value* valid) {
    ir::Shape is = dm.first.shape();
    *valid = ir::Compare(CompareDir::kLT, ir::Full(static_cast<double>(k), is), dm.count);
    Value o = ir::Binary(Op::kAdd, dm.first, ir::Full(static_cast<double>(k), is));
    return ir::Binary(Op::kMin, o, ir::Full(static_cast<double>(g.dims()[dm.d] - 1), is));
  };
  Value gc = Cast(g, ct), acc = ir::Full(0, ir::Shape(ct, od));
  for (int64_t kh = 0; kh < dh.most; ++kh) {
    Value vh;
    Value rows = GatherAlong(gc, r - 2, nth(dh, kh, &vh));
    for (int64_t kw = 0; kw < dw.most; ++kw) {
      Value vw;
      Value term = GatherAlong(rows, r - 1, nth(dw, kw, &vw));
      Value valid = ir::Binary(Op::kAnd, ir::BroadcastInDim(vh, od, {r - 2}), ir::BroadcastInDim(vw, od, {r - 1}));
      acc = ir::Binary(Op::kAdd, acc, ir::Select(valid, term, ir::Full(0, term.shape())));
    }
  }
  return acc;
}



// (values, indices[i64]) sorted along dim (stable; NaN placement is the emitter's comparator).
std::vector<Value> SortWithIndices(const Value& x, int64_t dim, bool descending) {
  if (x.rank() == 0) return {x, ir::ConstantInt(0, DType::kS64)};
  int64_t d = ir::NormalizeDim(dim, x.rank());
  Value idx = ir::Iota(ir::Shape(DType::kS64, x.dims()), d);
  return ir::Sort({x, idx}, d, descending, true);
}

// median along d (rank >= 1): the lower median sorted[(n-1)/2] of a stable ascending sort (NaN last);
// a slice holding NaN has median NaN with the index of its first NaN, as eager. Dim d is removed.
std::vector<Value> MedianAlong(const Value& x, int64_t d, bool ignore_nan = false) {
  int64_t n = x.dims()[d];
  std::vector<Value> s = SortWithIndices(x, d, false);
  std::vector<int64_t> out_dims, keep;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (i != d) out_dims.push_back(x.dims()[i]), keep.push_back(i);
  }
  auto take = [&](const Value& v, int64_t k) {
    std::vector<int64_t> st(x.rank(), 0), lim = x.dims(), str(x.rank(), 1);
    st[d] = k;
    lim[d] = k + 1;
    return ir::Reshape(ir::Slice(v, st, lim, str), out_dims);
  };
  if (ignore_nan && ir::IsFloating(x.dtype())) {
    // nanmedian: the lower median of the non-NaN values, at sorted position (count - 1) / 2 (NaN sort
    // last); an all-NaN slice gives position 0: NaN, with the first NaN's index.
    Value nan_count =
        ir::Reduce(ir::ReduceKind::kSum, Cast(ir::Compare(CompareDir::kNE, s[0], s[0]), DType::kS64), {d});
    Value cnt = ir::Binary(Op::kSub, ir::Full(static_cast<double>(n), nan_count.shape()), nan_count);
    Value k = ir::Binary(Op::kDiv, ir::Binary(Op::kSub, cnt, ir::Full(1, cnt.shape())), ir::Full(2, cnt.shape()));
    Value at_k = ir::Compare(CompareDir::kEQ, ir::Iota(ir::Shape(DType::kS64, x.dims()), d),
                             ir::BroadcastInDim(k, x.dims(), keep));
    Value v = ir::Reduce(ir::ReduceKind::kMax, ir::Select(at_k, s[0], ir::Full(-INFINITY, s[0].shape())), {d});
    Value i = ir::Reduce(ir::ReduceKind::kSum, ir::Select(at_k, s[1], ir::Full(0, s[1].shape())), {d});
    return {v, i};
  }
  Value vk = take(s[0], (n - 1) / 2), ik = take(s[1], (n - 1) / 2);
  if (!ir::IsFloating(x.dtype())) return {vk, ik};
  Value last = take(s[0], n - 1);
  Value has_nan = ir::Compare(CompareDir::kNE, last, last);
  Value nan_count = ir::Reduce(ir::ReduceKind::kSum, Cast(ir::Compare(CompareDir::kNE, s[0], s[0]), DType::kS64), {d});
  Value first_nan_pos = ir::Binary(Op::kSub, ir::Full(static_cast<double>(n), nan_count.shape()), nan_count);
  Value at_pos = ir::Compare(CompareDir::kEQ, ir::Iota(ir::Shape(DType::kS64, x.dims()), d),
                             ir::BroadcastInDim(first_nan_pos, x.dims(), keep));
  Value first_nan = ir::Reduce(ir::ReduceKind::kSum, ir::Select(at_pos, s[1], ir::Full(0, s[1].shape())), {d});
  return {ir::Select(has_nan, last, vk), ir::Select(has_nan, first_nan, ik)};
}

// Moves dims d1, d2 last; returns the permutation.
std::vector<int64_t> DiagPerm(int r, int64_t d1, int64_t d2) {
  std::vector<int64_t> perm;
  for (int i = 0; i < r; ++i) if (i != d1 && i != d2) perm.push_back(i);
  perm.push_back(d1);
  perm.push_back(d2);
  return perm;
}

// [L, 2] coordinates of the diagonal with `offset` in an [n, m] matrix.
Value DiagCoords(int64_t n, int64_t m, int64_t offset, int64_t* len) {
  int64_t r0 = std::max<int64_t>(0, -offset), c0 = std::max<int64_t>(0, offset);
  int64_t L = std::max<int64_t>(0, std::min(n - r0, m - c0));
  *len = L;
  ir::Shape is(DType::kS64, {L, 1});
  Value i = ir::Iota(is, 0);
  Value rows_ = ir::Binary(Op::kAdd, i, ir::Full(static_cast<double>(r0), is));
  Value cols = ir::Binary(Op::kAdd, i, ir::Full(static_cast<double>(c0), is));
  return ir::Concatenate({rows_, cols}, 1);
}

Value Diagonal(const Value& x, int64_t offset, int64_t d1, int64_t d2) {
  int r = x.rank();
  d1 = ir::NormalizeDim(d1, r);
  d2 = ir::NormalizeDim(d2, r);
  if (d1 == d2) throw ir::ShapeError("diagonal dimensions cannot be identical " + std::to_string(d1) + ", " + std::to_string(d2));
  Value t = ir::Transpose(x, DiagPerm(r, d1, d2));
  int64_t n = t.dims()[r - 2], m = t.dims()[r - 1], L;
  Value coords = DiagCoords(n, m, offset, &L);
  std::vector<int64_t> batch(t.dims().begin(), t.dims().end() - 2), out = batch;
  out.push_back(L);
  if (L == 0) return ir::Full(0, ir::Shape(x.dtype(), out));
  std::vector<int64_t> sizes = batch, offset_dims;
  sizes.push_back(1);
  sizes.push_back(1);
  for (size_t k = 0; k < batch.size(); ++k) offset_dims.push_back(static_cast<int64_t>(k));
  Value g = ir::Gather(t, coords, offset_dims, {r - 2, r - 1}, {r - 2, r - 1}, 1, sizes);  // [batch..., L]
  return g;
}

Value DiagonalScatter(const Value& self, const Value& src, int64_t offset, int64_t d1, int64_t d2) {
  int r = self.rank();
  d1 = ir::NormalizeDim(d1, r);
  d2 = ir::NormalizeDim(d2, r);
  std::vector<int64_t> perm = DiagPerm(r, d1, d2), inv(r);
  for (int i = 0; i < r; ++i) inv[perm[i]] = i;
  Value t = ir::Transpose(self, perm);
  int64_t n = t.dims()[r - 2], m = t.dims()[r - 1], L;
  Value coords = DiagCoords(n, m, offset, &L);
  if (L == 0) return self;
  // updates [batch..., L] -> scatter with the diagonal position as the scatter dim (last).
  std::vector<int64_t> window;
  for (int k = 0; k < r - 2; ++k) window.push_back(k);
  Value s = ir::Scatter(t, coords, Cast(src, self.dtype()), window, {r - 2, r - 1}, {r - 2, r - 1}, 1, 0);
  return ir::Transpose(s, inv);
}

Value VectorNorm(const Value& x, double ord, const std::optional<std::vector<int64_t>>& dims_opt, bool keepdim,
                 std::optional<DType> dtype) {
  DType t = dtype.value_or(FloatOf(x.dtype()));
  // f16/bf16 accumulate in float32 and round once, as eager's kernels do.
  DType out_t = t;
  t = OpMath(t);
  Value xc = ir::Unary(Op::kAbs, Cast(x, t));
  std::vector<int64_t> dims = (!dims_opt || dims_opt->empty()) ? AllDims(x.rank()) : ir::NormalizeDims(*dims_opt, x.rank());
  // Eager's is_reduce_over_1D_vector: every reduced dim has size 1 (a 0-dim tensor only when no dim
  // is given), so each norm is over one element.
  bool one_element = x.rank() > 0 || !dims_opt || dims_opt->empty();
  if (x.rank() > 0) {
    for (int64_t d : dims) one_element = one_element && x.dims()[d] == 1;
  }
  Value r;
  if (one_element && ord != 0) {
    // one element per norm: eager gives |x| itself, where |x|^p and its p-th root over- or
    // underflow (norm(2) of [1e30] is 1e30, not inf; fuzz seed 73232)
    r = ir::Reduce(ir::ReduceKind::kSum, xc, dims);
  } else if (std::isinf(ord)) {
    r = ir::Reduce(ord > 0 ? ir::ReduceKind::kMax : ir::ReduceKind::kMin, xc, dims);
  } else if (ord == 0) {
    r = ir::Reduce(ir::ReduceKind::kSum, Cast(ir::Compare(CompareDir::kNE, xc, ir::Full(0, xc.shape())), t), dims);
  } else if (ord == 1) {
    r = ir::Reduce(ir::ReduceKind::kSum, xc, dims);
  } else if (ord == 2) {
    r = ir::Unary(Op::kSqrt, ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kMul, xc, xc), dims));
  } else {
    Value p = ir::Binary(Op::kPow, xc, ir::Full(ord, xc.shape()));
    Value s = ir::Reduce(ir::ReduceKind::kSum, p, dims);
    r = ir::Binary(Op::kPow, s, ir::Full(1.0 / ord, s.shape()));
  }
  r = Cast(r, out_t);
  return keepdim ? KeepDims(r, x.dims(), dims) : r;
}

OpFn FmodLike(bool python_remainder, bool scalar) {
  return [=](OpArgs& a) -> V {
    const TensorArg& self = a.T(0);
    DType t = scalar ? ResultType({&self}, {&a.S(1)}) : ResultType({&self, &a.T(1)});
    Value x = Cast(self.v, t), y = scalar ? ScalarV(a.S(1), t, a.device) : Cast(a.V(1), t);
    auto dims = BroadcastShapes(x.dims(), y.dims());
    if (ir::IsIntegral(t, true) && ProductOf(dims) > 0) {  // eager's check runs per element
      if (scalar && a.S(1).AsDouble() == 0) a.Fail("ZeroDivisionError");
      if (!scalar) CheckNonZeroDivisor(y, a.device);
    }
    x = BroadcastTo(x, dims);
    y = BroadcastTo(y, dims);
    Value r = ir::Binary(Op::kRem, x, y);
    if (!python_remainder) return {r};
    // Python's remainder takes the divisor's sign.
    Value zero = ir::Full(0, r.shape());
    Value fix = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kNE, r, zero),
                           ir::Compare(CompareDir::kNE, ir::Compare(CompareDir::kLT, r, zero),
                                       ir::Compare(CompareDir::kLT, y, zero)));
    return {ir::Select(fix, ir::Binary(Op::kAdd, r, y), r)};
  };
}

OpFn Bitwise(Op op, bool scalar) {
  return [=](OpArgs& a) -> V {
    const TensorArg& self = a.T(0);
    DType t = scalar ? ResultType({&self}, {&a.S(1)}) : ResultType({&self, &a.T(1)});
    if (ir::IsFloating(t)) a.Fail("bitwise ops are only defined for integer and bool tensors");
    Value y = scalar ? ScalarV(a.S(1), t, a.device) : Cast(a.V(1), t);
    return {Bin(op, Cast(self.v, t), y)};
  };
}

OpFn ReduceBool(ir::ReduceKind kind, bool with_dim) {
  return [=](OpArgs& a) -> V {
    Value x = Cast(a.V(0), DType::kPred);
    if (!with_dim) {
      Value r = ir::Reduce(kind, x, AllDims(x.rank()));
      return {a.V(0).dtype() == DType::kU8 ? Cast(r, DType::kU8) : r};
    }
    if (x.rank() == 0) return {x};
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    Value r = ir::Reduce(kind, x, {d});
    Value out = a.Bool(2) ? KeepDims(r, x.dims(), {d}) : r;
    return {a.V(0).dtype() == DType::kU8 ? Cast(out, DType::kU8) : out};
  };
}

}  // namespace

// x's dim `dim` (size I) mapped through m [O, I]: the result has O at `dim`.
Value ThroughMatrix(const Value& x, int64_t dim, const Value& m) {
  Value y = ir::DotGeneral(x, m, {}, {}, {dim}, {1}, x.dtype());  // [x's other dims..., O]
  int r = x.rank();
  std::vector<int64_t> perm;
  for (int p = 0; p < r; ++p) perm.push_back(p < dim ? p : p == dim ? r - 1 : p - 1);
  return ir::Transpose(y, perm);
}

// Bicubic taps along one dim (eager's upsample_bicubic2d: A = -0.75, source index not clamped at
// 0, taps at clamp(floor(src) - 1 + k, 0, in - 1)): indices [4][out] (i64) and weights [4][out].
struct CubicTaps {
  Value idx[4], w[4];
};
CubicTaps CubicTapsOf(int64_t out, int64_t in, bool align_corners, std::optional<double> scale, DType t) {
  ir::Shape fs(t, {out});
  auto C = [&](double v) { return ir::Full(v, fs); };
  Value o = ir::Iota(fs, 0);
  Value src;
  if (align_corners) {
    double s = out > 1 ? static_cast<double>(in - 1) / (out - 1) : 0.0;
    src = ir::Binary(Op::kMul, C(s), o);
  } else {
    double s = scale && *scale > 0 ? 1.0 / *scale : static_cast<double>(in) / out;
    src = ir::Binary(Op::kSub, ir::Binary(Op::kMul, C(s), ir::Binary(Op::kAdd, o, C(0.5))), C(0.5));
  }
  Value fl = ir::Unary(Op::kFloor, src);
  Value tt = ir::Binary(Op::kSub, src, fl);
  const double A = -0.75;
  auto mul = [](const Value& a, const Value& b) { return ir::Binary(Op::kMul, a, b); };
  auto add = [](const Value& a, const Value& b) { return ir::Binary(Op::kAdd, a, b); };
  auto sub = [](const Value& a, const Value& b) { return ir::Binary(Op::kSub, a, b); };
  // cubic_convolution1(x) = ((A + 2) x - (A + 3)) x x + 1; cubic_convolution2(x) = ((A x - 5A) x + 8A) x - 4A
  auto c1 = [&](const Value& x) { return add(mul(mul(sub(mul(C(A + 2), x), C(A + 3)), x), x), C(1)); };
  auto c2 = [&](const Value& x) { return sub(mul(add(mul(sub(mul(C(A), x), C(5 * A)), x), C(8 * A)), x), C(4 * A)); };
  CubicTaps c;
  c.w[0] = c2(add(tt, C(1)));
  c.w[1] = c1(tt);
  Value one_m = sub(C(1), tt);
  c.w[2] = c1(one_m);
  c.w[3] = c2(add(one_m, C(1)));
  ir::Shape is(DType::kS64, {out});
  Value base = ir::Convert(fl, DType::kS64);
  for (int k = 0; k < 4; ++k) {
    c.idx[k] = ir::Clamp(ir::Full(0, is), ir::Binary(Op::kAdd, base, ir::Full(k - 1, is)), ir::Full(static_cast<double>(in - 1), is));
  }
  return c;
}

// Bicubic resampling along one dim: sum_k w_k * x[idx_k] (eager's arithmetic: 0 * inf stays NaN).
Value Cubic1d(const Value& x, int64_t dim, int64_t out, bool align_corners, std::optional<double> scale) {
  CubicTaps c = CubicTapsOf(out, x.dims()[dim], align_corners, scale, x.dtype());
  std::vector<int64_t> od = x.dims();
  od[dim] = out;
  Value sum;
  for (int k = 0; k < 4; ++k) {
    Value term = ir::Binary(Op::kMul, GatherAlong(x, dim, c.idx[k]), ir::BroadcastInDim(c.w[k], od, {dim}));
    sum = sum ? ir::Binary(Op::kAdd, sum, term) : term;
  }
  return sum;
}

// [out, in] matrix of bicubic resampling along one dim (clamped taps add up).
Value CubicMatrix(int64_t out, int64_t in, bool align_corners, std::optional<double> scale, DType t) {
  CubicTaps c = CubicTapsOf(out, in, align_corners, scale, t);
  ir::Shape ms(DType::kS64, {out, in});
  Value col = ir::Iota(ms, 1);
  Value m = ir::Full(0, ir::Shape(t, {out, in}));
  for (int k = 0; k < 4; ++k) {
    Value hit = ir::Compare(CompareDir::kEQ, col, ir::BroadcastInDim(c.idx[k], {out, in}, {0}));
    m = ir::Binary(Op::kAdd, m, ir::Select(hit, ir::BroadcastInDim(c.w[k], {out, in}, {0}), ir::Full(0, m.shape())));
  }
  return m;
}

void AddIndexRows(std::vector<OpRow>& rows) {
  rows.push_back({"tril", [](OpArgs& a) -> V { return {Triangle(a.V(0), a.Int(1), true)}; }});
  rows.push_back({"triu", [](OpArgs& a) -> V { return {Triangle(a.V(0), a.Int(1), false)}; }});

  rows.push_back({"linalg_vector_norm", [](OpArgs& a) -> V {
    return {VectorNorm(a.V(0), a.S(1).AsDouble(), a.OptInts(2), a.Bool(3), a.OptDType(4))};
  }});
  rows.push_back({"norm.Scalar", [](OpArgs& a) -> V {
    return {VectorNorm(a.V(0), a.IsNone(1) ? 2.0 : a.S(1).AsDouble(), std::nullopt, false, std::nullopt)};
  }});
  rows.push_back({"norm.ScalarOpt_dim", [](OpArgs& a) -> V {
    return {VectorNorm(a.V(0), a.IsNone(1) ? 2.0 : a.S(1).AsDouble(), a.OptInts(2), a.Bool(3), std::nullopt)};
  }});
  rows.push_back({"norm.ScalarOpt_dim_dtype", [](OpArgs& a) -> V {
    return {VectorNorm(a.V(0), a.IsNone(1) ? 2.0 : a.S(1).AsDouble(), a.OptInts(2), a.Bool(3), a.OptDType(4))};
  }});
  rows.push_back({"var.correction", [](OpArgs& a) -> V {
    auto c = a.OptS(2);
    return {Moment(a.V(0), a.OptInts(1), c ? c->AsDouble() : 1.0, a.Bool(3))};
  }});
  rows.push_back({"std.correction", [](OpArgs& a) -> V {
    auto c = a.OptS(2);
    return {Moment(a.V(0), a.OptInts(1), c ? c->AsDouble() : 1.0, a.Bool(3), /*sqrt=*/true)};
  }});
  rows.push_back({"prod", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType t = a.OptDType(1).value_or(ir::IsIntegral(x.dtype(), true) ? DType::kS64 : x.dtype());
    return {ir::Reduce(ir::ReduceKind::kProd, Cast(x, t), AllDims(x.rank()))};
  }});
  rows.push_back({"prod.dim_int", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType t = a.OptDType(3).value_or(ir::IsIntegral(x.dtype(), true) ? DType::kS64 : x.dtype());
    if (x.rank() == 0) return {Cast(x, t)};
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    Value r = ir::Reduce(ir::ReduceKind::kProd, Cast(x, t), {d});
    return {a.Bool(2) ? KeepDims(r, x.dims(), {d}) : r};
  }});
  rows.push_back({"diagonal_copy", [](OpArgs& a) -> V { return {Diagonal(a.V(0), a.Int(1), a.Int(2), a.Int(3))}; }});
  rows.push_back({"diagonal_scatter", [](OpArgs& a) -> V {
    return {DiagonalScatter(a.V(0), a.V(1), a.Int(2), a.Int(3), a.Int(4))};
  }});
  rows.push_back({"all", ReduceBool(ir::ReduceKind::kAnd, false)});
  rows.push_back({"any", ReduceBool(ir::ReduceKind::kOr, false)});
  rows.push_back({"all.dim", ReduceBool(ir::ReduceKind::kAnd, true)});
  rows.push_back({"any.dim", ReduceBool(ir::ReduceKind::kOr, true)});

  rows.push_back({"gather", [](OpArgs& a) -> V {
    Value x = a.V(0);
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    CheckDim(x, d, a.V(2), "gather", a.device);
    return {GatherDim(x, d, a.V(2))};
  }});
  rows.push_back({"scatter.src", [](OpArgs& a) -> V {
    Value x = a.V(0);
    CheckDim(x, ir::NormalizeDim(a.Int(1), x.rank()), a.V(2), "scatter", a.device);
    return {ScatterDim(x, ir::NormalizeDim(a.Int(1), x.rank()), a.V(2), a.V(3), false)};
  }});
  rows.push_back({"scatter.value", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(2);
    CheckDim(x, ir::NormalizeDim(a.Int(1), x.rank()), idx, "scatter", a.device);
    Value v = BroadcastTo(ScalarV(a.S(3), x.dtype(), a.device), idx.dims());
    return {ScatterDim(x, ir::NormalizeDim(a.Int(1), x.rank()), idx, v, false)};
  }});
  rows.push_back({"scatter.reduce", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(2);
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    CheckDim(x, d, idx, "scatter", a.device);
    return {ScatterReduce(x, d, idx, a.V(3), a.Str(4), a)};
  }});
  rows.push_back({"scatter.value_reduce", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(2);
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    CheckDim(x, d, idx, "scatter", a.device);
    Value v = BroadcastTo(ScalarV(a.S(3), x.dtype(), a.device), idx.dims());
    return {ScatterReduce(x, d, idx, v, a.Str(4), a)};
  }});
  rows.push_back({"scatter_reduce.two", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(2), src = a.V(3);
    std::string reduce = a.Str(4);
    if (x.dtype() == DType::kPred && reduce != "mean" && src.dtype() == x.dtype() && !ir::IsFloating(idx.dtype())) {
      // bool: sum and amax are or, prod and amin are and (eager's += and *= on bool).
      int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
      CheckDim(x, d, idx, "scatter_reduce", a.device);
      bool any = reduce == "sum" || reduce == "amax";
      Value base = x;
      if (!a.Bool(5, true) && idx.shape().numel()) {
        Value reached = ScatterCombine(ir::Full(0, x.shape()), d, idx, ir::Full(1, ir::Shape(DType::kPred, idx.dims())), 0);
        base = ir::Select(reached, ir::Full(any ? 0 : 1, x.shape()), x);
      }
      return {ScatterCombine(base, d, idx, src, any ? 1 : 2)};
    }
    if (x.dtype() == DType::kPred || ir::IsComplex(x.dtype()) || x.dtype() == DType::kU16 ||
        x.dtype() == DType::kU32 || x.dtype() == DType::kU64) {
      throw NotLowered{};
    }
    if (reduce != "sum" && reduce != "prod" && reduce != "mean" && reduce != "amax" && reduce != "amin") {
      throw NotLowered{};  // eager's error
    }
    if (src.dtype() != x.dtype() || ir::IsFloating(idx.dtype())) throw NotLowered{};  // eager's errors
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    CheckDim(x, d, idx, "scatter_reduce", a.device);
    return {ScatterReduceTwo(x, d, idx, src, reduce, a.Bool(5, true))};
  }});
  // index_reduce: scatter_reduce with the 1-d index spread over source's other dims (same reductions,
  // include_self and NaN rules); eager checks the indices itself ("index out of range in self", no wrapping).
  rows.push_back({"index_reduce", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(2), src = a.V(3);
    const std::string reduce = a.Str(4);
    if (reduce != "prod" && reduce != "mean" && reduce != "amax" && reduce != "amin") throw NotLowered{};
    const bool scalar = x.rank() == 0;  // a 0-d self and source: as one-element vectors
    if (scalar) {
      if (src.rank() != 0 || idx.rank() > 1 || idx.shape().numel() != 1) throw NotLowered{};
      x = ir::Reshape(x, {1});
      src = ir::Reshape(src, {1});
      idx = ir::Reshape(idx, {1});
    }
    if ( idx.rank() != 1 || src.rank() != x.rank() || src.dtype() != x.dtype() ||
        (idx.dtype() != DType::kS64 && idx.dtype() != DType::kS32) || x.dtype() == DType::kPred ||
        ir::IsComplex(x.dtype()) || x.dtype() == DType::kU16 || x.dtype() == DType::kU32 || x.dtype() == DType::kU64) {
      throw NotLowered{};  // eager's errors, or types scatter_reduce does not lower
    }
    // float16/bfloat16 prod/mean: eager rounds after every step, scatter_reduce accumulates in float32
    if ((reduce == "prod" || reduce == "mean") && (x.dtype() == DType::kF16 || x.dtype() == DType::kBF16)) {
      throw NotLowered{};
    }
    const int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    if (src.dims()[d] != idx.dims()[0]) throw NotLowered{};
    for (int k = 0; k < x.rank(); ++k) if (k != d && src.dims()[k] != x.dims()[k]) throw NotLowered{};
    if (idx.shape().numel() == 0) return {scalar ? ir::Reshape(x, {}) : x};
    CheckIndexRange(idx, 0, x.dims()[d], "index out of range in self", a.device);
    Value full = ir::BroadcastInDim(idx, src.dims(), {d});
    Value r = ScatterReduceTwo(x, d, full, src, reduce, a.Bool(5, true));
    return {scalar ? ir::Reshape(r, {}) : r};
  }});
  // index_copy: self's slices at index[i] along dim take source's slice i (a scatter).
  rows.push_back({"index_copy", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(2), src = a.V(3);
    if (idx.rank() > 1 || idx.dtype() != DType::kS64 || src.dtype() != x.dtype()) throw NotLowered{};
    if (x.rank() == 0) {  // one element: index [0] (or none) and a one-element source
      if (idx.shape().numel() == 0) return {x};
      if (idx.shape().numel() != 1 || src.shape().numel() != 1) throw NotLowered{};
      CheckIndexRange(idx, 0, 1, "index_copy_(): index out of bounds for dimension 0 with size 1", a.device);
      return {ir::Reshape(src, {})};
    }
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    int64_t m = idx.shape().numel();
    std::vector<int64_t> want = x.dims();
    want[d] = m;
    if (src.dims() != want) throw NotLowered{};  // eager's size errors
    if (m == 0) return {x};
    int64_t n = x.dims()[d];
    CheckIndexRange(idx, 0, n, "index_copy_(): index out of bounds for dimension " + std::to_string(d) +
                    " with size " + std::to_string(n), a.device);
    Value full = ir::BroadcastInDim(ir::Reshape(idx, {m}), src.dims(), {d});
    return {ScatterCombine(x, d, full, src, 0)};
  }});
  // put: self.flatten()[index] = (or +=) source, negative indices wrapping.
  rows.push_back({"put", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(1), src = a.V(2);
    bool acc = a.Bool(3);
    if (idx.dtype() != DType::kS64 || src.dtype() != x.dtype()) throw NotLowered{};
    int64_t m = idx.shape().numel(), n = x.shape().numel();
    if (src.shape().numel() != m) throw NotLowered{};  // eager's error
    if (m == 0) return {x};
    if (n == 0) throw NotLowered{};
    CheckIndexRange(idx, -n, n, "put_(): index out of range", a.device);
    Value i = ir::Reshape(idx, {m});
    i = ir::Select(ir::Compare(CompareDir::kLT, i, ir::Full(0, i.shape())),
                   ir::Binary(Op::kAdd, i, ir::Full(static_cast<double>(n), i.shape())), i);
    Value flat = ir::Reshape(x, {n});
    Value r = ir::Scatter(flat, ir::Reshape(i, {m, 1}), ir::Reshape(src, {m}), {}, {0}, {0}, 1, acc ? 1 : 0);
    return {ir::Reshape(r, x.dims())};
  }});
  // masked_scatter: the k-th True position (row-major) takes source.flatten()[k].
  rows.push_back({"masked_scatter", [](OpArgs& a) -> V {
    Value x = a.V(0), mask = a.V(1), src = a.V(2);
    if (mask.dtype() != DType::kPred || src.dtype() != x.dtype()) throw NotLowered{};
    auto dims = BroadcastShapes(x.dims(), mask.dims());
    x = BroadcastTo(x, dims);  // the out-of-place op expands self and mask to one shape
    int64_t n = x.shape().numel(), ns = src.shape().numel();
    if (n == 0) return {x};
    if (ns == 0) throw NotLowered{};
    Value mflat = ir::Reshape(BroadcastTo(mask, dims), {n});
    Value k = ir::Cumulative(ir::ReduceKind::kSum, Cast(mflat, DType::kS64), 0);
    graph::AddCheck(ir::Compare(CompareDir::kLE, ir::Reduce(ir::ReduceKind::kMax, k, {0}),
                                ir::ConstantInt(ns, DType::kS64)),
                    "masked_scatter: expected source to have at least as many elements as ones in mask", a.device,
                    /*runtime_error=*/true);
    k = ir::Clamp(ir::Full(0, k.shape()), ir::Binary(Op::kSub, k, ir::Full(1, k.shape())),
                  ir::Full(static_cast<double>(ns - 1), k.shape()));
    Value g = ir::Gather(ir::Reshape(src, {ns}), ir::Reshape(k, {n, 1}), {}, {0}, {0}, 1, {1});
    return {ir::Reshape(ir::Select(mflat, g, ir::Reshape(x, {n})), x.dims())};
  }});
  // renorm: each slice along dim whose p-norm exceeds maxnorm is scaled by maxnorm / (norm + 1e-7).
  rows.push_back({"renorm", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype()) || x.rank() == 0) throw NotLowered{};
    double p = a.S(1).AsDouble(), maxnorm = a.S(3).AsDouble();
    if (p <= 0 || maxnorm < 0) throw NotLowered{};  // eager's errors
    int64_t d = ir::NormalizeDim(a.Int(2), x.rank());
    std::vector<int64_t> others;
    for (int i = 0; i < x.rank(); ++i) if (i != d) others.push_back(i);
    DType ct = OpMath(x.dtype());
    Value xc = Cast(x, ct);
    Value norm = others.empty() ? ir::Unary(Op::kAbs, xc) : VectorNorm(xc, p, others, true, ct);
    Value big = ir::Compare(CompareDir::kGT, norm, ir::Full(maxnorm, norm.shape()));
    Value f = ir::Select(big, ir::Binary(Op::kDiv, ir::Full(maxnorm, norm.shape()),
                                         ir::Binary(Op::kAdd, norm, ir::Full(1e-7, norm.shape()))),
                         ir::Full(1, norm.shape()));
    return {Cast(ir::Binary(Op::kMul, xc, BroadcastTo(f, xc.dims())), x.dtype())};
  }});
  rows.push_back({"scatter_add", [](OpArgs& a) -> V {
    Value x = a.V(0);
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    CheckDim(x, d, a.V(2), "scatter_add", a.device);
    if (ReducedFloat(x.dtype())) return {ScatterInF32(x, d, a.V(2), a.V(3), 1)};
    return {ScatterDim(x, d, a.V(2), a.V(3), true)};
  }});
  auto index = [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& ix = a.TL(1);
    for (const auto& t : ix) {
      if (t.defined() && (t.v.dtype() == DType::kPred || t.v.dtype() == DType::kU8)) {
        throw NotLowered{};  // boolean mask: value-dependent shape, CPU
      }
    }
    return {IndexGather(x, PlanIndex(x, ix, a.device))};
  };
  rows.push_back({"index.Tensor", index});
  rows.push_back({"_unsafe_index.Tensor", index});
  auto index_put = [](OpArgs& a) -> V {
    auto MaskDims = [](const std::vector<int64_t>& d) { return ir::DimsToString(d); };
    Value x = a.V(0);
    const auto& ix = a.TL(1);
    for (const auto& t : ix) {
      if (t.defined() && (t.v.dtype() == DType::kPred || t.v.dtype() == DType::kU8)) {
        // x[mask] = v with a broadcastable v: a select, static shape.
        if (ix.size() == 1 && a.V(2).shape().numel() == 1) {
          // The mask covers the leading dims: align it there before broadcasting.
          std::vector<int64_t> md = t.v.dims();
          if (md.size() > x.dims().size()) throw IndexError("too many indices for tensor of dimension " + std::to_string(x.rank()));
          for (size_t j = 0; j < md.size(); ++j) {
            if (md[j] != x.dims()[j]) {
              throw IndexError("The shape of the mask " + MaskDims(t.v.dims()) + " at index " +
                               std::to_string(j) + " does not match the shape of the indexed tensor " +
                               MaskDims(x.dims()) + " at index " + std::to_string(j));
            }
          }
          while (static_cast<int>(md.size()) < x.rank()) md.push_back(1);
          Value m = BroadcastTo(ir::Reshape(Cast(t.v, DType::kPred), md), x.dims());
          Value v = BroadcastTo(Cast(ir::Reshape(a.V(2), {}), x.dtype()), x.dims());
          if (a.Bool(3)) v = ir::Binary(Op::kAdd, x, v);
          return {ir::Select(m, v, x)};
        }
        throw NotLowered{};  // mask with a non-scalar value: value-dependent shape, CPU
      }
    }
    return {IndexPut(x, PlanIndex(x, ix, a.device), a.V(2), a.Bool(3))};
  };
  rows.push_back({"index_put", index_put});
  rows.push_back({"_unsafe_index_put", index_put});
  rows.push_back({"_index_put_impl", index_put});

  rows.push_back({"sort", [](OpArgs& a) -> V { return SortWithIndices(a.V(0), a.Int(1), a.Bool(2)); }});
  rows.push_back({"sort.stable", [](OpArgs& a) -> V { return SortWithIndices(a.V(0), a.Int(2), a.Bool(3)); }});
  for (bool nan : {false, true}) {
    rows.push_back({nan ? "nanmedian" : "median", [nan](OpArgs& a) -> V {
      Value x = a.V(0);
      if (x.shape().numel() == 0) throw NotLowered{};  // eager's NaN of an empty tensor, on the CPU
      if (x.rank() == 0) return {x};
      return {MedianAlong(ir::Reshape(x, {x.shape().numel()}), 0, nan)[0]};
    }});
    rows.push_back({nan ? "nanmedian.dim" : "median.dim", [nan](OpArgs& a) -> V {
      Value x = a.V(0);
      if (x.rank() == 0) {
        ir::NormalizeDim(a.Int(1), 1);
        return {x, ir::ConstantInt(0, DType::kS64)};
      }
      int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
      if (x.dims()[d] == 0) a.Fail(std::string(nan ? "nanmedian" : "median") + "(): Expected reduction dim " + std::to_string(d) + " to have non-zero size.");
      V r = MedianAlong(x, d, nan);
      if (a.Bool(2)) {
        std::vector<int64_t> kd = x.dims();
        kd[d] = 1;
        r[0] = ir::Reshape(r[0], kd);
        r[1] = ir::Reshape(r[1], kd);
      }
      return r;
    }});
  }
  rows.push_back({"kthvalue", [](OpArgs& a) -> V {
    // The k-th smallest along dim (stable ascending sort, NaN last, as eager counts NaN largest).
    Value x = a.V(0);
    int64_t k = a.Int(1);
    if (x.rank() == 0) {
      if (k != 1) a.Fail("kthvalue(): selected number k out of range for dimension 0");
      return {x, ir::ConstantInt(0, DType::kS64)};
    }
    int64_t d = ir::NormalizeDim(a.Int(2), x.rank());
    if (k < 1 || k > x.dims()[d]) a.Fail("kthvalue(): selected number k out of range for dimension " + std::to_string(d));
    V s = SortWithIndices(x, d, false);
    std::vector<int64_t> st(x.rank(), 0), lim = x.dims(), str(x.rank(), 1), out = x.dims();
    st[d] = k - 1;
    lim[d] = k;
    if (!a.Bool(3)) out.erase(out.begin() + d);
    else out[d] = 1;
    return {ir::Reshape(ir::Slice(s[0], st, lim, str), out), ir::Reshape(ir::Slice(s[1], st, lim, str), out)};
  }});
  for (const char* name : {"_conj_copy", "_conj_physical"}) {
    rows.push_back({name, [](OpArgs& a) -> V {
      // conj(z) = re - (z - re): exact (z - re is i*im exactly), no overflow. Real tensors: a copy.
      Value z = a.V(0);
      if (!ir::IsComplex(z.dtype())) return {z};
      Value re = ir::Convert(ir::Unary(Op::kReal, z), z.dtype());
      return {ir::Binary(Op::kSub, re, ir::Binary(Op::kSub, z, re))};
    }});
  }
  rows.push_back({"topk", [](OpArgs& a) -> V {
    Value x = a.V(0);
    int64_t k = a.Int(1);
    if (x.rank() == 0) return {x, ir::ConstantInt(0, DType::kS64)};
    int64_t d = ir::NormalizeDim(a.Int(2), x.rank());
    if (k < 0 || k > x.dims()[d]) a.Fail("selected index k out of range");
    V s = SortWithIndices(x, d, a.Bool(3, true));
    std::vector<int64_t> st(x.rank(), 0), lim = x.dims(), str(x.rank(), 1);
    lim[d] = k;
    return {ir::Slice(s[0], st, lim, str), ir::Slice(s[1], st, lim, str)};
  }});

  rows.push_back({"remainder.Tensor", FmodLike(true, false)});
  rows.push_back({"remainder.Scalar", FmodLike(true, true)});
  rows.push_back({"fmod.Tensor", FmodLike(false, false)});
  rows.push_back({"fmod.Scalar", FmodLike(false, true)});
  for (auto [name, left, scalar] : {std::tuple{"bitwise_left_shift.Tensor", true, false},
                                     {"bitwise_left_shift.Tensor_Scalar", true, true},
                                     {"bitwise_right_shift.Tensor", false, false},
                                     {"bitwise_right_shift.Tensor_Scalar", false, true},
                                     {"__lshift__.Tensor", true, false}, {"__lshift__.Scalar", true, true},
                                     {"__rshift__.Tensor", false, false}, {"__rshift__.Scalar", false, true}}) {
    rows.push_back({name, [left = left, scalar = scalar](OpArgs& a) -> V {
      const TensorArg& self = a.T(0);
      DType t = scalar ? ResultType({&self}, {&a.S(1)}) : ResultType({&self, &a.T(1)});
      if (!ir::IsIntegral(t, false)) throw NotLowered{};  // float shifts: eager's own rules, on the CPU
      Value x = Cast(self.v, t), y = scalar ? ScalarV(a.S(1), t, a.device) : Cast(a.V(1), t);
      auto dims = BroadcastShapes(x.dims(), y.dims());
      x = BroadcastTo(x, dims);
      y = BroadcastTo(y, dims);
      // Eager: shifts by >= the bit width give 0 (left, or right of unsigned) or the sign (right).
      Op op = left ? Op::kShiftLeft : (ir::IsUnsigned(t) ? Op::kShiftRightLogical : Op::kShiftRightArithmetic);
      return {ir::Binary(op, x, y)};
    }});
  }
  rows.push_back({"bitwise_and.Tensor", Bitwise(Op::kAnd, false)});
  rows.push_back({"bitwise_or.Tensor", Bitwise(Op::kOr, false)});
  rows.push_back({"bitwise_xor.Tensor", Bitwise(Op::kXor, false)});
  rows.push_back({"bitwise_and.Scalar", Bitwise(Op::kAnd, true)});
  rows.push_back({"bitwise_or.Scalar", Bitwise(Op::kOr, true)});
  rows.push_back({"bitwise_xor.Scalar", Bitwise(Op::kXor, true)});
  rows.push_back({"isnan", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (ir::IsIntegral(x.dtype(), true)) return {ir::Full(0, ir::Shape(DType::kPred, x.dims()))};
    return {ir::Compare(CompareDir::kNE, x, x)};
  }});
  rows.push_back({"isinf", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (ir::IsIntegral(x.dtype(), true)) return {ir::Full(0, ir::Shape(DType::kPred, x.dims()))};
    return {ir::Compare(CompareDir::kEQ, ir::Unary(Op::kAbs, x), ir::Full(std::numeric_limits<double>::infinity(), x.shape()))};
  }});
  for (bool neg : {true, false}) {
    rows.push_back({neg ? "isneginf" : "isposinf", [neg](OpArgs& a) -> V {
      Value x = a.V(0);
      if (ir::IsIntegral(x.dtype(), true)) return {ir::Full(0, ir::Shape(DType::kPred, x.dims()))};
      double inf = std::numeric_limits<double>::infinity();
      return {ir::Compare(CompareDir::kEQ, x, ir::Full(neg ? -inf : inf, x.shape()))};
    }});
  }
  rows.push_back({"nan_to_num", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (ir::IsIntegral(x.dtype(), true)) return {x};
    double big = x.dtype() == DType::kF64 ? std::numeric_limits<double>::max()
               : x.dtype() == DType::kF16 ? 65504.0
               : x.dtype() == DType::kBF16 ? 3.3895313892515355e38 : std::numeric_limits<float>::max();
    double nan = a.OptDouble(1).value_or(0.0), pinf = a.OptDouble(2).value_or(big), ninf = a.OptDouble(3).value_or(-big);
    Value inf = ir::Full(std::numeric_limits<double>::infinity(), x.shape());
    Value r = ir::Select(ir::Compare(CompareDir::kNE, x, x), ir::Full(nan, x.shape()), x);
    r = ir::Select(ir::Compare(CompareDir::kEQ, x, inf), ir::Full(pinf, x.shape()), r);
    r = ir::Select(ir::Compare(CompareDir::kEQ, x, ir::Unary(Op::kNeg, inf)), ir::Full(ninf, x.shape()), r);
    return {r};
  }});
  rows.push_back({"log2", [](OpArgs& a) -> V {  // f16/bf16 in float32, rounded once, as eager
    DType t = FloatOf(a.V(0).dtype());
    Value x = Cast(a.V(0), OpMath(t));
    return {Cast(ir::Binary(Op::kDiv, ir::Unary(Op::kLog, x), ir::Full(M_LN2, x.shape())), t)};
  }});
  rows.push_back({"hardtanh", [](OpArgs& a) -> V {
    Value x = a.V(0);
    // ties keep x, as eager's clamp (see clamp in rows_elementwise.cc)
    return {Bin(Op::kMin, ScalarV(a.S(2), x.dtype(), a.device), Bin(Op::kMax, ScalarV(a.S(1), x.dtype(), a.device), x))};
  }});
  rows.push_back({"leaky_relu", [](OpArgs& a) -> V {
    // bf16/f16: eager multiplies in float32 by the slope as a float32 (not rounded to the dtype)
    Value x = a.V(0);
    DType t = x.dtype(), ct = OpMath(t);
    Value s = Cast(Bin(Op::kMul, Cast(x, ct), ScalarV(a.S(1), ct, a.device)), t);
    return {ir::Select(ir::Compare(CompareDir::kGT, x, ir::Full(0, x.shape())), x, s)};
  }});

  rows.push_back({"linspace", [](OpArgs& a) -> V {
    double s = a.S(0).AsDouble(), e = a.S(1).AsDouble();
    int64_t n = a.Int(2);
    if (n < 0) a.Fail("number of steps must be non-negative");
    DType t = a.OptDType(3).value_or(DType::kF32);
    ir::Shape fs(DType::kF64, {n});
    double step = n > 1 ? (e - s) / (n - 1) : 0.0;
    Value i = ir::Iota(fs, 0);
    // Eager fills the first half from start and the second half from end.
    Value fwd = ir::Binary(Op::kAdd, ir::Full(s, fs), ir::Binary(Op::kMul, i, ir::Full(step, fs)));
    Value bwd = ir::Binary(Op::kSub, ir::Full(e, fs), ir::Binary(Op::kMul, ir::Binary(Op::kSub, ir::Full(static_cast<double>(n - 1), fs), i), ir::Full(step, fs)));
    Value r = ir::Select(ir::Compare(CompareDir::kLT, i, ir::Full(static_cast<double>(n / 2), fs)), fwd, bwd);
    if (n == 1) r = ir::Full(s, fs);  // a single point is the start
    return {Cast(r, t)};  // integer dtypes truncate toward zero, as eager
  }});
  rows.push_back({"constant_pad_nd", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (a.Ints(1).size() % 2 != 0 || static_cast<int>(a.Ints(1).size() / 2) > x.rank()) {
      a.Fail("Length of pad should be even and at most twice the number of dimensions of the input");
    }
    return {PadConstant(x, a.Ints(1), ScalarV(a.S(2), x.dtype(), a.device))};
  }});
  for (const char* name : {"reflection_pad1d", "reflection_pad2d", "reflection_pad3d"}) {
    rows.push_back({name, [](OpArgs& a) -> V { return {PadIndexed(a.V(0), a.Ints(1), true)}; }});
  }
  for (const char* name : {"replication_pad1d", "replication_pad2d", "replication_pad3d"}) {
    rows.push_back({name, [](OpArgs& a) -> V { return {PadIndexed(a.V(0), a.Ints(1), false)}; }});
  }
  rows.push_back({"repeat", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& reps = a.Ints(1);
    if (reps.size() < static_cast<size_t>(x.rank())) {
      a.Fail("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor");
    }
    int r = static_cast<int>(reps.size()), off = r - x.rank();
    std::vector<int64_t> inter, bd, out;
    for (int d = 0; d < r; ++d) {
      int64_t sz = d < off ? 1 : x.dims()[d - off];
      inter.push_back(reps[d]);
      inter.push_back(sz);
      if (d >= off) bd.push_back(2 * d + 1);
      out.push_back(reps[d] * sz);
    }
    return {ir::Reshape(ir::BroadcastInDim(x, inter, bd), out)};
  }});
  rows.push_back({"roll", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& shifts = a.Ints(1);
    auto dims = a.Ints(2);
    if (x.rank() == 0) return {x};
    if (!dims.empty() && dims.size() != shifts.size()) {
      a.Fail("shifts and dimensions must align. shifts: " + std::to_string(shifts.size()) + ", dims:" +
             std::to_string(dims.size()));
    }
    if (dims.empty() && shifts.size() != 1) a.Fail("shifts must have one element when dims is empty");
    Value y = x;
    if (dims.empty()) {
      y = ir::Reshape(x, {x.shape().numel()});
      dims = {0};
    }
    for (size_t k = 0; k < dims.size(); ++k) {
      int64_t d = ir::NormalizeDim(dims[k], y.rank()), n = y.dims()[d];
      if (n == 0) continue;
      int64_t s = ((shifts[k] % n) + n) % n;
      if (s == 0) continue;
      std::vector<int64_t> st(y.rank(), 0), lim = y.dims(), str(y.rank(), 1);
      st[d] = n - s;
      Value tail = ir::Slice(y, st, lim, str);
      st[d] = 0;
      lim[d] = n - s;
      Value head = ir::Slice(y, st, lim, str);
      y = ir::Concatenate({tail, head}, d);
    }
    return {ir::Reshape(y, x.dims())};
  }});
  rows.push_back({"upsample_nearest2d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& os = a.Ints(1);
    int r = x.rank();
    DType ct = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    (void)ct;
    // Gathers (not 0/1 matrix products, which would turn inf into NaN).
    Value y = GatherAlong(x, r - 2, NearestIndex(os[0], x.dims()[r - 2], OptD(a, 2)));
    return {GatherAlong(y, r - 1, NearestIndex(os[1], x.dims()[r - 1], OptD(a, 3)))};
  }});
  rows.push_back({"_upsample_nearest_exact2d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& os = a.Ints(1);
    int r = x.rank();
    Value y = GatherAlong(x, r - 2, NearestIndex(os[0], x.dims()[r - 2], OptD(a, 2), true));
    return {GatherAlong(y, r - 1, NearestIndex(os[1], x.dims()[r - 1], OptD(a, 3), true))};
  }});
  rows.push_back({"_upsample_nearest_exact1d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {GatherAlong(x, x.rank() - 1, NearestIndex(a.Ints(1)[0], x.dims()[x.rank() - 1], OptD(a, 2), true))};
  }});
  rows.push_back({"upsample_nearest1d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {GatherAlong(x, x.rank() - 1, NearestIndex(a.Ints(1)[0], x.dims()[x.rank() - 1], OptD(a, 2)))};
  }});
  rows.push_back({"index_add", [](OpArgs& a) -> V {
    // out[..., index[i], ...] += alpha * source[..., i, ...]
    Value x = a.V(0), idx = a.V(2), src = a.V(3);
    int64_t d = ir::NormalizeDim(a.Int(1), std::max(x.rank(), 1));
    if (idx.rank() > 1) a.Fail("index_add_(): Index is supposed to be a vector");
    Value v = Cast(src, x.dtype());
    if (x.rank() == 0) {
      CheckIndexRange(idx, 0, 1, "index_add_(): index out of range", a.device);
      if (a.S(4).AsDouble() != 1.0) v = Bin(Op::kMul, v, ScalarV(a.S(4), x.dtype(), a.device));
      return {Bin(Op::kAdd, x, ir::Reshape(v, {}))};
    }
    CheckIndexRange(idx, 0, x.dims()[d], "index_add_(): index out of range", a.device);
    if (v.rank() == 0) v = ir::Reshape(v, {1});
    bool alpha_one = a.S(4).AsDouble() == 1.0;
    if (!alpha_one) v = Bin(Op::kMul, v, ScalarV(a.S(4), x.dtype(), a.device));
    Value ib = ir::BroadcastInDim(Cast(ir::Reshape(idx, {idx.shape().numel()}), DType::kS64), v.dims(), {d});
    // eager's CPU index_add takes scatter_add's path (float32 accumulation of float16 / bfloat16,
    // rounded once) for alpha 1, an int64 index and the first or last dim of a tensor of rank >= 2;
    // elsewhere it adds slice by slice, rounding after each addition (as the scatter below does)
    if (alpha_one && ReducedFloat(x.dtype()) && x.rank() >= 2 && (d == 0 || d == x.rank() - 1) &&
        idx.dtype() == DType::kS64) {
      return {ScatterInF32(x, d, ib, v, 1)};
    }
    return {ScatterDim(x, d, ib, v, true)};
  }});
  for (bool exact : {false, true}) {
    rows.push_back({exact ? "_upsample_nearest_exact2d_backward" : "upsample_nearest2d_backward", [exact](OpArgs& a) -> V {
      Value g = a.V(0);
      const auto& os = a.Ints(1);
      const auto& is = a.Ints(2);
      DType ct = g.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      if (ir::IsFloating(g.dtype()) && g.rank() == 4 && g.shape().numel() > 0 && is[2] > 0 && is[3] > 0 &&
          g.dims()[2] / is[2] <= 8 && g.dims()[3] / is[3] <= 8) {
        return {Cast(NearestBackwardSequential(g, is[2], is[3], OptD(a, 3), OptD(a, 4), ct, exact), g.dtype())};
      }
      Value ah = NearestMatrix(os[0], is[2], OptD(a, 3), ct, exact), aw = NearestMatrix(os[1], is[3], OptD(a, 4), ct, exact);
      return {Cast(ResampleLast2(Cast(g, ct), ir::Transpose(ah, {1, 0}), ir::Transpose(aw, {1, 0})), g.dtype())};
    }});
  }
  for (bool exact : {false, true}) {
    // 1-d: the 2-d gradient with a height of 1 (same summation order as eager's kernel).
    rows.push_back({exact ? "_upsample_nearest_exact1d_backward" : "upsample_nearest1d_backward", [exact](OpArgs& a) -> V {
      Value g = a.V(0);
      const auto& is = a.Ints(2);
      if (!ir::IsFloating(g.dtype()) || g.rank() != 3 || is.size() != 3 || g.shape().numel() == 0 || is[2] <= 0 ||
          g.dims()[2] / is[2] > 8) {
        throw NotLowered{};
      }
      DType ct = g.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      Value g4 = ir::Reshape(g, {g.dims()[0], g.dims()[1], 1, g.dims()[2]});
      Value r = NearestBackwardSequential(g4, 1, is[2], std::nullopt, OptD(a, 3), ct, exact);
      return {ir::Reshape(Cast(r, g.dtype()), {is[0], is[1], is[2]})};
    }});
  }
  rows.push_back({"upsample_bilinear2d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& os = a.Ints(1);
    bool ac = a.Bool(2);
    int r = x.rank();
    DType ct = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    if (x.shape().numel() == 0 || os[0] == 0 || os[1] == 0) {
      Value ah = LinearMatrix(os[0], x.dims()[r - 2], ac, OptD(a, 3), ct);
      Value aw = LinearMatrix(os[1], x.dims()[r - 1], ac, OptD(a, 4), ct);
      return {Cast(ResampleLast2(Cast(x, ct), ah, aw), x.dtype())};
    }
    Value y = Linear1d(Linear1d(Cast(x, ct), r - 2, os[0], ac, OptD(a, 3)), r - 1, os[1], ac, OptD(a, 4));
    return {Cast(y, x.dtype())};
  }});
  // Linear (1-d) and trilinear (3-d) resampling: Linear1d along each dim; the gradients through the
  // transposed interpolation matrices.
  for (int nsp : {1, 3}) {
    std::string name = nsp == 1 ? "upsample_linear1d" : "upsample_trilinear3d";
    rows.push_back({name, [nsp](OpArgs& a) -> V {
      Value x = a.V(0);
      const auto& os = a.Ints(1);
      bool ac = a.Bool(2);
      int r = x.rank();
      if (r != nsp + 2 || static_cast<int>(os.size()) != nsp || !ir::IsFloating(x.dtype())) throw NotLowered{};
      for (int i = 0; i < nsp; ++i) if (os[i] <= 0 || x.dims()[r - nsp + i] == 0) throw NotLowered{};
      if (x.shape().numel() == 0) throw NotLowered{};
      DType ct = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      Value y = Cast(x, ct);
      for (int i = 0; i < nsp; ++i) y = Linear1d(y, r - nsp + i, os[i], ac, OptD(a, 3 + i));
      return {Cast(y, x.dtype())};
    }});
    rows.push_back({name + "_backward", [nsp](OpArgs& a) -> V {
      Value g = a.V(0);
      const auto& os = a.Ints(1);
      const auto& is = a.Ints(2);
      bool ac = a.Bool(3);
      if (!ir::IsFloating(g.dtype())) throw NotLowered{};
      DType ct = g.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
      Value y = Cast(g, ct);
      for (int i = 0; i < nsp; ++i) {
        int64_t d = 2 + i;
        y = ThroughMatrix(y, d, ir::Transpose(LinearMatrix(os[i], is[d], ac, OptD(a, 4 + i), ct), {1, 0}));
      }
      return {Cast(y, g.dtype())};
    }});
  }
  rows.push_back({"upsample_bicubic2d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& os = a.Ints(1);
    bool ac = a.Bool(2);
    int r = x.rank();
    if (r != 4 || os.size() != 2 || !ir::IsFloating(x.dtype()) || x.shape().numel() == 0 || os[0] <= 0 || os[1] <= 0) {
      throw NotLowered{};
    }
    DType ct = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    // Eager interpolates along W first (four rows), then along H.
    Value y = Cubic1d(Cubic1d(Cast(x, ct), 3, os[1], ac, OptD(a, 4)), 2, os[0], ac, OptD(a, 3));
    return {Cast(y, x.dtype())};
  }});
  rows.push_back({"upsample_bicubic2d_backward", [](OpArgs& a) -> V {
    Value g = a.V(0);
    const auto& os = a.Ints(1);
    const auto& is = a.Ints(2);
    bool ac = a.Bool(3);
    if (!ir::IsFloating(g.dtype())) throw NotLowered{};
    DType ct = g.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value ah = CubicMatrix(os[0], is[2], ac, OptD(a, 4), ct), aw = CubicMatrix(os[1], is[3], ac, OptD(a, 5), ct);
    return {Cast(ResampleLast2(Cast(g, ct), ir::Transpose(ah, {1, 0}), ir::Transpose(aw, {1, 0})), g.dtype())};
  }});
  rows.push_back({"upsample_bilinear2d_backward", [](OpArgs& a) -> V {
    Value g = a.V(0);
    const auto& os = a.Ints(1);
    const auto& is = a.Ints(2);
    bool ac = a.Bool(3);
    DType ct = g.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value ah = LinearMatrix(os[0], is[2], ac, OptD(a, 4), ct), aw = LinearMatrix(os[1], is[3], ac, OptD(a, 5), ct);
    return {Cast(ResampleLast2(Cast(g, ct), ir::Transpose(ah, {1, 0}), ir::Transpose(aw, {1, 0})), g.dtype())};
  }});
}

}  // namespace txla::ops
