// Host kernels: ATen's own CPU kernels (MKL/oneDNN GEMM and convolution, eager's exact routines)
// run inside XLA:CPU executables as typed XLA FFI custom calls. The IR emits kHostCall nodes for
// large dots and for convolutions once these handlers are registered (ir::HostKernels()); XLA
// keeps fusing everything around them. Each handler views XLA's buffers as CPU tensors (no copy)
// and writes its results into XLA's result buffers.
//
// Parameters (attrs "p", one i64 array) are laid out by the IR builders (csrc/ir/ir.cc HostDot,
// csrc/ops/rows_conv.cc HostConv*). Errors become XLA FFI errors (the execution fails with the
// message, which reaches Python as a RuntimeError); nothing aborts.
#ifdef TXLA_HAVE_XLA_FFI

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/InferenceMode.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <optional>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <xla/ffi/api/c_api.h>

#include "runtime/ffi_handler.h"
#include "runtime/runtime.h"
#include "graph/spmd.h"
#include "ir/ir.h"

namespace txla::bridge {
namespace {

at::ScalarType ScalarTypeOf(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_F32: return at::kFloat;
    case XLA_FFI_DataType_F64: return at::kDouble;
    case XLA_FFI_DataType_BF16: return at::kBFloat16;
    case XLA_FFI_DataType_F16: return at::kHalf;
    default: throw std::invalid_argument("host kernel: unsupported element type " + std::to_string(t));
  }
}

at::Tensor View(void* p) {
  auto* b = static_cast<XLA_FFI_Buffer*>(p);
  std::vector<int64_t> dims(b->dims, b->dims + b->rank);
  return at::from_blob(b->data, dims, at::TensorOptions().dtype(ScalarTypeOf(b->dtype)).device(at::kCPU));
}

// The call frame's operands, results and the "p" attribute.
struct Frame {
  std::vector<at::Tensor> args, rets;
  std::vector<int64_t> p;
};

Frame Read(XLA_FFI_CallFrame* cf) {
  Frame f;
  for (int64_t i = 0; i < cf->args.size; ++i) {
    if (cf->args.types[i] != XLA_FFI_ArgType_BUFFER) throw std::invalid_argument("host kernel: non-buffer operand");
    f.args.push_back(View(cf->args.args[i]));
  }
  for (int64_t i = 0; i < cf->rets.size; ++i) {
    if (cf->rets.types[i] != XLA_FFI_RetType_BUFFER) throw std::invalid_argument("host kernel: non-buffer result");
    f.rets.push_back(View(cf->rets.rets[i]));
  }
  for (int64_t i = 0; i < cf->attrs.size; ++i) {
    const XLA_FFI_ByteSpan* name = cf->attrs.names[i];
    if (name->len != 1 || name->ptr[0] != 'p') continue;
    if (cf->attrs.types[i] != XLA_FFI_AttrType_ARRAY) throw std::invalid_argument("host kernel: attribute p is not an array");
    auto* arr = static_cast<XLA_FFI_Array*>(cf->attrs.attrs[i]);
    if (arr->dtype != XLA_FFI_DataType_S64) throw std::invalid_argument("host kernel: attribute p is not i64");
    auto* d = static_cast<const int64_t*>(arr->data);
    f.p.assign(d, d + arr->size);
  }
  return f;
}

std::vector<int64_t> Take(const std::vector<int64_t>& p, size_t* pos, int64_t n) {
  if (n < 0 || *pos + n > p.size()) throw std::invalid_argument("host kernel: malformed parameters");
  std::vector<int64_t> v(p.begin() + *pos, p.begin() + *pos + n);
  *pos += n;
  return v;
}

int64_t Prod(const at::Tensor& t, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= t.size(d);
  return n;
}

// OpenMP's per-thread setting, found at run time (torch loads libgomp; no link-time dependency).
struct OmpThreads {
  using Get = int (*)();
  using Set = void (*)(int);
  Get get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  Set set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
};

// [nb, nc, nfa, nfb, lb..., lc..., lf..., rb..., rc..., rf...]: out[B, M, N] = lhs[B, M, K] rhs[B, K, N].
void Dot(Frame& f) {
  size_t pos = 4;
  if (f.p.size() < 4 || f.args.size() != 2 || f.rets.size() != 1) throw std::invalid_argument("host dot: bad call");
  int64_t nb = f.p[0], nc = f.p[1], nfa = f.p[2], nfb = f.p[3];
  auto lb = Take(f.p, &pos, nb), lc = Take(f.p, &pos, nc), lf = Take(f.p, &pos, nfa);
  auto rb = Take(f.p, &pos, nb), rc = Take(f.p, &pos, nc), rf = Take(f.p, &pos, nfb);
  const at::Tensor &a = f.args[0], &b = f.args[1];
  int64_t B = Prod(a, lb), M = Prod(a, lf), K = Prod(a, lc), N = Prod(b, rf);
  std::vector<int64_t> pa(lb), pb(rb);
  pa.insert(pa.end(), lf.begin(), lf.end());
  pa.insert(pa.end(), lc.begin(), lc.end());
  pb.insert(pb.end(), rc.begin(), rc.end());
  pb.insert(pb.end(), rf.begin(), rf.end());
  // Permuted views; reshape copies only where the grouped dims are not adjacent in memory.
  at::Tensor l = a.permute(pa).reshape({B, M, K}), r = b.permute(pb).reshape({B, K, N});
  at::Tensor out = f.rets[0].view({B, M, N});
  // oneDNN's f32 matmul (ATen's at::native::mkldnn_matmul, found at run time): for every f32 host dot
  // with TXLA_HOST_DOT_ONEDNN=1, else for the big ones (kind "bigdot"). at::mm otherwise (MKL).
  using Fn = void (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, float, float);
  static const Fn dnnl = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "_ZN2at6native13mkldnn_matmulERKNS_6TensorES3_S3_ff"));
  static const bool dnnl_all = [] {
    const char* v = std::getenv("TXLA_HOST_DOT_ONEDNN");
    return v != nullptr && std::string(v) == "1";
  }();
  if (dnnl != nullptr && a.scalar_type() == at::kFloat &&
      (dnnl_all || (ir::HostBigDots() && B * M * N * K >= ir::HostBigDotMinFlops()))) {
    if (B == 1) {
      dnnl(l.select(0, 0), r.select(0, 0), out.select(0, 0), 0.f, 1.f);
    } else {
      dnnl(l, r, out, 0.f, 1.f);
    }
    return;
  }
  if (B == 1) {
    at::Tensor o2 = out.select(0, 0);
    at::mm_out(o2, l.select(0, 0), r.select(0, 0));
  } else {
    at::bmm_out(out, l, r);
  }
}

struct ConvArgs {
  int64_t nsp = 0, groups = 1;
  bool transposed = false;
  std::vector<int64_t> stride, padding, dilation, output_padding;
  std::vector<int64_t> rest;
};

// [nsp, transposed, groups, stride..., padding..., dilation..., output_padding..., rest...]
ConvArgs ReadConv(const std::vector<int64_t>& p) {
  if (p.size() < 3) throw std::invalid_argument("host conv: malformed parameters");
  ConvArgs c;
  c.nsp = p[0];
  c.transposed = p[1] != 0;
  c.groups = p[2];
  size_t pos = 3;
  c.stride = Take(p, &pos, c.nsp);
  c.padding = Take(p, &pos, c.nsp);
  c.dilation = Take(p, &pos, c.nsp);
  c.output_padding = Take(p, &pos, c.nsp);
  c.rest.assign(p.begin() + pos, p.end());
  return c;
}

void Conv(Frame& f) {
  if (f.args.size() != 2 || f.rets.size() != 1) throw std::invalid_argument("host conv: bad call");
  ConvArgs c = ReadConv(f.p);
  at::convolution_out(f.rets[0], f.args[0], f.args[1], std::nullopt, c.stride, c.padding, c.dilation, c.transposed,
                      c.output_padding, c.groups);
}

// operands (grad_output, input, weight); rest = [input mask, weight mask]; one result per mask set.
void ConvBackward(Frame& f) {
  ConvArgs c = ReadConv(f.p);
  if (f.args.size() != 3 || c.rest.size() != 2) throw std::invalid_argument("host conv_bwd: bad call");
  std::array<bool, 3> mask{c.rest[0] != 0, c.rest[1] != 0, false};
  if (f.rets.size() != static_cast<size_t>(mask[0] + mask[1])) throw std::invalid_argument("host conv_bwd: bad results");
  auto [gi, gw, gb] = at::convolution_backward(f.args[0], f.args[1], f.args[2], std::nullopt, c.stride, c.padding,
                                               c.dilation, c.transposed, c.output_padding, c.groups, mask);
  size_t k = 0;
  if (mask[0]) f.rets[k++].copy_(gi);
  if (mask[1]) f.rets[k++].copy_(gw);
}

// TORCH_XLA_HOST_KERNEL_THREADS=n: ATen's kernels inside an executable use n OpenMP threads (set on
// the calling thread for the call only: OpenMP's thread count is a per-thread setting, so eager ops
// on other threads keep theirs). Unset or 0: ATen's own setting. XLA runs independent parts of the
// executable on its own threads meanwhile; with 1, a host kernel never spins up a second team beside
// them (OpenMP's idle threads busy-wait, which on a loaded machine costs more than the GEMM).
int HostKernelThreads() {
  static const int n = [] {
    const char* v = std::getenv("TORCH_XLA_HOST_KERNEL_THREADS");
    if (v == nullptr || *v == '\0') return 0;
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 4096) {
      throw std::invalid_argument(std::string("TORCH_XLA_HOST_KERNEL_THREADS=") + v +
                                  " is not a thread count (0 = ATen's setting, or 1..4096)");
    }
    return static_cast<int>(x);
  }();
  return n;
}

class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) {
    static const OmpThreads omp;
    if (n <= 0 || omp.get == nullptr || omp.set == nullptr) return;
    set_ = omp.set;
    old_ = omp.get();
    if (old_ != n) omp.set(n); else set_ = nullptr;
  }
  ~ScopedOmpThreads() {
    if (set_ != nullptr) set_(old_);
  }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  OmpThreads::Set set_ = nullptr;
  int old_ = 0;
};

// operand x; params: the reduced dims (sorted); result: x summed over them, as eager's at::sum
// (its vectorized cascade, the same rounding as eager's own sum of x).
void Sum(Frame& f) {
  if (f.args.size() != 1 || f.rets.size() != 1) throw std::invalid_argument("host sum: bad call");
  // One thread: these sums are a few MB at most, and a second OpenMP team inside an executable
  // competes with XLA's own threads (its idle members busy-wait).
  ScopedOmpThreads one(1);
  at::sum_out(f.rets[0], f.args[0], f.p, /*keepdim=*/false, f.rets[0].scalar_type());
}

double DoubleFromBits(int64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// Training-mode batch norm, eager's kernel (batch_norm_cpu): operands (x, [w], [b], [rm, rv]);
// params [has_w, has_b, has_stats, eps bits, momentum bits]; results (out, save_mean,
// save_invstd, [rm, rv]): the running statistics are copied into their results, which ATen then
// updates in place as eager updates the module's buffers.
void BatchNorm(Frame& f) {
  if (f.p.size() != 5) throw std::invalid_argument("host bn: malformed parameters");
  bool has_w = f.p[0] != 0, has_b = f.p[1] != 0, stats = f.p[2] != 0;
  size_t need = 1 + has_w + has_b + (stats ? 2 : 0);
  if (f.args.size() != need || f.rets.size() != (stats ? 5u : 3u)) throw std::invalid_argument("host bn: bad call");
  size_t k = 1;
  std::optional<at::Tensor> w, b, rm, rv;
  if (has_w) w = f.args[k++];
  if (has_b) b = f.args[k++];
  if (stats) {
    f.rets[3].copy_(f.args[k++]);
    f.rets[4].copy_(f.args[k++]);
    rm = f.rets[3];
    rv = f.rets[4];
  }
  at::native_batch_norm_out(f.rets[0], f.rets[1], f.rets[2], f.args[0], w, b, rm, rv, /*training=*/true,
                            DoubleFromBits(f.p[4]), DoubleFromBits(f.p[3]));
}

// Its backward (batch_norm_backward_cpu, train=true): operands (dy, x, [w], save_mean, save_invstd);
// params [has_w, eps bits, mask...]; one result per mask entry set.
void BatchNormBackward(Frame& f) {
  if (f.p.size() != 5) throw std::invalid_argument("host bn_bwd: malformed parameters");
  bool has_w = f.p[0] != 0;
  std::array<bool, 3> mask{f.p[2] != 0, f.p[3] != 0, f.p[4] != 0};
  if (f.args.size() != 4u + has_w || f.rets.size() != static_cast<size_t>(mask[0] + mask[1] + mask[2])) {
    throw std::invalid_argument("host bn_bwd: bad call");
  }
  size_t k = 2;
  std::optional<at::Tensor> w;
  if (has_w) w = f.args[k++];
  const at::Tensor& mean = f.args[k++];
  const at::Tensor& invstd = f.args[k++];
  auto [gi, gw, gb] = at::native_batch_norm_backward(f.args[0], f.args[1], w, std::nullopt, std::nullopt, mean, invstd,
                                                     /*train=*/true, DoubleFromBits(f.p[1]), mask);
  size_t r = 0;
  if (mask[0]) f.rets[r++].copy_(gi);
  if (mask[1]) f.rets[r++].copy_(gw);
  if (mask[2]) f.rets[r++].copy_(gb);
}

template <void (*Kernel)(Frame&)>
XLA_FFI_Error* Handle(XLA_FFI_CallFrame* cf) {
  if (runtime::AnswerFfiMetadata(cf)) return nullptr;
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;
  try {
    // Plain CPU kernels, whatever the calling thread's dispatch state (XLA may run the call on the
    // Python thread that launched the executable): no autograd, no Python modes, no functionalization.
    c10::InferenceMode guard;
    c10::impl::ExcludeDispatchKeyGuard no_modes(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                             c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                             c10::DispatchKey::FuncTorchDynamicLayerBackMode, c10::DispatchKey::AutocastCPU}));
    ScopedOmpThreads threads(HostKernelThreads());
    Frame f = Read(cf);
    Kernel(f);
    return nullptr;
  } catch (const std::exception& e) {
    return runtime::FfiError(cf, std::string("torch_xla host kernel failed: ") + e.what());
  }
}

// TORCH_XLA_HOST_KERNELS: "conv,reduce" (default: convolutions and large sums), "dot" (every large
// dot), "tdot" (only dots whose right operand is contracted along its minor dimension), "conv",
// "reduce", any comma-separated list of these, "1"/"all" (every kind), "0"/"none" (none; handlers
// not even registered).
struct Kinds {
  bool dots = false, convs = false, transposed_only = false, reductions = false, norms = false, big_dots = false;
};
Kinds KindsFromEnv() {
  const char* v = std::getenv("TORCH_XLA_HOST_KERNELS");
  std::string s = v ? v : "conv,reduce,bigdot";
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  Kinds k;
  bool all_dots = false;
  if (s == "1" || s == "all" || s == "true") return {true, true, false, true, true, true};
  if (s == "0" || s == "none" || s == "false" || s.empty()) return k;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t e = s.find(',', pos);
    std::string w = s.substr(pos, e == std::string::npos ? std::string::npos : e - pos);
    if (w == "dot" || w == "dots") {
      k.dots = true;
      all_dots = true;
    } else if (w == "tdot" || w == "tdots") {
      k.dots = true;
      k.transposed_only = true;
    } else if (w == "bigdot" || w == "bigdots") {
      k.big_dots = true;
    } else if (w == "conv" || w == "convs") {
      k.convs = true;
    } else if (w == "reduce" || w == "reductions" || w == "sum") {
      k.reductions = true;
    } else if (w == "norm" || w == "norms" || w == "bn") {
      k.norms = true;
    } else if (!w.empty()) {
      throw std::invalid_argument("TORCH_XLA_HOST_KERNELS: unknown kind '" + w +
                                  "' (expected conv, dot, tdot, bigdot, reduce, norm, all or 0, or a comma-separated list)");
    }
    if (e == std::string::npos) break;
    pos = e + 1;
  }
  if (all_dots) k.transposed_only = false;
  return k;
}

bool g_registered = false;

}  // namespace

// Called once when the client starts (graph::SetClientStartHook).
// Registration is per plugin library (XLA's handler registry is static there), so a later client of
// the same plugin reuses it. A plugin that refuses is used without host kernels, with a warning.
void RegisterHostKernels(runtime::Client& client) {
  Kinds kinds = KindsFromEnv();
  if ((!kinds.dots && !kinds.convs && !kinds.reductions && !kinds.norms && !kinds.big_dots) ||
      client.PlatformName() != "cpu") {
    return;
  }
  HostKernelThreads();  // a bad TORCH_XLA_HOST_KERNEL_THREADS is an error here, not in an execution
  static std::set<const void*> registered;
  if (!registered.count(client.api())) {
    struct Entry {
      const char* kernel;
      XLA_FFI_Handler* fn;
    };
    const Entry entries[] = {{"dot", &Handle<Dot>},
                             {"conv", &Handle<Conv>},
                             {"conv_bwd", &Handle<ConvBackward>},
                             {"sum", &Handle<Sum>},
                             {"bn", &Handle<BatchNorm>},
                             {"bn_bwd", &Handle<BatchNormBackward>}};
    try {
      for (const Entry& e : entries) {
        if (!client.RegisterFfiHandler(ir::HostKernelTarget(e.kernel), reinterpret_cast<void*>(e.fn), "host")) return;
      }
    } catch (const std::exception& e) {
      TORCH_WARN("torch_xla: the CPU plugin refused the host kernels (", e.what(),
                 "); XLA compiles every dot and convolution itself");
      return;
    }
    registered.insert(client.api());
  }
  g_registered = true;
  // SPMD graphs keep XLA's dots (use_spmd() may come before the client starts).
  if (!graph::spmd::Enabled()) {
    ir::SetHostKernels(kinds.dots, kinds.convs);
    ir::SetHostReductions(kinds.reductions);
    ir::SetHostNorms(kinds.norms);
    ir::SetHostBigDots(kinds.big_dots);
  }
  ir::SetHostDotsTransposedOnly(kinds.transposed_only);
}

// Switches host reductions for graphs traced from now on (tests, export); only where registered.
void SetHostReductionKind(bool on) { ir::SetHostReductions(on && g_registered && !graph::spmd::Enabled()); }

// Switches host batch norm for graphs traced from now on (tests, export); only where registered.
void SetHostNormKind(bool on) { ir::SetHostNorms(on && g_registered && !graph::spmd::Enabled()); }

// Switches big dots for graphs traced from now on (tests, export); only where registered.
void SetHostBigDotKind(bool on) { ir::SetHostBigDots(on && g_registered && !graph::spmd::Enabled()); }

// Switches the kinds for graphs traced from now on (tests, export); only where registered.
void SetHostKernelKinds(bool dots, bool convs) {
  if (!g_registered || graph::spmd::Enabled()) {
    ir::SetHostKernels(false, false);
    return;
  }
  ir::SetHostKernels(dots, convs);
}

}  // namespace txla::bridge

#else  // !TXLA_HAVE_XLA_FFI

#include "runtime/runtime.h"

namespace txla::bridge {
void RegisterHostKernels(runtime::Client&) {}
void SetHostKernelKinds(bool, bool) {}
void SetHostReductionKind(bool) {}
void SetHostNormKind(bool) {}
void SetHostBigDotKind(bool) {}
}  // namespace txla::bridge

#endif
