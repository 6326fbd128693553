// Op table rows: elementwise arithmetic, comparisons, activations and their backward ops.
#include <cmath>

#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {


// Eager's lerp: exact at both ends (weight 0 -> self, weight 1 -> end).
Value Lerp(const Value& x, const Value& e, const Value& w) {
  auto dims = BroadcastShapes(BroadcastShapes(x.dims(), e.dims()), w.dims());
  Value xb = BroadcastTo(x, dims), eb = BroadcastTo(e, dims), wb = BroadcastTo(w, dims);
  Value diff = ir::Binary(Op::kSub, eb, xb);
  if (xb.dtype() == DType::kF32) {
    // eager (float32, and bf16/f16 computed in float32): fmadd(w < 0.5 ? w : w - 1, end - self,
    // w < 0.5 ? self : end), one rounding
    Value small = ir::Compare(CompareDir::kLT, ir::Unary(Op::kAbs, wb), ir::Full(0.5, wb.shape()));
    return ir::Select(small, FusedMulAddF32(wb, diff, xb),
                      FusedMulAddF32(ir::Binary(Op::kSub, wb, ir::Full(1, wb.shape())), diff, eb));
  }
  Value lo = ir::Binary(Op::kAdd, xb, ir::Binary(Op::kMul, wb, diff));
  Value hi = ir::Binary(Op::kSub, eb, ir::Binary(Op::kMul, diff, ir::Binary(Op::kSub, ir::Full(1, wb.shape()), wb)));
  Value small = ir::Compare(CompareDir::kLT, ir::Unary(Op::kAbs, wb), ir::Full(0.5, wb.shape()));
  return ir::Select(small, lo, hi);
}

// Converts tensor argument k to the compute type.
Value In(const OpArgs& a, size_t k, DType t) { return Cast(a.V(k), t); }

// A float unary op: integer inputs compute in float32, as eager.
// f16/bf16 in float32, rounded once, as eager's kernels (XLA's own float16 logistic is computed at
// lower precision: a third of a float16 sigmoid's outputs were 1 ulp off).
OpFn FloatUnary(Op op) {
  return [op](OpArgs& a) -> V {
    DType t = FloatOf(a.V(0).dtype()), ct = OpMath(t);
    return {Cast(ir::Unary(op, Cast(a.V(0), ct)), t)};
  };
}
OpFn SameUnary(Op op) {
  return [op](OpArgs& a) -> V { return {ir::Unary(op, a.V(0))}; };
}

// self (op) other*alpha, other a tensor (k=1) or scalar.
OpFn AddSub(Op op, bool scalar_other, bool reverse) {
  return [=](OpArgs& a) -> V {
    const TensorArg& self = a.T(0);
    DType t = scalar_other ? ResultType({&self}, {&a.S(1)}) : ResultType({&self, &a.T(1)});
    if (op == Op::kSub) {
      bool self_bool = self.v.dtype() == DType::kPred;
      bool other_bool = scalar_other ? a.S(1).kind == Scalar::kBool : a.V(1).dtype() == DType::kPred;
      if (self_bool && other_bool) a.Fail("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead.");
      if (self_bool || other_bool) {
        a.Fail("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, "
               "use the `~` or `logical_not()` operator instead.");
      }
    }
    // bf16/f16: eager's add kernel first converts every operand to the result dtype (a Python
    // number or 0-dim tensor too: 70000.0 becomes inf in float16, so -inf + 70000.0 is nan) and
    // computes `self + alpha * other` in float32 from those values. With an alpha, its vectorized
    // body rounds once (a fused multiply-add), its scalar tail twice (the product, then the sum):
    // which elements take which follows eager's loop (EagerBodyOrTail; same-shaped operands).
    DType ct = OpMath(t);
    const bool reduced = ct != t;
    auto in_t = [&](const Value& v) { return reduced ? Cast(Cast(v, t), ct) : Cast(v, ct); };
    Value x = in_t(self.v);
    Value y = scalar_other ? in_t(ScalarV(a.S(1), reduced ? t : ct, a.device)) : in_t(a.V(1));
    auto result = [&](const Value& p, const Value& q) { return Cast(reverse ? Bin(op, q, p) : Bin(op, p, q), t); };
    const Scalar& alpha = a.S(2);
    if (!(alpha.AsDouble() == 1.0)) {
      Value al = in_t(ScalarV(alpha, reduced ? t : ct, a.device));
      Value& scaled = reverse ? x : y;
      Value product = Bin(Op::kMul, scaled, al);
      if (reduced) {
        const Value& other = reverse ? y : x;
        auto dims = BroadcastShapes(x.dims(), y.dims());
        // one loop over the result when each operand has its shape or one element (a broadcast
        // scalar); other broadcasts loop row by row: the tail's rounding, as before
        auto flat = [&](const Value& v) { return v.dims() == dims || v.shape().numel() == 1; };
        const bool same_shapes = flat(x) && flat(y);
        // the rounded product kept from a contraction into the sum (float16 arithmetic is native
        // on AVX512-FP16 CPUs, and LLVM fuses the half multiply and add: ir::ContractibleProduct)
        Value rounded = Cast(NoContract(Cast(product, t), a.device), ct);
        Value tail = reverse ? result(rounded, other) : result(other, rounded);
        if (!same_shapes) return {tail};
        Value body = reverse ? result(product, other) : result(other, product);
        return {EagerBodyOrTail(dims, body, tail)};
      }
      if (ct == DType::kF32) {
        // float32: eager's `self + alpha * other` is a fused multiply-add (vec::fmadd, and its
        // scalar tail is contracted to one as well): one rounding
        auto dims = BroadcastShapes(x.dims(), y.dims());
        Value xs = BroadcastTo(x, dims), ys = BroadcastTo(y, dims), as = BroadcastTo(al, dims);
        if (op == Op::kSub) as = ir::Unary(Op::kNeg, as);
        return {Cast(reverse ? FusedMulAddF32(xs, as, ys) : FusedMulAddF32(ys, as, xs), t)};
      }
      scaled = product;
    }
    if (t == DType::kPred) return {Bin(op == Op::kAdd ? Op::kOr : Op::kXor, x, y)};
    return {result(x, y)};
  };
}

OpFn BinaryArith(Op op, bool scalar_other) {
  return [=](OpArgs& a) -> V {
    const TensorArg& self = a.T(0);
    DType t = scalar_other ? ResultType({&self}, {&a.S(1)}) : ResultType({&self, &a.T(1)});
    DType ct = OpMath(t);
    Value x = ToOpMath(self.v, t);
    // bf16/f16 mul reads a one-element second operand unrounded (eager's mul_kernel scalar path);
    // max/min/pow round every operand to the result dtype first
    const bool original = op == Op::kMul && (scalar_other || a.V(1).shape().numel() == 1);
    Value y = scalar_other ? (original ? ScalarV(a.S(1), ct, a.device) : Cast(ScalarV(a.S(1), t, a.device), ct))
                           : (original ? Cast(a.V(1), ct) : ToOpMath(a.V(1), t));
    if (t == DType::kPred && op == Op::kMul) return {Bin(Op::kAnd, x, y)};
    return {Cast(Bin(op, x, y), t)};
  };
}

Value TrueDiv(const Value& x, const Value& y) { return Bin(Op::kDiv, x, y); }

// clamp by tensor bounds (all of the result's dtype). Floats: NaN if x or a bound is NaN; at ties
// (0.0 vs -0.0) eager's vectorized body gives the bound (vec::minimum(vec::maximum(x, lo), hi)), its
// scalar tail x (std::min(std::max(x, lo), hi)); which elements take which follows eager's loop
// when every operand has the result's shape or one element (other broadcasts: the body's choice).
Value ClampByTensors(const Value& x, const std::optional<Value>& lo, const std::optional<Value>& hi) {
  const DType t = x.dtype();
  if (!ir::IsFloating(t)) {
    Value r = x;
    if (lo) r = Bin(Op::kMax, r, *lo);
    if (hi) r = Bin(Op::kMin, r, *hi);
    return r;
  }
  std::vector<int64_t> dims = x.dims();
  if (lo) dims = BroadcastShapes(dims, lo->dims());
  if (hi) dims = BroadcastShapes(dims, hi->dims());
  std::vector<std::vector<int64_t>> inputs{x.dims()};
  if (lo) inputs.push_back(lo->dims());
  if (hi) inputs.push_back(hi->dims());
  Value xb = BroadcastTo(x, dims);
  std::optional<Value> lb, hb;
  if (lo) lb = BroadcastTo(*lo, dims);
  if (hi) hb = BroadcastTo(*hi, dims);
  auto lt = [](const Value& p, const Value& q) { return ir::Compare(CompareDir::kLT, p, q); };
  auto isnan = [](const Value& v) { return ir::Compare(CompareDir::kNE, v, v); };
  Value body = xb, tail = xb, nan = isnan(xb);
  if (lb) {
    body = ir::Select(lt(*lb, body), body, *lb);  // ties: the bound
    tail = ir::Select(lt(tail, *lb), *lb, tail);  // ties: x
    nan = ir::Binary(Op::kOr, nan, isnan(*lb));
  }
  if (hb) {
    body = ir::Select(lt(body, *hb), body, *hb);
    tail = ir::Select(lt(*hb, tail), *hb, tail);
    nan = ir::Binary(Op::kOr, nan, isnan(*hb));
  }
  const int bytes = t == DType::kF64 ? 8 : t == DType::kF32 ? 4 : 2;
  Value r = EagerLoopBodyOrTail(dims, inputs, body, tail, bytes);
  return ir::Select(nan, ir::Full(NAN, r.shape()), r);
}

Value FloorDivInt(const Value& x, const Value& y) {
  auto dims = BroadcastShapes(x.dims(), y.dims());
  Value a = BroadcastTo(x, dims), b = BroadcastTo(y, dims);
  Value q = ir::Binary(Op::kDiv, a, b);
  Value r = ir::Binary(Op::kRem, a, b);
  Value zero = ir::Full(0, r.shape());
  Value fix = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kNE, r, zero),
                         ir::Compare(CompareDir::kNE, ir::Compare(CompareDir::kLT, r, zero),
                                     ir::Compare(CompareDir::kLT, b, zero)));
  return ir::Select(fix, ir::Binary(Op::kSub, q, ir::Full(1, q.shape())), q);
}

// Eager's div_floor_floating: b == 0 gives a / b; otherwise the quotient of (a - fmod(a, b)) / b,
// corrected toward floor, rounded to nearest, with a signed zero for zero quotients. Infinite
// operands follow from fmod (NaN for a = inf, a itself for b = inf), as in eager.
// round_to (bf16/f16): every intermediate rounded to it, as eager's loops over two bf16/f16
// tensors compute (Vectorized<Half> arithmetic; 2048 // -0.897 is -2280 there, -2282 in float32).
Value FloorDivFloat(const Value& x, const Value& y, std::optional<DType> round_to = std::nullopt) {
  auto dims = BroadcastShapes(x.dims(), y.dims());
  Value a = BroadcastTo(x, dims), b = BroadcastTo(y, dims);
  const ir::Shape& s = a.shape();
  auto F = [&](double v) { return ir::Full(v, s); };
  auto R = [&](const Value& v) { return round_to ? Cast(Cast(v, *round_to), v.dtype()) : v; };
  auto lt0 = [&](const Value& v) { return ir::Compare(CompareDir::kLT, v, F(0)); };
  Value q = R(ir::Binary(Op::kDiv, a, b));
  Value mod = R(ir::Binary(Op::kRem, a, b));
  Value div = R(ir::Binary(Op::kDiv, R(ir::Binary(Op::kSub, a, mod)), b));
  Value fix = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kNE, mod, F(0)),
                         ir::Compare(CompareDir::kNE, lt0(b), lt0(mod)));
  div = ir::Select(fix, R(ir::Binary(Op::kSub, div, F(1))), div);
  Value fl = ir::Unary(Op::kFloor, div);
  fl = ir::Select(ir::Compare(CompareDir::kGT, R(ir::Binary(Op::kSub, div, fl)), F(0.5)), R(ir::Binary(Op::kAdd, fl, F(1))), fl);
  // div == 0: copysign(0, a / b).
  Value zero = ir::Select(lt0(q), F(-0.0), ir::Select(ir::Compare(CompareDir::kGT, q, F(0)), F(0), q));
  Value r = ir::Select(ir::Compare(CompareDir::kEQ, div, F(0)), zero, fl);
  return ir::Select(ir::Compare(CompareDir::kEQ, b, F(0)), q, r);
}

V DivMode(OpArgs& a, const Value& other_in, const std::optional<std::string>& mode, DType t) {
  // bf16/f16 with a one-element divisor: eager's scalar path reads the divisor unrounded
  // (`original_scalar_value`); otherwise both operands are rounded to the result dtype first
  auto divisor = [&](DType ft) {
    return other_in.shape().numel() == 1 ? Cast(other_in, OpMath(ft)) : ToOpMath(other_in, ft);
  };
  if (!mode) {
    DType ft = FloatOf(t);
    return {Cast(TrueDiv(ToOpMath(a.V(0), ft), divisor(ft)), ft)};
  }
  // Eager rounds the bf16/f16 quotient before trunc. It floors a one-element divisor in float32
  // (div_floor_floating), two tensors with every step rounded to the dtype.
  if (OpMath(t) != t && mode && *mode == "floor") {
    const bool scalar = other_in.shape().numel() == 1;
    return {Cast(FloorDivFloat(ToOpMath(a.V(0), t), divisor(t), scalar ? std::nullopt : std::optional<DType>(t)), t)};
  }
  if (OpMath(t) != t && *mode == "trunc" && other_in.shape().numel() == 1) {
    // eager's trunc division of float16/bfloat16 by a scalar (a Python number or a 0-dim tensor)
    // takes its CPU-scalar path: the divisor as given (not rounded to the dtype first: -inf / 70000.
    // is -inf, where the float16 divisor inf would give nan; fuzz seed 55128), the quotient
    // truncated in float32, then rounded once (float16 10000 / 3 is 3332, not 3334). A tensor
    // divisor keeps the form of eager's vectorized loop below (quotient rounded, then truncated).
    Value q = Bin(Op::kDiv, ToOpMath(a.V(0), t), divisor(t));
    q = ir::Select(ir::Compare(CompareDir::kLT, q, ir::Full(0, q.shape())), ir::Unary(Op::kCeil, q),
                   ir::Unary(Op::kFloor, q));
    return {Cast(q, t)};
  }
  Value x = Cast(a.V(0), t), y = Cast(other_in, t);
  if (ir::IsIntegral(t, true)) {
    if (ProductOf(BroadcastShapes(x.dims(), y.dims())) > 0) CheckNonZeroDivisor(y, a.device);  // per element, as eager
    if (*mode == "trunc") return {Bin(Op::kDiv, x, y)};
    return {FloorDivInt(x, y)};
  }
  Value q = Bin(Op::kDiv, x, y);
  if (*mode == "trunc") return {ir::Select(ir::Compare(CompareDir::kLT, q, ir::Full(0, q.shape())),
                                           ir::Unary(Op::kCeil, q), ir::Unary(Op::kFloor, q))};
  if (*mode == "floor") return {FloorDivFloat(x, y)};
  a.Fail("div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '" + *mode + "'");
}

OpFn Comparison(CompareDir d, bool scalar_other) {
  return [=](OpArgs& a) -> V {
    const TensorArg& self = a.T(0);
    DType t = scalar_other ? ResultType({&self}, {&a.S(1)}) : ResultType({&self, &a.T(1)});
    Value y = scalar_other ? ScalarV(a.S(1), t, a.device) : Cast(a.V(1), t);
    return {Cmp(d, Cast(self.v, t), y)};
  };
}

Value Sigmoid(const Value& x) { return ir::Unary(Op::kLogistic, x); }

// erf as eager computes it. XLA's single-precision erf clamps its argument to [-4, 4] and its
// polynomial gives 0.99999982 there, so erf never reaches +-1 and gelu's tails go wrong
// (gelu(-20) = -1.8e-6 instead of -0, gelu(-inf) = -inf instead of nan). In f32 erf(x) rounds to
// +-1 for |x| >= 3.9192 (where erfc(x) < 2^-25): select the exact value there. NaN stays NaN.
Value Erf(const Value& x) {
  Value e = ir::Unary(Op::kErf, x);
  if (x.dtype() == DType::kF64) return e;
  const ir::Shape& s = x.shape();
  Value big = ir::Compare(ir::CompareDir::kGE, ir::Unary(Op::kAbs, x), ir::Full(3.9192, s));
  return ir::Select(big, ir::Unary(Op::kSign, x), e);
}

Value Gelu(const Value& x, const std::string& approx) {
  const ir::Shape& s = x.shape();
  if (approx == "tanh") {
    Value inner = ir::Binary(Op::kMul, ir::Full(std::sqrt(2.0 / M_PI), s),
                             ir::Binary(Op::kAdd, x, ir::Binary(Op::kMul, ir::Full(0.044715, s),
                                                                ir::Binary(Op::kMul, x, ir::Binary(Op::kMul, x, x)))));
    return ir::Binary(Op::kMul, ir::Binary(Op::kMul, ir::Full(0.5, s), x),
                      ir::Binary(Op::kAdd, ir::Full(1, s), ir::Unary(Op::kTanh, inner)));
  }
  Value cdf = ir::Binary(Op::kMul, ir::Full(0.5, s),
                         ir::Binary(Op::kAdd, ir::Full(1, s),
                                    Erf(ir::Binary(Op::kMul, x, ir::Full(M_SQRT1_2, s)))));
  return ir::Binary(Op::kMul, x, cdf);
}

Value GeluBackward(const Value& g, const Value& x, const std::string& approx) {
  const ir::Shape& s = x.shape();
  auto F = [&](double v) { return ir::Full(v, s); };
  auto mul = [](const Value& p, const Value& q) { return ir::Binary(Op::kMul, p, q); };
  auto add = [](const Value& p, const Value& q) { return ir::Binary(Op::kAdd, p, q); };
  if (approx == "tanh") {
    const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
    Value x2 = mul(x, x);
    Value inner = mul(F(k), add(x, mul(F(c), mul(x2, x))));
    Value t = ir::Unary(Op::kTanh, inner);
    Value left = mul(F(0.5), add(F(1), t));
    Value dinner = mul(F(k), add(F(1), mul(F(3 * c), x2)));
    Value right = mul(mul(F(0.5), x), mul(ir::Binary(Op::kSub, F(1), mul(t, t)), dinner));
    return mul(g, add(left, right));
  }
  Value cdf = mul(F(0.5), add(F(1), Erf(mul(x, F(M_SQRT1_2)))));
  Value pdf = mul(F(0.5 * M_2_SQRTPI * M_SQRT1_2), ir::Unary(Op::kExp, mul(F(-0.5), mul(x, x))));
  return mul(g, add(cdf, mul(x, pdf)));
}

// Elementwise rows with tensor operands all converted to the promoted type.
template <typename F>
OpFn Promoted(F f, std::vector<size_t> tensors) {
  return [f, tensors](OpArgs& a) -> V {
    std::vector<const TensorArg*> ts;
    for (size_t k : tensors) ts.push_back(&a.T(k));
    DType t = ResultType(ts);
    return {f(a, t)};
  };
}

}  // namespace

void AddElementwiseRows(std::vector<OpRow>& rows) {
  rows.push_back({"add.Tensor", AddSub(Op::kAdd, false, false)});
  rows.push_back({"add.Scalar", AddSub(Op::kAdd, true, false)});
  rows.push_back({"sub.Tensor", AddSub(Op::kSub, false, false)});
  rows.push_back({"sub.Scalar", AddSub(Op::kSub, true, false)});
  rows.push_back({"rsub.Tensor", AddSub(Op::kSub, false, true)});
  rows.push_back({"rsub.Scalar", AddSub(Op::kSub, true, true)});
  rows.push_back({"mul.Tensor", BinaryArith(Op::kMul, false)});
  rows.push_back({"mul.Scalar", BinaryArith(Op::kMul, true)});
  for (bool is_max : {true, false}) {
    rows.push_back({is_max ? "maximum" : "minimum", [is_max, arith = BinaryArith(is_max ? Op::kMax : Op::kMin, false)](OpArgs& a) -> V {
      DType t = ResultType({&a.T(0), &a.T(1)});
      if (!ir::IsFloating(t)) return arith(a);
      // Floats: NaN if either is NaN; at ties (0.0 vs -0.0) eager's vectorized body gives the
      // second operand, its scalar tail (std::max/min) the first. Which elements take which follows
      // eager's loop when each operand has the result's shape or one element; other broadcasts
      // loop row by row (the body's choice, as before).
      DType ct = OpMath(t);
      auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
      Value x = BroadcastTo(ToOpMath(a.V(0), t), dims), y = BroadcastTo(ToOpMath(a.V(1), t), dims);
      const CompareDir wins = is_max ? CompareDir::kGT : CompareDir::kLT;
      Value body = ir::Select(ir::Compare(wins, x, y), x, y);
      Value tail = ir::Select(ir::Compare(wins, y, x), y, x);
      Value r = EagerLoopBodyOrTail(dims, {a.V(0).dims(), a.V(1).dims()}, body, tail, t == DType::kF64 ? 8 : t == DType::kF32 ? 4 : 2);
      Value nan = ir::Binary(Op::kOr, ir::Compare(CompareDir::kNE, x, x), ir::Compare(CompareDir::kNE, y, y));
      return {Cast(ir::Select(nan, ir::Full(NAN, x.shape()), r), t)};
    }});
  }
  rows.push_back({"div.Tensor", [](OpArgs& a) -> V {
    return DivMode(a, a.V(1), std::nullopt, ResultType({&a.T(0), &a.T(1)}));
  }});
  rows.push_back({"div.Scalar", [](OpArgs& a) -> V {
    DType t = FloatOf(ResultType({&a.T(0)}, {&a.S(1)})), ct = OpMath(t);
    return {Cast(Bin(Op::kDiv, ToOpMath(a.V(0), t), ScalarV(a.S(1), ct, a.device)), t)};
  }});
  rows.push_back({"div.Tensor_mode", [](OpArgs& a) -> V {
    std::optional<std::string> mode;
    if (!a.IsNone(2)) mode = a.Str(2);
    return DivMode(a, a.V(1), mode, ResultType({&a.T(0), &a.T(1)}));
  }});
  rows.push_back({"pow.Tensor_Scalar", [](OpArgs& a) -> V {
    const Scalar& e = a.S(1);
    DType t = ResultType({&a.T(0)}, {&e});
    Value x = Cast(a.V(0), t);
    double ev = e.AsDouble();
    if (ev == 1.0) return {x};
    if (ev == 0.0) return {ir::Full(1, x.shape())};  // eager fills ones (any base, bool included)
    // bf16/f16: eager's kernels take the exponent in the tensor's dtype (x ** 3.0004 is x ** 3.0,
    // and bf16 takes its cube form); float16 has no special forms: std::pow throughout
    if (t == DType::kBF16 || t == DType::kF16) ev = RoundToFloatType(ev, t);
    if (ir::IsIntegral(t, true)) {
      if (ev == 2.0) return {ir::Binary(Op::kMul, x, x)};
      if (ev < 0 && e.kind != Scalar::kFloat) {
        a.Fail("Integers to negative integer powers are not allowed.");
      }
      return {Bin(Op::kPow, x, ScalarV(e, t, a.device))};
    }
    // Eager's CPU kernel special-cases these exponents (sqrt(-0.) = -0., rsqrt(-inf) = NaN, ...).
    DType ct = OpMath(t);
    Value xc = Cast(x, ct);
    auto one = [&] { return ir::Full(1, xc.shape()); };
    Value r;
    // bf16 (not f16): eager's cube and inverse square round the square to bf16 first
    auto square = [&] {
      Value sq = ir::Binary(Op::kMul, xc, xc);
      return t == DType::kBF16 ? Cast(Cast(sq, t), ct) : sq;
    };
    auto is = [&](double v) { return ir::Compare(CompareDir::kEQ, xc, ir::Full(v, xc.shape())); };
    if (ev == 2.0) r = ir::Binary(Op::kMul, xc, xc);
    else if (ev == 3.0) r = ir::Binary(Op::kMul, square(), xc);
    else if (ev == 0.5) {
      r = ir::Unary(Op::kSqrt, xc);
      // float16's pow(-0., 0.5) = 0, pow(-inf, 0.5) = inf (sqrt gives -0. and nan); bfloat16's too
      // when the exponent only rounds to 0.5 (eager's square-root dispatch tests the exponent as given)
      if (t == DType::kF16 || (t == DType::kBF16 && e.AsDouble() != 0.5)) r = ir::Select(is(0), ir::Full(0, xc.shape()), ir::Select(is(-INFINITY), ir::Full(INFINITY, xc.shape()), r));
    } else if (ev == -0.5) {
      if (t == DType::kBF16) {
        // eager's bf16 kernel (an AVX512 build): its vectorized body rounds 1 / sqrt(x) once, its
        // scalar tail rounds the square root first
        Value body = Cast(ir::Unary(Op::kRsqrt, xc), t);
        Value tail = Cast(ir::Binary(Op::kDiv, one(), Cast(Cast(ir::Unary(Op::kSqrt, xc), t), ct)), t);
        r = Cast(EagerBodyOrTail(xc.dims(), body, tail, 2, true), ct);
      } else {
        r = ir::Unary(Op::kRsqrt, xc);
      }
      // float16's pow(+-0., -0.5) = inf, pow(-inf, -0.5) = 0
      if (t == DType::kF16) r = ir::Select(is(0), ir::Full(INFINITY, xc.shape()), ir::Select(is(-INFINITY), ir::Full(0, xc.shape()), r));
    }
    else if (ev == -1.0) r = ir::Binary(Op::kDiv, one(), xc);
    else if (ev == -2.0) r = ir::Binary(Op::kDiv, one(), square());
    // f16/bf16: eager converts the exponent to the tensor's dtype first (x ** 1.7 is x ** 1.703125
    // in bf16), then computes in float32
    else r = Bin(Op::kPow, xc, ct == t ? ScalarV(e, ct, a.device) : ScalarV(ev, ct, a.device));
    return {Cast(r, t)};
  }});
  rows.push_back({"pow.Tensor_Tensor", BinaryArith(Op::kPow, false)});
  rows.push_back({"pow.Scalar", [](OpArgs& a) -> V {
    const Scalar& base = a.S(0);
    const TensorArg& e = a.T(1);
    DType t = ResultType({&e}, {&base});
    return {Bin(Op::kPow, ScalarV(base, t, a.device), Cast(e.v, t))};
  }});

  rows.push_back({"neg", SameUnary(Op::kNeg)});
  rows.push_back({"abs", SameUnary(Op::kAbs)});
  rows.push_back({"exp", FloatUnary(Op::kExp)});
  rows.push_back({"expm1", FloatUnary(Op::kExpm1)});
  rows.push_back({"log", FloatUnary(Op::kLog)});
  rows.push_back({"log1p", FloatUnary(Op::kLog1p)});
  rows.push_back({"sqrt", FloatUnary(Op::kSqrt)});
  rows.push_back({"rsqrt", [](OpArgs& a) -> V {
    // bf16/f16: eager's vectorized loop body rounds 1 / sqrt(x) once, its scalar tail rounds the
    // square root first (an RMSNorm's [batch, seq, 1] statistics are mostly tail)
    Value x = a.V(0);
    DType t = FloatOf(x.dtype()), ct = OpMath(t);
    Value xf = Cast(x, ct), body = Cast(ir::Unary(Op::kRsqrt, xf), t);
    if (ct == t) return {body};
    Value tail = Cast(Bin(Op::kDiv, ir::Full(1, ir::Shape(ct, {})), Cast(Cast(ir::Unary(Op::kSqrt, xf), t), ct)), t);
    return {EagerBodyOrTail(x.dims(), body, tail)};
  }});
  rows.push_back({"sin", FloatUnary(Op::kSin)});
  rows.push_back({"cos", FloatUnary(Op::kCos)});
  rows.push_back({"tan", FloatUnary(Op::kTan)});
  rows.push_back({"tanh", FloatUnary(Op::kTanh)});
  rows.push_back({"erf", [](OpArgs& a) -> V { return {Erf(Cast(a.V(0), FloatOf(a.V(0).dtype())))}; }});
  rows.push_back({"sigmoid", FloatUnary(Op::kLogistic)});
  rows.push_back({"floor", [](OpArgs& a) -> V {
    return {ir::IsIntegral(a.V(0).dtype(), true) ? a.V(0) : ir::Unary(Op::kFloor, a.V(0))};
  }});
  rows.push_back({"ceil", [](OpArgs& a) -> V {
    return {ir::IsIntegral(a.V(0).dtype(), true) ? a.V(0) : ir::Unary(Op::kCeil, a.V(0))};
  }});
  rows.push_back({"round", [](OpArgs& a) -> V {
    return {ir::IsIntegral(a.V(0).dtype(), true) ? a.V(0) : ir::Unary(Op::kRoundEven, a.V(0))};
  }});
  rows.push_back({"sign", [](OpArgs& a) -> V {
    if (a.V(0).dtype() == DType::kPred) return {a.V(0)};
    if (ir::IsUnsigned(a.V(0).dtype())) {  // 0 or 1
      Value x = a.V(0);
      return {Cast(ir::Compare(CompareDir::kNE, x, ir::Full(0, x.shape())), x.dtype())};
    }
    Value x = a.V(0);
    if (ir::IsFloating(x.dtype())) {
      const ir::Shape& sh = x.shape();
      Value z = ir::Full(0, sh);
      return {ir::Select(ir::Compare(CompareDir::kGT, x, z), ir::Full(1, sh),
                         ir::Select(ir::Compare(CompareDir::kLT, x, z), ir::Full(-1, sh), z))};
    }
    return {ir::Unary(Op::kSign, x)};
  }});
  rows.push_back({"logical_not", [](OpArgs& a) -> V {
    return {ir::Unary(Op::kNot, Cast(a.V(0), DType::kPred))};
  }});
  rows.push_back({"bitwise_not", SameUnary(Op::kNot)});
  rows.push_back({"reciprocal", [](OpArgs& a) -> V {
    Value x = Cast(a.V(0), FloatOf(a.V(0).dtype()));
    return {ir::Binary(Op::kDiv, ir::Full(1, x.shape()), x)};
  }});
  rows.push_back({"relu", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.dtype() == DType::kPred) a.Fail("\"clamp_min_scalar_cpu\" not implemented for 'Bool'");
    return {ir::Binary(Op::kMax, ir::Full(0, x.shape()), x)};  // ties give x: relu(-0.0) = -0.0
  }});
  rows.push_back({"gelu", [](OpArgs& a) -> V {
    // f16/bf16 in f32, rounded once, as eager (1 + erf(x) cancels in the tail otherwise)
    DType t = a.V(0).dtype();
    std::string approx = a.IsNone(1) ? "none" : a.Str(1);
    Value x = Cast(a.V(0), OpMath(t));
    Value y = Gelu(x, approx);
    if (approx == "none" && (t == DType::kF32 || t == DType::kBF16) && x.shape().numel() != 1) {
      // eager's vectorized f32/bf16 kernel gives nan at +inf as well (its f64 and f16 give inf);
      // a one-element tensor takes its scalar path, which gives inf (fuzz seed 9810)
      y = ir::Select(ir::Compare(ir::CompareDir::kEQ, x, ir::Full(INFINITY, x.shape())), ir::Full(NAN, x.shape()), y);
    }
    return {Cast(y, t)};
  }});
  rows.push_back({"gelu_backward", [](OpArgs& a) -> V {
    // Mixed dtypes (a bf16 grad of an f32 input) promote, as eager's TensorIterator does.
    DType t = ResultType({&a.T(0), &a.T(1)}), ct = OpMath(t);
    return {Cast(GeluBackward(Cast(a.V(0), ct), Cast(a.V(1), ct), a.IsNone(2) ? "none" : a.Str(2)), t)};
  }});
  // f16/bf16: eager computes in float32 and rounds once (silu's sigmoid rounded to bf16 first put a
  // quarter of a bf16 silu's outputs 1 ulp off).
  rows.push_back({"silu", [](OpArgs& a) -> V {
    DType t = a.V(0).dtype();
    Value x = Cast(a.V(0), OpMath(t));
    return {Cast(ir::Binary(Op::kMul, x, Sigmoid(x)), t)};
  }});
  rows.push_back({"silu_backward", [](OpArgs& a) -> V {  // (grad, self): dy * s * (1 + x * (1 - s))
    DType t = ResultType({&a.T(0), &a.T(1)}), ct = OpMath(t);
    Value g = Cast(Cast(a.V(0), t), ct), x = Cast(Cast(a.V(1), t), ct);
    Value sg = Sigmoid(x), one = ir::Full(1, x.shape());
    Value r = ir::Binary(Op::kMul, ir::Binary(Op::kMul, g, sg),
                         ir::Binary(Op::kAdd, one, ir::Binary(Op::kMul, x, ir::Binary(Op::kSub, one, sg))));
    return {Cast(r, t)};
  }});
  rows.push_back({"mish_backward", [](OpArgs& a) -> V {
    // (grad, self): dy * (t + x * s * (1 - t * t)), t = tanh(softplus(x)), s = sigmoid(x): eager's
    // CPU kernel, in float32 for bf16/f16 and rounded once (see silu_backward); mixed dtypes
    // compute in their common dtype and give self's, as eager's
    DType t = ResultType({&a.T(0), &a.T(1)}), out = a.V(1).dtype();
    if (!ir::IsFloating(t) || !ir::IsFloating(out)) throw NotLowered{};
    DType ct = OpMath(t);
    Value g = Cast(Cast(a.V(0), t), ct), x = Cast(Cast(a.V(1), t), ct);
    auto dims = BroadcastShapes(g.dims(), x.dims());
    g = BroadcastTo(g, dims), x = BroadcastTo(x, dims);
    Value one = ir::Full(1, x.shape());
    Value th = ir::Unary(Op::kTanh, ir::Unary(Op::kLog1p, ir::Unary(Op::kExp, x)));
    Value inner = ir::Binary(Op::kMul, ir::Binary(Op::kMul, x, Sigmoid(x)),
                             ir::Binary(Op::kSub, one, ir::Binary(Op::kMul, th, th)));
    return {Cast(Cast(ir::Binary(Op::kMul, g, ir::Binary(Op::kAdd, th, inner)), t), out)};
  }});
  // Mixed-dtype backward calls (a bf16 grad of an f32 output, or the reverse) promote both operands
  // to their common dtype, as eager's TensorIterator does; same-dtype calls compute as before.
  // f16/bf16 in float32, rounded once, as eager's kernels.
  rows.push_back({"sigmoid_backward", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)}), ct = OpMath(t);
    Value g = Cast(Cast(a.V(0), t), ct), y = Cast(Cast(a.V(1), t), ct);
    return {Cast(Bin(Op::kMul, g, ir::Binary(Op::kMul, y, ir::Binary(Op::kSub, ir::Full(1, y.shape()), y))), t)};
  }});
  rows.push_back({"tanh_backward", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)}), ct = OpMath(t);
    Value g = Cast(Cast(a.V(0), t), ct), y = Cast(Cast(a.V(1), t), ct);
    return {Cast(Bin(Op::kMul, g, ir::Binary(Op::kSub, ir::Full(1, y.shape()), ir::Binary(Op::kMul, y, y))), t)};
  }});
  rows.push_back({"threshold_backward", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)});
    Value x = Cast(a.V(1), t), g = Cast(a.V(0), t);
    Value th = ScalarV(a.S(2), x.dtype(), a.device);
    return {Where(Cmp(CompareDir::kLE, x, th), ir::Full(0, g.shape()), g)};
  }});

  rows.push_back({"eq.Tensor", Comparison(CompareDir::kEQ, false)});
  rows.push_back({"eq.Scalar", Comparison(CompareDir::kEQ, true)});
  rows.push_back({"ne.Tensor", Comparison(CompareDir::kNE, false)});
  rows.push_back({"ne.Scalar", Comparison(CompareDir::kNE, true)});
  rows.push_back({"lt.Tensor", Comparison(CompareDir::kLT, false)});
  rows.push_back({"lt.Scalar", Comparison(CompareDir::kLT, true)});
  rows.push_back({"le.Tensor", Comparison(CompareDir::kLE, false)});
  rows.push_back({"le.Scalar", Comparison(CompareDir::kLE, true)});
  rows.push_back({"gt.Tensor", Comparison(CompareDir::kGT, false)});
  rows.push_back({"gt.Scalar", Comparison(CompareDir::kGT, true)});
  rows.push_back({"ge.Tensor", Comparison(CompareDir::kGE, false)});
  rows.push_back({"ge.Scalar", Comparison(CompareDir::kGE, true)});
  for (auto [name, op] : {std::pair{"logical_and", Op::kAnd}, {"logical_or", Op::kOr}, {"logical_xor", Op::kXor}}) {
    rows.push_back({name, [op = op](OpArgs& a) -> V {
      // eager converts both operands to their common dtype first: a 0-dim 1e-40 with a float16
      // tensor is 0 (False) there (fuzz seed 67429)
      DType t = ResultType({&a.T(0), &a.T(1)});
      return {Bin(op, Cast(Cast(a.V(0), t), DType::kPred), Cast(Cast(a.V(1), t), DType::kPred))};
    }});
  }

  rows.push_back({"where.self", Promoted([](OpArgs& a, DType t) {
    return Where(Cast(a.V(0), DType::kPred), Cast(a.V(1), t), Cast(a.V(2), t));
  }, {1, 2})});
  rows.push_back({"masked_fill.Scalar", [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {Where(a.V(1), ScalarV(a.S(2), x.dtype(), a.device), x)};
  }});
  rows.push_back({"masked_fill.Tensor", [](OpArgs& a) -> V {
    Value x = a.V(0);
    return {Where(a.V(1), Cast(a.V(2), x.dtype()), x)};
  }});
  rows.push_back({"clamp", [](OpArgs& a) -> V {
    std::vector<const Scalar*> ss;
    auto lo = a.OptS(1), hi = a.OptS(2);
    if (lo) ss.push_back(&*lo);
    if (hi) ss.push_back(&*hi);
    DType t = ResultType({&a.T(0)}, ss);
    Value x = Cast(a.V(0), t);
    // Max/min give their second operand at ties (eager's maximum); eager's scalar clamp keeps x.
    if (lo) x = Bin(Op::kMax, ScalarV(*lo, t, a.device), x);
    if (hi) x = Bin(Op::kMin, ScalarV(*hi, t, a.device), x);
    return {x};
  }});
  rows.push_back({"clamp.Tensor", [](OpArgs& a) -> V {
    std::vector<const TensorArg*> ts{&a.T(0)};
    if (a.OptV(1)) ts.push_back(&a.T(1));
    if (a.OptV(2)) ts.push_back(&a.T(2));
    DType t = ResultType(ts);
    return {ClampByTensors(Cast(a.V(0), t), a.OptV(1) ? std::optional<Value>(Cast(*a.OptV(1), t)) : std::nullopt,
                           a.OptV(2) ? std::optional<Value>(Cast(*a.OptV(2), t)) : std::nullopt)};
  }});
  rows.push_back({"clamp_min", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0)}, {&a.S(1)});
    return {Bin(Op::kMax, ScalarV(a.S(1), t, a.device), Cast(a.V(0), t))};  // ties keep x (see clamp)
  }});
  rows.push_back({"clamp_max", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0)}, {&a.S(1)});
    return {Bin(Op::kMin, ScalarV(a.S(1), t, a.device), Cast(a.V(0), t))};
  }});
  rows.push_back({"clamp_min.Tensor", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)});
    return {ClampByTensors(Cast(a.V(0), t), Cast(a.V(1), t), std::nullopt)};
  }});
  rows.push_back({"clamp_max.Tensor", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)});
    return {ClampByTensors(Cast(a.V(0), t), std::nullopt, Cast(a.V(1), t))};
  }});
  rows.push_back({"lerp.Scalar", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)}), ct = OpMath(t);
    const Scalar& w = a.S(2);
    if ((ct == DType::kF32 || ct == DType::kF64) && w.kind != Scalar::kComplex) {
      // A number weight: eager's branch (|w| < 0.5) is known here, and so is w - 1 (computed in
      // the weight's compute type, as eager's kernel does): the formula of Lerp above with the
      // select decided on the host, half the nodes (the optimizers' lerp_ of every state tensor).
      Value x = ToOpMath(a.V(0), t), e = ToOpMath(a.V(1), t);
      auto dims = BroadcastShapes(x.dims(), e.dims());
      Value xb = BroadcastTo(x, dims), eb = BroadcastTo(e, dims);
      Value diff = ir::Binary(Op::kSub, eb, xb);
      Value r;
      if (ct == DType::kF32) {
        float wf = static_cast<float>(w.AsDouble());
        bool small = std::fabs(wf) < 0.5f;
        Value coef = BroadcastTo(ScalarV(small ? wf : wf - 1.0f, ct, a.device), dims);
        r = FusedMulAddF32(coef, diff, small ? xb : eb);
      } else {
        double wd = w.AsDouble();
        if (std::fabs(wd) < 0.5) {
          r = ir::Binary(Op::kAdd, xb, ir::Binary(Op::kMul, BroadcastTo(ScalarV(wd, ct, a.device), dims), diff));
        } else {
          r = ir::Binary(Op::kSub, eb, ir::Binary(Op::kMul, diff, BroadcastTo(ScalarV(1.0 - wd, ct, a.device), dims)));
        }
      }
      return {Cast(r, t)};
    }
    return {Cast(Lerp(ToOpMath(a.V(0), t), ToOpMath(a.V(1), t), ScalarV(w, ct, a.device)), t)};
  }});
  rows.push_back({"lerp.Tensor", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1), &a.T(2)});
    return {Cast(Lerp(ToOpMath(a.V(0), t), ToOpMath(a.V(1), t), ToOpMath(a.V(2), t)), t)};
  }});
  // self + value * t1 * t2 and self + value * t1 / t2, associated as eager's kernels write them
  // ((value * t1) first: the other order rounds differently; Adam's addcdiv_ step was 1 ulp off)
  rows.push_back({"addcmul", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1), &a.T(2)}), ct = OpMath(t);
    Value p = ToOpMath(a.V(1), t);
    if (a.S(3).AsDouble() != 1.0) p = Bin(Op::kMul, ScalarV(a.S(3), ct, a.device), p);
    p = Bin(Op::kMul, p, ToOpMath(a.V(2), t));
    return {Cast(Bin(Op::kAdd, ToOpMath(a.V(0), t), p), t)};
  }});
  rows.push_back({"addcdiv", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1), &a.T(2)}), ct = OpMath(t);
    Value p = ToOpMath(a.V(1), t);
    if (a.S(3).AsDouble() != 1.0) p = Bin(Op::kMul, ScalarV(a.S(3), ct, a.device), p);
    p = Bin(Op::kDiv, p, ToOpMath(a.V(2), t));
    return {Cast(Bin(Op::kAdd, ToOpMath(a.V(0), t), p), t)};
  }});
  (void)In;
}

}  // namespace txla::ops
