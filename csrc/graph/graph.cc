#include "graph/graph.h"

#include <atomic>
#include <thread>
#include <cerrno>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "graph/compile_cache.h"
#include "graph/spmd.h"
#include "lowering/stablehlo.h"
#include "runtime/fp_env.h"
#include "util/half.h"
#include "util/ptr_index.h"
#include "util/metrics.h"
#include "util/block_cache.h"

namespace txla::graph {

using ir::DType;
using ir::Node;
using ir::Value;

// ------------------------------------------------------------------ live tensor registry
namespace {
std::atomic<int64_t> g_next_id{1};
std::atomic<bool> g_alias_with_donor_config{false};

// Live tensors: an intrusive doubly-linked list (TensorData::live_prev_/live_next_) under g_weak_mu.
// A tensor unlinks itself in its destructor, so every listed pointer is valid under the lock; one
// whose last owner is gone but not yet unlinked fails weak_from_this().lock() and is skipped.
std::mutex g_weak_mu;
TensorData* g_live_head = nullptr;
size_t g_live_count = 0;

TensorPtr Register(TensorPtr t) { return TensorData::Register(std::move(t)); }
}  // namespace

TensorPtr TensorData::Register(TensorPtr t) {
  std::lock_guard<std::mutex> g(g_weak_mu);
  if (t->live_) return t;
  t->live_ = true;
  t->live_prev_ = nullptr;
  t->live_next_ = g_live_head;
  if (g_live_head != nullptr) g_live_head->live_prev_ = t.get();
  g_live_head = t.get();
  ++g_live_count;
  return t;
}

void TensorData::CollectLive(std::vector<TensorPtr>* out) {
  std::lock_guard<std::mutex> g(g_weak_mu);
  out->reserve(out->size() + g_live_count);
  for (TensorData* p = g_live_head; p != nullptr; p = p->live_next_) {
    if (TensorPtr t = p->weak_from_this().lock()) out->push_back(std::move(t));
  }
}

TensorData::TensorData(ir::Shape shape, int device) : id_(g_next_id++), shape_(std::move(shape)), device_(device) {
  TXLA_COUNTER_ADD("CreateXlaTensor", 1);
}

TensorData::~TensorData() {
  {
    std::lock_guard<std::mutex> g(g_weak_mu);
    if (live_) {
      if (live_prev_ != nullptr) live_prev_->live_next_ = live_next_;
      else g_live_head = live_next_;
      if (live_next_ != nullptr) live_next_->live_prev_ = live_prev_;
      --g_live_count;
    }
  }
  TXLA_COUNTER_ADD("DestroyXlaTensor", 1);
}

namespace {
const char* kDonatedMessage =
    "its device buffer was donated to a computation at a sync (torch_xla._XLAC._set_buffer_donation(t, True)) "
    "and holds no value any more";
}  // namespace

Value TensorData::GetValue() {
  if (!error_.empty()) throw std::runtime_error("this XLA tensor has no value: " + error_);
  if (pending_) return pending_;
  if (data_ && data_->donated) throw std::runtime_error(std::string("this XLA tensor has no value: ") + kDonatedMessage);
  if (!data_node_) {
    if (!data_) throw std::runtime_error("internal: XLA tensor has neither data nor a pending value");
    data_node_ = ir::MakeDeviceData(data_);
  }
  return data_node_;
}

void TensorData::SetPending(Value v) {
  if (v.shape() != shape_) {
    throw std::runtime_error("internal: pending value shape " + v.shape().ToString() + " differs from tensor shape " +
                             shape_.ToString());
  }
  pending_ = std::move(v);
  // A value that is just our own data leaf is not pending.
  if (pending_.node->op == ir::Op::kDeviceData) {
    data_ = pending_.node->data;
    data_node_ = pending_;
    pending_ = Value();
  }
}

void TensorData::SetError(std::string message) {
  error_ = std::move(message);
  pending_ = Value();
  data_ = nullptr;
  data_node_ = Value();
}

void TensorData::SetData(ir::DeviceDataPtr d) {
  data_ = std::move(d);
  data_node_ = Value();
  pending_ = Value();
}

std::vector<TensorPtr> LiveTensors() {
  std::vector<TensorPtr> out;
  TensorData::CollectLive(&out);
  std::sort(out.begin(), out.end(), [](const TensorPtr& a, const TensorPtr& b) { return a->id() < b->id(); });
  return out;
}

TensorPtr TensorFromValue(Value v, int device) {
  auto t = util::MakeCachedShared<TensorData>(v.shape(), device);
  t->SetPending(std::move(v));
  return Register(std::move(t));
}

// ------------------------------------------------------------------ runtime context
namespace {
std::mutex g_client_mu;
std::function<RuntimeConfig()> g_resolver;
RuntimeConfig g_config;
std::unique_ptr<runtime::Client> g_client;
std::function<void(runtime::Client&)> g_start_hook;
}  // namespace

void SetClientStartHook(std::function<void(runtime::Client&)> hook) {
  std::lock_guard<std::mutex> g(g_client_mu);
  g_start_hook = std::move(hook);
}

void SetConfigResolver(std::function<RuntimeConfig()> resolver) {
  std::lock_guard<std::mutex> g(g_client_mu);
  g_resolver = std::move(resolver);
}

bool ClientStarted() { return g_client != nullptr; }

namespace {
DType g_float_type = DType::kF32;  // XLA_USE_BF16 / XLA_USE_F16, read at the first transfer or compile

bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  return !(s.empty() || s == "0" || s == "false" || s == "False" || s == "FALSE");
}
}  // namespace

DType FloatStorageType() {
  // As PyTorch/XLA: read once, at the first transfer or compile (not when the client starts:
  // Lightning's SingleDeviceXLAStrategy asks for its device before its precision plugin sets
  // XLA_USE_BF16), then fixed for the process.
  static std::once_flag once;
  std::call_once(once, [] {
    if (EnvFlag("XLA_USE_BF16")) {
      g_float_type = DType::kBF16;
    } else if (EnvFlag("XLA_USE_F16")) {
      g_float_type = DType::kF16;
    }
  });
  return g_float_type;
}

DType PhysicalDType(DType logical) {
  DType f = FloatStorageType();
  return (f != DType::kF32 && (logical == DType::kF32 || logical == DType::kF64)) ? f : logical;
}

ir::DeviceDataPtr UploadData(const void* data, const ir::Shape& shape, int device, ir::ShardingPtr sharding) {
  // Host bytes of the logical values in the device's physical type (narrowing f32/f64 to bf16/f16).
  DType logical = shape.dtype, phys = PhysicalDType(logical);
  std::vector<uint16_t> narrow;
  if (phys != logical) {
    int64_t n = shape.numel();
    narrow.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float f = logical == DType::kF64 ? static_cast<float>(static_cast<const double*>(data)[i])
                                       : static_cast<const float*>(data)[i];
      narrow[i] = phys == DType::kBF16 ? FloatToBf16Bits(f) : FloatToHalfBits(f);
    }
    data = narrow.data();
  }
  if (spmd::Enabled()) {
    return std::make_shared<ir::DeviceData>(spmd::UploadShards(data, phys, shape.dims, sharding.get()), shape, device,
                                            std::move(sharding));
  }
  return std::make_shared<ir::DeviceData>(GetClient().ToDevice(data, phys, shape.dims, device), shape, device);
}

namespace {
// On the CPU plugin a ready buffer is host memory: copy it on this thread instead of going through
// PJRT_Buffer_ToHostBuffer (which hands the copy to the plugin's thread pool and waits for it:
// tens of microseconds per read, more on a busy machine). Only for dense row-major buffers of the
// expected size; false when the plugin's own copy must be used.
const void* HostMemoryOf(const runtime::Buffer& b, size_t nbytes) {
  static const bool host_resident = [] {
    const char* e = std::getenv("TORCH_XLA_DIRECT_HOST_READ");  // "0": always the plugin's copy
    return GetClient().PlatformName() == "cpu" && !(e != nullptr && std::string(e) == "0");
  }();
  if (!host_resident || nbytes == 0) return nullptr;
  try {
    if (!b.IsDenseRowMajor() || b.OnDeviceSizeBytes() != nbytes) return nullptr;
  } catch (const runtime::PjrtError&) {
    return nullptr;
  }
  b.Await();  // the producing computation is done (raises its error)
  return b.UnsafePointer();
}

bool ReadInPlace(const runtime::Buffer& b, void* out, size_t nbytes) {
  const void* p = HostMemoryOf(b, nbytes);
  if (p == nullptr) return false;
  std::memcpy(out, p, nbytes);
  static std::atomic<int64_t>* reads = metrics::CounterSlot("HostReadInPlace");
  reads->fetch_add(1, std::memory_order_relaxed);
  return true;
}
}  // namespace

std::shared_ptr<const void> HostView(const TensorPtr& t) {
  if (!t->error().empty() || t->HasPending() || !t->data()) return nullptr;
  const ir::DeviceDataPtr& d = t->data();
  if (d->donated || d->IsSpmd() || PhysicalDType(d->shape.dtype) != d->shape.dtype) return nullptr;
  size_t bytes = static_cast<size_t>(d->shape.numel()) * runtime::ElementSize(d->shape.dtype);
  const void* p = HostMemoryOf(d->buffer, bytes);
  if (p == nullptr) return nullptr;
  return std::shared_ptr<const void>(d, p);  // aliasing: keeps the DeviceData (and its buffer) alive
}

void DataToHost(const ir::DeviceData& d, void* dst) {
  DType logical = d.shape.dtype, phys = PhysicalDType(logical);
  size_t n = static_cast<size_t>(d.shape.numel());
  auto read = [&](void* out, size_t nbytes) {
    if (d.IsSpmd()) {
      spmd::AssembleToHost(d, out, nbytes);
    } else if (!ReadInPlace(d.buffer, out, nbytes)) {
      d.buffer.ToHost(out, nbytes);
    }
  };
  if (phys == logical) {
    metrics::Timer timer("TransferFromDeviceTime");
    read(dst, n * runtime::ElementSize(logical));
    return;
  }
  // XLA_USE_BF16 / XLA_USE_F16: widen the device's bf16/f16 to f32/f64
  std::vector<uint16_t> narrow(n);
  {
    metrics::Timer timer("TransferFromDeviceTime");
    read(narrow.data(), n * 2);
  }
  for (size_t i = 0; i < n; ++i) {
    float f = phys == DType::kBF16 ? Bf16BitsToFloat(narrow[i]) : HalfBitsToFloat(narrow[i]);
    if (logical == DType::kF64) {
      static_cast<double*>(dst)[i] = f;
    } else {
      static_cast<float*>(dst)[i] = f;
    }
  }
}

namespace {
std::atomic<bool> g_exiting{false};
}  // namespace

bool ProcessExiting() { return g_exiting.load(std::memory_order_relaxed); }
void SetProcessExiting() { g_exiting.store(true); }

runtime::Client& GetClient() {
  if (runtime::InForkedChild()) {
    throw std::runtime_error(
        "the XLA runtime was started in the parent process before os.fork(): a forked child cannot use it. "
        "Start worker processes with xmp.spawn (start_method='spawn'), torch.multiprocessing's 'spawn' start "
        "method, or fork before the first XLA operation");
  }
  if (g_client) return *g_client;
  std::lock_guard<std::mutex> g(g_client_mu);
  if (!g_client) {
    if (!g_resolver) throw std::runtime_error("torch_xla runtime is not configured (no plugin resolver)");
    g_config = g_resolver();
    runtime::ClientOptions o;
    o.plugin_path = g_config.plugin_path;
    o.platform_hint = g_config.device_type;
    o.cpu_device_count = g_config.cpu_device_count;
    o.options = g_config.options;
    auto client = runtime::Client::Create(o);
    if (g_start_hook) g_start_hook(*client);
    runtime::StartFpEnv(*client);
    g_client = std::move(client);
    runtime::WatchForFork();
  }
  return *g_client;
}

const RuntimeConfig& Config() {
  GetClient();
  return g_config;
}

int DeviceCount() { return spmd::Enabled() ? 1 : GetClient().NumDevices(); }
int RuntimeDeviceCount() { return GetClient().NumDevices(); }

void CheckDevice(int device) {
  int n = DeviceCount();
  if (device < 0 || device >= n) {
    throw std::out_of_range("XLA device index " + std::to_string(device) + " is out of range: this process has " +
                            std::to_string(n) + " device(s)");
  }
}

namespace {
// A new tensor over freshly uploaded data, with the upload's metrics.
TensorPtr FromUploaded(ir::DeviceDataPtr d, const ir::Shape& shape, int device) {
  size_t bytes = static_cast<size_t>(shape.numel()) * runtime::ElementSize(shape.dtype);
  metrics::AddSample("InboundData", static_cast<double>(bytes), metrics::Unit::kBytes);
  TXLA_COUNTER_ADD("CreateDataHandles", 1);
  auto t = util::MakeCachedShared<TensorData>(shape, device);
  {
    metrics::Timer wrap("WrapXlaData");
    t->SetData(std::move(d));
  }
  return Register(std::move(t));
}
}  // namespace

TensorPtr TensorFromHost(const void* data, const ir::Shape& shape, int device, ir::ShardingPtr sharding) {
  CheckDevice(device);
  metrics::Timer to_data("TensorToData");
  ir::DeviceDataPtr d;
  {
    metrics::Timer timer("TransferToDeviceTime");
    d = UploadData(data, shape, device, sharding && sharding->IsReplicated() ? nullptr : std::move(sharding));
  }
  return FromUploaded(std::move(d), shape, device);
}

TensorPtr TensorFromHostZeroCopy(const void* data, const ir::Shape& shape, int device, std::function<void()> release) {
  if (spmd::Enabled() || PhysicalDType(shape.dtype) != shape.dtype || shape.numel() == 0) {
    TensorPtr t = TensorFromHost(data, shape, device);
    release();
    return t;
  }
  CheckDevice(device);
  metrics::Timer to_data("TensorToData");
  ir::DeviceDataPtr d;
  {
    metrics::Timer timer("TransferToDeviceTime");
    d = std::make_shared<ir::DeviceData>(GetClient().ToDeviceZeroCopy(data, shape.dtype, shape.dims, device,
                                                                      std::move(release)),
                                         shape, device);
  }
  return FromUploaded(std::move(d), shape, device);
}

void TensorToHost(const TensorPtr& t, void* dst) {
  if (!t->error().empty()) throw std::runtime_error("this XLA tensor has no value: " + t->error());
  if (!t->HasPending() && t->data() && t->data()->donated) {
    throw std::runtime_error(std::string("this XLA tensor has no value: ") + kDonatedMessage);
  }
  if (t->HasPending()) {
    std::vector<TensorPtr> one{t};
    SyncTensors(&one, SyncOptions{});
  }
  size_t bytes = static_cast<size_t>(t->shape().numel()) * runtime::ElementSize(t->shape().dtype);
  if (bytes == 0) return;
  DataToHost(*t->data(), dst);
  RaiseFailedChecks();  // a host read waited for the graph anyway
  metrics::AddSample("OutboundData", static_cast<double>(bytes), metrics::Unit::kBytes);
}

// ------------------------------------------------------------------ scalars
namespace {
void ScalarBytes(double v, int64_t iv, DType t, char* out, double imag) {
  switch (t) {
    case DType::kPred: { uint8_t b = (v != 0 || iv != 0); std::memcpy(out, &b, 1); return; }
    case DType::kS8: { int8_t b = static_cast<int8_t>(iv); std::memcpy(out, &b, 1); return; }
    case DType::kS16: { int16_t b = static_cast<int16_t>(iv); std::memcpy(out, &b, 2); return; }
    case DType::kS32: { int32_t b = static_cast<int32_t>(iv); std::memcpy(out, &b, 4); return; }
    case DType::kS64: case DType::kU64: { std::memcpy(out, &iv, 8); return; }
    case DType::kU8: { uint8_t b = static_cast<uint8_t>(iv); std::memcpy(out, &b, 1); return; }
    case DType::kU16: { uint16_t b = static_cast<uint16_t>(iv); std::memcpy(out, &b, 2); return; }
    case DType::kU32: { uint32_t b = static_cast<uint32_t>(iv); std::memcpy(out, &b, 4); return; }
    case DType::kF16: { uint16_t b = FloatToHalfBits(static_cast<float>(v)); std::memcpy(out, &b, 2); return; }
    case DType::kBF16: { uint16_t b = FloatToBf16Bits(static_cast<float>(v)); std::memcpy(out, &b, 2); return; }
    case DType::kF32: { float b = static_cast<float>(v); std::memcpy(out, &b, 4); return; }
    case DType::kF64: { std::memcpy(out, &v, 8); return; }
    case DType::kC64: { float b[2] = {static_cast<float>(v), static_cast<float>(imag)}; std::memcpy(out, b, 8); return; }
    case DType::kC128: { double b[2] = {v, imag}; std::memcpy(out, b, 16); return; }
    case DType::kF8E4M3FN: { uint8_t b = FloatToF8E4M3FNBits(static_cast<float>(v)); std::memcpy(out, &b, 1); return; }
    case DType::kF8E5M2: { uint8_t b = FloatToF8E5M2Bits(static_cast<float>(v)); std::memcpy(out, &b, 1); return; }
  }
}

struct ScalarKey {
  int device;
  DType t;
  uint64_t bits;
  int64_t iv;
  uint64_t imag_bits;
  bool operator<(const ScalarKey& o) const {
    return std::tie(device, t, bits, iv, imag_bits) < std::tie(o.device, o.t, o.bits, o.iv, o.imag_bits);
  }
};
std::mutex g_scalar_mu;
std::map<ScalarKey, Value>& ScalarCache() {
  static auto* m = new std::map<ScalarKey, Value>();
  return *m;
}
}  // namespace

Value ScalarValue(double v, int64_t iv, DType t, int device, double imag, bool always_data) {
  bool is_int = ir::IsIntegral(t, true);
  if (!always_data && imag == 0 && ((is_int && (iv == 0 || iv == 1)) || (!is_int && (v == 0.0 || v == 1.0) && !std::signbit(v)))) {
    return is_int ? ir::ConstantInt(iv, t) : ir::Constant(v, t);
  }
  uint64_t bits, ibits;
  std::memcpy(&bits, &v, 8);
  std::memcpy(&ibits, &imag, 8);
  ScalarKey key{device, t, is_int ? 0 : bits, is_int ? iv : 0, ibits};
  std::lock_guard<std::mutex> g(g_scalar_mu);
  auto& cache = ScalarCache();
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() > 4096) cache.clear();
  TXLA_COUNTER_ADD("DeviceDataCacheMiss", 1);
  TXLA_COUNTER_ADD("CreateDataHandles", 1);
  char bytes[16];
  ScalarBytes(v, iv, t, bytes, imag);
  ir::Shape shape(t, {});
  auto data = UploadData(bytes, shape, device);
  data->donatable = false;  // the cache reuses it in later graphs
  Value node = ir::MakeDeviceData(data);
  cache.emplace(key, node);
  return node;
}

// ------------------------------------------------------------------ RNG
namespace {
std::mutex g_rng_mu;
std::map<int, TensorPtr>& Seeds() {
  static auto* m = new std::map<int, TensorPtr>();
  return *m;
}
TensorPtr SeedTensor(int device) {
  auto& seeds = Seeds();
  auto it = seeds.find(device);
  if (it != seeds.end()) return it->second;
  uint64_t s = 101;
  TensorPtr t = TensorFromHost(&s, ir::Shape(DType::kU64, {}), device);
  seeds[device] = t;
  return t;
}
}  // namespace

TensorPtr RngSeedTensor(int device) {
  std::lock_guard<std::mutex> g(g_rng_mu);
  return SeedTensor(device);
}

void SetSeed(uint64_t seed, int device) {
  std::lock_guard<std::mutex> g(g_rng_mu);
  Seeds()[device] = TensorFromHost(&seed, ir::Shape(DType::kU64, {}), device);
}

uint64_t GetSeed(int device) {
  TensorPtr t;
  {
    std::lock_guard<std::mutex> g(g_rng_mu);
    t = SeedTensor(device);
  }
  uint64_t s = 0;
  TensorToHost(t, &s);
  return s;
}

TensorPtr RngStateSnapshot(int device) {
  std::lock_guard<std::mutex> g(g_rng_mu);
  return TensorFromValue(SeedTensor(device)->GetValue(), device);
}

void SetRngStateFrom(const TensorPtr& state, int device) {
  const ir::Shape shape(DType::kU64, {});
  if (state->shape() != shape) {
    throw std::invalid_argument("set_rng_state: expected a state from torch_xla.get_rng_state() (a 0-dim uint64 "
                                "tensor), got " + state->shape().ToString());
  }
  TensorPtr t;
  if (state->device() == device) {
    t = TensorFromValue(state->GetValue(), device);
  } else {  // another device's state: through the host
    uint64_t s = 0;
    TensorToHost(state, &s);
    t = TensorFromHost(&s, shape, device);
  }
  std::lock_guard<std::mutex> g(g_rng_mu);
  Seeds()[device] = std::move(t);
}

Value NextRngState(int device) {
  std::lock_guard<std::mutex> g(g_rng_mu);
  TensorPtr t = SeedTensor(device);
  Value s = t->GetValue();
  // Advance the seed inside the graph (an LCG step); constants are fixed, so no recompiles.
  Value next = ir::Binary(ir::Op::kAdd, ir::Binary(ir::Op::kMul, s, ir::ConstantInt(6364136223846793005LL, DType::kU64)),
                          ir::ConstantInt(1442695040888963407LL, DType::kU64));
  t->SetPending(next);
  Value key = ir::Reshape(s, {1});
  Value ctr = ir::Reshape(ir::ConstantInt(0x9E3779B97F4A7C15LL, DType::kU64), {1});
  return ir::Concatenate({key, ctr}, 0);
}

// ------------------------------------------------------------------ checks
namespace {
struct PendingCheck {
  Value pred;
  std::string message;
  bool runtime_error = false;
};
struct RanCheck {
  ir::DeviceDataPtr result;
  std::string message;
  bool runtime_error = false;
};
std::mutex g_check_mu;
std::map<int, std::vector<PendingCheck>>& PendingChecks() {
  static auto* m = new std::map<int, std::vector<PendingCheck>>();
  return *m;
}
std::vector<RanCheck>& RanChecks() {
  static auto* v = new std::vector<RanCheck>();
  return *v;
}
}  // namespace

namespace {
thread_local const std::string* g_index_message = nullptr;  // CheckMessageScope
}

CheckMessageScope::CheckMessageScope(const std::string& message) : prev_(g_index_message) { g_index_message = &message; }
CheckMessageScope::~CheckMessageScope() { g_index_message = prev_; }

void AddCheck(Value all_ok, std::string message, int device, bool runtime_error) {
  if (g_index_message && all_ok.dtype() == ir::DType::kS64) message = *g_index_message;
  std::string where = CurrentUserScope();
  if (!where.empty()) message += " (raised by the op at " + where + ")";
  std::lock_guard<std::mutex> g(g_check_mu);
  auto& v = PendingChecks()[device];
  if (v.size() < 256) v.push_back({std::move(all_ok), std::move(message), runtime_error});
}

std::vector<LoopCheck> TakeLoopChecks(int device, size_t keep) {
  std::lock_guard<std::mutex> g(g_check_mu);
  std::vector<LoopCheck> out;
  auto it = PendingChecks().find(device);
  if (it == PendingChecks().end()) return out;
  std::vector<PendingCheck> kept;
  for (size_t i = 0; i < it->second.size(); ++i) {
    PendingCheck& c = it->second[i];
    if (i >= keep && c.pred.node->in_region) out.push_back({c.pred, c.message, c.runtime_error});
    else kept.push_back(std::move(c));
  }
  it->second.swap(kept);
  return out;
}

void RestoreCheck(int device, const LoopCheck& check) {
  std::lock_guard<std::mutex> g(g_check_mu);
  auto& v = PendingChecks()[device];
  if (v.size() < 256) v.push_back({check.pred, check.message, check.runtime_error});
}

size_t PendingCheckCount(int device) {
  std::lock_guard<std::mutex> g(g_check_mu);
  auto it = PendingChecks().find(device);
  return it == PendingChecks().end() ? 0 : it->second.size();
}

void DropPendingChecks(int device, size_t keep) {
  std::lock_guard<std::mutex> g(g_check_mu);
  auto it = PendingChecks().find(device);
  if (it != PendingChecks().end() && it->second.size() > keep) it->second.resize(keep);
}

namespace {
std::vector<RanCheck> TakeRanChecks() {
  std::vector<RanCheck> ran;
  std::lock_guard<std::mutex> g(g_check_mu);
  ran.swap(RanChecks());
  return ran;
}

// Puts checks taken by TakeRanChecks back in front of those run since (a sync that failed).
void ReturnRanChecks(std::vector<RanCheck> ran) {
  if (ran.empty()) return;
  std::lock_guard<std::mutex> g(g_check_mu);
  auto& now = RanChecks();
  ran.insert(ran.end(), std::make_move_iterator(now.begin()), std::make_move_iterator(now.end()));
  now.swap(ran);
}

// Moves the checks whose results are not computed yet out of `ran` (reading them would wait).
std::vector<RanCheck> TakeUnfinishedChecks(std::vector<RanCheck>& ran) {
  std::vector<RanCheck> later, now;
  for (auto& c : ran) {
    bool ready = true;
    try {
      ready = c.result->IsSpmd() || c.result->buffer.IsReady();
    } catch (...) {
    }
    (ready ? now : later).push_back(std::move(c));
  }
  ran.swap(now);
  return later;
}

// A check's one-byte result. On the CPU plugin a computed buffer is host memory: read it in place
// (PJRT's device-to-host copy of one byte goes through the plugin's thread pool and wakes a thread,
// tens of microseconds to milliseconds on a busy machine, at every sync).
uint8_t ReadCheck(const ir::DeviceData& d) {
  uint8_t ok = 1;
  if (d.IsSpmd()) {
    spmd::AssembleToHost(d, &ok, 1);
    return ok;
  }
  static const bool host_resident = GetClient().PlatformName() == "cpu";
  if (host_resident && d.buffer.IsReady()) {
    d.buffer.Await();  // ready: returns at once, or raises the computation's error
    if (const void* p = d.buffer.UnsafePointer()) return *static_cast<const uint8_t*>(p);
  }
  d.buffer.ToHost(&ok, 1);
  return ok;
}

// A check whose result is an s64 scalar (CheckWithIndex) holds the first failing index, or INT64_MIN.
int64_t ReadIndexCheck(const ir::DeviceData& d) {
  int64_t v = std::numeric_limits<int64_t>::min();
  if (d.IsSpmd()) {
    spmd::AssembleToHost(d, &v, sizeof(v));
    return v;
  }
  d.buffer.Await();
  d.buffer.ToHost(&v, sizeof(v));
  return v;
}

void RaiseIfFailed(const RanCheck& c) {
  std::string message = c.message;
  if (c.result->shape.dtype == ir::DType::kS64) {
    int64_t bad = ReadIndexCheck(*c.result);
    if (bad == std::numeric_limits<int64_t>::min()) return;
    message = CheckMessage(message, bad);
  } else if (ReadCheck(*c.result)) {
    return;
  }
  if (c.runtime_error) throw CheckError(message);
  throw IndexCheckError(message);
}

// Reads each check's result (waiting for its graph) and raises the first failure.
void RaiseChecks(std::vector<RanCheck>& ran) {
  for (auto& c : ran) RaiseIfFailed(c);
}
}  // namespace

std::string CheckMessage(const std::string& message, std::optional<int64_t> index) {
  // "{negative:A|B}": A for a negative index, B otherwise (B without a value)
  const std::string neg = "{negative:";
  size_t at0 = message.find(neg);
  if (at0 != std::string::npos) {
    size_t bar = message.find('|', at0), end = message.find('}', at0);
    if (bar != std::string::npos && end != std::string::npos && bar < end) {
      std::string pick = index && *index < 0 ? message.substr(at0 + neg.size(), bar - at0 - neg.size())
                                             : message.substr(bar + 1, end - bar - 1);
      return message.substr(0, at0) + pick + message.substr(end + 1);
    }
  }
  const std::string mark = "{index}";
  size_t at = message.find(mark);
  if (at == std::string::npos) return message;
  std::string out = message;
  if (index) return out.replace(at, mark.size(), std::to_string(*index));
  // no value (a check carried through a loop): drop the placeholder and the space after it
  size_t n = mark.size() + (at + mark.size() < out.size() && out[at + mark.size()] == ' ' ? 1 : 0);
  return out.erase(at, n);
}

ir::Value CheckPred(const ir::Value& check) {
  if (check.dtype() != ir::DType::kS64) return check;
  return ir::Compare(ir::CompareDir::kEQ, check, ir::ConstantInt(std::numeric_limits<int64_t>::min(), ir::DType::kS64));
}

void RaiseFailedChecks() {
  std::vector<RanCheck> ran = TakeRanChecks();
  RaiseChecks(ran);
}

// ------------------------------------------------------------------ sync
namespace {

struct PostOrder {
  std::vector<const Node*> nodes;
  std::vector<const Node*> params;
  util::PtrIndex index;
  PostOrder() = default;
  PostOrder(PostOrder&&) = default;
  PostOrder& operator=(PostOrder&&) = default;
  // Leaves its buffers to the thread's next ComputePostOrder: a sync then makes no large allocation
  // for them (each one makes glibc consolidate the small blocks the last graph freed; issue #12).
  ~PostOrder();
};

namespace {
struct PostOrderBuffers {
  std::vector<const Node*> nodes, params;
  util::PtrIndex index;
};
PostOrderBuffers& SparePostOrderBuffers() {
  thread_local PostOrderBuffers b;
  return b;
}
}  // namespace

PostOrder::~PostOrder() {
  PostOrderBuffers& b = SparePostOrderBuffers();
  if (nodes.capacity() > b.nodes.capacity()) b.nodes.swap(nodes);
  if (params.capacity() > b.params.capacity()) b.params.swap(params);
  if (index.capacity() > b.index.capacity()) b.index.swap(index);
}

// Step 1: operands before users, device-data leaves collected as parameters.
PostOrder ComputePostOrder(const std::vector<Value>& roots) {
  PostOrder po;
  {
    PostOrderBuffers& b = SparePostOrderBuffers();
    po.nodes.swap(b.nodes);
    po.params.swap(b.params);
    po.index.swap(b.index);
    po.nodes.clear();
    po.params.clear();
    po.index.clear();
  }
  // Sized from the previous graph (steps repeat): no rehashing while the walk grows the index.
  static thread_local size_t last_size = 64, last_params = 16;
  po.index.reserve(last_size);
  po.nodes.reserve(last_size);
  po.params.reserve(last_params);
  static thread_local std::vector<std::pair<const Node*, size_t>> stack;  // keeps its capacity
  stack.clear();
  for (const Value& r : roots) {
    const Node* root = r.node.get();
    if (po.index.count(root)) continue;
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next < n->operands.size()) {
        const Node* child = n->operands[next++].node.get();
        if (!po.index.count(child)) stack.emplace_back(child, 0);
        continue;
      }
      if (po.index.try_emplace(n, static_cast<int>(po.nodes.size()))) {
        po.nodes.push_back(n);
        if (n->op == ir::Op::kDeviceData) po.params.push_back(n);
      }
      stack.pop_back();
    }
  }
  last_size = po.nodes.size() + po.nodes.size() / 8;
  last_params = po.params.size() + 4;
  return po;
}

// Step 2: structural hash of the graph (never tensor values).
// Whether a graph compiled now keeps denormals on XLA:CPU (runtime/fp_env.h); part of the key.
// SPMD graphs do not (XLA's partitioner would have to place the side-effecting call).
bool GraphKeepsDenormals() { return runtime::KeepDenormals() && !spmd::Enabled(); }

Hash128 GraphHash(const PostOrder& po, const std::vector<Value>& roots, int device) {
  Hash128 h{GraphKeepsDenormals() ? 0xDE0C0FFEEULL : 0xC0FFEEULL, static_cast<uint64_t>(device)};
  for (const Node* n : po.nodes) {
    h = HashCombine(h, n->op_hash);
    for (const Value& v : n->operands) {
      h = HashCombine(h, static_cast<uint64_t>(po.index.at(v.node.get())) * 64 + static_cast<uint64_t>(v.index));
    }
  }
  for (const Value& r : roots) {
    h = HashCombine(h, static_cast<uint64_t>(po.index.at(r.node.get())) * 64 + static_cast<uint64_t>(r.index));
  }
  return h;
}

std::atomic<uint64_t> g_sync_executions{0};

struct Computation {
  runtime::Executable exe;
  std::string module_name;
  std::vector<ir::ShardingPtr> output_shardings;  // SPMD: as XLA placed each result
};

// ---- compilation control state
std::mutex g_ctl_mu;
std::string g_forbid_message;
std::string g_fail_compile_needle;  // InjectCompileFailure (tests)
std::atomic<bool> g_eager{false};
std::atomic<int> g_region_depth{0};
std::atomic<bool> g_any_computation{false};
std::string g_cache_dir;
bool g_cache_readonly = false;

// ---- persistent cache files: magic, key, payload length, payload, checksum. Written atomically.
constexpr char kCacheMagic[] = "TXLA-PCACHE-1\n";

uint64_t Checksum(const std::string& data) {
  return HashValue(std::string_view(data)) ^ Mix64(data.size());
}

std::string CacheFile(const Hash128& key) { return g_cache_dir + "/" + key.ToString() + ".xlaexe"; }

bool ReadCacheEntry(const std::string& path, const Hash128& key, std::string* payload) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t magic = sizeof(kCacheMagic) - 1;
  if (blob.size() < magic + 16 + 8 + 8 || blob.compare(0, magic, kCacheMagic) != 0) return false;
  Hash128 stored;
  uint64_t len, sum;
  std::memcpy(&stored.lo, blob.data() + magic, 8);
  std::memcpy(&stored.hi, blob.data() + magic + 8, 8);
  std::memcpy(&len, blob.data() + magic + 16, 8);
  if (stored != key || blob.size() != magic + 24 + len + 8) return false;
  *payload = blob.substr(magic + 24, len);
  std::memcpy(&sum, blob.data() + magic + 24 + len, 8);
  return sum == Checksum(*payload);
}

void WriteCacheEntry(const std::string& path, const Hash128& key, const std::string& payload) {
  std::string blob(kCacheMagic);
  uint64_t len = payload.size(), sum = Checksum(payload);
  blob.append(reinterpret_cast<const char*>(&key.lo), 8);
  blob.append(reinterpret_cast<const char*>(&key.hi), 8);
  blob.append(reinterpret_cast<const char*>(&len), 8);
  blob += payload;
  blob.append(reinterpret_cast<const char*>(&sum), 8);
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                    std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) + "." +
                    std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(blob.data(), static_cast<std::streamsize>(blob.size()));
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error("persistent cache: cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("persistent cache: cannot rename into " + path);
  }
}

// Everything that changes the compiled binary.
Hash128 PersistentKey(const std::string& text, const runtime::CompileOptions& opts) {
  auto& c = GetClient();
  Hash128 h{0x5EEDULL, 0xCAFEULL};
  h = HashAll(h, text, runtime::EncodeCompileOptions(opts), c.PlatformName(), c.PlatformVersion(),
              static_cast<int64_t>(c.ApiMajor()), static_cast<int64_t>(c.ApiMinor()), Config().plugin_path);
  struct stat st;  // the plugin build: PlatformVersion alone does not change when the plugin is upgraded
  if (::stat(Config().plugin_path.c_str(), &st) == 0) {
    h = HashAll(h, static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtime));
  }
  const char* flags = std::getenv("XLA_FLAGS");
  h = HashAll(h, std::string(flags ? flags : ""), static_cast<int64_t>(c.NumDevices()));
  for (int i = 0; i < c.NumDevices(); ++i) h = HashAll(h, c.DeviceKind(i));
  return h;
}

// ---- compile reasons (PT_XLA_DEBUG)
struct GraphSig {
  std::vector<std::string> nodes;   // descriptors
  std::vector<std::string> scopes;  // source lines
};
std::map<std::string, std::vector<GraphSig>>& Sigs() {
  static auto* m = new std::map<std::string, std::vector<GraphSig>>();
  return *m;
}
std::map<std::string, int64_t>& CompileCounts() {
  static auto* m = new std::map<std::string, int64_t>();
  return *m;
}

std::string Describe(const Node* n) {
  std::string d = n->ToString();
  if (!n->scope.empty()) d = d.substr(0, d.size() - n->scope.size() - 4);  // drop "  # scope"
  return d;
}

std::string CompileReason(const std::string& name, const std::vector<const Node*>& nodes) {
  GraphSig sig;
  for (const Node* n : nodes) {
    sig.nodes.push_back(Describe(n));
    sig.scopes.push_back(n->scope);
  }
  auto& known = Sigs()[name];
  int64_t count = ++CompileCounts()[name];
  std::string reason;
  if (known.empty()) {
    reason = "first compile of graph '" + name + "'";
  } else {
    size_t best = 0, best_prefix = 0;
    for (size_t k = 0; k < known.size(); ++k) {
      size_t p = 0;
      while (p < known[k].nodes.size() && p < sig.nodes.size() && known[k].nodes[p] == sig.nodes[p]) ++p;
      if (p >= best_prefix) { best_prefix = p; best = k; }
    }
    const GraphSig& old = known[best];
    size_t i = best_prefix;
    auto where = [](const std::string& scope) { return scope.empty() ? std::string() : " (from " + scope + ")"; };
    if (i == 0) {
      reason = "a new graph (none of the " + std::to_string(known.size()) + " cached graphs of this name starts "
               "the same way; first op `" + sig.nodes[0] + "`" + where(sig.scopes[0]) + ")";
    } else if (i < sig.nodes.size() && i < old.nodes.size()) {
      reason = "differs from a cached graph at node " + std::to_string(i) + ": now `" + sig.nodes[i] + "`" +
               where(sig.scopes[i]) + ", cached `" + old.nodes[i] + "`" + where(old.scopes[i]);
    } else if (i < sig.nodes.size()) {
      reason = "has more ops than a cached graph, first extra: `" + sig.nodes[i] + "`" + where(sig.scopes[i]);
    } else if (i >= old.nodes.size()) {
      // Every op equal: the key differs elsewhere (which inputs donate their buffers, e.g. a compiled
      // graph's donating executable, which results are outputs, or the device).
      reason = "the same ops as a cached graph, with other buffer donation, outputs or device";
    } else {
      reason = "has fewer ops than a cached graph, which continues with `" + old.nodes[i] + "`" + where(old.scopes[i]);
    }
  }
  if (known.size() < 64) known.push_back(std::move(sig));
  return reason + "; compiles of '" + name + "' so far: " + std::to_string(count);
}

std::mutex g_cache_mu;
// Bounded: see compile_cache.h (an evicted executable lives on while a caller still holds it).
LruCache<Hash128, std::shared_ptr<Computation>, Hash128Hasher>& Cache() {
  static auto* m = new LruCache<Hash128, std::shared_ptr<Computation>, Hash128Hasher>(CompileCacheCapacity());
  return *m;
}


runtime::CompileOptions OptionsForDevice(int device) {
  runtime::CompileOptions o;
  o.device_assignment = {{GetClient().DeviceId(device)}};
  return o;
}

// Step 3: find or build the executable (memory cache, then the persistent cache, then XLA).
std::shared_ptr<Computation> LookupOrCompile(const Hash128& key, const PostOrder& po, const std::vector<Value>& roots,
                                             int device, const SyncOptions& opts,
                                             const std::vector<std::pair<int, int>>& aliases, bool aliasing) {
  {
    std::lock_guard<std::mutex> g(g_cache_mu);
    if (auto* hit = Cache().Find(key)) {
      TXLA_COUNTER_ADD("CachedCompile", 1);
      return *hit;
    }
  }
  lowering::ModuleSpec spec;
  spec.name = opts.name.empty() ? "SyncTensorsGraph" : opts.name;
  spec.post_order = po.nodes;
  spec.params = po.params;
  spec.roots = roots;
  spec.locations = HloDebug();
  spec.aliases = aliases;
  // As PyTorch/XLA: one sample per compiled graph that considered aliasing, valued its alias count.
  if (aliasing) metrics::AddSample("InputOutputAliasCount", static_cast<double>(aliases.size()), metrics::Unit::kCount);
  spec.float_type = FloatStorageType();
  spec.keep_denormals = GraphKeepsDenormals();
  runtime::CompileOptions copts = spmd::Enabled() ? spmd::PrepareModule(&spec) : OptionsForDevice(device);
  std::string text = lowering::EmitStableHlo(spec);
  if (DebugLevel() > 0 && !opts.eager) {
    std::fprintf(metrics::DebugStream(), "[PT_XLA_DEBUG] compile: graph '%s' (%zu nodes, %zu inputs, %zu outputs, hash %s) %s\n",
                 spec.name.c_str(), po.nodes.size(), po.params.size(), roots.size(), key.ToString().c_str(),
                 CompileReason(spec.name, po.nodes).c_str());
  }
  auto comp = std::make_shared<Computation>();
  comp->module_name = spec.name;
  Hash128 pkey;
  bool from_disk = false;
  if (!g_cache_dir.empty()) {
    pkey = PersistentKey(text, copts);
    std::string payload;
    if (ReadCacheEntry(CacheFile(pkey), pkey, &payload)) {
      try {
        comp->exe = GetClient().DeserializeExecutable(payload, copts);
        from_disk = true;
        metrics::IncrementCounter("PersistentCacheHit");
      } catch (const std::exception&) {
        from_disk = false;  // unreadable by this plugin: recompile and replace
      }
    }
    if (!from_disk) metrics::IncrementCounter("PersistentCacheMiss");
  }
  if (!from_disk) {
    metrics::Timer timer(opts.eager ? "EagerOpCompileTime" : "CompileTime");
    try {
      {
        std::lock_guard<std::mutex> g(g_ctl_mu);
        if (!g_fail_compile_needle.empty() && text.find(g_fail_compile_needle) != std::string::npos) {
          throw std::runtime_error("injected compile failure (module contains '" + g_fail_compile_needle + "')");
        }
      }
      comp->exe = GetClient().Compile(text, copts);
      metrics::IncrementCounter("CreateCompileHandles");
    } catch (const std::exception& e) {
      const char* dump = std::getenv("TXLA_DUMP_ON_ERROR");
      std::string msg = std::string("XLA compilation failed: ") + e.what();
      if (dump && *dump) msg += "\n--- StableHLO ---\n" + text;
      throw std::runtime_error(msg);
    }
    metrics::IncrementCounter("UncachedCompile");
    if (!g_cache_dir.empty() && !g_cache_readonly) {
      try {  // best effort: the executable is good even if the cache cannot store it
        WriteCacheEntry(CacheFile(pkey), pkey, comp->exe.Serialize());
      } catch (const std::exception& e) {
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) std::fprintf(stderr, "[torch_xla] persistent cache: %s\n", e.what());
        metrics::IncrementCounter("PersistentCacheWriteError");
      }
    }
  }
  if (spmd::Enabled()) comp->output_shardings = spmd::OutputShardings(comp->exe, roots);
  const bool pressure = MapPressure();
  std::lock_guard<std::mutex> g(g_cache_mu);
  if (size_t evicted = Cache().Insert(key, comp)) metrics::IncrementCounter("CompileCacheEvictions", static_cast<int64_t>(evicted));
  if (pressure) {
    // Past half the process's memory-map limit (each executable's kernels hold mappings): the
    // least recently used half goes, before an XLA compile runs out of mappings.
    size_t evicted = Cache().EvictTo(Cache().size() / 2);
    metrics::IncrementCounter("CompileCacheMapPressureEvictions", static_cast<int64_t>(evicted));
    if (DebugLevel() > 0) {
      std::fprintf(metrics::DebugStream(), "[PT_XLA_DEBUG] compile cache: %zu executables evicted (the process holds %lld of "
                   "its %lld memory mappings)\n", evicted, static_cast<long long>(ProcessMapCount()),
                   static_cast<long long>(MaxMapCount()));
    }
  }
  return comp;
}

// Buffer donation: a tensor that the graph overwrites gives its old buffer to its new value when
// nothing else can read that buffer again: its device data is held only by the tensor and by the
// graph's parameter node (a second tensor, a cached scalar or an alias elsewhere raises the count),
// and the sync covers every live tensor, so every other graph that reads it is this one. Each
// parameter and each result is aliased at most once; shapes and dtypes match by construction.
std::vector<std::pair<int, int>> DonatableInputs(const std::vector<TensorPtr>& tensors, const std::vector<int>& root_of,
                                                 const std::vector<Value>& roots, const PostOrder& po, bool ltc,
                                                 bool user) {
  std::vector<std::pair<int, int>> aliases;
  // No per-entry allocations (issue #12): an open-addressing index and two flag arrays. Walked
  // backwards, so a buffer held by two parameter nodes maps to the last one (as a map overwritten
  // in order would).
  util::PtrIndex param_of;
  param_of.reserve(po.params.size());
  for (size_t p = po.params.size(); p-- > 0;) {
    if (po.params[p]->data) param_of.try_emplace(po.params[p]->data.get(), static_cast<int>(p));
  }
  struct Flags {
    std::vector<char> on;
    explicit Flags(size_t n) : on(n, 0) {}
    bool count(int i) const { return on[static_cast<size_t>(i)] != 0; }
    bool insert(int i) {  // true when newly set
      if (on[static_cast<size_t>(i)]) return false;
      on[static_cast<size_t>(i)] = 1;
      return true;
    }
  };
  Flags used_params(po.params.size()), used_results(roots.size());
  auto donate_to_any_result = [&](size_t p) {
    const ir::DeviceDataPtr& d = po.params[p]->data;
    for (size_t r = 0; r < roots.size(); ++r) {
      if (used_results.count(static_cast<int>(r)) || roots[r].node->op == ir::Op::kDeviceData) continue;
      if (roots[r].shape() != d->shape) continue;
      used_params.insert(static_cast<int>(p));
      used_results.insert(static_cast<int>(r));
      aliases.emplace_back(static_cast<int>(p), static_cast<int>(r));
      return;
    }
  };
  for (size_t i = 0; i < tensors.size() && ltc; ++i) {
    const ir::DeviceDataPtr& d = tensors[i]->data();
    if (!d || !d->donatable || d.use_count() != 2) continue;  // the tensor's reference + the parameter node's
    const int* param = param_of.find(d.get());
    if (param == nullptr) continue;
    int result = root_of[i];
    if (roots[result].node->op == ir::Op::kDeviceData) continue;  // unchanged: nothing to donate to
    if (roots[result].shape() != d->shape) continue;
    if (!used_params.insert(*param) || !used_results.insert(result)) continue;
    aliases.emplace_back(*param, result);
  }
  // Functionalization replaces a mutated tensor's inner value by a new tensor: the old buffer is
  // then held by the parameter node alone, and nothing can read it after this graph. Donate it to a
  // result of the same shape and dtype, preferably to the result computed from it (the parameter's
  // new value `p - lr * g` reads p): aliasing p with another result (its gradient) makes XLA copy
  // p before the step, since p is still read after that result is written.
  auto orphan = [&](const ir::Node* n) -> int {
    if (n->op != ir::Op::kDeviceData) return -1;
    const int* param = param_of.find(n->data.get());
    if (param == nullptr || used_params.count(*param)) return -1;
    const ir::DeviceDataPtr& d = n->data;
    return d && d->donatable && d.use_count() == 1 ? *param : -1;
  };
  // Only worth the walk when some parameter is orphaned (a sync after an in-place update).
  bool any_orphan = false;
  for (size_t p = 0; p < po.params.size() && ltc && !any_orphan; ++p) any_orphan = orphan(po.params[p]) >= 0;
  std::vector<const ir::Node*> frontier, next;
  for (size_t r = 0; r < roots.size() && any_orphan; ++r) {
    const ir::Node* root = roots[r].node.get();
    if (root->op == ir::Op::kDeviceData || used_results.count(static_cast<int>(r))) continue;
    // The parameters among the root's operands up to three levels up (an update's own inputs).
    frontier.assign(1, root);
    int found = -1;
    for (int depth = 0; depth < 3 && found < 0 && !frontier.empty(); ++depth) {
      next.clear();
      for (const ir::Node* n : frontier) {
        for (const Value& v : n->operands) {
          int p = orphan(v.node.get());
          if (p >= 0 && po.params[p]->data->shape == roots[r].shape()) {
            found = p;
            break;
          }
          if (next.size() < 32) next.push_back(v.node.get());
        }
        if (found >= 0) break;
      }
      frontier.swap(next);
    }
    if (found < 0) continue;
    used_params.insert(found);
    used_results.insert(static_cast<int>(r));
    aliases.emplace_back(found, static_cast<int>(r));
  }
  for (size_t p = 0; p < po.params.size() && ltc; ++p) {
    const ir::DeviceDataPtr& d = po.params[p]->data;
    if (!d || !d->donatable || d.use_count() != 1 || used_params.count(static_cast<int>(p))) continue;
    donate_to_any_result(p);
  }
  // Buffers the user marked for donation: donated whoever still holds them (those holders lose
  // their value after the run), to a result of the same shape and dtype.
  for (size_t p = 0; p < po.params.size() && user; ++p) {
    const ir::DeviceDataPtr& d = po.params[p]->data;
    if (!d || !d->donatable || !d->user_donor || used_params.count(static_cast<int>(p))) continue;
    donate_to_any_result(p);
  }
  std::sort(aliases.begin(), aliases.end());
  return aliases;
}

// Runs one device's pending tensors (and pending checks) as one graph.
void SyncDeviceOnce(std::vector<TensorPtr>& tensors, int device, const SyncOptions& opts) {
  g_sync_executions.fetch_add(1, std::memory_order_relaxed);
  std::vector<PendingCheck> checks;
  {
    std::lock_guard<std::mutex> g(g_check_mu);
    checks.swap(PendingChecks()[device]);
  }
  // Checks of a loop body still being traced (or abandoned by a failed trace) have no value here.
  checks.erase(std::remove_if(checks.begin(), checks.end(), [](const PendingCheck& c) { return c.pred.node->in_region; }),
               checks.end());
  // Collect unique roots.
  std::vector<Value> roots;
  std::vector<int> root_of(tensors.size());
  {
    // (node, output) -> root: the first root of each node, then a chain through its other outputs.
    util::PtrIndex first_root;
    first_root.reserve(tensors.size());
    std::vector<int> next_root;  // next root of the same node, or -1
    roots.reserve(tensors.size());
    next_root.reserve(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Value& v = tensors[i]->pending();
      const int* first = first_root.find(v.node.get());
      int r = first ? *first : -1, last = -1;
      while (r >= 0 && roots[r].index != v.index) {
        last = r;
        r = next_root[r];
      }
      if (r < 0) {
        r = static_cast<int>(roots.size());
        roots.push_back(v);
        next_root.push_back(-1);
        if (last >= 0) next_root[last] = r;
        else first_root.try_emplace(v.node.get(), r);
      }
      root_of[i] = r;
    }
  }
  size_t n_tensor_roots = roots.size();
  for (auto& c : checks) roots.push_back(c.pred);
  PostOrder po = ComputePostOrder(roots);
  metrics::AddSample("TensorsGraphSize", static_cast<double>(po.nodes.size()), metrics::Unit::kCount);
  std::vector<std::pair<int, int>> aliases;
  if (opts.donate || opts.user_donors) aliases = DonatableInputs(tensors, root_of, roots, po, opts.donate, opts.user_donors);
  Hash128 key = GraphHash(po, roots, device);
  if (spmd::Enabled()) key = spmd::HashParamShardings(key, po.params);
  for (const auto& [param, result] : aliases) key = HashCombine(key, (static_cast<uint64_t>(param) << 32) | result);
  std::shared_ptr<Computation> comp;
  comp = LookupOrCompile(key, po, roots, device, opts, aliases, opts.donate || opts.user_donors);
  if (opts.executed) opts.executed->push_back(key);

  std::vector<ir::DeviceDataPtr> datas;
  if (spmd::Enabled()) {
    datas = spmd::Execute(comp->exe, po.params, roots, comp->output_shardings, device,
                          opts.eager ? "EagerOpExecuteTime" : "ExecuteTime");
    g_any_computation = true;
  } else {
  std::vector<PJRT_Buffer*> args;
  args.reserve(po.params.size());
  {
    metrics::Timer unwrap("UnwrapXlaData");
    for (const Node* p : po.params) {
      if (p->data->device != device) {
        throw std::runtime_error("a graph mixes tensors of XLA devices " + std::to_string(p->data->device) + " and " +
                                 std::to_string(device) + "; move them to one device first");
      }
      if (p->data->donated) {
        throw std::runtime_error(std::string("a graph reads an XLA tensor whose device buffer is gone: ") + kDonatedMessage);
      }
      args.push_back(p->data->buffer.get());
    }
  }
  std::vector<runtime::Buffer> outs;
  {
    // ExecuteTime spans launch to the moment the results are ready (execution is asynchronous: the
    // launch alone returns long before), recorded from PJRT's ready callback of the first output.
    const char* name = opts.eager ? "EagerOpExecuteTime" : "ExecuteTime";
    int64_t start = metrics::NowNs();
    outs = GetClient().Execute(comp->exe, args, device);
    // The donated inputs' buffers now belong to the outputs: mark them. Their PJRT handles are
    // released only once the computation is done: XLA:CPU holds each donated buffer (a donation
    // hold) until the execution has finished, and destroying the handle before that waits for it,
    // which turned every donating launch into a synchronous one for the host (the old parameters'
    // last holder is this graph, freed at the end of this sync).
    // TXLA_DONATION_SYNC_RELEASE=1 restores the old behaviour (for benchmarks).
    static const bool sync_release = [] {
      const char* v = std::getenv("TXLA_DONATION_SYNC_RELEASE");
      return v != nullptr && std::string(v) == "1";
    }();
    auto donated_buffers = std::make_shared<std::vector<runtime::Buffer>>();
    for (const auto& [param, result] : aliases) {
      ir::DeviceData* d = po.params[param]->data.get();
      d->donated = true;
      donated_buffers->push_back(std::move(d->buffer));
    }
    std::vector<runtime::Buffer> release_now;  // destroyed (waiting for the execution) at this scope's end
    if (sync_release) release_now.swap(*donated_buffers);
    if (!outs.empty()) {
      metrics::BeginPendingSample();
      bool registered = false;
      try {
        registered = outs[0].OnReady([name, start, donated_buffers] {
          metrics::EndPendingSample(name, static_cast<double>(metrics::NowNs() - start), metrics::Unit::kTime);
          donated_buffers->clear();  // the donation is confirmed once the results are defined
        });
      } catch (...) {
      }
      if (!registered) metrics::EndPendingSample(name, static_cast<double>(metrics::NowNs() - start), metrics::Unit::kTime);
    } else {
      metrics::AddSample(name, static_cast<double>(metrics::NowNs() - start), metrics::Unit::kTime);
    }
  }
  g_any_computation = true;
  // Take the value of any tensor still holding a donated buffer (only a buffer the user marked for
  // donation can still be held).
  bool user_donated = false;
  for (const auto& [param, result] : aliases) user_donated |= po.params[param]->data->user_donor;
  if (user_donated) {
    for (auto& t : LiveTensors()) {
      if (!t->HasPending() && t->data() && t->data()->donated) t->SetError(kDonatedMessage);
    }
  }
  if (outs.size() != roots.size()) throw std::runtime_error("internal: executable returned a wrong number of outputs");
  TXLA_COUNTER_ADD("CreateDataHandles", static_cast<int64_t>(outs.size()));
  datas.reserve(outs.size());
  {
    metrics::Timer wrap("WrapXlaData");
    for (size_t i = 0; i < outs.size(); ++i) {
      datas.push_back(std::make_shared<ir::DeviceData>(std::move(outs[i]), roots[i].shape(), device));
    }
  }
  }
  if (opts.wait) {
    for (auto& d : datas) d->Await();
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i]->SetData(datas[root_of[i]]);
  if (!checks.empty()) {
    std::lock_guard<std::mutex> g(g_check_mu);
    for (size_t k = 0; k < checks.size(); ++k) {
      RanChecks().push_back({datas[n_tensor_roots + k], checks[k].message, checks[k].runtime_error});
    }
  }
}

// A graph that fails to compile or run must not take the values of the other tensors with it: on a
// failure, each tensor is computed alone (a tensor whose value is already device data needs no more
// than an identity graph); only those that fail alone lose their value, with the error as reason.
void SyncDevice(std::vector<TensorPtr>& tensors, int device, const SyncOptions& opts) {
  try {
    SyncDeviceOnce(tensors, device, opts);
  } catch (const std::exception& e) {
    if (tensors.size() <= 1) {
      for (auto& t : tensors) t->SetError(e.what());
      throw;
    }
    for (auto& t : tensors) {
      if (!t->HasPending()) continue;
      try {
        std::vector<TensorPtr> one{t};
        SyncDeviceOnce(one, device, opts);
      } catch (const std::exception& e2) {
        t->SetError(e2.what());
      }
    }
    throw;
  }
}

std::vector<Value> RootsOf(const std::vector<TensorPtr>& tensors) {
  std::vector<Value> roots;
  for (auto& t : tensors) roots.push_back(t->GetValue());
  return roots;
}

}  // namespace

void SyncTensors(const std::vector<TensorPtr>* tensors, const SyncOptions& opts) {
  RefreshDebugLevel();
  std::vector<TensorPtr> all = tensors ? *tensors : LiveTensors();
  if (opts.eager) {  // eager ops that used the RNG also advance the seed: run it too, or its chain grows
    std::lock_guard<std::mutex> g(g_rng_mu);
    for (auto& [device, seed] : Seeds()) {
      if (seed->HasPending()) all.push_back(seed);
    }
  }
  std::map<int, std::vector<TensorPtr>> by_device;
  std::unordered_set<int64_t> seen;
  for (auto& t : all) {
    if (t && t->HasPending() && t->pending().node->in_region) {
      // A value of a loop body being traced (control_flow.h): it has no value outside its loop.
      if (tensors) {
        throw std::runtime_error(
            "a tensor computed inside a loop body (while_loop / fori_loop / scan) cannot be synced or read on the "
            "host: its value exists only while the loop runs (return it from the body instead)");
      }
      continue;
    }
    if (t && t->HasPending() && seen.insert(t->id()).second) by_device[t->device()].push_back(t);
  }
  {
    std::lock_guard<std::mutex> g(g_check_mu);
    for (auto& [device, pending] : PendingChecks()) {
      if (!pending.empty() && !by_device.count(device)) by_device[device];  // run their checks too
    }
  }
  if (!by_device.empty()) {
    std::lock_guard<std::mutex> g(g_ctl_mu);
    if (!g_forbid_message.empty()) throw std::runtime_error(g_forbid_message);
  }
  // Checks of earlier steps: those already computed are read now; the others after this sync's
  // graphs are launched (reading one waits for its graph, and waiting before the launch kept step
  // N+1 from being queued while step N ran).
  std::vector<RanCheck> earlier = TakeRanChecks();
  std::vector<RanCheck> unfinished = TakeUnfinishedChecks(earlier);
  try {
    RaiseChecks(earlier);
  } catch (...) {
    ReturnRanChecks(std::move(unfinished));
    throw;
  }
  SyncOptions o = opts;
  o.donate = ParamAliasingEnabled() && tensors == nullptr && !opts.eager;
  o.user_donors = !opts.eager && (tensors == nullptr || g_alias_with_donor_config.load());
  try {
    for (auto& [device, ts] : by_device) SyncDevice(ts, device, o);
  } catch (...) {
    ReturnRanChecks(std::move(unfinished));
    throw;
  }
  RaiseChecks(unfinished);
  if (opts.wait) RaiseFailedChecks();
}

bool SetBufferDonation(const TensorPtr& t, bool donate) {
  if (!t->error().empty() || t->HasPending() || !t->data() || !t->data()->donatable || t->data()->donated) return false;
  t->data()->user_donor = donate;
  metrics::IncrementCounter("XlaSetBufferDonation");
  return true;
}

bool GetBufferDonation(const TensorPtr& t) {
  return t->error().empty() && !t->HasPending() && t->data() && t->data()->user_donor;
}

void SetAliasWithBufferDonorConfig(bool on) { g_alias_with_donor_config = on; }
bool AliasWithBufferDonorConfig() { return g_alias_with_donor_config.load(); }

void WaitDeviceOps() {
  for (auto& t : LiveTensors()) {
    if (!t->HasPending() && t->data()) t->data()->Await();
  }
}

std::string GetStableHlo(const std::vector<TensorPtr>& tensors) {
  std::vector<TensorPtr> ts;
  for (auto& t : (tensors.empty() ? LiveTensors() : tensors)) {
    if (tensors.empty() && (!t->HasPending() || t->pending().node->in_region)) continue;
    ts.push_back(t);
  }
  lowering::ModuleSpec spec;
  spec.roots = RootsOf(ts);
  PostOrder po = ComputePostOrder(spec.roots);
  spec.post_order = po.nodes;
  spec.params = po.params;
  spec.locations = HloDebug();
  spec.float_type = FloatStorageType();
  if (g_alias_with_donor_config.load()) {  // what a sync of these tensors would donate
    std::vector<int> root_of;
    spec.aliases = DonatableInputs(ts, root_of, spec.roots, po, /*ltc=*/false, /*user=*/true);
  }
  if (spmd::Enabled()) spmd::PrepareModule(&spec);  // shows the shardings
  return lowering::EmitStableHlo(spec);
}

std::string DumpIr(const std::vector<TensorPtr>& tensors) {
  std::vector<Value> roots = RootsOf(tensors.empty() ? LiveTensors() : tensors);
  PostOrder po = ComputePostOrder(roots);
  std::string s;
  for (const Node* n : po.nodes) s += "%" + std::to_string(po.index.at(n)) + " = " + n->ToString() + "\n";
  return s;
}

size_t CompileCacheSize() {
  std::lock_guard<std::mutex> g(g_cache_mu);
  return Cache().size();
}

void ForgetCachedScalars() {
  std::lock_guard<std::mutex> g(g_scalar_mu);
  ScalarCache().clear();
}

void ClearCompileCache() {
  std::lock_guard<std::mutex> g(g_cache_mu);
  Cache().Clear();
}

void InjectCompileFailure(const std::string& needle) {
  std::lock_guard<std::mutex> g(g_ctl_mu);
  g_fail_compile_needle = needle;
}

void SetExecutionForbidden(const std::string& message) {
  std::lock_guard<std::mutex> g(g_ctl_mu);
  g_forbid_message = message;
}
void SetEagerMode(bool on) { g_eager = on; }
bool EagerMode() { return g_eager; }
void EnterCompiledRegion() { ++g_region_depth; }
void ExitCompiledRegion() { --g_region_depth; }
bool InCompiledRegion() { return g_region_depth > 0; }
bool AnyComputationRan() { return g_any_computation; }

void InitializeCache(const std::string& path, bool readonly) {
  if (g_any_computation) {
    throw std::runtime_error("initialize_cache() must be called before any computation has run in this process");
  }
  if (path.empty()) throw std::invalid_argument("initialize_cache(): path is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (readonly) throw std::invalid_argument("initialize_cache(): read-only cache folder does not exist: " + path);
    std::string partial;
    for (size_t i = 0; i <= path.size(); ++i) {
      if (i == path.size() || (path[i] == '/' && i > 0)) {
        partial = path.substr(0, i);
        if (::stat(partial.c_str(), &st) != 0 && ::mkdir(partial.c_str(), 0755) != 0) {
          throw std::invalid_argument("initialize_cache(): cannot create folder " + partial + ": " + std::strerror(errno));
        }
      }
    }
  } else if (!S_ISDIR(st.st_mode)) {
    throw std::invalid_argument("initialize_cache(): not a folder: " + path);
  }
  if (!readonly && ::access(path.c_str(), W_OK) != 0) {
    throw std::invalid_argument("initialize_cache(): cache folder is not writable: " + path);
  }
  g_cache_dir = path;
  g_cache_readonly = readonly;
}

namespace {
int ReadDebugLevel() {
  const char* e = std::getenv("PT_XLA_DEBUG");
  const char* l = std::getenv("PT_XLA_DEBUG_LEVEL");
  bool on = e && *e && std::strcmp(e, "0") != 0;
  if (!on) return 0;
  return l && *l ? std::max(1, std::atoi(l)) : 1;
}
std::atomic<int> g_debug_level{ReadDebugLevel()};
}  // namespace

// Cached for the per-op scope check; re-read at every sync, so PT_XLA_DEBUG set by a framework
// after the runtime started (Lightning's strategy="xla_debug" sets it in its setup) takes effect.
int DebugLevel() { return g_debug_level.load(std::memory_order_relaxed); }
void RefreshDebugLevel() { g_debug_level.store(ReadDebugLevel(), std::memory_order_relaxed); }

bool HloDebug() {
  static bool on = [] {
    const char* e = std::getenv("XLA_HLO_DEBUG");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

namespace {
std::function<std::string()> g_scope_provider;
}
void SetScopeProvider(std::function<std::string()> provider) { g_scope_provider = std::move(provider); }
bool WantScopes() { return g_scope_provider && (DebugLevel() > 0 || HloDebug()); }
std::string CurrentUserScope() { return g_scope_provider ? g_scope_provider() : std::string(); }

std::string CompileReport() {
  std::lock_guard<std::mutex> g(g_cache_mu);
  std::string s;
  for (auto& [name, n] : CompileCounts()) s += name + ": " + std::to_string(n) + " compile(s)\n";
  return s;
}

}  // namespace txla::graph

// ------------------------------------------------------------------ hooks for compiled callables
namespace txla::graph {

TensorPtr TensorFromData(ir::DeviceDataPtr data) {
  auto t = util::MakeCachedShared<TensorData>(data->shape, data->device);
  t->SetData(std::move(data));
  return Register(std::move(t));
}

std::vector<CheckSpec> TakePendingChecks(int device, size_t from) {
  std::lock_guard<std::mutex> g(g_check_mu);
  std::vector<CheckSpec> out;
  auto it = PendingChecks().find(device);
  if (it == PendingChecks().end() || it->second.size() <= from) return out;
  for (size_t i = from; i < it->second.size(); ++i) {
    auto& c = it->second[i];
    out.push_back({c.pred, c.message, c.runtime_error});
  }
  it->second.resize(from);
  return out;
}

void AddExecutedCheck(ir::DeviceDataPtr result, const std::string& message, bool runtime_error) {
  std::vector<RanCheck> old;
  {
    std::lock_guard<std::mutex> g(g_check_mu);
    auto& ran = RanChecks();
    ran.push_back({std::move(result), message, runtime_error});
    // A compiled callable runs without syncs: read the oldest results (long finished) so that the
    // list stays bounded when nothing reads a value for many steps.
    if (ran.size() > 4096) {
      old.assign(ran.begin(), ran.begin() + 2048);
      ran.erase(ran.begin(), ran.begin() + 2048);
    }
  }
  for (auto& c : old) RaiseIfFailed(c);
}

std::shared_ptr<const runtime::Executable> CompileGraph(const std::vector<Value>& roots, int device,
                                                        const std::string& name,
                                                        std::vector<const Node*>* params,
                                                        const std::vector<std::pair<int, int>>& aliases) {
  RefreshDebugLevel();
  CheckDevice(device);
  PostOrder po = ComputePostOrder(roots);
  metrics::AddSample("TensorsGraphSize", static_cast<double>(po.nodes.size()), metrics::Unit::kCount);
  Hash128 key = GraphHash(po, roots, device);
  for (const auto& [param, result] : aliases) key = HashCombine(key, (static_cast<uint64_t>(param) << 32) | result);
  SyncOptions opts;
  opts.name = name;
  std::shared_ptr<Computation> comp = LookupOrCompile(key, po, roots, device, opts, aliases, !aliases.empty());
  *params = po.params;
  return std::shared_ptr<const runtime::Executable>(comp, &comp->exe);
}

bool ParamAliasingEnabled() {
  static const bool aliasing = [] {
    const char* e = std::getenv("XLA_ENABLE_PARAM_ALIASING");
    return !(e && (std::string(e) == "0" || std::string(e) == "false"));
  }();
  return aliasing;
}

bool MaterializeConstant(const TensorPtr& t) {
  if (!t->HasPending()) return false;
  std::vector<Value> roots{t->pending()};
  // A cheap bound first: constant expressions worth caching are small.
  size_t seen = 0;
  std::vector<const Node*> stack{roots[0].node.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n->op == ir::Op::kDeviceData || ++seen > 64) return false;
    for (const Value& v : n->operands) stack.push_back(v.node.get());
  }
  PostOrder po = ComputePostOrder(roots);
  Hash128 key = GraphHash(po, roots, t->device());
  static std::mutex mu;
  static auto* cache = new std::unordered_map<Hash128, ir::DeviceDataPtr, Hash128Hasher>();
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = cache->find(key);
    if (it != cache->end()) {
      t->SetData(it->second);
      return true;
    }
  }
  std::vector<TensorPtr> one{t};
  SyncTensors(&one, SyncOptions{});
  if (!t->data()) return false;
  t->data()->donatable = false;  // shared by every later tensor of this value
  std::lock_guard<std::mutex> g(mu);
  if (cache->size() < 1024) cache->emplace(key, t->data());
  return true;
}

uint64_t SyncExecutionCount() { return g_sync_executions.load(std::memory_order_relaxed); }
void MarkComputationRan() { g_any_computation = true; }

}  // namespace txla::graph
