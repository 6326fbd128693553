// Op table rows: special functions and bit-level elementwise ops PyTorch/XLA lowers that the OpInfo
// survey (scripts/opinfo_fallbacks.py) found on the CPU fallback: lgamma, digamma, polygamma, erfc
// (CHLO's decompositions, with eager's poles and signed zeros patched in; polygamma for n <= 1), signbit and copysign (bit
// level: NaN's sign bit counts, as eager's), heaviside, sinc, special_entr, special_xlog1py,
// nextafter, gcd/lcm (Euclid's loop unrolled to its worst case for the dtype's width). Each keeps
// eager's dtype rules; a dtype eager's kernel refuses goes to the CPU fallback, which raises eager's
// error.
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

Value C(double v, const Value& like) { return ir::Full(v, like.shape()); }
Value CInt(int64_t v, const Value& like) { return ir::BroadcastInDim(ir::ConstantInt(v, like.dtype()), like.dims(), {}); }
Value Add(const Value& a, const Value& b) { return ir::Binary(Op::kAdd, a, b); }
Value Sub(const Value& a, const Value& b) { return ir::Binary(Op::kSub, a, b); }
Value Mul(const Value& a, const Value& b) { return ir::Binary(Op::kMul, a, b); }
Value Div(const Value& a, const Value& b) { return ir::Binary(Op::kDiv, a, b); }
Value IsNan(const Value& x) { return ir::Compare(CompareDir::kNE, x, x); }
Value Lt(const Value& a, const Value& b) { return ir::Compare(CompareDir::kLT, a, b); }
Value Gt(const Value& a, const Value& b) { return ir::Compare(CompareDir::kGT, a, b); }
Value Eq(const Value& a, const Value& b) { return ir::Compare(CompareDir::kEQ, a, b); }
Value Ne(const Value& a, const Value& b) { return ir::Compare(CompareDir::kNE, a, b); }
Value And(const Value& a, const Value& b) { return ir::Binary(Op::kAnd, a, b); }
Value Or(const Value& a, const Value& b) { return ir::Binary(Op::kOr, a, b); }
Value Floor(const Value& x) { return ir::Unary(Op::kFloor, x); }

constexpr double kPi = 3.14159265358979323846;

// The signed integer type of a float's width (bitcasts).
DType BitsOf(DType t) {
  switch (t) {
    case DType::kF16: case DType::kBF16: return DType::kS16;
    case DType::kF64: return DType::kS64;
    default: return DType::kS32;
  }
}
int64_t SignBit(DType bits) {
  return bits == DType::kS16 ? std::numeric_limits<int16_t>::min()
         : bits == DType::kS64 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int32_t>::min();
}

// A float unary op: integers and bool compute in float32, bf16/f16 in float32 rounded once.
OpFn FloatUnary(std::function<Value(const Value&)> f) {
  return [f](OpArgs& a) -> V {
    DType in = a.V(0).dtype();
    if (ir::IsComplex(in)) throw NotLowered{};
    DType out = FloatOf(in);
    return {Cast(f(Cast(a.V(0), OpMath(out))), out)};
  };
}
// A float binary op of two tensors (broadcast; eager's result_type, integers to float).
OpFn FloatBinary(std::function<Value(const Value&, const Value&)> f) {
  return [f](OpArgs& a) -> V {
    if (ir::IsComplex(a.V(0).dtype()) || ir::IsComplex(a.V(1).dtype())) throw NotLowered{};
    DType out = FloatOf(ResultType({&a.T(0), &a.T(1)}));
    DType ct = OpMath(out);
    auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
    Value x = Cast(Cast(a.V(0), out), ct), y = Cast(Cast(a.V(1), out), ct);
    return {Cast(f(BroadcastTo(x, dims), BroadcastTo(y, dims)), out)};
  };
}

Value IsInteger(const Value& x) { return Eq(Floor(x), x); }

// digamma with eager's poles: +-0 -> -+inf (copysign(inf, -x)), negative integers and -inf -> NaN.
Value Digamma(const Value& x) {
  Value r = ir::Unary(Op::kDigamma, x);
  Value zero = Eq(x, C(0, x));
  Value pole = And(Lt(x, C(0, x)), IsInteger(x));
  Value inf0 = ir::Select(Lt(Div(C(1, x), x), C(0, x)), C(INFINITY, x), C(-INFINITY, x));  // 1 / -0 < 0
  r = ir::Select(pole, C(NAN, x), r);
  r = ir::Select(Eq(x, C(INFINITY, x)), x, r);
  return ir::Select(zero, inf0, r);
}

// lgamma: +inf at 0, at the negative integers and at +-inf; NaN stays NaN.
Value Lgamma(const Value& x) {
  Value r = ir::Unary(Op::kLgamma, x);
  // Below the smallest normal number lgamma(x) = -log|x| to within rounding; XLA's lgamma reads a
  // denormal as the smallest normal (f32: 88.7 for every denormal, eager 89-103).
  const ir::DType t = x.shape().dtype;
  const double tiny = t == ir::DType::kF64 ? 0x1p-1022 : t == ir::DType::kF16 ? 0x1p-14 : 0x1p-126;
  Value ax = ir::Unary(Op::kAbs, x);
  r = ir::Select(Lt(ax, C(tiny, x)), ir::Unary(Op::kNeg, ir::Unary(Op::kLog, ax)), r);
  Value pole = And(Lt(x, C(1, x)), IsInteger(x));  // 0, -1, -2, ... and -inf
  r = ir::Select(Or(Eq(x, C(1, x)), Eq(x, C(2, x))), C(0, x), r);  // exactly 0, as eager
  return ir::Select(Or(pole, Eq(x, C(INFINITY, x))), C(INFINITY, x), r);
}

// Eager's trigamma (series of 6 terms plus the asymptotic tail; reflection below 1/2).
Value Trigamma(const Value& x0) {
  Value x = x0;
  Value refl = Lt(x, C(0.5, x));
  Value s = ir::Unary(Op::kSin, Mul(C(kPi, x), x));
  Value result = ir::Select(refl, ir::Unary(Op::kNeg, Div(C(kPi * kPi, x), Mul(s, s))), C(0, x));
  x = ir::Select(refl, Sub(C(1, x), x), x);
  for (int i = 0; i < 6; ++i) {
    result = Add(result, Div(C(1, x), Mul(x, x)));
    x = Add(x, C(1, x));
  }
  Value ixx = Div(C(1, x), Mul(x, x));
  Value tail = Sub(C(1.0 / 30, x), Mul(ixx, C(1.0 / 42, x)));
  tail = Sub(C(1.0 / 6, x), Mul(ixx, tail));
  tail = Add(Add(C(1, x), Div(C(1, x), Mul(C(2, x), x))), Mul(ixx, tail));
  result = Add(result, Div(tail, x));
  return ir::Select(refl, ir::Unary(Op::kNeg, result), result);
}

// Euclid's algorithm as eager's calc_gcd (a = |a|, b = |b|; while a != 0: (a, b) = (b % a, a)),
// unrolled to the longest run of the dtype's width (consecutive Fibonacci numbers).
Value Gcd(Value a, Value b) {
  a = ir::Unary(Op::kAbs, a);
  b = ir::Unary(Op::kAbs, b);
  int steps;
  switch (a.dtype()) {
    case DType::kS8: case DType::kU8: steps = 13; break;
    case DType::kS16: case DType::kU16: steps = 25; break;
    case DType::kS32: case DType::kU32: steps = 48; break;
    default: steps = 94; break;
  }
  Value zero = C(0, a), one = C(1, a);
  for (int i = 0; i < steps; ++i) {
    Value nz = Ne(a, zero);
    Value r = ir::Binary(Op::kRem, b, ir::Select(nz, a, one));
    Value na = ir::Select(nz, r, a);
    b = ir::Select(nz, a, b);
    a = na;
  }
  return b;
}

// frexp in integer arithmetic on the bits (no float arithmetic, so denormals are exact though
// XLA:CPU flushes them in arithmetic): normal x = m * 2^e with m in [0.5, 1); a denormal's mantissa
// field, converted to a float (exact), is normalized the same way; 0, inf and NaN give (x, 0).
std::vector<Value> Frexp(const Value& x) {
  DType t = x.dtype(), bt = BitsOf(t);
  int mbits = t == DType::kF64 ? 52 : t == DType::kF16 ? 10 : t == DType::kBF16 ? 7 : 23;
  int64_t emask = t == DType::kF64 ? 0x7ff : t == DType::kF16 ? 0x1f : 0xff;
  int64_t bias = emask / 2 - 1;  // 126 for f32: the exponent field of a mantissa in [0.5, 1)
  Value bits = ir::BitcastConvert(x, bt);
  auto K = [&](int64_t v) { return CInt(v, bits); };
  auto shr = [&](const Value& v, int n) { return ir::Binary(Op::kShiftRightLogical, v, K(n)); };
  int64_t mmask = (int64_t{1} << mbits) - 1;
  Value field = And(shr(bits, mbits), K(emask));
  Value mant = And(bits, K(mmask));
  Value sign = And(bits, K(SignBit(bt)));
  // Normal numbers.
  Value n_m = Or(Or(sign, mant), K(bias << mbits));
  Value n_e = Sub(field, K(bias));
  // Denormals: the mantissa field as a float (exact), then its own exponent field.
  Value mf = ir::BitcastConvert(ir::Convert(mant, t), bt);
  Value mf_field = And(shr(mf, mbits), K(emask));
  Value d_m = Or(Or(sign, And(mf, K(mmask))), K(bias << mbits));
  Value d_e = Sub(Sub(mf_field, K(bias)), K(bias + mbits));
  Value zero = K(0);
  Value is_denorm = And(Eq(field, zero), Ne(mant, zero));
  Value is_normal = And(Ne(field, zero), Ne(field, K(emask)));
  Value m = ir::Select(is_normal, n_m, ir::Select(is_denorm, d_m, bits));
  Value e = ir::Select(is_normal, n_e, ir::Select(is_denorm, d_e, zero));
  return {ir::BitcastConvert(m, t), Cast(e, DType::kS32)};
}

}  // namespace

void AddSpecialRows(std::vector<OpRow>& rows) {
  rows.push_back({"frexp.Tensor", [](OpArgs& a) -> V {
    if (!ir::IsFloating(a.V(0).dtype())) throw NotLowered{};  // eager's error
    return Frexp(a.V(0));
  }});
  rows.push_back({"lgamma", FloatUnary(Lgamma)});
  rows.push_back({"digamma", FloatUnary(Digamma)});
  rows.push_back({"erfc", FloatUnary([](const Value& x) {
    Value r = ir::Unary(Op::kErfc, x);
    const ir::DType t = x.shape().dtype;
    if (t != ir::DType::kF32 && t != ir::DType::kBF16) return r;
    // Past x = 9.19 erfc(x) is below the smallest normal f32; XLA's f32 erfc gives 0 there (its
    // exp(-x*x) underflows), eager a denormal: those elements come from the f64 erfc, rounded once.
    Value wide = Cast(ir::Unary(Op::kErfc, Cast(x, ir::DType::kF64)), t);
    return ir::Select(Gt(x, C(9, x)), wide, r);
  })});
  rows.push_back({"polygamma", [](OpArgs& a) -> V {
    int64_t n = a.Int(0);
    Value x = a.V(1);
    if (n < 0 || ir::IsComplex(x.dtype())) throw NotLowered{};  // eager's error on the CPU
    DType out = FloatOf(x.dtype());
    Value c = Cast(x, OpMath(out));
    Value r;
    if (n == 0) {
      r = Digamma(c);
    } else if (n == 1) {
      r = Trigamma(c);
    } else {
      // Eager: (-1)^(n+1) n! zeta(n + 1, x), its zeta summing the series for any x <= 0 that is
      // not an integer; CHLO's zeta is NaN there. Stays on the CPU.
      throw NotLowered{};
    }
    return {Cast(r, out)};
  }});
  rows.push_back({"signbit", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (ir::IsComplex(x.dtype())) throw NotLowered{};
    ir::Shape s(DType::kPred, x.dims());
    if (ir::IsUnsigned(x.dtype())) return {ir::Full(0, s)};
    if (!ir::IsFloating(x.dtype())) return {Lt(x, C(0, x))};
    Value bits = ir::BitcastConvert(x, BitsOf(x.dtype()));
    return {Lt(bits, CInt(0, bits))};
  }});
  rows.push_back({"copysign.Tensor", [](OpArgs& a) -> V {
    // Exact in the result dtype: |x|'s bits with y's sign bit (bf16/f16 bitcast to 16-bit ints).
    if (ir::IsComplex(a.V(0).dtype()) || ir::IsComplex(a.V(1).dtype())) throw NotLowered{};
    DType out = FloatOf(ResultType({&a.T(0), &a.T(1)}));
    auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
    // bf16/f16: in float32 bits (exact both ways; only the sign changes). XLA:CPU miscompiled the
    // 16-bit form once the result was converted to float32 in the same graph: copysign(bf16 x, -3.0)
    // .float() kept x's sign (fuzz seed 66283).
    const DType work = out == DType::kBF16 || out == DType::kF16 ? DType::kF32 : out;
    Value x = BroadcastTo(Cast(a.V(0), work), dims), y = BroadcastTo(Cast(a.V(1), work), dims);
    DType bt = BitsOf(work);
    Value bx = ir::BitcastConvert(x, bt), by = ir::BitcastConvert(y, bt);
    int64_t sign = SignBit(bt);
    Value r = Or(And(bx, CInt(~sign, bx)), And(by, CInt(sign, by)));
    return {Cast(ir::BitcastConvert(r, work), out)};
  }});
  rows.push_back({"heaviside", [](OpArgs& a) -> V {
    Value x = a.V(0), v = a.V(1);
    if (x.dtype() != v.dtype() || ir::IsComplex(x.dtype())) throw NotLowered{};  // eager's own error
    auto dims = BroadcastShapes(x.dims(), v.dims());
    x = BroadcastTo(x, dims);
    v = BroadcastTo(v, dims);
    return {ir::Select(Eq(x, C(0, x)), v, Cast(Gt(x, C(0, x)), x.dtype()))};
  }});
  rows.push_back({"sinc", FloatUnary([](const Value& x) {
    Value p = Mul(C(kPi, x), x);
    return ir::Select(Eq(x, C(0, x)), C(1, x), Div(ir::Unary(Op::kSin, p), p));
  })});
  rows.push_back({"special_entr", FloatUnary([](const Value& x) {
    Value r = ir::Unary(Op::kNeg, Mul(x, ir::Unary(Op::kLog, x)));
    r = ir::Select(Eq(x, C(0, x)), C(0, x), r);
    r = ir::Select(Lt(x, C(0, x)), C(-INFINITY, x), r);
    return ir::Select(IsNan(x), x, r);
  })});
  rows.push_back({"special_xlog1py", [](OpArgs& a) -> V {
    // bf16/f16: log1p(y) rounded to the reduced type before the product, as eager (see xlogy)
    DType out = FloatOf(ResultType({&a.T(0), &a.T(1)}));
    return FloatBinary([out](const Value& x, const Value& y) {
      Value r = ir::Select(Eq(x, C(0, x)), C(0, x), Mul(x, Cast(Cast(ir::Unary(Op::kLog1p, y), out), y.dtype())));
      return ir::Select(IsNan(y), y, r);
    })(a);
  }});
  rows.push_back({"ldexp.Tensor", [](OpArgs& a) -> V {
    // A float tensor times 2 ** an integer tensor: eager's CPU kernel (std::ldexp), exact up to
    // the result's one rounding (0 * 2 ** 2049 is 0, where x * pow(2, e) gives 0 * inf = nan).
    Value x = a.V(0), e = a.V(1);
    if (!ir::IsFloating(x.dtype()) || !ir::IsIntegral(e.dtype(), false)) throw NotLowered{};  // bool: eager's error
    const DType t = x.dtype();
    auto dims = BroadcastShapes(x.dims(), e.dims());
    if (dims != x.dims()) throw NotLowered{};  // the result has self's shape (eager's error otherwise)
    Value k = BroadcastTo(Cast(e, DType::kS64), dims);
    auto clamp = [&](const Value& v, int64_t lo, int64_t hi) {
      return ir::Binary(Op::kMax, ir::Binary(Op::kMin, v, CInt(hi, v)), CInt(lo, v));
    };
    // 2 ** j for j in [-1074, 1023] as float64 bits (subnormal powers below -1022)
    auto pow2 = [&](const Value& j) {
      Value normal = ir::Binary(Op::kShiftLeft, Add(j, CInt(1023, j)), CInt(52, j));
      Value sub = ir::Binary(Op::kShiftLeft, CInt(1, j), Add(j, CInt(1074, j)));
      return ir::BitcastConvert(ir::Select(Lt(j, CInt(-1022, j)), sub, normal), DType::kF64);
    };
    Value xd = BroadcastTo(Cast(x, DType::kF64), dims);
    if (t != DType::kF64) {
      // |x| in [2^-149, 2^128): past +-400 every nonzero finite result over- or underflows
      return {Cast(Mul(xd, pow2(clamp(k, -400, 400))), t)};
    }
    // float64: two exact steps, the last one rounding (an intermediate below the normal range only
    // occurs when the result rounds to zero anyway)
    k = clamp(k, -2200, 2200);
    Value last = clamp(k, -1074, 1023), first = clamp(Sub(k, last), -1074, 1023);
    return {Mul(Mul(xd, pow2(first)), pow2(last))};
  }});
  rows.push_back({"nextafter", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)});
    if (!ir::IsFloating(t)) throw NotLowered{};  // integers: eager's error, on the CPU
    auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
    Value x = BroadcastTo(Cast(a.V(0), t), dims), y = BroadcastTo(Cast(a.V(1), t), dims);
    return {ir::Binary(Op::kNextAfter, x, y)};
  }});
  for (bool lcm : {false, true}) {
    rows.push_back({lcm ? "lcm" : "gcd", [lcm](OpArgs& a) -> V {
      DType t = ResultType({&a.T(0), &a.T(1)});
      if (!ir::IsIntegral(t, false)) throw NotLowered{};  // eager: not implemented for floats and bool
      auto dims = BroadcastShapes(a.V(0).dims(), a.V(1).dims());
      Value x = BroadcastTo(Cast(a.V(0), t), dims), y = BroadcastTo(Cast(a.V(1), t), dims);
      Value g = Gcd(x, y);
      if (!lcm) return {g};
      Value gz = Eq(g, C(0, g));
      Value q = ir::Binary(Op::kDiv, x, ir::Select(gz, C(1, g), g));
      // abs(a / g * b): C++ computes 8- and 16-bit products in int, then stores the abs truncated.
      bool narrow = t == DType::kS8 || t == DType::kS16;
      Value p = narrow ? Mul(Cast(q, DType::kS32), Cast(y, DType::kS32)) : Mul(q, y);
      return {ir::Select(gz, C(0, g), Cast(ir::Unary(Op::kAbs, p), t))};
    }});
  }
}

}  // namespace txla::ops
