// Op table rows: elementwise math that PyTorch/XLA lowers and the OpInfo survey
// (scripts/opinfo_fallbacks.py) found on the CPU fallback: inverse trigonometric and hyperbolic
// functions, exp2/log10/trunc/frac, activations (hardsigmoid, hardswish, hardshrink, softshrink, elu,
// logit, log_sigmoid, threshold), NaN-aware binaries (fmax, fmin, hypot, logaddexp(2), xlogy),
// round(decimals), plus trace, eye, nansum, cumprod and var_mean/std_mean. Each is written from
// StableHLO primitives in a form that keeps eager's accuracy (expm1/log1p near 0, no overflow of
// intermediates) and eager's NaN/inf results.
#include <cmath>

#include "graph/graph.h"
#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {


Value C(double v, const Value& like) { return ir::Full(v, like.shape()); }
Value Add(const Value& a, const Value& b) { return ir::Binary(Op::kAdd, a, b); }
Value Sub(const Value& a, const Value& b) { return ir::Binary(Op::kSub, a, b); }
Value Mul(const Value& a, const Value& b) { return ir::Binary(Op::kMul, a, b); }
Value Div(const Value& a, const Value& b) { return ir::Binary(Op::kDiv, a, b); }
Value Abs(const Value& x) { return ir::Unary(Op::kAbs, x); }
Value IsNan(const Value& x) { return ir::Compare(CompareDir::kNE, x, x); }
Value Lt(const Value& a, const Value& b) { return ir::Compare(CompareDir::kLT, a, b); }
Value Le(const Value& a, const Value& b) { return ir::Compare(CompareDir::kLE, a, b); }
Value Gt(const Value& a, const Value& b) { return ir::Compare(CompareDir::kGT, a, b); }
Value Eq(const Value& a, const Value& b) { return ir::Compare(CompareDir::kEQ, a, b); }
Value IsInf(const Value& x) { return Eq(Abs(x), C(INFINITY, x)); }

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLn10 = 2.30258509299404568402;

// A float unary op: integers compute in float32, bf16/f16 in float32 rounded once (eager's opmath).
OpFn MathUnary(std::function<Value(const Value&)> f) {
  return [f](OpArgs& a) -> V {
    DType out = FloatOf(a.V(0).dtype());
    return {Cast(f(Cast(a.V(0), OpMath(out))), out)};
  };
}

// A float binary op of two tensors (broadcast, promoted as eager's result_type, integers to float).
OpFn MathBinary(std::function<Value(const Value&, const Value&)> f) {
  return [f](OpArgs& a) -> V {
    DType out = FloatOf(ResultType({&a.T(0), &a.T(1)}));
    DType ct = OpMath(out);
    auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
    // Operands take the result dtype first (a 0-dim f32 70000 next to an f16 tensor is inf, as eager).
    Value x = Cast(Cast(a.V(0), out), ct), y = Cast(Cast(a.V(1), out), ct);
    return {Cast(f(BroadcastTo(x, dims), BroadcastTo(y, dims)), out)};
  };
}

Value Sqrt(const Value& x) { return ir::Unary(Op::kSqrt, x); }
Value Exp(const Value& x) { return ir::Unary(Op::kExp, x); }
Value Expm1(const Value& x) { return ir::Unary(Op::kExpm1, x); }
Value Log(const Value& x) { return ir::Unary(Op::kLog, x); }
Value Log1p(const Value& x) { return ir::Unary(Op::kLog1p, x); }
Value Atan2(const Value& y, const Value& x) { return ir::Binary(Op::kAtan2, y, x); }
Value Sign(const Value& x) { return ir::Unary(Op::kSign, x); }
Value Max(const Value& a, const Value& b) { return ir::Binary(Op::kMax, a, b); }
Value Min(const Value& a, const Value& b) { return ir::Binary(Op::kMin, a, b); }

Value Trunc(const Value& x) {
  if (!ir::IsFloating(x.dtype())) return x;
  return ir::Select(Lt(x, C(0, x)), ir::Unary(Op::kCeil, x), ir::Unary(Op::kFloor, x));
}
// 1 - x^2 as (1 - x)(1 + x): exact near |x| = 1.
Value OneMinusSq(const Value& x) { return Mul(Sub(C(1, x), x), Add(C(1, x), x)); }

Value Sinh(const Value& x) {
  // Small |x|: (expm1(x) - expm1(-x)) / 2 keeps the relative accuracy; large |x|: e^|x| / 2 computed
  // as e^(|x| - ln 2), which stays finite up to sinh's own overflow.
  Value ax = Abs(x);
  Value small = Mul(Sub(Expm1(x), Expm1(ir::Unary(Op::kNeg, x))), C(0.5, x));
  Value big = Mul(Sign(x), Exp(Sub(ax, C(kLn2, x))));
  return ir::Select(Lt(ax, C(9, x)), small, big);
}
Value Cosh(const Value& x) {
  Value ax = Abs(x);
  Value small = Mul(Add(Exp(x), Exp(ir::Unary(Op::kNeg, x))), C(0.5, x));
  return ir::Select(Lt(ax, C(9, x)), small, Exp(Sub(ax, C(kLn2, x))));
}
Value Asinh(const Value& x) {
  Value ax = Abs(x);
  Value x2 = Mul(ax, ax);
  Value moderate = Log1p(Add(ax, Div(x2, Add(C(1, x), Sqrt(Add(C(1, x), x2))))));
  Value huge = Add(Log(ax), C(kLn2, x));  // x^2 would overflow
  Value r = ir::Select(Gt(ax, C(1e15, x)), huge, moderate);
  r = ir::Select(Lt(x, C(0, x)), ir::Unary(Op::kNeg, r), r);
  return ir::Select(Eq(x, C(0, x)), x, r);  // asinh(-0.0) = -0.0
}
Value Acosh(const Value& x) {
  Value t = Sub(x, C(1, x));
  Value moderate = Log1p(Add(t, Sqrt(Mul(t, Add(x, C(1, x))))));
  Value huge = Add(Log(x), C(kLn2, x));
  Value r = ir::Select(Gt(x, C(1e15, x)), huge, moderate);
  return ir::Select(Lt(x, C(1, x)), C(NAN, x), r);  // NaN below 1 (and for NaN: the comparisons fail)
}
// (log1p(x) - log1p(-x)) / 2: accurate near 0 and near +-1 (1 -+ x is exact there).
Value Atanh(const Value& x) { return Mul(C(0.5, x), Sub(Log1p(x), Log1p(ir::Unary(Op::kNeg, x)))); }

// Eager's fmax/fmin: NaN only when both are NaN.
Value FMaxMin(const Value& a, const Value& b, bool is_max) {
  if (!ir::IsFloating(a.dtype())) return is_max ? Max(a, b) : Min(a, b);
  // Ties (-0.0 vs 0.0) give a, as eager's fmax(-0.0, 0.0) = -0.0, except in bfloat16, whose kernel gives b.
  bool tie_b = a.dtype() == DType::kBF16;
  Value m = is_max ? (tie_b ? Max(a, b) : Max(b, a)) : (tie_b ? Min(a, b) : Min(b, a));
  return ir::Select(IsNan(a), b, ir::Select(IsNan(b), a, m));
}

Value Hypot(const Value& a, const Value& b) {
  Value aa = Abs(a), ab = Abs(b);
  Value hi = Max(aa, ab), lo = Min(aa, ab);
  Value r = Div(lo, hi);
  Value h = Mul(hi, Sqrt(Add(C(1, a), Mul(r, r))));
  h = ir::Select(Eq(hi, C(0, a)), C(0, a), h);
  return ir::Select(ir::Binary(Op::kOr, IsInf(a), IsInf(b)), C(INFINITY, a), h);  // inf even with NaN
}

Value LogAddExp(const Value& a, const Value& b, bool base2) {
  Value m = Max(a, b);
  Value d = ir::Unary(Op::kNeg, Abs(Sub(a, b)));
  Value r = base2 ? Add(m, Mul(Log1p(ir::Binary(Op::kPow, C(2, d), d)), C(1.0 / kLn2, d))) : Add(m, Log1p(Exp(d)));  // eager: * (1 / ln 2)
  // Equal infinities: a (eager), not inf - inf = NaN.
  return ir::Select(ir::Binary(Op::kAnd, IsInf(a), Eq(a, b)), a, r);
}

// bf16/f16: eager's kernel computes `x * std::log(y)` in the reduced type, so log(y) is rounded
// to it before the product (round_to; the product is rounded by the caller).
Value XLogY(const Value& x, const Value& y, DType round_to) {
  Value r = ir::Select(Eq(x, C(0, x)), C(0, x), Mul(x, Cast(Cast(Log(y), round_to), y.dtype())));
  return ir::Select(IsNan(y), y, r);
}

// Reduced dims of a dim list argument (none or empty: all).
std::vector<int64_t> DimsOf(const std::optional<std::vector<int64_t>>& dims, int rank) {
  std::vector<int64_t> out;
  if (!dims || dims->empty()) {
    for (int i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  return ir::NormalizeDims(*dims, std::max(rank, 1));
}

}  // namespace

void AddMathRows(std::vector<OpRow>& rows) {
  rows.push_back({"asin", MathUnary([](const Value& x) { return Atan2(x, Sqrt(OneMinusSq(x))); })});
  rows.push_back({"acos", MathUnary([](const Value& x) { return Atan2(Sqrt(OneMinusSq(x)), x); })});
  rows.push_back({"atan", MathUnary([](const Value& x) { return Atan2(x, C(1, x)); })});
  rows.push_back({"sinh", MathUnary(Sinh)});
  rows.push_back({"cosh", MathUnary(Cosh)});
  rows.push_back({"asinh", MathUnary(Asinh)});
  rows.push_back({"acosh", MathUnary(Acosh)});
  rows.push_back({"atanh", MathUnary(Atanh)});
  rows.push_back({"atan2", MathBinary(Atan2)});
  rows.push_back({"log10", MathUnary([](const Value& x) { return Div(Log(x), C(kLn10, x)); })});
  rows.push_back({"exp2", MathUnary([](const Value& x) { return ir::Binary(Op::kPow, C(2, x), x); })});
  rows.push_back({"trunc", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) return {x};
    return {Trunc(x)};
  }});
  rows.push_back({"frac", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};  // eager's own error for integers
    return {Sub(x, Trunc(x))};
  }});
  rows.push_back({"sgn", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (ir::IsComplex(x.dtype())) throw NotLowered{};  // z / |z|: complex division, on the CPU
    if (x.dtype() == DType::kPred) return {x};
    if (ir::IsUnsigned(x.dtype())) return {Cast(ir::Compare(CompareDir::kNE, x, C(0, x)), x.dtype())};
    if (!ir::IsFloating(x.dtype())) return {Sign(x)};
    // eager's sgn of NaN and of -0.0 is +0 (stablehlo.sign keeps -0.0; fuzz seed 20708)
    return {ir::Select(ir::Compare(CompareDir::kGT, x, C(0, x)), C(1, x),
                       ir::Select(ir::Compare(CompareDir::kLT, x, C(0, x)), C(-1, x), C(0, x)))};
  }});
  for (bool is_max : {true, false}) {
    rows.push_back({is_max ? "fmax" : "fmin", [is_max](OpArgs& a) -> V {
      DType t = ResultType({&a.T(0), &a.T(1)});  // integers stay integers
      auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
      return {FMaxMin(BroadcastTo(Cast(a.V(0), t), dims), BroadcastTo(Cast(a.V(1), t), dims), is_max)};
    }});
  }
  rows.push_back({"hypot", MathBinary(Hypot)});
  rows.push_back({"logaddexp", MathBinary([](const Value& a, const Value& b) { return LogAddExp(a, b, false); })});
  rows.push_back({"logaddexp2", MathBinary([](const Value& a, const Value& b) { return LogAddExp(a, b, true); })});
  rows.push_back({"xlogy.Tensor", [](OpArgs& a) -> V {
    DType out = FloatOf(ResultType({&a.T(0), &a.T(1)}));
    return MathBinary([out](const Value& x, const Value& y) { return XLogY(x, y, out); })(a);
  }});

  // floor_divide: division rounded down (div(..., rounding_mode='floor')), as eager today.
  rows.push_back({"floor_divide", [](OpArgs& a) -> V {
    OpArgs b = a;
    b.args.resize(3);
    b.args[2].kind = Arg::kString;
    b.args[2].str = "floor";
    return FindOp("div.Tensor_mode")->fn(b);
  }});
  rows.push_back({"vdot", [](OpArgs& a) -> V {
    if (ir::IsComplex(a.V(0).dtype())) throw NotLowered{};  // conj(self) . other: complex, on the CPU
    if (a.V(0).rank() != 1 || a.V(1).rank() != 1) a.Fail("1D tensors expected, but got " + std::to_string(a.V(0).rank()) + "D and " + std::to_string(a.V(1).rank()) + "D tensors");
    if (a.V(0).dtype() != a.V(1).dtype()) {
      a.Fail("vdot : expected both vectors to have same dtype, but found " + std::string(ir::DTypeName(a.V(0).dtype())) +
             " and " + ir::DTypeName(a.V(1).dtype()));
    }
    return FindOp("dot")->fn(a);
  }});
  // linalg_cross along dim (size 3): (a1 b2 - a2 b1, a2 b0 - a0 b2, a0 b1 - a1 b0), broadcast.
  rows.push_back({"linalg_cross", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)});
    auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
    Value x = BroadcastTo(Cast(a.V(0), t), dims), y = BroadcastTo(Cast(a.V(1), t), dims);
    int64_t d = ir::NormalizeDim(a.Int(2), static_cast<int>(dims.size()));
    if (dims[d] != 3) a.Fail("linalg.cross: inputs dimension " + std::to_string(d) + " must have length 3. Got " +
                             std::to_string(a.V(0).rank() > d ? a.V(0).dims()[d] : 0) + " and " +
                             std::to_string(a.V(1).rank() > d ? a.V(1).dims()[d] : 0));
    auto part = [&](const Value& v, int64_t i) {
      std::vector<int64_t> st(dims.size(), 0), lim = dims, str(dims.size(), 1);
      st[d] = i;
      lim[d] = i + 1;
      return ir::Slice(v, st, lim, str);
    };
    auto term = [&](int64_t i, int64_t j) { return Sub(Mul(part(x, i), part(y, j)), Mul(part(x, j), part(y, i))); };
    return {ir::Concatenate({term(1, 2), term(2, 0), term(0, 1)}, d)};
  }});

  rows.push_back({"erfinv", MathUnary([](const Value& x) { return ir::Unary(Op::kErfInv, x); })});
  rows.push_back({"mish", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    Value c = Cast(x, OpMath(x.dtype()));
    return {Cast(Mul(c, ir::Unary(Op::kTanh, Log1p(Exp(c)))), x.dtype())};
  }});
  rows.push_back({"glu", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    if (x.rank() == 0) a.Fail("glu does not support scalars because halving size must be even");
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    int64_t n = x.dims()[d];
    if (n % 2) a.Fail("Halving dimension must be even, but dimension " + std::to_string(d) + " is size " + std::to_string(n));
    std::vector<int64_t> st(x.rank(), 0), mid = x.dims(), str(x.rank(), 1);
    mid[d] = n / 2;
    Value c = Cast(x, OpMath(x.dtype()));
    Value first = ir::Slice(c, st, mid, str);
    st[d] = n / 2;
    Value second = ir::Slice(c, st, c.dims(), str);
    return {Cast(Mul(first, ir::Unary(Op::kLogistic, second)), x.dtype())};
  }});

  // ---- losses
  auto reduce_loss = [](const Value& l, int64_t reduction) -> Value {
    if (reduction == 0) return l;
    std::vector<int64_t> all;
    for (int i = 0; i < l.rank(); ++i) all.push_back(i);
    Value s = l.rank() ? ir::Reduce(ir::ReduceKind::kSum, l, all) : l;
    if (reduction == 2) return s;
    return Div(s, C(static_cast<double>(l.shape().numel()), s));
  };
  rows.push_back({"binary_cross_entropy", [reduce_loss](OpArgs& a) -> V {
    // (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100), weighted: eager's CPU kernel. Inputs
    // outside [0, 1] raise eager's error at the next sync or read (an in-graph check).
    Value x = a.V(0), t = a.V(1);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    if (t.dims() != x.dims()) throw NotLowered{};  // eager's own size errors, on the CPU
    DType ct = OpMath(x.dtype());
    Value c = Cast(x, ct), tc = Cast(t, ct);
    Value ok = ir::Binary(Op::kAnd, Le(C(0, c), c), Le(c, C(1, c)));
    std::vector<int64_t> all;
    for (int i = 0; i < c.rank(); ++i) all.push_back(i);
    graph::AddCheck(c.rank() ? ir::Reduce(ir::ReduceKind::kAnd, ok, all) : ok,
                    "all elements of input should be between 0 and 1", a.device, /*runtime_error=*/true);
    Value l1 = Max(Log1p(ir::Unary(Op::kNeg, c)), C(-100, c));
    Value l0 = Max(Log(c), C(-100, c));
    Value loss = Sub(Mul(Sub(tc, C(1, tc)), l1), Mul(tc, l0));
    if (auto w = a.OptV(2)) loss = Mul(loss, BroadcastTo(Cast(*w, ct), loss.dims()));
    return {Cast(reduce_loss(loss, a.Int(3)), x.dtype())};
  }});
  rows.push_back({"binary_cross_entropy_backward", [](OpArgs& a) -> V {
    // grad * w * (x - t) / max((1 - x) * x, 1e-12), divided by numel for the mean.
    Value g = a.V(0), x = a.V(1), t = a.V(2);
    if (!ir::IsFloating(x.dtype()) || t.dims() != x.dims()) throw NotLowered{};
    DType ct = OpMath(x.dtype());
    Value c = Cast(x, ct), tc = Cast(t, ct);
    int64_t reduction = a.Int(4);
    Value gc = BroadcastTo(Cast(g, ct), c.dims());
    Value r = Div(Mul(Sub(c, tc), gc), Max(Mul(Sub(C(1, c), c), c), C(1e-12, c)));
    if (auto w = a.OptV(3)) r = Mul(r, BroadcastTo(Cast(*w, ct), r.dims()));
    if (reduction == 1) r = Div(r, C(static_cast<double>(c.shape().numel()), r));
    return {Cast(r, x.dtype())};
  }});
  rows.push_back({"smooth_l1_loss", [reduce_loss](OpArgs& a) -> V {
    Value x = a.V(0), t = a.V(1);
    DType out = ResultType({&a.T(0), &a.T(1)});
    if (!ir::IsFloating(out)) throw NotLowered{};
    DType ct = OpMath(out);
    auto dims = BroadcastShapes(x.dims(), t.dims());
    Value d = Abs(Sub(BroadcastTo(Cast(Cast(x, out), ct), dims), BroadcastTo(Cast(Cast(t, out), ct), dims)));
    double beta = a.Double(3);
    Value l = beta == 0 ? d
                        : ir::Select(Lt(d, C(beta, d)), Div(Mul(C(0.5, d), Mul(d, d)), C(beta, d)),
                                     Sub(d, C(0.5 * beta, d)));
    return {Cast(reduce_loss(l, a.Int(2)), out)};
  }});

  // ---- indexing
  rows.push_back({"take", [](OpArgs& a) -> V {
    Value x = a.V(0), idx = a.V(1);
    int64_t n = x.shape().numel(), m = idx.shape().numel();
    if (m == 0) return {ir::Full(0, ir::Shape(x.dtype(), idx.dims()))};
    if (n == 0) a.Fail("take: tried to take from an empty tensor");
    CheckIndexRange(idx, -n, n, "take: index out of range", a.device);
    Value i = Cast(ir::Reshape(idx, {m}), DType::kS64);
    i = ir::Select(Lt(i, C(0, i)), Add(i, C(static_cast<double>(n), i)), i);
    Value g = ir::Gather(ir::Reshape(x, {n}), ir::Reshape(i, {m, 1}), {}, {0}, {0}, 1, {1});
    return {ir::Reshape(g, idx.dims())};
  }});
  rows.push_back({"count_nonzero.dim_IntList", [](OpArgs& a) -> V {
    Value x = a.V(0);
    std::vector<int64_t> dims = DimsOf(a.Ints(1), x.rank());
    Value nz = Cast(ir::Compare(CompareDir::kNE, x, ir::Full(0, x.shape())), DType::kS64);
    if (x.rank() == 0) return {nz};
    return {ir::Reduce(ir::ReduceKind::kSum, nz, dims)};
  }});
  rows.push_back({"nonzero_static", [](OpArgs& a) -> V {
    // The coordinates of the first `size` nonzero elements in row-major order, rows past the count
    // filled with fill_value: each nonzero element's coordinates are scattered to row
    // (its running count - 1); the others, and those past `size`, go out of bounds and are dropped.
    Value x = a.V(0);
    const int64_t size = a.Int(1), fill = a.Int(2);
    if (size < 0 || ir::IsComplex(x.dtype())) throw NotLowered{};
    const int r = x.rank();
    if (r == 0) return {ir::Full(0, ir::Shape(DType::kS64, {size, 0}))};  // eager: [size, 0]
    const int64_t n = x.shape().numel();
    Value out = ir::Full(static_cast<double>(fill), ir::Shape(DType::kS64, {size, r}));
    if (fill > (int64_t{1} << 53) || fill < -(int64_t{1} << 53)) out = ir::BroadcastInDim(ir::ConstantInt(fill, DType::kS64), {size, r}, {});
    if (n == 0 || size == 0) return {out};
    Value nz = ir::Reshape(Cast(ir::Compare(CompareDir::kNE, x, ir::Full(0, x.shape())), DType::kS64), {n});
    Value pos = ir::Binary(Op::kSub, ir::Cumulative(ir::ReduceKind::kSum, nz, 0), ir::Full(1, nz.shape()));
    Value target = ir::Select(ir::Compare(CompareDir::kNE, nz, ir::Full(0, nz.shape())), pos,
                              ir::Full(static_cast<double>(size), nz.shape()));
    std::vector<Value> coords;
    for (int d = 0; d < r; ++d) coords.push_back(ir::Reshape(ir::Iota(ir::Shape(DType::kS64, x.dims()), d), {n, 1}));
    Value upd = r == 1 ? coords[0] : ir::Concatenate(coords, 1);
    return {ir::Scatter(out, ir::Reshape(target, {n, 1}), upd, {1}, {0}, {0}, 1, 0)};
  }});
  for (bool tensor_value : {false, true}) {
    rows.push_back({tensor_value ? "index_fill.int_Tensor" : "index_fill.int_Scalar", [tensor_value](OpArgs& a) -> V {
      Value x = a.V(0), idx = a.V(2);
      if (idx.rank() > 1) a.Fail("Index is supposed to be a vector");
      if (ir::IsFloating(idx.dtype())) throw NotLowered{};
      int64_t d = ir::NormalizeDim(a.Int(1), std::max(x.rank(), 1));
      Value v = tensor_value ? a.V(3) : ScalarV(a.S(3), x.dtype(), a.device);
      if (tensor_value && v.rank() != 0) throw NotLowered{};  // eager's own error
      v = Cast(v, x.dtype());
      int64_t m = idx.shape().numel();
      if (m == 0) return {x};
      if (x.rank() == 0) {  // index 0 or -1 of a scalar
        CheckIndexRange(idx, -1, 1, "index_fill(): index out of range", a.device);
        return {v};
      }
      int64_t n = x.dims()[d];
      CheckIndexRange(idx, -n, n, "index_fill(): index out of range", a.device);
      Value i = Cast(ir::Reshape(idx, {m}), DType::kS64);
      i = ir::Select(Lt(i, C(0, i)), Add(i, C(static_cast<double>(n), i)), i);
      Value hit = ir::Reduce(ir::ReduceKind::kOr,
                             Eq(ir::Iota(ir::Shape(DType::kS64, {n, m}), 0), ir::BroadcastInDim(i, {n, m}, {1})), {1});
      Value mask = ir::BroadcastInDim(hit, x.dims(), {d});
      return {ir::Select(mask, ir::BroadcastInDim(v, x.dims(), {}), x)};
    }});
  }

  // ---- activations
  rows.push_back({"hardsigmoid", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    Value c = Cast(x, OpMath(x.dtype()));
    Value r = Div(Min(Max(Add(c, C(3, c)), C(0, c)), C(6, c)), C(6, c));
    return {Cast(ir::Select(IsNan(c), c, r), x.dtype())};
  }});
  rows.push_back({"hardswish", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    Value c = Cast(x, OpMath(x.dtype()));
    Value r = Div(Mul(c, Min(Max(Add(c, C(3, c)), C(0, c)), C(6, c))), C(6, c));
    return {Cast(ir::Select(IsNan(c), c, r), x.dtype())};
  }});
  rows.push_back({"hardshrink", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    double l = a.S(1).AsDouble();
    Value inside = ir::Binary(Op::kAnd, Le(C(-l, x), x), Le(x, C(l, x)));
    return {ir::Select(inside, C(0, x), x)};
  }});
  rows.push_back({"softshrink", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    double l = a.S(1).AsDouble();
    Value c = Cast(x, OpMath(x.dtype()));
    // x * 0 keeps NaN and the sign of -0.0 (eager's scalar loop; its vectorized body gives +0.0, so
    // eager's sign of softshrink(-0.0) depends on the element's position)
    Value r = ir::Select(Gt(c, C(l, c)), Sub(c, C(l, c)), ir::Select(Lt(c, C(-l, c)), Add(c, C(l, c)), Mul(c, C(0, c))));
    return {Cast(r, x.dtype())};
  }});
  rows.push_back({"elu", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    double alpha = a.S(1).AsDouble(), scale = a.S(2).AsDouble(), in_scale = a.S(3).AsDouble();
    Value c = Cast(x, OpMath(x.dtype()));
    Value neg = Mul(Expm1(Mul(c, C(in_scale, c))), C(alpha * scale, c));
    return {Cast(ir::Select(Le(c, C(0, c)), neg, Mul(c, C(scale, c))), x.dtype())};
  }});
  rows.push_back({"logit", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType out = FloatOf(x.dtype());
    Value c = Cast(x, OpMath(out));
    if (auto eps = a.OptDouble(1)) c = ir::Clamp(C(*eps, c), c, C(1 - *eps, c));
    if (out != OpMath(out)) {
      // f16/bf16: eager's kernel rounds each step to the dtype: the clamped value, 1 - x, the
      // quotient, the log
      auto r = [&](const Value& v) { return Cast(Cast(v, out), OpMath(out)); };
      c = r(c);
      return {Cast(Log(r(Div(c, r(Sub(C(1, c), c))))), out)};
    }
    return {Cast(Log(Div(c, Sub(C(1, c), c))), out)};
  }});
  rows.push_back({"log_sigmoid_forward", [](OpArgs& a) -> V {
    // min(x, 0) - log1p(z), z = exp(-|x|); the buffer is z in x's dtype, as eager's CPU kernel
    // returns it (its backward reads the rounded z)
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    Value c = Cast(x, OpMath(x.dtype()));
    Value z = Exp(ir::Unary(Op::kNeg, Abs(c)));
    Value r = Sub(Min(c, C(0, c)), Log1p(z));
    return {Cast(r, x.dtype()), Cast(z, x.dtype())};
  }});
  rows.push_back({"log_sigmoid_backward", [](OpArgs& a) -> V {
    // grad * (max_deriv - sign * z / (1 + z)), z = exp(-|x|) from the forward's buffer (rounded to
    // x's dtype there): eager's formula. A buffer of another shape: z computed here.
    Value g = a.V(0), x = a.V(1), buffer = a.V(2);
    DType ct = OpMath(x.dtype());
    Value c = Cast(x, ct), gc = Cast(g, ct);
    auto dims = BroadcastShapes(gc.dims(), c.dims());
    c = BroadcastTo(c, dims);
    gc = BroadcastTo(gc, dims);
    Value neg = Lt(c, C(0, c));
    Value z = buffer.dims() == dims ? Cast(buffer, ct) : Exp(ir::Unary(Op::kNeg, Abs(c)));
    Value q = Div(z, Add(C(1, z), z));
    Value d = ir::Select(neg, Sub(C(1, q), q), q);
    Value r = Mul(gc, d);
    return {Cast(r, x.dtype())};
  }});
  rows.push_back({"threshold", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.dtype() == DType::kPred) throw NotLowered{};
    DType ct = OpMath(x.dtype());
    Value c = Cast(x, ct);
    Value r = ir::Select(Le(c, C(a.S(1).AsDouble(), c)), C(a.S(2).AsDouble(), c), c);
    return {Cast(r, x.dtype())};
  }});

  // round(x, decimals): eager scales by 10^|decimals| and rounds half to even.
  rows.push_back({"round.decimals", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!ir::IsFloating(x.dtype())) throw NotLowered{};
    int64_t d = a.Int(1);
    Value c = Cast(x, OpMath(x.dtype()));
    double p = std::pow(10.0, static_cast<double>(d < 0 ? -d : d));
    Value r = d >= 0 ? Div(ir::Unary(Op::kRoundEven, Mul(c, C(p, c))), C(p, c))
                     : Mul(ir::Unary(Op::kRoundEven, Div(c, C(p, c))), C(p, c));
    return {Cast(r, x.dtype())};
  }});

  // ---- reductions and factories
  rows.push_back({"trace", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.rank() != 2) a.Fail("trace: expected a matrix, but got tensor with dim " + std::to_string(x.rank()));
    DType t = ir::IsIntegral(x.dtype(), true) ? DType::kS64 : x.dtype();
    ir::Shape s(DType::kS64, x.dims());
    Value diag = Eq(ir::Iota(s, 0), ir::Iota(s, 1));
    Value v = Cast(x, OpMath(t));
    return {Cast(ir::Reduce(ir::ReduceKind::kSum, ir::Select(diag, v, C(0, v)), {0, 1}), t)};
  }});
  auto eye = [](OpArgs& a, int64_t n, int64_t m, size_t dtype_arg) -> Value {
    if (n < 0 || m < 0) a.Fail("n must be greater or equal to 0, got " + std::to_string(n < 0 ? n : m));
    DType t = a.OptDType(dtype_arg).value_or(DType::kF32);
    ir::Shape s(DType::kS64, {n, m});
    return Cast(Eq(ir::Iota(s, 0), ir::Iota(s, 1)), t);
  };
  rows.push_back({"eye", [eye](OpArgs& a) -> V { return {eye(a, a.Int(0), a.Int(0), 1)}; }});
  rows.push_back({"eye.m", [eye](OpArgs& a) -> V { return {eye(a, a.Int(0), a.Int(1), 2)}; }});
  rows.push_back({"nansum", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType t = a.OptDType(3).value_or(ir::IsIntegral(x.dtype(), true) ? DType::kS64 : x.dtype());
    if (ir::IsComplex(t) || ir::IsComplex(x.dtype())) throw NotLowered{};
    std::vector<int64_t> dims = DimsOf(a.OptInts(1), x.rank());
    Value c = Cast(x, OpMath(t));
    if (ir::IsFloating(c.dtype())) c = ir::Select(IsNan(c), C(0, c), c);
    if (x.rank() == 0) return {Cast(c, t)};
    Value r = ir::Reduce(ir::ReduceKind::kSum, c, dims);
    if (a.Bool(2)) r = KeepDims(r, x.dims(), dims);
    return {Cast(r, t)};
  }});
  rows.push_back({"cumprod", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType t = a.OptDType(2).value_or(ir::IsIntegral(x.dtype(), true) ? DType::kS64 : x.dtype());
    if (x.rank() == 0) return {Cast(x, t)};
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    // accumulated as eager's CPU kernel: float32 in double, half types in float32 (see cumsum)
    return {Cast(ir::Cumulative(ir::ReduceKind::kProd, Cast(x, t == DType::kF32 ? DType::kF64 : OpMath(t)), d), t)};
  }});
  // var_mean / std_mean: the var/std row and the mean over the same dims.
  for (bool is_std : {false, true}) {
    rows.push_back({is_std ? "std_mean.correction" : "var_mean.correction", [is_std](OpArgs& a) -> V {
      Value x = a.V(0);
      if (!ir::IsFloating(x.dtype())) throw NotLowered{};
      const OpRow* row = FindOp(is_std ? "std.correction" : "var.correction");
      V m = row->fn(a);
      std::vector<int64_t> dims = DimsOf(a.OptInts(1), x.rank());
      DType ct = OpMath(x.dtype());
      Value c = Cast(x, ct);
      if (x.rank() == 0) return {m[0], x};
      int64_t count = 1;
      for (int64_t d : dims) count *= x.dims()[d];
      Value sum = ir::Reduce(ir::ReduceKind::kSum, c, dims);
      Value mean = Div(sum, C(static_cast<double>(count), sum));
      if (a.Bool(3)) mean = KeepDims(mean, x.dims(), dims);
      return {m[0], Cast(mean, x.dtype())};
    }});
  }
}

}  // namespace txla::ops
