// Op table rows: factories and random fills. The device comes from the call (OpArgs::device).
#include <cmath>

#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {
DType DTypeOr(const OpArgs& a, size_t k, DType def) { return a.OptDType(k).value_or(def); }

Value Arange(const OpArgs& a, const Scalar& start, const Scalar& end, const Scalar& step, DType t) {
  double s = start.AsDouble(), e = end.AsDouble(), st = step.AsDouble();
  if (st == 0) a.Fail("step must be nonzero");
  if ((st > 0 && e < s) || (st < 0 && e > s)) a.Fail("upper bound and larger bound inconsistent with step sign");
  int64_t n = static_cast<int64_t>(std::ceil((e - s) / st));
  ir::Shape shape(t, {n});
  if (ir::IsIntegral(t, false)) {
    Value i = ir::Iota(shape, 0);
    Value r = ir::Binary(Op::kMul, i, ir::BroadcastInDim(ScalarV(step, t, a.device), {n}, {}));
    return ir::Binary(Op::kAdd, r, ir::BroadcastInDim(ScalarV(start, t, a.device), {n}, {}));
  }
  DType ct = t == DType::kF64 ? DType::kF64 : DType::kF32;
  Value i = ir::Iota(ir::Shape(ct, {n}), 0);
  Value r = ir::Binary(Op::kMul, i, ir::BroadcastInDim(ScalarV(step, ct, a.device), {n}, {}));
  r = ir::Binary(Op::kAdd, r, ir::BroadcastInDim(ScalarV(start, ct, a.device), {n}, {}));
  return Cast(r, t);
}

DType ArangeType(const OpArgs& a, size_t dtype_arg, std::initializer_list<size_t> scalars) {
  if (auto d = a.OptDType(dtype_arg)) return *d;
  for (size_t k : scalars) if (a.S(k).kind == Scalar::kFloat) return DType::kF32;
  return DType::kS64;
}
}  // namespace

void AddFactoryRows(std::vector<OpRow>& rows) {
  rows.push_back({"empty.memory_format", [](OpArgs& a) -> V {
    return {ir::Full(0, ir::Shape(DTypeOr(a, 1, DType::kF32), a.Ints(0)))};
  }});
  rows.push_back({"empty_strided", [](OpArgs& a) -> V {
    return {ir::Full(0, ir::Shape(DTypeOr(a, 2, DType::kF32), a.Ints(0)))};
  }});
  rows.push_back({"full", [](OpArgs& a) -> V {
    const Scalar& v = a.S(1);
    DType t = DTypeOr(a, 2, v.kind == Scalar::kFloat ? DType::kF32 : v.NaturalType());
    return {BroadcastTo(ScalarV(v, t, a.device), a.Ints(0))};
  }});
  rows.push_back({"scalar_tensor", [](OpArgs& a) -> V {
    // Eager's kernel converts to float16/bfloat16 without fill's overflow check (torch.where(c,
    // half_x, 70000.0) makes this scalar: inf, not an error) and checks float32 only. Floating
    // targets here; others run eager's CPU kernel.
    const Scalar& v = a.S(0);
    DType t = DTypeOr(a, 1, DType::kF32);
    if (!ir::IsFloating(t) || v.im != 0) throw NotLowered{};
    double d = v.AsDouble();
    if (t == DType::kF32 && std::isfinite(d) && std::fabs(d) > 3.4028234663852886e38) {
      a.Fail("value cannot be converted to type float without overflow");  // eager checks float only
    }
    return {Cast(ScalarV(v, DType::kF64, a.device), t)};
  }});
  rows.push_back({"fill.Scalar", [](OpArgs& a) -> V {
    Value self = a.V(0);
    return {BroadcastTo(ScalarV(a.S(1), self.dtype(), a.device), self.dims())};
  }});
  rows.push_back({"fill.Tensor", [](OpArgs& a) -> V {
    Value self = a.V(0);
    return {BroadcastTo(Cast(a.V(1), self.dtype()), self.dims())};
  }});
  rows.push_back({"zero", [](OpArgs& a) -> V { return {ir::Full(0, a.V(0).shape())}; }});
  rows.push_back({"arange.start_step", [](OpArgs& a) -> V {
    return {Arange(a, a.S(0), a.S(1), a.S(2), ArangeType(a, 3, {0, 1, 2}))};
  }});
  rows.push_back({"arange.start_out", [](OpArgs& a) -> V {
    return {Arange(a, a.S(0), a.S(1), a.S(2), a.V(3).dtype())};
  }});
  rows.push_back({"uniform", [](OpArgs& a) -> V {
    Value self = a.V(0);
    double from = a.Double(1), to = a.Double(2);
    DType ct = self.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value u = RandomUniform(ir::Shape(ct, self.dims()), a.device);
    Value r = ir::Binary(Op::kAdd, ir::Binary(Op::kMul, u, ir::Full(to - from, u.shape())), ir::Full(from, u.shape()));
    return {Cast(r, self.dtype())};
  }});
  rows.push_back({"normal_functional", [](OpArgs& a) -> V {
    Value self = a.V(0);
    double mean = a.Double(1), std = a.Double(2);
    DType ct = self.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value n = RandomNormal(ir::Shape(ct, self.dims()), a.device);
    Value r = ir::Binary(Op::kAdd, ir::Binary(Op::kMul, n, ir::Full(std, n.shape())), ir::Full(mean, n.shape()));
    return {Cast(r, self.dtype())};
  }});
  auto random_range = [](OpArgs& a, double lo, double hi) -> Value {
    Value self = a.V(0);
    Value u = RandomUniform(ir::Shape(DType::kF64, self.dims()), a.device);
    Value r = ir::Unary(Op::kFloor, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, u, ir::Full(hi - lo, u.shape())),
                                                ir::Full(lo, u.shape())));
    return Cast(r, self.dtype());
  };
  rows.push_back({"random.from", [random_range](OpArgs& a) -> V {
    auto to = a.OptInt(2);
    if (!to) a.Fail("random_(from, None) is not lowered");
    return {random_range(a, static_cast<double>(a.Int(1)), static_cast<double>(*to))};
  }});
  rows.push_back({"random.to", [random_range](OpArgs& a) -> V {
    return {random_range(a, 0, static_cast<double>(a.Int(1)))};
  }});
  rows.push_back({"bernoulli", [](OpArgs& a) -> V {  // self holds the probabilities
    Value p = a.V(0);
    DType ct = p.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value u = RandomUniform(ir::Shape(ct, p.dims()), a.device);
    return {Cast(ir::Compare(CompareDir::kLT, u, Cast(p, ct)), p.dtype())};
  }});
  rows.push_back({"bernoulli.Tensor", [](OpArgs& a) -> V {  // bernoulli(self, p: Tensor), functional of bernoulli_.Tensor
    Value self = a.V(0), p = a.V(1);
    DType ct = p.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value u = RandomUniform(ir::Shape(ct, self.dims()), a.device);
    return {Cast(Cmp(CompareDir::kLT, u, Cast(p, ct)), self.dtype())};
  }});
  rows.push_back({"bernoulli.p", [](OpArgs& a) -> V {
    Value self = a.V(0);
    Value u = RandomUniform(ir::Shape(DType::kF32, self.dims()), a.device);
    return {Cast(ir::Compare(CompareDir::kLT, u, ir::Full(a.Double(1), u.shape())), self.dtype())};
  }});
  // In-place random fills reached below functionalization (e.g. inside randn_like's composite):
  // the same rows, results written into self by the bridge.
  std::vector<std::pair<const char*, const char*>> inplace = {
      {"normal_", "normal_functional"}, {"uniform_", "uniform"}, {"bernoulli_.float", "bernoulli.p"},
      {"bernoulli_.Tensor", "bernoulli.Tensor"}, {"random_.from", "random.from"}, {"random_.to", "random.to"}};
  for (auto [name, functional] : inplace) {
    for (const auto& r : std::vector<OpRow>(rows)) {
      if (r.aten == functional) rows.push_back({name, r.fn});
    }
  }
}

}  // namespace txla::ops
