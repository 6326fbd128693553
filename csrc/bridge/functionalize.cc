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
#include <ATen/Dispatch_v2.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/empty_strided_native.h>
#include <ATen/ops/polygamma_ops.h>
#include <ATen/ops/_amp_update_scale_ops.h>
#include <ATen/ops/_batch_norm_with_update_ops.h>
#include <ATen/ops/_fused_moving_avg_obs_fq_helper_ops.h>
#include <ATen/ops/rrelu_with_noise_ops.h>
#include <ATen/ops/_native_batch_norm_legit_ops.h>
#include <ATen/ops/resize_ops.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_set>

#include "bridge/bridge.h"

namespace txla::bridge {
namespace {

using at::functionalization::ViewMeta;
namespace fimpl = at::functionalization::impl;

// Applies fn to every tensor of the stack's values from `begin` on: tensors, tensor lists and
// optional tensor lists (the boxed kernels below wrap or unwrap their arguments and results this way).
// fn receives defined tensors only.
template <typename Fn>
void MapStackTensors(torch::jit::Stack* stack, size_t begin, Fn&& fn) {
  for (size_t i = begin; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined()) v = fn(t);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(t.defined() ? fn(t) : t);
      v = out;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> out;
      for (const auto& t : v.toOptionalTensorList().vec()) {
        out.push_back(t && t->defined() ? std::optional<at::Tensor>(fn(*t)) : t);
      }
      v = out;
    }
  }
}

// ---- Writes through views whose elements overlap (expand, unfold with step < size, as_strided).
// Eager writes such a view element after element; for the writes it allows (fills, masked fills,
// copies, index_put) a base element ends up with the value written last to any view element that
// covers it, or keeps its value when none wrote there. Functionalization hands the view's reverse
// only the view's new value, so the reverse recovers the writes as the elements whose value (bits)
// changed, and takes the last changed one per base element, in the view's row-major order.

// 0 where the view element's value is unchanged; -0. and 0. differ, NaN equals NaN.
at::Tensor Changed(const at::Tensor& now, const at::Tensor& before) {
  at::Tensor ne = at::ne(now, before);
  if (!at::isFloatingType(now.scalar_type())) return ne;
  at::Tensor both_nan = at::logical_and(at::isnan(now), at::isnan(before));
  at::Tensor zeros = at::logical_and(at::eq(now, 0), at::eq(before, 0));
  at::Tensor sign = at::ne(at::lt(at::reciprocal(now), 0), at::lt(at::reciprocal(before), 0));
  return at::logical_or(at::logical_and(ne, at::logical_not(both_nan)), at::logical_and(zeros, sign));
}

// `base` with the writes of `mutated` (a view of it whose element i is base's flat element
// map[i]) applied as eager applies them: per base element, the last changed view element wins.
at::Tensor OverlapReverse(const at::Tensor& base, const at::Tensor& mutated, const at::Tensor& map_cpu) {
  const int64_t n = mutated.numel(), b = base.numel();
  at::Tensor map = map_cpu.reshape(-1).contiguous();
  const int64_t* m = map.data_ptr<int64_t>();
  std::vector<int64_t> count(b, 0);
  int64_t width = 1;
  for (int64_t i = 0; i < n; ++i) width = std::max(width, ++count[m[i]]);
  // table[j][k]: the k-th view element (ascending) that covers base element j; n where none.
  at::Tensor table = at::full({b, width}, n, at::kLong);
  int64_t* t = table.data_ptr<int64_t>();
  std::fill(count.begin(), count.end(), 0);
  for (int64_t i = 0; i < n; ++i) t[m[i] * width + count[m[i]]++] = i;
  auto dev = base.device();
  at::Tensor dmap = map.to(dev), dtable = at::view_copy(table.to(dev), {b * width});
  at::Tensor base_flat = at::view_copy(base, {b});
  at::Tensor now = at::view_copy(mutated, {n});
  at::Tensor changed = Changed(now, at::index_select(base_flat, 0, dmap));
  at::Tensor changed_ext = at::cat({changed, at::zeros({1}, changed.options())});
  at::Tensor now_ext = at::cat({now, at::zeros({1}, now.options())});
  at::Tensor c = at::view_copy(at::index_select(changed_ext, 0, dtable), {b, width});
  at::Tensor rank = at::arange(1, width + 1, at::TensorOptions().dtype(at::kLong).device(dev));
  at::Tensor last = at::argmax(at::mul(c.to(at::kLong), rank), 1, /*keepdim=*/true);
  at::Tensor src = at::view_copy(at::gather(at::view_copy(dtable, {b, width}), 1, last), {b});
  at::Tensor out = at::where(at::any(c, 1), at::index_select(now_ext, 0, src), base_flat);
  return at::view_copy(out, base.sizes());
}

// Whether two elements of a tensor of these sizes and strides share a memory location.
bool Overlaps(at::IntArrayRef sizes, at::IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of dimensions with size > 1
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return false;
    if (sizes[i] > 1) dims.emplace_back(std::abs(strides[i]), sizes[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // largest offset reachable by the dimensions so far
  bool nested = true;
  for (auto& [stride, size] : dims) {
    if (stride == 0) return true;
    if (stride <= span) nested = false;
    span += stride * (size - 1);
  }
  if (nested) return false;
  // Interleaved strides: enumerate the offsets (rare layouts only).
  std::vector<bool> seen(span + 1, false);
  std::vector<int64_t> idx(dims.size(), 0);
  int64_t off = 0;
  while (true) {
    if (seen[off]) return true;
    seen[off] = true;
    size_t d = 0;
    for (; d < dims.size(); ++d) {
      if (++idx[d] < dims[d].second) {
        off += dims[d].first;
        break;
      }
      off -= dims[d].first * (dims[d].second - 1);
      idx[d] = 0;
    }
    if (d == dims.size()) return false;
  }
}


// Our view metas remember eager's layout of the view (set at creation) and give it to each value
// they regenerate: the functional wrapper reports its inner tensor's layout.
struct LayoutViewMeta : ViewMeta {
  LayoutViewMeta() : ViewMeta(/*has_symbolic_inputs=*/false) {}
  struct Layout {
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    bool known = false;
  } layout;
  at::Tensor Relayout(at::Tensor t) const {
    if (layout.known) SetEagerLayout(t, layout.sizes, layout.strides, layout.offset);
    return t;
  }
};

struct ExpandMeta : LayoutViewMeta {
  ExpandMeta(bool reapply, std::vector<int64_t> size, bool implicit)
      : reapply(reapply), size(std::move(size)), implicit(implicit) {}
  at::Tensor forward(const at::Tensor& base) override {
    return Relayout(reapply ? at::_ops::expand::call(base, c10::fromIntArrayRefSlow(size), implicit)
                            : at::_ops::expand_copy::call(base, c10::fromIntArrayRefSlow(size), implicit));
  }
  at::Tensor reverse(const at::Tensor& base, const at::Tensor& mutated) override {
    // A base element appears at every index of an expanded dimension: what was written to any of
    // them (the last one) is its new value.
    if (mutated.numel() == 0) return at::view_copy(base, base.sizes());  // an empty view writes nothing
    if (mutated.numel() == base.numel()) return at::view_copy(mutated, base.sizes());  // nothing repeated
    at::Tensor map = at::arange(base.numel(), at::kLong).view(base.sizes()).expand(size, implicit);
    return OverlapReverse(base, mutated, map);
  }
  bool reapply;
  std::vector<int64_t> size;
  bool implicit;
};

struct UnfoldMeta : LayoutViewMeta {
  UnfoldMeta(bool reapply, int64_t dim, int64_t size, int64_t step) : reapply(reapply), dim(dim), size(size), step(step) {}
  at::Tensor forward(const at::Tensor& base) override {
    return Relayout(reapply ? at::_ops::unfold::call(base, dim, size, step)
                            : at::_ops::unfold_copy::call(base, dim, size, step));
  }
  at::Tensor reverse(const at::Tensor& base, const at::Tensor& mutated) override {
    // view[..., i, ..., j] = base[..., i * step + j, ...]: scatter the windows back, keep the rest.
    if (mutated.numel() == 0) return at::view_copy(base, base.sizes());  // an empty view writes nothing
    if (base.dim() == 0) return at::view_copy(mutated, base.sizes());
    int64_t d = c10::maybe_wrap_dim(dim, base.dim());
    int64_t n = mutated.size(d);
    if (step < size && n > 1) {  // overlapping windows
      return OverlapReverse(base, mutated, at::arange(base.numel(), at::kLong).view(base.sizes()).unfold(dim, size, step));
    }
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
  KeepViewNormal(out_inner);
  auto meta = make_meta(reapply);
  at::Tensor out = at::detail::make_tensor<at::FunctionalTensorWrapper>(out_inner, fimpl::unsafeGetFunctionalWrapper(self), meta);
  out.unsafeGetTensorImpl()->set_sizes_and_strides(reference.sym_sizes(), reference.sym_strides(),
                                                   reference.sym_storage_offset());
  // The wrapper reports its inner tensor's layout: give the inner tensor eager's (in-place checks
  // read it), and remember it for the view's regenerations.
  SetEagerLayout(out_inner, reference.sizes(), reference.strides(), reference.storage_offset());
  meta->layout = {reference.sizes().vec(), reference.strides().vec(), reference.storage_offset(), true};
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

// `_native_batch_norm_legit.out` and `_batch_norm_with_update.out` write their running stats (positional
// arguments) and their outs (keyword-only). torch's generated Functionalize kernels assign the
// functional op's results, which come outs first and running stats last, to the written arguments in
// schema order, running stats first: `out` received save_invstd, `running_mean` the normalized
// input (issue #7, found by the out= survey). Computed as the in-place-on-stats op + copies instead.
void CopyOut(at::Tensor& out, const at::Tensor& r) {
  if (out.sym_sizes() != r.sym_sizes()) at::_ops::resize_::call(out, r.sym_sizes(), std::nullopt);
  at::_ops::copy_::call(out, r, false);
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> NativeBatchNormLegitOutFunctionalize(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, bool training, double momentum, double eps, at::Tensor& out,
    at::Tensor& save_mean, at::Tensor& save_invstd) {
  auto r = at::_ops::_native_batch_norm_legit::call(input, weight, bias, running_mean, running_var, training,
                                                     momentum, eps);
  CopyOut(out, std::get<0>(r));
  CopyOut(save_mean, std::get<1>(r));
  CopyOut(save_invstd, std::get<2>(r));
  return {out, save_mean, save_invstd};
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&> BatchNormWithUpdateOutFunctionalize(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, double momentum, double eps, at::Tensor& out,
    at::Tensor& save_mean, at::Tensor& save_invstd, at::Tensor& reserve) {
  auto r = at::_ops::_batch_norm_with_update::call(input, weight, bias, running_mean, running_var, momentum, eps);
  CopyOut(out, std::get<0>(r));
  CopyOut(save_mean, std::get<1>(r));
  CopyOut(save_invstd, std::get<2>(r));
  CopyOut(reserve, std::get<3>(r));
  return {out, save_mean, save_invstd, reserve};
}

// The same ordering bug in the other out= overloads that also write a positional argument
// (every such aten schema was listed: the fused optimizers' out= overloads fail inside torch's
// functionalization or mix up their results, see OutFromFirstResult below): `out` received
// growth_tracker's new value / the noise, and the other way round.
at::Tensor& AmpUpdateScaleOutFunctionalize(const at::Tensor& self, at::Tensor& growth_tracker,
                                           const at::Tensor& found_inf, double growth, double backoff,
                                           int64_t interval, at::Tensor& out) {
  // Eager's own out= kernel (generated from the functional op) writes `out` only and leaves
  // growth_tracker as it was, although the schema marks it written: matched.
  auto r = at::_ops::_amp_update_scale::call(self, growth_tracker, found_inf, growth, backoff, interval);
  CopyOut(out, std::get<0>(r));
  return out;
}

at::Tensor& RreluWithNoiseOutFunctionalize(const at::Tensor& self, at::Tensor& noise, const at::Scalar& lower,
                                           const at::Scalar& upper, bool training,
                                           std::optional<at::Generator> generator, at::Tensor& out) {
  auto r = at::_ops::rrelu_with_noise_functional::call(self, noise, lower, upper, training, generator);
  CopyOut(out, std::get<0>(r));
  at::_ops::copy_::call(noise, std::get<1>(r), false);
  return out;
}

std::tuple<at::Tensor&, at::Tensor&> FusedMovingAvgObsFqHelperOutFunctionalize(
    const at::Tensor& self, const at::Tensor& observer_on, const at::Tensor& fake_quant_on, at::Tensor& running_min,
    at::Tensor& running_max, at::Tensor& scale, at::Tensor& zero_point, double averaging_const, int64_t quant_min,
    int64_t quant_max, int64_t ch_axis, bool per_row_fake_quant, bool symmetric_quant, at::Tensor& out0,
    at::Tensor& out1) {
  auto r = at::_ops::_fused_moving_avg_obs_fq_helper_functional::call(
      self, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const, quant_min,
      quant_max, ch_axis, per_row_fake_quant, symmetric_quant);
  CopyOut(out0, std::get<0>(r));
  CopyOut(out1, std::get<1>(r));
  // As for _amp_update_scale.out: eager's generated out= kernel writes the outs only (the running
  // min/max, scale and zero point keep their values): matched.
  return {out0, out1};
}

// The fused optimizers' out= overloads (`_fused_{adam,adamw,sgd,adagrad}.out` / `.tensor_lr_out`)
// and `_amp_foreach_non_finite_check_and_unscale.out`: torch's generated Functionalize kernels
// either raise its internal assert ("mutating a non-functional tensor") or hand the results to the
// written arguments in the wrong order (`out` received the gradients, the optimizer state the new
// parameters). Eager's out= kernels (generated from the functional op) write `out` only, with the
// functional op's first result, and leave every other argument as it was: done the same way here.
class OutFromFirstResult final : public c10::OperatorKernel {
 public:
  explicit OutFromFirstResult(c10::OperatorHandle functional) : functional_(std::move(functional)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    c10::IValue out_arg = std::move(stack->back());
    stack->pop_back();
    functional_.callBoxed(stack);
    std::vector<at::Tensor> results = std::move(stack->front()).toTensorVector();
    stack->clear();
    c10::List<at::Tensor> out = out_arg.toTensorList();
    TORCH_CHECK(out.size() == results.size(), op.schema().name(), ".", op.schema().overload_name(),
                ": out has ", out.size(), " tensors but the op gives ", results.size());
    for (size_t i = 0; i < results.size(); ++i) {
      at::Tensor o = out.get(i);
      TORCH_CHECK(o.scalar_type() == results[i].scalar_type(), "Expected out tensor to have dtype ",
                  results[i].scalar_type(), ", but got ", o.scalar_type(), " instead");
      CopyOut(o, results[i]);
    }
  }

 private:
  c10::OperatorHandle functional_;
};

// Their in-place forms (`_fused_adam_`, ...) with an empty list argument (Adam without amsgrad) hit
// the same internal assert, and `_fused_sgd_` / `_fused_adagrad_` have no meta kernel for
// functionalization to call: computed as the functional op, whose results come in the order of the
// written arguments, copied back into them.
class InplaceFromFunctional final : public c10::OperatorKernel {
 public:
  explicit InplaceFromFunctional(c10::OperatorHandle functional) : functional_(std::move(functional)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& args = op.schema().arguments();
    std::vector<c10::IValue> written;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].alias_info() && args[i].alias_info()->isWrite()) written.push_back((*stack)[stack->size() - args.size() + i]);
    }
    functional_.callBoxed(stack);
    TORCH_CHECK(stack->size() == written.size(), op.schema().name(), ": ", stack->size(), " results for ",
                written.size(), " written arguments");
    for (size_t i = 0; i < written.size(); ++i) {
      std::vector<at::Tensor> results = (*stack)[i].toTensorVector();
      c10::List<at::Tensor> dst = written[i].toTensorList();
      TORCH_CHECK(dst.size() == results.size(), op.schema().name(), ": ", results.size(), " results for ",
                  dst.size(), " tensors");
      for (size_t j = 0; j < results.size(); ++j) {
        at::Tensor d = dst.get(j);
        at::_ops::copy_::call(d, results[j], false);
      }
    }
    stack->clear();
  }

 private:
  c10::OperatorHandle functional_;
};

void RegisterOutFromFirstResult(torch::Library& fn) {
  const std::pair<const char*, const char*> ops[] = {
      {"_fused_adam", "out"},   {"_fused_adam", "tensor_lr_out"},   {"_fused_adamw", "out"},
      {"_fused_adamw", "tensor_lr_out"}, {"_fused_sgd", "out"},    {"_fused_sgd", "tensor_lr_out"},
      {"_fused_adagrad", "out"}, {"_fused_adagrad", "tensor_lr_out"},
      {"_amp_foreach_non_finite_check_and_unscale", "out"}};
  for (const auto& [name, overload] : ops) {
    std::string full = std::string("aten::") + name;
    std::string functional_overload = std::string(overload) == "out" ? "" : "tensor_lr";
    auto functional = c10::Dispatcher::singleton().findSchema({full, functional_overload});
    auto out_op = c10::Dispatcher::singleton().findSchema({full, overload});
    if (!functional || !out_op) continue;  // an op this torch does not have
    fn.impl((std::string(name) + "." + overload).c_str(),
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OutFromFirstResult>(*functional)));
    if (std::string(name).rfind("_fused_", 0) != 0) continue;
    auto inplace = c10::Dispatcher::singleton().findSchema({full + "_", functional_overload});
    if (!inplace) continue;
    fn.impl((std::string(name) + "_" + (functional_overload.empty() ? "" : "." + functional_overload)).c_str(),
            torch::CppFunction::makeFromBoxedFunctor(std::make_unique<InplaceFromFunctional>(*functional)));
  }
}

// Direct calls of the view ops' *_copy forms (torch.permute_copy, torch.expand_copy, ...): eager
// returns new contiguous tensors. Our rows give them the view's strides, which is right when
// functionalization lowers a view to them (below this key); a direct call reaches this key first, so
// its results are made contiguous here. Otherwise `.view()` refused (or reshape copied) where eager
// views, and writes through the reshape missed the result.
void CopyOfViewFunctionalize(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t nargs = op.schema().arguments().size(), nret = op.schema().returns().size();
  MapStackTensors(stack, stack->size() - nargs, [](const at::Tensor& t) {
    if (!fimpl::isFunctionalTensor(t)) return t;
    fimpl::sync(t);
    return fimpl::from_functional_tensor(t);
  });
  {
    at::AutoDispatchSkipFunctionalize guard;
    op.callBoxed(stack);
  }
  MapStackTensors(stack, stack->size() - nret, [](const at::Tensor& t) {
    if (!t.is_contiguous()) t.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), c10::contiguous_strides(t.sizes()));
    return fimpl::to_functional_tensor(t);
  });
}

void RegisterCopyOfViewKernels(torch::Library& fn) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const std::string& n = name.name;
    if (n.rfind("aten::", 0) != 0 || n.size() < 11 || n.compare(n.size() - 5, 5, "_copy") != 0) continue;
    if (name.overload_name.find("out") != std::string::npos) continue;
    auto view = dispatcher.findSchema({n.substr(0, n.size() - 5), name.overload_name});
    if (!view || view->schema().returns().empty() || !view->schema().returns()[0].alias_info()) continue;
    std::string key = n.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    fn.impl(key.c_str(), torch::CppFunction::makeFromBoxedFunction<&CopyOfViewFunctionalize>());
  }
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
struct AsStridedMeta : LayoutViewMeta {
  AsStridedMeta(bool reapply, std::vector<int64_t> size, std::vector<int64_t> stride, int64_t offset)
      : reapply(reapply), size(std::move(size)), stride(std::move(stride)), offset(offset) {}
  at::Tensor forward(const at::Tensor& base) override {
    return Relayout(reapply ? at::_ops::as_strided::call(base, c10::fromIntArrayRefSlow(size),
                                                         c10::fromIntArrayRefSlow(stride), offset)
                            : at::_ops::as_strided_copy::call(base, c10::fromIntArrayRefSlow(size),
                                                              c10::fromIntArrayRefSlow(stride), offset));
  }
  at::Tensor reverse(const at::Tensor& base, const at::Tensor& mutated) override {
    if (mutated.numel() > 0 && Overlaps(size, stride)) {
      at::Tensor map = at::arange(base.numel(), at::kLong).as_strided(size, stride, offset);
      return OverlapReverse(base, mutated, map);
    }
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

enum class OverlapRule {
  kNone,       // writes into overlapping memory are allowed (fills)
  kEager,      // eager's check only: no broadcast (stride 0) overlap
  kReadWrite,  // reads what it writes: no overlap at all (see CheckNoOverlappingWrite)
};

// ---- Generic meta kernel of in-place ops (see 2. above).

}  // namespace

// What a meta check of an in-place op can depend on, as a flat list of numbers: per argument its
// kind, a tensor's dtype, sizes, strides, device type and flags (a wrapped number promotes like a
// Python scalar), a scalar's type and exact value, lists element by element, plus the default dtype
// (Python floats promote to it). Two calls with equal keys get the same answer from the functional
// twin's meta kernel, which sees nothing else. Returns false for a value it cannot encode (symbolic
// sizes, objects): such calls are checked every time.
bool EncodeMetaCall(c10::ArrayRef<c10::IValue> ivs, std::vector<int64_t>& key) {
  key.clear();
  key.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  auto tensor = [&](const at::Tensor& t) -> bool {
    if (!t.defined()) {
      key.push_back(-1);
      return true;
    }
    if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(static_cast<int64_t>(t.device().type()));
    key.push_back((t.unsafeGetTensorImpl()->is_wrapped_number() ? 1 : 0) | (t.is_conj() ? 2 : 0) |
                  (t.is_neg() ? 4 : 0) | (static_cast<int64_t>(t.layout()) << 3));
    key.push_back(t.dim());
    for (int64_t d : t.sizes()) key.push_back(d);
    for (int64_t d : t.strides()) key.push_back(d);
    return true;
  };
  auto bits = [](double d) {
    int64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
  };
  for (const c10::IValue& v : ivs) {
    if (v.isTensor()) {
      key.push_back(5);
      if (!tensor(v.toTensor())) return false;
    } else if (v.isNone() || v.isGenerator()) {
      key.push_back(v.isNone() ? 1 : 2);  // a generator is dropped before the meta call
    } else if (v.isBool()) {
      key.push_back(10 + v.toBool());
    } else if (v.isInt()) {
      key.push_back(20);
      key.push_back(v.toInt());
    } else if (v.isDouble()) {
      key.push_back(30);
      key.push_back(bits(v.toDouble()));
    } else if (v.isComplexDouble()) {
      c10::complex<double> c = v.toComplexDouble();
      key.push_back(40);
      key.push_back(bits(c.real()));
      key.push_back(bits(c.imag()));
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      key.push_back(50);
      key.push_back(static_cast<int64_t>(s.size()));
      for (char ch : s) key.push_back(static_cast<unsigned char>(ch));
    } else if (v.isIntList()) {
      auto l = v.toIntList();
      key.push_back(60);
      key.push_back(static_cast<int64_t>(l.size()));
      for (int64_t x : l) key.push_back(x);
    } else if (v.isDoubleList()) {
      auto l = v.toDoubleList();
      key.push_back(70);
      key.push_back(static_cast<int64_t>(l.size()));
      for (double x : l) key.push_back(bits(x));
    } else if (v.isBoolList()) {
      auto l = v.toBoolList();
      key.push_back(80);
      key.push_back(static_cast<int64_t>(l.size()));
      for (bool x : l) key.push_back(x);
    } else if (v.isTensorList()) {
      key.push_back(90);
      key.push_back(static_cast<int64_t>(v.toTensorList().size()));
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (!tensor(t)) return false;
      }
    } else if (v.isOptionalTensorList()) {
      auto l = v.toOptionalTensorList();
      key.push_back(100);
      key.push_back(static_cast<int64_t>(l.size()));
      for (size_t i = 0; i < l.size(); ++i) {
        std::optional<at::Tensor> t = l.get(i);
        if (!tensor(t ? *t : at::Tensor())) return false;
      }
    } else if (v.isDevice()) {
      key.push_back(110);
      key.push_back(static_cast<int64_t>(v.toDevice().type()));
      key.push_back(v.toDevice().index());
    } else {
      return false;  // symbolic numbers, objects, anything else: not cached
    }
  }
  return true;
}

size_t MetaKeyHash::operator()(const std::vector<int64_t>& k) const noexcept {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t x : k) h = (h ^ static_cast<uint64_t>(x)) * 0x100000001b3ull;
  return static_cast<size_t>(h);
}

namespace {

// TXLA_INPLACE_META_CACHE=0: run the functional twin's meta kernel on every call (A/B, tests).
bool InplaceMetaCacheOn() {
  static const bool on = [] {
    const char* e = std::getenv("TXLA_INPLACE_META_CACHE");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

struct InplaceMeta : c10::OperatorKernel {
  InplaceMeta(c10::OperatorHandle functional, OverlapRule check_overlap, bool check_fill_value)
      : functional_(std::move(functional)), check_overlap_(check_overlap), check_fill_value_(check_fill_value) {}
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
    ClearInplaceResultLayout();
    if (check_fill_value_) {
      // masked_fill_/index_fill_ convert their value to self's dtype first (eager: RuntimeError
      // "value cannot be converted to type int64_t without overflow"; torch's Python meta raised
      // ValueError for NaN into integers).
      const auto& args = op.schema().arguments();
      for (size_t i = 1; i < n; ++i) {
        if (args[i].name() != "value" || !ivs[i].isScalar()) continue;
        c10::Scalar v = ivs[i].toScalar();
        AT_DISPATCH_V2(self.scalar_type(), "fill_value_check", AT_WRAP([&] { (void)v.to<scalar_t>(); }),
                       AT_EXPAND(AT_ALL_TYPES), at::kHalf, at::kBFloat16, at::kBool);
      }
    }
    if (check_overlap_ != OverlapRule::kNone) {
      bool accumulate = op.schema().name() == "aten::index_put_" && n > 3 && ivs[3].isBool() && ivs[3].toBool();
      if (check_overlap_ == OverlapRule::kEager) {
        TORCH_CHECK(at::has_internal_overlap(self) != at::MemOverlap::Yes,
                    "unsupported operation: more than one element of the written-to tensor refers to a single memory "
                    "location. Please clone() the tensor before performing the operation.");
      } else if (check_overlap_ == OverlapRule::kReadWrite || accumulate) {
        CheckNoOverlappingWrite(self, op.schema().name());
      }
    }
    NoteOverlappingWrite(self);
    // The functional twin's meta kernel is a pure function of the call's metadata; torch's Python
    // ones cost 40-1,000 us a call (relu_, clamp_, sub_, neg_, pow_ ...), paid again at every
    // step. Calls it accepted before are remembered, exactly (the whole key is compared); refused
    // ones are never cached, so every error is raised again.
    std::vector<int64_t>& key = CallKey();
    bool cacheable = InplaceMetaCacheOn() && EncodeMetaCall(ivs, key);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu_);
      if (passed_.count(key)) {
        torch::jit::drop(*stack, n);
        stack->push_back(self);
        return;
      }
    }
    torch::jit::Stack st(ivs.begin(), ivs.end());
    // A generator does not change shapes or dtypes, and torch's Python metas of the random fills
    // (exponential, cauchy, ...) refuse one ("generator is not supported in refs").
    for (auto& v : st) {
      if (v.isGenerator()) v = c10::IValue();
    }
    try {
      functional_.callBoxed(st);
      if (!st.empty() && st[0].isTensor()) {
        const at::Tensor& out = st[0].toTensor();
        TORCH_CHECK(out.sizes().equals(self.sizes()), "output with shape ", self.sizes(),
                    " doesn't match the broadcast shape ", out.sizes());
        TORCH_CHECK(c10::canCast(out.scalar_type(), self.scalar_type()), "result type ", out.scalar_type(),
                    " can't be cast to the desired output type ", self.scalar_type());
      }
    } catch (const std::exception&) {  // c10::Error, or a Python meta kernel's exception
      RaiseEagerDtypeError(op, ivs);
      throw;
    }
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu_);
      if (passed_.size() >= 4096) passed_.clear();  // bounded: a program of ever-new shapes
      passed_.insert(key);
    }
    torch::jit::drop(*stack, n);
    stack->push_back(self);
  }
  static std::vector<int64_t>& CallKey() {
    static thread_local std::vector<int64_t> k;
    return k;
  }
  std::mutex mu_;
  std::unordered_set<std::vector<int64_t>, MetaKeyHash> passed_;
  // The meta computation refused the call. Eager's kernel may refuse it first for its dtypes
  // (bool pow_, integer igamma_: NotImplementedError, where the Python meta kernels computed another
  // result type): run the in-place op on one-element CPU tensors of the same dtypes and raise eager's
  // NotImplementedError if that is what it gives. Only on this error path.
  static void RaiseEagerDtypeError(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> ivs) {
    torch::jit::Stack probe;
    for (const auto& v : ivs) {
      if (v.isTensor() && v.toTensor().defined()) {
        const at::Tensor& t = v.toTensor();
        probe.emplace_back(at::ones(std::vector<int64_t>(t.dim(), 1), at::TensorOptions().dtype(t.scalar_type())));
      } else {
        probe.push_back(v);
      }
    }
    try {
      op.callBoxed(probe);
    } catch (const c10::NotImplementedError& e) {
      throw;
    } catch (const std::exception&) {
    }
  }
  c10::OperatorHandle functional_;
  OverlapRule check_overlap_;
  bool check_fill_value_;
};

// ---- In-place foreach ops (`_foreach_mul_`, `_foreach_addcdiv_`, ...: what the foreach optimizers
// call, several per step on every parameter or state tensor). torch's generated Functionalize kernel
// first replays the call on meta copies of every tensor (to raise eager's shape and dtype errors),
// then runs the functional twin (`_foreach_mul`) on the unwrapped values and makes its results the
// tensors' new values. The replay is ~25% of such a call on our tensors (a meta tensor per element,
// TensorIterator per element) and is a pure function of the call's metadata (see EncodeMetaCall):
// this kernel does what the generated one does, and skips the replay for a call whose key passed
// before (refused calls are never cached, so every error comes back). Written tensors that are not
// dense replay every time (their overlap checks happen in the replay).
namespace {

struct ForeachInplaceFunctionalize : c10::OperatorKernel {
  explicit ForeachInplaceFunctionalize(c10::OperatorHandle functional) : functional_(std::move(functional)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto ivs = torch::jit::last(*stack, n);
    MetaCheck(op, ivs);
    // Unwrap (after syncing) every functional tensor, as the generated kernel does.
    bool self_functional = fimpl::isFunctionalTensor(ivs[0].toTensorList());
    bool other_functional = false;
    torch::jit::Stack st;
    st.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = ivs[i];
      if (v.isTensorList()) {
        c10::ArrayRef<c10::IValue> l = v.toListRef();
        c10::List<at::Tensor> out;
        out.reserve(l.size());
        for (const c10::IValue& e : l) out.push_back(Unwrap(e.toTensor(), i > 0 ? &other_functional : nullptr));
        st.emplace_back(std::move(out));
      } else if (v.isTensor()) {
        st.emplace_back(Unwrap(v.toTensor(), &other_functional));
      } else {
        st.push_back(v);
      }
    }
    if (!self_functional) {
      TORCH_INTERNAL_ASSERT(!other_functional,
                            "mutating a non-functional tensor with a functional tensor is not allowed. Please "
                            "ensure that all of your inputs are wrapped inside of a functionalize() call.");
      at::AutoDispatchSkipFunctionalize guard;
      op.callBoxed(stack);
      return;
    }
    {
      at::AutoDispatchSkipFunctionalize guard;
      functional_.callBoxed(st);
    }
    TORCH_INTERNAL_ASSERT(st.size() == 1 && st[0].isTensorList(), op.schema().name(), ": unexpected results");
    std::vector<at::Tensor> results = st[0].toTensorVector();
    std::vector<at::Tensor> self = ivs[0].toTensorVector();
    // (The generated kernel also calls propagate_xla_data here: a no-op for a backend that does
    // not register _propagate_xla_data, as ours does not.)
    fimpl::replace_(self, results);
    fimpl::commit_update(self);
    fimpl::sync(self);
    torch::jit::drop(*stack, n);
  }

 private:
  static at::Tensor Unwrap(const at::Tensor& t, bool* functional) {
    if (!t.defined() || !fimpl::isFunctionalTensor(t)) return t;
    if (functional) *functional = true;
    fimpl::sync(t);
    return fimpl::from_functional_tensor(t);
  }

  // The generated kernel's replay on meta tensors, or nothing for a call whose key passed before.
  void MetaCheck(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> ivs) {
    static thread_local std::vector<int64_t> key;
    bool cacheable = InplaceMetaCacheOn() && DenseWrites(ivs[0]) && EncodeMetaCall(ivs, key);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu_);
      if (passed_.count(key)) return;
    }
    torch::jit::Stack st(ivs.begin(), ivs.end());
    MapStackTensors(&st, 0, ToMeta);
    {
      at::AutoDispatchSkipFunctionalize func_guard;
      c10::impl::ExcludeDispatchKeyGuard guard(
          c10::functorch_transforms_ks |
          c10::DispatchKeySet({c10::DispatchKey::FuncTorchDynamicLayerBackMode,
                               c10::DispatchKey::FuncTorchDynamicLayerFrontMode, c10::DispatchKey::Python,
                               c10::DispatchKey::PreDispatch}));
      op.callBoxed(st);
    }
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu_);
      if (passed_.size() >= 4096) passed_.clear();  // bounded: a program of ever-new shapes
      passed_.insert(key);
    }
  }

  static at::Tensor ToMeta(const at::Tensor& t) {  // what the generated kernel's to_meta makes
    if (!t.defined()) return t;
    at::Tensor m = at::native::empty_strided_meta_symint(t.sym_sizes(), t.sym_strides(), t.scalar_type(), t.layout(),
                                                         c10::Device(c10::kMeta), std::nullopt);
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) m.unsafeGetTensorImpl()->set_wrapped_number(true);
    return m;
  }

  // Every written tensor is dense and free of overlap (the per-element overlap checks pass).
  static bool DenseWrites(const c10::IValue& self) {
    if (!self.isTensorList()) return false;
    for (const c10::IValue& e : self.toListRef()) {
      const at::Tensor& t = e.toTensor();
      if (!t.defined() || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || !t.is_non_overlapping_and_dense()) {
        return false;
      }
    }
    return true;
  }

  c10::OperatorHandle functional_;
  std::mutex mu_;
  std::unordered_set<std::vector<int64_t>, MetaKeyHash> passed_;
};

// Every `_foreach_X_.overload(Tensor(a!)[] self, ...) -> ()` whose twin `_foreach_X.overload` has
// the same arguments and returns a tensor list.
void RegisterForeachInplaceFunctionalize(torch::Library& fn) {
  const char* env = std::getenv("TXLA_FOREACH_FUNCTIONALIZE");
  if (env && std::string(env) == "0") return;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const std::string& full = name.name;
    if (full.rfind("aten::_foreach_", 0) != 0 || full.back() != '_') continue;
    auto inplace = dispatcher.findOp(name);
    auto functional = dispatcher.findOp({full.substr(0, full.size() - 1), name.overload_name});
    if (!inplace || !functional) continue;
    const auto& a = inplace->schema().arguments();
    const auto& b = functional->schema().arguments();
    if (a.empty() || a.size() != b.size() || !inplace->schema().returns().empty() ||
        functional->schema().returns().size() != 1 ||
        functional->schema().returns()[0].type()->str() != "Tensor[]" || a[0].type()->str() != "Tensor[]" ||
        !a[0].alias_info() || !a[0].alias_info()->isWrite()) {
      continue;
    }
    bool same = true;
    for (size_t i = 0; i < a.size() && same; ++i) {
      same = a[i].name() == b[i].name() && a[i].type()->str() == b[i].type()->str() &&
             (i == 0 || !a[i].alias_info() || !a[i].alias_info()->isWrite());
    }
    if (!same) continue;
    std::string key = full.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    fn.impl(key.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ForeachInplaceFunctionalize>(*functional)));
  }
}

}  // namespace

void RegisterInplaceMetaChecks(torch::Library& meta, const std::set<std::string>& skip) {
  auto& dispatcher = c10::Dispatcher::singleton();
  // Ops whose eager kernels allow writing into overlapping memory (each write's value does not
  // depend on what is there: the view's reverse recovers them); index_put_ with accumulate=True
  // reads what is there, and is checked as a read-modify-write.
  static const std::set<std::string> no_overlap_check = {"fill_", "zero_", "index_fill_", "masked_fill_",
                                                         "index_put_"};
  // Writes that eager rejects only for broadcast (stride 0) overlap, and that write values
  // independent of what is there: the view's reverse recovers them as well.
  static const std::set<std::string> write_only = {"copy_", "uniform_", "normal_", "bernoulli_", "random_",
                                                   "exponential_", "geometric_", "cauchy_", "log_normal_",
                                                   "masked_scatter_", "scatter_"};
  // In-place ops that change metadata: their functional twins legitimately change the shape.
  static const std::set<std::string> metadata_ops = {"resize_", "resize_as_", "resize_as_sparse_", "set_",
                                                     "as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_",
                                                     "swapaxes_", "swapdims_", "detach_", "sparse_resize_",
                                                     "sparse_resize_and_clear_"};
  std::map<std::string, std::vector<std::string>> overloads;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) overloads[name.name].push_back(name.overload_name);
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const std::string& full = name.name;
    if (full.rfind("aten::", 0) != 0 || full.back() != '_' || full.size() < 8) continue;
    std::string base = full.substr(6);
    if (base.rfind("_", 0) == 0) continue;  // private ops (_foreach_*, _index_put_impl_, ...)
    std::string key = base + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (skip.count(key) || metadata_ops.count(base)) continue;
    auto inplace = dispatcher.findOp(name);
    if (!inplace) continue;
    // The functional twin: the same overload name, or (pow_.Scalar -> pow.Tensor_Scalar) the
    // overload with the same arguments.
    std::string fname = "aten::" + base.substr(0, base.size() - 1);
    auto same_args = [&](const c10::OperatorHandle& cand) {
      const auto& x = cand.schema().arguments();
      const auto& y = inplace->schema().arguments();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (x[i].name() != y[i].name() || x[i].type()->str() != y[i].type()->str()) return false;
      }
      return true;
    };
    auto functional = dispatcher.findOp({fname, name.overload_name});
    if (!functional || !same_args(*functional)) {
      functional.reset();
      for (const std::string& ov : overloads[fname]) {
        auto cand = dispatcher.findOp({fname, ov});
        if (cand && same_args(*cand)) {
          functional = cand;
          break;
        }
      }
    }
    if (!functional) continue;
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
                               std::make_unique<InplaceMeta>(*functional, no_overlap_check.count(base) ? OverlapRule::kNone
                                                                         : write_only.count(base)
                                                                             ? OverlapRule::kEager
                                                                             : OverlapRule::kReadWrite,
                                                     base == "masked_fill_" || base == "index_fill_")));
  }
}

}  // namespace

bool ElementsOverlap(at::IntArrayRef sizes, at::IntArrayRef strides) { return Overlaps(sizes, strides); }

// The functional op's result becomes `self`'s new value, and the wrapper takes that value's layout:
// a result laid out contiguously made a transposed or strided view report contiguous strides after
// any in-place op, so a later reshape/flatten aliased where eager copies (the copy's writes reached
// the base; fuzz seed 81978) and view() succeeded where eager refuses. The result keeps `self`'s
// layout whenever that is not contiguous.
void KeepLayoutOfWrite(const at::Tensor& self) {
  ClearInplaceResultLayout();
  if (self.dim() >= 1 && !self.is_contiguous()) ExpectInplaceResultLayout(self);
}

void NoteOverlappingWrite(const at::Tensor& self) { KeepLayoutOfWrite(self); }

void CheckNoOverlappingWrite(const at::Tensor& self, const std::string& op) {
  KeepLayoutOfWrite(self);
  TORCH_CHECK(at::has_internal_overlap(self) != at::MemOverlap::Yes,
              "unsupported operation: more than one element of the written-to tensor refers to a single memory "
              "location. Please clone() the tensor before performing the operation.");
  if (self.is_non_overlapping_and_dense() || !Overlaps(self.sizes(), self.strides())) return;
  TORCH_CHECK(false, "unsupported operation: ", op,
              " writes in place into a tensor whose elements overlap in memory (a view such as unfold with "
              "step < size, or as_strided): eager applies such a write element after element, reading values "
              "it has just written, so its result depends on its kernel's iteration order. Please clone() the "
              "tensor before performing the operation.");
}

// nn.utils.rnn.pack_padded_sequence: `batch_sizes` is a CPU tensor by design (eager CUDA too), which
// the RNNs' packed kernels (gru.data, lstm.data, ...) and _pad_packed_sequence read through a data
// pointer. torch's generated Functionalize kernel wrapped it like any result, and a functional
// wrapper has no data: "The tensor has a non-zero number of elements, but its data is not allocated
// yet". Same kernel, with the CPU result returned as the plain CPU tensor it is.
std::tuple<at::Tensor, at::Tensor> PackPaddedSequenceFunctionalize(const at::Tensor& input, const at::Tensor& lengths,
                                                                   bool batch_first) {
  auto unwrap = [](const at::Tensor& t) {
    if (!at::functionalization::impl::isFunctionalTensor(t)) return t;
    at::functionalization::impl::sync(t);
    return at::functionalization::impl::from_functional_tensor(t);
  };
  std::tuple<at::Tensor, at::Tensor> r;
  {
    at::AutoDispatchSkipFunctionalize guard;
    r = at::_ops::_pack_padded_sequence::call(unwrap(input), unwrap(lengths), batch_first);
  }
  auto wrap = [](const at::Tensor& t) {
    return t.defined() && !t.device().is_cpu() ? at::functionalization::impl::to_functional_tensor(t) : t;
  };
  return {wrap(std::get<0>(r)), wrap(std::get<1>(r))};
}

namespace {
// A Python (or any non-aten) composite kernel registered as CompositeExplicitAutograd (every
// torch.library.custom_op without device_types, torch.nn's chunked linear_cross_entropy) fills the XLA
// slot of its op, and functionalization hands it our raw tensors: its views and in-place writes then
// ran below functionalization, each view on the CPU fallback (a copy, not a view), so writes through
// them were lost (wrong values). This kernel, registered for XLA on such ops, runs the composite on
// functional wrappers with functionalization re-enabled, as torch's functionalize_op_helper does for
// aten composites; it reaches the composite through a backend key that has no kernel of its own
// (functionalize_op_helper goes through Meta, which for these ops is their fake kernel).
constexpr c10::DispatchKey kCompositeProbeKey = c10::DispatchKey::PrivateUse3;

void FunctionalizedComposite(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  MapStackTensors(stack, stack->size() - op.schema().arguments().size(), [](const at::Tensor& t) {
    return fimpl::isFunctionalTensor(t) ? t : fimpl::to_functional_tensor(t);
  });
  {
    auto tls = c10::impl::tls_local_dispatch_key_set();
    c10::impl::PODLocalDispatchKeySet force;
    force.set_included(tls.included_);
    force.set_excluded(tls.excluded_.remove(c10::DispatchKey::Functionalize));
    c10::impl::ForceDispatchKeyGuard guard(force);
    op.redispatchBoxed(c10::DispatchKeySet(kCompositeProbeKey), stack);
  }
  MapStackTensors(stack, stack->size() - op.schema().returns().size(), [](const at::Tensor& t) {
    if (!fimpl::isFunctionalTensor(t)) return t;
    fimpl::sync(t);
    return fimpl::from_functional_tensor(t);
  });
}

// A composite custom op that writes its arguments in place (`torch.library.custom_op(...,
// mutates_args=...)`): functionalization's fallback refuses every non-aten op with alias annotations
// ("Found a custom (non-ATen) operator whose output has alias annotations"), so on XLA tensors such
// an op could not run at all. This kernel, registered for AutogradXLA, runs its composite (the Python
// function) on the functional tensors themselves, below autograd as eager's kernel for an op without
// an autograd formula does (the writes are not recorded for autograd; an autograd formula registered
// for a mutating op is not used on XLA): each aten op inside it is functionalized, its in-place writes
// included.
void MutableComposite(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::AutoDispatchBelowAutograd guard;
  op.redispatchBoxed(c10::DispatchKeySet(kCompositeProbeKey), stack);
}
}  // namespace

bool FunctionalizeCompositeForXla(const std::string& qualname) {
  const size_t sep = qualname.find("::");
  if (sep == std::string::npos) return false;
  const std::string ns = qualname.substr(0, sep), rest = qualname.substr(sep + 2);
  if (ns == "aten" || ns == "prims") return false;  // aten composites: the vetted lists in bridge.cc
  const size_t dot = rest.find('.');
  const std::string name = rest.substr(0, dot), overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  auto h = c10::Dispatcher::singleton().findSchema({ns + "::" + name, overload});
  if (!h) return false;
  if (!h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
      h->hasKernelForDispatchKey(c10::DispatchKey::XLA) || h->hasKernelForDispatchKey(kCompositeProbeKey)) {
    return false;
  }
  const auto& schema = h->schema();
  bool has_tensor = false, mutates = false;
  for (const auto& r : schema.returns()) {
    if (r.alias_info() != nullptr) return false;  // views and out= returns: not ours to handle
  }
  for (const auto& a : schema.arguments()) {
    if (a.alias_info() != nullptr) {
      if (!a.alias_info()->isWrite()) return false;  // view-like arguments
      mutates = true;
    }
    auto t = a.type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    if (t->kind() == c10::TypeKind::TensorType) has_tensor = true;
    if (auto l = t->cast<c10::ListType>()) {
      auto e = l->getElementType();
      if (auto opt = e->cast<c10::OptionalType>()) e = opt->getElementType();
      if (e->kind() == c10::TypeKind::TensorType) has_tensor = true;
    }
  }
  if (!has_tensor) return false;
  if (mutates) {
    if (h->hasKernelForDispatchKey(c10::DispatchKey::AutogradXLA)) return false;
    static auto* mlibs = new std::map<std::string, std::unique_ptr<torch::Library>>();
    auto& mlib = (*mlibs)[ns];
    if (!mlib) {
      mlib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::AutogradXLA, __FILE__, __LINE__);
    }
    mlib->impl(rest.c_str(), torch::CppFunction::makeFromBoxedFunction<&MutableComposite>());
    return true;
  }
  static auto* libs = new std::map<std::string, std::unique_ptr<torch::Library>>();
  auto& lib = (*libs)[ns];
  if (!lib) lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::XLA, __FILE__, __LINE__);
  lib->impl(rest.c_str(), torch::CppFunction::makeFromBoxedFunction<&FunctionalizedComposite>());
  return true;
}

namespace {
// CompositeImplicitAutograd ops below autograd. Such an op decomposes at the autograd key, above
// functionalization, so its inner views and writes are functionalized. Under torch.inference_mode
// (or anything else that skips autograd) nothing decomposes it there: it reaches functionalization's
// fallback, which hands our raw tensors to the decomposition below it. Its views then ran on the CPU
// fallback one by one (matmul, einsum, linear, tensordot: a host round trip each; F.multi_head_
// attention_forward raised on an as_strided view), and functionalization's fallback refuses every
// in-place or out= composite (clip_, fill_diagonal_, float_power_, `&=`, diff(out=)) with "Found a
// custom (non-ATen) operator whose output has alias annotations". This kernel, registered for
// functionalization on every aten composite without a functionalization kernel of its own, runs
// the decomposition there, as autograd would have: on XLA tensors through our autograd-level
// override of the op where we have one (linear, scaled_dot_product_attention), the composite
// otherwise; an op with an XLA kernel of its own keeps the fallback's way to it. Other devices' functional tensors (torch.func.functionalize, export) keep the fallback's
// behaviour for ops without alias annotations, and decompose the ones it refuses.
void CompositeBelowAutograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const bool xla = ks.has_backend(c10::BackendComponent::XLABit);
  // An op with an XLA kernel of its own (silu_backward's row) runs it, as before, on the raw tensors.
  const bool own_kernel = xla && op.hasKernelForDispatchKey(c10::DispatchKey::XLA);
  if (!own_kernel && (xla || op.schema().hasAnyAliasInfo())) {
    op.callBoxedForDispatchKey(xla && op.hasKernelForDispatchKey(c10::DispatchKey::AutogradXLA)
                                   ? c10::DispatchKey::AutogradXLA
                                   : c10::DispatchKey::CompositeImplicitAutograd,
                               *stack);
    return;
  }
  // functionalization's fallback: unwrap (after syncing) the functional arguments, run the op below
  // functionalization, wrap its results
  const size_t nargs = op.schema().arguments().size(), nrets = op.schema().returns().size();
  bool any_functional = false;
  MapStackTensors(stack, stack->size() - nargs, [&](const at::Tensor& t) {
    if (!fimpl::isFunctionalTensor(t)) return t;
    any_functional = true;
    fimpl::sync(t);
    return fimpl::from_functional_tensor(t);
  });
  {
    at::AutoDispatchSkipFunctionalize guard;
    op.redispatchBoxed(ks & c10::after_func_keyset, stack);
  }
  if (any_functional) {
    MapStackTensors(stack, stack->size() - nrets, [](const at::Tensor& t) { return fimpl::to_functional_tensor(t); });
  }
}

void RegisterCompositesBelowAutograd(torch::Library& fn) {
  auto& d = c10::Dispatcher::singleton();
  for (const auto& name : d.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto h = d.findOp(name);
    if (!h || !h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        h->hasKernelForDispatchKey(c10::DispatchKey::Functionalize)) {
      continue;
    }
    std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    fn.impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&CompositeBelowAutograd>());
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
  fn->impl("_native_batch_norm_legit.out", TORCH_FN(NativeBatchNormLegitOutFunctionalize));
  fn->impl("_batch_norm_with_update.out", TORCH_FN(BatchNormWithUpdateOutFunctionalize));
  fn->impl("_amp_update_scale.out", TORCH_FN(AmpUpdateScaleOutFunctionalize));
  fn->impl("rrelu_with_noise.out", TORCH_FN(RreluWithNoiseOutFunctionalize));
  fn->impl("_fused_moving_avg_obs_fq_helper.out", TORCH_FN(FusedMovingAvgObsFqHelperOutFunctionalize));
  fn->impl("_pack_padded_sequence", TORCH_FN(PackPaddedSequenceFunctionalize));
  RegisterOutFromFirstResult(*fn);
  RegisterCopyOfViewKernels(*fn);
  RegisterCompositesBelowAutograd(*fn);
  RegisterForeachInplaceFunctionalize(*fn);
  const char* env = std::getenv("TXLA_INPLACE_META_CHECKS");
  if (env && std::string(env) == "0") return;
  static torch::Library* meta =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  RegisterInplaceMetaChecks(*meta, cpp_meta_ops);
}

}  // namespace txla::bridge
