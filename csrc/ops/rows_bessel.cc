// Op table rows: modified Bessel functions of the first kind, i0, special_i0e, special_i1,
// special_i1e. CHLO has only bessel_i1e, so each is built here from two expansions evaluated in
// float64 (then rounded once to the result dtype): the power series
//   I_nu(x) = (x/2)^nu * sum_k (x^2/4)^k / (k! (k+nu)!)          for |x| <= 20 (41 terms),
// and the asymptotic expansion
//   e^-x I_nu(x) = (2 pi x)^-1/2 * sum_k (-1)^k a_k(nu) / x^k,
//   a_k(nu) = prod_{j<=k} (4 nu^2 - (2j-1)^2) / (k! 8^k)          for |x| > 20 (21 terms).
// Both are within ~1e-15 relative of the exact values over their ranges (checked against mpmath),
// so float32 results are the correctly rounded ones, as close as eager's Cephes expansions. i0 is
// even, i1 odd (i1(-0) = +0 as eager's). Eager's overflow and infinities are kept (see Bessel):
// i0/i1 are inf where e^|x| overflows in the compute type and NaN at +-inf; i0e/i1e(+-inf) = 0.
#include <cmath>
#include <functional>
#include <vector>

#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

constexpr double kSeriesMax = 20.0;
constexpr int kSeriesTerms = 40;
constexpr int kAsymptoticTerms = 20;
constexpr double kPi = 3.14159265358979323846;

Value C(double v, const Value& like) { return ir::Full(v, like.shape()); }
Value Add(const Value& a, const Value& b) { return ir::Binary(Op::kAdd, a, b); }
Value Mul(const Value& a, const Value& b) { return ir::Binary(Op::kMul, a, b); }
Value Div(const Value& a, const Value& b) { return ir::Binary(Op::kDiv, a, b); }

// Horner: sum_k c[k] * y^k.
Value Poly(const std::vector<double>& c, const Value& y) {
  Value s = C(c.back(), y);
  for (int k = static_cast<int>(c.size()) - 2; k >= 0; --k) s = Add(Mul(s, y), C(c[k], y));
  return s;
}

// I_nu(z) for 0 <= z <= kSeriesMax (float64 z).
Value Series(const Value& z, int nu) {
  std::vector<double> c(kSeriesTerms + 1);
  double f = 1.0;  // 1 / (0! nu!), nu <= 1
  for (int k = 0; k <= kSeriesTerms; ++k) {
    if (k > 0) f /= static_cast<double>(k) * static_cast<double>(k + nu);
    c[k] = f;
  }
  Value s = Poly(c, Mul(Mul(z, z), C(0.25, z)));
  return nu ? Mul(s, Mul(z, C(0.5, z))) : s;
}

// e^-z I_nu(z) for z > kSeriesMax (float64 z).
Value Asymptotic(const Value& z, int nu) {
  std::vector<double> b(kAsymptoticTerms + 1);
  b[0] = 1.0;
  for (int k = 1; k <= kAsymptoticTerms; ++k) {
    double m = 2.0 * k - 1.0;
    b[k] = -b[k - 1] * (4.0 * nu * nu - m * m) / (8.0 * k);
  }
  Value s = Poly(b, Div(C(1, z), z));
  return Div(s, ir::Unary(Op::kSqrt, Mul(C(2 * kPi, z), z)));
}

// scaled: e^-|x| I_nu(x); else I_nu(x). x is float64; `t` is the type eager computes in (float32
// for float32/bf16/f16/integers): beyond the series range eager multiplies e^|x|, computed in t, by
// the scaled value, so I0/I1 are inf once e^|x| overflows in t (|x| > 88.7 for float32) and NaN at
// +-inf (inf * 0); this keeps both.
Value Bessel(const Value& x, int nu, bool scaled, DType t) {
  Value z = ir::Unary(Op::kAbs, x);
  Value small = ir::Compare(CompareDir::kLE, z, C(kSeriesMax, z));
  // Keep each branch's argument in its own range so the other branch never sees inf/NaN arguments.
  Value zs = ir::Select(small, z, C(0, z));
  Value za = ir::Select(small, C(2 * kSeriesMax, z), z);
  Value r;
  if (scaled) {
    r = Cast(ir::Select(small, Mul(Series(zs, nu), ir::Unary(Op::kExp, ir::Unary(Op::kNeg, zs))), Asymptotic(za, nu)), t);
  } else {
    Value big = Mul(ir::Unary(Op::kExp, Cast(za, t)), Cast(Asymptotic(za, nu), t));
    r = ir::Select(Cast(small, DType::kPred), Cast(Series(zs, nu), t), big);
  }
  Value xt = Cast(x, t);
  if (nu == 1) r = ir::Select(ir::Compare(CompareDir::kLT, xt, C(0, xt)), ir::Unary(Op::kNeg, r), r);
  return ir::Select(ir::Compare(CompareDir::kNE, xt, xt), xt, r);
}

OpFn BesselRow(int nu, bool scaled) {
  return [nu, scaled](OpArgs& a) -> V {
    DType in = a.V(0).dtype();
    if (ir::IsComplex(in)) throw NotLowered{};
    DType out = FloatOf(in);
    return {Cast(Bessel(Cast(a.V(0), DType::kF64), nu, scaled, OpMath(out)), out)};
  };
}

}  // namespace

void AddBesselRows(std::vector<OpRow>& rows) {
  rows.push_back({"i0", BesselRow(0, false)});
  rows.push_back({"special_i0e", BesselRow(0, true)});
  rows.push_back({"special_i1", BesselRow(1, false)});
  rows.push_back({"special_i1e", BesselRow(1, true)});
}

}  // namespace txla::ops
