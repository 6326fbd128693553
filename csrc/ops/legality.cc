// Eager's argument legality for op-table rows: dtypes an eager CPU kernel is not built for, scalars
// that do not fit the result dtype, argument combinations eager refuses. XLA would either accept
// these programs (a wrong answer where eager raises) or reject them at compile time, at the next
// sync, far from the op. Each rule raises eager's exception type with eager's message at the op.
// The table is keyed by op-table row; a rule runs before the row builds any IR. Torch-free.
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "ops/op_table.h"
#include "util/text.h"

#include <optional>

namespace txla::ops {

const char* ScalarTypeName(DType t) {
  switch (t) {
    case DType::kPred: return "Bool";
    case DType::kS8: return "Char";
    case DType::kS16: return "Short";
    case DType::kS32: return "Int";
    case DType::kS64: return "Long";
    case DType::kU8: return "Byte";
    case DType::kU16: return "UInt16";
    case DType::kU32: return "UInt32";
    case DType::kU64: return "UInt64";
    case DType::kF16: return "Half";
    case DType::kBF16: return "BFloat16";
    case DType::kF32: return "Float";
    case DType::kF64: return "Double";
    case DType::kC64: return "ComplexFloat";
    case DType::kC128: return "ComplexDouble";
    case DType::kF8E4M3FN: return "Float8_e4m3fn";
    case DType::kF8E5M2: return "Float8_e5m2";
  }
  return "?";
}

namespace {
const char* TypeName(DType t) { return ScalarTypeName(t); }

bool IsComplexT(DType t) { return t == DType::kC64 || t == DType::kC128; }

[[noreturn]] void NotImpl(const std::string& kernel, DType t) {
  throw NotImplementedError("\"" + kernel + "\" not implemented for '" + TypeName(t) + "'");
}

using Rule = std::function<void(OpArgs&)>;

// First tensor argument's dtype must not be integral (bool included): eager's kernel is float-only.
// skip_empty: eager's kernel (and its dtype dispatch) never runs for an empty input (softmax); other
// kernels dispatch on dtype first (gelu of an empty int tensor raises too).
Rule FloatKernel(const std::string& kernel, size_t k = 0, bool skip_empty = true) {
  return [=](OpArgs& a) {
    if (a.IsNone(k) || (skip_empty && a.V(k).shape().numel() == 0)) return;
    if (ir::IsIntegral(a.V(k).dtype(), true)) NotImpl(kernel, a.V(k).dtype());
  };
}
// Eager's CPU kernel has no bfloat16/float16 version (avg_pool3d's): NotImplementedError naming it.
Rule NoReducedFloat(const std::string& kernel, size_t k) {
  return [=](OpArgs& a) {
    if (a.IsNone(k)) return;
    DType t = a.V(k).dtype();
    if (t == DType::kBF16 || t == DType::kF16) NotImpl(kernel, t);
  };
}
// Eager's linalg.vector_norm: a norm without an identity (ord < 0 or inf) cannot reduce an empty
// tensor over everything, nor over a dimension of size 0 (named as the caller gave it; fuzz seed 12793).
void NormIdentityCheck(OpArgs& a, size_t ord_arg, size_t dim_arg) {
  const Value& x = a.V(0);
  if (x.shape().numel() != 0 || a.IsNone(ord_arg)) return;
  double ord = a.S(ord_arg).AsDouble();
  if (!(ord < 0 || ord == std::numeric_limits<double>::infinity())) return;
  util::Text o;
  o << ord;
  std::optional<std::vector<int64_t>> dims;
  if (dim_arg != static_cast<size_t>(-1)) dims = a.OptInts(dim_arg);
  if (!dims || dims->empty()) {
    a.Fail("linalg.vector_norm cannot compute the " + o.str() + " norm on an empty tensor because the operation "
           "does not have an identity");
  }
  for (int64_t d : *dims) {
    if (x.dims()[ir::NormalizeDim(d, x.rank())] == 0) {
      a.Fail("linalg.vector_norm cannot compute the " + o.str() + " norm on the dimension " + std::to_string(d) +
             "because this dimension is empty and the operation does not have an identity");
    }
  }
}
// norm.Scalar (no dim: dim_arg -1) and norm.ScalarOpt_dim(_dtype): eager's kernel is vector_norm's.
Rule FloatNorm(size_t dim_arg = static_cast<size_t>(-1)) {
  return [=](OpArgs& a) {
    DType t = a.V(0).dtype();
    if (!ir::IsFloating(t) && !IsComplexT(t)) {
      a.Fail(std::string("linalg.vector_norm: Expected a floating point or complex tensor as input. Got ") + TypeName(t));
    }
    NormIdentityCheck(a, 1, dim_arg);
  };
}
Rule BitwiseInts(const std::string& kernel, bool scalar) {
  return [=](OpArgs& a) {
    DType t = scalar ? ResultType({&a.T(0)}, {&a.S(1)}) : ResultType({&a.T(0), &a.T(1)});
    if (!scalar) BroadcastShapes(a.V(0).dims(), a.V(1).dims());  // eager checks shapes before dtypes
    if (ir::IsFloating(t)) NotImpl(kernel, t);
  };
}
// Tensor-tensor ops whose eager kernel has no bool version: eager's shape error comes first
// (TensorIterator broadcasts before the dtype dispatch; fuzz seed 16877).
Rule BoolTensorPair(const std::string& kernel) {
  return [=](OpArgs& a) {
    if (ResultType({&a.T(0), &a.T(1)}) != DType::kPred) return;
    BroadcastShapes(a.V(0).dims(), a.V(1).dims());
    NotImpl(kernel, DType::kPred);
  };
}
// Tensor-tensor ops whose eager kernel is built for floating types only (hypot, logaddexp): an
// integer or bool result type raises after the shape check.
Rule FloatPair(const std::string& kernel) {
  return [=](OpArgs& a) {
    DType t = ResultType({&a.T(0), &a.T(1)});
    if (!ir::IsIntegral(t, true)) return;
    BroadcastShapes(a.V(0).dims(), a.V(1).dims());
    NotImpl(kernel, t);
  };
}
Rule NoBool(const std::string& kernel, size_t k = 0) {
  return [=](OpArgs& a) {
    if (!a.IsNone(k) && a.V(k).dtype() == DType::kPred) NotImpl(kernel, DType::kPred);
  };
}
// Matrix products: eager's kernel (and its dtype dispatch) only runs when every operand has elements.
Rule NoBoolProduct(const std::string& kernel, std::vector<size_t> operands) {
  return [=](OpArgs& a) {
    for (size_t k : operands) {
      if (a.IsNone(k) || a.V(k).shape().numel() == 0) return;
    }
    // mm with mixed dtypes: eager's "expected m1 and m2 to have the same dtype" comes first (the
    // row's check); bmm checks bool first.
    if (kernel == "addmm_impl_cpu_" && a.V(operands[0]).dtype() != a.V(operands[1]).dtype()) return;
    // Mismatched inner sizes: eager's shape error comes first (the row's check; fuzz seed 10454).
    const Value &m1 = a.V(operands[0]), &m2 = a.V(operands[1]);
    if (m1.rank() >= 2 && m2.rank() >= 1) {
      int64_t k2 = m2.rank() == 1 ? m2.dims()[0] : m2.dims()[m2.rank() - 2];
      if (m1.dims()[m1.rank() - 1] != k2) return;
    }
    if (a.V(operands[0]).dtype() == DType::kPred) NotImpl(kernel, DType::kPred);
  };
}
Rule NoBoolRuntime(const std::string& message) {
  return [=](OpArgs& a) {
    if (a.V(0).dtype() == DType::kPred) a.Fail(message);
  };
}

// A Python scalar converted to dtype t must fit, as eager's checked_convert.
// c10's name and finite range of a dtype, as its checked conversions report them; false for dtypes
// without one here (bool, unsigned wider than 8 bits, float64, complex).
bool C10Range(DType t, const char** name, double* lo, double* hi) {
  switch (t) {
    case DType::kU8: *name = "uint8_t"; *lo = 0; *hi = 255; return true;
    case DType::kS8: *name = "int8_t"; *lo = -128; *hi = 127; return true;
    case DType::kS16: *name = "int16_t"; *lo = -32768; *hi = 32767; return true;
    case DType::kS32: *name = "int"; *lo = -2147483648.0; *hi = 2147483647.0; return true;
    case DType::kS64: *name = "int64_t"; *lo = -9223372036854775808.0; *hi = 9223372036854775807.0; return true;
    case DType::kF16: *name = "c10::Half"; *lo = -65504; *hi = 65504; return true;
    case DType::kBF16: *name = "c10::BFloat16"; *lo = -3.3895313892515355e38; *hi = 3.3895313892515355e38; return true;
    case DType::kF32: *name = "float"; *lo = -3.4028234663852886e38; *hi = 3.4028234663852886e38; return true;
    case DType::kF8E4M3FN: *name = "c10::Float8_e4m3fn"; *lo = -448; *hi = 448; return true;
    case DType::kF8E5M2: *name = "c10::Float8_e5m2"; *lo = -57344; *hi = 57344; return true;
    default: return false;
  }
}

// c10's checked_convert of a Python number to dtype t (`value.to<T>()`): floating types refuse
// finite values beyond their largest (nan passes; inf passes where the type has one, so not
// float8_e4m3fn); integer types refuse what is outside their range, except that an integer (or
// bool) number may be negative down to -max for an unsigned type (it wraps); a float number may not.
void CheckConverts(const OpArgs& a, const Scalar& s, DType t) {
  if (s.kind == Scalar::kComplex || s.kind == Scalar::kBool || t == DType::kPred || IsComplexT(t)) return;
  if (s.kind == Scalar::kInt && t == DType::kS64) return;
  const double v = s.AsDouble();
  const char* name = nullptr;
  double lo = 0, hi = 0;
  if (!C10Range(t, &name, &lo, &hi)) return;
  const bool floating = ir::IsFloating(t) || ir::IsFloat8(t);
  if (floating && (std::isnan(v) || (std::isinf(v) && t != DType::kF8E4M3FN))) return;
  if (t == DType::kU8 && s.kind == Scalar::kInt) lo = -hi;
  if (!(v >= lo && v <= hi)) a.Fail(std::string("value cannot be converted to type ") + name + " without overflow");
}

// fill_/full: checked as CheckConverts (even with no element to fill), except that eager fills a
// one-element float16/bfloat16/float8 tensor unchecked, through float (its scalar_fill: 1e6 gives
// inf in float16, 448 in float8_e4m3fn).
void CheckFillFits(const OpArgs& a, const Scalar& s, DType t, int64_t numel) {
  if (numel == 1 && (t == DType::kF16 || t == DType::kBF16 || ir::IsFloat8(t))) return;
  CheckConverts(a, s, t);
}

// random_(from, to): eager's check_from_to_in_range for integral, bool and f16 tensors (f32, f64 and
// bf16 only warn about precision).
void CheckRandomRange(OpArgs& a, int64_t from, std::optional<int64_t> to) {
  const char* name = nullptr;
  int64_t lo = 0, hi = 0;
  switch (a.V(0).dtype()) {
    case DType::kPred: name = "bool"; lo = 0; hi = 1; break;
    case DType::kU8: name = "unsigned char"; lo = 0; hi = 255; break;
    case DType::kS8: name = "signed char"; lo = -128; hi = 127; break;
    case DType::kS16: name = "short"; lo = -32768; hi = 32767; break;
    case DType::kS32: name = "int"; lo = -2147483648LL; hi = 2147483647LL; break;
    case DType::kF16: name = "c10::Half"; lo = -65504; hi = 65504; break;
    default: return;
  }
  if (from < lo || from > hi) a.Fail(std::string("from is out of bounds for ") + name);
  if (to && (*to - 1 < lo || *to - 1 > hi)) a.Fail(std::string("to - 1 is out of bounds for ") + name);
}

Rule IntegralAlpha(size_t alpha, bool scalar_other) {
  return [=](OpArgs& a) {
    if (a.IsNone(alpha)) return;
    DType t = scalar_other ? ResultType({&a.T(0)}, {&a.S(1)}) : ResultType({&a.T(0), &a.T(1)});
    if (a.S(alpha).kind == Scalar::kFloat && ir::IsIntegral(t, true)) {
      a.Fail("For integral input tensors, argument alpha must not be a floating point number.");
    }
    CheckConverts(a, a.S(alpha), t);  // add/sub's alpha.to<T>()
  };
}

// clamp's scalar bounds are converted to the result dtype with c10's checked conversion.
Rule ClampBoundsConvert(std::vector<size_t> bounds) {
  return [=](OpArgs& a) {
    std::vector<const Scalar*> ss;
    for (size_t k : bounds) if (!a.IsNone(k)) ss.push_back(&a.S(k));
    DType t = ResultType({&a.T(0)}, ss);
    for (const Scalar* sc : ss) CheckConverts(a, *sc, t);
  };
}

Rule IndexDtypes(size_t k) {
  return [=](OpArgs& a) {
    for (const auto& t : a.TL(k)) {
      if (!t.defined()) continue;
      DType d = t.v.dtype();
      if (!(ir::IsIntegral(d, true))) throw IndexError("tensors used as indices must be long, int, byte or bool tensors");
    }
  };
}

// Backward kernels eager runs only on one floating dtype: a grad of another dtype than its input
// (a bf16 grad of an f32 activation) raises there instead of promoting. Pairs of tensor arguments
// (undefined optionals skipped) must share their dtype.
Rule SameDTypes(std::vector<std::pair<size_t, size_t>> pairs) {
  return [=](OpArgs& a) {
    for (auto [i, j] : pairs) {
      if (a.IsNone(i) || a.IsNone(j)) continue;
      DType ti = a.V(i).dtype(), tj = a.V(j).dtype();
      if (ti != tj && ir::IsFloating(ti) && ir::IsFloating(tj)) {
        a.Fail(std::string("expected scalar type ") + TypeName(tj) + " but found " + TypeName(ti));
      }
    }
  };
}

// c10's C++ name of a dtype, as its "expected dtype" messages print it.
std::string C10Name(DType t) {
  const char* name;
  double lo, hi;
  if (C10Range(t, &name, &lo, &hi)) return name;
  switch (t) {
    case DType::kF64: return "double";
    case DType::kPred: return "bool";
    case DType::kC64: return "c10::complex<float>";
    case DType::kC128: return "c10::complex<double>";
    default: return TypeName(t);
  }
}

// lerp's meta checks, before its dtype dispatch: `end` has self's dtype; a tensor weight too unless
// it is 0-dim (then it is converted).
void LerpDTypes(OpArgs& a, bool tensor_weight) {
  DType t = a.V(0).dtype();
  if (a.V(1).dtype() != t) a.Fail("expected dtype " + C10Name(t) + " for `end` but got dtype " + C10Name(a.V(1).dtype()));
  if (tensor_weight && a.V(2).rank() > 0 && a.V(2).dtype() != t) {
    a.Fail("expected dtype " + C10Name(t) + " for `weight` but got dtype " + C10Name(a.V(2).dtype()));
  }
}

const std::unordered_map<std::string, Rule>& Rules() {
  static const auto* rules = new std::unordered_map<std::string, Rule>{
      {"native_layer_norm", [](OpArgs& a) {
         if (a.Ints(1).empty()) {
           a.Fail("Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but "
                  "got normalized_shape = []");
         }
         FloatKernel("LayerNormKernelImpl", 0, /*skip_empty=*/false)(a);  // eager dispatches on dtype even when empty
       }},
      {"_softmax", FloatKernel("softmax_lastdim_kernel_impl")},
      {"_log_softmax", FloatKernel("log_softmax_lastdim_kernel_impl")},
      {"lerp.Scalar", [](OpArgs& a) {
         LerpDTypes(a, false);
         FloatKernel("lerp_kernel_scalar")(a);
       }},
      {"lerp.Tensor", [](OpArgs& a) {
         LerpDTypes(a, true);
         FloatKernel("lerp_kernel_tensor")(a);
       }},
      {"var.correction", [](OpArgs& a) {
         DType t = a.V(0).dtype();
         if (!ir::IsFloating(t) && !IsComplexT(t)) a.Fail("std and var only support floating point and complex dtypes");
       }},
      {"std.correction", [](OpArgs& a) {
         DType t = a.V(0).dtype();
         if (!ir::IsFloating(t) && !IsComplexT(t)) a.Fail("std and var only support floating point and complex dtypes");
       }},
      {"linalg_vector_norm", [](OpArgs& a) {
         DType t = a.V(0).dtype();
         if (!ir::IsFloating(t) && !IsComplexT(t)) {
           a.Fail(std::string("linalg.vector_norm: Expected a floating point or complex tensor as input. Got ") + TypeName(t));
         }
         NormIdentityCheck(a, 1, 2);
       }},
      {"topk", NoBoolRuntime("topk does not support bool dtypes on CPU")},
      {"kthvalue", [](OpArgs& a) {
         // eager: k's range check, then a 0-dim input is returned as is (bool too; fuzz seed 9913),
         // then the dtype dispatch
         // A reduction dim of size 0 raises eager's IndexError before anything else (fuzz seed 11369).
         const Value& x = a.V(0);
         if (x.rank() > 0) {
           int64_t d0 = ir::NormalizeDim(a.Int(2), x.rank());
           if (x.dims()[d0] == 0) {
             throw IndexError("kthvalue(): Expected reduction dim " + std::to_string(d0) + " to have non-zero size.");
           }
         }
         if (x.rank() == 0 || x.dtype() != DType::kPred) return;
         int64_t d = ir::NormalizeDim(a.Int(2), x.rank()), k = a.Int(1);
         if (k < 1 || k > x.dims()[d]) return;  // the row raises eager's range error
         NotImpl("kthvalue_cpu", DType::kPred);
       }},
      {"round", NoBool("round_vml_cpu")},
      {"ceil", NoBool("ceil_vml_cpu")},
      {"floor", NoBool("floor_vml_cpu")},
      {"trunc", NoBool("trunc_vml_cpu")},  // fuzz seed 12143
      {"silu", FloatKernel("silu_cpu", 0, false)},
      {"softplus", FloatKernel("softplus_cpu", 0, false)},
      {"gelu", FloatKernel("GeluKernelImpl", 0, false)},
      {"bitwise_not", [](OpArgs& a) {
         if (ir::IsFloating(a.V(0).dtype())) NotImpl("bitwise_not_cpu", a.V(0).dtype());
       }},
      {"neg", [](OpArgs& a) {
         if (a.V(0).dtype() == DType::kPred) {
           a.Fail("Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a "
                  "mask, use the `~` or `logical_not()` operator instead.");
         }
       }},
      {"div.Tensor_mode", [](OpArgs& a) {
         if (a.IsNone(2) || ResultType({&a.T(0), &a.T(1)}) != DType::kPred) return;
         BroadcastShapes(a.V(0).dims(), a.V(1).dims());  // eager checks shapes first (fuzz seed 12808)
         NotImpl(a.Str(2) == "trunc" ? "div_trunc_cpu" : "div_floor_cpu", DType::kPred);
       }},
      {"norm.Scalar", FloatNorm()},
      {"norm.ScalarOpt_dim", FloatNorm(2)},
      {"norm.ScalarOpt_dim_dtype", FloatNorm(2)},
      {"bitwise_and.Tensor", BitwiseInts("bitwise_and_cpu", false)},
      {"bitwise_and.Scalar", BitwiseInts("bitwise_and_cpu", true)},
      {"bitwise_or.Tensor", BitwiseInts("bitwise_or_cpu", false)},
      {"bitwise_or.Scalar", BitwiseInts("bitwise_or_cpu", true)},
      {"bitwise_xor.Tensor", BitwiseInts("bitwise_xor_cpu", false)},
      {"bitwise_xor.Scalar", BitwiseInts("bitwise_xor_cpu", true)},
      {"masked_fill.Scalar", [](OpArgs& a) { CheckConverts(a, a.S(2), a.V(0).dtype()); }},
      {"index_fill.int_Scalar", [](OpArgs& a) { CheckConverts(a, a.S(3), a.V(0).dtype()); }},
      {"constant_pad_nd", [](OpArgs& a) { CheckConverts(a, a.S(2), a.V(0).dtype()); }},
      {"argmax", NoBoolRuntime("argmax(): does not support bool input")},
      {"argmin", NoBoolRuntime("argmin(): does not support bool input")},
      {"abs", NoBool("abs_cpu")},
      {"dot", [](OpArgs& a) {
         // eager checks dot's dtype even for empty vectors, after its shape checks (fuzz seed 10798)
         const Value &x = a.V(0), &y = a.V(1);
         if (x.rank() != 1 || y.rank() != 1) {
           a.Fail("1D tensors expected, but got " + std::to_string(x.rank()) + "D and " + std::to_string(y.rank()) +
                  "D tensors");
         }
         if (x.dtype() != y.dtype()) {
           a.Fail(std::string("dot : expected both vectors to have same dtype, but found ") + TypeName(x.dtype()) +
                  " and " + TypeName(y.dtype()));
         }
         int64_t n = x.dims()[0], m = y.dims()[0];
         if (n != m) {
           a.Fail("inconsistent tensor size, expected tensor [" + std::to_string(n) + "] and src [" + std::to_string(m) +
                  "] to have the same number of elements, but got " + std::to_string(n) + " and " + std::to_string(m) +
                  " elements respectively");
         }
         NoBool("dot")(a);
       }},
      {"fmod.Tensor", BoolTensorPair("fmod_cpu")},
      {"fmod.Scalar", [](OpArgs& a) {
         if (ResultType({&a.T(0)}, {&a.S(1)}) == DType::kPred) NotImpl("fmod_cpu", DType::kPred);
       }},
      {"remainder.Tensor", BoolTensorPair("remainder_cpu")},
      {"remainder.Scalar", [](OpArgs& a) {
         if (ResultType({&a.T(0)}, {&a.S(1)}) == DType::kPred) NotImpl("remainder_cpu", DType::kPred);
       }},
      {"mm", NoBoolProduct("addmm_impl_cpu_", {0, 1})},
      {"addmm", NoBoolProduct("addmm_impl_cpu_", {1, 2})},
      {"bmm", NoBoolProduct("bmm", {0, 1})},
      {"addmv", [](OpArgs& a) {
         // eager's meta: self, mat and vec share one dtype (mv(f32 mat, bf16 vec) raises; fuzz seed 10053)
         DType s = a.V(0).dtype(), m = a.V(1).dtype(), v = a.V(2).dtype();
         if (s != m || m != v) {
           a.Fail(std::string("addmv input tensors must have the same dtype, but got ") + TypeName(s) + ", " +
                  TypeName(m) + ", and " + TypeName(v));
         }
         NoBoolProduct("addmv_impl_cpu", {1, 2})(a);
       }},
      {"addcdiv", [](OpArgs& a) {
         if (ir::IsIntegral(a.V(1).dtype(), true) && ir::IsIntegral(a.V(2).dtype(), true)) {
           a.Fail("Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform "
                  "a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as "
                  "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as "
                  "(input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the "
                  "latter implementation: (input + value * tensor1 / tensor2), for all dtypes.");
         }
       }},
      {"pow.Tensor_Tensor", BoolTensorPair("pow")},
      {"hypot", FloatPair("hypot_cpu")},
      {"leaky_relu", FloatKernel("leaky_relu_cpu", 0, false)},
      {"median", NoBool("median_cpu")},
      {"median.dim", NoBool("median_out")},
      {"trace", NoBool("trace")},
      {"pow.Tensor_Scalar", [](OpArgs& a) {  // f16/bf16: the exponent.to<scalar_t>() (checked)
         DType t = ResultType({&a.T(0)}, {&a.S(1)});
         double ev = a.S(1).AsDouble();
         bool special = ev == 0 || ev == 1 || ev == 2 || ev == 3 || ev == 0.5 || ev == -0.5 || ev == -1 || ev == -2;
         if ((t == DType::kF16 || t == DType::kBF16) && !special) CheckConverts(a, a.S(1), t);
       }},
      {"clamp", ClampBoundsConvert({1, 2})},
      {"clamp_min", ClampBoundsConvert({1})},
      {"clamp_max", ClampBoundsConvert({1})},
      {"hardtanh", [](OpArgs& a) {
         DType t = a.V(0).dtype();
         if (t == DType::kPred) a.Fail("Bool inputs not supported for hardtanh");
         if (ir::IsUnsigned(t) && (a.S(1).AsDouble() < 0 || a.S(2).AsDouble() < 0)) {
           a.Fail("cannot do hardtanh on an unsigned type with negative limits");
         }
       }},
      {"logaddexp", FloatPair("logaddexp_cpu")},
      {"pow.Scalar", [](OpArgs& a) {  // `True ** bool_tensor` (fuzz seed 21022)
         if (ResultType({&a.T(1)}, {&a.S(0)}) == DType::kPred) NotImpl("pow", DType::kPred);
       }},
      {"add.Tensor", IntegralAlpha(2, false)},
      {"sub.Tensor", IntegralAlpha(2, false)},
      {"add.Scalar", IntegralAlpha(2, true)},
      {"sub.Scalar", IntegralAlpha(2, true)},
      {"rsub.Tensor", IntegralAlpha(2, false)},
      {"rsub.Scalar", IntegralAlpha(2, true)},
      {"full", [](OpArgs& a) {
         if (auto t = a.OptDType(2)) {
           int64_t n = 1;
           for (int64_t d : a.Ints(0)) n *= d;
           CheckFillFits(a, a.S(1), *t, n);
         }
       }},
      {"fill.Scalar", [](OpArgs& a) { CheckFillFits(a, a.S(1), a.V(0).dtype(), a.V(0).shape().numel()); }},
      {"random.from", [](OpArgs& a) {
         auto to = a.OptInt(2);
         if (to && a.Int(1) >= *to) {
           a.Fail("random_ expects 'from' to be less than 'to', but got from=" + std::to_string(a.Int(1)) +
                  " >= to=" + std::to_string(*to));
         }
         CheckRandomRange(a, a.Int(1), to);
       }},
      {"random.to", [](OpArgs& a) {
         if (a.Int(1) <= 0) {
           a.Fail("random_ expects 'from' to be less than 'to', but got from=0 >= to=" + std::to_string(a.Int(1)));
         }
         CheckRandomRange(a, 0, a.Int(1));
       }},
      {"arange.start_step", [](OpArgs& a) {
         double lo = a.S(0).AsDouble(), hi = a.S(1).AsDouble();
         if (!std::isfinite(lo) || !std::isfinite(hi)) {
           auto str = [](double v) {
             if (std::isnan(v)) return std::string("nan");
             if (std::isinf(v)) return std::string(v > 0 ? "inf" : "-inf");
             std::string s = std::to_string(v);
             while (s.find('.') != std::string::npos && (s.back() == '0' || s.back() == '.')) s.pop_back();
             return s;
           };
           a.Fail("unsupported range: " + str(lo) + " -> " + str(hi));
         }
       }},
      {"index.Tensor", IndexDtypes(1)},
      {"_unsafe_index.Tensor", IndexDtypes(1)},
      {"index_put", IndexDtypes(1)},
      {"_unsafe_index_put", IndexDtypes(1)},
      {"_index_put_impl", IndexDtypes(1)},
      // mixed grad/input dtypes: eager's kernels refuse them (activations that promote are in the rows)
      {"log_sigmoid_backward", SameDTypes({{0, 1}})},
      {"huber_loss_backward", SameDTypes({{0, 1}})},
      {"binary_cross_entropy_backward", SameDTypes({{0, 1}})},
      {"_softmax_backward_data", SameDTypes({{0, 1}})},
      {"_log_softmax_backward_data", SameDTypes({{0, 1}})},
      {"nll_loss_backward", SameDTypes({{0, 1}})},
      {"nll_loss2d_backward", SameDTypes({{0, 1}})},
      {"native_layer_norm_backward", SameDTypes({{0, 1}})},
      {"native_group_norm_backward", SameDTypes({{0, 1}})},
      {"native_batch_norm_backward", SameDTypes({{0, 1}})},
      {"batch_norm_backward", SameDTypes({{0, 1}})},
      {"_prelu_kernel_backward", SameDTypes({{0, 1}})},
      {"_scaled_dot_product_flash_attention_for_cpu_backward", SameDTypes({{0, 1}, {4, 1}})},
      {"grid_sampler_2d_backward", SameDTypes({{0, 1}, {1, 2}})},
      {"convolution_backward", SameDTypes({{0, 1}, {1, 2}})},
      {"convolution_backward_overrideable", SameDTypes({{0, 1}, {1, 2}})},
      {"max_pool1d_with_indices_backward", SameDTypes({{0, 1}})},
      {"max_pool2d_with_indices_backward", SameDTypes({{0, 1}})},
      {"max_pool3d_with_indices_backward", SameDTypes({{0, 1}})},
      {"avg_pool1d_backward", SameDTypes({{0, 1}})},
      {"avg_pool2d_backward", SameDTypes({{0, 1}})},
      {"avg_pool3d_backward", [](OpArgs& a) {
         SameDTypes({{0, 1}})(a);
         NoReducedFloat("avg_pool3d_backward_out_frame", 1)(a);
       }},
      {"avg_pool3d", NoReducedFloat("avg_pool3d_out_frame", 0)},
      {"_adaptive_avg_pool2d_backward", SameDTypes({{0, 1}})},
      {"_adaptive_avg_pool3d_backward", SameDTypes({{0, 1}})},
      {"adaptive_max_pool2d_backward", SameDTypes({{0, 1}})},
  };
  return *rules;
}

// Data movement: rows that only copy, reshape, select or concatenate values, with no arithmetic on
// them. Right for every dtype the device holds (complex and float8 included).
const char* const kMovementRows[] = {
  "_reshape_alias_copy", "_unsafe_view", "alias_copy", "as_strided_copy", "cat", "clone", "constant_pad_nd",
  "copy", "detach_copy", "diagonal_copy", "expand_copy", "lift_fresh_copy", "narrow_copy", "permute_copy",
  "select_copy.int", "slice_copy.Tensor", "split_copy.Tensor", "split_with_sizes_copy", "squeeze_copy",
  "squeeze_copy.dim", "squeeze_copy.dims", "stack", "t_copy", "transpose_copy.int", "unbind_copy.int",
  "unsqueeze_copy", "unfold_copy", "view_copy", "index.Tensor", "_unsafe_index.Tensor", "index_select", "slice_scatter",
  "select_scatter", "empty.memory_format", "empty_strided", "new_empty_strided",
};

// Rows whose lowering is right for complex operands (checked against eager by
// scripts/survey_complex.py over torch's OpInfos). Any other row given a complex tensor (or a
// complex number) runs on the CPU fallback: eager's values where eager supports the dtype, eager's
// exception where it does not. Before this list, ordering ops (max, clamp, sort, comparisons)
// ordered complex numbers by their real part, some lowerings (cosh, lerp, addmm, norms) gave wrong
// values, and remainder/hardtanh crashed XLA's compiler (issue #7).
const std::unordered_set<std::string>& ComplexRows() {
  static const auto* rows = [] {
    auto* r = new std::unordered_set<std::string>(std::begin(kMovementRows), std::end(kMovementRows));
    r->insert({
      // more data movement (conjugation, fills, scatters, flips, rolls, shuffles)
      "_conj_copy", "_conj_physical", "as_strided_scatter", "diag_embed", "diagonal_scatter", "fill.Scalar",
      "fill.Tensor", "flip", "full", "gather", "index_copy", "index_fill.int_Scalar", "index_fill.int_Tensor",
      "index_put", "_index_put_impl", "_unsafe_index_put", "masked_fill.Scalar", "masked_fill.Tensor",
      "masked_scatter", "put", "repeat", "roll", "select_backward", "slice_backward", "take", "tril", "triu",
      "where.self", "zero", "scatter.src", "scatter.value", "pixel_shuffle", "pixel_unshuffle",
      "channel_shuffle",
      // arithmetic whose complex lowering matches eager, special values (inf, nan, signed zeros)
      // included. Division, abs, sgn, pow and the transcendental functions do not (XLA's complex
      // division by zero gives nan where eager gives inf, sqrt(-2.5-0j) has the other sign, abs of
      // nan+1j is finite...): they run on the CPU.
      "add.Scalar", "add.Tensor", "sub.Scalar", "sub.Tensor", "rsub.Scalar", "rsub.Tensor", "mul.Scalar",
      "mul.Tensor", "neg", "eq.Scalar", "eq.Tensor", "ne.Scalar", "ne.Tensor", "isnan", "sum", "sum.dim_IntList",
      "mean", "mean.dim", "mm", "bmm", "dot", "vdot", "cumsum", "_foreach_add.List", "_foreach_add.Scalar",
      "_foreach_add.ScalarList", "_foreach_add.Tensor", "_foreach_sub.List", "_foreach_sub.Scalar",
      "_foreach_sub.ScalarList", "_foreach_mul.List", "_foreach_mul.Scalar", "_foreach_mul.ScalarList",
      "_foreach_mul.Tensor", "_foreach_neg",
      "_foreach_zero"});
    return r;
  }();
  return *rows;
}

bool HasComplexOperand(const OpArgs& a) {
  for (const Arg& arg : a.args) {
    switch (arg.kind) {
      case Arg::kTensor:
        if (arg.t.defined() && IsComplexT(arg.t.v.dtype())) return true;
        break;
      case Arg::kTensorList:
      case Arg::kOptTensorList:
        for (const auto& t : arg.tl) {
          if (t.defined() && IsComplexT(t.v.dtype())) return true;
        }
        break;
      case Arg::kScalar:
        if (arg.s.kind == Scalar::kComplex) return true;
        break;
      case Arg::kScalarList:
        for (const auto& sc : arg.sl) {
          if (sc.kind == Scalar::kComplex) return true;
        }
        break;
      default:
        break;
    }
  }
  return false;
}

// Rows whose lowering is right for float8 (e4m3fn, e5m2) operands: data movement, and copy (the
// conversions, through float as eager). Eager's CPU kernels compute almost nothing in float8 (add,
// mul, sum, clamp, flip, gather raise "not implemented"; abs, eq, mm, _scaled_mm do compute): any
// other row with a float8 operand or result runs on the CPU fallback, so its values and its
// exceptions are eager's. Operands mixing float8 with another floating dtype also go there (eager
// refuses to promote float8), except in copy.
const std::unordered_set<std::string>& Float8Rows() {
  static const auto* rows = new std::unordered_set<std::string>(std::begin(kMovementRows), std::end(kMovementRows));
  return *rows;
}

// 0: no float8 operand; 1: float8 operands, other operands integral/bool only (indices, masks);
// 2: float8 mixed with another floating or complex dtype.
int Float8Operands(const OpArgs& a) {
  std::optional<DType> f8;
  bool other_float = false;
  auto see = [&](DType t) {
    if (ir::IsFloat8(t)) {
      if (f8 && *f8 != t) other_float = true;
      f8 = t;
    } else if (ir::IsFloating(t) || ir::IsComplex(t)) {
      other_float = true;
    }
  };
  for (const auto& arg : a.args) {
    if (arg.kind == Arg::kTensor && arg.t.defined()) see(arg.t.v.dtype());
    if (arg.kind == Arg::kTensorList || arg.kind == Arg::kOptTensorList) {
      for (const auto& t : arg.tl) if (t.defined()) see(t.v.dtype());
    }
  }
  if (!f8) return 0;
  return other_float ? 2 : 1;
}
}  // namespace

void WrapLegality(std::vector<OpRow>& rows) {
  const auto& rules = Rules();
  const auto& complex_rows = ComplexRows();
  const auto& f8_rows = Float8Rows();
  for (auto& row : rows) {
    auto it = rules.find(row.aten);
    OpFn fn = row.fn;
    Rule rule = it == rules.end() ? Rule() : it->second;
    bool complex_ok = complex_rows.count(row.aten) > 0;
    bool f8_ok = f8_rows.count(row.aten) > 0, f8_converts = row.aten == "copy";
    row.fn = [fn, rule, complex_ok, f8_ok, f8_converts](OpArgs& a) {
      if (!complex_ok && HasComplexOperand(a)) throw NotLowered{};
      int f8 = Float8Operands(a);
      if (f8 != 0 && (!f8_ok || (f8 == 2 && !f8_converts))) throw NotLowered{};
      if (rule) rule(a);
      auto outs = fn(a);
      if (!f8_ok) {
        for (const auto& v : outs) {
          if (v && ir::IsFloat8(v.dtype())) throw NotLowered{};  // a float8 result (a factory's dtype=)
        }
      }
      return outs;
    };
  }
}

}  // namespace txla::ops
