// Op table rows: convolution (forward, input and weight gradients, transposed), pooling and
// batch norm (train and eval, running statistics as eager).
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

std::vector<int64_t> Expand(const std::vector<int64_t>& v, size_t n, int64_t def) {
  if (v.empty()) return std::vector<int64_t>(n, def);
  if (v.size() == 1 && n > 1) return std::vector<int64_t>(n, v[0]);
  return v;
}

std::string ConvDims(int nsp, const char* lhs, const char* rhs, const char* out) {
  // lhs/rhs/out name the two non-spatial roles in order, e.g. "b, f" / "o, i" / "b, f".
  std::string sp;
  for (int i = 0; i < nsp; ++i) sp += ", " + std::to_string(i);
  return std::string("[") + lhs + sp + "]x[" + rhs + sp + "]->[" + out + sp + "]";
}

// [g*A, B, k...] -> [g*B, A, k...] (swap the per-group in/out feature dims of a kernel).
Value SwapGroupedKernel(const Value& w, int64_t g) {
  std::vector<int64_t> d = w.dims();
  int64_t a = d[0] / g, b = d[1];
  std::vector<int64_t> split{g, a, b};
  split.insert(split.end(), d.begin() + 2, d.end());
  Value r = ir::Reshape(w, split);
  std::vector<int64_t> perm{0, 2, 1};
  for (size_t i = 3; i < split.size(); ++i) perm.push_back(static_cast<int64_t>(i));
  r = ir::Transpose(r, perm);
  std::vector<int64_t> merged{g * b, a};
  merged.insert(merged.end(), d.begin() + 2, d.end());
  return ir::Reshape(r, merged);
}

Value FlipSpatial(const Value& w) {
  std::vector<int64_t> sp;
  for (int i = 2; i < w.rank(); ++i) sp.push_back(i);
  return ir::Reverse(w, sp);
}

struct ConvParams {
  std::vector<int64_t> stride, padding, dilation, output_padding;
  int64_t groups;
  int nsp;
};

ConvParams ReadConv(const OpArgs& a, size_t first, const Value& weight) {
  ConvParams p;
  p.nsp = weight.rank() - 2;
  p.stride = Expand(a.Ints(first), p.nsp, 1);
  p.padding = Expand(a.Ints(first + 1), p.nsp, 0);
  p.dilation = Expand(a.Ints(first + 2), p.nsp, 1);
  p.output_padding = Expand(a.Ints(first + 4), p.nsp, 0);
  p.groups = a.Int(first + 5);
  return p;
}

Value ConvForward(const Value& x, const Value& w, const ConvParams& p, bool transposed) {
  std::vector<int64_t> pads, ones(p.nsp, 1);
  if (!transposed) {
    for (int i = 0; i < p.nsp; ++i) { pads.push_back(p.padding[i]); pads.push_back(p.padding[i]); }
    return ir::Convolution(x, w, p.stride, pads, ones, p.dilation, p.groups, 1);
  }
  // The input gradient of a convolution: dilate the input by the stride, flip the kernel.
  for (int i = 0; i < p.nsp; ++i) {
    int64_t k = p.dilation[i] * (w.dims()[2 + i] - 1);
    pads.push_back(k - p.padding[i]);
    pads.push_back(k - p.padding[i] + p.output_padding[i]);
  }
  Value k = FlipSpatial(SwapGroupedKernel(w, p.groups));
  return ir::Convolution(x, k, ones, pads, p.stride, p.dilation, p.groups, 1);
}

// d(conv(x, w))/dx given dy.
Value ConvInputGrad(const Value& dy, const Value& x, const Value& w, const ConvParams& p) {
  std::vector<int64_t> pads, ones(p.nsp, 1);
  for (int i = 0; i < p.nsp; ++i) {
    int64_t k = p.dilation[i] * (w.dims()[2 + i] - 1);
    int64_t in = x.dims()[2 + i];
    int64_t r = (in + 2 * p.padding[i] - k - 1) % p.stride[i];
    pads.push_back(k - p.padding[i]);
    pads.push_back(k - p.padding[i] + r);
  }
  Value kern = FlipSpatial(SwapGroupedKernel(w, p.groups));
  return ir::Convolution(dy, kern, ones, pads, p.stride, p.dilation, p.groups, 1);
}

Value ConvWeightGradOneGroup(const Value& dy, const Value& x, const std::vector<int64_t>& kernel_spatial,
                             const ConvParams& p);

// d(conv(x, w))/dw given dy. XLA:CPU runs the batch_group_count form of a grouped weight gradient
// ~15x slower than plain convolutions (measured: 35 ms vs 2.4 ms for 32 channels, 2 groups), so
// up to 8 groups we convolve each group's channels separately and concatenate.
Value ConvWeightGrad(const Value& dy, const Value& x, const std::vector<int64_t>& kernel_spatial, const ConvParams& p) {
  if (p.groups <= 1 || p.groups > 8) return ConvWeightGradOneGroup(dy, x, kernel_spatial, p);
  int64_t g = p.groups, cg = x.dims()[1] / g, og = dy.dims()[1] / g;
  ConvParams one = p;
  one.groups = 1;
  std::vector<Value> parts;
  auto channels = [](const Value& v, int64_t start, int64_t n) {
    std::vector<int64_t> st(v.rank(), 0), lim = v.dims(), str(v.rank(), 1);
    st[1] = start;
    lim[1] = start + n;
    return ir::Slice(v, st, lim, str);
  };
  for (int64_t j = 0; j < g; ++j) {
    parts.push_back(ConvWeightGradOneGroup(channels(dy, j * og, og), channels(x, j * cg, cg), kernel_spatial, one));
  }
  return ir::Concatenate(parts, 0);
}

// Correlates x (channels as batch) with dy; batch_group_count handles groups.
Value ConvWeightGradOneGroup(const Value& dy, const Value& x, const std::vector<int64_t>& kernel_spatial,
                             const ConvParams& p) {
  std::vector<int64_t> pads;
  for (int i = 0; i < p.nsp; ++i) {
    int64_t in = x.dims()[2 + i], out = dy.dims()[2 + i], k = kernel_spatial[i];
    pads.push_back(p.padding[i]);
    pads.push_back((k - 1) * p.dilation[i] + (out - 1) * p.stride[i] + 1 - in - p.padding[i]);
  }
  Value r = ir::Convolution(x, dy, p.dilation, pads, std::vector<int64_t>(p.nsp, 1), p.stride, 1, p.groups,
                            ConvDims(p.nsp, "f, b", "i, o", "f, b"));
  return r;
}

std::vector<int64_t> SpatialOf(const Value& v) { return std::vector<int64_t>(v.dims().begin() + 2, v.dims().end()); }

Value SumAllBut(const Value& x, int64_t keep) {
  std::vector<int64_t> dims;
  for (int i = 0; i < x.rank(); ++i) if (i != keep) dims.push_back(i);
  return ir::Reduce(ir::ReduceKind::kSum, x, dims);
}

// ---- pooling helpers (the last `nsp` dims are spatial).
struct PoolGeom {
  std::vector<int64_t> window, strides, dilation, padding;  // full rank
  std::vector<int64_t> out;                                 // spatial output sizes
};

PoolGeom Pool(const Value& x, int nsp, std::vector<int64_t> k, std::vector<int64_t> s, std::vector<int64_t> p,
              std::vector<int64_t> d, bool ceil_mode) {
  k = Expand(k, nsp, 1);
  s = s.empty() ? k : Expand(s, nsp, 1);
  p = Expand(p, nsp, 0);
  d = Expand(d, nsp, 1);
  int lead = x.rank() - nsp;
  PoolGeom g;
  g.window.assign(lead, 1);
  g.strides.assign(lead, 1);
  g.dilation.assign(lead, 1);
  g.padding.assign(2 * lead, 0);
  // Every spatial output size first: eager's error names them all ("(1x0x0)").
  std::vector<int64_t> outs(nsp);
  for (int i = 0; i < nsp; ++i) {
    int64_t in = x.dims()[lead + i], span = d[i] * (k[i] - 1) + 1;
    if (p[i] * 2 > k[i]) throw ir::ShapeError("pad should be at most half of effective kernel size");
    int64_t num = in + 2 * p[i] - span;
    auto floor_div = [](int64_t n, int64_t q) { return n >= 0 ? n / q : -((-n + q - 1) / q); };
    int64_t o = (ceil_mode ? floor_div(num + s[i] - 1, s[i]) : floor_div(num, s[i])) + 1;
    if (ceil_mode && (o - 1) * s[i] >= in + p[i]) --o;
    outs[i] = o;
  }
  for (int i = 0; i < nsp; ++i) {
    if (outs[i] > 0) continue;
    std::string in_s, out_s;
    for (int j = std::max(lead - 1, 0); j < x.rank(); ++j) {
      in_s += (in_s.empty() ? "" : "x") + std::to_string(x.dims()[j]);
    }
    if (lead >= 1) out_s = std::to_string(x.dims()[lead - 1]);
    for (int64_t o : outs) out_s += (out_s.empty() ? "" : "x") + std::to_string(o);
    throw ir::ShapeError("Given input size: (" + in_s + "). Calculated output size: (" + out_s +
                         "). Output size is too small");
  }
  for (int i = 0; i < nsp; ++i) {
    int64_t o = outs[i], in = x.dims()[lead + i], span = d[i] * (k[i] - 1) + 1;
    g.out.push_back(o);
    g.window.push_back(k[i]);
    g.strides.push_back(s[i]);
    g.dilation.push_back(d[i]);
    g.padding.push_back(p[i]);
    g.padding.push_back(std::max<int64_t>(0, (o - 1) * s[i] + span - in - p[i]));
  }
  return g;
}

// Windows' divisor for avg pooling, shape = spatial output, broadcast later.
Value AvgDivisor(const Value& x, const PoolGeom& g, int nsp, bool count_include_pad, std::optional<int64_t> override_,
                 DType t) {
  std::vector<int64_t> out = g.out;
  if (override_) return ir::Full(static_cast<double>(*override_), ir::Shape(t, out));
  int lead = x.rank() - nsp;
  std::vector<int64_t> sp(x.dims().begin() + lead, x.dims().end());
  std::vector<int64_t> win(g.window.begin() + lead, g.window.end()), str(g.strides.begin() + lead, g.strides.end());
  std::vector<int64_t> pad(g.padding.begin() + 2 * lead, g.padding.end()), ones(nsp, 1);
  Value base;
  if (count_include_pad) {
    // Padding cells count, cells beyond the padding (ceil_mode) do not.
    std::vector<int64_t> padded = sp, hi_extra;
    for (int i = 0; i < nsp; ++i) padded[i] += 2 * pad[2 * i];
    base = ir::Full(1, ir::Shape(t, padded));
    std::vector<int64_t> pp;
    for (int i = 0; i < nsp; ++i) { pp.push_back(0); pp.push_back(pad[2 * i + 1] - pad[2 * i]); }
    return ir::ReduceWindow(ir::ReduceKind::kSum, base, ir::Constant(0, t), win, str, ones, ones, pp);
  }
  base = ir::Full(1, ir::Shape(t, sp));
  return ir::ReduceWindow(ir::ReduceKind::kSum, base, ir::Constant(0, t), win, str, ones, ones, pad);
}

// bf16/f16 avg pooling's gradient as eager's CPU kernel computes it: each output's share
// dy / divisor (the divisor converted to the dtype) rounded to the dtype, added into the input
// gradient window by window in output order, each sum rounded. An input element receives its
// windows' shares in ascending output order, which is descending tap order: the taps are added one
// by one, each a strided placement of the shares.
Value AvgPoolBackwardRounded(const Value& dy, const Value& x, const PoolGeom& g, int nsp, const Value& div) {
  const DType t = x.dtype(), ct = t == DType::kF64 ? DType::kF64 : DType::kF32;
  const int r = x.rank(), lead = r - nsp;
  auto round = [&](const Value& v) { return Cast(Cast(v, t), ct); };
  std::vector<int64_t> bd;
  for (int i = lead; i < r; ++i) bd.push_back(i);
  Value dv = round(Cast(div, ct));
  Value share = round(ir::Binary(Op::kDiv, Cast(dy, ct), ir::BroadcastInDim(dv, dy.dims(), bd)));
  // the frame holds every window position (output o, tap k at o * stride + k) and the padded input
  std::vector<int64_t> frame = x.dims(), start(r, 0), limit = x.dims(), unit(r, 1);
  for (int i = lead; i < r; ++i) {
    const int64_t o = dy.dims()[i], s = g.strides[i], k = g.window[i], plo = g.padding[2 * i];
    frame[i] = std::max((o - 1) * s + k, plo + x.dims()[i]);
    start[i] = plo;
    limit[i] = plo + x.dims()[i];
  }
  int64_t taps = 1;
  for (int i = lead; i < r; ++i) taps *= g.window[i];
  Value acc = ir::Full(0, ir::Shape(ct, frame));
  for (int64_t q = taps - 1; q >= 0; --q) {
    std::vector<int64_t> lo(r, 0), hi(r, 0), interior(r, 0);
    int64_t rest = q;
    for (int i = r - 1; i >= lead; --i) {  // tap index, the first spatial dim most significant
      const int64_t k = rest % g.window[i];
      rest /= g.window[i];
      const int64_t o = dy.dims()[i], s = g.strides[i];
      lo[i] = k;
      interior[i] = s - 1;
      hi[i] = frame[i] - ((o - 1) * s + 1) - k;
    }
    Value tap = ir::Pad(share, ir::Constant(0, ct), lo, hi, interior);
    acc = round(ir::Binary(Op::kAdd, acc, tap));
  }
  return Cast(ir::Slice(acc, start, limit, unit), t);
}

// Adaptive average pooling's gradient as eager's CPU kernel computes it: each output's share
// dy / kh / kw in the dtype (bf16/f16: each quotient rounded), added into its window's inputs in
// output order (row-major), each sum in the dtype. Input i of a dim lies in the windows of outputs
// floor(i*O/I) .. ceil((i+1)*O/I) - 1: the k-th of them is gathered for every input at once.
Value AdaptiveAvgPool2dBackwardRounded(const Value& dy, const Value& x) {
  const DType t = x.dtype(), ct = t == DType::kF64 ? DType::kF64 : DType::kF32;
  const int r = x.rank();
  auto round = [&](const Value& v) { return Cast(Cast(v, t), ct); };
  struct Dim { int d; int64_t in, out, most; };
  Dim dims[2];
  for (int q = 0; q < 2; ++q) {
    Dim& dm = dims[q];
    dm.d = r - 2 + q, dm.in = x.dims()[dm.d], dm.out = dy.dims()[dm.d], dm.most = 0;
    for (int64_t i = 0; i < dm.in; ++i) {
      const int64_t first = i * dm.out / dm.in, last = ((i + 1) * dm.out + dm.in - 1) / dm.in - 1;
      dm.most = std::max(dm.most, last - first + 1);
    }
  }
  // shares: dy / kh / kw as eager's kernel divides, in the dtype (each quotient rounded), with the
  // window lengths from the window bounds of each output (opaque: XLA would fold them into constants
  // and multiply by their reciprocals)
  Value share = Cast(dy, ct);
  for (const Dim& dm : dims) {
    ir::Shape os(DType::kS64, {dm.out});
    auto C = [&](int64_t v) { return ir::Full(static_cast<double>(v), os); };
    Value o = ir::Iota(os, 0);
    Value start = ir::Binary(Op::kDiv, ir::Binary(Op::kMul, o, C(dm.in)), C(dm.out));
    Value end = ir::Binary(Op::kDiv, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, ir::Binary(Op::kAdd, o, C(1)), C(dm.in)), C(dm.out - 1)), C(dm.out));
    Value len = ir::OptimizationBarrier({ir::Convert(ir::Binary(Op::kSub, end, start), ct)})[0];
    share = round(ir::Binary(Op::kDiv, share, ir::BroadcastInDim(len, dy.dims(), {dm.d})));
  }
  // the k-th output whose window holds input i, and whether there is one
  auto nth = [&](const Dim& dm, int64_t k, Value* valid) {
    ir::Shape is(DType::kS64, {dm.in});
    auto C = [&](int64_t v) { return ir::Full(static_cast<double>(v), is); };
    Value i = ir::Iota(is, 0);
    Value first = ir::Binary(Op::kDiv, ir::Binary(Op::kMul, i, C(dm.out)), C(dm.in));
    Value last = ir::Binary(Op::kSub, ir::Binary(Op::kDiv, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, ir::Binary(Op::kAdd, i, C(1)), C(dm.out)), C(dm.in - 1)), C(dm.in)), C(1));
    Value o = ir::Binary(Op::kAdd, first, C(k));
    *valid = ir::Compare(CompareDir::kLE, o, last);
    return ir::Binary(Op::kMin, o, last);
  };
  auto gather = [&](const Value& v, int d, const Value& idx, int64_t n) {
    std::vector<int64_t> slice = v.dims(), offset;
    slice[d] = 1;
    for (int q = 0; q < v.rank(); ++q) if (q != d) offset.push_back(q);
    return ir::Gather(v, ir::Reshape(idx, {n, 1}), offset, {d}, {d}, 1, slice);
  };
  Value acc = ir::Full(0, ir::Shape(ct, x.dims()));
  for (int64_t kh = 0; kh < dims[0].most; ++kh) {
    Value vh;
    Value rows = gather(share, dims[0].d, nth(dims[0], kh, &vh), dims[0].in);
    for (int64_t kw = 0; kw < dims[1].most; ++kw) {
      Value vw;
      Value term = gather(rows, dims[1].d, nth(dims[1], kw, &vw), dims[1].in);
      Value valid = ir::Binary(Op::kAnd, ir::BroadcastInDim(vh, x.dims(), {dims[0].d}),
                               ir::BroadcastInDim(vw, x.dims(), {dims[1].d}));
      acc = round(ir::Binary(Op::kAdd, acc, ir::Select(valid, term, ir::Full(0, term.shape()))));
    }
  }
  return Cast(acc, t);
}

// The largest window of adaptive pooling from `in` to `out` along one dim.
int64_t AdaptiveTaps(int64_t in, int64_t out) {
  int64_t taps = 0;
  for (int64_t o = 0; o < out; ++o) taps = std::max(taps, ((o + 1) * in + out - 1) / out - (o * in) / out);
  return taps;
}

// Adaptive average pooling as eager's CPU kernel computes it: each window's elements summed one by
// one in row-major order (float32 for bf16/f16), then divided by its height, then by its width
// (behind a barrier: XLA would multiply by constant reciprocals). Tap (i, j) of every window is
// gathered for all outputs at once; taps past a window's end add nothing.
Value AdaptiveAvgPool2dSequential(const Value& x, int64_t oh, int64_t ow) {
  const int r = x.rank();
  const DType t = x.dtype(), ct = t == DType::kF64 ? DType::kF64 : DType::kF32;
  struct Win { Value start, end, len; int64_t taps; };
  auto win = [&](int64_t in, int64_t out) {
    ir::Shape os(DType::kS64, {out});
    auto C = [&](int64_t v) { return ir::Full(static_cast<double>(v), os); };
    Value o = ir::Iota(os, 0);
    Win w;
    w.start = ir::Binary(Op::kDiv, ir::Binary(Op::kMul, o, C(in)), C(out));
    w.end = ir::Binary(Op::kDiv, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, ir::Binary(Op::kAdd, o, C(1)), C(in)), C(out - 1)), C(out));
    w.len = ir::OptimizationBarrier({ir::Convert(ir::Binary(Op::kSub, w.end, w.start), ct)})[0];
    w.taps = AdaptiveTaps(in, out);
    return w;
  };
  const int64_t h = x.dims()[r - 2], w = x.dims()[r - 1];
  Win wh = win(h, oh), ww = win(w, ow);
  auto gather = [&](const Value& v, int d, const Value& idx, int64_t n) {
    std::vector<int64_t> slice = v.dims(), offset;
    slice[d] = 1;
    for (int q = 0; q < v.rank(); ++q) if (q != d) offset.push_back(q);
    return ir::Gather(v, ir::Reshape(idx, {n, 1}), offset, {d}, {d}, 1, slice);
  };
  auto tap = [&](const Win& wd, int64_t k, int64_t in, Value* valid) {
    Value pos = ir::Binary(ir::Op::kAdd, wd.start, ir::Full(static_cast<double>(k), wd.start.shape()));
    *valid = ir::Compare(CompareDir::kLT, pos, wd.end);
    return ir::Binary(Op::kMin, pos, ir::Full(static_cast<double>(in - 1), pos.shape()));
  };
  std::vector<int64_t> od = x.dims();
  od[r - 2] = oh, od[r - 1] = ow;
  Value xc = Cast(x, ct), acc = ir::Full(0, ir::Shape(ct, od));
  for (int64_t i = 0; i < wh.taps; ++i) {
    Value vh;
    Value rows = gather(xc, r - 2, tap(wh, i, h, &vh), oh);
    for (int64_t j = 0; j < ww.taps; ++j) {
      Value vw;
      Value term = gather(rows, r - 1, tap(ww, j, w, &vw), ow);
      Value valid = ir::Binary(Op::kAnd, ir::BroadcastInDim(vh, od, {r - 2}), ir::BroadcastInDim(vw, od, {r - 1}));
      acc = ir::Binary(Op::kAdd, acc, ir::Select(valid, term, ir::Full(0, term.shape())));
    }
  }
  acc = ir::Binary(Op::kDiv, acc, ir::BroadcastInDim(wh.len, od, {r - 2}));
  acc = ir::Binary(Op::kDiv, acc, ir::BroadcastInDim(ww.len, od, {r - 1}));
  return Cast(acc, t);
}

// [O, I] averaging matrix of adaptive pooling: row o averages [floor(o*I/O), ceil((o+1)*I/O)).
Value AdaptiveMatrix(int64_t out, int64_t in, DType t) {
  ir::Shape is(DType::kS64, {out, in});
  Value o = ir::Iota(is, 0), h = ir::Iota(is, 1);
  auto C = [&](int64_t v) { return ir::Full(static_cast<double>(v), is); };
  Value start = ir::Binary(Op::kDiv, ir::Binary(Op::kMul, o, C(in)), C(out));
  Value end = ir::Binary(Op::kDiv, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, ir::Binary(Op::kAdd, o, C(1)), C(in)), C(out - 1)), C(out));
  Value mask = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGE, h, start), ir::Compare(CompareDir::kLT, h, end));
  Value inv = ir::Binary(Op::kDiv, ir::Full(1, ir::Shape(t, {out, in})), ir::Convert(ir::Binary(Op::kSub, end, start), t));
  return ir::Select(mask, inv, ir::Full(0, ir::Shape(t, {out, in})));
}

// Adaptive average pooling along one dim as a sum of gathered taps: output o averages
// [floor(o*I/O), ceil((o+1)*I/O)); taps past a window's end are selected out (never 0 * x, which
// turns an inf in a neighbouring window into NaN).
Value AdaptiveAvg1d(const Value& x, int64_t dim, int64_t out) {
  int64_t in = x.dims()[dim];
  int64_t taps = 0;
  for (int64_t o = 0; o < out; ++o) taps = std::max(taps, ((o + 1) * in + out - 1) / out - (o * in) / out);
  ir::Shape is(DType::kS64, {out});
  auto C = [&](int64_t v) { return ir::Full(static_cast<double>(v), is); };
  Value o = ir::Iota(is, 0);
  Value start = ir::Binary(Op::kDiv, ir::Binary(Op::kMul, o, C(in)), C(out));
  Value end = ir::Binary(Op::kDiv, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, ir::Binary(Op::kAdd, o, C(1)), C(in)), C(out - 1)), C(out));
  std::vector<int64_t> slice = x.dims(), offset;
  slice[dim] = 1;
  for (int q = 0; q < x.rank(); ++q) if (q != dim) offset.push_back(q);
  std::vector<int64_t> od = x.dims();
  od[dim] = out;
  Value sum;
  for (int64_t k = 0; k < taps; ++k) {
    Value pos = ir::Binary(Op::kAdd, start, C(k));
    Value idx = ir::Binary(Op::kMin, pos, C(in - 1));
    // As index_select: the offset dims keep their places, the gathered dim lands at `dim`.
    Value g = ir::Gather(x, ir::Reshape(idx, {out, 1}), offset, {dim}, {dim}, 1, slice);
    Value valid = ir::BroadcastInDim(ir::Compare(CompareDir::kLT, pos, end), od, {dim});
    Value term = ir::Select(valid, g, ir::Full(0, g.shape()));
    sum = sum ? ir::Binary(Op::kAdd, sum, term) : term;
  }
  Value len = ir::BroadcastInDim(ir::Convert(ir::Binary(Op::kSub, end, start), x.dtype()), od, {dim});
  return ir::Binary(Op::kDiv, sum, len);
}

// Max pooling's input gradient: each output's grad added at its flat (per-plane) argmax index,
// as one scatter into the flattened input (plane * area + index; an index outside its plane is
// dropped, as XLA drops out-of-bounds updates).
Value MaxPoolGradFromIndices(const Value& dy, const Value& x, const Value& idx, int nsp) {
  int r = x.rank();
  int64_t planes = 1, area = 1;
  for (int i = 0; i < r - nsp; ++i) planes *= x.dims()[i];
  for (int i = r - nsp; i < r; ++i) area *= x.dims()[i];
  int64_t m = dy.shape().numel() / std::max<int64_t>(planes, 1);
  ir::Shape is(DType::kS64, {planes, m});
  Value cols = Cast(ir::Reshape(idx, {planes, m}), DType::kS64);
  Value inside = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGE, cols, ir::Full(0, is)),
                            ir::Compare(CompareDir::kLT, cols, ir::Full(static_cast<double>(area), is)));
  Value flat = ir::Binary(Op::kAdd, ir::Binary(Op::kMul, ir::Iota(is, 0), ir::Full(static_cast<double>(area), is)), cols);
  flat = ir::Select(inside, flat, ir::Full(-1, is));
  Value upd = ir::Reshape(dy, {planes * m});
  Value zeros = ir::Full(0, ir::Shape(dy.dtype(), {planes * area}));
  Value g = ir::Scatter(zeros, ir::Reshape(flat, {planes * m, 1}), upd, {}, {0}, {0}, 1, 1);
  return ir::Reshape(g, x.dims());
}

constexpr int64_t kMaxPoolTaps = 64;  // windows of up to this many elements are unrolled

// Average pooling's window sums as eager's CPU kernel adds them: tap after tap in row-major window
// order (a strided slice of the zero-padded input per tap; padding adds +0, which changes no sum
// that starts at +0), in `ct`. XLA's reduce_window adds in its own order.
Value AvgPoolSums(const Value& x, const PoolGeom& g, int nsp, DType ct) {
  int r = x.rank(), lead = r - nsp;
  std::vector<int64_t> low(r, 0), high(r, 0), zeros(r, 0), od = x.dims();
  int64_t taps = 1;
  for (int q = 0; q < nsp; ++q) {
    low[lead + q] = g.padding[2 * (lead + q)];
    high[lead + q] = g.padding[2 * (lead + q) + 1];
    od[lead + q] = g.out[q];
    taps *= g.window[lead + q];
  }
  Value xp = ir::Pad(Cast(x, ct), ir::Constant(0, ct), low, high, zeros);
  Value acc = ir::Full(0, ir::Shape(ct, od));
  for (int64_t tap = 0; tap < taps; ++tap) {
    std::vector<int64_t> start(r, 0), limit = xp.dims(), str(r, 1);
    for (int64_t rem = tap, q = nsp - 1; q >= 0; --q) {
      const int64_t k0 = (rem % g.window[lead + q]) * g.dilation[lead + q], s = g.strides[lead + q];
      rem /= g.window[lead + q];
      start[lead + q] = k0;
      limit[lead + q] = k0 + (g.out[q] - 1) * s + 1;
      str[lead + q] = s;
    }
    acc = ir::Binary(Op::kAdd, acc, ir::Slice(xp, start, limit, str));
  }
  return acc;
}

std::pair<Value, Value> MaxPoolTaps(const Value& x, const PoolGeom& g, int nsp) {
  int r = x.rank(), lead = r - nsp;
  DType t = x.dtype();
  std::vector<int64_t> low(r, 0), high(r, 0), zeros(r, 0), od = x.dims();
  for (int q = 0; q < nsp; ++q) {
    low[lead + q] = g.padding[2 * (lead + q)];
    high[lead + q] = g.padding[2 * (lead + q) + 1];
    od[lead + q] = g.out[q];
  }
  Value xp = ir::Pad(x, ir::Constant(0, t), low, high, zeros);
  ir::Shape os(DType::kS64, od);
  // Per spatial dim q: the input row/column o * s - p that tap 0 of output o reads.
  std::vector<Value> base_q(nsp);
  Value flat_base;
  int64_t plane_stride = 1;
  std::vector<int64_t> in_stride(nsp);
  for (int q = nsp - 1; q >= 0; --q) { in_stride[q] = plane_stride; plane_stride *= x.dims()[lead + q]; }
  for (int q = 0; q < nsp; ++q) {
    ir::Shape vs(DType::kS64, {g.out[q]});
    base_q[q] = ir::Binary(Op::kSub, ir::Binary(Op::kMul, ir::Iota(vs, 0), ir::Full(static_cast<double>(g.strides[lead + q]), vs)),
                           ir::Full(static_cast<double>(low[lead + q]), vs));
    Value term = ir::BroadcastInDim(ir::Binary(Op::kMul, base_q[q], ir::Full(static_cast<double>(in_stride[q]), vs)), od, {lead + q});
    flat_base = flat_base ? ir::Binary(Op::kAdd, flat_base, term) : term;
  }
  int64_t taps = 1;
  for (int q = 0; q < nsp; ++q) taps *= g.window[lead + q];
  Value v, off, have;  // have: some in-bounds element seen (null once statically true everywhere)
  bool have_all = false;
  for (int64_t tap = 0; tap < taps; ++tap) {
    std::vector<int64_t> ij(nsp);
    for (int64_t rem = tap, q = nsp - 1; q >= 0; --q) { ij[q] = rem % g.window[lead + q]; rem /= g.window[lead + q]; }
    std::vector<int64_t> start(r, 0), limit = xp.dims(), str(r, 1);
    int64_t c = 0;
    Value valid;
    for (int q = 0; q < nsp; ++q) {
      int64_t s = g.strides[lead + q], d = g.dilation[lead + q], in = x.dims()[lead + q], k0 = ij[q] * d;
      start[lead + q] = k0;
      limit[lead + q] = k0 + (g.out[q] - 1) * s + 1;
      str[lead + q] = s;
      c += k0 * in_stride[q];
      int64_t first = k0 - low[lead + q], last = first + (g.out[q] - 1) * s;
      if (first >= 0 && last < in) continue;  // this tap is in bounds for every output along q
      ir::Shape vs(DType::kS64, {g.out[q]});
      Value pos = ir::Binary(Op::kAdd, base_q[q], ir::Full(static_cast<double>(k0), vs));
      Value ok = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kGE, pos, ir::Full(0, vs)),
                            ir::Compare(CompareDir::kLT, pos, ir::Full(static_cast<double>(in), vs)));
      ok = ir::BroadcastInDim(ok, od, {lead + q});
      valid = valid ? ir::Binary(Op::kAnd, valid, ok) : ok;
    }
    Value tv = ir::Slice(xp, start, limit, str);
    Value cv = ir::Full(static_cast<double>(c), os);
    if (!v) {
      v = tv;
      off = cv;
      if (valid) have = valid; else have_all = true;
      continue;
    }
    Value take = ir::Compare(CompareDir::kGT, tv, v);
    if (ir::IsFloating(t)) take = ir::Binary(Op::kOr, take, ir::Compare(CompareDir::kNE, tv, tv));
    if (!have_all) take = ir::Binary(Op::kOr, take, ir::Unary(Op::kNot, have));
    if (valid) take = ir::Binary(Op::kAnd, take, valid);
    v = ir::Select(take, tv, v);
    off = ir::Select(take, cv, off);
    if (!have_all) {
      if (valid) have = ir::Binary(Op::kOr, have, valid); else { have_all = true; have = Value(); }
    }
  }
  return {v, ir::Binary(Op::kAdd, flat_base, off)};
}

// x's dim `dim` (size I) mapped through m [O, I]: the result has O at `dim`.
Value AlongDim(const Value& x, int64_t dim, const Value& m) {
  Value y = ir::DotGeneral(x, m, {}, {}, {dim}, {1}, x.dtype());  // [x's other dims..., O]
  int r = x.rank();
  std::vector<int64_t> perm;
  for (int p = 0; p < r; ++p) perm.push_back(p < dim ? p : p == dim ? r - 1 : p - 1);
  return ir::Transpose(y, perm);
}

// Adaptive max pooling over the last two dims, as eager's CPU kernel: window [floor(o*I/O),
// ceil((o+1)*I/O)) per dim, scanned h-major; a later value replaces the running max when it is
// greater or NaN (ties keep the first). Indices are flat over the input's H*W.
std::vector<Value> AdaptiveMax2d(const Value& x, int64_t oh, int64_t ow) {
  int r = x.rank();
  int64_t ih = x.dims()[r - 2], iw = x.dims()[r - 1];
  auto taps_of = [](int64_t out, int64_t in) {
    int64_t t = 0;
    for (int64_t o = 0; o < out; ++o) t = std::max(t, ((o + 1) * in + out - 1) / out - (o * in) / out);
    return t;
  };
  auto bounds = [](int64_t out, int64_t in) {
    ir::Shape is(DType::kS64, {out});
    auto C = [&](int64_t v) { return ir::Full(static_cast<double>(v), is); };
    Value o = ir::Iota(is, 0);
    Value start = ir::Binary(Op::kDiv, ir::Binary(Op::kMul, o, C(in)), C(out));
    Value end = ir::Binary(Op::kDiv, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, ir::Binary(Op::kAdd, o, C(1)), C(in)), C(out - 1)), C(out));
    return std::make_pair(start, end);
  };
  auto [sh, eh] = bounds(oh, ih);
  auto [sw, ew] = bounds(ow, iw);
  int64_t th = taps_of(oh, ih), tw = taps_of(ow, iw);
  std::vector<int64_t> od = x.dims();
  od[r - 2] = oh;
  od[r - 1] = ow;
  ir::Shape ois(DType::kS64, od);
  auto along = [&](const Value& v, int dim) { return ir::BroadcastInDim(v, od, {dim}); };
  // Gather x at (h, w) index maps [oh] x [ow] for all leading dims.
  auto gather_hw = [&](const Value& hidx, const Value& widx) {
    std::vector<int64_t> sl = x.dims(), off;
    sl[r - 2] = 1;
    for (int q = 0; q < r; ++q) if (q != r - 2) off.push_back(q);
    Value g = ir::Gather(x, ir::Reshape(hidx, {oh, 1}), off, {r - 2}, {r - 2}, 1, sl);
    std::vector<int64_t> sl2 = g.dims(), off2;
    sl2[r - 1] = 1;
    for (int q = 0; q < r; ++q) if (q != r - 1) off2.push_back(q);
    return ir::Gather(g, ir::Reshape(widx, {ow, 1}), off2, {r - 1}, {r - 1}, 1, sl2);
  };
  Value best, best_idx;
  ir::Shape hs(DType::kS64, {oh}), ws(DType::kS64, {ow});
  for (int64_t a = 0; a < th; ++a) {
    Value ph = ir::Binary(Op::kAdd, sh, ir::Full(static_cast<double>(a), hs));
    Value hcl = ir::Binary(Op::kMin, ph, ir::Full(static_cast<double>(ih - 1), hs));
    for (int64_t b = 0; b < tw; ++b) {
      Value pw = ir::Binary(Op::kAdd, sw, ir::Full(static_cast<double>(b), ws));
      Value wcl = ir::Binary(Op::kMin, pw, ir::Full(static_cast<double>(iw - 1), ws));
      Value v = gather_hw(hcl, wcl);
      Value flat = ir::Binary(Op::kAdd, ir::Binary(Op::kMul, along(hcl, r - 2), ir::Full(static_cast<double>(iw), ois)),
                              along(wcl, r - 1));
      if (!best) {  // the first tap is always inside its window
        best = v;
        best_idx = flat;
        continue;
      }
      Value valid = ir::Binary(Op::kAnd, along(ir::Compare(CompareDir::kLT, ph, eh), r - 2),
                               along(ir::Compare(CompareDir::kLT, pw, ew), r - 1));
      Value better = ir::Compare(CompareDir::kGT, v, best);
      if (ir::IsFloating(x.dtype())) better = ir::Binary(Op::kOr, better, ir::Compare(CompareDir::kNE, v, v));
      Value take = ir::Binary(Op::kAnd, valid, better);
      best = ir::Select(take, v, best);
      best_idx = ir::Select(take, flat, best_idx);
    }
  }
  return {best, best_idx};
}

// ---- batch norm
Value PerChannel(const Value& v, const Value& like) { return ir::BroadcastInDim(v, like.dims(), {1}); }

std::vector<int64_t> NonChannelDims(const Value& x) {
  std::vector<int64_t> d;
  for (int i = 0; i < x.rank(); ++i) if (i != 1) d.push_back(i);
  return d;
}

DType AccType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

struct BnOut { Value out, mean, invstd, rm, rv; };

int64_t DoubleBits(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Host batch norm (ir::HostNorms()): f32/f64, every operand of the input's dtype, a non-empty input.
bool UseHostNorm(const Value& x, std::initializer_list<const std::optional<Value>*> others) {
  DType t = x.dtype();
  if (!ir::HostNorms() || (t != DType::kF32 && t != DType::kF64) || x.rank() < 2 || x.shape().numel() == 0) return false;
  for (const auto* o : others) if (*o && (*o)->dtype() != t) return false;
  return true;
}

// Training-mode batch norm through ATen's batch_norm_cpu inside the executable: operands
// (x, [w], [b], [rm, rv]); results (out, save_mean, save_invstd, [new rm, new rv]).
BnOut HostBatchNorm(const Value& x, const std::optional<Value>& w, const std::optional<Value>& b,
                    const std::optional<Value>& rm, const std::optional<Value>& rv, double momentum, double eps) {
  bool stats = rm && rv;
  std::vector<Value> ops{x};
  if (w) ops.push_back(*w);
  if (b) ops.push_back(*b);
  std::vector<ir::Shape> shapes{x.shape(), ir::Shape(x.dtype(), {x.dims()[1]}), ir::Shape(x.dtype(), {x.dims()[1]})};
  if (stats) {
    ops.push_back(*rm);
    ops.push_back(*rv);
    shapes.push_back(rm->shape());
    shapes.push_back(rv->shape());
  }
  V r = ir::HostCall("bn", ops, shapes, {w ? 1 : 0, b ? 1 : 0, stats ? 1 : 0, DoubleBits(eps), DoubleBits(momentum)});
  BnOut o;
  o.out = r[0];
  o.mean = r[1];
  o.invstd = r[2];
  if (stats) {
    o.rm = r[3];
    o.rv = r[4];
  }
  return o;
}

BnOut BatchNorm(const Value& x, std::optional<Value> w, std::optional<Value> b, std::optional<Value> rm,
                std::optional<Value> rv, bool training, double momentum, double eps) {
  if (training && (rm.has_value() == rv.has_value()) && UseHostNorm(x, {&w, &b, &rm, &rv})) {
    return HostBatchNorm(x, w, b, rm, rv, momentum, eps);
  }
  DType ct = AccType(x.dtype());
  Value xc = Cast(x, ct);
  auto dims = NonChannelDims(x);
  int64_t n = 1;
  for (int64_t d : dims) n *= x.dims()[d];
  int64_t c = x.dims()[1];
  BnOut r;
  Value mean, invstd;
  if (training) {
    mean = ir::Binary(Op::kDiv, ir::Reduce(ir::ReduceKind::kSum, xc, dims), ir::Full(static_cast<double>(n), ir::Shape(ct, {c})));
    Value cen = ir::Binary(Op::kSub, xc, PerChannel(mean, xc));
    Value var = ir::Binary(Op::kDiv, ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kMul, cen, cen), dims),
                           ir::Full(static_cast<double>(n), ir::Shape(ct, {c})));
    invstd = ir::Unary(Op::kRsqrt, ir::Binary(Op::kAdd, var, ir::Full(eps, var.shape())));
    if (rm) {
      Value m = ir::Full(momentum, ir::Shape(ct, {c})), one_m = ir::Full(1 - momentum, ir::Shape(ct, {c}));
      r.rm = Cast(ir::Binary(Op::kAdd, ir::Binary(Op::kMul, one_m, Cast(*rm, ct)), ir::Binary(Op::kMul, m, mean)), rm->dtype());
      Value unbiased = ir::Binary(Op::kMul, var, ir::Full(static_cast<double>(n) / std::max<int64_t>(n - 1, 1), var.shape()));
      r.rv = Cast(ir::Binary(Op::kAdd, ir::Binary(Op::kMul, one_m, Cast(*rv, ct)), ir::Binary(Op::kMul, m, unbiased)), rv->dtype());
    }
    r.mean = mean;
    r.invstd = invstd;
  } else {
    mean = Cast(*rm, ct);
    invstd = ir::Unary(Op::kRsqrt, ir::Binary(Op::kAdd, Cast(*rv, ct), ir::Full(eps, ir::Shape(ct, {c}))));
    r.mean = ir::Full(0, ir::Shape(ct, {0}));
    r.invstd = ir::Full(0, ir::Shape(ct, {0}));
    r.rm = *rm;
    r.rv = *rv;
  }
  Value y;
  if (ct == DType::kF32) {
    // eager's transform: alpha = invstd * w, beta = b - mean * alpha, out = x * alpha + beta, the
    // last two fused multiply-adds in its kernel (float32 outputs bit-equal; the other grouping was
    // 1 ulp off in half of them)
    Value alpha = w ? ir::Binary(Op::kMul, invstd, Cast(*w, ct)) : invstd;
    Value beta = ir::FmaF32(ir::Unary(Op::kNeg, mean), alpha, b ? Cast(*b, ct) : ir::Full(0, alpha.shape()));
    y = ir::FmaF32(xc, PerChannel(alpha, xc), PerChannel(beta, xc));
  } else {
    y = ir::Binary(Op::kMul, ir::Binary(Op::kSub, xc, PerChannel(mean, xc)), PerChannel(invstd, xc));
    if (w) y = ir::Binary(Op::kMul, y, PerChannel(Cast(*w, ct), xc));
    if (b) y = ir::Binary(Op::kAdd, y, PerChannel(Cast(*b, ct), xc));
  }
  r.out = Cast(y, x.dtype());
  // Eager returns the saved statistics in the input's dtype.
  r.mean = Cast(r.mean, x.dtype());
  r.invstd = Cast(r.invstd, x.dtype());
  return r;
}

V BatchNormBackward(const Value& g_in, const Value& x, std::optional<Value> w, std::optional<Value> rm,
                    std::optional<Value> rv, std::optional<Value> save_mean, std::optional<Value> save_invstd,
                    bool train, double eps, const std::vector<int64_t>& mask) {
  bool m0 = mask.size() > 0 && mask[0], m1 = mask.size() > 1 && mask[1], m2 = mask.size() > 2 && mask[2];
  std::optional<Value> gv = g_in;
  if (train && save_mean && save_invstd && (m0 || m1 || m2) && (w || (!m1 && !m2)) &&
      UseHostNorm(x, {&gv, &w, &save_mean, &save_invstd})) {
    // ATen's batch_norm_backward_cpu: operands (dy, x, [w], save_mean, save_invstd), one result per mask.
    std::vector<Value> ops{g_in, x};
    if (w) ops.push_back(*w);
    ops.push_back(*save_mean);
    ops.push_back(*save_invstd);
    std::vector<ir::Shape> shapes;
    if (m0) shapes.push_back(x.shape());
    if (m1) shapes.push_back(w->shape());
    if (m2) shapes.push_back(w->shape());
    V r = ir::HostCall("bn_bwd", ops, shapes, {w ? 1 : 0, DoubleBits(eps), m0, m1, m2});
    V out(3);
    size_t k = 0;
    if (m0) out[0] = r[k++];
    if (m1) out[1] = r[k++];
    if (m2) out[2] = r[k++];
    return out;
  }
  DType ct = AccType(x.dtype());
  Value g = Cast(g_in, ct), xc = Cast(x, ct);
  auto dims = NonChannelDims(x);
  int64_t n = 1, c = x.dims()[1];
  for (int64_t d : dims) n *= x.dims()[d];
  Value mean, invstd;
  if (train) {
    mean = Cast(*save_mean, ct);
    invstd = Cast(*save_invstd, ct);
  } else {
    mean = Cast(*rm, ct);
    invstd = ir::Unary(Op::kRsqrt, ir::Binary(Op::kAdd, Cast(*rv, ct), ir::Full(eps, ir::Shape(ct, {c}))));
  }
  Value xhat = ir::Binary(Op::kMul, ir::Binary(Op::kSub, xc, PerChannel(mean, xc)), PerChannel(invstd, xc));
  Value sum_g = ir::Reduce(ir::ReduceKind::kSum, g, dims);
  Value sum_gx = ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kMul, g, xhat), dims);
  Value wv = w ? Cast(*w, ct) : ir::Full(1, ir::Shape(ct, {c}));
  V out(3);
  if (mask.size() > 0 && mask[0]) {
    Value scale = ir::Binary(Op::kMul, wv, invstd);  // [C]
    Value dx;
    if (train) {
      Value nf = ir::Full(static_cast<double>(n), ir::Shape(ct, {c}));
      Value t1 = ir::Binary(Op::kMul, g, ir::Full(static_cast<double>(n), g.shape()));
      Value t2 = ir::Binary(Op::kSub, t1, PerChannel(sum_g, g));
      Value t3 = ir::Binary(Op::kSub, t2, ir::Binary(Op::kMul, xhat, PerChannel(sum_gx, g)));
      dx = ir::Binary(Op::kMul, t3, PerChannel(ir::Binary(Op::kDiv, scale, nf), g));
    } else {
      dx = ir::Binary(Op::kMul, g, PerChannel(scale, g));
    }
    out[0] = Cast(dx, x.dtype());
  }
  DType wt = w ? w->dtype() : x.dtype();
  if (mask.size() > 1 && mask[1]) out[1] = Cast(sum_gx, wt);
  if (mask.size() > 2 && mask[2]) out[2] = Cast(sum_g, wt);
  return out;
}

// Host kernels (ir::HostKernels()): ATen's CPU convolution runs inside the executable. Only at the
// DEFAULT mat mul precision: a precision the user set must reach XLA's convolution (issue #8).
bool UseHostConv(const Value& x, const Value& w) {
  DType t = x.dtype();
  return ir::HostConvs() && ir::MatMulPrecision() == 0 && w.dtype() == t && (t == DType::kF32 || t == DType::kF64 || t == DType::kBF16);
}

std::vector<int64_t> HostConvParams(const ConvParams& p, bool transposed) {
  std::vector<int64_t> v{p.nsp, transposed ? 1 : 0, p.groups};
  for (const auto* l : {&p.stride, &p.padding, &p.dilation, &p.output_padding}) v.insert(v.end(), l->begin(), l->end());
  return v;
}

std::vector<int64_t> Mask(const OpArgs& a, size_t k) {
  if (a.IsNone(k)) return {1, 1, 1};
  return a.Ints(k);
}

// (input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
V ConvolutionRow(OpArgs& a) {
  Value x = a.V(0), w = a.V(1);
  auto bias = a.OptV(2);
  if (x.dtype() != w.dtype()) {
    a.Fail("Input type (" + std::string(ir::DTypeName(x.dtype())) + ") and weight type (" +
           ir::DTypeName(w.dtype()) + ") should be the same");
  }
  ConvParams p = ReadConv(a, 3, w);
  Value y = ConvForward(x, w, p, a.Bool(6));  // XLA's form; its shape is the host call's
  if (UseHostConv(x, w)) y = ir::HostCall("conv", {x, w}, {y.shape()}, HostConvParams(p, a.Bool(6)))[0];
  if (bias) y = ir::Binary(Op::kAdd, y, PerChannel(Cast(*bias, y.dtype()), y));
  return {y};
}

// (grad_output, input, weight, [bias_sizes,] stride, padding, dilation, transposed, output_padding,
// groups, output_mask): `first` is the position of stride.
V ConvolutionBackward(OpArgs& a, size_t first) {
  Value dy = a.V(0), x = a.V(1), w = a.V(2);
  ConvParams p = ReadConv(a, first, w);
  bool transposed = a.Bool(first + 3);
  auto mask = Mask(a, first + 6);
  V out(3);
  if (UseHostConv(x, w) && dy.dtype() == x.dtype() && (mask[0] || mask[1])) {
    std::vector<int64_t> params = HostConvParams(p, transposed);
    params.push_back(mask[0] ? 1 : 0);
    params.push_back(mask[1] ? 1 : 0);
    std::vector<ir::Shape> shapes;
    if (mask[0]) shapes.push_back(x.shape());
    if (mask[1]) shapes.push_back(w.shape());
    V r = ir::HostCall("conv_bwd", {dy, x, w}, shapes, params);
    size_t k = 0;
    if (mask[0]) out[0] = r[k++];
    if (mask[1]) out[1] = r[k++];
  } else if (!transposed) {
    if (mask[0]) out[0] = ConvInputGrad(dy, x, w, p);
    if (mask[1]) out[1] = ConvWeightGrad(dy, x, SpatialOf(w), p);
  } else {
    // y = conv_transpose(x, w): dx = conv(dy, w); dw correlates dy (as input) with x.
    std::vector<int64_t> pads, ones(p.nsp, 1);
    for (int i = 0; i < p.nsp; ++i) { pads.push_back(p.padding[i]); pads.push_back(p.padding[i]); }
    if (mask[0]) out[0] = ir::Convolution(dy, w, p.stride, pads, ones, p.dilation, p.groups, 1);
    if (mask[1]) out[1] = ConvWeightGrad(x, dy, SpatialOf(w), p);
  }
  if (mask[2]) out[2] = SumAllBut(dy, 1);
  return out;
}

}  // namespace

void AddConvRows(std::vector<OpRow>& rows) {
  rows.push_back({"convolution_overrideable", ConvolutionRow});
  // aten::convolution itself is taken too: conv1d/conv3d's internal reshapes then stay above
  // functionalization. Its backward carries bias_sizes at position 3, the overrideable one does not.
  rows.push_back({"convolution", ConvolutionRow});
  rows.push_back({"convolution_backward_overrideable", [](OpArgs& a) -> V { return ConvolutionBackward(a, 3); }});
  rows.push_back({"convolution_backward", [](OpArgs& a) -> V { return ConvolutionBackward(a, 4); }});
  for (int nsp : {2, 3}) {
    std::string nd = std::to_string(nsp) + "d";
    rows.push_back({"max_pool" + nd + "_with_indices", [nsp](OpArgs& a) -> V {
      Value x = a.V(0);
      if (nsp == 3 && ((x.rank() != 4 && x.rank() != 5) || x.dtype() == DType::kPred)) throw NotLowered{};  // eager's errors
      PoolGeom g = Pool(x, nsp, a.Ints(1), a.Ints(2), a.Ints(3), a.Ints(4), a.Bool(5));
      int64_t taps = 1;
      for (int64_t k : g.window) taps *= k;
      if (taps <= kMaxPoolTaps && x.dtype() != DType::kPred) {
        auto [vals, idx] = MaxPoolTaps(x, g, nsp);
        return {vals, idx};
      }
      // Large windows: one variadic reduce_window (values and indices); values alone through
      // eager's running max, so a pooling whose indices nobody reads skips them.
      auto [vals, idx] = ir::ArgMaxWindow(x, g.window, g.strides, g.dilation, g.padding, nsp);
      if (ir::IsFloating(x.dtype())) {
        std::vector<int64_t> ones(x.rank(), 1);
        vals = ir::ReduceWindow(ir::ReduceKind::kMaxRunning, x,
                                ir::Constant(-std::numeric_limits<double>::infinity(), x.dtype()), g.window, g.strides,
                                ones, g.dilation, g.padding);
      }
      return {vals, idx};
    }});
    rows.push_back({"max_pool" + nd + "_with_indices_backward", [nsp](OpArgs& a) -> V {
      return {MaxPoolGradFromIndices(a.V(0), a.V(1), a.V(7), nsp)};
    }});
    rows.push_back({"avg_pool" + nd, [nsp](OpArgs& a) -> V {
      Value x = a.V(0);
      if (nsp == 3 && ((x.rank() != 4 && x.rank() != 5) || x.dtype() == DType::kPred)) throw NotLowered{};
      if (nsp == 3) {
        // eager's pool3d_shape_check (check_input_size): the input itself, padding aside, must hold a kernel
        std::vector<int64_t> k = Expand(a.Ints(1), 3, 1);
        const auto& dd = x.dims();
        int64_t it = dd[x.rank() - 3], ih = dd[x.rank() - 2], iw = dd[x.rank() - 1];
        if (k[0] > 0 && k[1] > 0 && k[2] > 0 && (it < k[0] || ih < k[1] || iw < k[2])) {
          throw ir::ShapeError("input image (T: " + std::to_string(it) + " H: " + std::to_string(ih) + " W: " +
                               std::to_string(iw) + ") smaller than kernel size (kT: " + std::to_string(k[0]) +
                               " kH: " + std::to_string(k[1]) + " kW: " + std::to_string(k[2]) + ")");
        }
      }
      PoolGeom g = Pool(x, nsp, a.Ints(1), a.Ints(2), a.Ints(3), {}, a.Bool(4));
      // 3-d integers: eager sums and divides in int64 (truncating), as here.
      DType ct = nsp == 3 && !ir::IsFloating(x.dtype()) ? DType::kS64 : AccType(x.dtype());
      int64_t taps = 1;
      for (int i = x.rank() - nsp; i < x.rank(); ++i) taps *= g.window[i];
      Value sums;
      if (ir::IsFloating(x.dtype()) && taps <= 64 && x.shape().numel() > 0) {
        sums = AvgPoolSums(x, g, nsp, ct);
      } else {
        std::vector<int64_t> ones(x.rank(), 1);
        sums = ir::ReduceWindow(ir::ReduceKind::kSum, Cast(x, ct), ir::Constant(0, ct), g.window, g.strides, ones, ones,
                                g.padding);
      }
      // behind a barrier: XLA would turn the division by a constant divisor into a multiplication
      // by its reciprocal (not eager's correctly rounded quotient)
      Value div = ir::OptimizationBarrier({AvgDivisor(x, g, nsp, a.Bool(5), a.OptInt(6), ct)})[0];
      std::vector<int64_t> bd;
      for (int i = x.rank() - nsp; i < x.rank(); ++i) bd.push_back(i);
      return {Cast(ir::Binary(Op::kDiv, sums, ir::BroadcastInDim(div, sums.dims(), bd)), x.dtype())};
    }});
    rows.push_back({"avg_pool" + nd + "_backward", [nsp](OpArgs& a) -> V {
      Value dy = a.V(0), x = a.V(1);
      PoolGeom g = Pool(x, nsp, a.Ints(2), a.Ints(3), a.Ints(4), {}, a.Bool(5));
      DType ct = AccType(x.dtype());
      // opaque as in the forward: XLA folds the divisors into constants and multiplies by their reciprocals
      Value div = ir::OptimizationBarrier({AvgDivisor(x, g, nsp, a.Bool(6), a.OptInt(7), ct)})[0];
      int r = x.rank();
      std::vector<int64_t> bd;
      for (int i = r - nsp; i < r; ++i) bd.push_back(i);
      Value gd = ir::Binary(Op::kDiv, Cast(dy, ct), ir::BroadcastInDim(div, dy.dims(), bd));
      int64_t taps = 1;
      for (int i = r - nsp; i < r; ++i) taps *= g.window[i];
      if (ir::IsFloating(x.dtype()) && taps <= 64 && x.shape().numel() > 0) {
        return {AvgPoolBackwardRounded(dy, x, g, nsp, div)};  // eager's order of the shares' sums
      }
      // Spread each window's share back: dilate by the stride, slide a window of the kernel size.
      std::vector<int64_t> base(r, 1), ones(r, 1), pad(2 * r, 0);
      std::vector<int64_t> limit = x.dims(), start(r, 0), strides1(r, 1);
      bool need_slice = false;
      for (int i = r - nsp; i < r; ++i) {
        int64_t k = g.window[i], s = g.strides[i], p = g.padding[2 * i];
        int64_t hd = (dy.dims()[i] - 1) * s + 1;
        int64_t lo = k - 1 - p;
        int64_t hi = x.dims()[i] - hd - lo + k - 1;
        base[i] = s;
        if (lo < 0) { start[i] = -lo; lo = 0; need_slice = true; }
        if (hi < 0) { hi = 0; need_slice = true; }
        pad[2 * i] = lo;
        pad[2 * i + 1] = hi;
      }
      Value gin = ir::ReduceWindow(ir::ReduceKind::kSum, gd, ir::Constant(0, ct), g.window, strides1, base, ones, pad);
      if (need_slice) {
        for (int i = r - nsp; i < r; ++i) limit[i] = start[i] + x.dims()[i];
        gin = ir::Slice(gin, start, limit, strides1);
      }
      return {Cast(gin, x.dtype())};
    }});
  }
  rows.push_back({"_adaptive_avg_pool2d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    auto os = Expand(a.Ints(1), 2, 1);
    int r = x.rank();
    DType ct = AccType(x.dtype());
    int64_t h = x.dims()[r - 2], w = x.dims()[r - 1];
    if (os[0] > 0 && os[1] > 0 && h > 0 && w > 0 && AdaptiveTaps(h, os[0]) * AdaptiveTaps(w, os[1]) <= 64) {
      return {AdaptiveAvgPool2dSequential(x, os[0], os[1])};
    }
    if (os[0] > 0 && os[1] > 0 && h % os[0] == 0 && w % os[1] == 0) {
      // Equal windows: windowed sums (a 0/1 matrix product would turn inf into NaN).
      int64_t kh = h / os[0], kw = w / os[1];
      std::vector<int64_t> win(r, 1), ones(r, 1), pad(2 * r, 0);
      win[r - 2] = kh;
      win[r - 1] = kw;
      Value sums = ir::ReduceWindow(ir::ReduceKind::kSum, Cast(x, ct), ir::Constant(0, ct), win, win, ones, ones, pad);
      Value n = ir::OptimizationBarrier({ir::Constant(static_cast<double>(kh * kw), ct)})[0];  // see avg_pool
      return {Cast(ir::Binary(Op::kDiv, sums, ir::BroadcastInDim(n, sums.dims(), {})), x.dtype())};
    }
    if (os[0] == 0 || os[1] == 0 || h == 0 || w == 0) {
      Value ah = AdaptiveMatrix(os[0], x.dims()[r - 2], ct), aw = AdaptiveMatrix(os[1], x.dims()[r - 1], ct);
      return {Cast(ResampleLast2(Cast(x, ct), ah, aw), x.dtype())};
    }
    if (AdaptiveTaps(h, os[0]) * AdaptiveTaps(w, os[1]) <= 64) return {AdaptiveAvgPool2dSequential(x, os[0], os[1])};
    // Unequal windows: sums over the window of each dim in turn, then the mean over the 2-D window.
    Value xc = Cast(x, ct);
    Value y = AdaptiveAvg1d(AdaptiveAvg1d(xc, r - 2, os[0]), r - 1, os[1]);
    return {Cast(y, x.dtype())};
  }});
  rows.push_back({"_adaptive_avg_pool2d_backward", [](OpArgs& a) -> V {
    Value dy = a.V(0), x = a.V(1);
    int r = x.rank();
    DType ct = AccType(x.dtype());
    if (ir::IsFloating(x.dtype()) && x.shape().numel() > 0 && dy.shape().numel() > 0) {
      return {AdaptiveAvgPool2dBackwardRounded(dy, x)};  // eager's shares and the order of their sums
    }
    Value ah = AdaptiveMatrix(dy.dims()[r - 2], x.dims()[r - 2], ct);
    Value aw = AdaptiveMatrix(dy.dims()[r - 1], x.dims()[r - 1], ct);
    Value aht = ir::Transpose(ah, {1, 0}), awt = ir::Transpose(aw, {1, 0});
    return {Cast(ResampleLast2(Cast(dy, ct), aht, awt), x.dtype())};
  }});
  rows.push_back({"_adaptive_avg_pool3d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    auto os = Expand(a.Ints(1), 3, 1);
    int r = x.rank();
    if ((r != 4 && r != 5) || !ir::IsFloating(x.dtype())) throw NotLowered{};  // eager's errors
    for (int i = 0; i < 3; ++i) if (os[i] <= 0 || x.dims()[r - 3 + i] == 0) throw NotLowered{};
    DType ct = AccType(x.dtype());
    Value y = Cast(x, ct);
    for (int i = 0; i < 3; ++i) y = AdaptiveAvg1d(y, r - 3 + i, os[i]);
    return {Cast(y, x.dtype())};
  }});
  rows.push_back({"_adaptive_avg_pool3d_backward", [](OpArgs& a) -> V {
    Value dy = a.V(0), x = a.V(1);
    int r = x.rank();
    DType ct = AccType(x.dtype());
    Value g = Cast(dy, ct);
    for (int i = 0; i < 3; ++i) {
      int64_t d = r - 3 + i;
      g = AlongDim(g, d, ir::Transpose(AdaptiveMatrix(dy.dims()[d], x.dims()[d], ct), {1, 0}));
    }
    return {Cast(g, x.dtype())};
  }});
  rows.push_back({"adaptive_max_pool2d", [](OpArgs& a) -> V {
    Value x = a.V(0);
    auto os = Expand(a.Ints(1), 2, 1);
    int r = x.rank();
    if ((r != 3 && r != 4) || os[0] <= 0 || os[1] <= 0 || x.shape().numel() == 0 || !ir::IsFloating(x.dtype())) {
      throw NotLowered{};  // eager's errors (integer dtypes are not implemented)
    }
    return AdaptiveMax2d(x, os[0], os[1]);
  }});
  rows.push_back({"adaptive_max_pool2d_backward", [](OpArgs& a) -> V {
    return {MaxPoolGradFromIndices(a.V(0), a.V(1), a.V(2), 2)};
  }});
  rows.push_back({"_native_batch_norm_legit_functional", [](OpArgs& a) -> V {
    BnOut r = BatchNorm(a.V(0), a.OptV(1), a.OptV(2), a.OptV(3), a.OptV(4), a.Bool(5), a.Double(6), a.Double(7));
    return {r.out, r.mean, r.invstd, r.rm, r.rv};
  }});
  rows.push_back({"_native_batch_norm_legit.no_stats", [](OpArgs& a) -> V {
    BnOut r = BatchNorm(a.V(0), a.OptV(1), a.OptV(2), std::nullopt, std::nullopt, true, a.Double(4), a.Double(5));
    return {r.out, r.mean, r.invstd};
  }});
  rows.push_back({"_native_batch_norm_legit_no_training", [](OpArgs& a) -> V {
    BnOut r = BatchNorm(a.V(0), a.OptV(1), a.OptV(2), a.OptV(3), a.OptV(4), false, a.Double(5), a.Double(6));
    return {r.out, r.mean, r.invstd};
  }});
  rows.push_back({"native_batch_norm", [](OpArgs& a) -> V {
    bool training = a.Bool(5);
    auto rm = a.OptV(3), rv = a.OptV(4);
    BnOut r = BatchNorm(a.V(0), a.OptV(1), a.OptV(2), rm, rv, training || !rm, a.Double(6), a.Double(7));
    if (training && rm) {  // eager updates the running statistics in place
      a.WriteBack(3, r.rm);
      a.WriteBack(4, r.rv);
    }
    return {r.out, r.mean, r.invstd};
  }});
  rows.push_back({"_batch_norm_with_update_functional", [](OpArgs& a) -> V {
    BnOut r = BatchNorm(a.V(0), a.OptV(1), a.OptV(2), a.OptV(3), a.OptV(4), true, a.Double(5), a.Double(6));
    return {r.out, r.mean, r.invstd, ir::Full(0, ir::Shape(DType::kU8, {0})), r.rm, r.rv};
  }});
  rows.push_back({"_batch_norm_no_update", [](OpArgs& a) -> V {
    auto rm = a.OptV(3), rv = a.OptV(4);
    BnOut r = BatchNorm(a.V(0), a.OptV(1), a.OptV(2), rm, rv, !rm, a.Double(5), a.Double(6));
    return {r.out, r.mean, r.invstd, ir::Full(0, ir::Shape(DType::kU8, {0}))};
  }});
  rows.push_back({"native_batch_norm_backward", [](OpArgs& a) -> V {
    return BatchNormBackward(a.V(0), a.V(1), a.OptV(2), a.OptV(3), a.OptV(4), a.OptV(5), a.OptV(6), a.Bool(7),
                             a.Double(8), Mask(a, 9));
  }});
  rows.push_back({"batch_norm_backward", [](OpArgs& a) -> V {
    return BatchNormBackward(a.V(0), a.V(1), a.OptV(2), a.OptV(3), a.OptV(4), a.OptV(5), a.OptV(6), a.Bool(7),
                             a.Double(8), Mask(a, 9));
  }});
}

}  // namespace txla::ops
