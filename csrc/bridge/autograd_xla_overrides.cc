// Kernels registered for AutogradXLA (issue #7): they replace a composite or autograd kernel for
// XLA tensors where that kernel cannot give eager's result or error.
//
// F.one_hot on XLA tensors with eager CPU's errors.
//
// one_hot is CompositeImplicitAutograd: for XLA (as for CUDA) its kernel skips the host checks of
// the class values and relies on the error of the scatter it runs, so an out-of-range class read
// "scatter(): index 5 is out of bounds ...", where eager CPU says "Class values must be smaller than
// num_classes." (or "... non-negative."). This kernel, registered for AutogradXLA, is the same
// composite (zeros + scatter_, or a host read of the max for num_classes=-1, as eager) with the
// scatter's in-graph index check worded as eager's CPU kernel: no extra host sync.
#include <ATen/ATen.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/linear_native.h>
#include <ATen/ops/mish_backward_native.h>
#include <ATen/ops/mish_backward_ops.h>
#include <ATen/ops/scaled_dot_product_attention_native.h>
#include <ATen/ops/silu_backward_native.h>
#include <ATen/ops/silu_backward_ops.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "graph/graph.h"

namespace {

at::Tensor OneHotXla(const at::Tensor& self, int64_t num_classes) {
  TORCH_CHECK(self.dtype() == at::kLong, "one_hot is only applicable to index tensor of type LongTensor.");
  std::vector<int64_t> shape = self.sizes().vec();
  if (self.numel() == 0) {
    if (num_classes == -1) {
      TORCH_CHECK(false, "Can not infer total number of classes from empty tensor.");
    }
    shape.push_back(num_classes);
    return at::empty(shape, self.options());
  }
  if (num_classes == -1) {
    // eager checks the minimum first, on the host
    TORCH_CHECK(self.min().item().toLong() >= 0, "Class values must be non-negative.");
    num_classes = self.max().item().toLong() + 1;
  }
  TORCH_CHECK(num_classes > 0, "Class values must be smaller than num_classes.");  // eager: max < num_classes fails
  shape.push_back(num_classes);
  static const std::string message =
      "one_hot(): {negative:Class values must be non-negative.|Class values must be smaller than num_classes.}";
  at::Tensor ret = at::zeros(shape, self.options());
  txla::graph::CheckMessageScope scope(message);
  ret.scatter_(-1, self.unsqueeze(-1), 1);
  return ret;
}

// x.set_(source, storage_offset, size, stride): eager makes `x` a view of source's storage, so a
// later write to either shows in the other. An XLA tensor has no storage of its own here (its value
// lives in the lazy graph and functionalization), so this cannot alias: the call used to fall back to
// the CPU and fail with a storage-device error. It raises NotImplementedError naming the limitation
// and the equivalent that works (`source.as_strided(size, stride, storage_offset)`, a real view).
at::Tensor& SetStorageXla(at::Tensor& self, const at::Tensor& source, c10::SymInt storage_offset,
                          c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  if (source.device().type() == c10::DeviceType::XLA) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        "set_(source, storage_offset, size, stride) with an XLA source is not supported: XLA tensors have no "
        "shared storage to alias. Use source.as_strided(size, stride, storage_offset), a view of source "
        "that sees its later writes as eager's set_ does.");
  }
  TORCH_CHECK(false, "Attempted to set the storage of a tensor on device \"", self.device(),
              "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
  return self;
}

// torch.linalg.matrix_rank(x, out=o) left `o` unwritten on XLA (the survey's "tolerance" was 0 for
// every rank): the composite's matrix_rank_impl takes its tensor-subclass path for our (functional)
// tensors, `result = at::sum(S > tol, -1)`, which rebinds its reference to the out argument instead of
// writing into it. Here: eager's dtype check, the functional op (which returns a fresh result), then
// out resized and written as an out= op does.
// One kernel for both overloads (tolerances as tensors or as floats).
template <typename Tol>
at::Tensor& MatrixRankOutXla(const at::Tensor& input, Tol atol, Tol rtol, bool hermitian, at::Tensor& out) {
  TORCH_CHECK(input.dim() >= 2, "torch.linalg.matrix_rank: The input tensor input must have at least 2 dimensions.");
  TORCH_CHECK(at::canCast(at::kLong, out.scalar_type()),
              "torch.linalg.matrix_rank: Expected result to be safely castable from Long dtype, but got result with dtype ",
              out.scalar_type());
  at::Tensor r = at::linalg_matrix_rank(input, atol, rtol, hermitian);
  if (out.sizes() != r.sizes()) out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

}  // namespace

// F.linear with a bias on an n-d input: eager CPU flattens a contiguous input to 2-d and runs one
// addmm (the bias added inside the gemm, in float32, rounded once), but torch's composite skips that
// path for XLA tensors (`!input.is_xla()`) and computes matmul, then adds the bias: for bfloat16
// (every transformer Linear under bf16) two roundings, 1 ulp off eager in a quarter of the outputs.
// Same decision as eager's composite, XLA included; results as eager's, values and autograd.
at::Tensor LinearXla(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias_opt) {
  const bool has_bias = bias_opt.has_value() && bias_opt->defined();
  const int64_t dim = input.dim();
  if (has_bias && dim > 2 && weight.dim() == 2) {
    const at::Tensor& bias = *bias_opt;
    const bool fusable = (bias.dim() == 1 || bias.squeeze().dim() == 1) && bias.is_contiguous();
    if (fusable && input.is_contiguous()) {
      std::vector<int64_t> sizes = input.sizes().vec();
      const int64_t k = sizes.back();
      sizes.pop_back();
      at::Tensor out = at::addmm(bias, input.reshape({-1, k}), weight.t());
      sizes.push_back(out.size(1));
      return out.view(sizes);
    }
  }
  return at::native::linear(input, weight, bias_opt);  // torch's composite, unchanged otherwise
}

// silu's gradient: silu_backward is CompositeImplicitAutograd for every backend but CPU/CUDA, so on
// XLA it decomposed into sigmoid, sub, mul and add, each rounded to bf16, where eager's CPU kernel
// computes in float32 and rounds once (bf16 SiLU gradients, and everything upstream of them, were
// 1 ulp off). autograd calls silu_backward with gradients off (create_graph=True takes the
// infinitely differentiable formula instead): then our one-kernel row runs; with gradients wanted
// of silu_backward itself, torch's decomposition as before.
at::Tensor SiluBackwardXla(const at::Tensor& grad_output, const at::Tensor& self) {
  if (at::GradMode::is_enabled() && (grad_output.requires_grad() || self.requires_grad())) {
    return at::native::math_silu_backward(grad_output, self);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return at::_ops::silu_backward::call(grad_output, self);
}
// mish's gradient, the same way (half of a bf16 Mish's input gradients were 1 ulp off)
at::Tensor MishBackwardXla(const at::Tensor& grad_output, const at::Tensor& self) {
  if (at::GradMode::is_enabled() && (grad_output.requires_grad() || self.requires_grad())) {
    return at::native::math_mish_backward(grad_output, self);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return at::_ops::mish_backward::call(grad_output, self);
}

// torch._foreach_mul_(tensors, scalar) (or a scalar list): eager's CPU kernel multiplies a bfloat16
// or float16 tensor by the scalar converted to the tensor's dtype, unchecked (0.9 is 0.8984375 in
// bf16; foreach Adam's beta2 0.999 is 1.0), where mul_ and the out-of-place _foreach_mul keep it in
// float32 (measured on torch 2.13). Functionalization turns the in-place op into the functional one,
// so the conversion is done here, above it. Without a gradient to record, the rest of the dispatch
// runs below autograd (as autograd's own kernel would); otherwise one mul_ per tensor.
namespace {
bool ReducedFloat(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf);
}
at::Scalar InDtype(const at::Scalar& s, const at::Tensor& t) {
  if (!ReducedFloat(t) || s.isComplex() || s.isBoolean()) return s;
  const float f = static_cast<float>(s.toDouble());
  return t.scalar_type() == at::kBFloat16 ? at::Scalar(static_cast<double>(static_cast<float>(c10::BFloat16(f))))
                                          : at::Scalar(static_cast<double>(static_cast<float>(c10::Half(f))));
}
bool WantsGrad(at::TensorList ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& t : ts) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}
void ForeachMulScalarListXla(c10::DispatchKeySet ks, at::TensorList self, at::ArrayRef<at::Scalar> scalars) {
  std::vector<at::Scalar> s(scalars.begin(), scalars.end());
  if (s.size() == self.size()) {
    for (size_t i = 0; i < s.size(); ++i) s[i] = InDtype(s[i], self[i]);
    if (WantsGrad(self)) {
      for (size_t i = 0; i < s.size(); ++i) const_cast<at::Tensor&>(self[i]).mul_(s[i]);
      return;
    }
  }
  at::AutoDispatchBelowAutograd guard;
  at::_ops::_foreach_mul__ScalarList::redispatch(ks & c10::after_autograd_keyset, self, s);
}
void ForeachMulScalarXla(c10::DispatchKeySet ks, at::TensorList self, const at::Scalar& scalar) {
  bool reduced = false;
  for (const auto& t : self) reduced = reduced || ReducedFloat(t);
  if (!reduced) {
    if (WantsGrad(self)) {
      for (const auto& t : self) const_cast<at::Tensor&>(t).mul_(scalar);
      return;
    }
    at::AutoDispatchBelowAutograd guard;
    at::_ops::_foreach_mul__Scalar::redispatch(ks & c10::after_autograd_keyset, self, scalar);
    return;
  }
  std::vector<at::Scalar> s(self.size(), scalar);
  ForeachMulScalarListXla(ks, self, s);
}
}  // namespace

// F.scaled_dot_product_attention: torch's composite picks its fused kernels only for CPU/CUDA
// devices, so on XLA it took the math path, a dozen traced ops per call forward and about as many
// backward (~320 us of host time per attention). Eager CPU runs its fused flash kernel when q, k, v
// are 4-d of one float dtype, without mask or dropout, with equal batch, heads and head sizes; then
// XLA runs the same op (`_scaled_dot_product_flash_attention_for_cpu`, one op-table row, and its
// backward: autograd's formula for that op). Everything else keeps torch's composite.
// TXLA_FUSED_SDPA=0 keeps the math path always.
namespace {
bool FusedSdpaEnabled() {
  static const bool on = [] {
    const char* e = std::getenv("TXLA_FUSED_SDPA");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}
bool FusedSdpaApplies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const std::optional<at::Tensor>& mask, double dropout_p, bool enable_gqa) {
  (void)enable_gqa;  // equal heads are required below, where gqa changes nothing
  if (!FusedSdpaEnabled() || dropout_p != 0.0 || (mask.has_value() && mask->defined())) return false;
  if (!q.defined() || !k.defined() || !v.defined() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  const auto st = q.scalar_type();
  if (k.scalar_type() != st || v.scalar_type() != st) return false;
  if (st != at::kFloat && st != at::kDouble && st != at::kBFloat16 && st != at::kHalf) return false;
  if (k.device() != q.device() || v.device() != q.device()) return false;
  if (q.size(0) != k.size(0) || q.size(0) != v.size(0) || q.size(1) != k.size(1) || q.size(1) != v.size(1) ||
      k.size(2) != v.size(2) || q.size(3) != k.size(3) || q.size(3) != v.size(3)) {
    return false;
  }
  if (q.numel() == 0 || k.numel() == 0) return false;
  // forward-mode AD (jvp): the fused op has no forward formula; the math path has
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->_fw_grad(/*level=*/0).defined()) return false;
  }
  return true;
}
at::Tensor SdpaXla(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                   double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  if (FusedSdpaApplies(q, k, v, mask, dropout_p, enable_gqa)) {
    return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, std::nullopt, scale));
  }
  return at::native::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}
}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradXLA, m) {
  m.impl("linalg_matrix_rank.atol_rtol_tensor_out",
         TORCH_FN(MatrixRankOutXla<const std::optional<at::Tensor>&>));
  m.impl("linalg_matrix_rank.atol_rtol_float_out", TORCH_FN(MatrixRankOutXla<std::optional<double>>));
  m.impl("one_hot", TORCH_FN(OneHotXla));
  m.impl("linear", TORCH_FN(LinearXla));
  m.impl("scaled_dot_product_attention", TORCH_FN(SdpaXla));
  m.impl("silu_backward", TORCH_FN(SiluBackwardXla));
  m.impl("mish_backward", TORCH_FN(MishBackwardXla));
  m.impl("_foreach_mul_.Scalar", TORCH_FN(ForeachMulScalarXla));
  m.impl("_foreach_mul_.ScalarList", TORCH_FN(ForeachMulScalarListXla));
  m.impl("set_.source_Tensor_storage_offset", TORCH_FN(SetStorageXla));
}
