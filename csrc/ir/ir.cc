#include "ir/ir.h"
#include "util/text.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include "util/block_cache.h"

namespace txla::ir {

bool IsFloating(DType t) {
  return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32 || t == DType::kF64;
}
bool IsComplex(DType t) { return t == DType::kC64 || t == DType::kC128; }
bool IsIntegral(DType t, bool include_bool) {
  switch (t) {
    case DType::kPred: return include_bool;
    case DType::kS8: case DType::kS16: case DType::kS32: case DType::kS64:
    case DType::kU8: case DType::kU16: case DType::kU32: case DType::kU64: return true;
    default: return false;
  }
}
bool IsUnsigned(DType t) {
  return t == DType::kPred || t == DType::kU8 || t == DType::kU16 || t == DType::kU32 || t == DType::kU64;
}
const char* DTypeName(DType t) { return runtime::ElementTypeName(t); }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

std::string Shape::ToString() const {
  std::string s = "tensor<";
  for (auto d : dims) s += std::to_string(d) + "x";
  s += DTypeName(dtype);
  s += ">";
  return s;
}

std::string DimsToString(const Dims& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

const char* OpName(Op op) {
  static const char* kNames[] = {
      "device_data", "constant", "iota", "convert",
      "negate", "abs", "exponential", "log", "sqrt", "rsqrt", "sine", "cosine", "tan", "tanh",
      "logistic", "floor", "ceil", "round_nearest_even", "round_nearest_afz", "sign", "log_plus_one",
      "exponential_minus_one", "not", "is_finite", "erf", "erf_inv", "cbrt", "real", "imag",
      "add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum", "and", "or",
      "xor", "atan2", "shift_left", "shift_right_arithmetic", "shift_right_logical",
      "compare", "select", "clamp",
      "broadcast_in_dim", "reshape", "transpose", "slice", "concatenate", "pad", "reverse",
      "dynamic_slice", "dynamic_update_slice",
      "reduce", "arg_reduce", "reduce_window", "arg_reduce_window", "select_and_scatter", "sort", "cumulative",
      "dot_general", "convolution", "gather", "scatter", "rng_bit_generator", "optimization_barrier", "all_reduce",
      "all_gather", "reduce_scatter", "all_to_all", "sharding",
      "lgamma", "digamma", "erfc", "bessel_i1e", "polygamma", "next_after", "zeta", "bitcast_convert",
      "host_call", "cholesky", "triangular_solve", "eigh", "parameter", "while", "fma_f32"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Op::kNumOps), "op names");
  return kNames[static_cast<int>(op)];
}

namespace {
thread_local std::string t_scope;
}
void SetCurrentScope(std::string scope) { t_scope = std::move(scope); }
const std::string& CurrentScope() { return t_scope; }

Node::Node(Op op_, Operands operands_, Shapes shapes_, Attrs attrs_, DeviceDataPtr data_)
    : op(op_), operands(std::move(operands_)), shapes(std::move(shapes_)), attrs(std::move(attrs_)),
      data(std::move(data_)) {
  Hash128 h{0x1234567ULL, 0x89ABCDEFULL};
  h = HashAll(h, static_cast<int64_t>(op), attrs.ints, attrs.f, attrs.n, attrs.s);
  for (const auto& s : shapes) h = HashAll(h, static_cast<int64_t>(s.dtype), s.dims);
  op_hash = h;
  if (!t_scope.empty()) scope = t_scope;
  in_region = op == Op::kParameter;
  for (const auto& v : operands) in_region = in_region || v.node->in_region;
}

Node::~Node() {
  // Operands whose last reference this node holds are destroyed from a per-thread work list by the
  // outermost destructor, not from inside this one: the depth stays constant for any chain length.
  thread_local std::vector<NodePtr> work;
  thread_local bool draining = false;
  for (auto& v : operands) {
    if (v.node) work.push_back(std::move(v.node));
  }
  if (draining) return;
  draining = true;
  while (!work.empty()) {
    NodePtr n = std::move(work.back());
    work.pop_back();
    n.reset();  // may run ~Node of n, which appends n's operands to `work`
  }
  draining = false;
}

std::string Node::ToString() const {
  util::Text os;
  os << OpName(op) << "(";
  for (size_t i = 0; i < operands.size(); ++i) os << (i ? ", " : "") << operands[i].shape().ToString();
  os << ") -> ";
  for (size_t i = 0; i < shapes.size(); ++i) os << (i ? ", " : "") << shapes[i].ToString();
  for (const auto& v : attrs.ints) os << " " << DimsToString(v);
  if (op == Op::kConstant) os << " value=" << attrs.f;
  if (op == Op::kSharding || op == Op::kHostCall) os << " " << attrs.s;
  if (op == Op::kParameter) os << " index=" << attrs.n;
  if ((op == Op::kDotGeneral || op == Op::kConvolution) && attrs.n > 0) {
    os << " precision=" << (attrs.n == 1 ? "HIGH" : "HIGHEST");
  }
  if (!scope.empty()) os << "  # " << scope;
  return os.str();
}

namespace {

Value Make(Op op, Operands operands, Shape shape, Attrs attrs = {}) {
  Shapes shapes;  // not `shapes{std::move(shape)}`: an initializer list copies its elements
  shapes.push_back(std::move(shape));
  return Value(util::MakeCachedShared<Node>(op, std::move(operands), std::move(shapes), std::move(attrs)), 0);
}

NodePtr MakeMulti(Op op, Operands operands, Shapes shapes, Attrs attrs = {}) {
  return util::MakeCachedShared<Node>(op, std::move(operands), std::move(shapes), std::move(attrs));
}

[[noreturn]] void Fail(const std::string& what) { throw ShapeError(what); }

void CheckSameShape(const char* what, const Value& a, const Value& b) {
  if (a.dims() != b.dims() || a.dtype() != b.dtype()) {
    Fail(std::string(what) + ": operand shapes differ: " + a.shape().ToString() + " vs " + b.shape().ToString());
  }
}

}  // namespace

int64_t NormalizeDim(int64_t dim, int rank) {
  int64_t r = std::max<int64_t>(rank, 1);
  if (dim < -r || dim >= r) {
    Fail("Dimension out of range (expected to be in range of [" + std::to_string(-r) + ", " +
         std::to_string(r - 1) + "], but got " + std::to_string(dim) + ")");
  }
  return dim < 0 ? dim + r : dim;
}

std::vector<int64_t> NormalizeDims(std::vector<int64_t> dims, int rank) {
  for (auto& d : dims) d = NormalizeDim(d, rank);
  for (size_t i = 0; i < dims.size(); ++i) {
    for (size_t j = i + 1; j < dims.size(); ++j) {
      if (dims[i] == dims[j]) Fail("dim " + std::to_string(dims[i]) + " appears multiple times in the list of dims");
    }
  }
  return dims;
}

Value MakeDeviceData(DeviceDataPtr data) {
  Shapes shapes;
  shapes.push_back(data->shape);
  Attrs a;
  a.n = data->device;
  return Value(util::MakeCachedShared<Node>(Op::kDeviceData, Operands{}, std::move(shapes), std::move(a), std::move(data)), 0);
}

namespace {
Value MakeConstant(double v, DType t) {
  Attrs a;
  a.f = v;
  a.n = IsFloating(t) || IsComplex(t) ? 0 : static_cast<int64_t>(v);
  return Make(Op::kConstant, {}, Shape(t, {}), std::move(a));
}

// Scalar 0 and 1 of every dtype (every `x + 1`, `x * 0`, masks and defaults build them): made once
// and shared, as nodes are immutable. Only outside debug scopes (a node carries its scope).
constexpr int kNumDTypes = static_cast<int>(DType::kC128) + 1;
const Value* SharedZeroOne(int64_t v, DType t) {
  const int d = static_cast<int>(t);
  if ((v != 0 && v != 1) || d < 0 || d >= kNumDTypes || !t_scope.empty()) return nullptr;
  static const std::vector<Value>* table = [] {
    auto* tab = new std::vector<Value>();  // never freed: nodes outlive every graph
    for (int64_t k : {0, 1}) {
      for (int i = 0; i < kNumDTypes; ++i) tab->push_back(MakeConstant(static_cast<double>(k), static_cast<DType>(i)));
    }
    return tab;
  }();
  return &(*table)[static_cast<size_t>(v * kNumDTypes + d)];
}
}  // namespace

Value Constant(double v, DType t) {
  if ((v == 0.0 && !std::signbit(v)) || v == 1.0) {
    if (const Value* c = SharedZeroOne(static_cast<int64_t>(v), t)) return *c;
  }
  return MakeConstant(v, t);
}

Value ConstantInt(int64_t v, DType t) {
  if (v == 0 || v == 1) {
    if (const Value* c = SharedZeroOne(v, t)) return *c;
  }
  Attrs a;
  a.f = static_cast<double>(v);
  a.n = v;
  return Make(Op::kConstant, {}, Shape(t, {}), std::move(a));
}

Value Full(double v, const Shape& s) {
  Value c = Constant(v, s.dtype);
  if (s.dims.empty()) return c;
  return BroadcastInDim(c, s.dims, {});
}

Value Iota(const Shape& s, int64_t dim) {
  Attrs a;
  a.ints.push_back({NormalizeDim(dim, s.rank())});
  return Make(Op::kIota, {}, s, std::move(a));
}

Value Convert(const Value& x, DType t) {
  if (x.dtype() == t) return x;
  // A scalar 0 or 1 (a Python number's constant, built in its own dtype) is that constant in any
  // dtype: no convert node (one node fewer per `x + 1`).
  if (x.node->op == Op::kConstant && x.rank() == 0) {
    const Attrs& a = x.node->attrs;
    const bool from_float = IsFloating(x.dtype()) || IsComplex(x.dtype());
    for (int64_t v : {0, 1}) {
      if (from_float ? (a.f == static_cast<double>(v) && !std::signbit(a.f)) : a.n == v) {
        return IsFloating(t) || IsComplex(t) ? Constant(static_cast<double>(v), t) : ConstantInt(v, t);
      }
    }
  }
  return Make(Op::kConvert, {x}, Shape(t, x.dims()));
}

Value BitcastConvert(const Value& x, DType t) {
  if (x.dtype() == t) return x;
  if (runtime::ElementSize(x.dtype()) != runtime::ElementSize(t)) {
    Fail(std::string("bitcast_convert: ") + DTypeName(x.dtype()) + " and " + DTypeName(t) + " differ in width");
  }
  return Make(Op::kBitcastConvert, {x}, Shape(t, x.dims()));
}

Value FmaF32(const Value& a, const Value& b, const Value& c) {
  CheckSameShape("fma_f32", a, b);
  CheckSameShape("fma_f32", a, c);
  if (a.dtype() != DType::kF32 || b.dtype() != DType::kF32 || c.dtype() != DType::kF32) {
    throw ShapeError("fma_f32: float32 operands expected");
  }
  return Make(Op::kFmaF32, {a, b, c}, a.shape());
}

namespace {
// XLA's algebraic simplifier rewrites some compositions by identities that hold for real numbers but
// not in floating point: ln(exp(A)) => A (eager: inf once exp overflows), ln(pow(A,B)) => B*ln|A|
// (eager: nan for a negative A), sqrt(A*A) => |A| (eager: 0 once A*A underflows),
// exp(A)/exp(B) => exp(A-B) (eager: inf/inf = nan), (A/B)/C => A/(B*C) and A/(B/C) => (A*C)/B
// (eager: no overflow of B*C or A*C). Eager computes each op and rounds each result:
// an optimization barrier on the inner value keeps XLA from seeing the composition (issue #7, fuzz
// seed 21292). Only these rare compositions pay for it (their inner value is not fused).
bool Produces(const Value& x, Op op) { return x.node && x.node->op == op; }
// The same, looking through reshapes, broadcasts and transposes (XLA's simplifier moves those).
const Node* BelowShapeOps(const Node* n) {
  while (n != nullptr && (n->op == Op::kReshape || n->op == Op::kBroadcastInDim || n->op == Op::kTranspose) &&
         n->operands.size() == 1) {
    n = n->operands[0].node.get();
  }
  return n;
}
bool ProducesThroughShape(const Value& x, Op op) {
  const Node* n = BelowShapeOps(x.node.get());
  return n != nullptr && n->op == op;
}
// A broadcast, possibly reshaped or transposed afterwards.
bool IsBroadcast(const Value& x) {
  const Node* n = x.node.get();
  while (n != nullptr && (n->op == Op::kReshape || n->op == Op::kTranspose) && n->operands.size() == 1) {
    n = n->operands[0].node.get();
  }
  return n != nullptr && n->op == Op::kBroadcastInDim;
}
bool IsSquare(const Value& x) {
  return Produces(x, Op::kMul) && x.node->operands.size() == 2 && x.node->operands[0].node == x.node->operands[1].node &&
         x.node->operands[0].index == x.node->operands[1].index;
}
Value Opaque(const Value& x) {
  if (!IsFloating(x.dtype()) && !IsComplex(x.dtype())) return x;
  return OptimizationBarrier({x})[0];
}

// The node below broadcasts, converts, reshapes and transposes.
const Node* ThroughShape(const Value& v) {
  const Node* n = v.node.get();
  while (n != nullptr && (n->op == Op::kBroadcastInDim || n->op == Op::kConvert || n->op == Op::kReshape ||
                          n->op == Op::kTranspose) &&
         n->operands.size() == 1) {
    n = n->operands[0].node.get();
  }
  return n;
}
bool IsFloatConstant(const Value& v) {
  const Node* n = ThroughShape(v);
  return IsFloating(v.dtype()) && n != nullptr && n->op == Op::kConstant;
}
// A constant XLA cannot see as one (the scalar made opaque, then broadcast again: no array is
// materialized).
Value OpaqueConstant(const Value& b) {
  if (b.node->op == Op::kBroadcastInDim && b.node->operands.size() == 1 && b.node->operands[0].rank() == 0) {
    return BroadcastInDim(Opaque(b.node->operands[0]), b.dims(), {});
  }
  return Opaque(b);
}

// A floating +0.0 constant (possibly converted, reshaped or broadcast). XLA's simplifier rewrites
// A + 0 => A, which keeps A = -0.0 where IEEE (and eager) give +0.0: such an operand is made opaque.
bool IsPlusZeroConstant(const Value& v) {
  const Node* n = ThroughShape(v);
  return n != nullptr && n->op == Op::kConstant && n->attrs.f == 0.0 && !std::signbit(n->attrs.f) && n->attrs.n == 0;
}

// A / C with C a floating constant (possibly converted, reshaped or broadcast) whose reciprocal is
// not exact: XLA's simplifier rewrites it into A * (1/C), which rounds twice where eager's division
// rounds once (hardswish's / 6 left a quarter of its float32 results 1 ulp off). The constant is
// made opaque. Powers of two keep the rewrite: their reciprocal is exact, and so is the product.
Value OpaqueDivisor(const Value& b) {
  const Node* n = ThroughShape(b);
  if (n == nullptr || n->op != Op::kConstant) return b;
  int e = 0;
  double m = std::frexp(n->attrs.f, &e);
  if (!std::isfinite(n->attrs.f) || m == 0.0 || ((m == 0.5 || m == -0.5) && e > -1000 && e < 1000)) return b;
  return OpaqueConstant(b);
}

// An add or subtract with a constant operand.
bool AddsConstant(const Value& v) {
  const Node* n = ThroughShape(v);
  if (n == nullptr || (n->op != Op::kAdd && n->op != Op::kSub) || n->operands.size() != 2) return false;
  return IsFloatConstant(n->operands[0]) || IsFloatConstant(n->operands[1]);
}

// Integer a ** b as eager's kernel computes it: exponentiation by squaring over every bit of the
// exponent, wrapping on overflow; a negative exponent gives 1 for a base of 1, +-1 for -1 (by the
// exponent's parity), 0 otherwise. XLA's integer power read only the exponent's low bits
// (int8 2 ** 64 was 1, int64 2 ** (2**63 - 2) was 2**62) and gave 0 where eager's product wraps
// (uint8 254 ** 7: eager 209).
Value IntPow(const Value& a, const Value& b) {
  const DType t = a.dtype();
  const Shape& s = a.shape();
  const int bits = static_cast<int>(8 * runtime::ElementSize(t));
  Value one = Full(1, s), zero = Full(0, s);
  Value r = one, base = a, e = b;
  for (int i = 0; i < bits; ++i) {
    Value odd = Compare(CompareDir::kNE, Make(Op::kAnd, {e, one}, s), zero);
    r = Select(odd, Make(Op::kMul, {r, base}, s), r);
    if (i + 1 == bits) break;
    base = Make(Op::kMul, {base, base}, s);
    e = Make(Op::kShiftRightLogical, {e, one}, s);
  }
  if (IsUnsigned(t)) return r;
  Value minus_one = Full(-1, s);
  Value odd_b = Compare(CompareDir::kNE, Make(Op::kAnd, {b, one}, s), zero);
  Value neg = Select(Compare(CompareDir::kEQ, a, one), one,
                     Select(Compare(CompareDir::kEQ, a, minus_one), Select(odd_b, minus_one, one), zero));
  return Select(Compare(CompareDir::kLT, b, zero), neg, r);
}

// r + (+0.0), which eager's sums compute (their accumulator starts at +0.0): turns -0.0 into +0.0
// and leaves every other value as it is. The zero is opaque, so XLA keeps the add.
Value PlusZero(const Value& r) {
  if (!IsFloating(r.dtype())) return r;
  Value z = Opaque(Constant(0.0, r.dtype()));
  if (r.rank() > 0) z = BroadcastInDim(z, r.dims(), {});
  return Make(Op::kAdd, {r, z}, r.shape());
}
}  // namespace

// An op's float product result, made non-contractible for its consumers: XLA:CPU lets LLVM fuse a
// multiply and a following add into one fused multiply-add (one rounding), so `buf.mul_(0.9)` then
// `.add_(grad)` (SGD's momentum) rounded once where eager's two kernels round twice (a quarter of
// the float32 results 1 ulp off). Subtracting +0.0 is the exact identity (-0.0 - 0.0 is -0.0);
// passed in as a runtime scalar (a constant, even behind a barrier, reaches LLVM, which folds
// `x - 0.0` away), the product then rounds on its own (fma(a, b, -0.0)) before any consumer's add.
// A subtraction rather than an added -0.0: when XLA folds the product itself to the constant +0.0
// (`zeros_like(x) * 0`), its simplifier rewrites `0.0 + p` into p, the -0.0, but leaves
// `0.0 - p` alone. Looks through reshapes, transposes and broadcasts, which XLA fuses as well.
// A float16/bfloat16 result converted from a float32 product counts too: on CPUs with native
// half-precision arithmetic (AVX512-FP16) LLVM narrows convert(f32 op of converted halves) to the
// half op itself and then contracts the half multiply into the next half add (one rounding where
// eager's kernels round the product to float16 first).
bool ContractibleProduct(const Value& v) {
  if (!v || !IsFloating(v.dtype())) return false;
  if (ProducesThroughShape(v, Op::kMul)) return true;
  if (v.dtype() != DType::kF16 && v.dtype() != DType::kBF16) return false;
  const Node* n = BelowShapeOps(v.node.get());
  return n != nullptr && n->op == Op::kConvert && n->operands.size() == 1 &&
         ProducesThroughShape(n->operands[0], Op::kMul);
}

Value NoContract(const Value& v, const Value& zero) {
  Value z = v.rank() > 0 ? BroadcastInDim(zero, v.dims(), {}) : zero;
  return Make(Op::kSub, {v, z}, v.shape());
}

Value Unary(Op op, const Value& x_in) {
  if (op == Op::kRsqrt && (x_in.dtype() == DType::kF32 || x_in.dtype() == DType::kF64)) {
    // 1 / sqrt(x), two correctly rounded steps, as eager's kernels compute it: XLA:CPU's rsqrt is an
    // approximation (float32 results up to ~100 ulp off). The root is opaque: XLA rewrites
    // A / sqrt(B) into A * rsqrt(B).
    Value r = Opaque(Make(Op::kSqrt, {x_in}, x_in.shape()));
    return Make(Op::kDiv, {Full(1, r.shape()), r}, r.shape());
  }
  // Unsigned integers: abs is the identity (StableHLO's abs rejects them).
  if (op == Op::kAbs && IsUnsigned(x_in.dtype())) return x_in;
  Value x = x_in;
  if ((op == Op::kLog && (Produces(x, Op::kExp) || Produces(x, Op::kPow) || Produces(x, Op::kSqrt) ||
                          Produces(x, Op::kRsqrt))) ||
      ((op == Op::kSqrt || op == Op::kRsqrt) && (IsSquare(x) || Produces(x, Op::kPow)))) {
    x = Opaque(x);
  }
  Shape s = x.shape();
  if (op == Op::kIsFinite) s.dtype = DType::kPred;
  if (op == Op::kReal || op == Op::kImag || (op == Op::kAbs && IsComplex(x.dtype()))) {
    s.dtype = x.dtype() == DType::kC128 ? DType::kF64 : DType::kF32;
  }
  return Make(op, {x}, s);
}

Value Binary(Op op, const Value& a, const Value& b) {
  CheckSameShape(OpName(op), a, b);
  if ((op == Op::kMul || op == Op::kDiv) && Produces(a, Op::kExp) && Produces(b, Op::kExp)) {
    return Make(op, {a, Opaque(b)}, a.shape());  // exp(A)*exp(B) => exp(A+B) (see Opaque)
  }
  if (op == Op::kMul && IsFloating(a.dtype()) && ProducesThroughShape(a, Op::kSqrt) && ProducesThroughShape(b, Op::kSqrt)) {
    // sqrt(A) * sqrt(A) => A: eager rounds the root, then the square (sqrt(2) ** 2 is 1.9999999)
    return Make(op, {a, Opaque(b)}, a.shape());
  }
  if (op == Op::kDiv && IsFloating(a.dtype()) &&
      (ProducesThroughShape(a, Op::kDiv) || ProducesThroughShape(b, Op::kDiv))) {
    // (A/B)/C => A/(B*C) and A/(B/C) => (A*C)/B overflow where eager's two roundings do not
    // (1e30/1e30/1e30: eager 1e-30, XLA's form 0) and turn -1.9/1e-40/-inf from nan into 0.
    return Make(op, {ProducesThroughShape(a, Op::kDiv) ? Opaque(a) : a, ProducesThroughShape(b, Op::kDiv) ? Opaque(b) : b},
                a.shape());
  }
  if (op == Op::kDiv && IsFloating(a.dtype())) {
    // A / sqrt(B): XLA rewrites it into A * rsqrt(B), whose rsqrt is an approximation on XLA:CPU
    // (float32 quotients 1-2 ulp off in 40% of the elements); the root is made opaque.
    if (ProducesThroughShape(b, Op::kSqrt)) return Make(op, {a, Opaque(b)}, a.shape());
    Value d = OpaqueDivisor(b);
    if (d.node != b.node) return Make(op, {a, d}, a.shape());
  }
  if (op == Op::kPow && (Produces(a, Op::kExp) || Produces(a, Op::kPow) || IsSquare(a))) {
    return Make(op, {Opaque(a), b}, a.shape());  // pow(exp(A),B) => exp(A*B), pow(A*A,0.5) => |A|
  }
  if (op == Op::kPow && IsIntegral(a.dtype(), false) && a.dtype() == b.dtype()) return IntPow(a, b);
  if ((op == Op::kDiv || op == Op::kRem) && IsIntegral(a.dtype(), false)) {
    // XLA's constant folding evaluates integer division and remainder in C++: a divisor that folds
    // to 0 (or INT_MIN / -1) killed the process with SIGFPE (fuzz seed 56193: fmod(t * 0, t * 0)).
    // Such lanes divide by 1 instead: x / 1 = x and x % 1 = 0 are eager's INT_MIN / -1 and
    // INT_MIN % -1 (two's complement wrap), and a zero divisor raises at the op (the integer rows
    // check it in-graph), so those lanes' values are never read.
    DType t = a.dtype();
    auto full = [&](int64_t v) { return BroadcastInDim(ConstantInt(v, t), b.dims(), {}); };
    Value bad = Compare(CompareDir::kEQ, b, full(0));
    int bits = 0;
    switch (t) {
      case DType::kS8: bits = 8; break;
      case DType::kS16: bits = 16; break;
      case DType::kS32: bits = 32; break;
      case DType::kS64: bits = 64; break;
      default: break;  // unsigned: no overflow
    }
    if (bits) {
      int64_t lowest = bits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t{1} << (bits - 1));
      bad = Binary(Op::kOr, bad,
                   Binary(Op::kAnd, Compare(CompareDir::kEQ, a, full(lowest)), Compare(CompareDir::kEQ, b, full(-1))));
    }
    return Make(op, {a, Select(bad, full(1), b)}, a.shape());
  }
  if (op == Op::kAdd && IsFloating(a.dtype())) {  // -0.0 + 0.0 is +0.0 (see IsPlusZeroConstant)
    if (IsPlusZeroConstant(b)) return PlusZero(a);
    if (IsPlusZeroConstant(a)) return PlusZero(b);
  }
  if ((op == Op::kAdd || op == Op::kSub) && IsFloating(a.dtype())) {
    // (A + C1) + C2 => A + (C1 + C2): XLA's simplifier folds the two constants, which rounds once
    // where eager rounds twice (`(x + 1) - 1` gave x; eager's is 0 for x = 1e-8 and +0.0 for -0.0).
    // The second constant is made opaque.
    if (IsFloatConstant(b) && AddsConstant(a)) return Make(op, {a, OpaqueConstant(b)}, a.shape());
    if (IsFloatConstant(a) && AddsConstant(b)) return Make(op, {OpaqueConstant(a), b}, a.shape());
  }
  return Make(op, {a, b}, a.shape());
}

// A floating zero constant of either sign (possibly converted, reshaped or broadcast).
bool IsZeroConstant(const Value& v) {
  const Node* n = ThroughShape(v);
  return n != nullptr && n->op == Op::kConstant && n->attrs.f == 0.0 && n->attrs.n == 0;
}

Value Compare(CompareDir dir, const Value& a_in, const Value& b_in) {
  CheckSameShape("compare", a_in, b_in);
  Value a = a_in, b = b_in;
  // abs(A) >= 0 (and 0 <= abs(A)): XLA's simplifier folds it to true, which is false for NaN, as
  // in eager (fuzz seed 85502: `v.abs_(); v >= 0`). The abs is made opaque.
  if (IsFloating(a.dtype())) {
    if (ProducesThroughShape(a, Op::kAbs) && IsZeroConstant(b)) a = Opaque(a);
    if (ProducesThroughShape(b, Op::kAbs) && IsZeroConstant(a)) b = Opaque(b);
  }
  Attrs at;
  at.n = static_cast<int64_t>(dir);
  return Make(Op::kCompare, {a, b}, Shape(DType::kPred, a.dims()), at);
}

Value Select(const Value& pred, const Value& t, const Value& f) {
  CheckSameShape("select", t, f);
  if (pred.dtype() != DType::kPred || (pred.rank() != 0 && pred.dims() != t.dims())) {
    Fail("select: predicate " + pred.shape().ToString() + " does not match " + t.shape().ToString());
  }
  return Make(Op::kSelect, {pred, t, f}, t.shape());
}

Value Clamp(const Value& lo, const Value& x, const Value& hi) {
  CheckSameShape("clamp", lo, x);
  CheckSameShape("clamp", hi, x);
  return Make(Op::kClamp, {lo, x, hi}, x.shape());
}

Value BroadcastInDim(const Value& x, const Dims& out_dims, const Dims& bdims) {
  if (static_cast<int>(bdims.size()) != x.rank()) Fail("broadcast_in_dim: rank mismatch");
  for (size_t i = 0; i < bdims.size(); ++i) {
    int64_t od = bdims[i];
    if (od < 0 || od >= static_cast<int64_t>(out_dims.size())) Fail("broadcast_in_dim: bad dimension");
    if (x.dims()[i] != 1 && x.dims()[i] != out_dims[od]) {
      Fail("broadcast: cannot expand " + DimsToString(x.dims()) + " to " + DimsToString(out_dims));
    }
  }
  if (out_dims == x.dims()) {
    bool identity = true;
    for (size_t i = 0; i < bdims.size(); ++i) identity &= bdims[i] == static_cast<int64_t>(i);
    if (identity) return x;
  }
  Attrs a;
  a.ints.emplace_back(bdims);  // not `= {x}`: an initializer list copies
  return Make(Op::kBroadcastInDim, {x}, Shape(x.dtype(), out_dims), std::move(a));
}

Value Reshape(const Value& x, const Dims& dims) {
  Shape s(x.dtype(), dims);
  if (s.numel() != x.shape().numel()) {
    Fail("shape '" + DimsToString(dims) + "' is invalid for input of size " + std::to_string(x.shape().numel()));
  }
  if (dims == x.dims()) return x;
  return Make(Op::kReshape, {x}, s);
}

Value Transpose(const Value& x, const Dims& perm) {
  if (static_cast<int>(perm.size()) != x.rank()) Fail("transpose: permutation rank mismatch");
  Dims dims(perm.size());
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) {
    dims[i] = x.dims()[perm[i]];
    identity &= perm[i] == static_cast<int64_t>(i);
  }
  if (identity) return x;
  if (x.node->op == Op::kTranspose) {  // transpose(transpose(y, q), p) = transpose(y, q o p)
    const Dims& q = x.node->attrs.ints[0];
    Dims c(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) c[i] = q[perm[i]];
    return Transpose(x.node->operands[0], c);
  }
  Attrs a;
  a.ints.emplace_back(perm);  // not `= {x}`: an initializer list copies
  return Make(Op::kTranspose, {x}, Shape(x.dtype(), std::move(dims)), std::move(a));
}

Value Slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
            const std::vector<int64_t>& strides) {
  std::vector<int64_t> dims(x.rank());
  bool identity = true;
  for (int i = 0; i < x.rank(); ++i) {
    if (start[i] < 0 || limit[i] > x.dims()[i] || start[i] > limit[i] || strides[i] < 1) {
      Fail("slice: invalid bounds for " + x.shape().ToString());
    }
    dims[i] = (limit[i] - start[i] + strides[i] - 1) / strides[i];
    identity &= start[i] == 0 && limit[i] == x.dims()[i] && strides[i] == 1;
  }
  if (identity) return x;
  Attrs a;
  a.ints = {start, limit, strides};
  return Make(Op::kSlice, {x}, Shape(x.dtype(), std::move(dims)), std::move(a));
}

Value Concatenate(const std::vector<Value>& xs, int64_t dim) {
  if (xs.empty()) Fail("concatenate: no inputs");
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].rank() == 0) Fail("zero-dimensional tensor (at position " + std::to_string(i) + ") cannot be concatenated");
  }
  if (xs.size() == 1) return xs[0];
  std::vector<int64_t> dims = xs[0].dims();
  dim = NormalizeDim(dim, xs[0].rank());
  for (size_t i = 1; i < xs.size(); ++i) {
    if (xs[i].rank() != xs[0].rank() || xs[i].dtype() != xs[0].dtype()) Fail("concatenate: operands differ");
    for (int d = 0; d < xs[0].rank(); ++d) {
      if (d != dim && xs[i].dims()[d] != dims[d]) {
        Fail("Sizes of tensors must match except in dimension " + std::to_string(dim) + ". Expected size " +
             std::to_string(dims[d]) + " but got size " + std::to_string(xs[i].dims()[d]) + " for tensor number " +
             std::to_string(i) + " in the list.");
      }
    }
    dims[dim] += xs[i].dims()[dim];
  }
  Attrs a;
  a.ints.push_back({dim});
  return Make(Op::kConcatenate, xs, Shape(xs[0].dtype(), std::move(dims)), std::move(a));
}

Value Pad(const Value& x, const Value& pad_value, const std::vector<int64_t>& low,
          const std::vector<int64_t>& high, const std::vector<int64_t>& interior) {
  std::vector<int64_t> dims(x.rank());
  for (int i = 0; i < x.rank(); ++i) {
    int64_t n = x.dims()[i];
    dims[i] = low[i] + high[i] + n + std::max<int64_t>(n - 1, 0) * interior[i];
    if (dims[i] < 0) Fail("pad: negative output size");
  }
  Attrs a;
  a.ints = {low, high, interior};
  return Make(Op::kPad, {x, pad_value}, Shape(x.dtype(), std::move(dims)), std::move(a));
}

Value Reverse(const Value& x, const Dims& dims) {
  if (dims.empty() || x.rank() == 0) return x;
  Attrs a;
  a.ints.push_back(NormalizeDims(dims, x.rank()));
  return Make(Op::kReverse, {x}, x.shape(), std::move(a));
}

Value DynamicSlice(const Value& x, const std::vector<Value>& starts, const std::vector<int64_t>& sizes) {
  std::vector<Value> ops{x};
  ops.insert(ops.end(), starts.begin(), starts.end());
  Attrs a;
  a.ints.emplace_back(sizes);  // not `= {x}`: an initializer list copies
  return Make(Op::kDynamicSlice, ops, Shape(x.dtype(), sizes), std::move(a));
}

Value DynamicUpdateSlice(const Value& x, const Value& update, const std::vector<Value>& starts) {
  std::vector<Value> ops{x, update};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return Make(Op::kDynamicUpdateSlice, ops, x.shape());
}

Value Reduce(ReduceKind kind, const Value& x, const Dims& dims_in) {
  std::vector<int64_t> dims = NormalizeDims(dims_in, x.rank());
  // Eager's sums start from +0.0, so a sum of -0.0 alone is +0.0; XLA computes init + x for two or
  // more elements but turns a reduction of one element into a reshape (keeping -0.0).
  const bool sum = kind == ReduceKind::kSum && IsFloating(x.dtype());
  if (x.rank() == 0) return sum ? PlusZero(x) : x;  // reducing a scalar over dim 0/-1: the identity
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  if (dims.empty()) return x;
  std::vector<int64_t> out;
  int64_t count = 1;
  for (int i = 0; i < x.rank(); ++i) {
    if (!std::binary_search(dims.begin(), dims.end(), i)) out.push_back(x.dims()[i]);
    else count *= x.dims()[i];
  }
  // Column sums only (the minor dimension kept: bias and norm-weight gradients), where XLA:CPU is
  // slowest (a reduce_window walking memory with a stride, in scalar code). A sum over the minor
  // dimension usually fuses its producer, which a host call would first have to write out; sending
  // also the sums of arrays XLA writes out anyway (BatchNorm's mean of a convolution) to ATen did
  // not measurably pay on the ResNet-style step.
  if (sum && count > 1 && HostReductions() && (x.dtype() == DType::kF32 || x.dtype() == DType::kF64) &&
      x.shape().numel() >= kHostReduceMinElems && dims.back() != x.rank() - 1) {
    return HostCall("sum", {x}, {Shape(x.dtype(), out)}, dims)[0];  // params: the reduced dims
  }
  Attrs a;
  a.ints.emplace_back(dims);  // not `= {x}`: an initializer list copies
  a.n = static_cast<int64_t>(kind);
  Value r = Make(Op::kReduce, {x}, Shape(x.dtype(), std::move(out)), std::move(a));
  // A sum of a broadcast becomes x * n in XLA's simplifier: -0.0 stays -0.0 (eager's sum: +0.0) and
  // the mean's (x * n) / n folds back to x (eager: inf once x * n overflows). The opaque + 0.0 keeps both.
  return sum && (count == 1 || IsBroadcast(x)) ? PlusZero(r) : r;
}

std::pair<Value, Value> ArgReduce(ArgKind kind, const Value& x, int64_t dim) {
  dim = NormalizeDim(dim, x.rank());
  std::vector<int64_t> out;
  for (int i = 0; i < x.rank(); ++i) if (i != dim) out.push_back(x.dims()[i]);
  Attrs a;
  a.ints.push_back({dim});
  a.n = static_cast<int64_t>(kind);
  NodePtr n = MakeMulti(Op::kArgReduce, {x}, {Shape(x.dtype(), out), Shape(DType::kS64, out)}, std::move(a));
  return {Value(n, 0), Value(n, 1)};
}

Value ReduceWindow(ReduceKind kind, const Value& x, const Value& init, const std::vector<int64_t>& window,
                   const std::vector<int64_t>& strides, const std::vector<int64_t>& base_dilations,
                   const std::vector<int64_t>& window_dilations, const std::vector<int64_t>& padding) {
  std::vector<int64_t> dims(x.rank());
  for (int i = 0; i < x.rank(); ++i) {
    int64_t in = (x.dims()[i] - 1) * base_dilations[i] + 1 + padding[2 * i] + padding[2 * i + 1];
    int64_t win = (window[i] - 1) * window_dilations[i] + 1;
    dims[i] = in < win ? 0 : (in - win) / strides[i] + 1;
  }
  Attrs a;
  a.ints = {window, strides, base_dilations, window_dilations, padding};
  a.n = static_cast<int64_t>(kind);
  return Make(Op::kReduceWindow, {x, init}, Shape(x.dtype(), std::move(dims)), std::move(a));
}

Value Cumulative(ReduceKind kind, const Value& x, int64_t dim) {
  dim = NormalizeDim(dim, x.rank());
  if (x.rank() == 0 || x.shape().numel() == 0) return x;
  Attrs a;
  a.ints.push_back({dim});
  a.n = static_cast<int64_t>(kind);
  Value r = Make(Op::kCumulative, {x}, x.shape(), std::move(a));
  // eager's running sum starts from +0.0: it never gives -0.0 (see Reduce)
  return kind == ReduceKind::kSum ? PlusZero(r) : r;
}

Value Cholesky(const Value& a, bool lower) {
  if (a.rank() < 2 || a.dims()[a.rank() - 1] != a.dims()[a.rank() - 2] || !IsFloating(a.dtype())) {
    Fail("cholesky: expected a float [..., n, n] operand, got " + a.shape().ToString());
  }
  Attrs at;
  at.n = lower ? 1 : 0;
  return Make(Op::kCholesky, {a}, a.shape(), at);
}

Value TriangularSolve(const Value& a, const Value& b, bool left_side, bool lower, bool unit_diagonal,
                      bool transpose_a) {
  int r = a.rank();
  if (r < 2 || b.rank() != r || a.dims()[r - 1] != a.dims()[r - 2] || a.dtype() != b.dtype() ||
      !std::equal(a.dims().begin(), a.dims().end() - 2, b.dims().begin()) ||
      a.dims()[r - 1] != b.dims()[left_side ? r - 2 : r - 1]) {
    Fail("triangular_solve: incompatible operands " + a.shape().ToString() + " and " + b.shape().ToString());
  }
  Attrs at;
  at.ints = {{left_side ? 1 : 0, lower ? 1 : 0, unit_diagonal ? 1 : 0, transpose_a ? 1 : 0}};
  return Make(Op::kTriangularSolve, {a, b}, b.shape(), at);
}

std::pair<Value, Value> Eigh(const Value& a, bool lower, int64_t max_iter, double tol) {
  int r = a.rank();
  if (r < 2 || a.dims()[r - 1] != a.dims()[r - 2] || !IsFloating(a.dtype())) {
    Fail("eigh: expected a float [..., n, n] operand, got " + a.shape().ToString());
  }
  Attrs at;
  at.n = lower ? 1 : 0;
  at.ints = {{max_iter}};
  at.f = tol;
  std::vector<int64_t> wd(a.dims().begin(), a.dims().end() - 1);
  NodePtr n = MakeMulti(Op::kEigh, {a}, {a.shape(), Shape(a.dtype(), wd)}, at);
  return {Value(n, 0), Value(n, 1)};
}

namespace {

// Dots below this many multiply-adds stay XLA's (a custom call costs a few microseconds).
constexpr int64_t kHostDotMinFlops = 1 << 15;

bool HostDotDType(DType t) { return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16; }

// The host dot's operand: a transpose is folded into the dimension lists (ATen's GEMM reads
// transposed operands in place; a custom call's operand would otherwise be a materialized copy).
Value LookThroughTranspose(const Value& v, std::vector<int64_t>* batch, std::vector<int64_t>* contract,
                           std::vector<int64_t>* free) {
  if (v.node->op != Op::kTranspose) return v;
  const std::vector<int64_t>& perm = v.node->attrs.ints[0];
  for (auto* dims : {batch, contract, free}) {
    for (auto& d : *dims) d = perm[d];
  }
  return v.node->operands[0];
}

// True when the right operand, as XLA will read it (a transpose folded into the dot), is contracted
// along its minor (last, row-major) dimension: the `x @ W.t()` form.
bool RhsContractsMinor(const Value& b, std::vector<int64_t> rb, std::vector<int64_t> rc) {
  std::vector<int64_t> rf;
  Value v = LookThroughTranspose(b, &rb, &rc, &rf);
  return rc.size() == 1 && rc[0] == v.rank() - 1;
}

// params: [nb, nc, nfa, nfb, lhs batch..., lhs contract..., lhs free..., rhs batch..., rhs contract...,
// rhs free...]; the result is [batch..., lhs free..., rhs free...] as dot_general's.
Value HostDot(Value a, Value b, std::vector<int64_t> lb, std::vector<int64_t> rb, std::vector<int64_t> lc,
              std::vector<int64_t> rc, Shape out) {
  auto free_dims = [](int rank, const std::vector<int64_t>& x, const std::vector<int64_t>& y) {
    std::vector<int64_t> f;
    for (int i = 0; i < rank; ++i) {
      if (std::find(x.begin(), x.end(), i) == x.end() && std::find(y.begin(), y.end(), i) == y.end()) f.push_back(i);
    }
    return f;
  };
  std::vector<int64_t> lf = free_dims(a.rank(), lb, lc), rf = free_dims(b.rank(), rb, rc);
  a = LookThroughTranspose(a, &lb, &lc, &lf);
  b = LookThroughTranspose(b, &rb, &rc, &rf);
  std::vector<int64_t> p{static_cast<int64_t>(lb.size()), static_cast<int64_t>(lc.size()),
                         static_cast<int64_t>(lf.size()), static_cast<int64_t>(rf.size())};
  for (const auto* v : {&lb, &lc, &lf, &rb, &rc, &rf}) p.insert(p.end(), v->begin(), v->end());
  return HostCall("dot", {a, b}, {std::move(out)}, std::move(p))[0];
}

}  // namespace

Value DotGeneral(const Value& a, const Value& b, const std::vector<int64_t>& lb, const std::vector<int64_t>& rb,
                 const std::vector<int64_t>& lc, const std::vector<int64_t>& rc, DType out) {
  if (lb.size() != rb.size() || lc.size() != rc.size()) Fail("dot_general: dimension lists differ");
  std::vector<int64_t> dims;
  dims.reserve(a.rank() + b.rank());
  for (size_t i = 0; i < lb.size(); ++i) {
    if (a.dims()[lb[i]] != b.dims()[rb[i]]) Fail("dot_general: batch dimensions differ");
    dims.push_back(a.dims()[lb[i]]);
  }
  for (size_t i = 0; i < lc.size(); ++i) {
    if (a.dims()[lc[i]] != b.dims()[rc[i]]) {
      Fail("mat1 and mat2 shapes cannot be multiplied (" + DimsToString(a.dims()) + " and " +
           DimsToString(b.dims()) + ")");
    }
  }
  auto in = [](const std::vector<int64_t>& v, int64_t d) { return std::find(v.begin(), v.end(), d) != v.end(); };
  for (int i = 0; i < a.rank(); ++i) if (!in(lb, i) && !in(lc, i)) dims.push_back(a.dims()[i]);
  for (int i = 0; i < b.rank(); ++i) if (!in(rb, i) && !in(rc, i)) dims.push_back(b.dims()[i]);
  // A precision set by the user (set_mat_mul_precision) must reach XLA's dot: host kernels only at DEFAULT.
  const bool big_dots = HostBigDots() && out == DType::kF32;
  if ((HostDots() || big_dots) && MatMulPrecision() == 0 && a.dtype() == out && b.dtype() == out &&
      HostDotDType(out)) {
    int64_t flops = 1;
    for (int64_t d : dims) flops *= d;
    for (int64_t d : lc) flops *= a.dims()[d];
    const bool all = HostDots() && flops >= kHostDotMinFlops && (!HostDotsTransposedOnly() || RhsContractsMinor(b, rb, rc));
    if (all || (big_dots && flops >= HostBigDotMinFlops())) return HostDot(a, b, lb, rb, lc, rc, Shape(out, dims));
  }
  Attrs at;
  at.ints.reserve(4);  // not `= {lb, rb, lc, rc}`: an initializer list copies every list twice
  for (const auto* v : {&lb, &rb, &lc, &rc}) at.ints.push_back(*v);
  at.n = EffectiveMatMulPrecision(a.dtype(), b.dtype());
  // Eager's GEMMs accumulate from +0.0 (a sum of -0.0 products only is +0.0), XLA's dot from the
  // first product (-0.0 there). Not corrected: an add per dot output cost the MLP step 5%.
  return Make(Op::kDotGeneral, {a, b}, Shape(out, std::move(dims)), std::move(at));
}

namespace {
std::atomic<bool> g_host_dots{false}, g_host_convs{false}, g_host_dots_transposed_only{false},
    g_host_reductions{false}, g_host_norms{false}, g_host_big_dots{false};
}  // namespace

void SetHostBigDots(bool on) { g_host_big_dots.store(on); }
bool HostBigDots() { return g_host_big_dots.load(std::memory_order_relaxed); }
int64_t HostBigDotMinFlops() {
  static const int64_t n = [] {
    const char* v = std::getenv("TXLA_HOST_BIG_DOT_MIN_FLOPS");
    return v != nullptr && *v != 0 ? std::max<int64_t>(1, std::atoll(v)) : int64_t{100000000};
  }();
  return n;
}

void SetHostNorms(bool on) { g_host_norms.store(on); }
bool HostNorms() { return g_host_norms.load(std::memory_order_relaxed); }

void SetHostReductions(bool on) { g_host_reductions.store(on); }
bool HostReductions() { return g_host_reductions.load(std::memory_order_relaxed); }

void SetHostDotsTransposedOnly(bool only) { g_host_dots_transposed_only.store(only); }
bool HostDotsTransposedOnly() { return g_host_dots_transposed_only.load(std::memory_order_relaxed); }

void SetHostKernels(bool dots, bool convs) {
  g_host_dots.store(dots);
  g_host_convs.store(convs);
}
bool HostDots() { return g_host_dots.load(std::memory_order_relaxed); }
bool HostConvs() { return g_host_convs.load(std::memory_order_relaxed); }
bool HostKernels() { return HostDots() || HostConvs(); }
std::string HostKernelTarget(const std::string& kernel) { return "txla_aten_" + kernel; }

std::vector<Value> HostCall(const std::string& kernel, const std::vector<Value>& operands, std::vector<Shape> shapes,
                            std::vector<int64_t> params) {
  Attrs a;
  a.s = kernel;
  a.ints.push_back(std::move(params));
  NodePtr n = MakeMulti(Op::kHostCall, operands, std::move(shapes), std::move(a));
  std::vector<Value> out;
  for (size_t i = 0; i < n->shapes.size(); ++i) out.emplace_back(n, static_cast<int>(i));
  return out;
}

Value Gather(const Value& x, const Value& indices, const std::vector<int64_t>& offset_dims,
             const std::vector<int64_t>& collapsed, const std::vector<int64_t>& start_index_map,
             int64_t index_vector_dim, const std::vector<int64_t>& slice_sizes) {
  // Output rank = batch dims (indices dims without index_vector_dim) + offset dims.
  std::vector<int64_t> batch;
  for (int i = 0; i < indices.rank(); ++i) if (i != index_vector_dim) batch.push_back(indices.dims()[i]);
  std::vector<int64_t> offsets;
  for (int i = 0; i < x.rank(); ++i) {
    if (std::find(collapsed.begin(), collapsed.end(), i) == collapsed.end()) offsets.push_back(slice_sizes[i]);
  }
  int64_t out_rank = static_cast<int64_t>(batch.size() + offsets.size());
  std::vector<int64_t> dims(out_rank);
  size_t bi = 0, oi = 0;
  for (int64_t i = 0; i < out_rank; ++i) {
    if (std::find(offset_dims.begin(), offset_dims.end(), i) != offset_dims.end()) dims[i] = offsets[oi++];
    else dims[i] = batch[bi++];
  }
  Attrs a;
  a.ints = {offset_dims, collapsed, start_index_map, {index_vector_dim}, slice_sizes};
  return Make(Op::kGather, {x, indices}, Shape(x.dtype(), std::move(dims)), std::move(a));
}

Value Scatter(const Value& x, const Value& indices, const Value& updates, const std::vector<int64_t>& uwd,
              const std::vector<int64_t>& iwd, const std::vector<int64_t>& sdod, int64_t ivd, int64_t combine) {
  Attrs a;
  a.ints = {uwd, iwd, sdod, {ivd}};
  a.n = combine;
  return Make(Op::kScatter, {x, indices, updates}, x.shape(), std::move(a));
}

std::vector<Value> Sort(const std::vector<Value>& xs, int64_t dim, bool descending, bool stable) {
  Attrs a;
  a.ints.push_back({NormalizeDim(dim, xs[0].rank())});
  a.n = (descending ? 1 : 0) | (stable ? 2 : 0);
  std::vector<Shape> shapes;
  for (auto& x : xs) shapes.push_back(x.shape());
  NodePtr n = MakeMulti(Op::kSort, xs, std::move(shapes), std::move(a));
  std::vector<Value> out;
  for (size_t i = 0; i < xs.size(); ++i) out.emplace_back(n, static_cast<int>(i));
  return out;
}

std::pair<Value, Value> RngBitGenerator(const Value& state, const Shape& bits_shape) {
  NodePtr n = MakeMulti(Op::kRngBitGenerator, {state}, {state.shape(), bits_shape});
  return {Value(n, 0), Value(n, 1)};
}

namespace {
// Parses "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]" into per-side role -> position maps.
struct ConvDims {
  int64_t lb = 0, lf = 1, ko = 0, ki = 1, ob = 0, of = 1;
  std::vector<int64_t> ls, ks, os;  // spatial positions in order 0, 1, ...
};
ConvDims ParseConvDims(const std::string& text, int nsp) {
  ConvDims d;
  if (text.empty()) {
    for (int i = 0; i < nsp; ++i) { d.ls.push_back(2 + i); d.ks.push_back(2 + i); d.os.push_back(2 + i); }
    return d;
  }
  std::vector<std::vector<std::string>> parts;
  std::string cur;
  std::vector<std::string> side;
  for (char c : text) {
    if (c == '[') { side.clear(); cur.clear(); }
    else if (c == ',' || c == ']') {
      std::string t;
      for (char ch : cur) if (ch != ' ') t += ch;
      if (!t.empty()) side.push_back(t);
      cur.clear();
      if (c == ']') parts.push_back(side);
    } else cur += c;
  }
  if (parts.size() != 3) Fail("convolution: bad dimension numbers " + text);
  d.ls.assign(nsp, -1); d.ks.assign(nsp, -1); d.os.assign(nsp, -1);
  for (int s = 0; s < 3; ++s) {
    for (size_t pos = 0; pos < parts[s].size(); ++pos) {
      const std::string& r = parts[s][pos];
      int64_t p = static_cast<int64_t>(pos);
      if (s == 0) { if (r == "b") d.lb = p; else if (r == "f") d.lf = p; else d.ls[std::stoi(r)] = p; }
      if (s == 1) { if (r == "o") d.ko = p; else if (r == "i") d.ki = p; else d.ks[std::stoi(r)] = p; }
      if (s == 2) { if (r == "b") d.ob = p; else if (r == "f") d.of = p; else d.os[std::stoi(r)] = p; }
    }
  }
  return d;
}
}  // namespace

Value Convolution(const Value& lhs, const Value& rhs, const std::vector<int64_t>& strides,
                  const std::vector<int64_t>& padding, const std::vector<int64_t>& lhs_dilation,
                  const std::vector<int64_t>& rhs_dilation, int64_t feature_groups, int64_t batch_groups,
                  const std::string& dims) {
  int nsp = static_cast<int>(strides.size());
  if (lhs.rank() != nsp + 2 || rhs.rank() != nsp + 2) Fail("convolution: operand ranks do not match the window");
  ConvDims d = ParseConvDims(dims, nsp);
  std::vector<int64_t> out(nsp + 2);
  out[d.ob] = lhs.dims()[d.lb] / batch_groups;
  out[d.of] = rhs.dims()[d.ko];
  if (lhs.dims()[d.lf] != rhs.dims()[d.ki] * feature_groups) {
    Fail("convolution: input has " + std::to_string(lhs.dims()[d.lf]) + " channels, the kernel expects " +
         std::to_string(rhs.dims()[d.ki] * feature_groups));
  }
  for (int i = 0; i < nsp; ++i) {
    int64_t in = (lhs.dims()[d.ls[i]] - 1) * lhs_dilation[i] + 1 + padding[2 * i] + padding[2 * i + 1];
    int64_t k = (rhs.dims()[d.ks[i]] - 1) * rhs_dilation[i] + 1;
    int64_t o = in < k ? 0 : (in - k) / strides[i] + 1;
    if (in < k) {
      Fail("Calculated output size is too small: input " + DimsToString(lhs.dims()) + " kernel " +
           DimsToString(rhs.dims()));
    }
    out[d.os[i]] = o;
  }
  Attrs a;
  a.ints = {strides, padding, lhs_dilation, rhs_dilation, {feature_groups, batch_groups}};
  a.s = dims;
  a.n = EffectiveMatMulPrecision(lhs.dtype(), rhs.dtype());
  return Make(Op::kConvolution, {lhs, rhs}, Shape(lhs.dtype(), out), std::move(a));
}

namespace {
std::atomic<int> g_mat_mul_precision{-1};  // -1: not chosen by the user
std::atomic<int> g_platform_f32_precision{0};

void CheckPrecision(int precision) {
  if (precision < 0 || precision > 2) {
    throw std::invalid_argument("mat mul precision must be 0 (default), 1 (high) or 2 (highest), got " +
                                std::to_string(precision));
  }
}
}  // namespace

void SetMatMulPrecision(int precision) {
  CheckPrecision(precision);
  g_mat_mul_precision.store(precision);
}

int MatMulPrecision() { return std::max(0, g_mat_mul_precision.load()); }
int MatMulPrecisionSetting() { return g_mat_mul_precision.load(); }
void RestoreMatMulPrecisionSetting(int setting) { g_mat_mul_precision.store(setting < 0 ? -1 : std::min(setting, 2)); }

void SetPlatformF32MatMulPrecision(int precision) {
  CheckPrecision(precision);
  g_platform_f32_precision.store(precision);
}

int EffectiveMatMulPrecision(DType lhs, DType rhs) {
  int p = g_mat_mul_precision.load();
  if (p >= 0) return p;
  auto f32 = [](DType t) { return t == DType::kF32 || t == DType::kC64; };
  return f32(lhs) || f32(rhs) ? g_platform_f32_precision.load() : 0;
}

namespace {
// Replica groups must be non-empty, equally sized and hold distinct non-negative ids.
int64_t CheckGroups(const char* what, const std::vector<std::vector<int64_t>>& groups) {
  if (groups.empty() || groups[0].empty()) Fail(std::string(what) + ": replica groups must not be empty");
  std::vector<int64_t> seen;
  for (const auto& g : groups) {
    if (g.size() != groups[0].size()) Fail(std::string(what) + ": replica groups must all have the same size");
    for (int64_t id : g) {
      if (id < 0) Fail(std::string(what) + ": replica ids must be >= 0");
      seen.push_back(id);
    }
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
    Fail(std::string(what) + ": a replica id appears in more than one group");
  }
  return static_cast<int64_t>(groups[0].size());
}

Attrs CollectiveAttrs(const std::vector<std::vector<int64_t>>& groups, std::vector<int64_t> params) {
  Attrs a;
  a.ints.assign(groups.begin(), groups.end());
  a.ints.push_back(std::move(params));
  return a;
}
}  // namespace

std::vector<std::vector<int64_t>> CollectiveGroups(const Attrs& a) {
  return std::vector<std::vector<int64_t>>(a.ints.begin(), a.ints.end() - 1);
}
const Dims& CollectiveParams(const Attrs& a) { return a.ints.back(); }

Value AllReduce(ReduceKind kind, const Value& x, const std::vector<std::vector<int64_t>>& groups) {
  CheckGroups("all_reduce", groups);
  return Make(Op::kAllReduce, {x}, x.shape(), CollectiveAttrs(groups, {static_cast<int64_t>(kind)}));
}

Value AllGather(const Value& x, int64_t dim, const std::vector<std::vector<int64_t>>& groups) {
  int64_t n = CheckGroups("all_gather", groups);
  if (x.rank() == 0) Fail("all_gather: the operand must have at least one dimension");
  dim = NormalizeDim(dim, x.rank());
  std::vector<int64_t> dims = x.dims();
  dims[dim] *= n;
  return Make(Op::kAllGather, {x}, Shape(x.dtype(), dims), CollectiveAttrs(groups, {dim}));
}

Value ReduceScatter(ReduceKind kind, const Value& x, int64_t dim, const std::vector<std::vector<int64_t>>& groups) {
  int64_t n = CheckGroups("reduce_scatter", groups);
  if (x.rank() == 0) Fail("reduce_scatter: the operand must have at least one dimension");
  dim = NormalizeDim(dim, x.rank());
  std::vector<int64_t> dims = x.dims();
  if (dims[dim] % n != 0) {
    Fail("reduce_scatter: dimension " + std::to_string(dim) + " of size " + std::to_string(dims[dim]) +
         " does not divide by the group size " + std::to_string(n));
  }
  dims[dim] /= n;
  return Make(Op::kReduceScatter, {x}, Shape(x.dtype(), dims),
              CollectiveAttrs(groups, {static_cast<int64_t>(kind), dim}));
}

Value AllToAll(const Value& x, int64_t split_dim, int64_t concat_dim, const std::vector<std::vector<int64_t>>& groups) {
  int64_t n = CheckGroups("all_to_all", groups);
  if (x.rank() == 0) Fail("all_to_all: the operand must have at least one dimension");
  split_dim = NormalizeDim(split_dim, x.rank());
  concat_dim = NormalizeDim(concat_dim, x.rank());
  std::vector<int64_t> dims = x.dims();
  if (dims[split_dim] % n != 0) {
    Fail("all_to_all: split dimension " + std::to_string(split_dim) + " of size " + std::to_string(dims[split_dim]) +
         " does not divide by the split count " + std::to_string(n));
  }
  dims[split_dim] /= n;
  dims[concat_dim] *= n;
  return Make(Op::kAllToAll, {x}, Shape(x.dtype(), dims), CollectiveAttrs(groups, {split_dim, concat_dim, n}));
}

Value AnnotateSharding(const Value& x, const Sharding& sharding) {
  Attrs a;
  a.s = sharding.ToString();
  return Make(Op::kSharding, {x}, x.shape(), std::move(a));
}

void DeviceData::Await() const {
  if (buffer) buffer.Await();
  for (const auto& b : shards) b.Await();
}

std::vector<Value> OptimizationBarrier(const std::vector<Value>& xs) {
  if (xs.empty()) return {};
  std::vector<Shape> shapes;
  for (const auto& x : xs) shapes.push_back(x.shape());
  NodePtr node = MakeMulti(Op::kOptimizationBarrier, xs, std::move(shapes));
  std::vector<Value> out;
  for (size_t i = 0; i < xs.size(); ++i) out.emplace_back(node, static_cast<int>(i));
  return out;
}

std::pair<Value, Value> ArgMaxWindow(const Value& x, const std::vector<int64_t>& window,
                                     const std::vector<int64_t>& strides, const std::vector<int64_t>& wdil,
                                     const std::vector<int64_t>& padding, int index_dims) {
  std::vector<int64_t> dims(x.rank());
  for (int i = 0; i < x.rank(); ++i) {
    int64_t in = x.dims()[i] + padding[2 * i] + padding[2 * i + 1];
    int64_t win = (window[i] - 1) * wdil[i] + 1;
    dims[i] = in < win ? 0 : (in - win) / strides[i] + 1;
  }
  Attrs a;
  a.ints = {window, strides, wdil, padding, {index_dims}};
  NodePtr n = MakeMulti(Op::kArgReduceWindow, {x}, {Shape(x.dtype(), dims), Shape(DType::kS64, dims)}, std::move(a));
  return {Value(n, 0), Value(n, 1)};
}

Value SelectAndScatter(const Value& operand, const Value& source, const Value& init,
                       const std::vector<int64_t>& window, const std::vector<int64_t>& strides,
                       const std::vector<int64_t>& padding) {
  Attrs a;
  a.ints = {window, strides, padding};
  return Make(Op::kSelectAndScatter, {operand, source, init}, operand.shape(), std::move(a));
}

}  // namespace txla::ir
