// Eager's check that an in-place op's output does not share memory with one of its inputs
// (issue #7, fuzz seed 5165):
//
//   x = torch.arange(4.).to(d); x.unfold(0, 2, 1).mul_(x)   # eager: RuntimeError "unsupported
//   operation: some elements of the input tensor and the written-to tensor refer to a single
//   memory location"
//
// The check needs storage identity, which functionalization's meta replay drops (each operand
// becomes a fresh meta tensor, without even its storage offset). The user's tensors still have it:
// every view of an XLA tensor is a FunctionalTensorWrapper sharing its base's storage, with eager's
// sizes, strides and offset. So the check runs one dispatch key above functionalization, at
// ADInplaceOrView, whose kernel for an in-place op only redispatches and bumps `self`'s version. We
// replace that kernel for the in-place ops whose eager kernels make this check: for XLA tensors it
// compares `self` with each tensor operand as eager's MemoryOverlap does (both dense and
// non-overlapping, same storage, byte ranges), then does exactly what the generated kernel did.
// Tensors of other devices pay one more call (TXLA_INPLACE_OVERLAP_CHECK=0 turns it off).
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Operators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <string>

#include "bridge/bridge.h"

namespace txla::bridge {
namespace {

enum class Lap { kNo, kPartial, kFull, kTooHard };

// As eager's get_overlap_status, on the storage offsets instead of data pointers (the storage of
// an XLA tensor has none).
Lap OverlapStatus(const at::Tensor& a, const at::Tensor& b) {
  const c10::TensorImpl* ai = a.unsafeGetTensorImpl();
  const c10::TensorImpl* bi = b.unsafeGetTensorImpl();
  if (ai == bi) return Lap::kFull;
  // Symbolic shapes (dynamo's fake tensors) and Python subclasses: nothing to compare here.
  for (const c10::TensorImpl* i : {ai, bi}) {
    if (i->has_symbolic_sizes_strides() || i->key_set().has(c10::DispatchKey::Python)) return Lap::kNo;
  }
  if (ai->numel() == 0 || bi->numel() == 0) return Lap::kNo;
  const c10::Storage& as = ai->unsafe_storage();
  if (!as || as.unsafeGetStorageImpl() != bi->unsafe_storage().unsafeGetStorageImpl()) return Lap::kNo;
  if (!ai->is_non_overlapping_and_dense() || !bi->is_non_overlapping_and_dense()) return Lap::kTooHard;
  int64_t a0 = ai->storage_offset() * static_cast<int64_t>(ai->itemsize());
  int64_t a1 = a0 + ai->numel() * static_cast<int64_t>(ai->itemsize());
  int64_t b0 = bi->storage_offset() * static_cast<int64_t>(bi->itemsize());
  int64_t b1 = b0 + bi->numel() * static_cast<int64_t>(bi->itemsize());
  if (a0 == b0 && a1 == b1) return ai->strides() == bi->strides() ? Lap::kFull : Lap::kPartial;
  if (a0 < b1 && b0 < a1) return Lap::kPartial;
  return Lap::kNo;
}

[[noreturn]] void Raise() {
  TORCH_CHECK(false,
              "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
              "memory location. Please clone() the tensor before performing the operation.");
}

// A non-dense operand sharing self's storage (eager's overlap check gives up: "too hard"): eager then
// computes element after element and reads values it has already written wherever an element of
// `other` is written at another position of `self`, so its result depends on its loop order (fuzz
// seed 23413: x2 = x[:, ::3]; x2.transpose(0, 1).add_(x2)). We compute from the values before the
// op; rather than a different answer, refuse as for an overlapping read-modify-write.
void CheckOrderDependent(const at::Tensor& self, const at::Tensor& other) {
  auto positions = [](const at::Tensor& t) {
    int64_t extent = t.storage_offset() + 1;
    for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
    return at::arange(extent, at::TensorOptions().dtype(at::kLong)).as_strided(t.sizes(), t.strides(), t.storage_offset());
  };
  // contiguous: isin's CPU kernel views its operands flat, which a strided one refuses (fuzz seed
  // 54110: x = t[::2]; x.transpose(1, 1).add_(x) raised "view size is not compatible").
  at::Tensor ws = positions(self).contiguous();
  at::Tensor rs = positions(other).expand(self.sizes()).contiguous();
  at::Tensor written = at::isin(rs, ws);
  if ((written & rs.ne(ws)).any().item<bool>()) {
    TORCH_CHECK(false,
                "unsupported operation: the written-to tensor and an input of this in-place op share elements at "
                "different positions (a non-contiguous view of the same tensor): eager applies the write element "
                "after element, reading values it has just written, so its result depends on its kernel's iteration "
                "order. Please clone() the input before performing the operation.");
  }
}

// One argument of an in-place op against `self`. full: eager's assert_no_overlap (index and scatter
// ops reject even an operand equal to self); else TensorIterator's assert_no_partial_overlap.
template <bool Full>
void CheckArg(const at::Tensor& self, const at::Tensor& other) {
  if (!other.defined() || other.device().type() != c10::DeviceType::XLA) return;
  if (!Full && other.unsafeGetTensorImpl() == self.unsafeGetTensorImpl()) return;
  Lap lap = OverlapStatus(self, other);
  if (lap == Lap::kPartial || (Full && lap == Lap::kFull)) Raise();
  if (!Full && lap == Lap::kTooHard && other.dim() <= self.dim()) {
    bool broadcastable = true;
    for (int64_t i = 1; i <= other.dim() && broadcastable; ++i) {
      int64_t o = other.size(-i), s = self.size(-i);
      broadcastable = o == s || o == 1;
    }
    if (broadcastable) CheckOrderDependent(self, other);
  }
}
template <bool Full>
void CheckArg(const at::Tensor& self, const std::optional<at::Tensor>& other) {
  if (other.has_value()) CheckArg<Full>(self, *other);
}
template <bool Full>
void CheckArg(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& others) {
  for (const std::optional<at::Tensor> t : others) CheckArg<Full>(self, t);
}
template <bool Full, typename T>
void CheckArg(const at::Tensor&, const T&) {}

// What the generated ADInplaceOrView kernel of in-place op `Op` (an at::_ops struct) does: redispatch
// below ADInplaceOrView, then bump self's version.
// A non-contiguous `self` keeps its layout (see KeepLayoutOfWrite, functionalize.cc): where the
// functional op's result did not get it (an op functionalization runs as several), it is set here.
template <typename Op, typename... Args>
at::Tensor& Redispatch(c10::DispatchKeySet ks, at::Tensor& self, Args&&... args) {
  const bool keep = self.device().type() == c10::DeviceType::XLA && self.dim() >= 1 && !self.is_contiguous();
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  if (keep) sizes = self.sizes().vec(), strides = self.strides().vec(), offset = self.storage_offset();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    Op::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, std::forward<Args>(args)...);
  }
  if (keep && self.sizes().equals(sizes) && (!self.strides().equals(strides) || self.storage_offset() != offset)) {
    self.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    SetEagerLayout(self, sizes, strides, offset);
  }
  torch::autograd::impl::bump_version(self);
  return self;
}

// The ADInplaceOrView kernel of in-place op `Op` (an at::_ops struct): the generated one (redispatch
// below ADInplaceOrView, bump self's version) with the check first. Unboxed, so that CPU tensors
// pay one extra call and a device test, nothing more.
template <typename Op, bool Full, typename Sig = typename Op::schema>
struct Checked;
template <typename Op, bool Full, typename... Args>
struct Checked<Op, Full, at::Tensor&(at::Tensor&, Args...)> {
  static at::Tensor& fn(c10::DispatchKeySet ks, at::Tensor& self, Args... args) {
    if (self.device().type() == c10::DeviceType::XLA) (CheckArg<Full>(self, args), ...);
    return Redispatch<Op>(ks, self, args...);
  }
};

// copy_ into a view whose elements overlap (unfold with step < size, as_strided): eager writes the
// source element after element in its TensorIterator's order, and a memory location covered twice
// keeps the value written last. Functionalization sees only the view's new value, so the reverse of
// the view could not tell which write came last (it took the last changed element in row-major
// order: `b.unfold(0, 2, 1).copy_(src)` left 1 where eager leaves 0, fuzz seed 70569). Here the
// order is eager's own: the same TensorIterator (an add into a CPU index buffer laid out as `self`,
// with `src`'s strides for its operand) says which source element lands on each location, and the
// copy becomes an index_put_ of those elements into a flat view of the storage (unique positions).
bool OverlappingView(const at::Tensor& self) {
  return !self.is_non_overlapping_and_dense() && ElementsOverlap(self.sizes(), self.strides()) &&
         at::has_internal_overlap(self) != at::MemOverlap::Yes;  // stride 0: eager's own error follows
}

bool OnXla(const at::Tensor& self) { return self.device().type() == c10::DeviceType::XLA; }

// Writes `source`'s elements into `self`'s storage as `replay` (the op, run by eager on CPU index
// buffers: `window` laid out as self, `ids` holding each source element's row-major index) says
// they land: per location, the element written last. One index_put_ into a flat view of the
// storage, at unique positions; self's version is bumped as the in-place op's would be.
void WriteAsReplayed(at::Tensor& self, const at::Tensor& source, const at::Tensor& ids_layout,
                     const std::function<void(at::Tensor&, const at::Tensor&)>& replay) {
  int64_t extent = self.storage_offset() + 1;
  for (int64_t d = 0; d < self.dim(); ++d) extent += (self.size(d) - 1) * self.stride(d);
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  at::Tensor written = at::full({extent}, -1, lopt);
  at::Tensor window = written.as_strided(self.sizes(), self.strides(), self.storage_offset());
  replay(window, ids_layout);
  at::Tensor pos = at::nonzero(written.ge(0)).view({-1});
  at::Tensor which = written.index_select(0, pos);
  at::Tensor vals = source.to(self.device(), self.scalar_type()).reshape({-1}).index_select(0, which.to(self.device()));
  at::Tensor flat = self.as_strided({extent}, {1}, 0);
  c10::List<std::optional<at::Tensor>> index;
  index.push_back(pos.to(self.device()));
  flat.index_put_(index, vals);
  torch::autograd::impl::bump_version(self);
}

// The source's element ids (row-major), laid out with its strides where it has its own elements
// (the strides decide TensorIterator's order), else contiguous.
at::Tensor SourceIds(const at::Tensor& source) {
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  at::Tensor ids = at::arange(source.numel(), lopt).view(source.sizes());
  if (!source.is_non_overlapping_and_dense()) return ids;
  return at::empty_strided(source.sizes(), source.strides(), lopt).copy_(ids);
}

// copy_ into a view whose elements overlap (unfold with step < size, as_strided): eager writes the
// source element after element in its TensorIterator's order, and a memory location covered twice
// keeps the value written last. Functionalization sees only the view's new value, so the reverse of
// the view could not tell which write came last (it took the last changed element in row-major
// order: `b.unfold(0, 2, 1).copy_(src)` left 1 where eager leaves 0, fuzz seed 70569). Here the
// order is eager's own: the same TensorIterator (an add into a CPU index buffer laid out as `self`,
// zeros with `src`'s strides as one operand, the view's element ids as the other) says which element
// lands on each location. index_put_, masked_scatter_, scatter_ (src), index_copy_ and put_ into such
// views likewise replay the op.
bool CopyIntoOverlappingView(at::Tensor& self, const at::Tensor& src) {
  if (!OverlappingView(self) || !src.defined() || src.is_complex() != self.is_complex()) return false;
  if (!at::is_expandable_to(src.sizes(), self.sizes())) return false;  // eager's error follows
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  at::Tensor order = at::empty_strided(src.sizes(), src.strides(), lopt).zero_().expand(self.sizes());
  WriteAsReplayed(self, src.expand(self.sizes()), order, [&](at::Tensor& window, const at::Tensor& zeros) {
    at::add_out(window, zeros, at::arange(self.numel(), lopt).view(self.sizes()));
  });
  return true;
}

at::Tensor& CopyInplaceChecked(c10::DispatchKeySet ks, at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (OnXla(self)) {
    CheckArg<false>(self, src);
    at::AutoDispatchBelowADInplaceOrView guard;
    if (CopyIntoOverlappingView(self, src)) return self;
  }
  return Redispatch<at::_ops::copy_>(ks, self, src, non_blocking);
}

// An index-writing op into an overlapping view: when `self` is one and `source` can be written
// into it, replays the op (`replay(window, ids)` on CPU index buffers) and writes the source's
// elements where eager's would land; false otherwise (the op runs as usual).
bool ReplayIntoOverlappingView(at::Tensor& self, const at::Tensor& source,
                               const std::function<void(at::Tensor&, const at::Tensor&)>& replay) {
  if (!OverlappingView(self) || !source.defined() || source.is_complex() != self.is_complex()) return false;
  at::AutoDispatchBelowADInplaceOrView guard;
  WriteAsReplayed(self, source, SourceIds(source), replay);
  return true;
}

at::Tensor& IndexPutInplaceChecked(c10::DispatchKeySet ks, at::Tensor& self,
                                   const c10::List<std::optional<at::Tensor>>& indices, const at::Tensor& values,
                                   bool accumulate) {
  if (OnXla(self)) {
    CheckArg<true>(self, indices);
    CheckArg<true>(self, values);
    if (!accumulate && ReplayIntoOverlappingView(self, values, [&](at::Tensor& window, const at::Tensor& ids) {
          c10::List<std::optional<at::Tensor>> cpu;
          for (const std::optional<at::Tensor> t : indices) {
            cpu.push_back(t && t->defined() ? std::optional<at::Tensor>(t->cpu()) : std::nullopt);
          }
          window.index_put_(cpu, ids, false);
        })) {
      return self;
    }
  }
  return Redispatch<at::_ops::index_put_>(ks, self, indices, values, accumulate);
}

at::Tensor& ScatterSrcInplaceChecked(c10::DispatchKeySet ks, at::Tensor& self, int64_t dim, const at::Tensor& index,
                                     const at::Tensor& src) {
  if (OnXla(self)) {
    CheckArg<true>(self, index);
    CheckArg<true>(self, src);
    if (index.defined() && ReplayIntoOverlappingView(self, src, [&](at::Tensor& window, const at::Tensor& ids) {
          window.scatter_(dim, index.cpu(), ids);
        })) {
      return self;
    }
  }
  return Redispatch<at::_ops::scatter__src>(ks, self, dim, index, src);
}

at::Tensor& IndexCopyInplaceChecked(c10::DispatchKeySet ks, at::Tensor& self, int64_t dim, const at::Tensor& index,
                                    const at::Tensor& source) {
  if (OnXla(self)) {
    CheckArg<true>(self, index);
    CheckArg<true>(self, source);
    if (index.defined() && ReplayIntoOverlappingView(self, source, [&](at::Tensor& window, const at::Tensor& ids) {
          window.index_copy_(dim, index.cpu(), ids);
        })) {
      return self;
    }
  }
  return Redispatch<at::_ops::index_copy_>(ks, self, dim, index, source);
}

// put_ without accumulate writes source[i] to self's element index[i] (row-major), the last one
// winning; with accumulate it reads what it writes and stays refused for such views.
at::Tensor& PutInplaceChecked(c10::DispatchKeySet ks, at::Tensor& self, const at::Tensor& index,
                              const at::Tensor& source, bool accumulate) {
  if (OnXla(self)) {
    CheckArg<true>(self, index);
    CheckArg<true>(self, source);
    if (!accumulate && index.defined() &&
        ReplayIntoOverlappingView(self, source, [&](at::Tensor& window, const at::Tensor& ids) {
          window.put_(index.cpu(), ids, false);
        })) {
      return self;
    }
  }
  return Redispatch<at::_ops::put_>(ks, self, index, source, accumulate);
}

at::Tensor& MaskedScatterInplaceChecked(c10::DispatchKeySet ks, at::Tensor& self, const at::Tensor& mask,
                                        const at::Tensor& source) {
  if (OnXla(self) && mask.scalar_type() == at::kBool && at::is_expandable_to(mask.sizes(), self.sizes()) &&
      ReplayIntoOverlappingView(self, source, [&](at::Tensor& window, const at::Tensor& ids) {
        window.masked_scatter_(mask.cpu(), ids);
      })) {
    return self;
  }
  return Redispatch<at::_ops::masked_scatter_>(ks, self, mask, source);
}

}  // namespace

void RegisterInplaceOverlapChecks() {
  const char* env = std::getenv("TXLA_INPLACE_OVERLAP_CHECK");
  if (env && std::string(env) == "0") return;
  // In-place ops whose eager kernels are TensorIterators (partial overlap with an input raises;
  // an input equal to self is fine). The list is every aten in-place overload with a written
  // `self` and another tensor operand for which eager CPU raises this error, found by
  // scripts/enum_inplace_overlap.py, which calls each such overload with a partially overlapping
  // operand and with `self` itself on eager CPU and on XLA and prints where the two differ
  // (aliases such as subtract_, multiply_, clip_, __iand__ decompose into ops listed here). Not
  // here because eager accepts the overlap: masked_fill_, masked_scatter_, ldexp_, addmm_,
  // addmv_, baddbmm_, addbmm_, index_fill_, fill_; or because they have no tensor operand
  // besides self.
  auto& dispatcher = c10::Dispatcher::singleton();
  static torch::Library* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
  struct Quiet : c10::WarningHandler {
    void process(const c10::Warning&) override {}  // the override of the generated kernel is deliberate
  } quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  // Only ops that have a generated ADInplaceOrView kernel (the one replaced).
  auto has = [&](const char* name, const char* overload) {
    std::string n(name);
    auto op = dispatcher.findOp({n, overload});
    return op && op->hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
  };
#define TXLA_OVERLAP(OP, FULL)                                                                   \
  if (has(at::_ops::OP::name, at::_ops::OP::overload_name)) {                                    \
    std::string key = std::string(at::_ops::OP::name).substr(6);                                 \
    if (*at::_ops::OP::overload_name) key += std::string(".") + at::_ops::OP::overload_name;     \
    lib->impl(key.c_str(), TORCH_FN((Checked<at::_ops::OP, FULL>::fn)));                          \
  }
  TXLA_OVERLAP(add__Tensor, false) TXLA_OVERLAP(sub__Tensor, false) TXLA_OVERLAP(mul__Tensor, false)
  TXLA_OVERLAP(div__Tensor, false) TXLA_OVERLAP(div__Tensor_mode, false)
  TXLA_OVERLAP(pow__Tensor, false) TXLA_OVERLAP(atan2_, false) TXLA_OVERLAP(fmod__Tensor, false)
  TXLA_OVERLAP(remainder__Tensor, false) TXLA_OVERLAP(lerp__Scalar, false) TXLA_OVERLAP(lerp__Tensor, false)
  TXLA_OVERLAP(addcmul_, false) TXLA_OVERLAP(addcdiv_, false) TXLA_OVERLAP(clamp__Tensor, false)
  TXLA_OVERLAP(clamp_min__Tensor, false) TXLA_OVERLAP(clamp_max__Tensor, false) TXLA_OVERLAP(hypot_, false)
  TXLA_OVERLAP(copysign__Tensor, false) TXLA_OVERLAP(xlogy__Tensor, false) TXLA_OVERLAP(eq__Tensor, false)
  TXLA_OVERLAP(ne__Tensor, false) TXLA_OVERLAP(lt__Tensor, false) TXLA_OVERLAP(le__Tensor, false)
  TXLA_OVERLAP(gt__Tensor, false) TXLA_OVERLAP(ge__Tensor, false) TXLA_OVERLAP(logical_and_, false)
  TXLA_OVERLAP(logical_or_, false) TXLA_OVERLAP(logical_xor_, false) TXLA_OVERLAP(bitwise_and__Tensor, false)
  TXLA_OVERLAP(bitwise_or__Tensor, false) TXLA_OVERLAP(bitwise_xor__Tensor, false)
  TXLA_OVERLAP(bitwise_left_shift__Tensor, false) TXLA_OVERLAP(bitwise_right_shift__Tensor, false)
  TXLA_OVERLAP(__ilshift___Tensor, false) TXLA_OVERLAP(__irshift___Tensor, false)
  TXLA_OVERLAP(floor_divide__Tensor, false) TXLA_OVERLAP(nextafter_, false) TXLA_OVERLAP(heaviside_, false)
  TXLA_OVERLAP(igamma_, false) TXLA_OVERLAP(igammac_, false) TXLA_OVERLAP(gcd_, false) TXLA_OVERLAP(lcm_, false)
  TXLA_OVERLAP(float_power__Tensor, false) TXLA_OVERLAP(_add_relu__Tensor, false) TXLA_OVERLAP(addr_, false)
  TXLA_OVERLAP(bernoulli__Tensor, false)
  // Index and scatter ops: eager's assert_no_overlap (an operand equal to self raises as well).
  TXLA_OVERLAP(index_add_, true)
  TXLA_OVERLAP(scatter__reduce, true) TXLA_OVERLAP(scatter_add_, true) TXLA_OVERLAP(scatter_reduce__two, true)
  TXLA_OVERLAP(index_reduce_, true)
  TXLA_OVERLAP(_index_put_impl_, true)
#undef TXLA_OVERLAP
  // With a write into a view whose elements overlap in eager's order (CopyIntoOverlappingView).
  if (has(at::_ops::copy_::name, at::_ops::copy_::overload_name)) lib->impl("copy_", TORCH_FN(CopyInplaceChecked));
  if (has(at::_ops::index_put_::name, at::_ops::index_put_::overload_name)) {
    lib->impl("index_put_", TORCH_FN(IndexPutInplaceChecked));
  }
  if (has(at::_ops::scatter__src::name, at::_ops::scatter__src::overload_name)) {
    lib->impl("scatter_.src", TORCH_FN(ScatterSrcInplaceChecked));
  }
  if (has(at::_ops::index_copy_::name, at::_ops::index_copy_::overload_name)) {
    lib->impl("index_copy_", TORCH_FN(IndexCopyInplaceChecked));
  }
  if (has(at::_ops::put_::name, at::_ops::put_::overload_name)) lib->impl("put_", TORCH_FN(PutInplaceChecked));
  if (has(at::_ops::masked_scatter_::name, at::_ops::masked_scatter_::overload_name)) {
    lib->impl("masked_scatter_", TORCH_FN(MaskedScatterInplaceChecked));
  }
}

}  // namespace txla::bridge
