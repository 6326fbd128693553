// Op table rows: softmax, losses, embedding, layer norm, dropout and their backward ops.
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

// One-hot mask [N, C] of target [N] (class axis 1), false where target == ignore_index.
std::pair<Value, Value> TargetMask(const Value& target, int64_t classes, int64_t ignore_index) {
  int64_t n = target.dims()[0];
  Value t = Cast(target, DType::kS64);
  Value iota = ir::Iota(ir::Shape(DType::kS64, {n, classes}), 1);
  Value tb = ir::BroadcastInDim(t, {n, classes}, {0});
  Value valid = ir::Compare(CompareDir::kNE, t, ir::Full(static_cast<double>(ignore_index), t.shape()));
  Value onehot = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kEQ, iota, tb), ir::BroadcastInDim(valid, {n, classes}, {0}));
  return {onehot, valid};
}

// Per-sample weights w[target] * valid, as dtype t.
Value SampleWeights(const std::optional<Value>& weight, const Value& onehot, const Value& valid, DType t) {
  if (!weight) return Cast(valid, t);
  Value wb = ir::BroadcastInDim(Cast(*weight, t), onehot.dims(), {1});
  return ir::Reduce(ir::ReduceKind::kSum, ir::Select(onehot, wb, ir::Full(0, wb.shape())), {1});
}

// bf16/f16 compute in float32 as eager does (rounded once at the end).

Value LayerNormStat(const Value& x, const std::vector<int64_t>& axes) {
  return KeepDims(ir::Reduce(ir::ReduceKind::kSum, x, axes), x.dims(), axes);
}

// The fused attention kernel's arguments, checked as eager's kernel checks them; what it does not
// lower (a mask, empty sequences) runs on the CPU fallback.
struct FlashAttention {
  DType ct;
  double scale;
  bool causal;
};
FlashAttention FlashAttentionArgs(OpArgs& a, const Value& q, const Value& k, const Value& v, size_t dropout,
                                  size_t causal, size_t mask, size_t scale) {
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) throw NotLowered{};
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() || !ir::IsFloating(q.dtype())) throw NotLowered{};
  if (a.Double(dropout) != 0) a.Fail("scaled_dot_product_attention_flash_attention: Currently do not support dropout > 0");
  const auto &qd = q.dims(), &kd = k.dims(), &vd = v.dims();
  if (qd[3] != kd[3] || qd[3] != vd[3]) a.Fail("scaled_dot_product_attention_flash_attention: Q/K/V should have the same head size");
  if (qd[0] != kd[0] || qd[0] != vd[0] || qd[1] != kd[1] || qd[1] != vd[1] || kd[2] != vd[2]) throw NotLowered{};
  if (!a.IsNone(mask) || q.shape().numel() == 0 || k.shape().numel() == 0) throw NotLowered{};
  FlashAttention at;
  at.ct = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  at.scale = a.OptDouble(scale).value_or(1.0 / std::sqrt(static_cast<double>(qd[3])));
  at.causal = a.Bool(causal);
  return at;
}
// scale * q k^T [B, H, L, S], -inf above the diagonal (top-left aligned, as eager) when causal.
Value FlashScores(const Value& q, const Value& k, const FlashAttention& at) {
  Value s = ir::DotGeneral(Cast(q, at.ct), Cast(k, at.ct), {0, 1}, {0, 1}, {3}, {3}, at.ct);
  s = Bin(Op::kMul, s, ir::Full(at.scale, ir::Shape(at.ct, {})));
  if (at.causal) {
    const int64_t l = s.dims()[2], n = s.dims()[3];
    Value keep = ir::Compare(CompareDir::kGE, ir::Iota(ir::Shape(DType::kS64, {l, n}), 0),
                             ir::Iota(ir::Shape(DType::kS64, {l, n}), 1));
    s = ir::Select(ir::BroadcastInDim(keep, s.dims(), {2, 3}), s,
                   ir::Full(-std::numeric_limits<double>::infinity(), s.shape()));
  }
  return s;
}

V NllForward(OpArgs& a) {
  Value x = a.V(0), target = a.V(1);
  auto weight = a.OptV(2);
  int64_t reduction = a.Int(3), ignore = a.Int(4);
  bool one_d = x.rank() == 1;
  if (one_d) {
    x = ir::Reshape(x, {1, x.dims()[0]});
    target = ir::Reshape(target, {1});
  }
  if (x.rank() != 2) a.Fail("input tensors of rank > 2 go through nll_loss2d");
  if (target.dims()[0] != x.dims()[0]) {
    a.Fail("Expected input batch_size (" + std::to_string(x.dims()[0]) + ") to match target batch_size (" +
           std::to_string(target.dims()[0]) + ").");
  }
  DType t = x.dtype();
  CheckIndexRange(target, 0, x.dims()[1], "nll_loss: Target is out of bounds.", a.device, ignore);
  auto [onehot, valid] = TargetMask(target, x.dims()[1], ignore);
  Value w = SampleWeights(weight, onehot, valid, t);
  Value picked = ir::Reduce(ir::ReduceKind::kSum, ir::Select(onehot, x, ir::Full(0, x.shape())), {1});
  Value losses = ir::Unary(Op::kNeg, ir::Binary(Op::kMul, picked, w));
  Value total = ir::Reduce(ir::ReduceKind::kSum, w, {0});
  if (reduction == 0) {  // eager leaves total_weight 0 without a reduction
    return {one_d ? ir::Reshape(losses, {}) : losses, ir::Full(0, total.shape())};
  }
  Value sum = ir::Reduce(ir::ReduceKind::kSum, losses, {0});
  if (reduction == 2) return {sum, total};
  return {ir::Binary(Op::kDiv, sum, total), total};
}

V NllBackward(OpArgs& a) {
  Value g = a.V(0), x = a.V(1), target = a.V(2);
  auto weight = a.OptV(3);
  int64_t reduction = a.Int(4), ignore = a.Int(5);
  Value total = a.V(6);
  std::vector<int64_t> in_dims = x.dims();
  if (x.rank() == 1) {
    x = ir::Reshape(x, {1, x.dims()[0]});
    target = ir::Reshape(target, {1});
    if (g.rank() == 1 || (reduction == 0 && g.rank() == 0)) g = ir::Reshape(g, reduction == 0 ? std::vector<int64_t>{1} : std::vector<int64_t>{});
  }
  DType t = x.dtype();
  auto [onehot, valid] = TargetMask(target, x.dims()[1], ignore);
  Value w = SampleWeights(weight, onehot, valid, t);  // [N]
  Value scale;                                      // [N]
  if (reduction == 0) {
    scale = ir::Binary(Op::kMul, Cast(g, t), w);
  } else {
    Value gs = Cast(ir::Reshape(g, {}), t);
    if (reduction == 1) gs = ir::Binary(Op::kDiv, gs, Cast(total, t));
    scale = ir::Binary(Op::kMul, ir::BroadcastInDim(gs, w.dims(), {}), w);
  }
  Value neg = ir::Unary(Op::kNeg, ir::BroadcastInDim(scale, x.dims(), {0}));
  Value grad = ir::Select(onehot, neg, ir::Full(0, x.shape()));
  return {ir::Reshape(grad, in_dims)};
}

// nll_loss2d: input [N, C, H, W], target [N, H, W]: the class axis moved last and every pixel a sample
// of nll_loss (same weights, ignore_index and reductions).
void Nll2dShapes(const OpArgs& a, const Value& x, const Value& target) {
  if (x.rank() != 4) a.Fail("only batches of spatial inputs supported (4D tensors), but got input of size: " + x.shape().ToString());
  if (target.rank() != 3) {
    a.Fail("only batches of spatial targets supported (3D tensors) but got targets of size: " + target.shape().ToString());
  }
  const auto& xd = x.dims();
  const auto& td = target.dims();
  if (xd[0] != td[0] || xd[2] != td[1] || xd[3] != td[2]) {
    a.Fail("input and target batch or spatial sizes don't match: target " + target.shape().ToString() + ", input " +
           x.shape().ToString());
  }
}

Value PixelsAsSamples(const Value& x) {  // [N, C, H, W] -> [N*H*W, C]
  const auto& d = x.dims();
  return ir::Reshape(ir::Transpose(x, {0, 2, 3, 1}), {d[0] * d[2] * d[3], d[1]});
}

V Nll2dForward(OpArgs& a) {
  Value x = a.V(0), target = a.V(1);
  Nll2dShapes(a, x, target);
  const auto& d = x.dims();
  OpArgs b = a;
  b.args[0].t.v = PixelsAsSamples(x);
  b.args[1].t.v = ir::Reshape(target, {d[0] * d[2] * d[3]});
  V r = NllForward(b);
  if (a.Int(3) == 0) r[0] = ir::Reshape(r[0], {d[0], d[2], d[3]});
  return r;
}

V Nll2dBackward(OpArgs& a) {
  Value g = a.V(0), x = a.V(1), target = a.V(2);
  Nll2dShapes(a, x, target);
  const auto& d = x.dims();
  int64_t n = d[0] * d[2] * d[3];
  OpArgs b = a;
  if (a.Int(4) == 0) b.args[0].t.v = ir::Reshape(g, {n});
  b.args[1].t.v = PixelsAsSamples(x);
  b.args[2].t.v = ir::Reshape(target, {n});
  Value grad = NllBackward(b)[0];  // [N*H*W, C]
  return {ir::Transpose(ir::Reshape(grad, {d[0], d[2], d[3], d[1]}), {0, 3, 1, 2})};
}

// embedding_renorm_(weight, indices, max_norm, norm_type): every row named by an index whose p-norm
// exceeds max_norm is scaled by max_norm / (norm + 1e-7), once however often it is named (eager).
V EmbeddingRenorm(OpArgs& a) {
  Value w = a.V(0), idx = a.V(1);
  double max_norm = a.Double(2), p = a.Double(3);
  if (w.rank() != 2) a.Fail("embedding_renorm_: weight must be 2-D, got " + w.shape().ToString());
  if (!ir::IsFloating(w.dtype())) a.Fail("embedding_renorm_: weight must be floating point");
  if (p == 0) throw NotLowered{};  // a count of non-zeros: eager's own rule, on the CPU
  int64_t rows_n = w.dims()[0], n = idx.shape().numel();
  if (n == 0 || w.shape().numel() == 0) return {w};
  CheckIndexRange(idx, 0, rows_n, "embedding_renorm_: index out of range in self", a.device);
  Value flat = ir::Reshape(Cast(idx, DType::kS64), {n});
  Value named = ir::Reduce(ir::ReduceKind::kOr,
                           ir::Compare(CompareDir::kEQ, ir::Iota(ir::Shape(DType::kS64, {rows_n, n}), 0),
                                       ir::BroadcastInDim(flat, {rows_n, n}, {1})),
                           {1});  // [rows]
  DType ct = OpMath(w.dtype());
  Value x = Cast(w, ct);
  Value ax = ir::Unary(Op::kAbs, x);
  Value norm;
  if (std::isinf(p)) {
    norm = ir::Reduce(p > 0 ? ir::ReduceKind::kMax : ir::ReduceKind::kMin, ax, {1});
  } else if (p == 1) {
    norm = ir::Reduce(ir::ReduceKind::kSum, ax, {1});
  } else if (p == 2) {
    norm = ir::Unary(Op::kSqrt, ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kMul, x, x), {1}));
  } else {
    Value s = ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kPow, ax, ir::Full(p, ax.shape())), {1});
    norm = ir::Binary(Op::kPow, s, ir::Full(1.0 / p, s.shape()));
  }
  Value over = ir::Binary(Op::kAnd, named, ir::Compare(CompareDir::kGT, norm, ir::Full(max_norm, norm.shape())));
  Value scale = ir::Binary(Op::kDiv, ir::Full(max_norm, norm.shape()),
                           ir::Binary(Op::kAdd, norm, ir::Full(1e-7, norm.shape())));
  scale = ir::Select(over, scale, ir::Full(1, norm.shape()));
  return {Cast(ir::Binary(Op::kMul, x, ir::BroadcastInDim(scale, x.dims(), {0})), w.dtype())};
}

}  // namespace

void AddNnRows(std::vector<OpRow>& rows) {
  // reduction: 0 none, 1 mean, 2 sum.
  rows.push_back({"mse_loss", [](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0), &a.T(1)}), ct = OpMath(t);
    Value d = Bin(Op::kSub, Cast(a.V(0), ct), Cast(a.V(1), ct));
    Value sq = ir::Binary(Op::kMul, d, d);
    int64_t red = a.IsNone(2) ? 1 : a.Int(2);
    std::vector<int64_t> all(sq.rank());
    std::iota(all.begin(), all.end(), 0);
    if (red == 0) return {Cast(sq, t)};
    Value s = ir::Reduce(ir::ReduceKind::kSum, sq, all);
    if (red == 1) s = ir::Binary(Op::kDiv, s, ir::Full(static_cast<double>(sq.shape().numel()), s.shape()));
    return {Cast(s, t)};
  }});
  rows.push_back({"mse_loss_backward", [](OpArgs& a) -> V {
    Value g = a.V(0), x = a.V(1), y = a.V(2);
    DType t = x.dtype(), ct = OpMath(t);
    Value d = Bin(Op::kSub, Cast(x, ct), Cast(y, ct));
    auto dims = BroadcastShapes(x.dims(), y.dims());
    double k = 2.0;
    if (a.Int(3) == 1) k /= static_cast<double>(std::max<int64_t>(ir::Shape(ct, dims).numel(), 1));
    if (ct != t) {
      // f16/bf16: eager's kernel is sub, then mul_(norm), then mul_(grad), each rounded to the dtype,
      // with norm converted to the dtype
      auto rd = [&](const Value& v) { return Cast(Cast(v, t), ct); };
      Value norm = rd(ir::Full(k, ir::Shape(ct, {})));
      Value r = rd(Bin(Op::kMul, rd(Bin(Op::kMul, rd(d), norm)), Cast(g, ct)));
      return {Cast(BroadcastTo(r, dims), t)};
    }
    Value r = Bin(Op::kMul, Bin(Op::kMul, d, ir::Full(k, ir::Shape(ct, {}))), Cast(g, ct));
    return {Cast(BroadcastTo(r, dims), t)};
  }});
  rows.push_back({"softplus", [](OpArgs& a) -> V {
    Value x = a.V(0);
    DType t = x.dtype(), ct = OpMath(t);
    Value xc = Cast(x, ct);
    Value beta = ScalarV(a.S(1), ct, a.device), th = ScalarV(a.S(2), ct, a.device);
    Value xb = Bin(Op::kMul, xc, beta);
    Value soft = Bin(Op::kDiv, ir::Unary(Op::kLog1p, ir::Unary(Op::kExp, xb)), beta);
    return {Cast(ir::Select(Cmp(CompareDir::kGT, xb, th), xc, soft), t)};
  }});
  rows.push_back({"softplus_backward", [](OpArgs& a) -> V {
    Value g = a.V(0), x = a.V(1);
    DType t = ResultType({&a.T(0), &a.T(1)}), ct = OpMath(t);  // mixed grad/input dtypes promote (eager)
    Value xc = Cast(x, ct), gc = Cast(g, ct);
    Value beta = ScalarV(a.S(2), ct, a.device), th = ScalarV(a.S(3), ct, a.device);
    Value xb = Bin(Op::kMul, xc, beta);
    Value z = ir::Unary(Op::kExp, xb);
    Value soft = Bin(Op::kDiv, Bin(Op::kMul, gc, z), Bin(Op::kAdd, z, ir::Full(1, ir::Shape(ct, {}))));
    return {Cast(ir::Select(Cmp(CompareDir::kGT, xb, th), gc, soft), t)};
  }});
  rows.push_back({"_softmax", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (a.Bool(2)) x = Cast(x, DType::kF32);
    return {Softmax(x, a.Int(1), false)};
  }});
  rows.push_back({"_log_softmax", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (a.Bool(2)) x = Cast(x, DType::kF32);
    return {Softmax(x, a.Int(1), true)};
  }});
  rows.push_back({"_softmax_backward_data", [](OpArgs& a) -> V {
    Value g = a.V(0), y = a.V(1);
    int64_t dim = ir::NormalizeDim(a.Int(2), y.rank());
    DType ct = OpMath(y.dtype());
    g = Cast(g, ct), y = Cast(y, ct);
    Value gy = ir::Binary(Op::kMul, g, y);
    // A scalar's sum over its one element is itself: y * (g - g * y) is 0 for y = 1 and finite g,
    // NaN for a NaN output or an infinite gradient, as eager (fuzz seed 10183).
    Value s = y.rank() == 0 ? gy : KeepDims(ir::Reduce(ir::ReduceKind::kSum, gy, {dim}), y.dims(), {dim});
    Value r = ir::Binary(Op::kMul, y, Bin(Op::kSub, g, s));
    return {Cast(r, a.args[3].dtype)};
  }});
  rows.push_back({"_log_softmax_backward_data", [](OpArgs& a) -> V {
    Value g = a.V(0), y = a.V(1);
    int64_t dim = ir::NormalizeDim(a.Int(2), y.rank());
    DType ct = OpMath(y.dtype());
    g = Cast(g, ct), y = Cast(y, ct);
    Value s = y.rank() == 0 ? g : KeepDims(ir::Reduce(ir::ReduceKind::kSum, g, {dim}), y.dims(), {dim});
    Value r = ir::Binary(Op::kSub, g, Bin(Op::kMul, ir::Unary(Op::kExp, y), s));
    return {Cast(r, a.args[3].dtype)};
  }});

  rows.push_back({"nll_loss_forward", NllForward});
  rows.push_back({"nll_loss_backward", NllBackward});
  rows.push_back({"nll_loss2d_forward", Nll2dForward});
  rows.push_back({"nll_loss2d_backward", Nll2dBackward});
  rows.push_back({"embedding_renorm", EmbeddingRenorm});

  rows.push_back({"embedding", [](OpArgs& a) -> V {
    Value w = a.V(0), idx = a.V(1);
    if (w.rank() != 2) a.Fail("'weight' must be 2-D");
    int64_t n = idx.shape().numel(), d = w.dims()[1];
    CheckIndexRange(idx, 0, w.dims()[0], "embedding: index out of range in self", a.device);
    Value i1 = ir::Reshape(Cast(idx, DType::kS64), {n, 1});
    Value rows_ = ir::Gather(w, i1, {1}, {0}, {0}, 1, {1, d});
    std::vector<int64_t> out = idx.dims();
    out.push_back(d);
    return {ir::Reshape(rows_, out)};
  }});
  rows.push_back({"embedding_dense_backward", [](OpArgs& a) -> V {
    Value g = a.V(0), idx = a.V(1);
    int64_t num_weights = a.Int(2), padding_idx = a.Int(3);
    if (a.Bool(4)) a.Fail("scale_grad_by_freq is not lowered");
    int64_t d = g.dims().back(), n = idx.shape().numel();
    Value i = Cast(ir::Reshape(idx, {n}), DType::kS64);
    Value upd = ir::Reshape(g, {n, d});
    if (padding_idx >= 0) {
      Value keep = ir::Compare(CompareDir::kNE, i, ir::Full(static_cast<double>(padding_idx), i.shape()));
      upd = ir::Select(ir::BroadcastInDim(keep, {n, d}, {0}), upd, ir::Full(0, upd.shape()));
    }
    Value zeros = ir::Full(0, ir::Shape(g.dtype(), {num_weights, d}));
    return {ir::Scatter(zeros, ir::Reshape(i, {n, 1}), upd, {1}, {0}, {0}, 1, 1)};
  }});

  rows.push_back({"native_layer_norm", [](OpArgs& a) -> V {
    Value x = a.V(0);
    const auto& ns = a.Ints(1);
    auto w = a.OptV(2), b = a.OptV(3);
    double eps = a.Double(4);
    int r = x.rank(), k = static_cast<int>(ns.size());
    for (int i = 0; i < k; ++i) {
      if (x.dims()[r - k + i] != ns[i]) a.Fail("Given normalized_shape=" + ir::DimsToString(ns) + ", expected input with shape [*, " + std::to_string(ns[i]) + "], but got input of size" + ir::DimsToString(x.dims()));
    }
    std::vector<int64_t> axes;
    for (int i = r - k; i < r; ++i) axes.push_back(i);
    DType ct = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value xc = Cast(x, ct);
    double n = static_cast<double>(ProductOf(ns));
    Value mean;
    if (x.shape().numel() > 0) {
      // The mean about a pivot (each row's first element), as eager's Welford moments: a constant
      // row gets its value back exactly, so x - mean is exactly 0 there (sum/n can be an ulp off,
      // which rstd = 1/sqrt(eps) turns into ~1e-5), and shifted sums lose less precision.
      std::vector<int64_t> start(r, 0), limit = x.dims(), strides(r, 1);
      for (int64_t ax : axes) limit[ax] = 1;
      Value pivot = ir::Slice(xc, start, limit, strides);
      Value shifted = LayerNormStat(Bin(Op::kSub, xc, pivot), axes);
      mean = ir::Binary(Op::kAdd, pivot, ir::Binary(Op::kDiv, shifted, ir::Full(n, shifted.shape())));
    } else {
      mean = ir::Binary(Op::kDiv, LayerNormStat(xc, axes), ir::Full(n, LayerNormStat(xc, axes).shape()));
    }
    Value centered = Bin(Op::kSub, xc, mean);
    Value var = LayerNormStat(ir::Binary(Op::kMul, centered, centered), axes);
    var = ir::Binary(Op::kDiv, var, ir::Full(n, var.shape()));
    Value rstd = ir::Unary(Op::kRsqrt, ir::Binary(Op::kAdd, var, ir::Full(eps, var.shape())));
    Value y = Bin(Op::kMul, centered, rstd);
    if (w) y = Bin(Op::kMul, y, Cast(*w, ct));
    if (b) y = Bin(Op::kAdd, y, Cast(*b, ct));
    return {Cast(y, x.dtype()), Cast(mean, x.dtype()), Cast(rstd, x.dtype())};
  }});
  rows.push_back({"native_layer_norm_backward", [](OpArgs& a) -> V {
    Value go = a.V(0), x = a.V(1);
    const auto& ns = a.Ints(2);
    Value mean = a.V(3), rstd = a.V(4);
    auto w = a.OptV(5), b = a.OptV(6);
    const auto& mask_arg = a.args[7];
    std::vector<bool> mask = {true, true, true};
    if (mask_arg.kind == Arg::kIntList) for (size_t i = 0; i < 3 && i < mask_arg.il.size(); ++i) mask[i] = mask_arg.il[i];
    int r = x.rank(), k = static_cast<int>(ns.size());
    std::vector<int64_t> axes, batch_axes;
    for (int i = 0; i < r; ++i) (i >= r - k ? axes : batch_axes).push_back(i);
    DType ct = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value g = Cast(go, ct), xc = Cast(x, ct), m = Cast(mean, ct), rs = Cast(rstd, ct);
    Value xhat = Bin(Op::kMul, Bin(Op::kSub, xc, m), rs);
    V out(3);
    if (mask[0]) {
      Value gw = w ? Bin(Op::kMul, g, Cast(*w, ct)) : g;
      double n = static_cast<double>(ProductOf(ns));
      Value mg = LayerNormStat(gw, axes);
      mg = ir::Binary(Op::kDiv, mg, ir::Full(n, mg.shape()));
      Value mgx = LayerNormStat(ir::Binary(Op::kMul, gw, xhat), axes);
      mgx = ir::Binary(Op::kDiv, mgx, ir::Full(n, mgx.shape()));
      Value dx = Bin(Op::kMul, rs, Bin(Op::kSub, Bin(Op::kSub, gw, mg), Bin(Op::kMul, xhat, mgx)));
      out[0] = Cast(dx, x.dtype());
    }
    if (mask[1] && w) out[1] = Cast(ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kMul, g, xhat), batch_axes), w->dtype());
    if (mask[2] && b) out[2] = Cast(ir::Reduce(ir::ReduceKind::kSum, g, batch_axes), b->dtype());
    return out;
  }});

  // scaled_dot_product_attention's fused CPU kernel (what eager CPU runs for 4-d float q/k/v without
  // dropout or mask; autograd_xla_overrides.cc routes XLA's sdpa calls here under the same
  // conditions): one op forward, one backward, in float32 (float64 for f64) as eager's kernel.
  rows.push_back({"_scaled_dot_product_flash_attention_for_cpu", [](OpArgs& a) -> V {
    Value q = a.V(0), k = a.V(1), v = a.V(2);
    auto at = FlashAttentionArgs(a, q, k, v, 3, 4, 5, 6);
    Value s = FlashScores(q, k, at);
    Value m = ir::Reduce(ir::ReduceKind::kMax, s, {3});  // [B, H, L]
    Value e = ir::Unary(Op::kExp, Bin(Op::kSub, s, ir::BroadcastInDim(m, s.dims(), {0, 1, 2})));
    Value l = ir::Reduce(ir::ReduceKind::kSum, e, {3});
    Value o = ir::DotGeneral(e, Cast(v, at.ct), {0, 1}, {0, 1}, {3}, {2}, at.ct);  // [B, H, L, E]
    o = Bin(Op::kDiv, o, ir::BroadcastInDim(l, o.dims(), {0, 1, 2}));
    Value lse = Bin(Op::kAdd, m, ir::Unary(Op::kLog, l));
    return {Cast(o, q.dtype()), lse};
  }});
  rows.push_back({"_scaled_dot_product_flash_attention_for_cpu_backward", [](OpArgs& a) -> V {
    Value go = a.V(0), q = a.V(1), k = a.V(2), v = a.V(3), out = a.V(4), lse = a.V(5);
    auto at = FlashAttentionArgs(a, q, k, v, 6, 7, 8, 9);
    DType ct = at.ct;
    Value s = FlashScores(q, k, at);
    Value p = ir::Unary(Op::kExp, Bin(Op::kSub, s, ir::BroadcastInDim(Cast(lse, ct), s.dims(), {0, 1, 2})));
    Value g = Cast(go, ct), vc = Cast(v, ct);
    Value dv = ir::DotGeneral(p, g, {0, 1}, {0, 1}, {2}, {2}, ct);   // [B, H, S, E]
    Value dp = ir::DotGeneral(g, vc, {0, 1}, {0, 1}, {3}, {3}, ct);  // [B, H, L, S]
    Value d = ir::Reduce(ir::ReduceKind::kSum, Bin(Op::kMul, g, Cast(out, ct)), {3});
    Value ds = Bin(Op::kMul, p, Bin(Op::kSub, dp, ir::BroadcastInDim(d, dp.dims(), {0, 1, 2})));
    Value scale = ir::Full(at.scale, ir::Shape(ct, {}));
    Value dq = ir::DotGeneral(ds, Cast(k, ct), {0, 1}, {0, 1}, {3}, {2}, ct);  // [B, H, L, E]
    Value dk = ir::DotGeneral(ds, Cast(q, ct), {0, 1}, {0, 1}, {2}, {2}, ct);  // [B, H, S, E]
    dq = Bin(Op::kMul, dq, scale);
    dk = Bin(Op::kMul, dk, scale);
    return {Cast(dq, q.dtype()), Cast(dk, k.dtype()), Cast(dv, v.dtype())};
  }});

  rows.push_back({"native_dropout", [](OpArgs& a) -> V {
    Value x = a.V(0);
    double p = a.Double(1);
    bool train = a.Bool(2, true);
    if (!train || p == 0) return {x, ir::Full(1, ir::Shape(DType::kPred, x.dims()))};
    if (p >= 1) return {ir::Full(0, x.shape()), ir::Full(0, ir::Shape(DType::kPred, x.dims()))};
    Value u = RandomUniform(ir::Shape(DType::kF32, x.dims()), a.device);
    Value keep = ir::Compare(CompareDir::kLT, u, ir::Full(1 - p, u.shape()));
    Value scaled = ir::Binary(Op::kMul, x, ir::Full(1.0 / (1 - p), x.shape()));
    return {ir::Select(keep, scaled, ir::Full(0, x.shape())), keep};
  }});
  rows.push_back({"native_dropout_backward", [](OpArgs& a) -> V {
    // grad * mask * scale: a float scale promotes integer/bool grads to the default float type.
    Value g = Cast(a.V(0), FloatOf(a.V(0).dtype())), m = a.V(1);
    Value s = ir::Binary(Op::kMul, g, ir::Full(a.Double(2), g.shape()));
    return {Where(Cast(m, DType::kPred), s, ir::Full(0, g.shape()))};
  }});
}

}  // namespace txla::ops
