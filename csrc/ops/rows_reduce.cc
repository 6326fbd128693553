// Op table rows: reductions and matrix products.
#include <numeric>

#include <limits>

#include "ops/rows.h"

namespace txla::ops {

using ir::Op;
using V = std::vector<Value>;

namespace {

std::vector<int64_t> AllDims(const Value& x) {
  std::vector<int64_t> d(x.rank());
  std::iota(d.begin(), d.end(), 0);
  return d;
}

DType SumType(const Value& x, std::optional<DType> dt) {
  if (dt) return *dt;
  return ir::IsIntegral(x.dtype(), true) ? DType::kS64 : x.dtype();
}

std::vector<int64_t> DimsOrAll(const OpArgs& a, size_t k, const Value& x) {
  auto d = a.OptInts(k);
  if (!d || d->empty()) return AllDims(x);
  return ir::NormalizeDims(*d, x.rank());
}

Value MinMax(ir::ReduceKind kind, const Value& x, const std::vector<int64_t>& dims, bool keepdim) {
  for (int64_t d : dims) {
    if (x.rank() > 0 && x.dims()[d] == 0) {
      throw IndexError("Expected reduction dim " + std::to_string(d) + " to have non-zero size.");
    }
  }
  Value r = ir::Reduce(kind, x, dims);
  return keepdim ? KeepDims(r, x.dims(), dims) : r;
}

V ArgMinMax(const OpArgs& a, ir::ArgKind kind) {
  Value x = a.V(0);
  auto dim = a.OptInt(1);
  bool keepdim = a.Bool(2);
  if (!dim && x.shape().numel() == 0) throw IndexError("Expected reduction dim to be specified for input.numel() == 0.");
  if (!dim) {
    Value flat = ir::Reshape(x, {x.shape().numel()});
    Value idx = ir::ArgReduce(kind, flat, 0).second;
    if (keepdim) return {ir::Reshape(idx, std::vector<int64_t>(x.rank(), 1))};
    return {idx};
  }
  if (x.rank() == 0) return {ir::ConstantInt(0, DType::kS64)};
  int64_t d = ir::NormalizeDim(*dim, x.rank());
  if (x.dims()[d] == 0) throw IndexError("Expected reduction dim " + std::to_string(d) + " to have non-zero size.");
  if (x.shape().numel() == 0) {  // another dimension is empty: an empty result
    std::vector<int64_t> dims = x.dims();
    if (keepdim) dims[d] = 1;
    else dims.erase(dims.begin() + d);
    return {ir::Full(0, ir::Shape(DType::kS64, dims))};
  }
  Value idx = ir::ArgReduce(kind, x, d).second;
  return {keepdim ? KeepDims(idx, x.dims(), {d}) : idx};
}

V MinMaxDim(const OpArgs& a, ir::ArgKind kind) {
  Value x = a.V(0);
  bool keepdim = a.Bool(2);
  if (x.rank() == 0) return {x, ir::ConstantInt(0, DType::kS64)};
  int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
  if (x.dims()[d] == 0) throw IndexError("Expected reduction dim " + std::to_string(d) + " to have non-zero size.");
  auto [vals, idx] = ir::ArgReduce(kind, x, d);
  if (keepdim) return {KeepDims(vals, x.dims(), {d}), KeepDims(idx, x.dims(), {d})};
  return {vals, idx};
}

// addmm/baddbmm/addmv: beta * self + alpha * product (args 0, 3, 4), beta == 0 ignoring self.
// bf16/f16: eager's CPU gemm accumulates in float32 and computes alpha * product + beta * self there,
// rounding once; rounding the product first and adding self after gave F.linear's bias add two
// roundings (a quarter of a bf16 Linear's outputs 1 ulp off). `x` and `y` go into the dot as float32
// (their products are exact there).
Value BetaSelfPlusAlphaReduced(const OpArgs& a, const Value& x, const Value& y,
                               const std::function<Value(const Value&, const Value&)>& dot) {
  DType t = x.dtype();
  Value m = dot(Cast(x, DType::kF32), Cast(y, DType::kF32));
  if (a.S(4).AsDouble() != 1.0) m = Bin(Op::kMul, m, ScalarV(a.S(4), DType::kF32, a.device));
  double beta = a.S(3).AsDouble();
  if (beta != 0.0) {
    Value s = Cast(Cast(a.V(0), t), DType::kF32);
    if (beta != 1.0) s = Bin(Op::kMul, s, ScalarV(a.S(3), DType::kF32, a.device));
    m = Bin(Op::kAdd, BroadcastTo(s, m.dims()), m);
  }
  return Cast(m, t);
}

bool ReducedFloatGemm(const Value& x, const Value& y) {
  return x.dtype() == y.dtype() && (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16);
}

Value BetaSelfPlusAlpha(const OpArgs& a, Value m) {
  DType t = m.dtype();
  if (a.S(4).AsDouble() != 1.0) m = Bin(Op::kMul, m, ScalarV(a.S(4), t, a.device));
  double beta = a.S(3).AsDouble();
  if (beta == 0.0) return m;
  Value s = Cast(a.V(0), t);
  if (beta != 1.0) s = Bin(Op::kMul, s, ScalarV(a.S(3), t, a.device));
  return Bin(Op::kAdd, BroadcastTo(s, m.dims()), m);
}

Value BatchedMatmul(const Value& a, const Value& b) {
  return ir::DotGeneral(a, b, {0}, {0}, {2}, {1}, a.dtype());
}

}  // namespace

void AddReductionRows(std::vector<OpRow>& rows) {
  rows.push_back({"sum", [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {SumDims(x, AllDims(x), false, SumType(x, a.OptDType(1)))};
  }});
  rows.push_back({"sum.dim_IntList", [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {SumDims(x, DimsOrAll(a, 1, x), a.Bool(2), SumType(x, a.OptDType(3)))};
  }});
  auto mean = [](const Value& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dt,
                 const OpArgs& a) -> Value {
    DType t = dt ? *dt : x.dtype();
    if (!ir::IsFloating(t) && !ir::IsComplex(t)) {
      a.Fail("mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. "
             "Got: " + std::string(ir::DTypeName(x.dtype())));
    }
    int64_t count = 1;
    if (x.rank() > 0) for (int64_t d : dims) count *= x.dims()[d];
    // bf16/f16: eager's CPU mean sums in float32, divides in float32 and rounds once (dividing the
    // rounded sum by the count in the reduced dtype was off, and 333 is 332 in bfloat16)
    DType acc = t == DType::kBF16 || t == DType::kF16 ? DType::kF32 : t;
    Value s = SumDims(x, dims, keepdim, acc);
    // the count as a device scalar, not a constant: XLA rewrites a division by a constant into a
    // multiplication by its reciprocal, which is not eager's correctly rounded sum / count
    return Cast(Bin(Op::kDiv, s, ScalarV(static_cast<double>(count), acc, a.device)), t);
  };
  rows.push_back({"mean", [mean](OpArgs& a) -> V {
    Value x = a.V(0);
    return {mean(x, AllDims(x), false, a.OptDType(1), a)};
  }});
  rows.push_back({"mean.dim", [mean](OpArgs& a) -> V {
    Value x = a.V(0);
    return {mean(x, DimsOrAll(a, 1, x), a.Bool(2), a.OptDType(3), a)};
  }});
  rows.push_back({"max", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.shape().numel() == 0) a.Fail("max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
    return {MinMax(ir::ReduceKind::kMax, x, AllDims(x), false)};
  }});
  rows.push_back({"min", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.shape().numel() == 0) a.Fail("min(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
    return {MinMax(ir::ReduceKind::kMin, x, AllDims(x), false)};
  }});
  rows.push_back({"amax", [](OpArgs& a) -> V {
    Value x = a.V(0);
    auto d = a.OptInts(1);
    if ((!d || d->empty()) && x.shape().numel() == 0) {
      a.Fail("amax(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
    }
    return {MinMax(ir::ReduceKind::kMax, x, DimsOrAll(a, 1, x), a.Bool(2))};
  }});
  rows.push_back({"amin", [](OpArgs& a) -> V {
    Value x = a.V(0);
    auto d = a.OptInts(1);
    if ((!d || d->empty()) && x.shape().numel() == 0) {
      a.Fail("amin(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.");
    }
    return {MinMax(ir::ReduceKind::kMin, x, DimsOrAll(a, 1, x), a.Bool(2))};
  }});
  rows.push_back({"max.dim", [](OpArgs& a) -> V { return MinMaxDim(a, ir::ArgKind::kArgMax); }});
  rows.push_back({"min.dim", [](OpArgs& a) -> V { return MinMaxDim(a, ir::ArgKind::kArgMin); }});
  rows.push_back({"argmax", [](OpArgs& a) -> V { return ArgMinMax(a, ir::ArgKind::kArgMax); }});
  rows.push_back({"argmin", [](OpArgs& a) -> V { return ArgMinMax(a, ir::ArgKind::kArgMin); }});
  rows.push_back({"cumsum", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType t = SumType(x, a.OptDType(2));
    if (x.rank() == 0) return {Cast(x, t)};
    // eager's CPU running sum accumulates float32 in double (at::acc_type<float, false>), half
    // types in float32: [3e38, 3e38, -3e38] gives [3e38, inf, 3e38]
    DType acc = t == DType::kF32 ? DType::kF64 : OpMath(t);
    return {Cast(ir::Cumulative(ir::ReduceKind::kSum, Cast(x, acc), a.Int(1)), t)};
  }});

  rows.push_back({"_logcumsumexp", [](OpArgs& a) -> V {
    // A running log(sum(exp)): eager folds left with its log-add-exp in the accumulate type (double
    // for float32, float32 for half types). log-add-exp is associative, so: a log-depth scan
    // (y = lae(y, y shifted by k, -inf filled) for k = 1, 2, 4, ...) in that type, rounded once.
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    if (x.rank() == 0) return {x};
    const int64_t dim = ir::NormalizeDim(a.Int(1), x.rank());
    const int64_t n = x.dims()[dim];
    if (x.shape().numel() == 0 || n == 1) return {x};
    const DType acc = (x.dtype() == DType::kF32 || x.dtype() == DType::kF64) ? DType::kF64 : DType::kF32;
    Value y = Cast(x, acc);
    const ir::Shape sh = y.shape();
    const double inf = std::numeric_limits<double>::infinity();
    Value ninf = ir::Full(-inf, ir::Shape(acc, {}));
    auto lae = [&](const Value& p, const Value& q) {
      // eager's _log_add_exp_helper: max + log1p(exp(min - max)); equal infinities give the first; NaN wins
      Value mx = ir::Binary(Op::kMax, p, q), mn = ir::Binary(Op::kMin, p, q);
      Value r = ir::Binary(Op::kAdd, mx, ir::Unary(Op::kLog1p, ir::Unary(Op::kExp, ir::Binary(Op::kSub, mn, mx))));
      Value same_inf = ir::Binary(Op::kAnd, ir::Compare(ir::CompareDir::kEQ, mn, mx), ir::Unary(Op::kNot, ir::Unary(Op::kIsFinite, mn)));
      r = ir::Select(same_inf, p, r);
      Value nan = ir::Binary(Op::kOr, ir::Compare(ir::CompareDir::kNE, p, p), ir::Compare(ir::CompareDir::kNE, q, q));
      return ir::Select(nan, ir::Full(std::numeric_limits<double>::quiet_NaN(), sh), r);
    };
    for (int64_t k = 1; k < n; k *= 2) {
      std::vector<int64_t> st(x.rank(), 0), lim = x.dims(), str(x.rank(), 1), lo(x.rank(), 0), hi(x.rank(), 0),
          in(x.rank(), 0);
      lim[dim] = n - k;
      lo[dim] = k;
      Value shifted = ir::Pad(ir::Slice(y, st, lim, str), ninf, lo, hi, in);
      y = lae(y, shifted);
    }
    return {Cast(y, x.dtype())};
  }});
  rows.push_back({"mm", [](OpArgs& a) -> V {
    Value x = a.V(0), y = a.V(1);
    if (x.rank() != 2 || y.rank() != 2) a.Fail("self must be a matrix");
    if (x.dtype() != y.dtype()) {  // eager checks this even for empty operands
      a.Fail(std::string("expected m1 and m2 to have the same dtype, but got: ") + ScalarTypeName(x.dtype()) +
             " != " + ScalarTypeName(y.dtype()));
    }
    return {Matmul2d(x, y)};
  }});
  rows.push_back({"bmm", [](OpArgs& a) -> V {
    Value x = a.V(0), y = a.V(1);
    if (x.rank() != 3 || y.rank() != 3) a.Fail("batch1 must be a 3D tensor");
    if (x.dtype() != y.dtype()) {
      // Eager returns early, without a dtype check, when an operand is empty: zeros of the
      // result's shape in batch2's dtype.
      if (x.shape().numel() == 0 || y.shape().numel() == 0) {
        return {ir::Full(0, ir::Shape(y.dtype(), {x.dims()[0], x.dims()[1], y.dims()[2]}))};
      }
      a.Fail(std::string("expected scalar type ") + ScalarTypeName(x.dtype()) + " but found " +
             ScalarTypeName(y.dtype()));
    }
    return {BatchedMatmul(x, y)};
  }});
  rows.push_back({"addmm", [](OpArgs& a) -> V {
    if (ReducedFloatGemm(a.V(1), a.V(2)) && a.V(1).rank() == 2 && a.V(2).rank() == 2) {
      return {BetaSelfPlusAlphaReduced(a, a.V(1), a.V(2), Matmul2d)};
    }
    return {BetaSelfPlusAlpha(a, Matmul2d(a.V(1), a.V(2)))};
  }});
  rows.push_back({"baddbmm", [](OpArgs& a) -> V {
    Value x = a.V(1), y = a.V(2);
    if (x.rank() != 3 || y.rank() != 3) a.Fail("batch1 must be a 3D tensor");
    if (ReducedFloatGemm(x, y)) return {BetaSelfPlusAlphaReduced(a, x, y, BatchedMatmul)};
    Value m = BatchedMatmul(x, y);
    return {BetaSelfPlusAlpha(a, m)};
  }});
  rows.push_back({"addbmm", [](OpArgs& a) -> V {
    // beta * self + alpha * sum_b batch1[b] @ batch2[b]: one dot contracting the batch and inner dims.
    Value x = a.V(1), y = a.V(2);
    if (x.rank() != 3 || y.rank() != 3 || x.dtype() != y.dtype() || x.dims()[0] != y.dims()[0] ||
        x.dims()[2] != y.dims()[1] || x.dtype() == DType::kPred || ir::IsComplex(x.dtype())) {
      throw NotLowered{};  // eager's errors
    }
    DType t = x.dtype();
    if (t != DType::kBF16 && t != DType::kF16) {
      Value m = ir::DotGeneral(x, y, {}, {}, {0, 2}, {0, 1}, t);
      return {BetaSelfPlusAlpha(a, m)};
    }
    // bf16/f16: eager adds one product per batch into the result (addmm_, rounded each time).
    int64_t nb = x.dims()[0];
    if (nb > 64) throw NotLowered{};
    std::vector<int64_t> out = {x.dims()[1], y.dims()[2]};
    double beta = a.S(3).AsDouble(), alpha = a.S(4).AsDouble();
    // The first step is beta * self + alpha * product, in float32 and rounded once (one gemm).
    Value acc = beta == 0 ? ir::Full(0, ir::Shape(DType::kF32, out)) : BroadcastTo(Cast(Cast(a.V(0), t), DType::kF32), out);
    if (beta != 0 && beta != 1) acc = Bin(Op::kMul, acc, ScalarV(beta, DType::kF32, a.device));
    if (nb == 0) return {Cast(acc, t)};
    for (int64_t b = 0; b < nb; ++b) {
      auto batch = [&](const Value& v) {
        std::vector<int64_t> st = {b, 0, 0}, lim = {b + 1, v.dims()[1], v.dims()[2]}, str = {1, 1, 1};
        return ir::Reshape(Cast(ir::Slice(v, st, lim, str), DType::kF32), {v.dims()[1], v.dims()[2]});
      };
      Value m = ir::DotGeneral(batch(x), batch(y), {}, {}, {1}, {0}, DType::kF32);
      if (alpha != 1) m = Bin(Op::kMul, m, ScalarV(alpha, DType::kF32, a.device));
      acc = Cast(Cast(Bin(Op::kAdd, acc, m), t), DType::kF32);
    }
    return {Cast(acc, t)};
  }});
  rows.push_back({"addmv", [](OpArgs& a) -> V {
    Value mat = a.V(1), vec = a.V(2);
    if (mat.rank() != 2 || vec.rank() != 1) a.Fail("vector + matrix @ vector expected");
    Value m = ir::DotGeneral(mat, vec, {}, {}, {1}, {0}, mat.dtype());
    return {BetaSelfPlusAlpha(a, m)};
  }});
  rows.push_back({"logsumexp", [](OpArgs& a) -> V {
    // Eager: m = amax (0 where infinite); log(sum(exp(x - m))) + m.
    Value x = a.V(0);
    DType t = FloatOf(x.dtype()), ct = OpMath(t);
    Value xc = Cast(x, ct);
    if (xc.rank() == 0) return {Cast(xc, t)};
    std::vector<int64_t> dims = DimsOrAll(a, 1, xc);
    bool keepdim = a.Bool(2);
    if (xc.shape().numel() == 0) {
      Value s = SumDims(ir::Unary(Op::kExp, xc), dims, keepdim, ct);
      return {Cast(ir::Unary(Op::kLog, s), t)};
    }
    Value m = KeepDims(ir::Reduce(ir::ReduceKind::kMax, xc, dims), xc.dims(), dims);
    Value inf = ir::Compare(ir::CompareDir::kEQ, ir::Unary(Op::kAbs, m), ir::Full(std::numeric_limits<double>::infinity(), m.shape()));
    m = ir::Select(inf, ir::Full(0, m.shape()), m);
    // bf16/f16: eager's composite runs one aten op per step on tensors of the dtype, each rounded
    // (x - m, exp, the float32-accumulated sum, log, + m)
    auto step = [&](const Value& v) { return ct == t ? v : Cast(Cast(v, t), ct); };
    Value s = step(SumDims(step(ir::Unary(Op::kExp, step(Bin(Op::kSub, xc, m)))), dims, true, ct));
    Value r = ir::Binary(Op::kAdd, step(ir::Unary(Op::kLog, s)), m);
    if (!keepdim) r = ir::Reshape(r, ir::Reduce(ir::ReduceKind::kSum, xc, dims).dims());
    return {Cast(r, t)};
  }});
  rows.push_back({"dot", [](OpArgs& a) -> V {
    return {ir::DotGeneral(a.V(0), a.V(1), {}, {}, {0}, {0}, a.V(0).dtype())};
  }});
}

}  // namespace txla::ops
