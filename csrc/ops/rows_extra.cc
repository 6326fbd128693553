// Op table rows PyTorch/XLA lowers that the OpInfo survey found on the CPU fallback (issue #8,
// op-lowering remainder): cummax/cummin (eager's tie and NaN rules), aminmax, diag_embed,
// huber_loss (+ backward), pixel_shuffle/pixel_unshuffle and channel_shuffle (reshape + transpose),
// the random fills exponential/cauchy/geometric/log_normal and multinomial (the device RNG, as the
// other random rows: same distributions as eager, not the same draws).
// Argument errors go to the CPU fallback, which raises eager's error.
#include <algorithm>
#include <cmath>
#include <optional>
#include <numeric>

#include "graph/graph.h"
#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

Value C(double v, const Value& like) { return ir::Full(v, like.shape()); }
Value Eq(const Value& a, const Value& b) { return ir::Compare(CompareDir::kEQ, a, b); }
Value IsNan(const Value& x) { return ir::Compare(CompareDir::kNE, x, x); }

// cummax/cummin along dim. Eager updates the running value (and its index) when x is NaN or x >= the
// running max (<= for min), so ties take the later index, and after a NaN the index is the last
// NaN's. The update positions are where x equals the running reduction (or is NaN); each index is
// the last update position so far, and the values are read back at those indices (signed zeros as
// eager's).
std::vector<Value> CumExtreme(const Value& x, int64_t dim, bool is_max) {
  if (x.rank() == 0) return {x, ir::ConstantInt(0, DType::kS64)};
  int64_t d = ir::NormalizeDim(dim, x.rank());
  Value run = ir::Cumulative(is_max ? ir::ReduceKind::kMax : ir::ReduceKind::kMin, x, d);
  Value upd = Eq(x, run);
  if (ir::IsFloating(x.dtype())) upd = ir::Binary(Op::kOr, upd, IsNan(x));
  ir::Shape is(DType::kS64, x.dims());
  Value pos = ir::Select(upd, ir::Iota(is, d), ir::Full(0, is));
  Value idx = ir::Cumulative(ir::ReduceKind::kMax, pos, d);
  // values = x gathered at idx along d.
  int r = x.rank();
  int64_t n = x.shape().numel();
  std::vector<Value> cols;
  for (int k = 0; k < r; ++k) cols.push_back(ir::Reshape(k == d ? idx : ir::Iota(is, k), {n, 1}));
  std::vector<int64_t> all(r), ones(r, 1);
  std::iota(all.begin(), all.end(), 0);
  Value vals = ir::Reshape(ir::Gather(x, ir::Concatenate(cols, 1), {}, all, all, 1, ones), x.dims());
  return {vals, idx};
}


// Uniform [0, 1) draws in the compute type of `like` (f64 for f64, else f32).
Value Uniform01(const Value& like, int device) {
  DType ct = like.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  return RandomUniform(ir::Shape(ct, like.dims()), device);
}

std::string Num(double v) {
  std::string s = std::to_string(v);
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  while (!s.empty() && s.back() == '0') s.pop_back();
  return s;
}

}  // namespace

static void AddExtraRandomRows(std::vector<OpRow>& rows) {
  auto floating = [](OpArgs& a, const char* what) {
    DType t = a.V(0).dtype();
    if (!ir::IsFloating(t)) {
      a.Fail(std::string(what) + " distribution is a continuous probability distribution. dtype must be a floating "
             "point but you specified " + ScalarTypeName(t));
    }
  };
  rows.push_back({"exponential", [floating](OpArgs& a) -> V {
    double lambd = a.Double(1);
    if (!(lambd > 0)) a.Fail("exponential_ expects lambda > 0.0, but found lambda=" + Num(lambd));
    floating(a, "Exponential");
    Value u = Uniform01(a.V(0), a.device);
    Value r = ir::Binary(Op::kDiv, ir::Unary(Op::kNeg, ir::Unary(Op::kLog1p, ir::Unary(Op::kNeg, u))), C(lambd, u));
    return {Cast(r, a.V(0).dtype())};
  }});
  rows.push_back({"cauchy", [floating](OpArgs& a) -> V {
    double median = a.Double(1), sigma = a.Double(2);
    if (!(sigma > 0)) a.Fail("cauchy_ expects sigma > 0.0, but found sigma=" + Num(sigma));
    floating(a, "Cauchy");
    Value u = Uniform01(a.V(0), a.device);
    Value t = ir::Unary(Op::kTan, ir::Binary(Op::kMul, C(M_PI, u), ir::Binary(Op::kSub, u, C(0.5, u))));
    return {Cast(ir::Binary(Op::kAdd, C(median, u), ir::Binary(Op::kMul, C(sigma, u), t)), a.V(0).dtype())};
  }});
  rows.push_back({"log_normal", [floating](OpArgs& a) -> V {
    double mean = a.Double(1), std = a.Double(2);
    if (!(std > 0)) a.Fail("log_normal_ expects std > 0.0, but found std=" + Num(std));
    floating(a, "LogNormal");
    DType ct = a.V(0).dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value n = RandomNormal(ir::Shape(ct, a.V(0).dims()), a.device);
    Value r = ir::Unary(Op::kExp, ir::Binary(Op::kAdd, C(mean, n), ir::Binary(Op::kMul, C(std, n), n)));
    return {Cast(r, a.V(0).dtype())};
  }});
  rows.push_back({"geometric", [](OpArgs& a) -> V {
    // The number of Bernoulli(p) trials up to the first success: ceil(log(1 - u) / log1p(-p)) >= 1.
    double p = a.Double(1);
    if (!(p > 0 && p < 1)) a.Fail("geometric_ expects p to be in (0, 1), but got p=" + Num(p));
    Value self = a.V(0);
    if (self.dtype() == DType::kPred || ir::IsComplex(self.dtype())) throw NotLowered{};
    ir::Shape s(DType::kF64, self.dims());
    Value u = RandomUniform(s, a.device);
    Value k = ir::Unary(Op::kCeil, ir::Binary(Op::kDiv, ir::Unary(Op::kLog1p, ir::Unary(Op::kNeg, u)),
                                              ir::Full(std::log1p(-p), s)));
    k = ir::Binary(Op::kMax, k, ir::Full(1, s));
    return {Cast(k, self.dtype())};
  }});
  rows.push_back({"multinomial", [](OpArgs& a) -> V {
    Value p = a.V(0);
    int64_t n = a.Int(1);
    bool replacement = a.Bool(2);
    if (!ir::IsFloating(p.dtype()) || (p.rank() != 1 && p.rank() != 2) || n <= 0) throw NotLowered{};  // eager's errors
    int64_t k = p.dims().back();
    if (k == 0 || (!replacement && n > k)) throw NotLowered{};
    int r = p.rank();
    DType ct = p.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    Value pc = Cast(p, ct);
    std::vector<int64_t> all(r);
    std::iota(all.begin(), all.end(), 0);
    Value ok = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGE, pc, C(0, pc)), ir::Unary(Op::kIsFinite, pc));
    graph::AddCheck(ir::Reduce(ir::ReduceKind::kAnd, ok, all),
                    "probability tensor contains either `inf`, `nan` or element < 0", a.device, true);
    Value total = ir::Reduce(ir::ReduceKind::kSum, pc, {static_cast<int64_t>(r - 1)});
    std::vector<int64_t> rows_dims;
    for (int i = 0; i < total.rank(); ++i) rows_dims.push_back(i);
    Value pos = ir::Compare(CompareDir::kGT, total, C(0, total));
    graph::AddCheck(total.rank() ? ir::Reduce(ir::ReduceKind::kAnd, pos, rows_dims) : pos,
                    "invalid multinomial distribution (sum of probabilities <= 0)", a.device, true);
    std::vector<int64_t> out_dims = p.dims();
    out_dims.back() = n;
    if (!replacement) {
      // Gumbel top-n: keys log(p) - log(-log(u)); zero probabilities come last.
      Value u = RandomUniform(pc.shape(), a.device);
      Value g = ir::Unary(Op::kNeg, ir::Unary(Op::kLog, ir::Unary(Op::kNeg, ir::Unary(Op::kLog, u))));
      Value keys = ir::Binary(Op::kAdd, ir::Unary(Op::kLog, pc), g);
      ir::Shape is(DType::kS64, pc.dims());
      auto sorted = ir::Sort({keys, ir::Iota(is, r - 1)}, r - 1, /*descending=*/true, /*stable=*/true);
      std::vector<int64_t> st(r, 0), lim = pc.dims(), str(r, 1);
      lim.back() = n;
      return {ir::Slice(sorted[1], st, lim, str)};
    }
    // Inverse CDF: the sample is the number of cumulative sums <= u * total.
    Value cdf = ir::Cumulative(ir::ReduceKind::kSum, pc, r - 1);
    ir::Shape us(ct, out_dims);
    Value u = RandomUniform(us, a.device);
    std::vector<int64_t> keep;
    for (int i = 0; i < r - 1; ++i) keep.push_back(i);
    Value v = ir::Binary(Op::kMul, u, ir::BroadcastInDim(total, out_dims, keep));
    // [.., n, k] comparisons.
    std::vector<int64_t> cmp_dims = out_dims;
    cmp_dims.push_back(k);
    std::vector<int64_t> vd, cd;
    for (int i = 0; i < r; ++i) vd.push_back(i);
    for (int i = 0; i < r - 1; ++i) cd.push_back(i);
    cd.push_back(r);
    Value le = ir::Compare(CompareDir::kLE, ir::BroadcastInDim(cdf, cmp_dims, cd), ir::BroadcastInDim(v, cmp_dims, vd));
    Value cnt = ir::Reduce(ir::ReduceKind::kSum, Cast(le, DType::kS64), {static_cast<int64_t>(r)});
    return {ir::Binary(Op::kMin, cnt, ir::Full(static_cast<double>(k - 1), cnt.shape()))};
  }});
}

// The insertion points of x into sorted rows of `seq` (last dim), as eager's binary search: the
// number of entries e with !(e >= x) (left) or !(e > x) (right), so NaN goes last.
// Eager's binary search (cus_lower_bound / cus_upper_bound): start = 0, end = size; while start <
// end: mid = start + (end - start) / 2, go right when !(seq[mid] >= v) (left) or !(seq[mid] > v)
// (right). Run as floor(log2(size)) + 1 masked steps, each a gather per query. Counting the
// elements below v instead gave other answers where the search path matters: NaN in the sequence
// (NaNs sort last; `!(nan >= v)` sends the search right only where it visits them) and unsorted
// sequences.
Value SearchSorted(const Value& seq, const Value& x, bool right, bool int32) {
  const DType out = int32 ? DType::kS32 : DType::kS64;
  const int64_t b = seq.dims().back();
  const int64_t batches = seq.shape().numel() / b;
  const int64_t m = seq.rank() > 1 ? x.dims().back() : x.shape().numel();
  if (x.shape().numel() == 0) return ir::Full(0, ir::Shape(out, x.dims()));
  Value flat = ir::Reshape(seq, {batches * b});
  Value xv = ir::Reshape(x, {batches, m});
  const ir::Shape is(DType::kS64, {batches, m});
  auto full = [&](double v) { return ir::Full(v, is); };
  Value base = ir::Binary(Op::kMul, ir::Iota(is, 0), full(static_cast<double>(b)));
  Value lo = full(0), hi = full(static_cast<double>(b));
  int steps = 0;
  for (int64_t n = b; n > 0; n >>= 1) ++steps;
  for (int i = 0; i < steps; ++i) {
    Value active = ir::Compare(CompareDir::kLT, lo, hi);
    Value mid = ir::Binary(Op::kAdd, lo, ir::Binary(Op::kShiftRightArithmetic, ir::Binary(Op::kSub, hi, lo), full(1)));
    Value at = ir::Binary(Op::kAdd, base, ir::Binary(Op::kMin, mid, full(static_cast<double>(b - 1))));
    Value val = ir::Reshape(ir::Gather(flat, ir::Reshape(at, {batches * m, 1}), {}, {0}, {0}, 1, {1}), {batches, m});
    Value stop = ir::Compare(right ? CompareDir::kGT : CompareDir::kGE, val, xv);  // NaN: false, go right
    Value go_right = ir::Binary(Op::kAnd, active, ir::Unary(Op::kNot, stop));
    Value go_left = ir::Binary(Op::kAnd, active, stop);
    lo = ir::Select(go_right, ir::Binary(Op::kAdd, mid, full(1)), lo);
    hi = ir::Select(go_left, mid, hi);
  }
  return Cast(ir::Reshape(lo, x.dims()), out);
}

// max_unpool: zeros of the output size, each input value written at its flat per-plane index.
Value MaxUnpool(OpArgs& a, int nsp) {
  Value x = a.V(0), idx = a.V(1);
  const auto& os = a.Ints(2);
  int r = x.rank();
  if ((r != nsp + 1 && r != nsp + 2) || idx.dims() != x.dims() || idx.dtype() != DType::kS64 || !ir::IsFloating(x.dtype()) ||
      static_cast<int>(os.size()) != nsp) {
    throw NotLowered{};  // eager's errors
  }
  int64_t planes = 1, area = 1, m = 1;
  for (int i = 0; i < r - nsp; ++i) planes *= x.dims()[i];
  for (int64_t o : os) area *= o;
  for (int i = r - nsp; i < r; ++i) m *= x.dims()[i];
  std::vector<int64_t> od(x.dims().begin(), x.dims().end() - nsp);
  for (int64_t o : os) od.push_back(o);
  if (planes * area == 0) return ir::Full(0, ir::Shape(x.dtype(), od));
  if (planes * m == 0) return ir::Full(0, ir::Shape(x.dtype(), od));
  CheckIndexRange(idx, 0, area, "Found an invalid max index (output volumes are of size " + [&] {
    std::string t;
    for (size_t i = 0; i < os.size(); ++i) t += (i ? "x" : "") + std::to_string(os[i]);
    return t;
  }() + ")", a.device, std::nullopt, /*runtime_error=*/true);
  ir::Shape is(DType::kS64, {planes, m});
  Value both = ir::Concatenate({ir::Reshape(ir::Iota(is, 0), {planes * m, 1}), ir::Reshape(idx, {planes * m, 1})}, 1);
  Value g = ir::Scatter(ir::Full(0, ir::Shape(x.dtype(), {planes, area})), both, ir::Reshape(x, {planes * m}), {},
                        {0, 1}, {0, 1}, 1, 0);
  return ir::Reshape(g, od);
}

// grid_sampler_2d, bilinear or nearest, zeros or border padding, as eager's CPU kernel: source
// coordinates (g + 1) * s (- 0.5 without align_corners), s = (size - 1) / 2 or size / 2; border
// clips them to [0, size - 1]; bilinear output nw*v_nw + ne*v_ne + sw*v_sw + se*v_se with
// out-of-bounds corners read as 0 (their weights still multiply: NaN stays NaN).
struct GridGeom {
  Value x, y;                     // source coordinates [N, Ho, Wo]
  double sx = 0, sy = 0;          // d coordinate / d grid
};
GridGeom GridCoords(const Value& grid, int64_t h, int64_t w, bool border, bool align_corners) {
  int64_t n = grid.dims()[0], ho = grid.dims()[1], wo = grid.dims()[2];
  DType t = grid.dtype();
  std::vector<int64_t> st = {0, 0, 0, 0}, lim = {n, ho, wo, 1}, str = {1, 1, 1, 1};
  Value gx = ir::Reshape(ir::Slice(grid, st, lim, str), {n, ho, wo});
  st[3] = 1;
  lim[3] = 2;
  Value gy = ir::Reshape(ir::Slice(grid, st, lim, str), {n, ho, wo});
  auto un = [&](const Value& g, int64_t size, double* scale) {
    double sc = align_corners ? static_cast<double>(size - 1) / 2 : static_cast<double>(size) / 2;
    *scale = sc;
    Value v = ir::Binary(Op::kMul, ir::Binary(Op::kAdd, g, C(1, g)), C(sc, g));
    if (!align_corners) v = ir::Binary(Op::kSub, v, C(0.5, v));
    if (border) v = ir::Binary(Op::kMin, C(static_cast<double>(size - 1), v), ir::Binary(Op::kMax, v, C(0, v)));
    return v;
  };
  GridGeom gg;
  gg.x = un(gx, w, &gg.sx);
  gg.y = un(gy, h, &gg.sy);
  (void)t;
  return gg;
}

// Reads input [N, C, H, W] at integer coordinates (iy, ix) [N, Ho, Wo]; `ok` masks out-of-bounds
// reads to 0. Returns [N, C, Ho, Wo].
Value GridRead(const Value& in, const Value& iy, const Value& ix, const Value& ok) {
  int64_t n = in.dims()[0], c = in.dims()[1], h = in.dims()[2], w = in.dims()[3];
  std::vector<int64_t> od = iy.dims();
  ir::Shape is(DType::kS64, od);
  Value cy = ir::Clamp(ir::Full(0, is), iy, ir::Full(static_cast<double>(h - 1), is));
  Value cx = ir::Clamp(ir::Full(0, is), ix, ir::Full(static_cast<double>(w - 1), is));
  std::vector<int64_t> cd = od;
  cd.push_back(1);
  Value coords = ir::Concatenate({ir::Reshape(ir::Iota(is, 0), cd), ir::Reshape(cy, cd), ir::Reshape(cx, cd)}, 3);
  Value nhwc = ir::Transpose(in, {0, 2, 3, 1});
  Value g = ir::Gather(nhwc, coords, {3}, {0, 1, 2}, {0, 1, 2}, 3, {1, 1, 1, c});  // [N, Ho, Wo, C]
  (void)n;
  Value okb = ir::BroadcastInDim(ok, g.dims(), {0, 1, 2});
  g = ir::Select(okb, g, ir::Full(0, g.shape()));
  return ir::Transpose(g, {0, 3, 1, 2});
}

struct Corners {
  Value iy[4], ix[4], ok[4], wt[4];  // nw, ne, sw, se
  Value fx, fy;                     // fractional parts (w, n in eager's names)
};
Corners BilinearCorners(const GridGeom& gg, int64_t h, int64_t w) {
  Corners k;
  Value xw = ir::Unary(Op::kFloor, gg.x), yn = ir::Unary(Op::kFloor, gg.y);
  k.fx = ir::Binary(Op::kSub, gg.x, xw);
  k.fy = ir::Binary(Op::kSub, gg.y, yn);
  Value e = ir::Binary(Op::kSub, C(1, k.fx), k.fx), s = ir::Binary(Op::kSub, C(1, k.fy), k.fy);
  k.wt[0] = ir::Binary(Op::kMul, s, e);
  k.wt[1] = ir::Binary(Op::kMul, s, k.fx);
  k.wt[2] = ir::Binary(Op::kMul, k.fy, e);
  k.wt[3] = ir::Binary(Op::kMul, k.fy, k.fx);
  auto in_range = [](const Value& v, double lo, double hi) {  // lo < v < hi (false for NaN)
    return ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGT, v, C(lo, v)), ir::Compare(CompareDir::kLT, v, C(hi, v)));
  };
  Value wm = in_range(xw, -1, static_cast<double>(w)), em = in_range(xw, -2, static_cast<double>(w - 1));
  Value nm = in_range(yn, -1, static_cast<double>(h)), sm = in_range(yn, -2, static_cast<double>(h - 1));
  Value ixw = Cast(ir::Select(wm, xw, C(0, xw)), DType::kS64), iyn = Cast(ir::Select(nm, yn, C(0, yn)), DType::kS64);
  Value ixe = ir::Binary(Op::kAdd, Cast(ir::Select(em, xw, C(0, xw)), DType::kS64), ir::Full(1, ixw.shape()));
  Value iys = ir::Binary(Op::kAdd, Cast(ir::Select(sm, yn, C(0, yn)), DType::kS64), ir::Full(1, iyn.shape()));
  k.iy[0] = iyn; k.ix[0] = ixw; k.ok[0] = ir::Binary(Op::kAnd, nm, wm);
  k.iy[1] = iyn; k.ix[1] = ixe; k.ok[1] = ir::Binary(Op::kAnd, nm, em);
  k.iy[2] = iys; k.ix[2] = ixw; k.ok[2] = ir::Binary(Op::kAnd, sm, wm);
  k.iy[3] = iys; k.ix[3] = ixe; k.ok[3] = ir::Binary(Op::kAnd, sm, em);
  return k;
}

// || d ||_p over dim `last` of the pairwise differences d, as eager's distance kernels: p = 0 counts
// the nonzero elements, 1, 2 and inf have their own forms, any other p is (sum |d|^p)^(1/p).
static Value PNormOfDiff(const Value& d, int64_t last, double p, DType t) {
  Value ad = ir::Unary(Op::kAbs, d);
  if (p == 0) return ir::Reduce(ir::ReduceKind::kSum, Cast(ir::Compare(CompareDir::kNE, d, ir::Full(0, d.shape())), t), {last});
  if (p == 1) return ir::Reduce(ir::ReduceKind::kSum, ad, {last});
  if (p == 2) return ir::Unary(Op::kSqrt, ir::Reduce(ir::ReduceKind::kSum, Bin(Op::kMul, d, d), {last}));
  if (std::isinf(p)) return ir::Reduce(ir::ReduceKind::kMax, ad, {last});
  Value s = ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kPow, ad, ir::Full(p, ad.shape())), {last});
  return ir::Binary(Op::kPow, s, ir::Full(1.0 / p, s.shape()));
}

// The gradient of || d ||_p for each element of d, times the incoming gradient gq (gq and the
// distance dq broadcast to d's shape): eager's per-pair backward terms (zero where the distance is
// 0, and for p < 1 where the difference is 0). p = 0 is not handled here (its gradient is zero).
static Value PNormGradTerm(const Value& d, const Value& gq, const Value& dq, double p, DType t) {
  Value zero = ir::Full(0, d.shape());
  Value ad = ir::Unary(Op::kAbs, d), sg = ir::Unary(Op::kSign, d);
  Value dist0 = ir::Compare(CompareDir::kEQ, dq, zero);
  auto powc = [&](const Value& x, double e) { return ir::Binary(Op::kPow, x, ir::Full(e, x.shape())); };
  Value term;
  if (p == 1) {
    term = Bin(Op::kMul, gq, sg);
  } else if (p == 2) {
    term = ir::Select(dist0, zero, Bin(Op::kDiv, Bin(Op::kMul, gq, d), dq));
  } else if (std::isinf(p)) {
    term = Bin(Op::kMul, Bin(Op::kMul, gq, sg), Cast(ir::Compare(CompareDir::kEQ, ad, dq), t));
  } else if (p < 2) {
    Value v = Bin(Op::kDiv, Bin(Op::kMul, Bin(Op::kMul, sg, powc(ad, p - 1)), gq), powc(dq, p - 1));
    Value skip = dist0;
    if (p < 1) skip = ir::Binary(Op::kOr, skip, ir::Compare(CompareDir::kEQ, d, zero));
    term = ir::Select(skip, zero, v);
  } else {
    Value v = Bin(Op::kDiv, Bin(Op::kMul, Bin(Op::kMul, d, powc(ad, p - 2)), gq), powc(dq, p - 1));
    term = ir::Select(dist0, zero, v);
  }
  return term;
}

// cdist's geometry: x1 [B1..., P, M] and x2 [B2..., R, M] with broadcast batch dims, and their
// pairwise differences x1[b, i] - x2[b, j] as [batch..., P, R, M].
struct CdistPairs {
  std::vector<int64_t> batch;
  int64_t P, R, M;
  explicit CdistPairs(const Value& x1, const Value& x2)
      : batch(BroadcastShapes(std::vector<int64_t>(x1.dims().begin(), x1.dims().end() - 2),
                              std::vector<int64_t>(x2.dims().begin(), x2.dims().end() - 2))),
        P(x1.dims()[x1.rank() - 2]), R(x2.dims()[x2.rank() - 2]), M(x1.dims().back()) {}
  std::vector<int64_t> Dims(std::initializer_list<int64_t> tail) const {
    std::vector<int64_t> d = batch;
    d.insert(d.end(), tail);
    return d;
  }
  Value Diffs(const Value& x1, const Value& x2) const {
    const std::vector<int64_t> quad = Dims({P, R, M});
    const int nq = static_cast<int>(quad.size());
    auto spread = [&](const Value& x, int64_t n, int skip) {  // [batch..., n, M] -> quad, skipping `skip`
      std::vector<int64_t> bd;
      for (int k = 0; k < nq; ++k) if (k != skip) bd.push_back(k);
      return ir::BroadcastInDim(BroadcastTo(x, Dims({n, M})), quad, bd);
    };
    return Bin(Op::kSub, spread(x1, P, nq - 2), spread(x2, R, nq - 3));
  }
};

// angle (real inputs), isin, cdist's kernel, im2col/col2im (nn.Unfold / nn.Fold): composites of
// existing primitives. Anything outside what is lowered here (complex inputs, eager's argument
// errors, very large pairwise products) throws NotLowered: the CPU fallback gives eager's answer
// or error.
static void AddWindowAndSetRows(std::vector<OpRow>& rows) {
  rows.push_back({"angle", [](OpArgs& a) -> V {
    // eager, real inputs: pi where x < 0, NaN where x is NaN, else 0; integers give the default float.
    Value x = a.V(0);
    if (ir::IsComplex(x.dtype()) || !(ir::IsFloating(x.dtype()) || x.dtype() == DType::kPred ||
                                      x.dtype() == DType::kU8 || x.dtype() == DType::kS8 ||
                                      x.dtype() == DType::kS16 || x.dtype() == DType::kS32 ||
                                      x.dtype() == DType::kS64)) {
      throw NotLowered{};
    }
    DType t = FloatOf(x.dtype());
    Value zero = ir::Full(0, ir::Shape(t, x.dims())), pi = ir::Full(M_PI, ir::Shape(t, x.dims()));
    if (x.dtype() == DType::kPred) return {zero};
    Value xz = ir::Full(0, ir::Shape(x.dtype(), x.dims()));
    Value r = ir::Select(ir::Compare(CompareDir::kLT, x, xz), pi, zero);
    if (ir::IsFloating(x.dtype())) r = ir::Select(ir::Compare(CompareDir::kNE, x, x), x, r);
    return {r};
  }});
  // isin: elements[..., None] == test_elements.flatten(), any over the last dim, in the promoted dtype.
  auto isin = [](OpArgs& a, const Value& elements, const Value& test, DType t) -> V {
    const DType kinds[] = {DType::kU8, DType::kS8, DType::kS16, DType::kS32, DType::kS64, DType::kF16,
                           DType::kBF16, DType::kF32, DType::kF64};
    if (std::find(std::begin(kinds), std::end(kinds), t) == std::end(kinds)) throw NotLowered{};
    const int64_t n = elements.shape().numel(), m = test.shape().numel();
    if (n * std::max<int64_t>(m, 1) > (int64_t{1} << 24)) throw NotLowered{};
    bool invert = a.Bool(3);
    if (n == 0 || m == 0) return {ir::Full(invert ? 1 : 0, ir::Shape(DType::kPred, elements.dims()))};
    std::vector<int64_t> out = elements.dims(), pair = elements.dims();
    pair.push_back(m);
    std::vector<int64_t> bd(elements.rank());
    std::iota(bd.begin(), bd.end(), 0);
    Value e = ir::BroadcastInDim(Cast(elements, t), pair, bd);
    Value tv = ir::BroadcastInDim(ir::Reshape(Cast(test, t), {m}), pair, {static_cast<int64_t>(elements.rank())});
    Value hit = ir::Reduce(ir::ReduceKind::kOr, ir::Compare(CompareDir::kEQ, e, tv), {static_cast<int64_t>(elements.rank())});
    if (invert) hit = ir::Unary(Op::kNot, hit);
    return {hit};
  };
  rows.push_back({"isin.Tensor_Tensor", [isin](OpArgs& a) -> V {
    return isin(a, a.V(0), a.V(1), ResultType({&a.T(0), &a.T(1)}));
  }});
  rows.push_back({"isin.Tensor_Scalar", [isin](OpArgs& a) -> V {
    DType t = ResultType({&a.T(0)}, {&a.S(1)});
    return isin(a, a.V(0), ScalarV(a.S(1), t, a.device), t);
  }});
  rows.push_back({"isin.Scalar_Tensor", [isin](OpArgs& a) -> V {
    DType t = ResultType({&a.T(1)}, {&a.S(0)});
    return isin(a, ScalarV(a.S(0), t, a.device), a.V(1), t);
  }});
  rows.push_back({"_cdist_forward", [](OpArgs& a) -> V {
    // out[b, i, j] = || x1[b, i] - x2[b, j] ||_p over the last dim, batch dims broadcast.
    Value x1 = a.V(0), x2 = a.V(1);
    const double p = a.Double(2);
    const DType t = x1.dtype();
    if ((t != DType::kF32 && t != DType::kF64) || x2.dtype() != t || x1.rank() < 2 || x2.rank() < 2 ||
        !(p >= 0) || x1.dims().back() != x2.dims().back()) {
      throw NotLowered{};  // eager's errors
    }
    const CdistPairs pc(x1, x2);
    const int64_t nb = ProductOf(pc.batch);
    if (nb * pc.P * pc.R == 0 || pc.M == 0) return {ir::Full(0, ir::Shape(t, pc.Dims({pc.P, pc.R})))};
    if (nb * pc.P * pc.R * pc.M > (int64_t{1} << 24)) throw NotLowered{};
    return {PNormOfDiff(pc.Diffs(x1, x2), static_cast<int64_t>(pc.batch.size()) + 2, p, t)};
  }});
  rows.push_back({"_cdist_backward", [](OpArgs& a) -> V {
    // The gradient of _cdist_forward for x1 (autograd calls it again with x1 and x2 swapped for x2):
    // eager's per-pair terms, summed over x2's rows, in the broadcast batch shape (autograd sums it
    // down to x1's).
    Value g = a.V(0), x1 = a.V(1), x2 = a.V(2), dist = a.V(4);
    const double p = a.Double(3);
    const DType t = x1.dtype();
    if ((t != DType::kF32 && t != DType::kF64) || x2.dtype() != t || g.dtype() != t || dist.dtype() != t ||
        x1.rank() < 2 || x2.rank() < 2 || !(p >= 0) || x1.dims().back() != x2.dims().back()) {
      throw NotLowered{};
    }
    const CdistPairs pc(x1, x2);
    const std::vector<int64_t> pr = pc.Dims({pc.P, pc.R}), quad = pc.Dims({pc.P, pc.R, pc.M});
    if (g.dims() != pr || dist.dims() != pr) throw NotLowered{};
    const int64_t nb = ProductOf(pc.batch);
    if (nb * pc.P * pc.M == 0 || pc.R == 0 || p == 0) return {ir::Full(0, ir::Shape(t, pc.Dims({pc.P, pc.M})))};
    if (nb * pc.P * pc.R * pc.M > (int64_t{1} << 24)) throw NotLowered{};
    std::vector<int64_t> lead(quad.size() - 1);
    std::iota(lead.begin(), lead.end(), 0);
    Value gq = ir::BroadcastInDim(g, quad, lead), dq = ir::BroadcastInDim(dist, quad, lead);
    Value term = PNormGradTerm(pc.Diffs(x1, x2), gq, dq, p, t);
    return {ir::Reduce(ir::ReduceKind::kSum, term, {static_cast<int64_t>(quad.size()) - 2})};
  }});
  // pdist: the distances of the K = N(N-1)/2 row pairs i < j of x [N, M], in row-major pair order.
  // Pair k's rows from iotas: i = #{r >= 1 : start(r) <= k} with start(r) = r(2N - r - 1)/2, and
  // j = k - start(i) + i + 1.
  struct Pairs {
    Value i, j;
  };
  auto pairs = [](int64_t n) {
    const int64_t k = n * (n - 1) / 2;
    ir::Shape ks(DType::kS64, {k, n - 1});
    Value kk = ir::Iota(ks, 0), r = Bin(Op::kAdd, ir::Iota(ks, 1), ir::Full(1, ks));
    auto start = [&](const Value& v) {  // v(2N - v - 1)/2
      Value two_n = ir::Full(static_cast<double>(2 * n - 1), v.shape());
      return Bin(Op::kDiv, Bin(Op::kMul, v, Bin(Op::kSub, two_n, v)), ir::Full(2, v.shape()));
    };
    Value i = ir::Reduce(ir::ReduceKind::kSum, Cast(ir::Compare(CompareDir::kLE, start(r), kk), DType::kS64), {1});
    Value k1 = ir::Iota(ir::Shape(DType::kS64, {k}), 0);
    Value j = Bin(Op::kAdd, Bin(Op::kSub, k1, start(i)), Bin(Op::kAdd, i, ir::Full(1, i.shape())));
    return Pairs{i, j};
  };
  auto rows_at = [](const Value& x, const Value& idx) {  // x[idx] for a 2-d x: [K, M]
    const int64_t m = x.dims()[1], k = idx.dims()[0];
    return ir::Gather(x, ir::Reshape(idx, {k, 1}), {1}, {0}, {0}, 1, {1, m});
  };
  rows.push_back({"_pdist_forward", [pairs, rows_at](OpArgs& a) -> V {
    Value x = a.V(0);
    const double p = a.Double(1);
    const DType t = x.dtype();
    if ((t != DType::kF32 && t != DType::kF64) || x.rank() != 2 || !(p >= 0)) throw NotLowered{};
    const int64_t n = x.dims()[0], m = x.dims()[1];
    if (n <= 1) return {ir::Full(0, ir::Shape(t, {0}))};
    const int64_t k = n * (n - 1) / 2;
    if (m == 0) return {ir::Full(0, ir::Shape(t, {k}))};
    if (k * std::max(n, m) > (int64_t{1} << 24)) throw NotLowered{};
    Pairs pr = pairs(n);
    return {PNormOfDiff(Bin(Op::kSub, rows_at(x, pr.i), rows_at(x, pr.j)), 1, p, t)};
  }});
  rows.push_back({"_pdist_backward", [pairs, rows_at](OpArgs& a) -> V {
    // Each pair's term is added to row i and subtracted from row j: a [N, K] matrix of 0/+1/-1
    // times the [K, M] terms.
    Value g = a.V(0), x = a.V(1), dist = a.V(3);
    const double p = a.Double(2);
    const DType t = x.dtype();
    if ((t != DType::kF32 && t != DType::kF64) || x.rank() != 2 || !(p >= 0) || g.dtype() != t ||
        dist.dtype() != t) {
      throw NotLowered{};
    }
    const int64_t n = x.dims()[0], m = x.dims()[1];
    const int64_t k = n * (n - 1) / 2;
    if (g.dims() != std::vector<int64_t>{k} || dist.dims() != std::vector<int64_t>{k}) throw NotLowered{};
    if (n <= 1 || m == 0 || p == 0) return {ir::Full(0, ir::Shape(t, x.dims()))};
    if (k * std::max(n, m) > (int64_t{1} << 24)) throw NotLowered{};
    Pairs pr = pairs(n);
    Value d = Bin(Op::kSub, rows_at(x, pr.i), rows_at(x, pr.j));
    Value term = PNormGradTerm(d, ir::BroadcastInDim(g, d.dims(), {0}), ir::BroadcastInDim(dist, d.dims(), {0}), p, t);
    ir::Shape nk(DType::kS64, {n, k});
    Value row = ir::Iota(nk, 0);
    auto hit = [&](const Value& idx) {
      return Cast(ir::Compare(CompareDir::kEQ, row, ir::BroadcastInDim(idx, {n, k}, {1})), t);
    };
    Value sel = Bin(Op::kSub, hit(pr.i), hit(pr.j));
    return {ir::DotGeneral(sel, term, {}, {}, {1}, {0}, t)};
  }});
  // im2col: [N, C, H, W] -> [N, C*kh*kw, L], column (c, i, j) holding x_pad[c, i*dh + y*sh, j*dw + z*sw]
  // for the L = oh*ow output positions (y, z): one strided slice of the padded input per (i, j).
  struct Window {
    int64_t kh, kw, dh, dw, ph, pw, sh, sw;
  };
  auto window = [](OpArgs& a, size_t k) {
    const auto &ks = a.Ints(k), &dl = a.Ints(k + 1), &pd = a.Ints(k + 2), &st = a.Ints(k + 3);
    if (ks.size() != 2 || dl.size() != 2 || pd.size() != 2 || st.size() != 2) throw NotLowered{};
    Window w{ks[0], ks[1], dl[0], dl[1], pd[0], pd[1], st[0], st[1]};
    if (w.kh <= 0 || w.kw <= 0 || w.dh <= 0 || w.dw <= 0 || w.ph < 0 || w.pw < 0 || w.sh <= 0 || w.sw <= 0) {
      throw NotLowered{};  // eager's errors
    }
    return w;
  };
  auto out_len = [](int64_t n, int64_t k, int64_t d, int64_t p, int64_t s) {
    return (n + 2 * p - (d * (k - 1) + 1)) / s + 1;
  };
  rows.push_back({"im2col", [window, out_len](OpArgs& a) -> V {
    Value x = a.V(0);
    const bool batched = x.rank() == 4;
    // eager's kernel takes floating types and bool (its error for the others)
    if (!(ir::IsFloating(x.dtype()) || x.dtype() == DType::kPred) || (x.rank() != 3 && x.rank() != 4)) {
      throw NotLowered{};
    }
    if (!batched) x = ir::Reshape(x, {1, x.dims()[0], x.dims()[1], x.dims()[2]});
    Window w = window(a, 1);
    const int64_t n = x.dims()[0], c = x.dims()[1], h = x.dims()[2], wd = x.dims()[3];
    if (c == 0 || h == 0 || wd == 0) throw NotLowered{};
    const int64_t oh = out_len(h, w.kh, w.dh, w.ph, w.sh), ow = out_len(wd, w.kw, w.dw, w.pw, w.sw);
    if (oh < 1 || ow < 1) throw NotLowered{};
    Value xp = (w.ph || w.pw) ? ir::Pad(x, ir::Full(0, ir::Shape(x.dtype(), {})), {0, 0, w.ph, w.pw},
                                        {0, 0, w.ph, w.pw}, {0, 0, 0, 0})
                              : x;
    std::vector<Value> cols;
    for (int64_t i = 0; i < w.kh; ++i) {
      for (int64_t j = 0; j < w.kw; ++j) {
        std::vector<int64_t> st = {0, 0, i * w.dh, j * w.dw};
        std::vector<int64_t> lim = {n, c, st[2] + (oh - 1) * w.sh + 1, st[3] + (ow - 1) * w.sw + 1};
        cols.push_back(ir::Reshape(ir::Slice(xp, st, lim, {1, 1, w.sh, w.sw}), {n, c, 1, oh, ow}));
      }
    }
    Value r = cols.size() == 1 ? cols[0] : ir::Concatenate(cols, 2);
    std::vector<int64_t> out = {n, c * w.kh * w.kw, oh * ow};
    if (!batched) out.erase(out.begin());
    return {ir::Reshape(r, out)};
  }});
  rows.push_back({"col2im", [window, out_len](OpArgs& a) -> V {
    // The adjoint of im2col: each (i, j) block [N, C, oh, ow] is spread into the padded output with
    // interior padding (stride - 1) at offset (i*dh, j*dw) and the blocks are summed; then the
    // padding is cut off.
    Value x = a.V(0);
    const bool batched = x.rank() == 3;
    if (!ir::IsFloating(x.dtype()) || (x.rank() != 2 && x.rank() != 3)) {
      throw NotLowered{};
    }
    if (!batched) x = ir::Reshape(x, {1, x.dims()[0], x.dims()[1]});
    const auto& os = a.Ints(1);
    if (os.size() != 2) throw NotLowered{};
    Window w = window(a, 2);
    const int64_t n = x.dims()[0], ckk = x.dims()[1], len = x.dims()[2], H = os[0], W = os[1];
    if (ckk == 0 || ckk % (w.kh * w.kw) || H <= 0 || W <= 0) throw NotLowered{};
    const int64_t c = ckk / (w.kh * w.kw);
    const int64_t oh = out_len(H, w.kh, w.dh, w.ph, w.sh), ow = out_len(W, w.kw, w.dw, w.pw, w.sw);
    if (oh < 1 || ow < 1 || oh * ow != len) throw NotLowered{};
    const int64_t hp = H + 2 * w.ph, wp = W + 2 * w.pw;
    const DType t = x.dtype();
    // bf16/f16: eager accumulates in the dtype, one block after another; ours sums in float32 then
    // rounds once (closer to the exact sum).
    const DType acc = (t == DType::kBF16 || t == DType::kF16) ? DType::kF32 : t;
    Value blocks = ir::Reshape(Cast(x, acc), {n, c, w.kh * w.kw, oh, ow});
    Value zero = ir::Full(0, ir::Shape(acc, {}));
    std::optional<Value> sum;
    for (int64_t i = 0; i < w.kh; ++i) {
      for (int64_t j = 0; j < w.kw; ++j) {
        const int64_t k = i * w.kw + j;
        Value b = ir::Reshape(ir::Slice(blocks, {0, 0, k, 0, 0}, {n, c, k + 1, oh, ow}, {1, 1, 1, 1, 1}), {n, c, oh, ow});
        const int64_t y0 = i * w.dh, x0 = j * w.dw;
        const int64_t yh = hp - (y0 + (oh - 1) * w.sh + 1), xh = wp - (x0 + (ow - 1) * w.sw + 1);
        if (yh < 0 || xh < 0) throw NotLowered{};
        Value placed = ir::Pad(b, zero, {0, 0, y0, x0}, {0, 0, yh, xh}, {0, 0, w.sh - 1, w.sw - 1});
        sum = sum ? Bin(Op::kAdd, *sum, placed) : placed;
      }
    }
    Value r = ir::Slice(*sum, {0, 0, w.ph, w.pw}, {n, c, w.ph + H, w.pw + W}, {1, 1, 1, 1});
    r = Cast(r, t);
    if (!batched) r = ir::Reshape(r, {c, H, W});
    return {r};
  }});
}

void AddExtraRows(std::vector<OpRow>& rows) {
  AddExtraRandomRows(rows);
  // prelu's kernel: x > 0 ? x : w * x (w broadcast, as torch's prelu reshapes it), and its backward
  // (grad_weight in the broadcast shape, reduced by autograd).
  rows.push_back({"_prelu_kernel", [](OpArgs& a) -> V {
    Value x = a.V(0), w = a.V(1);
    if (!ir::IsFloating(x.dtype()) || w.dtype() != x.dtype()) throw NotLowered{};
    auto dims = BroadcastShapes(x.dims(), w.dims());
    DType ct = OpMath(x.dtype());
    Value xc = BroadcastTo(Cast(x, ct), dims), wc = BroadcastTo(Cast(w, ct), dims);
    Value r = ir::Select(ir::Compare(CompareDir::kGT, xc, C(0, xc)), xc, ir::Binary(Op::kMul, wc, xc));
    return {Cast(r, x.dtype())};
  }});
  rows.push_back({"_prelu_kernel_backward", [](OpArgs& a) -> V {
    Value g = a.V(0), x = a.V(1), w = a.V(2);
    if (!ir::IsFloating(x.dtype()) || w.dtype() != x.dtype() || g.dtype() != x.dtype()) throw NotLowered{};
    auto dims = BroadcastShapes(BroadcastShapes(x.dims(), w.dims()), g.dims());
    DType ct = OpMath(x.dtype());
    Value xc = BroadcastTo(Cast(x, ct), dims), wc = BroadcastTo(Cast(w, ct), dims), gc = BroadcastTo(Cast(g, ct), dims);
    Value pos = ir::Compare(CompareDir::kGT, xc, C(0, xc));
    Value gi = ir::Select(pos, gc, ir::Binary(Op::kMul, wc, gc));
    Value gw = ir::Select(pos, C(0, xc), ir::Binary(Op::kMul, xc, gc));
    return {Cast(gi, x.dtype()), Cast(gw, x.dtype())};
  }});
  // normal(mean, std) with tensor arguments: mean + std * N(0, 1), broadcast; a negative std raises
  // eager's error (at once for a float, at the next sync or read for a tensor).
  auto normal = [](OpArgs& a, std::optional<Value> mean, std::optional<Value> std_t, double mean_f, double std_f) -> V {
    if (!std_t && std_f < 0) a.Fail("normal expects std >= 0.0, but found std " + Num(std_f));
    DType t = mean ? mean->dtype() : std_t->dtype();
    if (mean && std_t && mean->dtype() != std_t->dtype()) throw NotLowered{};
    if (!ir::IsFloating(t)) throw NotLowered{};
    std::vector<int64_t> dims = mean && std_t ? BroadcastShapes(mean->dims(), std_t->dims()) : ir::Dims(mean ? mean->dims() : std_t->dims());
    if (mean && std_t && (mean->shape().numel() != std_t->shape().numel()) && dims != mean->dims()) throw NotLowered{};
    DType ct = t == DType::kF64 ? DType::kF64 : DType::kF32;
    if (std_t) {
      Value sc = Cast(*std_t, ct);
      Value ok = ir::Compare(CompareDir::kGE, sc, C(0, sc));
      std::vector<int64_t> all(sc.rank());
      std::iota(all.begin(), all.end(), 0);
      graph::AddCheck(sc.rank() ? ir::Reduce(ir::ReduceKind::kAnd, ok, all) : ok,
                      "normal expects all elements of std >= 0.0", a.device, true);
    }
    Value z = RandomNormal(ir::Shape(ct, dims), a.device);
    Value s = std_t ? BroadcastTo(Cast(*std_t, ct), dims) : ir::Full(std_f, z.shape());
    Value m = mean ? BroadcastTo(Cast(*mean, ct), dims) : ir::Full(mean_f, z.shape());
    return {Cast(ir::Binary(Op::kAdd, m, ir::Binary(Op::kMul, s, z)), t)};
  };
  rows.push_back({"normal.Tensor_float", [normal](OpArgs& a) -> V { return normal(a, a.V(0), std::nullopt, 0, a.Double(1)); }});
  rows.push_back({"normal.float_Tensor", [normal](OpArgs& a) -> V { return normal(a, std::nullopt, a.V(1), a.Double(0), 0); }});
  rows.push_back({"normal.Tensor_Tensor", [normal](OpArgs& a) -> V { return normal(a, a.V(0), a.V(1), 0, 0); }});
  rows.push_back({"narrow_copy", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (x.rank() == 0) throw NotLowered{};
    int64_t d = ir::NormalizeDim(a.Int(1), x.rank());
    int64_t n = x.dims()[d], start = a.Int(2), len = a.Int(3);
    if (start < 0) start += n;
    if (start < 0 || len < 0 || start + len > n) throw NotLowered{};  // eager's errors
    std::vector<int64_t> st(x.rank(), 0), lim = x.dims(), str(x.rank(), 1);
    st[d] = start;
    lim[d] = start + len;
    return {ir::Slice(x, st, lim, str)};
  }});
  rows.push_back({"new_empty_strided", [](OpArgs& a) -> V {
    // Uninitialized in eager; zeros here (strides are a layout detail of XLA tensors).
    DType t = a.OptDType(3).value_or(a.V(0).dtype());
    for (int64_t v : a.Ints(1)) if (v < 0) throw NotLowered{};
    return {ir::Full(0, ir::Shape(t, a.Ints(1)))};
  }});
  rows.push_back({"grid_sampler_2d", [](OpArgs& a) -> V {
    Value in = a.V(0), grid = a.V(1);
    int64_t mode = a.Int(2), pad = a.Int(3);
    bool ac = a.Bool(4);
    DType t = in.dtype();
    if ((t != DType::kF32 && t != DType::kF64) || grid.dtype() != t || in.rank() != 4 || grid.rank() != 4 ||
        grid.dims()[3] != 2 || grid.dims()[0] != in.dims()[0] || mode > 1 || pad > 1 ||
        in.shape().numel() == 0 || grid.shape().numel() == 0) {
      throw NotLowered{};  // bicubic, reflection padding, other dtypes, eager's errors: on the CPU
    }
    int64_t h = in.dims()[2], w = in.dims()[3];
    GridGeom gg = GridCoords(grid, h, w, pad == 1, ac);
    std::vector<int64_t> od = {in.dims()[0], in.dims()[1], grid.dims()[1], grid.dims()[2]};
    auto bc = [&](const Value& v) { return ir::BroadcastInDim(v, od, {0, 2, 3}); };
    if (mode == 1) {  // nearest: round half to even, out of bounds reads 0
      Value rx = ir::Unary(Op::kRoundEven, gg.x), ry = ir::Unary(Op::kRoundEven, gg.y);
      auto in_range = [](const Value& v, double hi) {
        return ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGT, v, C(-1, v)), ir::Compare(CompareDir::kLT, v, C(hi, v)));
      };
      Value ok = ir::Binary(Op::kAnd, in_range(rx, static_cast<double>(w)), in_range(ry, static_cast<double>(h)));
      Value ix = Cast(ir::Select(ok, rx, C(0, rx)), DType::kS64), iy = Cast(ir::Select(ok, ry, C(0, ry)), DType::kS64);
      return {GridRead(in, iy, ix, ok)};
    }
    Corners k = BilinearCorners(gg, h, w);
    Value out;
    for (int q = 0; q < 4; ++q) {
      Value term = ir::Binary(Op::kMul, GridRead(in, k.iy[q], k.ix[q], k.ok[q]), bc(k.wt[q]));
      out = out ? ir::Binary(Op::kAdd, out, term) : term;
    }
    return {out};
  }});
  rows.push_back({"grid_sampler_2d_backward", [](OpArgs& a) -> V {
    // Bilinear (zeros or border padding): grad_input scatters grad * weight to the four corners; grad_grid is
    // sum_c grad * d out / d (x, y) * scale.
    Value go = a.V(0), in = a.V(1), grid = a.V(2);
    int64_t mode = a.Int(3), pad = a.Int(4);
    bool ac = a.Bool(5);
    DType t = in.dtype();
    if ((t != DType::kF32 && t != DType::kF64) || grid.dtype() != t || go.dtype() != t || in.rank() != 4 ||
        mode > 1 || pad > 1 || in.shape().numel() == 0 || grid.shape().numel() == 0) {
      throw NotLowered{};
    }
    const auto& mask_arg = a.args[6];
    std::vector<bool> mask = {true, true};
    if (mask_arg.kind == Arg::kIntList) for (size_t i = 0; i < 2 && i < mask_arg.il.size(); ++i) mask[i] = mask_arg.il[i];
    int64_t n = in.dims()[0], c = in.dims()[1], h = in.dims()[2], w = in.dims()[3];
    int64_t ho = grid.dims()[1], wo = grid.dims()[2];
    GridGeom gg = GridCoords(grid, h, w, pad == 1, ac);
    if (mode == 1) {  // nearest: the grad goes to the rounded position; the grid gets none
      V out(2);
      if (mask[0]) {
        Value rx = ir::Unary(Op::kRoundEven, gg.x), ry = ir::Unary(Op::kRoundEven, gg.y);
        auto in_range = [](const Value& v, double hi) {
          return ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGT, v, C(-1, v)), ir::Compare(CompareDir::kLT, v, C(hi, v)));
        };
        Value ok = ir::Binary(Op::kAnd, in_range(rx, static_cast<double>(w)), in_range(ry, static_cast<double>(h)));
        ir::Shape is(DType::kS64, {n, ho, wo});
        Value ix = Cast(ir::Select(ok, rx, C(0, rx)), DType::kS64), iy = Cast(ir::Select(ok, ry, C(0, ry)), DType::kS64);
        Value gnhwc = ir::Transpose(go, {0, 2, 3, 1});
        Value upd = ir::Select(ir::BroadcastInDim(ok, gnhwc.dims(), {0, 1, 2}), gnhwc, ir::Full(0, gnhwc.shape()));
        std::vector<int64_t> cd = {n, ho, wo, 1};
        Value coords = ir::Concatenate({ir::Reshape(ir::Iota(is, 0), cd), ir::Reshape(iy, cd), ir::Reshape(ix, cd)}, 3);
        Value gin = ir::Scatter(ir::Full(0, ir::Shape(t, {n, h, w, c})), coords, upd, {3}, {0, 1, 2}, {0, 1, 2}, 3, 1);
        out[0] = ir::Transpose(gin, {0, 3, 1, 2});
      }
      if (mask[1]) out[1] = ir::Full(0, grid.shape());
      return out;
    }
    Corners k = BilinearCorners(gg, h, w);
    std::vector<int64_t> od = {n, c, ho, wo};
    auto bc = [&](const Value& v) { return ir::BroadcastInDim(v, od, {0, 2, 3}); };
    V out(2);
    if (mask[0]) {
      // Scatter-add into [N, H, W, C] at (n, iy, ix) of grad * weight (masked corners add 0).
      Value gin = ir::Full(0, ir::Shape(t, {n, h, w, c}));
      ir::Shape is(DType::kS64, {n, ho, wo});
      Value gnhwc = ir::Transpose(go, {0, 2, 3, 1});  // [N, Ho, Wo, C]
      for (int q = 0; q < 4; ++q) {
        Value wq = ir::Select(k.ok[q], k.wt[q], C(0, k.wt[q]));
        Value upd = ir::Binary(Op::kMul, gnhwc, ir::BroadcastInDim(wq, gnhwc.dims(), {0, 1, 2}));
        Value cy = ir::Clamp(ir::Full(0, is), k.iy[q], ir::Full(static_cast<double>(h - 1), is));
        Value cx = ir::Clamp(ir::Full(0, is), k.ix[q], ir::Full(static_cast<double>(w - 1), is));
        std::vector<int64_t> cd = {n, ho, wo, 1};
        Value coords = ir::Concatenate({ir::Reshape(ir::Iota(is, 0), cd), ir::Reshape(cy, cd), ir::Reshape(cx, cd)}, 3);
        gin = ir::Scatter(gin, coords, upd, {3}, {0, 1, 2}, {0, 1, 2}, 3, 1);
      }
      out[0] = ir::Transpose(gin, {0, 3, 1, 2});
    }
    if (mask[1]) {
      Value v[4];
      for (int q = 0; q < 4; ++q) v[q] = GridRead(in, k.iy[q], k.ix[q], k.ok[q]);
      Value s = bc(ir::Binary(Op::kSub, C(1, k.fy), k.fy)), nn = bc(k.fy);
      Value e = bc(ir::Binary(Op::kSub, C(1, k.fx), k.fx)), ww = bc(k.fx);
      auto mul = [](const Value& p, const Value& q) { return ir::Binary(Op::kMul, p, q); };
      auto sub = [](const Value& p, const Value& q) { return ir::Binary(Op::kSub, p, q); };
      auto add = [](const Value& p, const Value& q) { return ir::Binary(Op::kAdd, p, q); };
      Value dx = add(mul(sub(v[1], v[0]), s), mul(sub(v[3], v[2]), nn));
      Value dy = add(mul(sub(v[2], v[0]), e), mul(sub(v[3], v[1]), ww));
      Value gx = ir::Reduce(ir::ReduceKind::kSum, mul(go, dx), {1});  // [N, Ho, Wo]
      Value gy = ir::Reduce(ir::ReduceKind::kSum, mul(go, dy), {1});
      gx = mul(gx, C(gg.sx, gx));
      gy = mul(gy, C(gg.sy, gy));
      if (pad == 1) {  // border: a coordinate clipped onto 0 or size - 1 passes no gradient (eager)
        auto inside = [&](const Value& v, int64_t size) {
          Value ok = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kNE, v, C(0, v)),
                                ir::Compare(CompareDir::kNE, v, C(static_cast<double>(size - 1), v)));
          return ok;
        };
        gx = ir::Select(inside(gg.x, w), gx, C(0, gx));
        gy = ir::Select(inside(gg.y, h), gy, C(0, gy));
      }
      std::vector<int64_t> cd = {n, ho, wo, 1};
      out[1] = ir::Concatenate({ir::Reshape(gx, cd), ir::Reshape(gy, cd)}, 3);
    }
    return out;
  }});
  rows.push_back({"max_unpool2d", [](OpArgs& a) -> V { return {MaxUnpool(a, 2)}; }});
  rows.push_back({"max_unpool3d", [](OpArgs& a) -> V { return {MaxUnpool(a, 3)}; }});
  rows.push_back({"bucketize.Tensor", [](OpArgs& a) -> V {
    Value x = a.V(0), b = a.V(1);
    if (b.rank() != 1 || b.dtype() != x.dtype() || ir::IsComplex(x.dtype()) || x.dtype() == DType::kPred) throw NotLowered{};
    if (x.shape().numel() * std::max<int64_t>(b.dims()[0], 1) > (int64_t{1} << 26)) throw NotLowered{};
    if (b.dims()[0] == 0) return {ir::Full(0, ir::Shape(a.Bool(2) ? DType::kS32 : DType::kS64, x.dims()))};
    return {SearchSorted(b, x, a.Bool(3), a.Bool(2))};
  }});
  rows.push_back({"searchsorted.Scalar", [](OpArgs& a) -> V {
    // The scalar as a 0-d tensor; both compared in their common dtype.
    DType t = ResultType({&a.T(0)}, {&a.S(1)});
    OpArgs b = a;
    b.args[0].t.v = Cast(a.V(0), t);
    b.args[1].kind = Arg::kTensor;
    b.args[1].t.v = ScalarV(a.S(1), t, a.device);
    b.args[1].t.wrapped_number = false;
    return FindOp("searchsorted.Tensor")->fn(b);
  }});
  rows.push_back({"searchsorted.Tensor", [](OpArgs& a) -> V {
    Value seq = a.V(0), x = a.V(1);
    if (auto sorter = a.OptV(5)) {  // the sequence in sorter's order (gather along the last dim)
      if (sorter->dims() != seq.dims() || sorter->dtype() != DType::kS64 || seq.rank() == 0) throw NotLowered{};
      OpArgs g;
      g.device = a.device;
      g.op_name = "gather";
      g.args.resize(4);
      g.args[0].kind = Arg::kTensor;
      g.args[0].t.v = seq;
      g.args[1].kind = Arg::kInt;
      g.args[1].i = -1;
      g.args[2].kind = Arg::kTensor;
      g.args[2].t.v = *sorter;
      g.args[3].kind = Arg::kBool;
      seq = FindOp("gather")->fn(g)[0];
    }
    if (seq.dtype() != x.dtype() || ir::IsComplex(x.dtype()) || x.dtype() == DType::kPred) throw NotLowered{};
    bool right = a.Bool(3);
    if (!a.IsNone(4)) {
      const std::string& side = a.Str(4);
      if (side != "left" && side != "right") throw NotLowered{};
      if (right && side == "left") throw NotLowered{};  // eager's error
      right = side == "right";
    }
    if (seq.rank() == 0) throw NotLowered{};
    if (seq.rank() > 1) {
      if (x.rank() != seq.rank()) throw NotLowered{};
      for (int i = 0; i < seq.rank() - 1; ++i) if (seq.dims()[i] != x.dims()[i]) throw NotLowered{};
    }
    if (x.shape().numel() * std::max<int64_t>(seq.dims().back(), 1) > (int64_t{1} << 26)) throw NotLowered{};
    if (seq.dims().back() == 0) return {ir::Full(0, ir::Shape(a.Bool(2) ? DType::kS32 : DType::kS64, x.dims()))};
    return {SearchSorted(seq, x, right, a.Bool(2))};
  }});
  rows.push_back({"native_group_norm_backward", [](OpArgs& a) -> V {
    // Eager's formulas over [N, G, D, HxW]: ds = sum(dy * x), db = sum(dy) per (n, c); with
    // s = 1 / (D * HxW), c2 = (db_g * mean - ds_g) * rstd^3 * s, c3 = -c2 * mean - db_g * rstd * s
    // (db_g, ds_g summed over the group with gamma): dx = rstd * gamma * dy + c2 * x + c3;
    // dgamma = sum_n (ds - db * mean) * rstd, dbeta = sum_n db.
    Value dy = a.V(0), x = a.V(1), mean = a.V(2), rstd = a.V(3);
    auto w = a.OptV(4);
    int64_t n = a.Int(5), c = a.Int(6), hw = a.Int(7), g = a.Int(8);
    const auto& mask_arg = a.args[9];
    std::vector<bool> mask = {true, true, true};
    if (mask_arg.kind == Arg::kIntList) for (size_t i = 0; i < 3 && i < mask_arg.il.size(); ++i) mask[i] = mask_arg.il[i];
    if (!ir::IsFloating(x.dtype()) || g <= 0 || c % g || x.shape().numel() != n * c * hw || dy.dims() != x.dims() ||
        (mask[1] && !w)) {
      throw NotLowered{};
    }
    if (n * c * hw == 0) {  // nothing to normalize: zero gradients
      V out(3);
      if (mask[0]) out[0] = ir::Full(0, x.shape());
      if (mask[1]) out[1] = ir::Full(0, ir::Shape(w->dtype(), {c}));
      if (mask[2]) out[2] = ir::Full(0, ir::Shape(x.dtype(), {c}));
      return out;
    }
    int64_t d = c / g;
    DType ct = OpMath(x.dtype());
    std::vector<int64_t> s4 = {n, g, d, hw};
    Value dyc = ir::Reshape(Cast(dy, ct), s4), xc = ir::Reshape(Cast(x, ct), s4);
    Value m = ir::Reshape(Cast(mean, ct), {n, g}), rs = ir::Reshape(Cast(rstd, ct), {n, g});
    Value gamma = w ? ir::Reshape(Cast(*w, ct), {g, d}) : ir::Full(1, ir::Shape(ct, {g, d}));
    auto mul = [](const Value& p, const Value& q) { return ir::Binary(Op::kMul, p, q); };
    auto add = [](const Value& p, const Value& q) { return ir::Binary(Op::kAdd, p, q); };
    auto sub = [](const Value& p, const Value& q) { return ir::Binary(Op::kSub, p, q); };
    Value ds = ir::Reduce(ir::ReduceKind::kSum, mul(dyc, xc), {3});  // [n, g, d]
    Value db = ir::Reduce(ir::ReduceKind::kSum, dyc, {3});
    std::vector<int64_t> s3 = {n, g, d};
    Value gamma3 = ir::BroadcastInDim(gamma, s3, {1, 2});
    Value m3 = ir::BroadcastInDim(m, s3, {0, 1}), rs3 = ir::BroadcastInDim(rs, s3, {0, 1});
    V out(3);
    if (mask[0]) {
      double sc = 1.0 / static_cast<double>(d * hw);
      Value ds_g = ir::Reduce(ir::ReduceKind::kSum, mul(ds, gamma3), {2});  // [n, g]
      Value db_g = ir::Reduce(ir::ReduceKind::kSum, mul(db, gamma3), {2});
      Value r3 = mul(mul(rs, rs), rs);
      Value c2 = mul(mul(sub(mul(db_g, m), ds_g), r3), ir::Full(sc, m.shape()));
      Value c3 = sub(ir::Unary(Op::kNeg, mul(c2, m)), mul(mul(db_g, rs), ir::Full(sc, m.shape())));
      Value c1 = mul(rs3, gamma3);  // [n, g, d]
      Value dx = add(add(mul(ir::BroadcastInDim(c1, s4, {0, 1, 2}), dyc), mul(ir::BroadcastInDim(c2, s4, {0, 1}), xc)),
                     ir::BroadcastInDim(c3, s4, {0, 1}));
      out[0] = Cast(ir::Reshape(dx, x.dims()), x.dtype());
    }
    if (mask[1]) {
      Value dg = ir::Reduce(ir::ReduceKind::kSum, mul(sub(ds, mul(db, m3)), rs3), {0});  // [g, d]
      out[1] = Cast(ir::Reshape(dg, {c}), w->dtype());
    }
    if (mask[2]) out[2] = Cast(ir::Reshape(ir::Reduce(ir::ReduceKind::kSum, db, {0}), {c}), x.dtype());
    return out;
  }});
  for (bool is_max : {true, false}) {
    rows.push_back({is_max ? "cummax" : "cummin", [is_max](OpArgs& a) -> V {
      Value x = a.V(0);
      if (ir::IsComplex(x.dtype())) throw NotLowered{};
      if (x.dtype() == DType::kPred) {  // as 0/1 bytes
        auto r = CumExtreme(Cast(x, DType::kU8), a.Int(1), is_max);
        return {Cast(r[0], DType::kPred), r[1]};
      }
      return CumExtreme(x, a.Int(1), is_max);
    }});
  }
  rows.push_back({"aminmax", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (ir::IsComplex(x.dtype())) throw NotLowered{};
    std::optional<int64_t> dim = a.OptInt(1);
    if (x.shape().numel() == 0 && (!dim || x.rank() == 0 || x.dims()[ir::NormalizeDim(*dim, x.rank())] == 0)) {
      throw NotLowered{};  // an empty reduction: eager's error
    }
    if (x.dtype() == DType::kPred) {  // as 0/1 bytes
      OpArgs b = a;
      b.args[0].t.v = Cast(x, DType::kU8);
      V r = FindOp("aminmax")->fn(b);
      return {Cast(r[0], DType::kPred), Cast(r[1], DType::kPred)};
    }
    bool keepdim = a.Bool(2);
    if (x.rank() == 0) return {x, x};
    std::vector<int64_t> dims;
    if (dim) {
      dims = {ir::NormalizeDim(*dim, x.rank())};
    } else {
      dims.resize(x.rank());
      std::iota(dims.begin(), dims.end(), 0);
    }
    Value mn = ir::Reduce(ir::ReduceKind::kMin, x, dims), mx = ir::Reduce(ir::ReduceKind::kMax, x, dims);
    if (keepdim) {
      mn = KeepDims(mn, x.dims(), dims);
      mx = KeepDims(mx, x.dims(), dims);
    }
    return {mn, mx};
  }});
  rows.push_back({"diag_embed", [](OpArgs& a) -> V {
    // out[..., i, j] = x[..., i] where j - i == offset (x[..., j] for a negative offset), then the
    // two new dims moved to dim1 and dim2.
    Value x = a.V(0);
    if (x.rank() == 0) throw NotLowered{};
    int64_t offset = a.Int(1);
    int r = x.rank() + 1;
    int64_t d1 = ir::NormalizeDim(a.Int(2), r), d2 = ir::NormalizeDim(a.Int(3), r);
    if (d1 == d2) throw NotLowered{};  // eager's error
    int64_t n = x.dims().back(), m = n + std::abs(offset);
    std::vector<int64_t> batch(x.dims().begin(), x.dims().end() - 1);
    std::vector<int64_t> out_dims = batch;
    out_dims.push_back(m);
    out_dims.push_back(m);
    // x padded to m along its last dim (zeros after), broadcast along the other new axis.
    std::vector<int64_t> lo(x.rank(), 0), hi(x.rank(), 0), in(x.rank(), 0);
    hi.back() = m - n;
    Value xp = ir::Pad(x, ir::Constant(0, x.dtype()), lo, hi, in);
    std::vector<int64_t> bd(batch.size());
    std::iota(bd.begin(), bd.end(), 0);
    bd.push_back(offset >= 0 ? r - 2 : r - 1);  // x indexed by i (offset >= 0) or by j
    Value v = ir::BroadcastInDim(xp, out_dims, bd);
    ir::Shape s(DType::kS64, out_dims);
    Value diff = ir::Binary(Op::kSub, ir::Iota(s, r - 1), ir::Iota(s, r - 2));  // j - i
    Value res = ir::Select(Eq(diff, ir::Full(static_cast<double>(offset), s)), v, ir::Full(0, v.shape()));
    std::vector<int64_t> perm(r);
    int64_t next = 0;
    for (int p = 0; p < r; ++p) perm[p] = p == d1 ? r - 2 : p == d2 ? r - 1 : next++;
    return {ir::Transpose(res, perm)};
  }});
  rows.push_back({"huber_loss", [](OpArgs& a) -> V {
    Value x = a.V(0), t = a.V(1);
    DType out = ResultType({&a.T(0), &a.T(1)});
    if (!ir::IsFloating(out) || x.dtype() != t.dtype()) throw NotLowered{};
    DType ct = OpMath(out);
    double delta = a.Double(3);
    auto dims = BroadcastShapes(x.dims(), t.dims());
    Value z = ir::Unary(Op::kAbs, ir::Binary(Op::kSub, BroadcastTo(Cast(x, ct), dims), BroadcastTo(Cast(t, ct), dims)));
    Value l = ir::Select(ir::Compare(CompareDir::kLT, z, C(delta, z)), ir::Binary(Op::kMul, C(0.5, z), ir::Binary(Op::kMul, z, z)),
                         ir::Binary(Op::kMul, C(delta, z), ir::Binary(Op::kSub, z, C(0.5 * delta, z))));
    int64_t reduction = a.Int(2);
    if (reduction != 0 && l.rank() > 0) {
      std::vector<int64_t> all(l.rank());
      std::iota(all.begin(), all.end(), 0);
      Value s = ir::Reduce(ir::ReduceKind::kSum, l, all);
      l = reduction == 2 ? s : ir::Binary(Op::kDiv, s, C(static_cast<double>(l.shape().numel()), s));
    }
    return {Cast(l, out)};
  }});
  rows.push_back({"huber_loss_backward", [](OpArgs& a) -> V {
    // x = self - target; grad * (x <= -delta ? -delta : x >= delta ? delta : x), / numel for the mean.
    Value g = a.V(0), x = a.V(1), t = a.V(2);
    if (!ir::IsFloating(x.dtype()) || t.dtype() != x.dtype() || g.dtype() != x.dtype()) throw NotLowered{};
    DType ct = OpMath(x.dtype());
    auto dims = BroadcastShapes(BroadcastShapes(x.dims(), t.dims()), g.dims());
    if (dims != x.dims()) throw NotLowered{};
    Value d = ir::Binary(Op::kSub, Cast(x, ct), BroadcastTo(Cast(t, ct), dims));
    Value gc = BroadcastTo(Cast(g, ct), dims);
    int64_t reduction = a.Int(3);
    double delta = a.Double(4);
    double norm = reduction == 1 ? 1.0 / static_cast<double>(x.shape().numel()) : 1.0;
    Value ng = ir::Binary(Op::kMul, C(norm, gc), gc);
    Value r = ir::Select(ir::Compare(CompareDir::kLE, d, C(-delta, d)), ir::Binary(Op::kMul, C(-delta, d), ng),
                         ir::Select(ir::Compare(CompareDir::kGE, d, C(delta, d)), ir::Binary(Op::kMul, C(delta, d), ng),
                                    ir::Binary(Op::kMul, ir::Binary(Op::kMul, C(norm, d), d), gc)));
    return {Cast(r, x.dtype())};
  }});
  for (bool up : {true, false}) {
    rows.push_back({up ? "pixel_shuffle" : "pixel_unshuffle", [up](OpArgs& a) -> V {
      Value x = a.V(0);
      int64_t f = a.Int(1);
      int r = x.rank();
      if (r < 3 || f <= 0) throw NotLowered{};
      std::vector<int64_t> b(x.dims().begin(), x.dims().end() - 3);
      int64_t c = x.dims()[r - 3], h = x.dims()[r - 2], w = x.dims()[r - 1];
      int nb = static_cast<int>(b.size());
      std::vector<int64_t> split = b, perm(nb), out = b;
      std::iota(perm.begin(), perm.end(), 0);
      if (up) {
        if (c % (f * f)) throw NotLowered{};
        // [*, C, f, f, H, W] -> [*, C, H, f, W, f]
        for (int64_t v : {c / (f * f), f, f, h, w}) split.push_back(v);
        for (int k : {0, 3, 1, 4, 2}) perm.push_back(nb + k);
        for (int64_t v : {c / (f * f), h * f, w * f}) out.push_back(v);
      } else {
        if (h % f || w % f) throw NotLowered{};
        // [*, C, H, f, W, f] -> [*, C, f, f, H, W]
        for (int64_t v : {c, h / f, f, w / f, f}) split.push_back(v);
        for (int k : {0, 2, 4, 1, 3}) perm.push_back(nb + k);
        for (int64_t v : {c * f * f, h / f, w / f}) out.push_back(v);
      }
      return {ir::Reshape(ir::Transpose(ir::Reshape(x, split), perm), out)};
    }});
  }
  rows.push_back({"channel_shuffle", [](OpArgs& a) -> V {
    // [N, C, *] -> [N, g, C/g, *] -> swap g and C/g -> [N, C, *].
    Value x = a.V(0);
    int64_t g = a.Int(1);
    if (x.rank() < 3 || g <= 0 || x.dims()[1] % g) throw NotLowered{};
    std::vector<int64_t> split = {x.dims()[0], g, x.dims()[1] / g};
    std::vector<int64_t> perm = {0, 2, 1};
    for (int k = 2; k < x.rank(); ++k) {
      split.push_back(x.dims()[k]);
      perm.push_back(k + 1);
    }
    return {ir::Reshape(ir::Transpose(ir::Reshape(x, split), perm), x.dims())};
  }});
  AddWindowAndSetRows(rows);
}

}  // namespace txla::ops
