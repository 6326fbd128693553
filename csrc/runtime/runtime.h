// The runtime layer: a narrow C++ interface over the PJRT C API.
// No torch headers here or in anything this includes.
#pragma once

#include <functional>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Device;
struct PJRT_Buffer;
struct PJRT_LoadedExecutable;
struct PJRT_Error;
struct PJRT_Event;

namespace txla::runtime {

// A process forked after the client started inherits the plugin's state without its threads: no
// PJRT call can work there. WatchForFork (called when a client starts) marks such children; in them
// every handle is leaked instead of destroyed, and the graph layer raises at the first use.
void WatchForFork();
bool InForkedChild();

// Every PJRT error becomes one of these, carrying the plugin's message.
// Default visibility + an out-of-line destructor (the key function) so that one
// typeinfo is shared by the core library and the Python modules that catch it.
class __attribute__((visibility("default"))) PjrtError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~PjrtError() override;
};

// Element types we move across the host/device boundary. Values are our own;
// the runtime maps them to PJRT_Buffer_Type.
enum class ElementType : int {
  kPred = 0, kS8, kS16, kS32, kS64, kU8, kU16, kU32, kU64,
  kF16, kBF16, kF32, kF64, kC64, kC128,
  kF8E4M3FN, kF8E5M2,  // storage and data movement only (see ops::Float8Rows)
};
size_t ElementSize(ElementType t);
const char* ElementTypeName(ElementType t);  // "f32", "bf16", "i1"... (StableHLO spelling)

// Options for creating a client.
struct ClientOptions {
  std::string plugin_path;          // path of the plugin .so
  std::string platform_hint;        // "CPU", "CUDA", "TPU", ... (for messages only)
  int64_t cpu_device_count = -1;    // >0: pass "cpu_device_count" (kInt64) as a create option
  // Further named create options, passed as given (GPU: "visible_devices", "node_id",
  // "num_nodes", "memory_fraction", "preallocate", ...). A plugin refuses names it doesn't know.
  struct Option {
    enum class Kind { kString, kInt64, kInt64List, kFloat, kBool } kind = Kind::kInt64;
    std::string name;
    std::string string_value;
    std::vector<int64_t> ints;  // kInt64 (one element) and kInt64List
    float float_value = 0;
    bool bool_value = false;
  };
  std::vector<Option> options;
};

class Client;

// Move-only owner of one PJRT_Buffer.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const PJRT_Api* api, PJRT_Buffer* buf);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  PJRT_Buffer* get() const { return buf_; }
  explicit operator bool() const { return buf_ != nullptr; }
  // Blocks until the buffer's data is ready (errors surface as PjrtError).
  void Await() const;
  // True once the buffer's data is ready (or its computation failed); never blocks.
  bool IsReady() const;
  // The buffer's address as the plugin reports it (PJRT_Buffer_UnsafePointer): on a CPU client,
  // host memory holding the data once the buffer is ready, valid while this Buffer lives.
  const void* UnsafePointer() const;
  // True when the plugin reports the buffer's layout as dense row-major (no tiles, minor_to_major
  // = rank-1..0): its memory then reads like a contiguous host array. False when it cannot say.
  bool IsDenseRowMajor() const;
  // Calls done() on a PJRT thread once the buffer is ready (or its computation failed); never
  // blocks. Used to time executions without waiting for them.
  // Returns false (done() never called) where the plugin cannot report readiness.
  bool OnReady(std::function<void()> done) const;
  // Copies the whole buffer (dense, row-major) into dst, which has nbytes bytes. Blocks.
  void ToHost(void* dst, size_t nbytes) const;
  std::vector<int64_t> Dims() const;
  ElementType Type() const;
  size_t OnDeviceSizeBytes() const;
  int DeviceId() const;  // PJRT global id of the device holding the buffer

 private:
  const PJRT_Api* api_ = nullptr;
  PJRT_Buffer* buf_ = nullptr;
};

// Move-only owner of one PJRT_LoadedExecutable.
class Executable {
 public:
  Executable() = default;
  Executable(const PJRT_Api* api, PJRT_LoadedExecutable* exe);
  ~Executable();
  Executable(Executable&& o) noexcept;
  Executable& operator=(Executable&& o) noexcept;
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  PJRT_LoadedExecutable* get() const { return exe_; }
  size_t NumOutputs() const;
  // The devices the executable is loaded on (PJRT_LoadedExecutable_AddressableDevices).
  std::vector<PJRT_Device*> Devices() const;
  // Serialized executable bytes (PJRT_Executable_Serialize), for a persistent cache.
  std::string Serialize() const;
  // The optimized program (PJRT_Executable_OptimizedProgram): serialized HLO; *format receives
  // its format name ("hlo", "hlo_with_config"). SPMD reads the output shardings from it.
  std::string OptimizedProgram(std::string* format) const;

 private:
  const PJRT_Api* api_ = nullptr;
  PJRT_LoadedExecutable* exe_ = nullptr;
  // Asked once when the executable is made (each query costs a PJRT_Executable view and, for the
  // output count, XLA's output shapes: allocations on every launch otherwise); -1: not known.
  int64_t num_outputs_ = -1;
  std::vector<PJRT_Device*> devices_;
};

// Build options encoded into a serialized xla.CompileOptionsProto.
struct CompileOptions {
  int num_replicas = 1;
  int num_partitions = 1;
  bool use_spmd_partitioning = false;
  // ExecutableBuildOptionsProto.allow_spmd_sharding_propagation_to_output (one flag per output, or
  // one for all): where true, XLA picks that output's sharding.
  std::vector<bool> allow_spmd_sharding_propagation_to_output;
  // device_assignment[replica][partition] = device id; empty: let the plugin choose.
  std::vector<std::vector<int>> device_assignment;
};
// Hand-encoded protobuf bytes (never empty). Exposed for tests.
std::string EncodeCompileOptions(const CompileOptions& opts);

// One PJRT client. Thread-compatible (callers serialize access).
class Client {
 public:
  // Loads the plugin (dlopen + GetPjrtApi), initializes it, creates the client.
  // Throws PjrtError with a clear message if the file is missing or not a plugin.
  static std::unique_ptr<Client> Create(const ClientOptions& opts);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const PJRT_Api* api() const { return api_; }
  std::string PlatformName() const;     // e.g. "cpu"
  std::string PlatformVersion() const;
  int ApiMajor() const;
  int ApiMinor() const;
  // Registers a typed XLA FFI handler (an XLA_FFI_Handler*) for custom calls to `target` on
  // `platform` ("Host" for XLA:CPU) through the plugin's PJRT FFI extension. False where the
  // plugin has no such extension or this build lacks its header; throws PjrtError if the plugin
  // refuses the handler.
  bool RegisterFfiHandler(const std::string& target, void* handler, const std::string& platform);
  // Addressable devices, in PJRT order.
  int NumDevices() const { return static_cast<int>(devices_.size()); }
  PJRT_Device* Device(int index) const;  // throws std::out_of_range
  int DeviceId(int index) const;         // PJRT global device id
  std::string DeviceKind(int index) const;

  // PJRT_Device_MemoryStats of an addressable device; false when the plugin does not report them
  // (XLA:CPU answers UNIMPLEMENTED). A limit or peak the plugin leaves unset is -1.
  struct MemoryStats {
    int64_t bytes_in_use = 0, peak_bytes_in_use = -1, bytes_limit = -1;
  };
  bool GetMemoryStats(int index, MemoryStats* out) const;
  // Host -> device. data is dense row-major with dims; copied before return.
  Buffer ToDevice(const void* data, ElementType type, const std::vector<int64_t>& dims, int device_index);
  // Like ToDevice, but the plugin may use `data` in place instead of copying it (PJRT's immutable
  // zero-copy semantics; the CPU plugin does for aligned data): `release` is called, on any thread,
  // once the plugin no longer reads `data` (the buffer and every computation using it are gone).
  // The caller must not write `data` before that. Falls back to a copy (release called at once)
  // where the plugin cannot report that moment.
  Buffer ToDeviceZeroCopy(const void* data, ElementType type, const std::vector<int64_t>& dims, int device_index,
                          std::function<void()> release);

 private:
  // PJRT_Client_BufferFromHostBuffer; the caller owns *done_with_host_buffer.
  Buffer FromHost(const void* data, ElementType type, const std::vector<int64_t>& dims, int device_index,
                  bool zero_copy, PJRT_Event** done_with_host_buffer);

 public:
  // Compile MLIR (StableHLO text or bytecode). Throws PjrtError with the compiler's message.
  Executable Compile(const std::string& mlir, const CompileOptions& opts);
  // Loads a serialized executable, overriding its compile options with opts.
  Executable DeserializeExecutable(const std::string& bytes, const CompileOptions& opts);
  // Loads a serialized executable with the compile options stored in it.
  Executable DeserializeExecutable(const std::string& bytes);
  // Runs on one device (device_index among addressable devices) with the given arguments.
  // Returns the outputs (untupled). Does not block on completion: await via Buffer::Await/ToHost.
  std::vector<Buffer> Execute(const Executable& exe, const std::vector<PJRT_Buffer*>& args, int device_index);
  // Runs a multi-device executable: args[device][arg] -> outputs[device][out].
  std::vector<std::vector<Buffer>> ExecuteReplicated(const Executable& exe,
                                                    const std::vector<std::vector<PJRT_Buffer*>>& args,
                                                    const std::vector<int>& device_indices);

 private:
  Client() = default;
  void* dl_handle_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
};

// Throws PjrtError (message from the plugin) if err is non-null, destroying err.
void Check(const PJRT_Api* api, PJRT_Error* err, const char* what);

}  // namespace txla::runtime
