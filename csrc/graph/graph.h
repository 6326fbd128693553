// Lazy tensors and the sync: collect pending tensors -> post order -> hash -> cache lookup ->
// lower -> compile -> run. Torch-free.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "runtime/runtime.h"

namespace txla::graph {

// A lazy tensor: either materialized device data, a pending IR value, or both (value wins).
class TensorData : public std::enable_shared_from_this<TensorData> {
 public:
  TensorData(ir::Shape shape, int device);
  ~TensorData();
  TensorData(const TensorData&) = delete;
  TensorData& operator=(const TensorData&) = delete;

  int64_t id() const { return id_; }
  const ir::Shape& shape() const { return shape_; }
  int device() const { return device_; }

  // The IR value for use in new graphs (a device-data leaf when materialized).
  ir::Value GetValue();
  bool HasPending() const { return static_cast<bool>(pending_); }
  const ir::Value& pending() const { return pending_; }
  const ir::DeviceDataPtr& data() const { return data_; }
  void SetPending(ir::Value v);
  void SetData(ir::DeviceDataPtr d);
  // The graph computing this tensor failed (e.g. did not compile): later uses raise `message`
  // instead of failing every later sync.
  void SetError(std::string message);
  const std::string& error() const { return error_; }

  // The registry of live tensors (LiveTensors, syncs of every tensor): an intrusive list under a
  // mutex, so registering a tensor allocates nothing. Register returns its argument.
  static std::shared_ptr<TensorData> Register(std::shared_ptr<TensorData> t);
  static void CollectLive(std::vector<std::shared_ptr<TensorData>>* out);

 private:
  TensorData* live_prev_ = nullptr;
  TensorData* live_next_ = nullptr;
  bool live_ = false;
  int64_t id_;
  ir::Shape shape_;
  int device_;
  ir::DeviceDataPtr data_;
  ir::Value data_node_;  // cached leaf for data_
  ir::Value pending_;
  std::string error_;
};
using TensorPtr = std::shared_ptr<TensorData>;

TensorPtr TensorFromValue(ir::Value v, int device);
// In SPMD mode, `sharding` lays the data out across the devices (null: replicated).
TensorPtr TensorFromHost(const void* data, const ir::Shape& shape, int device, ir::ShardingPtr sharding = nullptr);
// Like TensorFromHost, but the device buffer may alias `data` (CPU plugin): `release` runs once the
// runtime no longer reads it; `data` must stay unchanged until then. Copies (and releases at once)
// where aliasing does not apply (SPMD, bf16/f16 storage).
TensorPtr TensorFromHostZeroCopy(const void* data, const ir::Shape& shape, int device, std::function<void()> release);
// Runs what the tensor needs (if pending) and copies it to dst (numel * element size bytes).
void TensorToHost(const TensorPtr& t, void* dst);
// On the CPU plugin: the host memory of `t`'s ready device buffer (dense row-major), sharing
// ownership of its DeviceData (which therefore is not donated while the view lives). Read-only:
// other tensors may hold the same buffer. Null when `t` has pending work, no value, is sharded, is
// stored narrowed (XLA_USE_BF16) or the plugin's memory is not host memory.
std::shared_ptr<const void> HostView(const TensorPtr& t);

// ---- Runtime configuration and devices.
struct RuntimeConfig {
  std::string plugin_path;
  std::string device_type;  // "CPU", "CUDA", "TPU", ...
  int64_t cpu_device_count = -1;
  std::vector<runtime::ClientOptions::Option> options;  // further create options (GPU: visible_devices...)
};
// Called (once, on first device use) to resolve the plugin; set by the Python layer.
void SetConfigResolver(std::function<RuntimeConfig()> resolver);
bool ClientStarted();
// Called once, right after the client starts (before any compile): the bridge registers its host
// kernels there (ir::SetHostKernels). Set before the first device use.
void SetClientStartHook(std::function<void(runtime::Client&)> hook);
runtime::Client& GetClient();
const RuntimeConfig& Config();
int DeviceCount();  // starts the client; 1 in SPMD mode (one virtual device, xla:0)
int RuntimeDeviceCount();  // the runtime's devices (SPMD: those the virtual device spans)
void CheckDevice(int device);  // throws std::out_of_range with a clear message
// XLA_USE_BF16=1 (XLA_USE_F16=1), read once at the first transfer or compile: f32 and f64 tensors are
// stored and computed as bf16 (f16) on the device while their torch dtype stays f32/f64; host
// copies narrow on upload and widen on read. FloatStorageType() is kF32 when neither is set.
ir::DType FloatStorageType();
ir::DType PhysicalDType(ir::DType logical);

// ---- Host <-> device data (shared with SPMD, spmd.cc). Host bytes are in the logical dtype
// (numel * element size); XLA_USE_BF16 narrowing/widening happens here. In SPMD mode the data is one
// buffer per runtime device holding its shard of `sharding` (null: the whole array on each).
ir::DeviceDataPtr UploadData(const void* data, const ir::Shape& shape, int device, ir::ShardingPtr sharding = nullptr);
void DataToHost(const ir::DeviceData& d, void* dst);

// ---- Scalars as graph inputs: 0 and 1 are constants; other values are uploaded once and cached,
// so changing a scalar (learning rate, bias correction) never recompiles.
// always_data: uploaded even for 0 and 1 (a value XLA must not see as a constant).
ir::Value ScalarValue(double v, int64_t iv, ir::DType t, int device, double imag = 0, bool always_data = false);

// ---- Device RNG: the seed is a device tensor, a graph input.
void SetSeed(uint64_t seed, int device);
uint64_t GetSeed(int device);
// The RNG state as a tensor holding the seed's current value: nothing runs (the value may be
// pending). SetRngStateFrom makes such a state the device's seed again (torch_xla.get_rng_state /
// set_rng_state: the device-module protocol torch.utils.checkpoint and torch.random.fork_rng use).
TensorPtr RngStateSnapshot(int device);
void SetRngStateFrom(const TensorPtr& state, int device);
ir::Value NextRngState(int device);  // u64[2] state for rng_bit_generator; advances the seed in-graph

// ---- Process exit.
// True once the interpreter has finalized (set from Py_AtExit: Python's objects are gone, C++ statics
// are next). XLA tensors freed after that are leaked instead of destroyed, since the statics their
// destruction uses (the live-tensor list, IR work lists, the client) may already be gone: a static
// holding an XLA tensor at exit (autocast's cast cache when autocast was never exited) corrupted the
// heap.
bool ProcessExiting();
void SetProcessExiting();

// ---- In-graph checks (index bounds): a boolean scalar computed with the graph; a false value
// raises IndexCheckError (Python IndexError) at the next sync or host read, naming the op.
class IndexCheckError : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};
// A failed check that eager reports as RuntimeError (gather/scatter bounds, integer division by zero).
class CheckError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The message gains the Python source line of the op that added the check. A false value raises
// IndexCheckError, or CheckError when runtime_error is set.
void AddCheck(ir::Value all_ok, std::string message, int device, bool runtime_error = false);
// A check may instead be an s64 scalar: INT64_MIN when it holds, else the first failing index, which
// replaces `{index}` in the message (CheckWithIndex in ops/helpers.cc builds one).
std::string CheckMessage(const std::string& message, std::optional<int64_t> index);
// The boolean form of a check (an s64 check compared with INT64_MIN), for loops that and them.
ir::Value CheckPred(const ir::Value& check);
// While alive, the index checks (s64) the ops add on this thread take `message` instead of their own
// (a composite op such as one_hot words the error of the scatter it runs as eager's CPU kernel does).
// `message` must outlive the scope.
class CheckMessageScope {
 public:
  explicit CheckMessageScope(const std::string& message);
  ~CheckMessageScope();
  CheckMessageScope(const CheckMessageScope&) = delete;
  CheckMessageScope& operator=(const CheckMessageScope&) = delete;

 private:
  const std::string* prev_;
};
// Checks pending for `device`; DropPendingChecks keeps the first `keep` (an op whose results turned out
// empty drops the checks it added).
size_t PendingCheckCount(int device);
void DropPendingChecks(int device, size_t keep);
// Control flow: the checks added since `keep` by ops of a loop body being traced (their pred
// depends on the body's parameters) leave the pending list; the loop carries them and re-adds one
// check per message on its result (RestoreCheck; the message is kept as is).
struct LoopCheck {
  ir::Value pred;
  std::string message;
  bool runtime_error = false;
};
std::vector<LoopCheck> TakeLoopChecks(int device, size_t keep);
void RestoreCheck(int device, const LoopCheck& check);
// Raises for any executed check that failed (awaits their results).
void RaiseFailedChecks();

// ---- Sync.
struct SyncOptions {
  bool wait = false;
  bool eager = false;                       // one op run at once (eager mode): EagerOp* metrics
  std::string name;                         // shows in debug output, dumps and the module name
  std::vector<Hash128>* executed = nullptr;  // receives the hashes of the graphs that ran
  // Set by SyncTensors for a sync of every live tensor (mark_step): inputs that the graph
  // overwrites and nothing else references are donated to their outputs (XLA_ENABLE_PARAM_ALIASING=0
  // turns this off).
  bool donate = false;
  // Buffers marked by the user (SetBufferDonation) are donated: set by SyncTensors for a full sync,
  // and for a sync of listed tensors when the alias-with-buffer-donor config is on.
  bool user_donors = false;
};
// Materializes the given tensors (all live pending tensors when `tensors` is null).
void SyncTensors(const std::vector<TensorPtr>* tensors, const SyncOptions& opts);
void WaitDeviceOps();
// StableHLO text of the graph computing these tensors (all pending when empty).
std::string GetStableHlo(const std::vector<TensorPtr>& tensors);
std::vector<TensorPtr> LiveTensors();
// Debug: the pending IR graph of the tensors as text.
std::string DumpIr(const std::vector<TensorPtr>& tensors);
size_t CompileCacheSize();

// ---- Explicit buffer donation (torch_xla._XLAC._set_buffer_donation / _get_buffer_donation).
// Marks the tensor's device buffer to be donated by the next graph that reads it: at a full sync
// always, at a sync of listed tensors when the alias-with-buffer-donor config is on. A donated buffer
// is never read again: the tensors holding it raise on use. Returns false (nothing marked) for a
// tensor without device data of its own (pending, or a cached scalar input).
bool SetBufferDonation(const TensorPtr& t, bool donate);
bool GetBufferDonation(const TensorPtr& t);
void SetAliasWithBufferDonorConfig(bool on);
bool AliasWithBufferDonorConfig();
void ClearCompileCache();
void ForgetCachedScalars();  // drops the cached scalar inputs (SPMD re-uploads them replicated)

// ---- Compilation under the user's control.
// While set (torch_xla.compile(full_graph=True)), any execution raises with this message.
void SetExecutionForbidden(const std::string& message);  // "" lifts it
// Tests only: a compile of a module whose StableHLO text contains `needle` fails ("" turns it off),
// to check that a failed graph costs only the tensors that fail alone.
void InjectCompileFailure(const std::string& needle);
// Eager mode: every op outside compiled regions runs at once.
void SetEagerMode(bool on);
bool EagerMode();
void EnterCompiledRegion();
void ExitCompiledRegion();
bool InCompiledRegion();
// Persistent compilation cache (PJRT serialize/deserialize). Throws if a computation already ran.
void InitializeCache(const std::string& path, bool readonly);
bool AnyComputationRan();
// Debug output (PT_XLA_DEBUG / PT_XLA_DEBUG_LEVEL): compile reasons with source lines.
int DebugLevel();
void RefreshDebugLevel();  // re-reads PT_XLA_DEBUG / PT_XLA_DEBUG_LEVEL (done at every sync)
bool HloDebug();  // XLA_HLO_DEBUG: Python source locations in the StableHLO
// Source-line provider (installed by the Python bridge); called only when debugging is on.
void SetScopeProvider(std::function<std::string()> provider);
bool WantScopes();
std::string CurrentUserScope();
std::string CompileReport();  // per-name compile counts

// ---- Hooks for compiled callables (torch.compile's openxla backends: csrc/graph/dynamo.cc).
// A tensor holding already computed device data (registered as live).
TensorPtr TensorFromData(ir::DeviceDataPtr data);
// The device's current RNG seed tensor (created on first use; torch_xla.manual_seed replaces it).
TensorPtr RngSeedTensor(int device);
// In-graph checks of `device` pending beyond the first `from`: removed from the pending list.
struct CheckSpec {
  ir::Value pred;
  std::string message;
  bool runtime_error = false;
};
std::vector<CheckSpec> TakePendingChecks(int device, size_t from);
// The result of an executed check, read at the next sync or host read (as a sync's checks).
void AddExecutedCheck(ir::DeviceDataPtr result, const std::string& message, bool runtime_error);
// Finds (memory cache, persistent cache) or compiles the graph computing `roots` on `device`, named
// `name` for debug output; *params receives the executable's parameters in order (device-data
// nodes owned by the roots' graph).
// `aliases` (parameter, result) donates those parameters' buffers to those results (a separate
// executable: the pairs are part of the cache key).
std::shared_ptr<const runtime::Executable> CompileGraph(const std::vector<ir::Value>& roots, int device,
                                                        const std::string& name,
                                                        std::vector<const ir::Node*>* params,
                                                        const std::vector<std::pair<int, int>>& aliases = {});
// XLA_ENABLE_PARAM_ALIASING (default on): graphs donate the buffers of inputs they overwrite.
bool ParamAliasingEnabled();
// A pending tensor computed from constants alone (torch.ones_like(loss), the autograd seed) gets
// the cached result of an earlier identical graph: no execution, no sync. False when the tensor
// reads device data (or is not pending); the first time, the graph runs and its result is kept.
bool MaterializeConstant(const TensorPtr& t);
// Graphs run by syncs so far (a compiled callable's trace must run none).
uint64_t SyncExecutionCount();
// Records that a computation ran (initialize_cache() refuses to start after that).
void MarkComputationRan();

}  // namespace txla::graph
