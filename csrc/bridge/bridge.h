// The aten bridge: the only code that includes torch headers.
#pragma once

#include <ATen/ATen.h>

#include <set>
#include <string>

#include "graph/graph.h"
#include "util/block_cache.h"

namespace txla::bridge {

// Our TensorImpl for DispatchKey::XLA: shape/dtype metadata plus a lazy tensor.
class XLATensorImpl : public c10::TensorImpl {
 public:
  explicit XLATensorImpl(graph::TensorPtr t);
  // Leaks the lazy tensor once the process is exiting (graph::ProcessExiting): torch's static
  // caches (autocast's cast cache) free their tensors after our statics are gone.
  ~XLATensorImpl() override;
  // Tensor impls come and go with every traced op: their blocks are cached per thread (see
  // util/block_cache.h) instead of going through glibc's bins each time.
  static void* operator new(size_t n) {
    return n == sizeof(XLATensorImpl) ? util::BlockCache<sizeof(XLATensorImpl)>::Get() : ::operator new(n);
  }
  static void operator delete(void* p, size_t n) noexcept {
    if (n == sizeof(XLATensorImpl)) {
      util::BlockCache<sizeof(XLATensorImpl)>::Put(p);
    } else {
      ::operator delete(p);
    }
  }
  const graph::TensorPtr& tensor() const { return tensor_; }
  void set_tensor(graph::TensorPtr t);  // also refreshes sizes

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                               bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                               bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;
  // A view made under torch.inference_mode is a normal tensor (see KeepViewNormal): the autograd
  // keys and the version counter that a TensorImpl made in inference mode lacks (functionalization's
  // wrapper takes both from us).
  void MakeNormal() {
    if (!is_inference()) return;
    key_set_ = key_set_ | c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::XLABit);
    version_counter_ = c10::VariableVersion(/*version=*/0);
  }

 private:
  void RefreshSizes();
  graph::TensorPtr tensor_;
};

at::ScalarType ToScalarType(ir::DType t);
ir::DType ToDType(at::ScalarType t);  // throws for dtypes XLA tensors cannot hold

// Under torch.inference_mode: `view` (an inner result of a view op) becomes a normal tensor.
void KeepViewNormal(const at::Tensor& view);
// Inner (unwrapped) XLA tensor -> lazy tensor; nullptr if not an XLA tensor.
graph::TensorPtr TryGetXla(const at::Tensor& t);
// Any tensor the user holds (functional wrapper or inner) -> lazy tensor; throws if not XLA.
graph::TensorPtr XlaFromUser(const at::Tensor& t);
// Lazy tensor -> at::Tensor, wrapped for functionalization unless we are below the Functionalize key.
at::Tensor MakeXla(graph::TensorPtr t);
at::Tensor ToCpu(const graph::TensorPtr& t);
graph::TensorPtr FromCpu(const at::Tensor& cpu, int device);

void RegisterKernels();
// Exact expand/unfold view inverses and eager's in-place checks (functionalize.cc); ops listed in
// cpp_meta_ops keep the C++ structured meta kernels registered for them.
void RegisterFunctionalizationFixes(const std::set<std::string>& cpp_meta_ops);
// Registers, for XLA, a kernel that runs `qualname`'s CompositeExplicitAutograd kernel under
// functionalization (non-aten, out-of-place ops with tensor arguments and no XLA kernel of their
// own). "ns::name" or "ns::name.overload"; false when the op does not qualify.
bool FunctionalizeCompositeForXla(const std::string& qualname);
// Eager's "some elements of the input tensor and the written-to tensor refer to a single memory
// location" for in-place ops on XLA tensors (inplace_overlap.cc).
void RegisterInplaceOverlapChecks();
// Eager's dtype checks of `out=` tensors (a float result into a long `out` raises), which
// functionalization skips (out_dtype_check.cc).
void RegisterOutDtypeChecks();
// The out= probe cache's key for a Python number: what of its value can decide eager's verdict.
std::string OutProbeValueClass(const c10::Scalar& s);
// In-place ops that read what they write: eager's error for broadcast overlap, and ours for any
// other overlap of `self`'s elements (eager's result would depend on its iteration order).
void CheckNoOverlappingWrite(const at::Tensor& self, const std::string& op);
// A write allowed into overlapping memory (fills): the functional op's result keeps `self`'s
// layout when its elements overlap (ExpectInplaceResultLayout), else nothing is expected.
void NoteOverlappingWrite(const at::Tensor& self);
// What a meta kernel's answer for a call can depend on, as a flat key (appended to `key` after it is
// cleared): per argument its kind, a tensor's dtype, sizes, strides, device type and flags, a
// scalar's type and exact value, lists element by element, and the default dtype. False for values
// it cannot encode (symbolic sizes, objects): such calls are not cached.
bool EncodeMetaCall(c10::ArrayRef<c10::IValue> ivs, std::vector<int64_t>& key);
struct MetaKeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept;
};
// Whether two elements of a tensor of these sizes and strides share a memory location.
bool ElementsOverlap(at::IntArrayRef sizes, at::IntArrayRef strides);
// Writes into a view whose elements overlap (allowed for fills and copies): the functional op that
// functionalization runs next gets `self`'s layout (an overlapping view keeps reporting it).
void ExpectInplaceResultLayout(const at::Tensor& self);
void ClearInplaceResultLayout();
void ApplyInplaceResultLayout(c10::ArrayRef<c10::IValue> results);
// Give an (inner) XLA tensor eager's sizes, strides and offset, if its sizes are these.
void SetEagerLayout(const at::Tensor& t, at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset);
// Set a tensor's sizes and strides, and its functional inner value's.
void SetLayout(const at::Tensor& t, at::IntArrayRef sizes, at::IntArrayRef strides);
// The op-table rows registered with the dispatcher in this torch release (by their own names).
std::vector<std::string> RegisteredRows();

}  // namespace txla::bridge
