// The op table: one row per aten overload we lower natively. A row maps the aten schema name to a
// function from torch-free arguments to IR values. Composites of existing primitives need only a
// row; a new primitive also needs a builder (ir/) and an emitter (lowering/). Torch-free.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"

namespace txla::ops {

using ir::DType;
using ir::Value;

struct Scalar {
  enum Kind { kBool, kInt, kFloat, kComplex } kind = kFloat;
  double f = 0;
  int64_t i = 0;
  double im = 0;  // imaginary part of complex scalars
  double AsDouble() const { return kind == kInt || kind == kBool ? static_cast<double>(i) : f; }
  int64_t AsInt() const { return kind == kInt || kind == kBool ? i : static_cast<int64_t>(f); }
  DType NaturalType() const;  // bool -> pred, int -> i64, float -> f32 (default dtype), complex -> c64
};

struct TensorArg {
  Value v;
  bool wrapped_number = false;  // a Python number turned into a 0-dim tensor
  // The tensor's eager layout (strides, storage offset), filled only for rows that read storage
  // (as_strided_copy, as_strided_scatter: see rows_as_strided.cc).
  bool has_layout = false;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  bool defined() const { return static_cast<bool>(v); }
};

struct Arg {
  enum Kind { kNone, kTensor, kTensorList, kOptTensorList, kInt, kDouble, kBool, kIntList, kScalar, kScalarList,
              kString, kDType, kDevice, kOther } kind = kNone;
  TensorArg t;
  std::vector<TensorArg> tl;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::vector<int64_t> il;
  Scalar s;
  std::vector<Scalar> sl;  // Scalar[] (foreach ops' per-tensor scalars)
  std::string str;
  DType dtype = DType::kF32;
};

class OpArgs {
 public:
  std::vector<Arg> args;
  int device = 0;
  std::string_view op_name;  // the aten op ("aten::add.Tensor"); outlives the call
  // In-place updates of arguments the schema does not mark as written (legacy ops such as
  // native_batch_norm's running statistics): applied by the bridge after the row runs.
  std::vector<std::pair<size_t, Value>> writebacks;
  void WriteBack(size_t arg, Value v) { writebacks.emplace_back(arg, std::move(v)); }
  // The bridge drops the index checks of an op whose results are all empty (eager computes nothing,
  // so it checks nothing); a row sets this when eager checks its indices even then (index_select
  // of a source with zero elements).
  bool keep_checks = false;

  size_t size() const { return args.size(); }
  bool IsNone(size_t k) const { return k >= args.size() || args[k].kind == Arg::kNone; }
  const TensorArg& T(size_t k) const;
  const Value& V(size_t k) const { return T(k).v; }
  std::optional<Value> OptV(size_t k) const;
  const std::vector<TensorArg>& TL(size_t k) const;
  int64_t Int(size_t k) const;
  std::optional<int64_t> OptInt(size_t k) const;
  double Double(size_t k) const;
  std::optional<double> OptDouble(size_t k) const;
  bool Bool(size_t k, bool def = false) const;
  const std::vector<int64_t>& Ints(size_t k) const;
  std::optional<std::vector<int64_t>> OptInts(size_t k) const;
  const Scalar& S(size_t k) const;
  std::optional<Scalar> OptS(size_t k) const;
  std::optional<DType> OptDType(size_t k) const;
  const std::string& Str(size_t k) const;
  [[noreturn]] void Fail(const std::string& msg) const;
};

// Thrown by a row when this call cannot be lowered (e.g. a value-dependent output shape): the
// bridge runs the op on the CPU fallback instead. Correct, counted as aten::<name>.
struct NotLowered {};
// Thrown by a row for eager's IndexError (the bridge raises it as IndexError, not RuntimeError).
struct IndexError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Thrown by a row for eager's NotImplementedError (a dtype the eager kernel is not built for).
struct NotImplementedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using OpFn = std::function<std::vector<Value>(OpArgs&)>;
struct OpRow {
  std::string aten;  // "add.Tensor" (namespace aten implied); overload "" for the default
  OpFn fn;
};
const std::vector<OpRow>& OpTable();
const OpRow* FindOp(const std::string& aten);

// ---- Helpers shared by rows (ops/helpers.cc).
DType PromoteTypes(DType a, DType b);
// PyTorch's result_type over tensors (dim / zero-dim / wrapped priority) and scalars.
DType ResultType(const std::vector<const TensorArg*>& tensors, const std::vector<const Scalar*>& scalars = {});
ir::Dims BroadcastShapes(const ir::Dims& a, const ir::Dims& b);
Value BroadcastTo(const Value& x, const ir::Dims& dims);
Value Cast(const Value& x, DType t);
// Scalar as a graph value of type t (constant for 0/1, else a cached device input).
Value ScalarV(const Scalar& s, DType t, int device);
Value ScalarV(double v, DType t, int device);
// Elementwise binary op with broadcasting; both operands already converted to compute type.
Value Bin(ir::Op op, const Value& a, const Value& b);
Value Cmp(ir::CompareDir d, const Value& a, const Value& b);
Value Where(const Value& pred, const Value& a, const Value& b);
DType FloatOf(DType t);  // integer/bool -> f32 (default dtype), floats unchanged
Value SumDims(const Value& x, const ir::Dims& dims, bool keepdim, DType out);
Value KeepDims(const Value& reduced, const ir::Dims& in_dims, const ir::Dims& reduced_dims);
Value Matmul2d(const Value& a, const Value& b);
Value PermuteDims(const Value& x, const ir::Dims& perm);
Value Softmax(const Value& x, int64_t dim, bool log);
// Uniform [0,1) floats of shape s from the device RNG.
Value RandomUniform(const ir::Shape& s, int device);
Value RandomNormal(const ir::Shape& s, int device);
int64_t ProductOf(const ir::Dims& v);
// x[..., H, W] -> A_h x A_w^T over the last two dims (A_h: [Ho, H], A_w: [Wo, W]); resampling and
// adaptive pooling, and their gradients with the transposed matrices.
Value ResampleLast2(const Value& x, const Value& ah, const Value& aw);
// Adds an in-graph check that every index is in [lo, hi) (or equals `ignore`); a failure raises
// IndexError with `message` at the next sync or host read (see graph::AddCheck).
void CheckIndexRange(const Value& idx, int64_t lo, int64_t hi, const std::string& message, int device,
                     std::optional<int64_t> ignore = std::nullopt, bool runtime_error = false);
// Integer division and remainder: eager raises RuntimeError("ZeroDivisionError") for a zero divisor
// (at once for a scalar, at the next sync or host read for a tensor).
void CheckNonZeroDivisor(const Value& divisor, int device);
std::vector<int64_t> InferViewShape(std::vector<int64_t> shape, int64_t numel);

// How eager's CPU elementwise loops split a 16-bit float result (TensorIterator + cpu_kernel_vec):
// `threads` chunks when it has at least 32768 elements, and in each chunk a vectorized body of
// `step16` elements per step followed by a scalar tail. Some ops round differently in the two
// (add with alpha: once in the body, twice in the tail). Set by the bridge from torch's CPU
// capability and thread count (step16 = 0: no vectorized body, every element takes the scalar path).
struct EagerCpuLoop {
  int step16 = 0;
  int threads = 1;
  bool avx512 = false;  // kernels ATen also builds for AVX512 step by twice as many elements there
};
void SetEagerCpuLoopSource(EagerCpuLoop (*source)());
// The body's value where eager's loop over a contiguous result of `dims` vectorizes, the tail's
// where it does not (a select only when both occur).
// v converted to t as c10 converts a double Scalar (to float, then to bf16/f16, round to nearest
// even; float16 overflows to inf past 65504); other dtypes: v.
double RoundToFloatType(double v, DType t);
// elem_bytes: the result dtype's size (the body steps by step16 * 2 / elem_bytes elements);
// avx512_kernel: the kernel has an AVX512 build (pow's does, add's and maximum's do not).
Value EagerBodyOrTail(const std::vector<int64_t>& dims, const Value& body, const Value& tail, int elem_bytes = 2,
                      bool avx512_kernel = false);
// EagerBodyOrTail for an elementwise op whose inputs have `inputs` dims (broadcast to `dims`): eager's
// TensorIterator coalesces the trailing dims in which every input is either full or broadcast
// alike, and runs that inner loop per row; it vectorizes only when at most one input is broadcast
// (stride 0) there, else every element takes the scalar path. Rows split as EagerBodyOrTail's.
// Results of 32768 elements or more (several threads) take the body.
Value EagerLoopBodyOrTail(const std::vector<int64_t>& dims, const std::vector<std::vector<int64_t>>& inputs,
                          const Value& body, const Value& tail, int elem_bytes = 2, bool avx512_kernel = false);
// round_f32(a * b + c) correctly rounded (a fused multiply-add), float32 operands of one shape.
Value FusedMulAddF32(const Value& a, const Value& b, const Value& c);
// v minus a runtime +0.0 of its dtype (ir::NoContract): v, rounded on its own before any add it feeds.
Value NoContract(const Value& v, int device);

}  // namespace txla::ops
