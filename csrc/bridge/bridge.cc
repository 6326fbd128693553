// XLA TensorImpl, dtype mapping, the boxed kernel that runs op-table rows, the CPU fallback, and
// the few kernels that move data between host and device.
#include "bridge/bridge.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/Version.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/addcdiv_meta_dispatch.h>
#include <ATen/ops/addcmul_meta_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/lerp_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <ATen/ScalarOps.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/sqrt_meta_dispatch.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "ops/op_table.h"
#include "util/metrics.h"

namespace txla::bridge {

using ir::DType;

// ------------------------------------------------------------------ dtypes
at::ScalarType ToScalarType(DType t) {
  switch (t) {
    case DType::kPred: return at::kBool;
    case DType::kS8: return at::kChar;
    case DType::kS16: return at::kShort;
    case DType::kS32: return at::kInt;
    case DType::kS64: return at::kLong;
    case DType::kU8: return at::kByte;
    case DType::kU16: return at::kUInt16;
    case DType::kU32: return at::kUInt32;
    case DType::kU64: return at::kUInt64;
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kF32: return at::kFloat;
    case DType::kF64: return at::kDouble;
    case DType::kC64: return at::kComplexFloat;
    case DType::kC128: return at::kComplexDouble;
    case DType::kF8E4M3FN: return at::kFloat8_e4m3fn;
    case DType::kF8E5M2: return at::kFloat8_e5m2;
  }
  return at::kFloat;
}

DType ToDType(at::ScalarType t) {
  switch (t) {
    case at::kBool: return DType::kPred;
    case at::kChar: return DType::kS8;
    case at::kShort: return DType::kS16;
    case at::kInt: return DType::kS32;
    case at::kLong: return DType::kS64;
    case at::kByte: return DType::kU8;
    case at::kUInt16: return DType::kU16;
    case at::kUInt32: return DType::kU32;
    case at::kUInt64: return DType::kU64;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kFloat: return DType::kF32;
    case at::kDouble: return DType::kF64;
    case at::kComplexFloat: return DType::kC64;
    case at::kComplexDouble: return DType::kC128;
    case at::kFloat8_e4m3fn: return DType::kF8E4M3FN;
    case at::kFloat8_e5m2: return DType::kF8E5M2;
    default:
      throw c10::TypeError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                           std::string("XLA tensors do not support dtype ") + c10::toString(t));
  }
}

// ------------------------------------------------------------------ TensorImpl
XLATensorImpl::~XLATensorImpl() {
  if (tensor_ && graph::ProcessExiting()) new graph::TensorPtr(std::move(tensor_));  // deliberately leaked
}

XLATensorImpl::XLATensorImpl(graph::TensorPtr t)
    : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::XLA),
                      caffe2::TypeMeta::fromScalarType(ToScalarType(t->shape().dtype)),
                      c10::Device(c10::DeviceType::XLA, static_cast<c10::DeviceIndex>(t->device()))),
      tensor_(std::move(t)) {
  set_storage_access_should_throw();
  RefreshSizes();
}

void XLATensorImpl::RefreshSizes() {
  const auto& dims = tensor_->shape().dims;
  set_sizes_contiguous(c10::IntArrayRef(dims.data(), dims.size()));
  is_non_overlapping_and_dense_ = true;
}

void XLATensorImpl::set_tensor(graph::TensorPtr t) {
  tensor_ = std::move(t);
  data_type_ = caffe2::TypeMeta::fromScalarType(ToScalarType(tensor_->shape().dtype));
  RefreshSizes();
}

c10::intrusive_ptr<c10::TensorImpl> XLATensorImpl::shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<XLATensorImpl>(tensor_);
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> XLATensorImpl::shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<XLATensorImpl>(tensor_);
  copy_tensor_metadata(this, impl.get(), std::move(version_counter), allow_tensor_metadata_change);
  return impl;
}

void XLATensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<XLATensorImpl*>(impl.get());
  TORCH_CHECK(other, "cannot shallow-copy a non-XLA tensor into an XLA tensor");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  tensor_ = other->tensor_;
}

// Under torch.inference_mode a view of a normal (non-inference) tensor is a normal tensor, as in
// eager; functionalization's wrapper takes its keys from our inner result, which, made in inference
// mode, had none. Autograd's view tracking (inference mode keeps it for normal tensors) then raised
// "Cannot set version_counter for inference tensor" on every view of a parameter or of a tensor made
// outside inference mode (w.t(), x.view(...), x[0], a KV cache's slice). The inner base does not tell
// whether its wrapper is normal (an in-place write made in inference mode replaces a normal
// wrapper's inner tensor with an inference one), so every view made in inference mode is a normal
// tensor, with a version counter of its own (autograd's view tracking, where its base is normal,
// gives it the base's). The one difference from eager: a view of an inference tensor is a normal
// tensor (is_inference() False; eager refuses an in-place write to it outside inference mode, we
// allow it).
void KeepViewNormal(const at::Tensor& view) {
  if (!view.defined() || !c10::InferenceMode::is_enabled()) return;
  if (auto* impl = dynamic_cast<XLATensorImpl*>(view.unsafeGetTensorImpl())) impl->MakeNormal();
}

// ------------------------------------------------------------------ conversions
graph::TensorPtr TryGetXla(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  auto* impl = dynamic_cast<XLATensorImpl*>(t.unsafeGetTensorImpl());
  return impl ? impl->tensor() : nullptr;
}

graph::TensorPtr XlaFromUser(const at::Tensor& t) {
  at::Tensor inner = t;
  if (at::functionalization::impl::isFunctionalTensor(t)) {
    at::functionalization::impl::sync(t);
    inner = at::functionalization::impl::from_functional_tensor(t);
  }
  auto x = TryGetXla(inner);
  if (!x) {
    throw std::invalid_argument("expected a tensor on an XLA device, got one on " +
                                (t.defined() ? t.device().str() : std::string("<undefined>")));
  }
  return x;
}

at::Tensor MakeXla(graph::TensorPtr t) {
  at::Tensor out(c10::make_intrusive<XLATensorImpl>(std::move(t)));
  // Below the Functionalize key (inside a functionalized op) we return plain tensors: the
  // Functionalize kernel wraps them. Elsewhere (factories) we wrap here.
  if (c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::Functionalize)) return out;
  return at::functionalization::impl::to_functional_tensor(out);
}

at::Tensor ToCpu(const graph::TensorPtr& t) {
  const auto& dims = t->shape().dims;
  at::Tensor cpu = at::empty(c10::IntArrayRef(dims.data(), dims.size()),
                             at::TensorOptions().dtype(ToScalarType(t->shape().dtype)).device(at::kCPU));
  try {
    graph::TensorToHost(t, cpu.data_ptr());
  } catch (const graph::IndexCheckError& e) {
    TORCH_CHECK_INDEX(false, e.what());  // IndexError, as eager
  }
  return cpu;
}

graph::TensorPtr FromCpu(const at::Tensor& cpu_in, int device) {
  at::Tensor cpu = cpu_in.contiguous();
  ir::Shape shape(ToDType(cpu.scalar_type()), std::vector<int64_t>(cpu.sizes().begin(), cpu.sizes().end()));
  return graph::TensorFromHost(cpu.data_ptr(), shape, device);
}

namespace {
struct PendingLayout {
  bool set = false;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};
thread_local PendingLayout pending_layout;
}  // namespace

void SetEagerLayout(const at::Tensor& t, at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset) {
  if (!t.defined()) return;
  at::Tensor inner = at::functionalization::impl::isFunctionalTensor(t) ? at::functionalization::impl::from_functional_tensor(t) : t;
  if (!dynamic_cast<XLATensorImpl*>(inner.unsafeGetTensorImpl()) || !inner.sizes().equals(sizes)) return;
  inner.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
}

void SetLayout(const at::Tensor& t, at::IntArrayRef sizes, at::IntArrayRef strides) {
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  if (at::functionalization::impl::isFunctionalTensor(t)) {
    at::functionalization::impl::from_functional_tensor(t).unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  }
}

void ExpectInplaceResultLayout(const at::Tensor& self) {
  pending_layout.set = true;
  pending_layout.sizes = self.sizes().vec();
  pending_layout.strides = self.strides().vec();
  pending_layout.offset = self.storage_offset();
}

void ClearInplaceResultLayout() { pending_layout.set = false; }

void ApplyInplaceResultLayout(c10::ArrayRef<c10::IValue> results) {
  if (!pending_layout.set) return;
  pending_layout.set = false;
  if (results.empty() || !results[0].isTensor()) return;
  SetEagerLayout(results[0].toTensor(), pending_layout.sizes, pending_layout.strides, pending_layout.offset);
}

// ------------------------------------------------------------------ row kernel
namespace {

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

using Layout = std::pair<std::vector<int64_t>, std::vector<int64_t>>;  // sizes, strides
using ResultLayouts = std::vector<std::optional<Layout>>;

// The layouts eager gives an op's results (see EagerResultStrides): per result, the sizes and
// strides to take, or nothing (keep contiguous).
ResultLayouts ComputeResultLayouts(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> ivs,
                                   const std::vector<c10::IValue>& results, bool pointwise, bool candidate) {
  ResultLayouts out(results.size());
  if (pointwise) {
    // Pointwise ops: eager's CPU kernels lay out their results with TensorIterator, but the meta
    // kernels of a few (div with rounding_mode='floor', floor_divide, copysign, where) return
    // contiguous results: ask TensorIterator itself, over meta operands laid out like ours (fuzz
    // seed 18455: a floor division of a transposed tensor kept contiguous strides, so .view() was
    // accepted where eager refuses it).
    try {
      at::TensorIteratorConfig cfg;
      cfg.set_check_mem_overlap(false).check_all_same_dtype(false).declare_static_dtype_and_device(at::kFloat, at::kMeta);
      cfg.add_owned_output(at::Tensor());
      size_t inputs = 0;
      for (const auto& v : ivs) {
        if (!v.isTensor() || !v.toTensor().defined()) continue;
        const at::Tensor& t = v.toTensor();
        cfg.add_owned_const_input(at::empty_strided(t.sizes(), t.strides(), at::TensorOptions().device(at::kMeta)));
        ++inputs;
      }
      if (inputs > 0) {
        at::TensorIterator iter = cfg.build();
        const at::Tensor& meta = iter.output(0);
        for (size_t i = 0; i < results.size(); ++i) {
          if (results[i].isTensor()) out[i] = Layout{meta.sizes().vec(), meta.strides().vec()};
        }
        return out;
      }
    } catch (const std::exception&) {
      // fall through to the meta kernel
    }
  }
  if (!candidate) return out;
  try {
    torch::jit::Stack st;
    for (const auto& v : ivs) {
      if (v.isTensor() && v.toTensor().defined()) {
        const at::Tensor& t = v.toTensor();
        st.emplace_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta)));
      } else if (v.isOptionalTensorList()) {  // index's indices
        c10::List<std::optional<at::Tensor>> metas;
        for (const auto& t : v.toOptionalTensorList().vec()) {
          metas.push_back(t && t->defined() ? std::optional<at::Tensor>(at::empty_strided(
                                                  t->sizes(), t->strides(), t->options().device(at::kMeta)))
                                            : std::optional<at::Tensor>());
        }
        st.emplace_back(metas);
      } else if (v.isDevice()) {
        st.emplace_back(c10::Device(c10::kMeta));  // a factory (empty.memory_format): its meta kernel
      } else {
        st.push_back(v);
      }
    }
    at::AutoDispatchSkipFunctionalize guard;
    op.callBoxed(st);
    for (size_t i = 0; i < results.size() && i < st.size(); ++i) {
      if (!results[i].isTensor() || !st[i].isTensor()) continue;
      const at::Tensor& meta = st[i].toTensor();
      if (!meta.defined() || meta.is_contiguous() || !meta.is_non_overlapping_and_dense()) continue;
      out[i] = Layout{meta.sizes().vec(), meta.strides().vec()};
    }
  } catch (const std::exception&) {
    // Layout only: keep contiguous results if the op has no meta kernel.
  }
  return out;
}

// Eager gives an op's results the memory layout of its inputs (TensorIterator keeps a transposed
// input's order), and layout decides whether reshape copies or aliases. When a result has the
// shape of a dense, non-contiguous input, run the op on meta tensors laid out like the inputs and
// take the result's strides from there. Contiguous inputs (the common case) cost nothing.
void EagerResultStrides(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> ivs,
                        const std::vector<c10::IValue>& results) {
  bool candidate = false, any_strided = false;
  for (const auto& v : ivs) {
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || t.dim() < 2 || t.is_contiguous()) continue;
    any_strided = true;  // broadcast (expanded) inputs too: TensorIterator weighs them
    if (!t.is_non_overlapping_and_dense()) continue;
    for (const auto& r : results) {
      if (r.isTensor() && r.toTensor().defined() && r.toTensor().sizes().equals(t.sizes())) candidate = true;
    }
  }
  // An explicit memory_format other than preserve/contiguous (clone, empty_like, contiguous(memory_format=
  // torch.channels_last) through clone) lays the result out in that format even for a contiguous input.
  {
    const auto& args = op.schema().arguments();
    for (size_t i = 0; i < args.size() && i < ivs.size(); ++i) {
      if (args[i].name() != "memory_format" || ivs[i].isNone() || !ivs[i].isInt()) continue;
      auto mf = static_cast<at::MemoryFormat>(ivs[i].toInt());
      if (mf != at::MemoryFormat::Preserve && mf != at::MemoryFormat::Contiguous) any_strided = candidate = true;
    }
  }
  const std::string& name = op.schema().name();
  // LAPACK-backed ops: eager's results are column-major (batched Fortran order) whatever the inputs'
  // layout (`torch.linalg.inv(a).is_contiguous()` is False; `.view(-1)` of it raises); their meta
  // kernels lay the results out that way.
  static const std::set<std::string> lapack_extra = {"aten::triangular_solve", "aten::cholesky",
                                                     "aten::cholesky_solve", "aten::cholesky_inverse",
                                                     "aten::geqrf", "aten::ormqr", "aten::lu_unpack"};
  // The fused attention kernel (and its backward) lays its results out as [B, L, H, E] transposed to
  // [B, H, L, E] whatever the inputs' layout; Dynamo's graphs are traced with that layout (a later
  // view of the transposed gradient relies on it).
  static const std::set<std::string> fixed_layout = {"aten::_scaled_dot_product_flash_attention_for_cpu",
                                                     "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
  const bool lapack = name.rfind("aten::linalg_", 0) == 0 || name.rfind("aten::_linalg_", 0) == 0 ||
                      lapack_extra.count(name) > 0 || fixed_layout.count(name) > 0;
  if (!any_strided && !lapack) return;
  if (lapack) candidate = true;
  // Advanced indexing: eager's result keeps the order of a strided input's remaining dims (a
  // transposed input indexed on its first dims gives a non-contiguous result; its .flatten() copies;
  // fuzz seed 64518), so ask the meta kernel whatever the result's shape.
  if (name == "aten::index" && any_strided) candidate = true;
  const auto& rets = op.schema().returns();
  for (const auto& ret : rets) {
    if (ret.alias_info()) return;  // in-place and out=: the destination keeps its layout
  }
  if (name.find("batch_norm") != std::string::npos && name.find("backward") == std::string::npos && !ivs.empty() &&
      ivs[0].isTensor() && !results.empty() && results[0].isTensor()) {
    // Eager's CPU batch norm writes its output in the input's suggested memory format (channels-last
    // or contiguous), not in the input's strides as its meta kernel does.
    const at::Tensor& in = ivs[0].toTensor();
    const at::Tensor& out = results[0].toTensor();
    if (in.defined() && out.defined() && out.sizes().equals(in.sizes()) &&
        dynamic_cast<XLATensorImpl*>(out.unsafeGetTensorImpl())) {
      at::Tensor probe = at::empty(in.sizes(), at::TensorOptions().device(at::kMeta).memory_format(in.suggest_memory_format()));
      out.unsafeGetTensorImpl()->set_sizes_and_strides(probe.sizes(), probe.strides());
    }
    return;
  }
  // masked_fill is tagged pointwise but eager's kernel clones its input contiguous first.
  bool pointwise = (op.hasTag(at::Tag::pointwise) || name == "aten::floor_divide") && name != "aten::masked_fill";
  for (const auto& arg : op.schema().arguments()) {
    if (arg.name() == "memory_format") pointwise = false;  // clone: its memory_format decides (meta below)
  }
  if (!pointwise && !candidate) return;
  // The layouts depend only on the op, the arguments' metadata and the results' sizes; torch's
  // Python meta kernels (empty_like, bmm, ...) cost 20-100 us a call, so each answer is remembered.
  static thread_local std::vector<int64_t> key;
  bool cacheable = EncodeMetaCall(ivs, key);
  if (cacheable) {
    key.push_back(reinterpret_cast<int64_t>(&op.schema()));
    key.push_back(pointwise ? 1 : 0);
    key.push_back(candidate ? 1 : 0);
    for (const auto& r : results) {
      if (!r.isTensor() || !r.toTensor().defined()) {
        key.push_back(-1);
        continue;
      }
      key.push_back(r.toTensor().dim());
      for (int64_t d : r.toTensor().sizes()) key.push_back(d);
    }
  }
  static std::mutex mu;
  static std::unordered_map<std::vector<int64_t>, ResultLayouts, MetaKeyHash> cache;
  ResultLayouts layouts;
  bool hit = false;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      layouts = it->second;
      hit = true;
    }
  }
  if (!hit) {
    layouts = ComputeResultLayouts(op, ivs, results, pointwise, candidate);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu);
      if (cache.size() >= 8192) cache.clear();  // bounded: a program of ever-new shapes
      cache.emplace(key, layouts);
    }
  }
  for (size_t i = 0; i < results.size() && i < layouts.size(); ++i) {
    if (!layouts[i] || !results[i].isTensor()) continue;
    const at::Tensor& out = results[i].toTensor();
    if (!out.defined() || !dynamic_cast<XLATensorImpl*>(out.unsafeGetTensorImpl())) continue;
    if (!out.sizes().equals(layouts[i]->first)) continue;
    out.unsafeGetTensorImpl()->set_sizes_and_strides(layouts[i]->first, layouts[i]->second);
  }
}

// Device indices from the user (device= arguments, .to("xla:N")) must exist: IndexError otherwise.
int CheckedDevice(int index) {
  int n = graph::DeviceCount();
  TORCH_CHECK_INDEX(index >= 0 && index < n, "XLA device index ", index,
                    " is out of range: this process has ", n, " device(s)");
  return index;
}

enum class ArgClass { kTensor, kTensorList, kOptTensorList, kScalar, kScalarList, kDType, kDevice, kString, kIntList,
                      kBoolList, kInt, kDouble, kBool, kOther };

ArgClass Classify(const c10::Argument& arg) {
  c10::TypePtr t = arg.real_type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  switch (t->kind()) {
    case c10::TypeKind::TensorType: return ArgClass::kTensor;
    case c10::TypeKind::NumberType: return ArgClass::kScalar;
    case c10::TypeKind::ScalarTypeType: return ArgClass::kDType;
    case c10::TypeKind::DeviceObjType: return ArgClass::kDevice;
    case c10::TypeKind::StringType: return ArgClass::kString;
    case c10::TypeKind::IntType: case c10::TypeKind::SymIntType: return ArgClass::kInt;
    case c10::TypeKind::FloatType: return ArgClass::kDouble;
    case c10::TypeKind::BoolType: return ArgClass::kBool;
    case c10::TypeKind::ListType: {
      auto el = t->cast<c10::ListType>()->getElementType();
      if (el->kind() == c10::TypeKind::TensorType) return ArgClass::kTensorList;
      if (auto o = el->cast<c10::OptionalType>()) {
        if (o->getElementType()->kind() == c10::TypeKind::TensorType) return ArgClass::kOptTensorList;
      }
      if (el->kind() == c10::TypeKind::IntType || el->kind() == c10::TypeKind::SymIntType) return ArgClass::kIntList;
      if (el->kind() == c10::TypeKind::BoolType) return ArgClass::kBoolList;
      if (el->kind() == c10::TypeKind::NumberType) return ArgClass::kScalarList;
      return ArgClass::kOther;
    }
    default: return ArgClass::kOther;
  }
}

ops::Scalar ToScalar(const c10::IValue& v) {
  ops::Scalar s;
  if (v.isBool()) { s.kind = ops::Scalar::kBool; s.i = v.toBool(); }
  else if (v.isInt()) { s.kind = ops::Scalar::kInt; s.i = v.toInt(); }
  else if (v.isSymInt()) { s.kind = ops::Scalar::kInt; s.i = v.toSymInt().guard_int(__FILE__, __LINE__); }
  else if (v.isDouble()) { s.kind = ops::Scalar::kFloat; s.f = v.toDouble(); }
  else if (v.isSymFloat()) { s.kind = ops::Scalar::kFloat; s.f = v.toSymFloat().guard_float(__FILE__, __LINE__); }
  else if (v.isComplexDouble()) {
    s.kind = ops::Scalar::kComplex;
    s.f = v.toComplexDouble().real();
    s.im = v.toComplexDouble().imag();
  }
  else {
    at::Scalar sc = v.toScalar();
    if (sc.isIntegral(false)) { s.kind = ops::Scalar::kInt; s.i = sc.toLong(); }
    else { s.kind = ops::Scalar::kFloat; s.f = sc.toDouble(); }
  }
  return s;
}

std::vector<int64_t> ToInts(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const auto& e : v.toListRef()) {
    if (e.isSymInt()) out.push_back(e.toSymInt().guard_int(__FILE__, __LINE__));
    else if (e.isBool()) out.push_back(e.toBool());
    else out.push_back(e.toInt());
  }
  return out;
}

// A traced op's converted arguments, from a per-thread pool: an op's `std::vector<ops::Arg>` is
// ~230 bytes per argument, so an op of five or more arguments asked glibc for a "large" (>= 1 KiB)
// block at every call, and such a request first consolidates every small block freed since (after
// a sync, the previous step's whole IR graph: ~0.8 ms in the GPT-2-style step's first op). Pooled
// argument vectors keep their capacity; every argument is reset (and its values released) when the
// op returns. Nested ops (a fallback, a row that dispatches) take the next pool entry.
struct PooledArgs {
  explicit PooledArgs(size_t n) : args(Take()) {
    if (args.args.size() < n) args.args.resize(n);
    else args.args.erase(args.args.begin() + static_cast<std::ptrdiff_t>(n), args.args.end());
  }
  ~PooledArgs() {
    for (ops::Arg& a : args.args) Reset(a);
    args.writebacks.clear();
    args.keep_checks = false;
    args.device = 0;
    args.op_name = {};
    auto& pool = Pool();
    if (pool.size() < 16) pool.push_back(std::move(args));
  }
  PooledArgs(const PooledArgs&) = delete;
  PooledArgs& operator=(const PooledArgs&) = delete;

  ops::OpArgs args;

 private:
  static std::vector<ops::OpArgs>& Pool() {
    static thread_local std::vector<ops::OpArgs> pool;
    return pool;
  }
  static ops::OpArgs Take() {
    auto& pool = Pool();
    if (pool.empty()) return ops::OpArgs();
    ops::OpArgs a = std::move(pool.back());
    pool.pop_back();
    return a;
  }
  static void Reset(ops::Arg& a) {  // a default Arg, keeping the containers' capacity
    a.kind = ops::Arg::kNone;
    a.t = ops::TensorArg();
    a.tl.clear();
    a.i = 0;
    a.f = 0;
    a.b = false;
    a.il.clear();
    a.s = ops::Scalar();
    a.sl.clear();
    a.str.clear();
    a.dtype = ops::DType::kF32;
  }
};

class RowKernel : public c10::OperatorKernel {
 public:
  explicit RowKernel(const ops::OpRow* row)
      : row_(row), allow_cpu_tensors_(row->aten == "copy"),
        shares_input_(row->aten == "alias_copy" || row->aten == "detach_copy"),
        foreach_(row->aten.rfind("_foreach_", 0) == 0),
        strided_factory_(row->aten == "empty_strided"),
        format_factory_(row->aten == "empty.memory_format"),
        wants_layout_(row->aten.rfind("as_strided", 0) == 0),
        counter_(metrics::CounterSlot("xla::" + row->aten.substr(0, row->aten.find('.')))) {
    // A *_copy view row: remember the view op, to give our results eager's strides (see ViewStrides).
    std::string base = row->aten.substr(0, row->aten.find('.'));
    std::string overload = row->aten.find('.') == std::string::npos ? "" : row->aten.substr(row->aten.find('.') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, "_copy") == 0) {
      auto h = c10::Dispatcher::singleton().findSchema({"aten::" + base.substr(0, base.size() - 5), overload});
      if (h) view_op_ = *h;
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    counter_->fetch_add(1, std::memory_order_relaxed);
    metrics::Timer tracing("LazyTracing");
    const auto& schema = op.schema();
    std::call_once(classes_once_, [&] {  // autograd may run the first call on a device thread
      for (const auto& a : schema.arguments()) classes_.push_back(Classify(a));
      op_name_ = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
      for (size_t i = 0; i < schema.arguments().size(); ++i) {
        const auto& t = schema.arguments()[i].type();
        auto opt = t->cast<c10::OptionalType>();
        if ((opt ? opt->getElementType() : t)->kind() == c10::TypeKind::GeneratorType) generator_args_.push_back(i);
      }
    });
    size_t n = schema.arguments().size();
    auto ivs = torch::jit::last(*stack, n);
    for (size_t i : generator_args_) {
      if (ivs[i].isGenerator() && ivs[i].toGenerator().defined()) {
        // An explicit (CPU) generator: draw from it on the CPU, as upstream PyTorch/XLA does, so the
        // values are eager's for that generator's state and advance it; our device RNG would ignore it.
        CpuFallback(op, stack);
        return;
      }
    }
    if (allow_cpu_tensors_ && n > 0 && ivs[0].isTensor()) {
      // copy is what functionalization runs for copy_: an inner value with a broadcast (stride 0)
      // layout is an expand view's, which eager refuses to copy into.
      TORCH_CHECK(at::has_internal_overlap(ivs[0].toTensor()) != at::MemOverlap::Yes,
                  "unsupported operation: more than one element of the written-to tensor refers to a single memory "
                  "location. Please clone() the tensor before performing the operation.");
    }
    if (shares_input_ && FastAlias(ivs, stack)) return;
    PooledArgs pooled(n);
    ops::OpArgs& args = pooled.args;
    args.op_name = op_name_;
    int device = FindDevice(ivs);
    if (foreach_ && ForeachNeedsPerTensorKernel(ivs, device)) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
      return;
    }
    args.device = device;
    std::optional<ir::ScopeGuard> scope;
    if (graph::WantScopes()) scope.emplace(graph::CurrentUserScope());
    for (size_t i = 0; i < n; ++i) Convert(ivs[i], classes_[i], device, &args.args[i]);
    std::vector<ir::Value> outs;
    size_t checks_before = graph::PendingCheckCount(device);
    try {
      outs = row_->fn(args);
    } catch (const ops::NotLowered&) {
      // This call's arguments need the CPU (value-dependent shapes, dtypes the row does not take):
      // the stack is untouched; index checks the attempt queued are the fallback's to make.
      graph::DropPendingChecks(device, checks_before);
      CpuFallback(op, stack);
      return;
    } catch (const ops::IndexError& e) {
      TORCH_CHECK_INDEX(false, args.op_name, ": ", e.what());
    } catch (const ops::NotImplementedError& e) {
      TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
    } catch (const ir::ShapeError& e) {
      // Eager raises RuntimeError for size and argument mismatches.
      std::string msg = e.what();
      if (msg.rfind(args.op_name, 0) != 0) msg = std::string(args.op_name) + ": " + msg;
      TORCH_CHECK(false, msg);
    }
    // Empty results are constants: nothing to compute (XLA rejects some ops on empty operands, such
    // as a gather from a zero-size dimension), and index checks of an op with empty results never fire.
    bool all_empty = !outs.empty();
    for (auto& v : outs) {
      if (v && v.shape().numel() == 0) v = ir::Full(0, v.shape());
      else all_empty = false;
      // an op's product rounds before another op adds to it, as in eager (ir::NoContract)
      if (ir::ContractibleProduct(v)) v = ops::NoContract(v, device);
    }
    if (all_empty && !args.keep_checks) graph::DropPendingChecks(device, checks_before);
    if (all_empty && args.keep_checks && graph::PendingCheckCount(device) > checks_before) {
      // Eager raises at this op, and reading an empty result runs no graph: run the checks now.
      std::vector<graph::TensorPtr> none;
      graph::SyncTensors(&none, graph::SyncOptions{});
      graph::RaiseFailedChecks();
    }
    for (auto& [k, v] : args.writebacks) Assign(ivs[k].toTensor(), v);
    // Arguments written by the op (out=, in-place) are returned as themselves.
    std::vector<c10::IValue> results;
    const auto& rets = schema.returns();
    for (size_t r = 0; r < rets.size(); ++r) {
      const auto& ret = rets[r];
      if (ret.type()->kind() == c10::TypeKind::ListType) {
        c10::List<at::Tensor> list;
        list.reserve(outs.size() > r ? outs.size() - r : 0);
        for (size_t k = r; k < outs.size(); ++k) list.push_back(Wrap(outs[k], device));
        results.emplace_back(std::move(list));
        break;
      }
      int aliased = AliasedArgument(schema, ret);
      if (aliased >= 0) {
        at::Tensor dst = ivs[aliased].toTensor();
        Assign(dst, outs.at(r));
        results.emplace_back(dst);
      } else if (shares_input_ && r == 0 && ivs[0].isTensor()) {
        // alias/detach: share the lazy tensor, so writes done below functionalization (running
        // statistics of native_batch_norm, copy_ from a fallback) are seen through every alias.
        auto x = TryGetXla(ivs[0].toTensor());
        results.emplace_back(x ? at::Tensor(c10::make_intrusive<XLATensorImpl>(x)) : Wrap(outs[r], device));
      } else {
        results.emplace_back(r < outs.size() ? Wrap(outs[r], device) : at::Tensor());
      }
    }
    if (view_op_) ViewStrides(ivs, results);
    else if (!results.empty()) ResultStrides(op, ivs, results);
    if (view_op_ || shares_input_) KeepNormal(results);
    if (strided_factory_) FactoryStrides(ivs, results);
    if (format_factory_) FormatFactoryStrides(ivs, results);
    ApplyInplaceResultLayout(results);
    // Eager mode materializes the results and the arguments the op updated in place outside its
    // schema (native_batch_norm's running statistics), in the one graph of this op.
    bool eager = graph::EagerMode() && !graph::InCompiledRegion();
    std::vector<c10::IValue> written;
    if (eager) for (auto& wb : args.writebacks) written.push_back(ivs[wb.first]);
    torch::jit::drop(*stack, n);
    if (eager) {
      written.insert(written.begin(), results.begin(), results.end());
      RunNow(written);
    }
    for (auto& v : results) stack->push_back(std::move(v));
  }

  // alias_copy / detach_copy of one of our tensors (functionalization regenerates every view of
  // a mutated base with them: a parameter is a detach view, so twice per parameter per in-place
  // op): the result shares the lazy tensor and takes the input's layout, which is what the general
  // path computes (the row's identity, then the view op replayed on a meta tensor), without the
  // argument conversion and the meta replay. Eager mode takes the general path (it materializes).
  bool FastAlias(c10::ArrayRef<c10::IValue> ivs, torch::jit::Stack* stack) const {
    if (ivs.size() != 1 || !ivs[0].isTensor() || (graph::EagerMode() && !graph::InCompiledRegion())) return false;
    const at::Tensor& in = ivs[0].toTensor();
    auto x = TryGetXla(in);
    if (!x || in.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
    at::Tensor out(c10::make_intrusive<XLATensorImpl>(x));
    if (out.sizes().equals(in.sizes())) {
      out.unsafeGetTensorImpl()->set_sizes_and_strides(in.sizes(), in.strides(), in.storage_offset());
    }
    std::vector<c10::IValue> results{out};
    KeepNormal(results);
    ApplyInplaceResultLayout(results);
    torch::jit::drop(*stack, ivs.size());
    stack->push_back(std::move(results[0]));
    return true;
  }

  static void KeepNormal(const std::vector<c10::IValue>& results) {
    if (!c10::InferenceMode::is_enabled()) return;
    for (const auto& v : results) {
      if (v.isTensor()) KeepViewNormal(v.toTensor());
      else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList().vec()) KeepViewNormal(t);
    }
  }

  // Functionalization's wrappers report the inner tensor's strides. For a view, those must be
  // eager's (else x.t().is_contiguous() is true and .contiguous() aliases): replay the view op on a
  // meta tensor laid out like the input and copy its sizes, strides and offset onto our results.
  void ViewStrides(c10::ArrayRef<c10::IValue> ivs, const std::vector<c10::IValue>& results) const {
    if (ivs.empty() || !ivs[0].isTensor()) return;
    const at::Tensor& in = ivs[0].toTensor();
    try {
      at::Tensor meta = at::empty_strided(in.sizes(), in.strides(), in.options().device(at::kMeta));
      if (in.storage_offset() != 0) meta = meta.as_strided(in.sizes(), in.strides(), in.storage_offset());
      torch::jit::Stack st(ivs.begin(), ivs.end());
      st[0] = meta;
      view_op_->callBoxed(st);
      std::vector<at::Tensor> metas, outs;
      for (const auto& v : st) {
        if (v.isTensor()) metas.push_back(v.toTensor());
        else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList().vec()) metas.push_back(t);
      }
      for (const auto& v : results) {
        if (v.isTensor()) outs.push_back(v.toTensor());
        else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList().vec()) outs.push_back(t);
      }
      if (metas.size() != outs.size()) return;
      for (size_t i = 0; i < outs.size(); ++i) {
        if (!outs[i].defined() || !dynamic_cast<XLATensorImpl*>(outs[i].unsafeGetTensorImpl())) continue;
        if (!metas[i].sizes().equals(outs[i].sizes())) continue;
        outs[i].unsafeGetTensorImpl()->set_sizes_and_strides(metas[i].sizes(), metas[i].strides(),
                                                            metas[i].storage_offset());
      }
    } catch (const std::exception&) {
      // Layout only: keep contiguous metadata if the view cannot be replayed.
    }
  }

  static void ResultStrides(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> ivs,
                            const std::vector<c10::IValue>& results) {
    EagerResultStrides(op, ivs, results);
  }

  // empty_strided with a dense layout (how CPU tensors' .to("xla") preserves a transposed layout):
  // the result reports the requested strides, as on CUDA.
  static void FactoryStrides(c10::ArrayRef<c10::IValue> ivs, const std::vector<c10::IValue>& results) {
    if (ivs.size() < 2 || results.empty() || !results[0].isTensor()) return;
    std::vector<int64_t> size = ToInts(ivs[0]), stride = ToInts(ivs[1]);
    if (size.size() != stride.size()) return;
    at::Tensor probe = at::empty_strided(size, stride, at::TensorOptions().device(at::kMeta));
    if (probe.is_contiguous() || !probe.is_non_overlapping_and_dense()) return;
    SetLayout(results[0].toTensor(), size, stride);
  }

  // torch.empty(..., memory_format=torch.channels_last): eager's strides for that format.
  static void FormatFactoryStrides(c10::ArrayRef<c10::IValue> ivs, const std::vector<c10::IValue>& results) {
    if (ivs.size() < 6 || results.empty() || !results[0].isTensor() || ivs[5].isNone()) return;
    at::MemoryFormat mf = ivs[5].toMemoryFormat();
    if (mf == at::MemoryFormat::Contiguous) return;
    // eager's errors too: "unsupported memory format Preserve", "required rank 5 tensor to use
    // channels_last_3d format"
    at::Tensor probe = at::empty(ToInts(ivs[0]), at::TensorOptions().device(at::kMeta).memory_format(mf));
    if (!probe.is_contiguous()) SetLayout(results[0].toTensor(), probe.sizes(), probe.strides());
  }

  // Eager mode: materialize what this op produced (compiled once per op signature, cached).
  static void RunNow(const std::vector<c10::IValue>& results) {
    std::vector<graph::TensorPtr> ts;
    auto add = [&](const at::Tensor& t) {
      at::Tensor inner = t;
      if (t.defined() && at::functionalization::impl::isFunctionalTensor(t)) {
        inner = at::functionalization::impl::from_functional_tensor(t);
      }
      if (auto x = TryGetXla(inner)) ts.push_back(x);
    };
    for (const auto& v : results) {
      if (v.isTensor()) add(v.toTensor());
      else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList().vec()) add(t);
    }
    graph::SyncOptions o;
    o.eager = true;
    graph::SyncTensors(&ts, o);
  }

 private:
  static at::Tensor Wrap(const ir::Value& v, int device) {
    if (!v) return at::Tensor();
    return MakeXla(graph::TensorFromValue(v, device));
  }

  static int AliasedArgument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
    if (!ret.alias_info() || !ret.alias_info()->isWrite()) return -1;
    const auto& args = schema.arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].alias_info() && args[i].alias_info()->isWrite() &&
          args[i].alias_info()->beforeSets() == ret.alias_info()->beforeSets()) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  static void Assign(const at::Tensor& dst, const ir::Value& v) {
    auto* impl = dynamic_cast<XLATensorImpl*>(dst.unsafeGetTensorImpl());
    TORCH_CHECK(impl, "out= tensor must be an XLA tensor");
    at::ScalarType from = ToScalarType(v.dtype()), to = dst.scalar_type();
    TORCH_CHECK(c10::canCast(from, to), "result type ", from, " can't be cast to the desired output type ", to);
    const ir::Shape& cur = impl->tensor()->shape();
    if (cur.dims == v.dims()) {
      impl->tensor()->SetPending(ops::Cast(v, cur.dtype));
    } else {
      impl->set_tensor(graph::TensorFromValue(ops::Cast(v, cur.dtype), impl->tensor()->device()));
    }
  }

  int FindDevice(c10::ArrayRef<c10::IValue> ivs) const {
    for (size_t i = 0; i < ivs.size(); ++i) {
      const auto& v = ivs[i];
      if (classes_[i] == ArgClass::kTensor && v.isTensor()) {
        if (auto x = TryGetXla(v.toTensor())) return x->device();
      } else if (classes_[i] == ArgClass::kTensorList && v.isTensorList()) {
        for (const c10::IValue& e : v.toListRef()) {
          if (auto x = TryGetXla(e.toTensor())) return x->device();
        }
      }
    }
    for (size_t i = 0; i < ivs.size(); ++i) {
      if (classes_[i] == ArgClass::kDevice && ivs[i].isDevice()) {
        auto d = ivs[i].toDevice();
        if (d.type() == c10::DeviceType::XLA) return CheckedDevice(d.has_index() ? d.index() : 0);
      }
    }
    return 0;
  }

  ops::TensorArg TensorArgOf(const at::Tensor& t, int device, bool index = false) const {
    ops::TensorArg ta;
    if (!t.defined()) return ta;
    if (auto x = TryGetXla(t)) {
      if (x->device() != device) {
        // copy_ between devices moves the data; any other op refuses, as eager does for two CUDA devices.
        TORCH_CHECK(allow_cpu_tensors_, "Expected all tensors to be on the same device, but found at least two devices, xla:",
                    device, " and xla:", x->device(), "! (in ", row_->aten, ")");
        ta.v = FromCpu(ToCpu(x), device)->GetValue();
        return ta;
      }
      ta.v = x->GetValue();
      if (wants_layout_) {  // rows that read the storage need its layout (rows_as_strided.cc)
        ta.has_layout = true;
        ta.strides = t.strides().vec();
        ta.storage_offset = t.storage_offset();
      }
      return ta;
    }
    if (index && t.device().is_cpu()) {
      // Index tensors and masks may live on the CPU, as with CUDA tensors.
      ta.v = FromCpu(t, device)->GetValue();
      return ta;
    }
    if (t.device().is_cpu() && t.dim() == 0) {
      // A CPU scalar (Python number or 0-dim tensor) joins the graph as a cached input.
      ta.wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
      DType dt = ToDType(t.scalar_type());
      at::Scalar s = t.item();
      if (s.isFloatingPoint()) ta.v = graph::ScalarValue(s.toDouble(), 0, dt, device);
      else if (s.isComplex()) {
        ta.v = graph::ScalarValue(s.toComplexDouble().real(), 0, dt, device, s.toComplexDouble().imag());
      }
      else ta.v = graph::ScalarValue(static_cast<double>(s.toLong()), s.toLong(), dt, device);
      return ta;
    }
    if (allow_cpu_tensors_ && t.device().is_cpu()) {
      ta.v = FromCpu(t, device)->GetValue();
      return ta;
    }
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, xla:", device,
                " and ", t.device(), "! (in ", row_->aten, ")");
  }

  void Convert(const c10::IValue& v, ArgClass cls, int device, ops::Arg* out) const {
    if (v.isNone()) { out->kind = ops::Arg::kNone; return; }
    switch (cls) {
      case ArgClass::kTensor:
        out->kind = ops::Arg::kTensor;
        out->t = TensorArgOf(v.toTensor(), device);
        if (!out->t.defined()) out->kind = ops::Arg::kNone;
        return;
      case ArgClass::kTensorList:
        out->kind = ops::Arg::kTensorList;
        {
          c10::ArrayRef<c10::IValue> l = v.toListRef();
          out->tl.reserve(l.size());
          for (const c10::IValue& e : l) out->tl.push_back(TensorArgOf(e.toTensor(), device));
        }
        return;
      case ArgClass::kOptTensorList:
        out->kind = ops::Arg::kOptTensorList;
        for (const auto& e : v.toListRef()) {
          out->tl.push_back(e.isNone() ? ops::TensorArg{} : TensorArgOf(e.toTensor(), device, /*index=*/true));
        }
        return;
      case ArgClass::kScalar: out->kind = ops::Arg::kScalar; out->s = ToScalar(v); return;
      case ArgClass::kScalarList:
        out->kind = ops::Arg::kScalarList;
        for (const auto& e : v.toListRef()) out->sl.push_back(ToScalar(e));
        return;
      case ArgClass::kDType: out->kind = ops::Arg::kDType; out->dtype = ToDType(v.toScalarType()); return;
      case ArgClass::kDevice: out->kind = ops::Arg::kDevice; out->i = v.toDevice().index(); return;
      case ArgClass::kString: out->kind = ops::Arg::kString; out->str = v.toStringRef(); return;
      case ArgClass::kIntList: case ArgClass::kBoolList:
        out->kind = ops::Arg::kIntList; out->il = ToInts(v); return;
      case ArgClass::kInt:
        out->kind = ops::Arg::kInt;
        out->i = v.isSymInt() ? v.toSymInt().guard_int(__FILE__, __LINE__) : v.toInt();
        return;
      case ArgClass::kDouble: out->kind = ops::Arg::kDouble; out->f = v.toDouble(); return;
      case ArgClass::kBool: out->kind = ops::Arg::kBool; out->b = v.toBool(); return;
      case ArgClass::kOther: out->kind = ops::Arg::kOther; return;
    }
  }

  // A foreach list holding tensors of other devices (a CPU scalar among xla tensors): torch's own
  // per-tensor kernel (the CPU key's, which dispatches each element by its device).
  bool ForeachNeedsPerTensorKernel(c10::ArrayRef<c10::IValue> ivs, int device) const {
    for (size_t i = 0; i < ivs.size(); ++i) {
      if (classes_[i] != ArgClass::kTensorList || !ivs[i].isTensorList()) continue;
      for (const c10::IValue& e : ivs[i].toListRef()) {
        auto x = TryGetXla(e.toTensor());
        if (!x || x->device() != device) return true;
      }
    }
    return false;
  }

  const ops::OpRow* row_;
  bool allow_cpu_tensors_;
  bool shares_input_;
  bool foreach_;
  bool strided_factory_;
  bool format_factory_;
  bool wants_layout_;
  std::atomic<int64_t>* counter_;
  std::optional<c10::OperatorHandle> view_op_;
  mutable std::vector<ArgClass> classes_;
  mutable std::vector<size_t> generator_args_;  // indices of Generator? arguments, set with classes_
  std::once_flag classes_once_;
  mutable std::string op_name_;  // "aten::add.Tensor", set with classes_
};

// ------------------------------------------------------------------ fallback and data movement
void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string& name = op.schema().name();
  if (name == "aten::as_strided_copy" || name == "aten::as_strided") {
    // A tensor that owns a dense storage (offset 0, non-overlapping and dense, e.g. moved with
    // .to() from a transposed CPU tensor, which keeps eager's strides): rebuild that storage on the
    // CPU with the tensor's strides, then read it as eager would.
    const auto& args = op.schema().arguments();
    auto ivs = torch::jit::last(*stack, args.size());
    if (ivs.size() >= 3 && ivs[0].isTensor()) {
      const at::Tensor& t = ivs[0].toTensor();
      auto x = TryGetXla(t);
      if (x && t.storage_offset() == 0 && t.is_non_overlapping_and_dense()) {
        at::Tensor logical = ToCpu(x);
        at::Tensor storage = at::empty_strided(t.sizes(), t.strides(), logical.options());
        storage.copy_(logical);
        std::vector<int64_t> size = ToInts(ivs[1]), stride = ToInts(ivs[2]);
        std::optional<int64_t> offset;
        if (ivs.size() > 3 && !ivs[3].isNone()) {
          offset = ivs[3].isSymInt() ? ivs[3].toSymInt().guard_int(__FILE__, __LINE__) : ivs[3].toInt();
        }
        at::Tensor r = storage.as_strided(size, stride, offset).clone();
        metrics::IncrementCounter(name);
        torch::jit::drop(*stack, args.size());
        stack->push_back(MakeXla(FromCpu(r, x->device())));
        return;
      }
    }
  }
  if (name.rfind("aten::as_strided", 0) == 0) {
    // On the CPU the input is a dense copy of the view: its storage layout is lost. That is only
    // the same storage for a contiguous tensor at offset 0; anything else would read wrong elements.
    const auto& args = op.schema().arguments();
    auto ivs = torch::jit::last(*stack, args.size());
    if (!ivs.empty() && ivs[0].isTensor() && TryGetXla(ivs[0].toTensor())) {
      const at::Tensor& t = ivs[0].toTensor();
      TORCH_CHECK(t.storage_offset() == 0 && t.is_contiguous(), name,
                  " on a view (storage offset ", t.storage_offset(), ", strides ", t.strides(),
                  ") of an XLA tensor is not supported: call .contiguous() (or .clone()) first");
    }
  }
  metrics::IncrementCounter(name);
  // The XLA device of the arguments: results computed on the CPU go back there (torch's fallback
  // puts them on the first tensor argument's device, which may be a CPU scalar: 7 // xla_tensor).
  int xla_device = -1;
  {
    auto ivs = torch::jit::last(*stack, op.schema().arguments().size());
    for (const auto& v : ivs) {
      if (xla_device >= 0) break;
      if (v.isTensor()) {
        if (auto x = TryGetXla(v.toTensor())) xla_device = x->device();
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList().vec()) {
          if (auto x = TryGetXla(t)) { xla_device = x->device(); break; }
        }
      }
    }
  }
  static bool debug = [] {
    const char* e = std::getenv("PT_XLA_DEBUG");
    return e && *e && std::string(e) != "0";
  }();
  if (debug) {
    std::fprintf(metrics::DebugStream(), "[PT_XLA_DEBUG] op %s is not lowered: running it on the CPU (fallback)\n",
                 op.schema().name().c_str());
  }
  std::vector<c10::IValue> inputs;  // kept for the results' layout (below)
  if (xla_device >= 0) {
    auto ivs = torch::jit::last(*stack, op.schema().arguments().size());
    inputs.assign(ivs.begin(), ivs.end());
  }
  at::native::cpu_fallback(op, stack);
  if (xla_device < 0) return;
  auto rets = torch::jit::last(*stack, op.schema().returns().size());
  for (size_t i = 0; i < rets.size(); ++i) {
    const auto& alias = op.schema().returns()[i].alias_info();
    if (alias) continue;  // an argument written in place stays where it is
    c10::IValue& v = (*stack)[stack->size() - rets.size() + i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu()) {
      v = MakeXla(FromCpu(v.toTensor(), xla_device));
    }
  }
  // The CPU computed on dense copies: give the results eager's layout for the real inputs.
  auto outs = torch::jit::last(*stack, op.schema().returns().size());
  std::vector<c10::IValue> results(outs.begin(), outs.end());
  EagerResultStrides(op, inputs, results);
  ApplyInplaceResultLayout(results);
}

void CopyInto(const at::Tensor& self, const at::Tensor& src) {
  auto dst = TryGetXla(self);
  if (dst) {
    ir::Value v;
    if (auto s = TryGetXla(src)) {
      v = s->GetValue();
      if (s->device() != dst->device()) v = FromCpu(ToCpu(s), dst->device())->GetValue();
    } else {
      v = FromCpu(src.to(self.scalar_type()), dst->device())->GetValue();
    }
    dst->SetPending(ops::BroadcastTo(ops::Cast(v, dst->shape().dtype), dst->shape().dims));
    return;
  }
  auto s = TryGetXla(src);
  TORCH_CHECK(s, "copy_: expected an XLA tensor on one side");
  self.copy_(ToCpu(s));
}

at::Tensor& Copy_(at::Tensor& self, const at::Tensor& src, bool /*non_blocking*/) {
  CopyInto(self, src);
  return self;
}

at::Tensor CopyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  CopyInto(dst, self);
  return dst;
}

at::Tensor CopyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (auto* impl = dynamic_cast<XLATensorImpl*>(dst.unsafeGetTensorImpl())) {
    if (impl->tensor()->shape().dims != std::vector<int64_t>(self.sizes().begin(), self.sizes().end())) {
      ir::Shape s(impl->tensor()->shape().dtype, std::vector<int64_t>(self.sizes().begin(), self.sizes().end()));
      impl->set_tensor(graph::TensorFromValue(ir::Full(0, s), impl->tensor()->device()));
    }
  } else if (!dst.sizes().equals(self.sizes())) {
    dst.resize_(self.sizes());
  }
  CopyInto(dst, self);
  return dst;
}

// .to()'s result layout, as eager's empty_like: memory_format=preserve keeps a dense source's strides
// (a transposed tensor stays transposed, so a later reshape copies as in eager instead of viewing);
// contiguous_format/channels_last give that format's strides.
void ApplyToCopyLayout(const at::Tensor& out, const at::Tensor& self, std::optional<at::MemoryFormat> memory_format) {
  at::MemoryFormat mf = memory_format.value_or(at::MemoryFormat::Preserve);
  if (mf == at::MemoryFormat::Contiguous || self.dim() < 2) return;
  at::Tensor probe;
  try {
    probe = at::empty_like(at::empty_strided(self.sizes(), self.strides(), at::TensorOptions().device(at::kMeta)),
                           at::TensorOptions().device(at::kMeta), mf);
  } catch (const std::exception&) {
    return;  // a format that does not fit the rank: eager's own call raises, the layout stays contiguous
  }
  if (probe.is_contiguous()) return;
  SetLayout(out, probe.sizes(), probe.strides());
}

at::Tensor ToCopy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                  std::optional<at::Device> device, std::optional<bool>, bool,
                  std::optional<at::MemoryFormat> memory_format) {
  auto x = TryGetXla(self);
  at::ScalarType st = dtype.value_or(self.scalar_type());
  if (!x) {
    // Host -> device upload (e.g. cpu_tensor.to("xla")).
    TORCH_CHECK(self.device().is_cpu(), "_to_copy: cannot copy from ", self.device(), " to an XLA device");
    int target = CheckedDevice(device && device->has_index() ? device->index() : 0);
    at::Tensor out = MakeXla(FromCpu(self.to(st), target));
    // .to() keeps a dense layout (memory_format=preserve), as for CUDA: a transposed tensor stays transposed.
    bool preserve = !memory_format || *memory_format == at::MemoryFormat::Preserve;
    if (preserve && !self.is_contiguous() && self.is_non_overlapping_and_dense()) ApplyToCopyLayout(out, self, memory_format);
    return out;
  }
  if (device && device->type() != c10::DeviceType::XLA) {
    // Downloads are contiguous (as upstream PyTorch/XLA's .cpu()); an explicit memory_format is honoured.
    at::Tensor cpu = ToCpu(x);
    if (memory_format && *memory_format != at::MemoryFormat::Preserve) {
      return cpu.to(*device, st).contiguous(*memory_format);
    }
    return cpu.to(*device, st);
  }
  int target = device && device->has_index() ? CheckedDevice(device->index()) : x->device();
  ir::Value v = x->GetValue();
  if (target != x->device()) v = FromCpu(ToCpu(x), target)->GetValue();
  at::Tensor out = MakeXla(graph::TensorFromValue(ops::Cast(v, ToDType(st)), target));
  ApplyToCopyLayout(out, self, memory_format);  // fuzz seed 15757
  return out;
}

// scaled_dot_product_attention: take PyTorch's math decomposition (matmul, softmax, dropout),
// which lowers fully; the fused CPU/CUDA kernels do not apply to XLA tensors.
int64_t FusedSdpChoice(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                       double, bool, std::optional<double>, bool) {
  return 0;  // sdp::SDPBackend::math
}

// torch.tensor(..., device="xla") ends with lift_fresh: wrap the fresh tensor for functionalization
// (an identity here would hand the user an unwrapped tensor whose views cannot work).
at::Tensor LiftFresh(const at::Tensor& self) {
  if (at::functionalization::impl::isFunctionalTensor(self)) return self;
  if (c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::Functionalize)) return self;
  return at::functionalization::impl::to_functional_tensor(self);
}

// Forward-mode AD (forward_ad.make_dual, torch.func.jvp/jacfwd/hessian) compares a tangent's layout
// with its primal's (autograd's has_same_meta), reading both storages' sizes, which an XLA tensor
// does not have ("Cannot access storage of TensorImpl"); functionalization hands us the values, each
// its own storage.
bool HasSameStorageNumel(const at::Tensor& self, const at::Tensor& other) { return self.numel() == other.numel(); }

at::Scalar LocalScalarDense(const at::Tensor& self) {
  auto x = TryGetXla(self);
  TORCH_CHECK(x, "_local_scalar_dense: expected an XLA tensor");
  // PyTorch/XLA reads a scalar through its CPU fallback: .item(), bool(t), int(t) count as
  // aten::_local_scalar_dense (in met.executed_fallback_ops() too).
  static std::atomic<int64_t>* counter = metrics::CounterSlot("aten::_local_scalar_dense");
  counter->fetch_add(1, std::memory_order_relaxed);
  return ToCpu(x).item();
}

// ------------------------------------------------------------------ device guard
struct XlaGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static thread_local c10::DeviceIndex current;
  c10::DeviceType type() const override { return c10::DeviceType::XLA; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(c10::DeviceType::XLA, current);
    current = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::XLA, current); }
  void setDevice(c10::Device d) const override { current = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current = d.index(); }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override {
    // Never starts the runtime: autograd asks for this to size its device thread pool.
    try {
      if (graph::ClientStarted()) return static_cast<c10::DeviceIndex>(graph::DeviceCount());
    } catch (...) {
    }
    int n = 8;
    if (const char* e = std::getenv("CPU_NUM_DEVICES")) n = std::max(n, std::atoi(e));
    return static_cast<c10::DeviceIndex>(n);
  }
};
thread_local c10::DeviceIndex XlaGuardImpl::current = 0;
C10_REGISTER_GUARD_IMPL(XLA, XlaGuardImpl);

// ---- Meta kernels of hot in-place ops.
// Functionalization replays every in-place op on meta tensors first (to raise eager's shape and
// dtype errors). `import torch` installs Python meta kernels for these ops, which made that replay
// about half of the tracing time of an optimizer step (measured: GPT-2-style step tracing 12.6 ms,
// 5.7 ms without the replay). We register torch's own C++ structured meta implementations
// (at::meta::*) instead: same checks, C++ speed. TXLA_CPP_INPLACE_META=0 keeps torch's.
at::Tensor& MetaAdd_(at::Tensor& s, const at::Tensor& o, const at::Scalar& a) {
  CheckNoOverlappingWrite(s, "aten::add_");
  return at::meta::add_(s, o, a);
}
at::Tensor& MetaMul_(at::Tensor& s, const at::Tensor& o) {
  CheckNoOverlappingWrite(s, "aten::mul_");
  return at::meta::mul_(s, o);
}
at::Tensor& MetaDiv_(at::Tensor& s, const at::Tensor& o) {
  CheckNoOverlappingWrite(s, "aten::div_");
  return at::meta::div_(s, o);
}
at::Tensor& MetaAddcdiv_(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  CheckNoOverlappingWrite(s, "aten::addcdiv_");
  return at::meta::addcdiv_(s, a, b, v);
}
at::Tensor& MetaAddcmul_(at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  CheckNoOverlappingWrite(s, "aten::addcmul_");
  return at::meta::addcmul_(s, a, b, v);
}
at::Tensor& MetaLerpScalar_(at::Tensor& s, const at::Tensor& e, const at::Scalar& w) {
  CheckNoOverlappingWrite(s, "aten::lerp_");
  return at::meta::lerp_(s, e, w);
}
at::Tensor& MetaLerpTensor_(at::Tensor& s, const at::Tensor& e, const at::Tensor& w) {
  CheckNoOverlappingWrite(s, "aten::lerp_");
  return at::meta::lerp_(s, e, w);
}
at::Tensor& MetaSqrt_(at::Tensor& s) {
  CheckNoOverlappingWrite(s, "aten::sqrt_");
  return at::meta::sqrt_(s);
}
// The Scalar overloads are eager's composites of the Tensor ones with a wrapped-number scalar (the
// foreach optimizers' `_foreach_mul_(ts, beta)`, `_foreach_add_(ts, eps)`, `_foreach_div_(ts, c)`):
// without these, each call reached torch's Python meta of the functional op (~40 us apiece).
at::Tensor& MetaAddScalar_(at::Tensor& s, const at::Scalar& o, const at::Scalar& a) {
  CheckNoOverlappingWrite(s, "aten::add_");
  return at::meta::add_(s, at::native::wrapped_scalar_tensor(o), a);
}
at::Tensor& MetaSubScalar_(at::Tensor& s, const at::Scalar& o, const at::Scalar& a) {
  CheckNoOverlappingWrite(s, "aten::sub_");
  return at::meta::sub_(s, at::native::wrapped_scalar_tensor(o), a);
}
at::Tensor& MetaMulScalar_(at::Tensor& s, const at::Scalar& o) {
  CheckNoOverlappingWrite(s, "aten::mul_");
  return at::meta::mul_(s, at::native::wrapped_scalar_tensor(o));
}
at::Tensor& MetaDivScalar_(at::Tensor& s, const at::Scalar& o) {
  CheckNoOverlappingWrite(s, "aten::div_");
  return at::meta::div_(s, at::native::wrapped_scalar_tensor(o));
}
// fill_ with a number has no shape or dtype rule to check (eager fills any tensor, overlapping
// memory included); torch's Python meta of fill.Scalar ran for every causal mask of
// scaled_dot_product_attention's math path. A fill of a view whose elements overlap keeps the
// view's layout (see NoteOverlappingWrite).
at::Tensor& MetaFillScalar_(at::Tensor& s, const at::Scalar&) {
  NoteOverlappingWrite(s);
  return s;
}

bool RegisterInplaceMetaKernels() {
  const char* env = std::getenv("TXLA_CPP_INPLACE_META");
  if (env && std::string(env) == "0") return false;
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}  // the override below is deliberate
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  static torch::Library* meta =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  meta->impl("add_.Tensor", TORCH_FN(MetaAdd_));
  meta->impl("mul_.Tensor", TORCH_FN(MetaMul_));
  meta->impl("div_.Tensor", TORCH_FN(MetaDiv_));
  meta->impl("addcdiv_", TORCH_FN(MetaAddcdiv_));
  meta->impl("addcmul_", TORCH_FN(MetaAddcmul_));
  meta->impl("lerp_.Scalar", TORCH_FN(MetaLerpScalar_));
  meta->impl("lerp_.Tensor", TORCH_FN(MetaLerpTensor_));
  meta->impl("sqrt_", TORCH_FN(MetaSqrt_));
  meta->impl("add_.Scalar", TORCH_FN(MetaAddScalar_));
  meta->impl("sub_.Scalar", TORCH_FN(MetaSubScalar_));
  meta->impl("mul_.Scalar", TORCH_FN(MetaMulScalar_));
  meta->impl("div_.Scalar", TORCH_FN(MetaDivScalar_));
  meta->impl("fill_.Scalar", TORCH_FN(MetaFillScalar_));
  return true;
}

}  // namespace

namespace {
std::vector<std::string>& RowsRegistered() {
  static auto* v = new std::vector<std::string>();
  return *v;
}
}  // namespace

std::vector<std::string> RegisteredRows() { return RowsRegistered(); }

void SparseUnsupported(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(),
                              ": sparse tensors are not supported on XLA devices (no sparse layout, as in "
                              "PyTorch/XLA). Sparse gradients come from nn.Embedding(sparse=True), "
                              "nn.EmbeddingBag(sparse=True) or F.embedding/F.embedding_bag(..., sparse=True): "
                              "use sparse=False");
}

// native_group_norm's composite accepts any dtype; eager's CPU kernel is built for floating types
// only (complex inputs raised nothing here; issue #7, scripts/survey_complex.py).
void GroupNormFunctionalized(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::Tensor input = torch::jit::peek(*stack, 0, op.schema().arguments().size()).toTensor();
  TORCH_CHECK_NOT_IMPLEMENTED(at::isFloatingType(input.scalar_type()), "\"GroupNormKernelImpl\" not implemented for '",
                              c10::toString(input.scalar_type()), "'");
  at::MemoryFormat mf = input.suggest_memory_format();
  at::functionalization::functionalize_op_helper(op, stack);
  // eager's output is in the input's suggested memory format (channels-last stays channels-last)
  const at::Tensor& out = torch::jit::peek(*stack, 0, op.schema().returns().size()).toTensor();
  if (mf != at::MemoryFormat::Contiguous && out.defined()) {
    at::Tensor probe = at::empty(out.sizes(), at::TensorOptions().device(at::kMeta).memory_format(mf));
    SetLayout(out, probe.sizes(), probe.strides());
  }
}

// How eager's CPU loops split 16-bit results (ops::EagerBodyOrTail): measured on x86, the
// vectorized body steps by 32 elements of a 16-bit dtype with AVX2 and AVX512 alike (the add kernel
// ATen dispatches to is its AVX2 build, two 16-lane vectors per step); other capabilities take the
// scalar path's roundings everywhere. The intra-op thread count is read at each trace.
static ops::EagerCpuLoop EagerCpuLoopNow() {
  ops::EagerCpuLoop loop;
  static const int step16 = [] {
    const std::string cap = at::get_cpu_capability();  // "AVX512", "AVX2", "DEFAULT", ...
    return cap == "AVX512" || cap == "AVX2" ? 32 : 0;
  }();
  static const bool avx512 = at::get_cpu_capability() == "AVX512";
  loop.step16 = step16;
  loop.avx512 = avx512;
  loop.threads = at::get_num_threads();
  return loop;
}

void RegisterKernels() {
  static torch::Library* lib = nullptr;
  if (lib) return;
  ops::SetEagerCpuLoopSource(&EagerCpuLoopNow);
  lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::XLA, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  // Kernels of our own, not rows: never overridden by a row variant.
  std::set<std::string> registered = {"copy_", "_copy_from", "_copy_from_and_resize", "_to_copy",
                                      "_local_scalar_dense", "_fused_sdp_choice", "lift_fresh",
                                      "_has_same_storage_numel"};
  for (const auto& row : ops::OpTable()) {
    std::string name = row.aten, overload;
    auto dot = name.find('.');
    if (dot != std::string::npos) {
      overload = name.substr(dot + 1);
      name = name.substr(0, dot);
    }
    // The functional row also serves its in-place (name_) and out= variants: their schemas mark the
    // written argument, and the kernel routes the result into it.
    std::vector<std::pair<std::string, std::string>> variants = {{name, overload}, {name + "_", overload}};
    // Foreach in-place/out= variants return nothing (the kernel could not route results into their
    // lists); functionalization turns them into the functional overload anyway.
    if (name.rfind("_foreach_", 0) == 0) variants.resize(1);
    else if (overload.empty()) {
      variants.push_back({name, "out"});
    } else {
      variants.push_back({name, overload + "_out"});
      variants.push_back({name, "out"});
    }
    for (const auto& [vname, vover] : variants) {
      auto handle = dispatcher.findSchema({"aten::" + vname, vover});
      if (!handle) continue;  // not in this torch release
      // A CompositeImplicitAutograd op decomposes above autograd; a backend kernel would hide it
      // from autograd (no gradients). Its decomposition reaches our rows anyway.
      // (silu_backward, mish_backward: eager CPU runs its one kernel, rounding bf16 once;
      // autograd_xla_overrides.cc sends XLA's calls to this row when no gradient of it is wanted,
      // its decomposition otherwise.)
      if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
          row.aten != "silu_backward" && row.aten != "mish_backward") {
        continue;
      }
      if (vname != name || vover != overload) {
        // out= "out" overloads must extend the functional schema's arguments.
        auto base = dispatcher.findSchema({"aten::" + name, overload});
        if (!base || handle->schema().arguments().size() < base->schema().arguments().size()) continue;
        // The variant must take the functional row's arguments, same names and types, first.
        bool same_prefix = true;
        const auto& a = handle->schema().arguments();
        const auto& b = base->schema().arguments();
        for (size_t i = 0; i < b.size() && same_prefix; ++i) {
          same_prefix = a[i].name() == b[i].name() && a[i].type()->str() == b[i].type()->str();
        }
        if (!same_prefix) continue;
        if (ops::FindOp(vname + (vover.empty() ? "" : "." + vover))) continue;  // has its own row
      }
      std::string full = vname + (vover.empty() ? "" : "." + vover);
      if (!registered.insert(full).second) continue;
      if (vname == name && vover == overload) RowsRegistered().push_back(row.aten);
      lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<RowKernel>(&row)));
    }
  }
  lib->impl("copy_", TORCH_FN(Copy_));
  lib->impl("_copy_from", TORCH_FN(CopyFrom));
  lib->impl("_copy_from_and_resize", TORCH_FN(CopyFromAndResize));
  lib->impl("_to_copy", TORCH_FN(ToCopy));
  lib->impl("_local_scalar_dense", TORCH_FN(LocalScalarDense));
  lib->impl("_fused_sdp_choice", TORCH_FN(FusedSdpChoice));
  lib->impl("lift_fresh", TORCH_FN(LiftFresh));
  lib->impl("_has_same_storage_numel", TORCH_FN(HasSameStorageNumel));
  // CompositeExplicitAutograd kernels that build their result through views and in-place writes run
  // below functionalization on our tensors; their views would reach the CPU fallback (a view cannot
  // fall back correctly). Run them under functionalization instead.
  for (const char* name : {"diagonal_backward", "unfold_backward", "trace_backward", "_trilinear", "native_group_norm",
                           "block_diag", "_chunk_cat", "unsafe_split.Tensor", "unsafe_split_with_sizes",
                           "mvlgamma", "affine_grid_generator", "conv_tbc", "_euclidean_dist", "_stack", "rot90"}) {
    std::string full(name), base = full.substr(0, full.find('.'));
    std::string overload = full.find('.') == std::string::npos ? "" : full.substr(full.find('.') + 1);
    if (dispatcher.findSchema({"aten::" + base, overload}) && registered.insert(full).second) {
      lib->impl(name, full == "native_group_norm"
                          ? torch::CppFunction::makeFromBoxedFunction<&GroupNormFunctionalized>()
                          : torch::CppFunction::makeFromBoxedFunction<&at::functionalization::functionalize_op_helper>());
    }
  }
  // CompositeExplicitAutograd kernels that call a CPU-only DispatchStub (eager CUDA has its own), and
  // factories that write into views of a tensor they create (functionalization does not see tensors
  // made inside a kernel without tensor inputs), and composites with a Python meta kernel (the helper
  // above would run that Python decomposition below functionalization: addr's views and
  // soft_margin_loss's resize_ reached the fallback one by one): the CPU fallback, correct and counted.
  for (const char* name : {"kaiser_window", "kaiser_window.periodic", "kaiser_window.beta", "fft_fftfreq",
                           "fft_rfftfreq", "addr", "soft_margin_loss"}) {
    std::string full(name), base = full.substr(0, full.find('.'));
    std::string overload = full.find('.') == std::string::npos ? "" : full.substr(full.find('.') + 1);
    if (dispatcher.findSchema({"aten::" + base, overload}) && registered.insert(full).second) {
      lib->impl(name, torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
    }
  }
  std::set<std::string> cpp_meta_ops;  // in-place ops whose C++ meta kernels were registered above
  if (RegisterInplaceMetaKernels()) cpp_meta_ops = {"add_.Tensor", "mul_.Tensor", "div_.Tensor", "addcdiv_", "addcmul_", "lerp_.Scalar",
                                  "lerp_.Tensor", "sqrt_", "add_.Scalar", "sub_.Scalar", "mul_.Scalar",
                                  "div_.Scalar", "fill_.Scalar"};
  RegisterFunctionalizationFixes(cpp_meta_ops);
  RegisterInplaceOverlapChecks();
  RegisterOutDtypeChecks();
  // No sparse XLA tensors (as PyTorch/XLA): the ops that would build one raise, naming the op.
  static torch::Library* sparse =
      new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::SparseXLA, __FILE__, __LINE__);
  sparse->fallback(torch::CppFunction::makeFromBoxedFunction<&SparseUnsupported>());
  static torch::Library* fallback =
      new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::XLA, __FILE__, __LINE__);
  fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
}

}  // namespace txla::bridge
