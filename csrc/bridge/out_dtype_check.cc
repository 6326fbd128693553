// Eager's checks of an `out=` tensor's dtype (issue #7):
//
//   torch.add(x, y, out=torch.empty(1, dtype=torch.long, device=d))   # x float: eager raises
//   "result type Float can't be cast to the desired output type Long"
//
// Functionalization turns an out= op into its functional op and then replaces `out`'s value with
// the result, casting it to `out`'s dtype; unlike in-place ops, it never runs the out= op's meta
// kernel, so eager's dtype checks (TensorIterator's safe-casting rule, `mm`'s "Expected out tensor
// to have dtype ...", `cat`'s TypeError, ...) were skipped and the result silently cast.
//
// Here the ADInplaceOrView kernel of every out= overload (it only redispatches and bumps the
// outputs' versions) is replaced by one that, for XLA outputs whose dtype differs from an input's
// (the only case where eager's dtype rules can refuse), first runs the overload's own meta kernel
// on meta copies of the arguments: eager's error, with eager's type and message, at the op. Same
// dtypes skip the meta call, so an out= op on XLA pays a dtype comparison per tensor argument.
// The kernel is boxed (one per schema, hundreds of ops), so an out= call on a CPU tensor pays
// the boxing of its arguments (bench/bench_inplace_overlap.py measures it);
// TXLA_OUT_DTYPE_CHECK=0 turns it off.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/overflows.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "bridge/bridge.h"
#include "util/metrics.h"

namespace txla::bridge {
namespace {

at::Tensor ToMeta(const at::Tensor& t) {
  // CPU scalars (wrapped Python numbers among them) stay: meta kernels take them as eager does.
  if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

// "torch.float32" -> Float (c10's name, which eager's messages use).
std::string DtypeName(const std::string& torch_name) {
  static const std::pair<const char*, c10::ScalarType> names[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool},      {"complex64", at::kComplexFloat},
      {"complex128", at::kComplexDouble}};
  std::string n = torch_name.rfind("torch.", 0) == 0 ? torch_name.substr(6) : torch_name;
  for (const auto& [k, v] : names) {
    if (n == k) return c10::toString(v);
  }
  return torch_name;
}

// The meta kernels of many out= ops are torch's Python references, whose out= wrapper words the
// refusal differently ("Attempting to cast from torch.float32 to out tensor with dtype
// torch.int64, but this can't be cast because it is not safe!"): eager's message instead.
[[noreturn]] void RethrowAsEager(const c10::OperatorHandle& op, const std::exception& e) {
  std::string m = e.what();
  const std::string from = "Attempting to cast from ", to = " to out tensor with dtype ";
  size_t a = m.find(from), b = m.find(to);
  if (a == std::string::npos || b == std::string::npos || b < a) throw;
  std::string src = m.substr(a + from.size(), b - a - from.size());
  size_t c = b + to.size(), d = m.find_first_of(", ", c);
  std::string dst = DtypeName(m.substr(c, d == std::string::npos ? std::string::npos : d - c));
  if (op.schema().name() == "aten::cat") {
    TORCH_CHECK_TYPE(false, "torch.cat(): input types can't be cast to the desired output type ", dst);
  }
  TORCH_CHECK(false, "result type ", DtypeName(src), " can't be cast to the desired output type ", dst);
}

c10::IValue ToMeta(const c10::IValue& v) {
  if (v.isTensor()) return ToMeta(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(ToMeta(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(ToMeta(*t)) : std::nullopt);
    }
    return out;
  }
  return v;
}


// ---- eager's own verdict on an out= dtype the meta kernel accepts ----
//
// Many out= overloads have a Python meta kernel (a torch._refs reference registered over the C++
// structured meta at `import torch`) that accepts any safe cast into `out`, while eager's CPU kernel
// demands out's dtype equal the one it computes (`torch.neg(f32, out=f64)`: "Found dtype Double but
// expected Float"; `tril`, `index_select`, `softmax`, `amax`, ...). The C++ meta kernel is no longer
// reachable through the dispatcher, so eager's verdict is asked of eager itself: the out= overload
// runs on the CPU with small stand-ins (every tensor of the same dtype and rank, its own sizes up to
// 65,536 elements and sizes capped at 4 beyond, floats 1 and integers 0; CPU scalars and Python
// numbers as they are). Only when that call raises AND the same call with one `out` switched to
// another dtype (an input's first) succeeds is
// the refusal a dtype refusal: eager's exception is rethrown, with eager's type and message. Any
// other outcome (both succeed, both fail for another reason) checks nothing, so nothing eager
// accepts is refused. The verdict depends only on dtypes, capped sizes, non-tensor arguments and the
// values of CPU scalars (all in the cache key): it is cached per signature, so a given out= call pays the probe once per process.

// Stand-in sizes: the real ones for a tensor of up to 65,536 elements (integer arguments such as
// slice_scatter's start/end relate to them), else each capped at 4 (k-th value, top-k, windows need
// some room); the verdict is cached per dtypes, stand-in sizes and non-tensor arguments.
// TXLA_OUT_PROBE_VALUE_KEYS=1: key Python numbers by value, as before (for measurements).
bool value_keys() {
  static const bool on = [] {
    const char* e = std::getenv("TXLA_OUT_PROBE_VALUE_KEYS");
    return e && std::string(e) == "1";
  }();
  return on;
}

constexpr int64_t kStandinCap = 4;
constexpr int64_t kStandinRealNumel = 65536;

std::vector<int64_t> StandinSizes(const at::Tensor& t) {
  std::vector<int64_t> sizes = t.sizes().vec();
  if (t.numel() <= kStandinRealNumel) return sizes;
  for (int64_t& n : sizes) n = std::min<int64_t>(n, kStandinCap);
  return sizes;
}

// What of a Python number can decide eager's verdict on an out= call, instead of its value (so that an
// out= call with a scalar that changes every step, a decaying learning rate, pays the probe once):
// eager's type promotion reads only the number's category (bool/int/float/complex, in the key too);
// the value-dependent checks eager makes read the sign and zero (integer division and remainder by
// zero, integers to negative powers), NaN/inf, whether a float is integral, and, when the number is
// converted to the op's computation type, c10::overflows for that type (`value cannot be converted to
// type uint8_t without overflow`; for a uint8 computation an integer passes in [-255, 255], a float in
// [0, 255]), and, as some kernels wrap a number into a narrower integer type unchecked, the sign of the
// wrapped value for 8, 16 and 32 bits. The class records exactly these, overflows taken from c10 itself for every type a
// computation can have. tests/test_out_dtype_gaps.py checks, over out= overloads with a Scalar argument,
// that eager's verdict is the same for every value the class groups (tests/_probe_value_classes.py
// runs all 109). Complex and unsigned 64-bit numbers keep their value.
template <typename From>
void OverflowBits(std::ostringstream& k, From v) {
  k << c10::overflows<uint8_t, From>(v) << c10::overflows<int8_t, From>(v) << c10::overflows<int16_t, From>(v)
    << c10::overflows<int32_t, From>(v) << c10::overflows<int64_t, From>(v) << c10::overflows<uint16_t, From>(v)
    << c10::overflows<uint32_t, From>(v) << c10::overflows<c10::Half, From>(v)
    << c10::overflows<c10::BFloat16, From>(v) << c10::overflows<float, From>(v);
}

}  // namespace

std::string OutProbeValueClass(const c10::Scalar& s) {
  std::ostringstream k;
  auto sign = [&](double v) { k << (v < 0 ? "-" : v > 0 ? "+" : "0"); };
  if (s.isBoolean()) {
    k << (s.toBool() ? "T" : "F");
  } else if (s.isIntegral(false) &&
             (!s.isUnsigned() || s.toUInt64() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    // (isUnsigned() is also true of a non-negative int64; beyond int64 the number keeps its value)
    int64_t v = s.toLong();
    sign(static_cast<double>(v));
    if (v == 1 || v == -1) k << "1";
    OverflowBits<int64_t>(k, v);
    // Some kernels wrap a number into a narrower integer computation type without an overflow check
    // (`torch.fmod(uint8, 256)` divides by 0): the sign of the wrapped value for each width.
    auto wrapped = [&](auto w) { k << (w < 0 ? "-" : w > 0 ? "+" : "0"); };
    wrapped(static_cast<int8_t>(v));
    wrapped(static_cast<int16_t>(v));
    wrapped(static_cast<int32_t>(v));
  } else if (s.isFloatingPoint()) {
    double v = s.toDouble();
    if (std::isnan(v)) {
      k << "nan";
    } else if (std::isinf(v)) {
      k << (v > 0 ? "+inf" : "-inf");
    } else if (v == 0) {
      k << (std::signbit(v) ? "-0" : "+0");
    } else {
      sign(v);
      double a = std::fabs(v);
      k << (a == 1 ? "1" : "") << (a < 1 ? "<1" : "") << (std::trunc(v) == v ? "int" : "");
      OverflowBits<double>(k, v);
    }
  } else {
    k << s;
  }
  return k.str();
}

namespace {

void KeyOf(std::ostringstream& k, const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      k << "U";
    } else {
      k << "T" << static_cast<int>(t.scalar_type()) << "[";
      for (int64_t n : StandinSizes(t)) k << n << " ";
      k << "]"
        << (t.unsafeGetTensorImpl()->is_wrapped_number() ? "w" : "")
        << (t.device().is_cpu() && t.dim() == 0 ? "c" : "");
      // A CPU scalar (a Python number) reaches the probe as it is: its value class is part of the
      // verdict (eager's overflow checks of scalars into the out dtype).
      if (t.device().is_cpu() && t.dim() == 0) {
        k << "=";
        if (value_keys()) k << t.item(); else k << OutProbeValueClass(t.item());
      }
    }
  } else if (v.isTensorList()) {
    k << "L[";
    for (const at::Tensor& t : v.toTensorList()) KeyOf(k, t);
    k << "]";
  } else if (v.isOptionalTensorList()) {
    k << "O[";
    for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
      if (t.has_value()) KeyOf(k, *t); else k << "N";
    }
    k << "]";
  } else if (v.isScalar()) {
    k << "S" << (v.isDouble() ? "d" : v.isInt() ? "i" : v.isBool() ? "b" : "c");
    if (value_keys()) k << v; else k << OutProbeValueClass(v.toScalar());
  } else if (v.isGenerator()) {
    k << "G";
  } else {
    k << v;
  }
  k << ",";
}

// Stand-in values. Round 0: floats 1, integers 0 (a valid index into any non-empty dimension).
// Round 1, only when round 0 decided nothing (every call failed for a reason other than out's dtype):
// floats an identity in the last two dimensions (full rank: lstsq, solves), integers 1 (valid LU/LDL
// pivots, which are 1-based: lu_unpack, lu_solve, ldl_solve).
at::Tensor Standin(const at::Tensor& t, int round) {
  if (!t.defined() || (t.device().is_cpu() && t.dim() == 0)) return t;
  std::vector<int64_t> sizes = StandinSizes(t);
  auto opts = t.options().device(c10::kCPU);
  const bool floating = at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
  if (round == 0) return floating ? at::ones(sizes, opts) : at::zeros(sizes, opts);
  if (!floating) return at::ones(sizes, opts);
  if (sizes.size() < 2) return at::ones(sizes, opts);
  at::Tensor e = at::eye(sizes[sizes.size() - 2], sizes.back(), opts);
  return e.expand(sizes).contiguous();
}

c10::IValue Standin(const c10::IValue& v, int round) {
  if (v.isTensor()) return Standin(v.toTensor(), round);
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(Standin(t, round));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(Standin(*t, round)) : std::nullopt);
    }
    return out;
  }
  if (v.isGenerator()) return c10::IValue();  // the default CPU generator, whose state is restored
  return v;
}

// An out argument (a tensor or a list of them) with every tensor in dtype `c`.
c10::IValue WithDtype(const c10::IValue& v, c10::ScalarType c) {
  if (v.isTensor()) return v.toTensor().defined() ? c10::IValue(v.toTensor().to(c)) : v;
  c10::List<at::Tensor> out;
  for (const at::Tensor& t : v.toTensorList()) out.push_back(t.defined() ? t.to(c) : t);
  return out;
}

// Runs the overload on `stack` (CPU stand-ins); the exception it raised, or null.
std::exception_ptr TryCpu(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  try {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(&stack);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

std::exception_ptr EagerRefusal(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                                const std::vector<size_t>& outs) {
  std::ostringstream k;
  k << op.schema().name() << "." << op.schema().overload_name() << ":";
  for (const c10::IValue& v : args) KeyOf(k, v);
  static std::mutex mu;
  static auto* cache = new std::unordered_map<std::string, std::exception_ptr>();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache->find(k.str());
    if (it != cache->end()) return it->second;
  }
  std::exception_ptr verdict;
  metrics::IncrementCounter("OutDtypeProbe");  // an uncached verdict: the eager probe runs
  {
    // The probe must not consume the CPU generator (random out= ops) nor warn (resizes).
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
    }
    struct Quiet : c10::WarningHandler {
      void process(const c10::Warning&) override {}
    } quiet;
    c10::WarningUtils::WarningHandlerGuard wguard(&quiet);
    // Any dtype will do as the alternative: A failed and differs from an accepted call only in this
    // out's dtype, so eager refuses A for its dtype (the inputs' dtypes first: the usual demand).
    std::vector<c10::ScalarType> cands;
    auto add = [&](c10::ScalarType t) {
      if (std::find(cands.begin(), cands.end(), t) == cands.end()) cands.push_back(t);
    };
    for (const c10::IValue& v : args) {
      if (v.isTensor() && v.toTensor().defined()) add(v.toTensor().scalar_type());
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) add(t.scalar_type());
      }
    }
    for (c10::ScalarType t : {at::kFloat, at::kDouble, at::kLong, at::kInt, at::kBool, at::kHalf, at::kBFloat16}) add(t);
    for (int round = 0; round < 2; ++round) {
      torch::jit::Stack base;
      base.reserve(args.size());
      for (const c10::IValue& v : args) base.push_back(Standin(v, round));
      std::exception_ptr a = TryCpu(op, base);
      if (!a) break;  // eager accepts these dtypes
      bool accepted = false;
      for (size_t i : outs) {
        if (!(base[i].isTensor() && base[i].toTensor().defined()) && !base[i].isTensorList()) continue;
        c10::ScalarType own = base[i].isTensor() ? base[i].toTensor().scalar_type() : at::ScalarType::Undefined;
        for (c10::ScalarType c : cands) {
          if (c == own) continue;
          torch::jit::Stack alt;
          alt.reserve(args.size());
          for (size_t j = 0; j < args.size(); ++j) alt.push_back(Standin(args[j], round));  // fresh outs
          alt[i] = WithDtype(alt[i], c);
          if (!TryCpu(op, alt)) {
            accepted = true;
            break;
          }
        }
        if (accepted) break;
      }
      if (accepted) {
        verdict = a;
        break;
      }
    }
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
  std::lock_guard<std::mutex> lock(mu);
  // Bounded: a Python scalar that changes every step (its value is in the key) must not grow it forever.
  if (cache->size() >= 8192) cache->clear();
  cache->emplace(k.str(), verdict);
  return verdict;
}

struct OutCheck final : c10::OperatorKernel {
  OutCheck(std::vector<size_t> outs, std::vector<size_t> writes, bool has_meta)
      : outs_(std::move(outs)), writes_(std::move(writes)), has_meta_(has_meta) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto args = torch::jit::last(*stack, n);
    if (NeedsCheck(args) && !has_meta_) {
      if (probe_) {
        if (std::exception_ptr refused = EagerRefusal(op, args, outs_)) std::rethrow_exception(refused);
      }
    } else if (NeedsCheck(args)) {
      torch::jit::Stack meta;
      meta.reserve(n);
      for (const c10::IValue& v : args) meta.push_back(ToMeta(v));
      c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKeySet(c10::DispatchKey::Python));
      try {
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
      } catch (const c10::NotImplementedError&) {
        // no meta kernel for this overload (data-dependent shapes: nonzero): nothing to check here
      } catch (const c10::Error&) {
        // The meta kernel refuses: eager's own words when eager's kernel refuses this dtype too.
        if (probe_) {
          if (std::exception_ptr refused = EagerRefusal(op, args, outs_)) std::rethrow_exception(refused);
        }
        throw;
      } catch (const std::exception& e) {
        std::string m = e.what();
        if (m.find("NotImplementedError") == std::string::npos && m.find("unimplemented") == std::string::npos) {
          if (probe_) {
            if (std::exception_ptr refused = EagerRefusal(op, args, outs_)) std::rethrow_exception(refused);
          }
          RethrowAsEager(op, e);
        }
      }
      if (probe_) {
        if (std::exception_ptr refused = EagerRefusal(op, args, outs_)) std::rethrow_exception(refused);
      }
    }
    std::vector<at::Tensor> outs;
    for (const std::vector<size_t>* idx : {&outs_, &writes_}) {
      for (size_t i : *idx) {
        if (args[i].isTensor()) outs.push_back(args[i].toTensor());
        if (args[i].isTensorList()) {
          for (const at::Tensor& t : args[i].toTensorList()) outs.push_back(t);
        }
      }
    }
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    for (at::Tensor& t : outs) {
      if (t.defined()) torch::autograd::impl::bump_version(t);
    }
  }

  // An XLA output whose dtype differs from a tensor input's.
  bool NeedsCheck(c10::ArrayRef<c10::IValue> args) const {
    std::vector<at::Tensor> out_tensors;
    for (size_t i : outs_) {
      if (args[i].isTensor()) out_tensors.push_back(args[i].toTensor());
      if (args[i].isTensorList()) {
        for (const at::Tensor& t : args[i].toTensorList()) out_tensors.push_back(t);
      }
    }
    for (const at::Tensor& out : out_tensors) {
      if (!out.defined() || out.device().type() != c10::DeviceType::XLA) continue;
      for (size_t j = 0; j < args.size(); ++j) {
        if (std::find(outs_.begin(), outs_.end(), j) != outs_.end()) continue;
        const c10::IValue& v = args[j];
        if (v.isTensor()) {
          if (v.toTensor().defined() && v.toTensor().scalar_type() != out.scalar_type()) return true;
        } else if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorList()) {
            if (t.defined() && t.scalar_type() != out.scalar_type()) return true;
          }
        }
      }
    }
    return false;
  }

  std::vector<size_t> outs_, writes_;
  bool has_meta_;
  bool probe_ = [] {
    const char* e = std::getenv("TXLA_OUT_DTYPE_PROBE");
    return !(e && std::string(e) == "0");
  }();
};

}  // namespace

void RegisterOutDtypeChecks() {
  const char* env = std::getenv("TXLA_OUT_DTYPE_CHECK");
  if (env && std::string(env) == "0") return;
  auto& dispatcher = c10::Dispatcher::singleton();
  static torch::Library* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}  // the override of the generated kernel is deliberate
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    // Every out= overload: one without a meta kernel (masked_select, histogram: data-dependent shapes)
    // or whose composite kernel our XLA kernel replaces (softmax.int_out, linear.out) is checked by
    // the eager probe alone. For an op without a generated ADInplaceOrView kernel (a fallthrough),
    // this one does what the generated ones do.
    if (!op) continue;
    const auto& schema = op->schema();
    if (schema.is_mutable() == false) continue;
    // out= overloads: the written arguments are keyword-only (in-place ops write `self`).
    // A list of out tensors (`unbind_copy.int_out`, `split_with_sizes_copy.out`) counts as one out;
    // other written arguments (`_native_batch_norm_legit.out`'s running stats) are inputs whose
    // versions are bumped as the generated kernel does.
    std::vector<size_t> outs, writes;
    const auto& a = schema.arguments();
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].alias_info() || !a[i].alias_info()->isWrite()) continue;
      const c10::TypePtr& ty = a[i].type();
      const bool tensor = ty->kind() == c10::TypeKind::TensorType;
      const bool tensor_list = ty->kind() == c10::TypeKind::ListType &&
                               ty->containedTypes().size() == 1 &&
                               ty->containedTypes()[0]->kind() == c10::TypeKind::TensorType;
      if (!tensor && !tensor_list) {
        outs.clear();
        break;
      }
      (a[i].kwarg_only() ? outs : writes).push_back(i);
    }
    if (outs.empty()) continue;
    // bernoulli's eager kernel samples into any out dtype; its Python meta promotes and refuses.
    if (name.name == "aten::bernoulli") continue;
    std::string key = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(key.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<OutCheck>(
                                      std::move(outs), std::move(writes),
                                      op->hasKernelForDispatchKey(c10::DispatchKey::Meta))));
  }
}

}  // namespace txla::bridge
