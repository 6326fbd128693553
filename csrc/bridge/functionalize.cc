// Corrections to PyTorch's functionalization pass, and eager's checks for in-place ops.
//
// 1. View inverses. Functionalization replays a write into a view onto its base through the view
//    op's inverse. Two of torch's inverses are not exact:
//      expand: base + sum_to(view - base)   (inf/NaN in the base become NaN; -0. becomes 0.; bool
//              bases raise "Subtraction ... bool"; an overlapping fill_ adds k times)
//      unfold: unfold_backward(view)         (elements no window covers become 0)
//    We register our own Functionalize kernels for these two views, identical to the generated ones
//    except for the ViewMeta's reverse: expand takes index 0 of every expanded dimension (the value
//    that was written there), unfold scatters the windows back into the base with index_put.
// 2. In-place meta checks. Functionalization runs every in-place op on meta tensors first, to raise
//    eager's errors. For many ops, the Meta kernel installed by `import torch` is a Python reference
//    that resizes `self` instead of raising (`t %= other` with a broadcast shape) and never checks
//    internal overlap. We replace the Meta kernel of in-place ops whose functional twin has the same
//    arguments: run the functional op's meta, then check shape, dtype and overlap as eager does.
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/polygamma_ops.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <set>
#include <string>

#include "bridge/bridge.h"

namespace txla::bridge {
namespace {

using at::functionalization::ViewMeta;
namespace fimpl = at::functionalization::impl;

struct ExpandMeta : ViewMeta {
  ExpandMeta(bool reapply, std::vector<int64_t> size, bool implicit)
      : ViewMeta(/*has_symbolic_inputs=*/false), reapply(reapply), size(std::move(size)), implicit(implicit) {}
  at::Tensor forward(const at::Tensor& base) override {
    return reapply ? at::_ops::expand::call(base, c10::fromIntArrayRefSlow(size), implicit)
                   : at::_ops::expand_copy::call(base, c10::fromIntArrayRefSlow(size), implicit);
  }
  at::Tensor reverse(const at::Tensor& base, const at::Tensor& mutated) override {
    // A base element appears at every index of an expanded dimension: index 0 holds what was written.
    if (mutated.numel() == 0) return at::view_copy(base, base.sizes());  // an empty view writes nothing
    at::Tensor r = mutated;
    int64_t lead = mutated.dim() - base.dim();
    for (int64_t i = 0; i < lead; ++i) r = at::select_copy(r, 0, 0);
    for (int64_t d = 0; d < base.dim(); ++d) {
      if (base.size(d) == 1 && r.size(d) != 1) r = at::slice_copy(r, d, 0, 1, 1);
    }
    return at::view_copy(r, base.sizes());
  }
  bool reapply;
  std::vector<int64_t> size;
  bool implicit;
};

struct UnfoldMeta : ViewMeta {
  UnfoldMeta(bool reapply, int64_t dim, int64_t size, int64_t step)
      : ViewMeta(/*has_symbolic_inputs=*/false), reapply(reapply), dim(dim), size(size), step(step) {}
  at::Tensor forward(const at::Tensor& base) override {
    return reapply ? at::_ops::unfold::call(base, dim, size, step) : at::_ops::unfold_copy::call(base, dim, size, step);
  }
  at::Tensor reverse(const at::Tensor& base, const at::Tensor& mutated) override {
    // view[..., i, ..., j] = base[..., i * step + j, ...]: scatter the windows back, keep the rest.
    if (mutated.numel() == 0) return at::view_copy(base, base.sizes());  // an empty view writes nothing
    if (base.dim() == 0) return at::view_copy(mutated, base.sizes());
    int64_t d = c10::maybe_wrap_dim(dim, base.dim());
    int64_t n = mutated.size(d);
    auto opts = at::TensorOptions().dtype(at::kLong).device(base.device());
    at::Tensor idx = at::add(at::unsqueeze_copy(at::mul(at::arange(n, opts), step), 1), at::unsqueeze_copy(at::arange(size, opts), 0));
    std::vector<int64_t> perm;
    for (int64_t i = 0; i <= d; ++i) perm.push_back(i);
    perm.push_back(mutated.dim() - 1);
    for (int64_t i = d + 1; i < mutated.dim() - 1; ++i) perm.push_back(i);
    at::Tensor vals = at::permute_copy(mutated, perm);  // B[:d], n, size, B[d+1:]
    c10::List<std::optional<at::Tensor>> indices;
    for (int64_t i = 0; i < d; ++i) indices.push_back(std::nullopt);
    indices.push_back(idx);
    return at::_unsafe_index_put(base, indices, vals, false);
  }
  bool reapply;
  int64_t dim, size, step;
};

// The generated Functionalize kernel of a view op, with our ViewMeta.
template <typename MetaOp, typename Make>
at::Tensor FunctionalView(const at::Tensor& self, MetaOp run_view, Make make_meta) {
  if (!fimpl::isFunctionalTensor(self)) {
    at::AutoDispatchSkipFunctionalize guard;
    return run_view(self, /*reapply=*/true);
  }
  bool reapply = fimpl::getFunctionalizationReapplyViewsTLS();
  at::Tensor inner = fimpl::from_functional_tensor(self);
  // Eager's sizes, strides and offset of the view, from the view op on a meta tensor.
  at::Tensor reference;
  {
    at::AutoDispatchSkipFunctionalize guard;
    at::Tensor m = at::empty_strided(self.sizes(), self.strides(), self.options().device(at::kMeta));
    if (self.storage_offset() != 0) m = m.as_strided(self.sizes(), self.strides(), self.storage_offset());
    reference = run_view(m, /*reapply=*/true);
  }
  at::Tensor out_inner;
  {
    at::AutoDispatchSkipFunctionalize guard;
    out_inner = run_view(inner, reapply);
  }
  std::shared_ptr<ViewMeta> meta = make_meta(reapply);
  at::Tensor out = at::detail::make_tensor<at::FunctionalTensorWrapper>(out_inner, fimpl::unsafeGetFunctionalWrapper(self), meta);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(reference.sym_sizes(), reference.sym_strides(),
                                                   reference.sym_storage_offset());
  return out;
}

at::Tensor ExpandFunctionalize(const at::Tensor& self, c10::SymIntArrayRef size_in, bool implicit) {
  std::vector<int64_t> size = C10_AS_INTARRAYREF_SLOW(size_in).vec();
  return FunctionalView(
      self,
      [&](const at::Tensor& t, bool reapply) {
        return reapply ? at::_ops::expand::call(t, size_in, implicit) : at::_ops::expand_copy::call(t, size_in, implicit);
      },
      [&](bool reapply) { return std::make_shared<ExpandMeta>(reapply, size, implicit); });
}

// polygamma_(self, n): its arguments are in another order than polygamma(n, self), so torch's
// functionalization pass finds no functional twin and refuses it. Computed as polygamma + copy_.
at::Tensor& PolygammaInplaceFunctionalize(at::Tensor& self, int64_t n) {
  at::Tensor r = at::_ops::polygamma::call(n, self);
  at::_ops::copy_::call(self, r, false);
  return self;
}

at::Tensor UnfoldFunctionalize(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  return FunctionalView(
      self,
      [&](const at::Tensor& t, bool reapply) {
        return reapply ? at::_ops::unfold::call(t, dim, size, step) : at::_ops::unfold_copy::call(t, dim, size, step);
      },
      [&](bool reapply) { return std::make_shared<UnfoldMeta>(reapply, dim, size, step); });
}

// as_strided reads the storage of its input. On a view, eager reads the base's storage, which the
// view's own value (all functionalization hands the backend) does not hold: take the view's base as
// the input instead (same storage, so the same elements), with the view's offset by default.
struct AsStridedMeta : ViewMeta {
  AsStridedMeta(bool reapply, std::vector<int64_t> size, std::vector<int64_t> stride, int64_t offset)
      : ViewMeta(/*has_symbolic_inputs=*/false), reapply(reapply), size(std::move(size)), stride(std::move(stride)),
        offset(offset) {}
  at::Tensor forward(const at::Tensor& base) override {
    return reapply ? at::_ops::as_strided::call(base, c10::fromIntArrayRefSlow(size), c10::fromIntArrayRefSlow(stride), offset)
                   : at::_ops::as_strided_copy::call(base, c10::fromIntArrayRefSlow(size),
                                                     c10::fromIntArrayRefSlow(stride), offset);
  }
  at::Tensor reverse(const at::Tensor& base, const at::Tensor& mutated) override {
    return at::_ops::as_strided_scatter::call(base, mutated, c10::fromIntArrayRefSlow(size),
                                              c10::fromIntArrayRefSlow(stride), offset);
  }
  bool reapply;
  std::vector<int64_t> size, stride;
  int64_t offset;
};

at::Tensor AsStridedFunctionalize(const at::Tensor& self, c10::SymIntArrayRef size_in, c10::SymIntArrayRef stride_in,
                                  std::optional<c10::SymInt> offset_in) {
  std::vector<int64_t> size = C10_AS_INTARRAYREF_SLOW(size_in).vec();
  std::vector<int64_t> stride = C10_AS_INTARRAYREF_SLOW(stride_in).vec();
  int64_t offset = offset_in ? offset_in->guard_int(__FILE__, __LINE__) : self.storage_offset();
  at::Tensor src = self;
  if (fimpl::isFunctionalTensor(self) && self.is_view()) {
    at::Tensor base(self._base());
    if (base.defined() && fimpl::isFunctionalTensor(base)) src = base;
  }
  if (fimpl::isFunctionalTensor(src)) fimpl::sync(src);
  return FunctionalView(
      src,
      [&](const at::Tensor& t, bool reapply) {
        return reapply ? at::_ops::as_strided::call(t, size_in, stride_in, offset)
                       : at::_ops::as_strided_copy::call(t, size_in, stride_in, offset);
      },
      [&](bool reapply) { return std::make_shared<AsStridedMeta>(reapply, size, stride, offset); });
}

// ---- Generic meta kernel of in-place ops (see 2. above).
struct InplaceMeta : c10::OperatorKernel {
  InplaceMeta(c10::OperatorHandle functional, bool check_overlap)
      : functional_(std::move(functional)), check_overlap_(check_overlap) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    size_t n = op.schema().arguments().size();
    auto ivs = torch::jit::last(*stack, n);
    at::Tensor self = ivs[0].toTensor();
    // A functional twin that is a composite of the in-place op (uniform -> uniform_) comes back here:
    // the outer call checks, the inner one only returns self (a meta op computes nothing).
    static thread_local int depth = 0;
    if (depth > 0) {
      torch::jit::drop(*stack, n);
      stack->push_back(self);
      return;
    }
    struct Depth {
      Depth() { ++depth; }
      ~Depth() { --depth; }
    } in_meta;
    if (check_overlap_) {
      TORCH_CHECK(at::has_internal_overlap(self) != at::MemOverlap::Yes,
                  "unsupported operation: more than one element of the written-to tensor refers to a single memory "
                  "location. Please clone() the tensor before performing the operation.");
    }
    torch::jit::Stack st(ivs.begin(), ivs.end());
    functional_.callBoxed(st);
    if (!st.empty() && st[0].isTensor()) {
      const at::Tensor& out = st[0].toTensor();
      TORCH_CHECK(out.sizes().equals(self.sizes()), "output with shape ", self.sizes(),
                  " doesn't match the broadcast shape ", out.sizes());
      TORCH_CHECK(c10::canCast(out.scalar_type(), self.scalar_type()), "result type ", out.scalar_type(),
                  " can't be cast to the desired output type ", self.scalar_type());
    }
    torch::jit::drop(*stack, n);
    stack->push_back(self);
  }
  c10::OperatorHandle functional_;
  bool check_overlap_;
};

void RegisterInplaceMetaChecks(torch::Library& meta, const std::set<std::string>& skip) {
  auto& dispatcher = c10::Dispatcher::singleton();
  // Ops whose eager kernels allow writing into overlapping memory, or that have their own meta.
  static const std::set<std::string> no_overlap_check = {"fill_", "zero_", "index_fill_", "masked_fill_"};
  // In-place ops that change metadata: their functional twins legitimately change the shape.
  static const std::set<std::string> metadata_ops = {"resize_", "resize_as_", "resize_as_sparse_", "set_",
                                                     "as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_",
                                                     "swapaxes_", "swapdims_", "detach_", "sparse_resize_",
                                                     "sparse_resize_and_clear_"};
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const std::string& full = name.name;
    if (full.rfind("aten::", 0) != 0 || full.back() != '_' || full.size() < 8) continue;
    std::string base = full.substr(6);
    if (base.rfind("_", 0) == 0) continue;  // private ops (_foreach_*, _index_put_impl_, ...)
    std::string key = base + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (skip.count(key) || metadata_ops.count(base)) continue;
    auto inplace = dispatcher.findOp(name);
    auto functional = dispatcher.findOp({"aten::" + base.substr(0, base.size() - 1), name.overload_name});
    if (!inplace || !functional) continue;
    if (!inplace->hasKernelForDispatchKey(c10::DispatchKey::Meta)) continue;
    if (!functional->hasKernelForDispatchKey(c10::DispatchKey::Meta) &&
        !functional->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
      continue;
    }
    const auto& a = inplace->schema().arguments();
    const auto& b = functional->schema().arguments();
    if (a.empty() || a.size() != b.size() || inplace->schema().returns().size() != 1 ||
        functional->schema().returns().size() != 1) {
      continue;
    }
    bool same = true;
    for (size_t i = 0; i < a.size() && same; ++i) same = a[i].name() == b[i].name() && a[i].type()->str() == b[i].type()->str();
    if (!same || a[0].type()->kind() != c10::TypeKind::TensorType || !a[0].alias_info() || !a[0].alias_info()->isWrite()) {
      continue;
    }
    if (functional->schema().returns()[0].type()->kind() != c10::TypeKind::TensorType) continue;
    meta.impl(key.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                               std::make_unique<InplaceMeta>(*functional, !no_overlap_check.count(base))));
  }
}

}  // namespace

void RegisterFunctionalizationFixes(const std::set<std::string>& cpp_meta_ops) {
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}  // the overrides below are deliberate
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  static torch::Library* fn =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Functionalize, __FILE__, __LINE__);
  fn->impl("expand", TORCH_FN(ExpandFunctionalize));
  fn->impl("unfold", TORCH_FN(UnfoldFunctionalize));
  fn->impl("as_strided", TORCH_FN(AsStridedFunctionalize));
  fn->impl("polygamma_", TORCH_FN(PolygammaInplaceFunctionalize));
  const char* env = std::getenv("TXLA_INPLACE_META_CHECKS");
  if (env && std::string(env) == "0") return;
  static torch::Library* meta =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  RegisterInplaceMetaChecks(*meta, cpp_meta_ops);
}

}  // namespace txla::bridge
