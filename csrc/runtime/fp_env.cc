// See fp_env.h.
#include "runtime/fp_env.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "runtime/ffi_handler.h"
#include "runtime/runtime.h"

namespace txla::runtime {
namespace {

std::atomic<bool> g_registered{false};  // the plugin took the handler
std::atomic<bool> g_enabled{false};     // graphs use it (registered, TORCH_XLA_DENORMALS != flush)
std::atomic<int> g_pool_cleared{0};
std::atomic<bool> g_pool_done{false};

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFtzDaz = 0x8040u;  // MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6)
bool ThreadFlushes() { return (_mm_getcsr() & kFtzDaz) != 0; }
void KeepOnThisThread() { _mm_setcsr(_mm_getcsr() & ~kFtzDaz); }
#elif defined(__aarch64__)
constexpr uint64_t kFz = 1ull << 24;  // FPCR.FZ
bool ThreadFlushes() {
  uint64_t f;
  asm volatile("mrs %0, fpcr" : "=r"(f));
  return (f & kFz) != 0;
}
void KeepOnThisThread() {
  uint64_t f;
  asm volatile("mrs %0, fpcr" : "=r"(f));
  f &= ~kFz;
  asm volatile("msr fpcr, %0" : : "r"(f));
}
#else
bool ThreadFlushes() { return false; }
void KeepOnThisThread() {}
#endif

#ifdef TXLA_HAVE_XLA_FFI

// One round of clearing XLA's intra-op pool: n tasks, each clears its thread and then waits until
// all n have arrived (or a deadline), so that no thread runs two of them: n distinct threads.
struct PoolRound {
  std::mutex mu;
  std::condition_variable cv;
  int want = 0, arrived = 0, finished = 0;
  std::set<std::thread::id> threads;
  std::chrono::steady_clock::time_point deadline;
};

void PoolTask(void* data) {
  auto* holder = static_cast<std::shared_ptr<PoolRound>*>(data);
  std::shared_ptr<PoolRound> r = std::move(*holder);
  delete holder;
  KeepOnThisThread();
  std::unique_lock<std::mutex> l(r->mu);
  r->threads.insert(std::this_thread::get_id());
  ++r->arrived;
  r->cv.notify_all();
  r->cv.wait_until(l, r->deadline, [&] { return r->arrived >= r->want; });
  ++r->finished;
  r->cv.notify_all();
}

bool HasPoolApi(const XLA_FFI_Api* api) {
  if (api == nullptr) return false;
  size_t need = offsetof(XLA_FFI_Api, XLA_FFI_ThreadPool_NumThreads) + sizeof(void*);
  return api->struct_size >= need && api->XLA_FFI_ThreadPool_Schedule != nullptr &&
         api->XLA_FFI_ThreadPool_NumThreads != nullptr;
}

void DestroyError(const XLA_FFI_Api* api, XLA_FFI_Error* err) {
  if (err == nullptr) return;
  XLA_FFI_Error_Destroy_Args d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  d.error = err;
  api->XLA_FFI_Error_Destroy(&d);
}

// The pool's threads keep FTZ/DAZ for life (set when they were created), so clearing them once is
// enough. Tried at most three times (a round gives up after half a second if the pool is busy).
void ClearPool(XLA_FFI_CallFrame* cf) {
  static std::mutex mu;
  static int tries = 0;
  std::lock_guard<std::mutex> g(mu);
  if (g_pool_done.load() || tries >= 3) return;
  ++tries;
  const XLA_FFI_Api* api = cf->api;
  if (!HasPoolApi(api)) {
    g_pool_done.store(true);
    return;
  }
  int64_t n = 0;
  XLA_FFI_ThreadPool_NumThreads_Args na;
  std::memset(&na, 0, sizeof(na));
  na.struct_size = XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE;
  na.ctx = cf->ctx;
  na.num_threads = &n;
  if (XLA_FFI_Error* err = api->XLA_FFI_ThreadPool_NumThreads(&na)) {  // no pool: nothing to clear
    DestroyError(api, err);
    g_pool_done.store(true);
    return;
  }
  if (n <= 0) {
    g_pool_done.store(true);
    return;
  }
  auto r = std::make_shared<PoolRound>();
  r->want = static_cast<int>(n);
  r->deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  int scheduled = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto* holder = new std::shared_ptr<PoolRound>(r);
    XLA_FFI_ThreadPool_Schedule_Args sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.struct_size = XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE;
    sa.ctx = cf->ctx;
    sa.task = &PoolTask;
    sa.data = holder;
    if (XLA_FFI_Error* err = api->XLA_FFI_ThreadPool_Schedule(&sa)) {
      DestroyError(api, err);
      delete holder;
      break;
    }
    ++scheduled;
  }
  std::unique_lock<std::mutex> l(r->mu);
  r->cv.wait_until(l, r->deadline + std::chrono::milliseconds(100), [&] { return r->finished >= scheduled; });
  int cleared = static_cast<int>(r->threads.size() - r->threads.count(std::this_thread::get_id()));
  g_pool_cleared.store(cleared);
  if (cleared >= n || tries >= 3) {
    g_pool_done.store(true);
    if (cleared < n) {
      std::fprintf(stderr, "[torch_xla] denormals: %d of XLA's %lld intra-op threads could be set to keep them; "
                   "results computed on the others flush denormals to zero\n", cleared, static_cast<long long>(n));
    }
  }
}

XLA_FFI_Error* FpEnvHandler(XLA_FFI_CallFrame* cf) {
  if (AnswerFfiMetadata(cf)) return nullptr;
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;
  KeepOnThisThread();  // the executing thread: XLA set FTZ/DAZ for this execution; undone at its end
  if (!g_pool_done.load(std::memory_order_acquire)) ClearPool(cf);
  return nullptr;
}

#endif  // TXLA_HAVE_XLA_FFI

}  // namespace

const char* FpEnvTarget() { return "txla_fp_env"; }

bool StartFpEnv(Client& client) {
  const char* v = std::getenv("TORCH_XLA_DENORMALS");
  std::string mode = v ? v : "keep";
  for (auto& c : mode) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (mode != "keep" && mode != "flush" && !mode.empty()) {
    throw std::invalid_argument("TORCH_XLA_DENORMALS=" + std::string(v) +
                                ": expected 'keep' (eager's behaviour, the default) or 'flush' (XLA:CPU's)");
  }
  g_enabled.store(false);
  if (mode == "flush" || client.PlatformName() != "cpu") return false;
#ifdef TXLA_HAVE_XLA_FFI
  static std::set<const void*> registered;  // XLA's handler registry is per plugin library
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  if (!registered.count(client.api())) {
    try {
      if (!client.RegisterFfiHandler(FpEnvTarget(), reinterpret_cast<void*>(&FpEnvHandler), "host")) return false;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[torch_xla] the CPU plugin refused the denormal handler (%s); XLA:CPU flushes denormals\n",
                   e.what());
      return false;
    }
    registered.insert(client.api());
  }
  g_registered.store(true);
  try {
    // main(x: i32[]) = x + x, after the call; the argument passes through the barrier, as in graphs.
    std::string text = std::string(
        "module @txla_fp_env attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
        "  func.func public @main(%arg0: tensor<i32>) -> (tensor<i32>) {\n"
        "    %t = \"stablehlo.custom_call\"() {api_version = 4 : i32, call_target_name = \"") + FpEnvTarget() +
        "\", has_side_effect = true} : () -> !stablehlo.token\n"
        "    %b:2 = \"stablehlo.optimization_barrier\"(%t, %arg0) : (!stablehlo.token, tensor<i32>) -> "
        "(!stablehlo.token, tensor<i32>)\n"
        "    %0 = \"stablehlo.add\"(%b#1, %b#1) : (tensor<i32>, tensor<i32>) -> tensor<i32>\n"
        "    \"func.return\"(%0) : (tensor<i32>) -> ()\n  }\n}\n";
    CompileOptions o;
    o.device_assignment = {{client.DeviceId(0)}};
    Executable exe = client.Compile(text, o);
    int32_t one = 1, two = 0;
    Buffer in = client.ToDevice(&one, ElementType::kS32, {}, 0);
    std::vector<Buffer> out = client.Execute(exe, {in.get()}, 0);
    out.at(0).ToHost(&two, sizeof(two));
    if (two != 2) throw std::runtime_error("the check computed " + std::to_string(two) + " instead of 2");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[torch_xla] denormals: the CPU plugin could not run the call that keeps them (%s); "
                 "XLA:CPU flushes denormals to zero\n", e.what());
    return false;
  }
  g_enabled.store(true);
  return true;
#else
  return false;
#endif
}

bool KeepDenormals() { return g_enabled.load(std::memory_order_relaxed) && !ThreadFlushes(); }

void SetFpEnvEnabled(bool on) { g_enabled.store(on && g_registered.load()); }
bool FpEnvRegistered() { return g_registered.load(); }
int FpEnvPoolThreadsCleared() { return g_pool_cleared.load(); }

}  // namespace txla::runtime
