// Op table row: histc, with eager's CPU arithmetic. The outer edges are min/max (or, when they are
// equal, the data's own min/max, widened by 1 each way if those are equal too), rounded to the
// input dtype as linspace rounds its first and last points. Each element in [left, right] goes to
// bin trunc((x - left) * bins / (right - left)) evaluated in the input dtype (every step rounded to
// bf16/f16 for those dtypes, as c10's BFloat16/Half operators do), the right edge to the last bin;
// NaN and elements outside are skipped. Counts are exact (summed in float32 / float64), then
// rounded to the input dtype. A data range that is not finite raises eager's RuntimeError at the
// next sync or host read; eager's other errors (bins <= 0, min > max, non-finite min/max, integer
// inputs) come from the CPU fallback.
#include <cmath>

#include "graph/graph.h"
#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

// One arithmetic step of eager's kernel in dtype t: computed in float32 (float64) and rounded to t.
Value Step(Op op, const Value& a, const Value& b, DType t) {
  DType c = OpMath(t);
  return Cast(ir::Binary(op, Cast(a, c), Cast(b, c)), t);
}

// A double bound as eager's linspace stores its end points in t (through float for bf16/f16).
Value Edge(const Value& v64, DType t) {
  return Cast(t == DType::kF64 ? v64 : Cast(v64, DType::kF32), t);
}

}  // namespace

void AddHistcRows(std::vector<OpRow>& rows) {
  rows.push_back({"histc", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType t = x.dtype();
    if (!ir::IsFloating(t)) throw NotLowered{};  // eager: not implemented for integers
    int64_t bins = a.IsNone(1) ? 100 : a.Int(1);
    double mn = a.IsNone(2) ? 0.0 : a.S(2).AsDouble(), mx = a.IsNone(3) ? 0.0 : a.S(3).AsDouble();
    if (bins <= 0) throw NotLowered{};
    if (mn != mx && (!std::isfinite(mn) || !std::isfinite(mx) || mn > mx)) throw NotLowered{};
    ir::Shape out(t, {bins});
    int64_t n = x.shape().numel();
    Value lo, hi;  // float64 scalars
    if (mn != mx || n == 0) {
      if (mn == mx) {
        mn -= 1;
        mx += 1;
      }
      if (n == 0) return {ir::Full(0, out)};
      // Device scalars, not constants: XLA would fold (hi - lo) and turn the division by it into a
      // multiplication by its reciprocal, which rounds differently from eager's division.
      lo = ScalarV(mn, DType::kF64, a.device);
      hi = ScalarV(mx, DType::kF64, a.device);
    } else {
      Value flat = ir::Reshape(Cast(x, DType::kF64), {n});
      lo = ir::Reduce(ir::ReduceKind::kMin, flat, {0});
      hi = ir::Reduce(ir::ReduceKind::kMax, flat, {0});
      Value ok = ir::Binary(Op::kAnd, ir::Unary(Op::kIsFinite, lo), ir::Unary(Op::kIsFinite, hi));
      graph::AddCheck(ok, "torch.histc: range of [min, max] is not finite (the input holds a NaN or an infinity)",
                      a.device, /*runtime_error=*/true);
      Value same = ir::Compare(CompareDir::kEQ, lo, hi);
      lo = ir::Select(same, ir::Binary(Op::kSub, lo, ir::Constant(1, DType::kF64)), lo);
      hi = ir::Select(same, ir::Binary(Op::kAdd, hi, ir::Constant(1, DType::kF64)), hi);
    }
    Value flat = ir::Reshape(x, {n});
    std::vector<int64_t> dims{n};
    Value left = BroadcastTo(Edge(lo, t), dims), right = BroadcastTo(Edge(hi, t), dims);
    Value nb = BroadcastTo(ScalarV(static_cast<double>(bins), t, a.device), dims);  // bins rounded to t, as c10 does
    Value q = Step(Op::kDiv, Step(Op::kMul, Step(Op::kSub, flat, left, t), nb, t), Step(Op::kSub, right, left, t), t);
    Value pos = Cast(Cast(q, OpMath(t)), DType::kS64);  // truncation toward zero
    Value last = ir::Full(static_cast<double>(bins - 1), ir::Shape(DType::kS64, dims));
    pos = ir::Select(ir::Compare(CompareDir::kGE, pos, ir::Full(static_cast<double>(bins), pos.shape())), last, pos);
    pos = ir::Clamp(ir::Full(0, pos.shape()), pos, last);
    Value inside = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGE, flat, left), ir::Compare(CompareDir::kLE, flat, right));
    // Skipped elements land in an extra bin past the end, sliced off.
    pos = ir::Select(inside, pos, ir::Full(static_cast<double>(bins), pos.shape()));
    DType acc = t == DType::kF64 ? DType::kF64 : DType::kF32;
    Value counts = ir::Scatter(ir::Full(0, ir::Shape(acc, {bins + 1})), ir::Reshape(pos, {n, 1}),
                               ir::Full(1, ir::Shape(acc, dims)), {}, {0}, {0}, 1, 1);
    return {Cast(ir::Slice(counts, {0}, {bins}, {1}), t)};
  }});
}

}  // namespace txla::ops
