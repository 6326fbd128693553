#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "graph/graph.h"
#include "ops/op_table.h"

namespace txla::ops {

using ir::Op;

DType Scalar::NaturalType() const {
  switch (kind) {
    case kBool: return DType::kPred;
    case kInt: return DType::kS64;
    case kFloat: return DType::kF32;
    case kComplex: return DType::kC64;
  }
  return DType::kF32;
}

// ---------------------------------------------------------------- OpArgs accessors
void OpArgs::Fail(const std::string& msg) const { throw ir::ShapeError(std::string(op_name) + ": " + msg); }
const TensorArg& OpArgs::T(size_t k) const {
  if (k >= args.size() || args[k].kind != Arg::kTensor) Fail("argument " + std::to_string(k) + " is not a tensor");
  return args[k].t;
}
std::optional<Value> OpArgs::OptV(size_t k) const {
  if (IsNone(k) || args[k].kind != Arg::kTensor || !args[k].t.defined()) return std::nullopt;
  return args[k].t.v;
}
const std::vector<TensorArg>& OpArgs::TL(size_t k) const {
  if (k >= args.size() || (args[k].kind != Arg::kTensorList && args[k].kind != Arg::kOptTensorList)) {
    Fail("argument " + std::to_string(k) + " is not a tensor list");
  }
  return args[k].tl;
}
int64_t OpArgs::Int(size_t k) const {
  if (k >= args.size()) Fail("missing int argument");
  const Arg& a = args[k];
  if (a.kind == Arg::kInt) return a.i;
  if (a.kind == Arg::kBool) return a.b;
  if (a.kind == Arg::kScalar) return a.s.AsInt();
  Fail("argument " + std::to_string(k) + " is not an int");
}
std::optional<int64_t> OpArgs::OptInt(size_t k) const {
  if (IsNone(k)) return std::nullopt;
  return Int(k);
}
double OpArgs::Double(size_t k) const {
  if (k >= args.size()) Fail("missing float argument");
  const Arg& a = args[k];
  if (a.kind == Arg::kDouble) return a.f;
  if (a.kind == Arg::kInt) return static_cast<double>(a.i);
  if (a.kind == Arg::kScalar) return a.s.AsDouble();
  Fail("argument " + std::to_string(k) + " is not a float");
}
std::optional<double> OpArgs::OptDouble(size_t k) const {
  if (IsNone(k)) return std::nullopt;
  return Double(k);
}
bool OpArgs::Bool(size_t k, bool def) const {
  if (IsNone(k)) return def;
  const Arg& a = args[k];
  if (a.kind == Arg::kBool) return a.b;
  if (a.kind == Arg::kInt) return a.i != 0;
  Fail("argument " + std::to_string(k) + " is not a bool");
}
const std::vector<int64_t>& OpArgs::Ints(size_t k) const {
  if (k >= args.size() || args[k].kind != Arg::kIntList) Fail("argument " + std::to_string(k) + " is not an int list");
  return args[k].il;
}
std::optional<std::vector<int64_t>> OpArgs::OptInts(size_t k) const {
  if (IsNone(k)) return std::nullopt;
  if (args[k].kind == Arg::kInt) return std::vector<int64_t>{args[k].i};
  return Ints(k);
}
const Scalar& OpArgs::S(size_t k) const {
  if (k >= args.size() || args[k].kind != Arg::kScalar) Fail("argument " + std::to_string(k) + " is not a scalar");
  return args[k].s;
}
std::optional<Scalar> OpArgs::OptS(size_t k) const {
  if (IsNone(k)) return std::nullopt;
  return S(k);
}
std::optional<DType> OpArgs::OptDType(size_t k) const {
  if (IsNone(k)) return std::nullopt;
  if (args[k].kind != Arg::kDType) Fail("argument " + std::to_string(k) + " is not a dtype");
  return args[k].dtype;
}
const std::string& OpArgs::Str(size_t k) const {
  if (k >= args.size() || args[k].kind != Arg::kString) Fail("argument " + std::to_string(k) + " is not a string");
  return args[k].str;
}

// ---------------------------------------------------------------- type promotion
namespace {
int Category(DType t) {
  if (t == DType::kPred) return 0;
  if (ir::IsIntegral(t, false)) return 1;
  if (ir::IsFloating(t)) return 2;
  return 3;
}
int IntRank(DType t) {
  switch (t) {
    case DType::kU8: case DType::kS8: return 1;
    case DType::kS16: case DType::kU16: return 2;
    case DType::kS32: case DType::kU32: return 3;
    default: return 4;
  }
}
int FloatRank(DType t) {
  switch (t) {
    case DType::kF16: case DType::kBF16: return 1;
    case DType::kF32: return 2;
    default: return 3;
  }
}
DType ToComplex(DType t) { return t == DType::kF64 ? DType::kC128 : DType::kC64; }
}  // namespace

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  int ca = Category(a), cb = Category(b);
  if (ca != cb) {
    DType hi = ca > cb ? a : b, lo = ca > cb ? b : a;
    if (Category(hi) == 3 && lo == DType::kF64) return DType::kC128;
    return hi;
  }
  switch (ca) {
    case 1: {
      bool ua = ir::IsUnsigned(a), ub = ir::IsUnsigned(b);
      if (ua != ub) {  // u8 with a signed type
        DType s = ua ? b : a;
        return s == DType::kS8 ? DType::kS16 : s;
      }
      return IntRank(a) >= IntRank(b) ? a : b;
    }
    case 2:
      if (FloatRank(a) == 1 && FloatRank(b) == 1) return DType::kF32;  // f16 + bf16
      return FloatRank(a) >= FloatRank(b) ? a : b;
    case 3:
      return (a == DType::kC128 || b == DType::kC128) ? DType::kC128 : DType::kC64;
  }
  return a;
}

namespace {
constexpr int kUndef = -1;
int CombineCategories(int higher, int lower) {
  if (higher == kUndef) return lower;
  if (lower == kUndef) return higher;
  DType h = static_cast<DType>(higher), l = static_cast<DType>(lower);
  if (ir::IsComplex(h)) return higher;
  if (ir::IsComplex(l)) return ir::IsFloating(h) ? static_cast<int>(ToComplex(h)) : lower;
  if (ir::IsFloating(h)) return higher;
  if (h == DType::kPred || ir::IsFloating(l)) return static_cast<int>(PromoteTypes(h, l));
  return higher;
}
int PromoteSkip(int a, DType b) { return a == kUndef ? static_cast<int>(b) : static_cast<int>(PromoteTypes(static_cast<DType>(a), b)); }
}  // namespace

DType ResultType(const std::vector<const TensorArg*>& tensors, const std::vector<const Scalar*>& scalars) {
  int dim = kUndef, zero = kUndef, wrapped = kUndef;
  for (const TensorArg* t : tensors) {
    if (!t || !t->defined()) continue;
    DType d = t->v.dtype();
    if (t->wrapped_number) {
      if (ir::IsFloating(d)) d = DType::kF32;
      else if (ir::IsComplex(d)) d = DType::kC64;
      wrapped = PromoteSkip(wrapped, d);
    } else if (t->v.rank() == 0) {
      zero = PromoteSkip(zero, d);
    } else {
      dim = PromoteSkip(dim, d);
    }
  }
  for (const Scalar* s : scalars) wrapped = PromoteSkip(wrapped, s->NaturalType());
  int r = CombineCategories(dim, CombineCategories(zero, wrapped));
  return r == kUndef ? DType::kF32 : static_cast<DType>(r);
}

DType FloatOf(DType t) { return ir::IsIntegral(t, true) ? DType::kF32 : t; }

// ---------------------------------------------------------------- shapes
ir::Dims BroadcastShapes(const ir::Dims& a, const ir::Dims& b) {
  size_t n = std::max(a.size(), b.size());
  ir::Dims out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw ir::ShapeError("The size of tensor a (" + std::to_string(da) + ") must match the size of tensor b (" +
                           std::to_string(db) + ") at non-singleton dimension " + std::to_string(i));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Value BroadcastTo(const Value& x, const ir::Dims& dims) {
  if (x.dims() == dims) return x;
  int off = static_cast<int>(dims.size()) - x.rank();
  if (off < 0) throw ir::ShapeError("cannot broadcast " + ir::DimsToString(x.dims()) + " to " + ir::DimsToString(dims));
  // Drop size-1 dims that need expanding so broadcast_in_dim sees exact sizes.
  ir::Dims keep_dims, bdims;
  for (int i = 0; i < x.rank(); ++i) {
    int64_t d = x.dims()[i], od = dims[i + off];
    if (d == od) {
      keep_dims.push_back(d);
      bdims.push_back(i + off);
    } else if (d != 1) {
      throw ir::ShapeError("The expanded size of the tensor (" + std::to_string(od) +
                           ") must match the existing size (" + std::to_string(d) + ") at non-singleton dimension " +
                           std::to_string(i + off) + ".  Target sizes: " + ir::DimsToString(dims) +
                           ".  Tensor sizes: " + ir::DimsToString(x.dims()));
    }
  }
  Value r = keep_dims.size() == x.dims().size() ? x : ir::Reshape(x, keep_dims);
  return ir::BroadcastInDim(r, dims, bdims);
}

Value Cast(const Value& x, DType t) {
  if (x.dtype() == t) return x;
  if (ir::IsFloat8(x.dtype())) {  // float8 -> float is exact; from there as eager converts a float
    Value f = ir::Convert(x, DType::kF32);
    return t == DType::kF32 ? f : Cast(f, t);
  }
  if (ir::IsFloat8(t)) {
    // Eager converts to float8 from float only: a double or a 64-bit integer rounds to float first
    // (twice rounded, as eager's static_cast), then to float8 (round to nearest even). e4m3fn has
    // no infinity: eager saturates (1000 and inf give 448), XLA would give NaN. NaN stays NaN.
    Value f = Cast(x, DType::kF32);
    if (t == DType::kF8E4M3FN) {
      Value hi = ir::Full(448.0, f.shape()), lo = ir::Full(-448.0, f.shape());
      f = ir::Select(ir::Compare(ir::CompareDir::kGT, f, hi), hi,
                     ir::Select(ir::Compare(ir::CompareDir::kLT, f, lo), lo, f));
    }
    return ir::Convert(f, t);
  }
  if (t == DType::kPred) return ir::Compare(ir::CompareDir::kNE, x, ir::Full(0, x.shape()));
  if (ir::IsIntegral(t, false) && ir::IsFloating(x.dtype())) {
    // C-style truncation toward zero, as eager. Out of range (NaN, inf, too large), eager's CPU
    // kernels give what the x86 conversion instructions give: the "integer indefinite" value
    // (INT64_MIN for int64, INT32_MIN for int32), and the narrower types convert through int32 and
    // keep its low bits (int8(300.) == 44, uint8(-2.7) == 254). XLA saturates instead.
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
    if (t == DType::kS64 || t == DType::kS32 || t == DType::kS16 || t == DType::kS8 || t == DType::kU8) {
      DType wide = t == DType::kS64 ? DType::kS64 : DType::kS32;
      double lim = t == DType::kS64 ? 9223372036854775808.0 : 2147483648.0;  // 2^63, 2^31: exact
      // In range: -lim <= x < lim (NaN fails both; values in (-lim - 1, -lim) truncate to -lim,
      // which is also the indefinite value, so the boundary needs no truncation).
      Value ok = ir::Binary(Op::kAnd, ir::Compare(ir::CompareDir::kGE, x, ir::Full(-lim, x.shape())),
                            ir::Compare(ir::CompareDir::kLT, x, ir::Full(lim, x.shape())));
      int64_t indefinite = wide == DType::kS64 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int32_t>::min();
      Value v = ir::Select(ok, ir::Convert(x, wide), ir::BroadcastInDim(ir::ConstantInt(indefinite, wide), x.dims(), {}));
      return wide == t ? v : ir::Convert(v, t);  // integer narrowing keeps the low bits
    }
#endif
    return ir::Convert(x, t);
  }
  if (x.dtype() == DType::kPred && ir::IsFloating(t)) {
    // XLA's algebraic simplifier rewrites multiply(a, convert(pred)) into select(pred, a, 0), which
    // turns NaN * False and inf * False into 0 (eager: NaN). A select keeps IEEE semantics.
    return ir::Select(x, ir::Full(1, ir::Shape(t, x.dims())), ir::Full(0, ir::Shape(t, x.dims())));
  }
  return ir::Convert(x, t);
}

Value ScalarV(const Scalar& s, DType t, int device) {
  if (t == DType::kPred) {  // bool(0.5) is true: compare, do not truncate
    int64_t b = s.AsDouble() != 0 || s.im != 0;
    return graph::ScalarValue(static_cast<double>(b), b, t, device);
  }
  return graph::ScalarValue(s.AsDouble(), s.AsInt(), t, device, s.im);
}
Value ScalarV(double v, DType t, int device) {
  return graph::ScalarValue(v, static_cast<int64_t>(v), t, device);
}

Value Bin(Op op, const Value& a, const Value& b) {
  auto dims = BroadcastShapes(a.dims(), b.dims());
  return ir::Binary(op, BroadcastTo(a, dims), BroadcastTo(b, dims));
}
Value Cmp(ir::CompareDir d, const Value& a, const Value& b) {
  auto dims = BroadcastShapes(a.dims(), b.dims());
  return ir::Compare(d, BroadcastTo(a, dims), BroadcastTo(b, dims));
}
Value Where(const Value& pred, const Value& a, const Value& b) {
  auto dims = BroadcastShapes(BroadcastShapes(pred.dims(), a.dims()), b.dims());
  return ir::Select(BroadcastTo(pred, dims), BroadcastTo(a, dims), BroadcastTo(b, dims));
}

Value SumDims(const Value& x, const ir::Dims& dims_in, bool keepdim, DType out) {
  std::vector<int64_t> dims = dims_in;
  if (dims.empty()) {
    dims.resize(x.rank());
    std::iota(dims.begin(), dims.end(), 0);
  }
  // dim 0/-1 of a scalar: nothing to reduce (ir::Reduce still adds eager's +0.0 start to a float)
  if (x.rank() == 0) return Cast(ir::Reduce(ir::ReduceKind::kSum, x, {}), out);
  dims = ir::NormalizeDims(dims, x.rank());
  // bf16/f16 accumulate in float32 as eager does.
  DType acc = out == DType::kBF16 || out == DType::kF16 ? DType::kF32 : out;
  Value r = ir::Reduce(ir::ReduceKind::kSum, Cast(x, acc), dims);
  r = Cast(r, out);
  return keepdim ? KeepDims(r, x.dims(), dims) : r;
}

Value KeepDims(const Value& reduced, const ir::Dims& in_dims, const ir::Dims& rdims) {
  if (in_dims.empty()) return reduced;
  std::vector<int64_t> shape = in_dims;
  for (int64_t d : rdims) shape[d] = 1;
  return ir::Reshape(reduced, shape);
}

Value Matmul2d(const Value& a, const Value& b) {
  return ir::DotGeneral(a, b, {}, {}, {1}, {0}, a.dtype());
}

Value PermuteDims(const Value& x, const ir::Dims& perm) {
  return ir::Transpose(x, ir::NormalizeDims(perm, x.rank()));
}

Value Softmax(const Value& x, int64_t dim, bool log) {
  dim = ir::NormalizeDim(dim, x.rank());
  if (x.rank() == 0) {  // exp(x - x) / exp(x - x): NaN for NaN and +-inf, as eager
    Value d = Bin(Op::kSub, x, x);
    return log ? d : ir::Unary(Op::kExp, d);
  }
  if (x.dtype() == DType::kBF16 || x.dtype() == DType::kF16) {  // eager computes these in float32
    DType t = x.dtype();
    Value xf = Cast(x, DType::kF32);
    if (log && dim == x.rank() - 1) {
      // eager's last-dim log_softmax kernel rounds the sum of exponentials to the input's dtype, and
      // the log of it, before subtracting: (x - max) - round(log(round(sum))), then rounds once more
      // (other dims: computed in float32, rounded once)
      Value mx = KeepDims(ir::Reduce(ir::ReduceKind::kMax, xf, {dim}), x.dims(), {dim});
      Value neg_inf = ir::Compare(ir::CompareDir::kEQ, mx, ir::Full(-std::numeric_limits<double>::infinity(), mx.shape()));
      mx = ir::Select(neg_inf, ir::Full(0, mx.shape()), mx);
      Value shifted = Bin(Op::kSub, xf, mx);
      Value sum = KeepDims(ir::Reduce(ir::ReduceKind::kSum, ir::Unary(Op::kExp, shifted), {dim}), x.dims(), {dim});
      Value lg = Cast(Cast(ir::Unary(Op::kLog, Cast(Cast(sum, t), DType::kF32)), t), DType::kF32);
      return Cast(Bin(Op::kSub, shifted, lg), t);
    }
    return Cast(Softmax(xf, dim, log), t);
  }
  Value mx = KeepDims(ir::Reduce(ir::ReduceKind::kMax, x, {dim}), x.dims(), {dim});
  // Rows that are entirely -inf (fully masked) shift by 0 so they give NaN as eager; +inf rows keep
  // the inf shift (eager: NaN too).
  Value neg_inf = ir::Compare(ir::CompareDir::kEQ, mx, ir::Full(-std::numeric_limits<double>::infinity(), mx.shape()));
  mx = ir::Select(neg_inf, ir::Full(0, mx.shape()), mx);
  Value shifted = Bin(Op::kSub, x, mx);
  Value e = ir::Unary(Op::kExp, shifted);
  Value s = KeepDims(ir::Reduce(ir::ReduceKind::kSum, e, {dim}), x.dims(), {dim});
  if (log) return Bin(Op::kSub, shifted, ir::Unary(Op::kLog, s));
  return Bin(Op::kDiv, e, s);
}

Value RandomUniform(const ir::Shape& s, int device) {
  Value state = graph::NextRngState(device);
  bool f64 = s.dtype == DType::kF64;
  ir::Shape bits_shape(f64 ? DType::kU64 : DType::kU32, s.dims);
  Value bits = ir::RngBitGenerator(state, bits_shape).second;
  // Take the top mantissa bits: uniform in [0, 1) with 24 (53) bits of randomness.
  Value f;
  if (f64) {
    Value top = ir::Binary(Op::kShiftRightLogical, bits, ir::Full(11, bits.shape()));
    f = ir::Binary(Op::kMul, ir::Convert(top, DType::kF64), ir::Full(1.0 / 9007199254740992.0, ir::Shape(DType::kF64, s.dims)));
  } else {
    Value top = ir::Binary(Op::kShiftRightLogical, bits, ir::Full(8, bits.shape()));
    f = ir::Binary(Op::kMul, ir::Convert(top, DType::kF32), ir::Full(1.0 / 16777216.0, ir::Shape(DType::kF32, s.dims)));
  }
  return Cast(f, s.dtype);
}

Value RandomNormal(const ir::Shape& s, int device) {
  // Box-Muller on two uniforms.
  DType ct = s.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  ir::Shape cs(ct, s.dims);
  Value u1 = RandomUniform(cs, device);
  Value u2 = RandomUniform(cs, device);
  Value one = ir::Full(1, cs);
  Value r = ir::Unary(Op::kSqrt, ir::Binary(Op::kMul, ir::Full(-2, cs), ir::Unary(Op::kLog, ir::Binary(Op::kSub, one, u1))));
  Value th = ir::Binary(Op::kMul, ir::Full(2 * M_PI, cs), u2);
  return Cast(ir::Binary(Op::kMul, r, ir::Unary(Op::kCos, th)), s.dtype);
}

void CheckNonZeroDivisor(const Value& divisor, int device) {
  if (divisor.shape().numel() == 0) return;
  Value nz = ir::Compare(ir::CompareDir::kNE, divisor, ir::Full(0, divisor.shape()));
  std::vector<int64_t> all(divisor.rank());
  std::iota(all.begin(), all.end(), 0);
  graph::AddCheck(ir::Reduce(ir::ReduceKind::kAnd, nz, all), "ZeroDivisionError", device, /*runtime_error=*/true);
}

void CheckIndexRange(const Value& idx, int64_t lo, int64_t hi, const std::string& message, int device,
                     std::optional<int64_t> ignore, bool runtime_error) {
  if (idx.shape().numel() == 0) return;
  Value i = Cast(idx, DType::kS64);
  const ir::Shape& s = i.shape();
  Value ok = ir::Binary(Op::kAnd, ir::Compare(ir::CompareDir::kGE, i, ir::Full(static_cast<double>(lo), s)),
                        ir::Compare(ir::CompareDir::kLT, i, ir::Full(static_cast<double>(hi), s)));
  if (ignore) ok = ir::Binary(Op::kOr, ok, ir::Compare(ir::CompareDir::kEQ, i, ir::Full(static_cast<double>(*ignore), s)));
  std::vector<int64_t> all(i.rank());
  std::iota(all.begin(), all.end(), 0);
  Value all_ok = ir::Reduce(ir::ReduceKind::kAnd, ok, all);
  if (message.find("{index}") == std::string::npos) {
    graph::AddCheck(all_ok, message, device, runtime_error);
    return;
  }
  // The message names the bad index, as eager's: the check is the first failing index in row-major
  // order (INT64_MIN when all hold; an index of INT64_MIN itself reads INT64_MIN + 1).
  int64_t n = s.numel();
  ir::Shape flat(DType::kS64, {n});
  Value i1 = ir::Reshape(i, {n}), ok1 = ir::Reshape(ok, {n}), pos = ir::Iota(flat, 0);
  Value first = ir::Reduce(ir::ReduceKind::kMin, ir::Select(ok1, ir::Full(static_cast<double>(n), flat), pos), {0});
  const int64_t kMin64 = std::numeric_limits<int64_t>::min();
  Value lowest = ir::BroadcastInDim(ir::ConstantInt(kMin64, DType::kS64), {n}, {});
  Value hit = ir::Compare(ir::CompareDir::kEQ, pos, ir::BroadcastInDim(first, {n}, {}));
  Value bad = ir::Reduce(ir::ReduceKind::kMax, ir::Select(hit, i1, lowest), {0});
  bad = ir::Binary(Op::kMax, bad, ir::ConstantInt(kMin64 + 1, DType::kS64));
  graph::AddCheck(ir::Select(all_ok, ir::ConstantInt(kMin64, DType::kS64), bad), message, device, runtime_error);
}

Value ResampleLast2(const Value& x, const Value& ah, const Value& aw) {
  int r = x.rank();
  Value y = ir::DotGeneral(x, aw, {}, {}, {r - 1}, {1}, x.dtype());  // [..., H, Wo]
  Value z = ir::DotGeneral(ah, y, {}, {}, {1}, {r - 2}, x.dtype());  // [Ho, ..., Wo]
  std::vector<int64_t> perm;
  for (int i = 1; i < r - 1; ++i) perm.push_back(i);
  perm.push_back(0);
  perm.push_back(r - 1);
  return ir::Transpose(z, perm);
}

int64_t ProductOf(const ir::Dims& v) {
  int64_t p = 1;
  for (auto x : v) p *= x;
  return p;
}

std::vector<int64_t> InferViewShape(std::vector<int64_t> shape, int64_t numel) {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw ir::ShapeError("only one dimension can be inferred");
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      throw ir::ShapeError("shape '" + ir::DimsToString(shape) + "' is invalid for input of size " + std::to_string(numel));
    }
    shape[infer] = numel / known;
  }
  if (ProductOf(shape) != numel) {
    throw ir::ShapeError("shape '" + ir::DimsToString(shape) + "' is invalid for input of size " + std::to_string(numel));
  }
  return shape;
}

double RoundToFloatType(double v, DType t) {
  if (t != DType::kF16 && t != DType::kBF16 && t != DType::kF32) return v;
  const float f = static_cast<float>(v);
  if (t == DType::kF32 || !std::isfinite(f) || f == 0) return f;
  const bool half = t == DType::kF16;
  const int mant = half ? 10 : 7, min_exp = half ? -14 : -126;  // explicit mantissa bits, smallest normal exponent
  int e;
  std::frexp(static_cast<double>(std::fabs(f)), &e);  // |f| in [2^(e-1), 2^e)
  const int exp = std::max(e - 1, min_exp);
  const double quantum = std::ldexp(1.0, exp - mant);
  double r = std::nearbyint(std::fabs(f) / quantum) * quantum;  // ties to even (the default mode)
  if (half && r > 65504) r = INFINITY;
  if (!half && r >= 0x1p128) r = INFINITY;
  return std::copysign(r, f);
}

namespace {
EagerCpuLoop (*g_eager_loop_source)() = nullptr;
}  // namespace

void SetEagerCpuLoopSource(EagerCpuLoop (*source)()) { g_eager_loop_source = source; }

Value EagerBodyOrTail(const std::vector<int64_t>& dims, const Value& body, const Value& tail, int elem_bytes,
                      bool avx512_kernel) {
  const EagerCpuLoop loop = g_eager_loop_source ? g_eager_loop_source() : EagerCpuLoop{};
  const int64_t n = ProductOf(dims);
  const int64_t v = loop.step16 * 2 / std::max(1, elem_bytes) * (avx512_kernel && loop.avx512 ? 2 : 1);
  if (v <= 0) return tail;
  constexpr int64_t kGrain = 32768;  // at::internal::GRAIN_SIZE: smaller loops run on one thread
  const int64_t threads = n < kGrain ? 1 : std::max<int64_t>(1, std::min<int64_t>(loop.threads, (n + kGrain - 1) / kGrain));
  const int64_t chunk = (n + threads - 1) / threads;  // at::parallel_for's split
  std::vector<std::pair<int64_t, int64_t>> tails;    // [lo, hi) of each chunk's scalar tail
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    if (len % v) tails.push_back({start + len - len % v, start + len});
  }
  if (tails.empty()) return body;
  if (tails.size() == 1 && tails[0].first == 0 && tails[0].second == n) return tail;
  ir::Shape is(DType::kS64, {n});
  Value i = ir::Iota(is, 0), mask;
  for (const auto& [lo, hi] : tails) {
    Value in = ir::Binary(ir::Op::kAnd, ir::Compare(ir::CompareDir::kGE, i, ir::Full(static_cast<double>(lo), is)),
                          ir::Compare(ir::CompareDir::kLT, i, ir::Full(static_cast<double>(hi), is)));
    mask = mask ? ir::Binary(ir::Op::kOr, mask, in) : in;
  }
  return ir::Select(ir::Reshape(mask, dims), tail, body);
}

Value EagerLoopBodyOrTail(const std::vector<int64_t>& dims, const std::vector<std::vector<int64_t>>& inputs,
                          const Value& body, const Value& tail, int elem_bytes, bool avx512_kernel) {
  const int64_t n = ProductOf(dims);
  const int rank = static_cast<int>(dims.size());
  // each input's dim i (right-aligned): 1 = full, 0 = broadcast; result dims of size 1 are skipped
  auto status = [&](const std::vector<int64_t>& in, int i) {
    const int j = i - (rank - static_cast<int>(in.size()));
    return j >= 0 && in[j] == dims[i] ? 1 : 0;
  };
  int64_t inner = 1;
  std::vector<int> block;  // the inner block's status per input
  for (int i = rank - 1; i >= 0; --i) {
    if (dims[i] == 1) continue;
    std::vector<int> st;
    for (const auto& in : inputs) st.push_back(status(in, i));
    if (block.empty()) block = st;
    else if (st != block) break;
    inner *= dims[i];
  }
  int scalars = 0;
  for (int v : block) scalars += v == 0;
  if (n <= 1 || scalars > 1) return tail;  // no vectorized loop
  if (inner == n) return EagerBodyOrTail(dims, body, tail, elem_bytes, avx512_kernel);
  constexpr int64_t kGrain = 32768;
  if (n >= kGrain) return body;
  // rows of `inner` elements, each split as a one-row loop: the body's mask of one row, repeated
  std::vector<int64_t> row{inner};
  ir::Shape ms(DType::kPred, {inner});
  Value row_tail = EagerBodyOrTail(row, ir::Full(0, ms), ir::Full(1, ms), elem_bytes, avx512_kernel);
  Value mask = ir::Reshape(ir::BroadcastInDim(row_tail, {n / inner, inner}, {1}), dims);
  return ir::Select(mask, tail, body);
}

}  // namespace txla::ops

namespace txla::ops {

// round_f32(a * b + c), correctly rounded, of float32 operands of one shape: eager's CPU kernels
// compute `a + alpha * b` (add/sub with an alpha) and lerp as fused multiply-adds, which XLA has no
// op for. One IR node (ir::FmaF32); the emitter writes the exact float64 computation.
Value FusedMulAddF32(const Value& a, const Value& b, const Value& c) { return ir::FmaF32(a, b, c); }

Value NoContract(const Value& v, int device) {
  return ir::NoContract(v, graph::ScalarValue(0.0, 0, v.dtype(), device, 0, /*always_data=*/true));
}

}  // namespace txla::ops
