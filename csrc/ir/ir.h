// The IR: immutable nodes of a small primitive set (close to StableHLO), each with its output
// shapes and a hash of (op, attributes, shapes) computed at construction. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/sharding.h"
#include "runtime/runtime.h"
#include "util/hash.h"
#include "util/small_vec.h"

namespace txla::ir {

using DType = runtime::ElementType;

bool IsFloating(DType t);   // f16, bf16, f32, f64
bool IsComplex(DType t);
// float8 (e4m3fn, e5m2): not IsFloating. Eager stores and moves them but computes almost nothing
// in them; only data-movement rows take them (ops::Float8Rows), and conversions go through f32.
inline bool IsFloat8(DType t) { return t == DType::kF8E4M3FN || t == DType::kF8E5M2; }
bool IsIntegral(DType t, bool include_bool);
bool IsUnsigned(DType t);   // u8.. and pred
const char* DTypeName(DType t);  // StableHLO spelling

// A shape's dimensions, inline up to rank 6 (util/small_vec.h): building and freeing shapes is most
// of the small heap traffic of tracing otherwise (issue #12). Converts to a std::vector where needed.
using Dims = util::SmallVec<int64_t, 6>;

struct Shape {
  DType dtype = DType::kF32;
  Dims dims;
  Shape() = default;
  Shape(DType t, Dims d) : dtype(t), dims(std::move(d)) {}
  int rank() const { return static_cast<int>(dims.size()); }
  int64_t numel() const;
  std::string ToString() const;  // tensor<2x3xf32>
  bool operator==(const Shape& o) const { return dtype == o.dtype && dims == o.dims; }
  bool operator!=(const Shape& o) const { return !(*this == o); }
};

// A buffer that lives on a device; leaves of the graph point at it.
struct DeviceData {
  runtime::Buffer buffer;  // the data (one device); empty in SPMD mode, where `shards` hold it
  Shape shape;
  int device = 0;
  DeviceData(runtime::Buffer b, Shape s, int d) : buffer(std::move(b)), shape(std::move(s)), device(d) {}
  // SPMD (torch_xla.runtime.use_spmd): one buffer per runtime device (device order), each holding
  // that device's shard as `sharding` places it (null: replicated, never annotated by the user).
  DeviceData(std::vector<runtime::Buffer> s, Shape sh, int d, ShardingPtr sharding_)
      : shape(std::move(sh)), device(d), shards(std::move(s)), sharding(std::move(sharding_)) {}
  std::vector<runtime::Buffer> shards;
  ShardingPtr sharding;
  bool IsSpmd() const { return !shards.empty(); }
  // The sharding as XLA's text ("{replicated}" when null).
  std::string ShardingText() const { return sharding ? sharding->ToString() : "{replicated}"; }
  void Await() const;  // every buffer
  // False for buffers a cache keeps for later graphs (scalar inputs): never donated.
  bool donatable = true;
  // Marked by the user (torch_xla._XLAC._set_buffer_donation): donated at the next sync that reads
  // it, even while a tensor still holds it (that tensor then has no value).
  bool user_donor = false;
  // Set once the buffer was given to an executable's output: it must never be read again.
  bool donated = false;
};
using DeviceDataPtr = std::shared_ptr<DeviceData>;

enum class Op : uint16_t {
  kDeviceData, kConstant, kIota, kConvert,
  // unary elementwise
  kNeg, kAbs, kExp, kLog, kSqrt, kRsqrt, kSin, kCos, kTan, kTanh, kLogistic, kFloor, kCeil,
  kRoundEven, kRoundAfz, kSign, kLog1p, kExpm1, kNot, kIsFinite, kErf, kErfInv, kCbrt,
  kReal, kImag,
  // binary elementwise
  kAdd, kSub, kMul, kDiv, kRem, kPow, kMax, kMin, kAnd, kOr, kXor, kAtan2,
  kShiftLeft, kShiftRightArithmetic, kShiftRightLogical,
  kCompare, kSelect, kClamp,
  // shape
  kBroadcastInDim, kReshape, kTranspose, kSlice, kConcatenate, kPad, kReverse,
  kDynamicSlice, kDynamicUpdateSlice,
  // reductions and friends
  kReduce, kArgReduce, kReduceWindow, kArgReduceWindow, kSelectAndScatter, kSort, kCumulative,
  // linear algebra / indexing
  kDotGeneral, kConvolution, kGather, kScatter,
  // randomness
  kRngBitGenerator,
  kOptimizationBarrier,
  // collectives (in-graph, across replicas)
  kAllReduce, kAllGather, kReduceScatter, kAllToAll,
  // SPMD: the operand annotated with a sharding (attrs.s, XLA's text); a custom call @Sharding
  kSharding,
  // CHLO special functions (unary: lgamma, digamma, erfc, bessel_i1e; binary: polygamma(n, x),
  // next_after, zeta(x, q)) and a same-width bitcast (attrs: none; the result dtype is the shape's)
  kLgamma, kDigamma, kErfc, kBesselI1e, kPolygamma, kNextAfter, kZeta, kBitcastConvert,
  // A host kernel (attrs.s names it, attrs.ints[0] its integer parameters): an XLA FFI custom call
  // to one of ATen's CPU kernels, registered with the CPU plugin (see HostKernels()).
  kHostCall,
  // linear algebra (attrs: see Cholesky / TriangularSolve / Eigh)
  kCholesky, kTriangularSolve, kEigh,
  // Structured control flow (control_flow.h): a region's parameter (attrs.n = its index) and
  // stablehlo.while (regions: cond, body; operands and results: the carried values).
  kParameter, kWhile,
  // round_f32(a * b + c), correctly rounded (a fused multiply-add), of float32 operands of one shape:
  // lowered to exact float64 arithmetic (see FmaF32)
  kFmaF32,
  kNumOps
};
const char* OpName(Op op);

enum class CompareDir : int64_t { kEQ = 0, kNE, kLT, kLE, kGT, kGE };
// kMaxRunning: eager's running max over a window (max pooling): starting from the init value, each
// element replaces the accumulator when it is greater or NaN, so ties keep the earlier element (the
// sign of a zero) and a NaN is kept. Order-dependent: only for reduce_window, whose reducer XLA applies
// as (accumulator, element) in window order.
enum class ReduceKind : int64_t { kSum = 0, kProd, kMax, kMin, kAnd, kOr, kMaxRunning };
enum class ArgKind : int64_t { kArgMax = 0, kArgMin };

// Attributes: a few integer lists plus a scalar, interpreted per op (see builders).
// (`ints` inline for the common single list: util/small_vec.h.)
struct Attrs {
  util::SmallVec<Dims, 1> ints;
  double f = 0;
  int64_t n = 0;
  std::string s;
};

struct Node;
using NodePtr = std::shared_ptr<const Node>;
struct Region;
using RegionPtr = std::shared_ptr<const Region>;

struct Value {
  NodePtr node;
  int index = 0;
  Value() = default;
  Value(NodePtr n, int i = 0) : node(std::move(n)), index(i) {}
  const Shape& shape() const;
  DType dtype() const { return shape().dtype; }
  const Dims& dims() const { return shape().dims; }
  int rank() const { return shape().rank(); }
  explicit operator bool() const { return node != nullptr; }
};

// A node's operands and result shapes, inline up to the common sizes (util/small_vec.h).
using Operands = util::SmallVec<Value, 3>;
using Shapes = util::SmallVec<Shape, 1>;

struct Node {
  Op op;
  Operands operands;
  Shapes shapes;
  Attrs attrs;
  DeviceDataPtr data;  // kDeviceData only
  Hash128 op_hash;     // op + attrs + output shapes (operands are hashed by the graph walk)
  std::string scope;   // debug: where it came from (aten op name, user location)
  // Control flow (kWhile): closed sub-graphs over their own parameters (see control_flow.h). Their
  // structural hash is part of attrs, hence of op_hash.
  std::vector<RegionPtr> regions;
  // True when the node depends on a region parameter (it was built while tracing a loop body):
  // such a value only exists inside its loop and can never be synced on its own.
  bool in_region = false;
  Node(Op op, Operands operands, Shapes shapes, Attrs attrs, DeviceDataPtr data = nullptr);
  // Releases operand chains iteratively: dropping a graph of a 200k-op chain must not recurse
  // once per node (that overflowed the stack).
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  std::string ToString() const;
};

inline const Shape& Value::shape() const { return node->shapes[index]; }

// Debug scope (Python source line) recorded into nodes built on this thread while set.
void SetCurrentScope(std::string scope);
const std::string& CurrentScope();
class ScopeGuard {
 public:
  explicit ScopeGuard(std::string scope) { SetCurrentScope(std::move(scope)); }
  ~ScopeGuard() { SetCurrentScope(std::string()); }
};

// Thrown for invalid shapes/arguments while building IR: reaches Python as ValueError.
class ShapeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// ---- Builders (with shape inference). All elementwise builders require equal shapes and
// dtypes: broadcasting and type promotion are explicit (ops layer).
Value MakeDeviceData(DeviceDataPtr data);
Value Constant(double v, DType t);                 // scalar constant
Value ConstantInt(int64_t v, DType t);             // exact for 64-bit integers
Value Full(double v, const Shape& s);              // broadcast scalar constant
Value Iota(const Shape& s, int64_t dim);
Value Convert(const Value& x, DType t);
// Reinterprets the bits of x as dtype t (same bit width).
Value BitcastConvert(const Value& x, DType t);
// round_f32(a * b + c) correctly rounded, float32 operands of one shape (one node; the lowering
// computes it exactly from float64 arithmetic: see the emitter).
Value FmaF32(const Value& a, const Value& b, const Value& c);
// A float value whose producer is a multiply (through shape ops), and that value minus `zero`
// (a runtime +0.0 scalar of its dtype): the exact identity, which keeps XLA:CPU from fusing the
// product into a consumer's add (one rounding where eager's separate kernels round twice).
bool ContractibleProduct(const Value& v);
Value NoContract(const Value& v, const Value& zero);
Value Unary(Op op, const Value& x);
Value Binary(Op op, const Value& a, const Value& b);
Value Compare(CompareDir dir, const Value& a, const Value& b);
Value Select(const Value& pred, const Value& on_true, const Value& on_false);
Value Clamp(const Value& lo, const Value& x, const Value& hi);
Value BroadcastInDim(const Value& x, const Dims& out_dims, const Dims& bdims);
Value Reshape(const Value& x, const Dims& dims);
Value Transpose(const Value& x, const Dims& perm);
Value Slice(const Value& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
            const std::vector<int64_t>& strides);
Value Concatenate(const std::vector<Value>& xs, int64_t dim);
Value Pad(const Value& x, const Value& pad_value, const std::vector<int64_t>& low,
          const std::vector<int64_t>& high, const std::vector<int64_t>& interior);
Value Reverse(const Value& x, const Dims& dims);
Value DynamicSlice(const Value& x, const std::vector<Value>& starts, const std::vector<int64_t>& sizes);
Value DynamicUpdateSlice(const Value& x, const Value& update, const std::vector<Value>& starts);
Value Reduce(ReduceKind kind, const Value& x, const Dims& dims);
// Returns (values, indices[i64]) reducing one dim, first occurrence wins ties.
std::pair<Value, Value> ArgReduce(ArgKind kind, const Value& x, int64_t dim);
Value ReduceWindow(ReduceKind kind, const Value& x, const Value& init, const std::vector<int64_t>& window,
                   const std::vector<int64_t>& strides, const std::vector<int64_t>& base_dilations,
                   const std::vector<int64_t>& window_dilations, const std::vector<int64_t>& padding_lo_hi);
// Cumulative sum/prod/max/min along dim (lowered to reduce_window).
Value Cumulative(ReduceKind kind, const Value& x, int64_t dim);
Value DotGeneral(const Value& a, const Value& b, const std::vector<int64_t>& lhs_batch,
                 const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                 const std::vector<int64_t>& rhs_contract, DType out);
// Gather with StableHLO's dimension numbers.
Value Gather(const Value& x, const Value& indices, const std::vector<int64_t>& offset_dims,
             const std::vector<int64_t>& collapsed_slice_dims, const std::vector<int64_t>& start_index_map,
             int64_t index_vector_dim, const std::vector<int64_t>& slice_sizes);
// Scatter; combine: 0 = replace, 1 = add, 2 = multiply, 3 = max, 4 = min (NaN wins for floats).
Value Scatter(const Value& x, const Value& indices, const Value& updates,
              const std::vector<int64_t>& update_window_dims, const std::vector<int64_t>& inserted_window_dims,
              const std::vector<int64_t>& scatter_dims_to_operand_dims, int64_t index_vector_dim, int64_t combine);
// Sort several same-shaped operands by the first along dim; returns all sorted operands.
std::vector<Value> Sort(const std::vector<Value>& xs, int64_t dim, bool descending, bool stable);
// (new_state, bits) with THREE_FRY; state is u64[2].
std::pair<Value, Value> RngBitGenerator(const Value& state, const Shape& bits_shape);
// Convolution; `dims` is StableHLO's dimension-number text, "" for [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1].
// The output shape is inferred.
Value Convolution(const Value& lhs, const Value& rhs, const std::vector<int64_t>& strides,
                  const std::vector<int64_t>& padding_lo_hi, const std::vector<int64_t>& lhs_dilation,
                  const std::vector<int64_t>& rhs_dilation, int64_t feature_groups, int64_t batch_groups,
                  const std::string& dims = "");
// Max over windows with the flat (row-major, per trailing `index_dims` dims) index of the max:
// returns (values, indices[i64]); padding cells never win.
std::pair<Value, Value> ArgMaxWindow(const Value& x, const std::vector<int64_t>& window,
                                     const std::vector<int64_t>& strides, const std::vector<int64_t>& window_dilations,
                                     const std::vector<int64_t>& padding_lo_hi, int index_dims);
Value SelectAndScatter(const Value& operand, const Value& source, const Value& init,
                       const std::vector<int64_t>& window, const std::vector<int64_t>& strides,
                       const std::vector<int64_t>& padding_lo_hi);

// Cholesky factor of each [..., n, n] matrix of a (float): lower (or upper) triangle; the other
// triangle of the result is implementation-defined (callers mask it). Not positive-definite: NaNs.
Value Cholesky(const Value& a, bool lower);
// Solves op(a) x = b (left_side) or x op(a) = b for x, a triangular [..., n, n] (only its `lower` or
// upper triangle is read), b [..., m, k] with the same batch dims; op transposes when transpose_a.
Value TriangularSolve(const Value& a, const Value& b, bool left_side, bool lower, bool unit_diagonal,
                      bool transpose_a);

// Symmetric eigendecomposition of each [..., n, n] float matrix (only its `lower` or upper triangle
// is read): (eigenvectors [..., n, n] as columns, eigenvalues [..., n] ascending). A custom call
// @Eigh that XLA's EighExpander turns into a cyclic Jacobi loop (max_iter sweeps at most, stopping
// once the off-diagonal norm is below tol times the matrix's Frobenius norm).
std::pair<Value, Value> Eigh(const Value& a, bool lower, int64_t max_iter, double tol);

// OptimizationBarrier over several values: returns the same values, which XLA may not move
// computations across.
std::vector<Value> OptimizationBarrier(const std::vector<Value>& xs);
// Cross-replica all-reduce of x over each group of replica ids (groups partition the replicas).
Value AllReduce(ReduceKind kind, const Value& x, const std::vector<std::vector<int64_t>>& groups);
// Cross-replica all-gather: each group's members' x concatenated along `dim` in group order.
Value AllGather(const Value& x, int64_t dim, const std::vector<std::vector<int64_t>>& groups);
// Cross-replica reduce-scatter: the group's reduction of x, split along `dim` in group-size
// pieces; member k gets piece k. `dim`'s size must divide by the group size.
Value ReduceScatter(ReduceKind kind, const Value& x, int64_t dim, const std::vector<std::vector<int64_t>>& groups);
// Cross-replica all-to-all: x split along `split_dim` into group-size pieces, piece k sent to
// member k, the received pieces concatenated along `concat_dim` in group order.
Value AllToAll(const Value& x, int64_t split_dim, int64_t concat_dim, const std::vector<std::vector<int64_t>>& groups);
// Collective ops' attributes: ints = replica groups followed by one list of op parameters.
std::vector<std::vector<int64_t>> CollectiveGroups(const Attrs& a);
const Dims& CollectiveParams(const Attrs& a);

// SPMD: x annotated with `sharding` (XLA's partitioner places the value so; the text is part of the
// node hash, so a new sharding is a new graph).
Value AnnotateSharding(const Value& x, const Sharding& sharding);

// Precision of dot_general and convolution nodes built from now on (PyTorch/XLA's
// set_mat_mul_precision): 0 = DEFAULT, 1 = HIGH, 2 = HIGHEST. Recorded in each node's attributes,
// so it is part of the node hash (the graph cache key) and of the StableHLO text.
// Until the user sets one, float32 (and complex64) dots and convolutions get the platform's
// precision (SetPlatformF32MatMulPrecision: HIGHEST on CUDA, where XLA's DEFAULT means TF32 while
// eager's matmuls run in full float32; DEFAULT elsewhere) and other dtypes DEFAULT.
void SetMatMulPrecision(int precision);  // throws std::invalid_argument outside 0..2
int MatMulPrecision();                   // the user's choice, DEFAULT (0) when none was made
int MatMulPrecisionSetting();            // the user's choice, -1 when none was made
void RestoreMatMulPrecisionSetting(int setting);  // a value MatMulPrecisionSetting returned
void SetPlatformF32MatMulPrecision(int precision);  // throws std::invalid_argument outside 0..2
int EffectiveMatMulPrecision(DType lhs, DType rhs);  // what a node of these operand dtypes records

// Host kernels: on the CPU plugin, large dots and convolutions run ATen's own CPU kernels (MKL /
// oneDNN, eager's exact routines) as typed XLA FFI custom calls inside the compiled executable,
// while XLA fuses everything around them. Enabled once the bridge has registered the handlers with
// the client (never on other platforms); builders below then emit kHostCall nodes, which are part
// of the graph hash like any node.
// Two kinds, switched separately: dots (HostDots) and convolutions (HostConvs).
void SetHostKernels(bool dots, bool convs);
// Which dots go to the host when HostDots(): every large one (false, TORCH_XLA_HOST_KERNELS=dot) or
// only those whose right operand is contracted along its minor dimension (true, kind "tdot": x @ W.t(),
// F.linear, q @ k.t(); XLA:CPU's Eigen dot runs these at less than half its speed on the others).
void SetHostDotsTransposedOnly(bool only);
bool HostDotsTransposedOnly();
bool HostDots();
bool HostConvs();
// Big dots (kind "bigdot", on by default): float32 dots of at least HostBigDotMinFlops()
// multiply-adds run oneDNN's matmul through ATen (at::native::mkldnn_matmul; at::mm where that is
// missing) even when HostDots() is off. Measured on the CPU plugin: the MLP step 0.78-0.81x with
// them, the GPT-2-style step (no dot that large) unchanged.
void SetHostBigDots(bool on);
bool HostBigDots();
int64_t HostBigDotMinFlops();  // 10^8; TXLA_HOST_BIG_DOT_MIN_FLOPS overrides
bool HostKernels();  // either kind
// Host reductions (kind "reduce"): large floating column sums (f32/f64, at least
// kHostReduceMinElems elements, the minor dimension kept) run ATen's sum kernel: XLA:CPU reduces in
// scalar code (and splits reductions over more than 32 elements into a reduce_window walking memory
// with a stride and a reduce), 3-10x slower than ATen's vectorized cascade.
void SetHostReductions(bool on);
bool HostReductions();
constexpr int64_t kHostReduceMinElems = 16384;
// Host batch norm (kind "norm"): training-mode batch norm forward and backward of f32/f64 run
// ATen's batch_norm_cpu / batch_norm_backward_cpu (eager's kernels: statistics, running-stat
// updates and gradients bit for bit); XLA's own form reduces in scalar code, 2-4x slower.
void SetHostNorms(bool on);
bool HostNorms();
// The custom-call target of host kernel `kernel` ("dot", "conv", "conv_bwd").
std::string HostKernelTarget(const std::string& kernel);
// A host-kernel call with explicit result shapes; returns one value per shape.
std::vector<Value> HostCall(const std::string& kernel, const std::vector<Value>& operands,
                            std::vector<Shape> shapes, std::vector<int64_t> params);

// Helpers for ops code.
std::vector<int64_t> NormalizeDims(std::vector<int64_t> dims, int rank);
int64_t NormalizeDim(int64_t dim, int rank);
std::string DimsToString(const Dims& dims);

}  // namespace txla::ir
