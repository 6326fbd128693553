// The runtime layer over the PJRT C API (see runtime.h).
//
// Conventions:
//  * Every PJRT args struct is made by MakeArgs<T>(T_STRUCT_SIZE): zero-filled,
//    struct_size set. Nothing else sets struct_size.
//  * Every PJRT_Error goes through Check(), which throws PjrtError("<what>: <msg>").
//  * Every API function is fetched through PJRT_FN(api, Name), which throws
//    "not supported by this plugin" when the plugin's PJRT_Api is too old to
//    have the slot (beyond its struct_size) or leaves it null.
//  * Each PJRT handle has exactly one owner: Buffer, Executable, Client, and the
//    local helpers Event and ExecutableRef below.
//
// Executing on a device other than the first one (verified with the
// xla-cpu-pjrt plugin, PJRT API 0.81, cpu_device_count=2):
//  * Compiled with device_assignment {{1}}: the executable's addressable
//    devices are [device 1]. Executing with execute_device == nullptr runs it
//    on device 1 and the outputs live there; execute_device = device 1 is
//    accepted as well.
//  * Compiled without a device assignment: bound to device 0. Executing with
//    execute_device = device 1 fails with "ExecuteShard attempted to execute on
//    device id 1 which is not addressable by this client" (an error, no abort);
//    likewise a {{1}} executable asked to run on device 0.
//  * Compiled with compile_portable_executable=true (not emitted by
//    EncodeCompileOptions): runs on whichever device execute_device names.
// So callers wanting device i compile with device_assignment {{DeviceId(i)}}.
// Execute() passes execute_device = nullptr when the executable is bound to
// exactly that one device, and the explicit device otherwise (a portable
// executable, or one device of a multi-device executable).
//
// Other CPU-plugin behaviour worth knowing:
//  * Arguments are checked by count and byte size only: an i32[2,3] buffer
//    passed for an f32[2,3] parameter, or f32[3,2] for f32[2,3], is accepted.
//  * Without cpu_device_count the client had 4 devices here (a 2-core host).

#include "runtime/runtime.h"
#include "util/text.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

#include <dlfcn.h>
#include <sys/stat.h>

#include <pjrt_c_api.h>
#ifdef TXLA_HAVE_PJRT_FFI
#include <xla/pjrt/c/pjrt_c_api_ffi_extension.h>
#endif

#include <cstddef>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

namespace txla::runtime {

PjrtError::~PjrtError() = default;

namespace {

template <class T>
T MakeArgs(size_t struct_size) {
  T a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = struct_size;
  return a;
}

// Returns the API function in `slot`, or throws if the plugin does not provide it.
template <class F>
F* RequireFn(const PJRT_Api* api, size_t offset, F* const* slot, const char* name) {
  if (api == nullptr) throw PjrtError(std::string(name) + ": no PJRT API (object not initialized)");
  if (offset + sizeof(F*) > api->struct_size || *slot == nullptr) {
    util::Text os;
    os << name << " is not supported by this plugin (PJRT API "
       << api->pjrt_api_version.major_version << "." << api->pjrt_api_version.minor_version << ")";
    throw PjrtError(os.str());
  }
  return *slot;
}
#define PJRT_FN(api, name) RequireFn((api), offsetof(PJRT_Api, name), &(api)->name, #name)

// For destructors: destroys an error without throwing.
void Discard(const PJRT_Api* api, PJRT_Error* err) noexcept {
  if (err == nullptr || api == nullptr || api->PJRT_Error_Destroy == nullptr) return;
  auto a = MakeArgs<PJRT_Error_Destroy_Args>(PJRT_Error_Destroy_Args_STRUCT_SIZE);
  a.error = err;
  api->PJRT_Error_Destroy(&a);
}

// Owns one PJRT_Event; Await() throws the event's error.
class Event {
 public:
  Event(const PJRT_Api* api, PJRT_Event* ev) : api_(api), ev_(ev) {}
  ~Event() {
    if (ev_ == nullptr || InForkedChild()) return;  // see InForkedChild
    auto a = MakeArgs<PJRT_Event_Destroy_Args>(PJRT_Event_Destroy_Args_STRUCT_SIZE);
    a.event = ev_;
    try {
      Discard(api_, PJRT_FN(api_, PJRT_Event_Destroy)(&a));
    } catch (...) {
    }
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void Await(const char* what) const {
    if (ev_ == nullptr) return;
    auto a = MakeArgs<PJRT_Event_Await_Args>(PJRT_Event_Await_Args_STRUCT_SIZE);
    a.event = ev_;
    Check(api_, PJRT_FN(api_, PJRT_Event_Await)(&a), what);
  }

 private:
  const PJRT_Api* api_;
  PJRT_Event* ev_;
};

// Owns the PJRT_Executable view of a loaded executable.
class ExecutableRef {
 public:
  ExecutableRef(const PJRT_Api* api, PJRT_LoadedExecutable* loaded) : api_(api) {
    if (loaded == nullptr) throw PjrtError("executable is empty (moved from or never compiled)");
    auto a = MakeArgs<PJRT_LoadedExecutable_GetExecutable_Args>(
        PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE);
    a.loaded_executable = loaded;
    Check(api_, PJRT_FN(api_, PJRT_LoadedExecutable_GetExecutable)(&a), "LoadedExecutable_GetExecutable");
    exe_ = a.executable;
  }
  ~ExecutableRef() {
    if (exe_ == nullptr || InForkedChild()) return;  // see InForkedChild
    auto a = MakeArgs<PJRT_Executable_Destroy_Args>(PJRT_Executable_Destroy_Args_STRUCT_SIZE);
    a.executable = exe_;
    try {
      Discard(api_, PJRT_FN(api_, PJRT_Executable_Destroy)(&a));
    } catch (...) {
    }
  }
  ExecutableRef(const ExecutableRef&) = delete;
  ExecutableRef& operator=(const ExecutableRef&) = delete;
  PJRT_Executable* get() const { return exe_; }

 private:
  const PJRT_Api* api_;
  PJRT_Executable* exe_ = nullptr;
};

PJRT_Buffer_Type ToPjrtType(ElementType t) {
  switch (t) {
    case ElementType::kPred: return PJRT_Buffer_Type_PRED;
    case ElementType::kS8: return PJRT_Buffer_Type_S8;
    case ElementType::kS16: return PJRT_Buffer_Type_S16;
    case ElementType::kS32: return PJRT_Buffer_Type_S32;
    case ElementType::kS64: return PJRT_Buffer_Type_S64;
    case ElementType::kU8: return PJRT_Buffer_Type_U8;
    case ElementType::kU16: return PJRT_Buffer_Type_U16;
    case ElementType::kU32: return PJRT_Buffer_Type_U32;
    case ElementType::kU64: return PJRT_Buffer_Type_U64;
    case ElementType::kF16: return PJRT_Buffer_Type_F16;
    case ElementType::kBF16: return PJRT_Buffer_Type_BF16;
    case ElementType::kF32: return PJRT_Buffer_Type_F32;
    case ElementType::kF64: return PJRT_Buffer_Type_F64;
    case ElementType::kC64: return PJRT_Buffer_Type_C64;
    case ElementType::kC128: return PJRT_Buffer_Type_C128;
    case ElementType::kF8E4M3FN: return PJRT_Buffer_Type_F8E4M3FN;
    case ElementType::kF8E5M2: return PJRT_Buffer_Type_F8E5M2;
  }
  throw PjrtError("unknown ElementType " + std::to_string(static_cast<int>(t)));
}

ElementType FromPjrtType(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED: return ElementType::kPred;
    case PJRT_Buffer_Type_S8: return ElementType::kS8;
    case PJRT_Buffer_Type_S16: return ElementType::kS16;
    case PJRT_Buffer_Type_S32: return ElementType::kS32;
    case PJRT_Buffer_Type_S64: return ElementType::kS64;
    case PJRT_Buffer_Type_U8: return ElementType::kU8;
    case PJRT_Buffer_Type_U16: return ElementType::kU16;
    case PJRT_Buffer_Type_U32: return ElementType::kU32;
    case PJRT_Buffer_Type_U64: return ElementType::kU64;
    case PJRT_Buffer_Type_F16: return ElementType::kF16;
    case PJRT_Buffer_Type_BF16: return ElementType::kBF16;
    case PJRT_Buffer_Type_F32: return ElementType::kF32;
    case PJRT_Buffer_Type_F64: return ElementType::kF64;
    case PJRT_Buffer_Type_C64: return ElementType::kC64;
    case PJRT_Buffer_Type_C128: return ElementType::kC128;
    case PJRT_Buffer_Type_F8E4M3FN: return ElementType::kF8E4M3FN;
    case PJRT_Buffer_Type_F8E5M2: return ElementType::kF8E5M2;
    default: break;
  }
  throw PjrtError("PJRT buffer element type " + std::to_string(static_cast<int>(t)) +
                  " is not supported by this runtime");
}

PJRT_DeviceDescription* Describe(const PJRT_Api* api, PJRT_Device* dev) {
  auto a = MakeArgs<PJRT_Device_GetDescription_Args>(PJRT_Device_GetDescription_Args_STRUCT_SIZE);
  a.device = dev;
  Check(api, PJRT_FN(api, PJRT_Device_GetDescription)(&a), "Device_GetDescription");
  return a.device_description;
}

int DescriptionId(const PJRT_Api* api, PJRT_Device* dev) {
  auto a = MakeArgs<PJRT_DeviceDescription_Id_Args>(PJRT_DeviceDescription_Id_Args_STRUCT_SIZE);
  a.device_description = Describe(api, dev);
  Check(api, PJRT_FN(api, PJRT_DeviceDescription_Id)(&a), "DeviceDescription_Id");
  return a.id;
}

std::vector<PJRT_Device*> ExecutableDevices(const PJRT_Api* api, PJRT_LoadedExecutable* exe) {
  auto a = MakeArgs<PJRT_LoadedExecutable_AddressableDevices_Args>(
      PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE);
  a.executable = exe;
  Check(api, PJRT_FN(api, PJRT_LoadedExecutable_AddressableDevices)(&a),
        "LoadedExecutable_AddressableDevices");
  return std::vector<PJRT_Device*>(a.addressable_devices, a.addressable_devices + a.num_addressable_devices);
}

// --- protobuf wire format (just what CompileOptionsProto needs) ---
void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void PutTag(std::string& out, int field, int wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}
void PutInt(std::string& out, int field, int64_t v) {  // int32/int64/bool: varint
  PutTag(out, field, 0);
  PutVarint(out, static_cast<uint64_t>(v));
}
void PutBytes(std::string& out, int field, const std::string& bytes) {  // length-delimited
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  out += bytes;
}

// Process-wide: PJRT_Plugin_Initialize must run once per loaded plugin.
std::mutex g_init_mu;
std::set<const PJRT_Api*>& InitializedApis() {
  static std::set<const PJRT_Api*> apis;
  return apis;
}

}  // namespace

bool Client::GetMemoryStats(int index, MemoryStats* out) const {
  PJRT_Device* device = Device(index);
  if (api_->struct_size < offsetof(PJRT_Api, PJRT_Device_MemoryStats) + sizeof(void*) ||
      api_->PJRT_Device_MemoryStats == nullptr) {
    return false;  // a plugin older than the function
  }
  auto a = MakeArgs<PJRT_Device_MemoryStats_Args>(PJRT_Device_MemoryStats_Args_STRUCT_SIZE);
  a.device = device;
  PJRT_Error* err = api_->PJRT_Device_MemoryStats(&a);
  if (err != nullptr) {
    Discard(api_, err);
    return false;
  }
  out->bytes_in_use = a.bytes_in_use;
  out->peak_bytes_in_use = a.peak_bytes_in_use_is_set ? a.peak_bytes_in_use : -1;
  out->bytes_limit = a.bytes_limit_is_set ? a.bytes_limit : -1;
  return true;
}

void Check(const PJRT_Api* api, PJRT_Error* err, const char* what) {
  if (err == nullptr) return;
  std::string msg = "(no message)";
  if (api != nullptr && api->PJRT_Error_Message != nullptr) {
    auto m = MakeArgs<PJRT_Error_Message_Args>(PJRT_Error_Message_Args_STRUCT_SIZE);
    m.error = err;
    api->PJRT_Error_Message(&m);
    if (m.message != nullptr) msg.assign(m.message, m.message_size);
  }
  Discard(api, err);
  throw PjrtError(std::string(what) + ": " + msg);
}

size_t ElementSize(ElementType t) {
  switch (t) {
    case ElementType::kPred: case ElementType::kS8: case ElementType::kU8:
    case ElementType::kF8E4M3FN: case ElementType::kF8E5M2: return 1;
    case ElementType::kS16: case ElementType::kU16: case ElementType::kF16: case ElementType::kBF16: return 2;
    case ElementType::kS32: case ElementType::kU32: case ElementType::kF32: return 4;
    case ElementType::kS64: case ElementType::kU64: case ElementType::kF64: case ElementType::kC64: return 8;
    case ElementType::kC128: return 16;
  }
  throw PjrtError("unknown ElementType " + std::to_string(static_cast<int>(t)));
}

const char* ElementTypeName(ElementType t) {
  switch (t) {
    case ElementType::kPred: return "i1";
    case ElementType::kS8: return "i8";
    case ElementType::kS16: return "i16";
    case ElementType::kS32: return "i32";
    case ElementType::kS64: return "i64";
    case ElementType::kU8: return "ui8";
    case ElementType::kU16: return "ui16";
    case ElementType::kU32: return "ui32";
    case ElementType::kU64: return "ui64";
    case ElementType::kF16: return "f16";
    case ElementType::kBF16: return "bf16";
    case ElementType::kF32: return "f32";
    case ElementType::kF64: return "f64";
    case ElementType::kC64: return "complex<f32>";
    case ElementType::kC128: return "complex<f64>";
    case ElementType::kF8E4M3FN: return "f8E4M3FN";
    case ElementType::kF8E5M2: return "f8E5M2";
  }
  return "unknown";
}

// ------------------------------- fork -----------------------------------------
namespace {
std::atomic<bool> g_forked_child{false};
void MarkForkedChild() { g_forked_child.store(true); }
}  // namespace

bool InForkedChild() { return g_forked_child.load(std::memory_order_relaxed); }

void WatchForFork() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &MarkForkedChild); });
}

// ------------------------------- Buffer -------------------------------------

Buffer::Buffer(const PJRT_Api* api, PJRT_Buffer* buf) : api_(api), buf_(buf) {}

Buffer::~Buffer() {
  if (buf_ == nullptr || InForkedChild()) return;  // see InForkedChild
  auto a = MakeArgs<PJRT_Buffer_Destroy_Args>(PJRT_Buffer_Destroy_Args_STRUCT_SIZE);
  a.buffer = buf_;
  try {
    Discard(api_, PJRT_FN(api_, PJRT_Buffer_Destroy)(&a));
  } catch (...) {
  }
}

Buffer::Buffer(Buffer&& o) noexcept : api_(o.api_), buf_(std::exchange(o.buf_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Buffer old(std::move(*this));
    api_ = o.api_;
    buf_ = std::exchange(o.buf_, nullptr);
  }
  return *this;
}

void Buffer::Await() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::Await: empty buffer");
  auto a = MakeArgs<PJRT_Buffer_ReadyEvent_Args>(PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_ReadyEvent)(&a), "Buffer_ReadyEvent");
  Event ev(api_, a.event);
  ev.Await("buffer not ready (computation failed)");
}

bool Buffer::IsReady() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::IsReady: empty buffer");
  auto a = MakeArgs<PJRT_Buffer_ReadyEvent_Args>(PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_ReadyEvent)(&a), "Buffer_ReadyEvent");
  Event ev(api_, a.event);
  auto r = MakeArgs<PJRT_Event_IsReady_Args>(PJRT_Event_IsReady_Args_STRUCT_SIZE);
  r.event = a.event;
  Check(api_, PJRT_FN(api_, PJRT_Event_IsReady)(&r), "Event_IsReady");
  return r.is_ready;
}

const void* Buffer::UnsafePointer() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::UnsafePointer: empty buffer");
  auto a = MakeArgs<PJRT_Buffer_UnsafePointer_Args>(PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_UnsafePointer)(&a), "Buffer_UnsafePointer");
  return reinterpret_cast<const void*>(a.buffer_pointer);
}

bool Buffer::IsDenseRowMajor() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::IsDenseRowMajor: empty buffer");
  if (offsetof(PJRT_Api, PJRT_Buffer_GetMemoryLayout) + sizeof(void*) > api_->struct_size ||
      api_->PJRT_Buffer_GetMemoryLayout == nullptr) {
    return false;
  }
  auto a = MakeArgs<PJRT_Buffer_GetMemoryLayout_Args>(PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE);
  a.buffer = buf_;
  if (PJRT_Error* err = api_->PJRT_Buffer_GetMemoryLayout(&a)) {
    Discard(api_, err);
    return false;
  }
  if (a.layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled || a.layout.tiled.num_tiles != 0) return false;
  size_t rank = a.layout.tiled.minor_to_major_size;
  for (size_t i = 0; i < rank; ++i) {
    if (a.layout.tiled.minor_to_major[i] != static_cast<int64_t>(rank - 1 - i)) return false;
  }
  return true;
}

namespace {
struct ReadyCallback {
  const PJRT_Api* api;
  PJRT_Event* event;
  std::function<void()> done;
};

void OnReadyTrampoline(PJRT_Error* error, void* user_arg) {
  auto* cb = static_cast<ReadyCallback*>(user_arg);
  Discard(cb->api, error);
  try {
    cb->done();
  } catch (...) {
  }
  {
    Event ev(cb->api, cb->event);  // destroyed once its callback has run
  }
  delete cb;
}

bool HasOnReady(const PJRT_Api* api) {
  try {
    PJRT_FN(api, PJRT_Event_OnReady);
    return true;
  } catch (const PjrtError&) {
    return false;
  }
}

// Calls done() on a PJRT thread once `event` is ready, then destroys the event. Returns false (event
// and done left to the caller) where the plugin refuses the callback.
bool CallWhenReady(const PJRT_Api* api, PJRT_Event* event, const std::function<void()>& done) {
  auto* cb = new ReadyCallback{api, event, done};
  auto o = MakeArgs<PJRT_Event_OnReady_Args>(PJRT_Event_OnReady_Args_STRUCT_SIZE);
  o.event = event;
  o.callback = &OnReadyTrampoline;
  o.user_arg = cb;
  PJRT_Error* err = PJRT_FN(api, PJRT_Event_OnReady)(&o);
  if (err == nullptr) return true;
  Discard(api, err);
  delete cb;
  return false;
}
}  // namespace

bool Buffer::OnReady(std::function<void()> done) const {
  if (buf_ == nullptr) return false;
  if (!HasOnReady(api_)) return false;  // an older plugin: no timing
  auto a = MakeArgs<PJRT_Buffer_ReadyEvent_Args>(PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_ReadyEvent)(&a), "Buffer_ReadyEvent");
  if (CallWhenReady(api_, a.event, done)) return true;
  Event ev(api_, a.event);
  return false;
}

void Buffer::ToHost(void* dst, size_t nbytes) const {
  if (buf_ == nullptr) throw PjrtError("Buffer::ToHost: empty buffer");
  auto fn = PJRT_FN(api_, PJRT_Buffer_ToHostBuffer);
  // dst == nullptr asks for the size of the dense host copy.
  auto q = MakeArgs<PJRT_Buffer_ToHostBuffer_Args>(PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE);
  q.src = buf_;
  Check(api_, fn(&q), "Buffer_ToHostBuffer (size query)");
  Event query_event(api_, q.event);
  if (q.dst_size != nbytes) {
    throw PjrtError("Buffer::ToHost: the buffer holds " + std::to_string(q.dst_size) +
                    " bytes but the destination has " + std::to_string(nbytes));
  }
  if (nbytes == 0) {  // nothing to copy; still surface a failed computation
    Await();
    return;
  }
  auto a = MakeArgs<PJRT_Buffer_ToHostBuffer_Args>(PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE);
  a.src = buf_;
  a.dst = dst;
  a.dst_size = nbytes;
  Check(api_, fn(&a), "Buffer_ToHostBuffer");
  Event ev(api_, a.event);
  ev.Await("Buffer_ToHostBuffer");
}

std::vector<int64_t> Buffer::Dims() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::Dims: empty buffer");
  auto a = MakeArgs<PJRT_Buffer_Dimensions_Args>(PJRT_Buffer_Dimensions_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_Dimensions)(&a), "Buffer_Dimensions");
  return std::vector<int64_t>(a.dims, a.dims + a.num_dims);
}

ElementType Buffer::Type() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::Type: empty buffer");
  auto a = MakeArgs<PJRT_Buffer_ElementType_Args>(PJRT_Buffer_ElementType_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_ElementType)(&a), "Buffer_ElementType");
  return FromPjrtType(a.type);
}

size_t Buffer::OnDeviceSizeBytes() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::OnDeviceSizeBytes: empty buffer");
  auto a = MakeArgs<PJRT_Buffer_OnDeviceSizeInBytes_Args>(PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_OnDeviceSizeInBytes)(&a), "Buffer_OnDeviceSizeInBytes");
  return a.on_device_size_in_bytes;
}

int Buffer::DeviceId() const {
  if (buf_ == nullptr) throw PjrtError("Buffer::DeviceId: empty buffer");
  auto a = MakeArgs<PJRT_Buffer_Device_Args>(PJRT_Buffer_Device_Args_STRUCT_SIZE);
  a.buffer = buf_;
  Check(api_, PJRT_FN(api_, PJRT_Buffer_Device)(&a), "Buffer_Device");
  return DescriptionId(api_, a.device);
}

// ----------------------------- Executable -----------------------------------

Executable::Executable(const PJRT_Api* api, PJRT_LoadedExecutable* exe) : api_(api), exe_(exe) {
  if (exe_ == nullptr) return;
  try {
    devices_ = ExecutableDevices(api_, exe_);
    num_outputs_ = static_cast<int64_t>(NumOutputs());
  } catch (...) {  // asked again at each use, where an error reaches the caller
    num_outputs_ = -1;
    devices_.clear();
  }
}

Executable::~Executable() {
  if (exe_ == nullptr || InForkedChild()) return;  // see InForkedChild
  auto a = MakeArgs<PJRT_LoadedExecutable_Destroy_Args>(PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE);
  a.executable = exe_;
  try {
    Discard(api_, PJRT_FN(api_, PJRT_LoadedExecutable_Destroy)(&a));
  } catch (...) {
  }
}

Executable::Executable(Executable&& o) noexcept
    : api_(o.api_),
      exe_(std::exchange(o.exe_, nullptr)),
      num_outputs_(std::exchange(o.num_outputs_, -1)),
      devices_(std::move(o.devices_)) {}

Executable& Executable::operator=(Executable&& o) noexcept {
  if (this != &o) {
    Executable old(std::move(*this));
    api_ = o.api_;
    exe_ = std::exchange(o.exe_, nullptr);
    num_outputs_ = std::exchange(o.num_outputs_, -1);
    devices_ = std::move(o.devices_);
    o.devices_.clear();
  }
  return *this;
}

std::vector<PJRT_Device*> Executable::Devices() const {
  if (num_outputs_ >= 0) return devices_;
  if (exe_ == nullptr) throw PjrtError("executable is empty (moved from or never compiled)");
  return ExecutableDevices(api_, exe_);
}

size_t Executable::NumOutputs() const {
  if (num_outputs_ >= 0) return static_cast<size_t>(num_outputs_);
  ExecutableRef ref(api_, exe_);
  auto a = MakeArgs<PJRT_Executable_NumOutputs_Args>(PJRT_Executable_NumOutputs_Args_STRUCT_SIZE);
  a.executable = ref.get();
  Check(api_, PJRT_FN(api_, PJRT_Executable_NumOutputs)(&a), "Executable_NumOutputs");
  return a.num_outputs;
}

std::string Executable::Serialize() const {
  ExecutableRef ref(api_, exe_);
  auto a = MakeArgs<PJRT_Executable_Serialize_Args>(PJRT_Executable_Serialize_Args_STRUCT_SIZE);
  a.executable = ref.get();
  Check(api_, PJRT_FN(api_, PJRT_Executable_Serialize)(&a), "Executable_Serialize");
  std::string out;
  if (a.serialized_bytes != nullptr) out.assign(a.serialized_bytes, a.serialized_bytes_size);
  if (a.serialized_executable_deleter != nullptr && a.serialized_executable != nullptr) {
    a.serialized_executable_deleter(a.serialized_executable);
  }
  return out;
}

std::string Executable::OptimizedProgram(std::string* format) const {
  ExecutableRef ref(api_, exe_);
  PJRT_Program program;
  std::memset(&program, 0, sizeof program);
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  auto a = MakeArgs<PJRT_Executable_OptimizedProgram_Args>(PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE);
  a.executable = ref.get();
  a.program = &program;
  Check(api_, PJRT_FN(api_, PJRT_Executable_OptimizedProgram)(&a), "Executable_OptimizedProgram");
  std::string code(program.code_size, '\0');
  program.code = code.data();
  Check(api_, PJRT_FN(api_, PJRT_Executable_OptimizedProgram)(&a), "Executable_OptimizedProgram");
  if (format != nullptr) format->assign(program.format ? program.format : "", program.format_size);
  return code;
}

// --------------------------- Compile options --------------------------------

std::string EncodeCompileOptions(const CompileOptions& opts) {
  if (opts.num_replicas < 1 || opts.num_partitions < 1) {
    throw std::invalid_argument("compile options: num_replicas and num_partitions must be >= 1");
  }
  // xla.ExecutableBuildOptionsProto
  std::string build;
  PutInt(build, 4, opts.num_replicas);    // num_replicas
  PutInt(build, 5, opts.num_partitions);  // num_partitions
  if (opts.use_spmd_partitioning) PutInt(build, 6, 1);
  for (bool b : opts.allow_spmd_sharding_propagation_to_output) PutInt(build, 12, b ? 1 : 0);  // repeated bool
  if (!opts.device_assignment.empty()) {
    const auto& da = opts.device_assignment;  // [replica][partition]
    if (static_cast<int>(da.size()) != opts.num_replicas) {
      throw std::invalid_argument("compile options: device_assignment has " + std::to_string(da.size()) +
                      " rows but num_replicas is " + std::to_string(opts.num_replicas));
    }
    for (const auto& row : da) {
      if (static_cast<int>(row.size()) != opts.num_partitions) {
        throw std::invalid_argument("compile options: a device_assignment row has " + std::to_string(row.size()) +
                        " entries but num_partitions is " + std::to_string(opts.num_partitions));
      }
    }
    // xla.DeviceAssignmentProto: computation_devices is indexed by computation
    // (= partition) and lists the device of each replica.
    std::string assignment;
    PutInt(assignment, 1, opts.num_replicas);    // replica_count
    PutInt(assignment, 2, opts.num_partitions);  // computation_count
    for (int p = 0; p < opts.num_partitions; ++p) {
      std::string ids;
      for (int r = 0; r < opts.num_replicas; ++r) PutVarint(ids, static_cast<uint64_t>(static_cast<int64_t>(da[r][p])));
      std::string computation;
      PutBytes(computation, 1, ids);  // packed repeated int64 replica_device_ids
      PutBytes(assignment, 3, computation);
    }
    PutBytes(build, 9, assignment);
  }
  // xla.CompileOptionsProto
  std::string out;
  PutBytes(out, 3, build);  // executable_build_options
  return out;
}

// ------------------------------- Client -------------------------------------

std::unique_ptr<Client> Client::Create(const ClientOptions& opts) {
  const std::string& path = opts.plugin_path;
  std::string label = opts.platform_hint.empty() ? "PJRT plugin" : "PJRT " + opts.platform_hint + " plugin";
  if (path.empty()) throw PjrtError(label + ": no plugin path given");
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw PjrtError(label + " not found: '" + path + "' does not exist");

  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    throw PjrtError("cannot load " + label + " '" + path + "': " + (e ? e : "dlopen failed"));
  }
  dlerror();
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    const char* e = dlerror();
    std::string msg = "'" + path + "' is not a PJRT plugin (no GetPjrtApi symbol): " + (e ? e : "");
    dlclose(handle);
    throw PjrtError(msg);
  }
  const PJRT_Api* api = get_api();
  if (api == nullptr) throw PjrtError("'" + path + "': GetPjrtApi returned null");
  if (api->struct_size < offsetof(PJRT_Api, pjrt_api_version) + sizeof(PJRT_Api_Version)) {
    throw PjrtError("'" + path + "': PJRT_Api struct is too small to be a PJRT plugin");
  }
  if (api->pjrt_api_version.major_version != PJRT_API_MAJOR) {
    throw PjrtError("'" + path + "' implements PJRT API " + std::to_string(api->pjrt_api_version.major_version) +
                    "." + std::to_string(api->pjrt_api_version.minor_version) + " but this build expects major version " +
                    std::to_string(PJRT_API_MAJOR));
  }

  {
    std::lock_guard<std::mutex> lock(g_init_mu);
    if (InitializedApis().count(api) == 0) {
      if (offsetof(PJRT_Api, PJRT_Plugin_Initialize) < api->struct_size && api->PJRT_Plugin_Initialize != nullptr) {
        auto a = MakeArgs<PJRT_Plugin_Initialize_Args>(PJRT_Plugin_Initialize_Args_STRUCT_SIZE);
        Check(api, api->PJRT_Plugin_Initialize(&a), "Plugin_Initialize");
      }
      InitializedApis().insert(api);
    }
  }

  std::unique_ptr<Client> client(new Client());
  client->dl_handle_ = handle;
  client->api_ = api;

  std::vector<PJRT_NamedValue> options;
  static const char kCpuDeviceCount[] = "cpu_device_count";
  if (opts.cpu_device_count > 0) {
    auto nv = MakeArgs<PJRT_NamedValue>(PJRT_NamedValue_STRUCT_SIZE);
    nv.name = kCpuDeviceCount;
    nv.name_size = sizeof(kCpuDeviceCount) - 1;
    nv.type = PJRT_NamedValue_kInt64;  // the CPU plugin aborts on any other type
    nv.int64_value = opts.cpu_device_count;
    nv.value_size = 1;
    options.push_back(nv);
  }
  for (const auto& o : opts.options) {  // the option structs point into `opts`, alive for the call
    auto nv = MakeArgs<PJRT_NamedValue>(PJRT_NamedValue_STRUCT_SIZE);
    nv.name = o.name.c_str();
    nv.name_size = o.name.size();
    using K = ClientOptions::Option::Kind;
    switch (o.kind) {
      case K::kString:
        nv.type = PJRT_NamedValue_kString;
        nv.string_value = o.string_value.c_str();
        nv.value_size = o.string_value.size();
        break;
      case K::kInt64:
        if (o.ints.size() != 1) throw std::invalid_argument("client option " + o.name + ": expected one integer");
        nv.type = PJRT_NamedValue_kInt64;
        nv.int64_value = o.ints[0];
        nv.value_size = 1;
        break;
      case K::kInt64List:
        nv.type = PJRT_NamedValue_kInt64List;
        nv.int64_array_value = o.ints.data();
        nv.value_size = o.ints.size();
        break;
      case K::kFloat:
        nv.type = PJRT_NamedValue_kFloat;
        nv.float_value = o.float_value;
        nv.value_size = 1;
        break;
      case K::kBool:
        nv.type = PJRT_NamedValue_kBool;
        nv.bool_value = o.bool_value;
        nv.value_size = 1;
        break;
    }
    options.push_back(nv);
  }
  auto a = MakeArgs<PJRT_Client_Create_Args>(PJRT_Client_Create_Args_STRUCT_SIZE);
  a.create_options = options.empty() ? nullptr : options.data();
  a.num_options = options.size();
  Check(api, PJRT_FN(api, PJRT_Client_Create)(&a), ("Client_Create (" + path + ")").c_str());
  client->client_ = a.client;

  auto d = MakeArgs<PJRT_Client_AddressableDevices_Args>(PJRT_Client_AddressableDevices_Args_STRUCT_SIZE);
  d.client = client->client_;
  Check(api, PJRT_FN(api, PJRT_Client_AddressableDevices)(&d), "Client_AddressableDevices");
  client->devices_.assign(d.addressable_devices, d.addressable_devices + d.num_addressable_devices);
  return client;
}

Client::~Client() {
  if (client_ == nullptr || InForkedChild()) return;  // see InForkedChild
  auto a = MakeArgs<PJRT_Client_Destroy_Args>(PJRT_Client_Destroy_Args_STRUCT_SIZE);
  a.client = client_;
  try {
    Discard(api_, PJRT_FN(api_, PJRT_Client_Destroy)(&a));
  } catch (...) {
  }
  // The plugin stays loaded (no dlclose): plugins are not built to be unloaded.
}

std::string Client::PlatformName() const {
  auto a = MakeArgs<PJRT_Client_PlatformName_Args>(PJRT_Client_PlatformName_Args_STRUCT_SIZE);
  a.client = client_;
  Check(api_, PJRT_FN(api_, PJRT_Client_PlatformName)(&a), "Client_PlatformName");
  return std::string(a.platform_name, a.platform_name_size);
}

bool Client::RegisterFfiHandler(const std::string& target, void* handler, const std::string& platform) {
#ifdef TXLA_HAVE_PJRT_FFI
  for (const PJRT_Extension_Base* e = api_->extension_start; e != nullptr; e = e->next) {
    if (e->type != PJRT_Extension_Type_FFI) continue;
    const auto* ffi = reinterpret_cast<const PJRT_FFI_Extension*>(e);
    if (ffi->base.struct_size < PJRT_FFI_Extension_STRUCT_SIZE || ffi->register_handler == nullptr) return false;
    auto a = MakeArgs<PJRT_FFI_Register_Handler_Args>(PJRT_FFI_Register_Handler_Args_STRUCT_SIZE);
    a.target_name = target.c_str();
    a.target_name_size = target.size();
    a.handler = handler;
    a.platform_name = platform.c_str();
    a.platform_name_size = platform.size();
    Check(api_, ffi->register_handler(&a), ("FFI register_handler " + target).c_str());
    return true;
  }
#else
  (void)target;
  (void)handler;
  (void)platform;
#endif
  return false;
}

std::string Client::PlatformVersion() const {
  auto a = MakeArgs<PJRT_Client_PlatformVersion_Args>(PJRT_Client_PlatformVersion_Args_STRUCT_SIZE);
  a.client = client_;
  Check(api_, PJRT_FN(api_, PJRT_Client_PlatformVersion)(&a), "Client_PlatformVersion");
  return std::string(a.platform_version, a.platform_version_size);
}

int Client::ApiMajor() const { return api_->pjrt_api_version.major_version; }
int Client::ApiMinor() const { return api_->pjrt_api_version.minor_version; }

PJRT_Device* Client::Device(int index) const {
  if (index < 0 || index >= NumDevices()) {
    throw std::out_of_range("device index " + std::to_string(index) + " out of range: the client has " +
                            std::to_string(NumDevices()) + " addressable device(s)");
  }
  return devices_[index];
}

int Client::DeviceId(int index) const { return DescriptionId(api_, Device(index)); }

std::string Client::DeviceKind(int index) const {
  auto a = MakeArgs<PJRT_DeviceDescription_Kind_Args>(PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE);
  a.device_description = Describe(api_, Device(index));
  Check(api_, PJRT_FN(api_, PJRT_DeviceDescription_Kind)(&a), "DeviceDescription_Kind");
  return std::string(a.device_kind, a.device_kind_size);
}

Buffer Client::FromHost(const void* data, ElementType type, const std::vector<int64_t>& dims, int device_index,
                        bool zero_copy, PJRT_Event** done_with_host_buffer) {
  PJRT_Device* device = Device(device_index);
  for (int64_t d : dims) {
    if (d < 0) throw PjrtError("ToDevice: negative dimension " + std::to_string(d));
  }
  static const char kEmpty[1] = {0};  // PJRT wants a non-null pointer even for 0 elements
  auto a = MakeArgs<PJRT_Client_BufferFromHostBuffer_Args>(PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE);
  a.client = client_;
  a.data = data != nullptr ? data : kEmpty;
  a.type = ToPjrtType(type);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = zero_copy ? PJRT_HostBufferSemantics_kImmutableZeroCopy
                                      : PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  a.device = device;
  Check(api_, PJRT_FN(api_, PJRT_Client_BufferFromHostBuffer)(&a), "Client_BufferFromHostBuffer");
  *done_with_host_buffer = a.done_with_host_buffer;
  return Buffer(api_, a.buffer);
}

Buffer Client::ToDevice(const void* data, ElementType type, const std::vector<int64_t>& dims, int device_index) {
  PJRT_Event* done_event = nullptr;
  Buffer buf = FromHost(data, type, dims, device_index, false, &done_event);
  Event done(api_, done_event);
  done.Await("Client_BufferFromHostBuffer (host copy)");
  return buf;
}

Buffer Client::ToDeviceZeroCopy(const void* data, ElementType type, const std::vector<int64_t>& dims,
                                int device_index, std::function<void()> release) {
  if (!HasOnReady(api_) || data == nullptr) {  // cannot learn when the plugin is done: copy
    Buffer b = ToDevice(data, type, dims, device_index);
    release();
    return b;
  }
  PJRT_Event* done_event = nullptr;
  Buffer buf = FromHost(data, type, dims, device_index, true, &done_event);
  if (CallWhenReady(api_, done_event, release)) return buf;
  // No callback: copy instead, drop the aliasing buffer, then wait until the plugin lets go of `data`.
  Buffer copy = ToDevice(data, type, dims, device_index);
  buf = Buffer();
  {
    Event done(api_, done_event);
    done.Await("Client_BufferFromHostBuffer (zero copy)");
  }
  release();
  return copy;
}

Executable Client::Compile(const std::string& mlir, const CompileOptions& opts) {
  std::string options = EncodeCompileOptions(opts);
  static const char kFormat[] = "mlir";
  auto program = MakeArgs<PJRT_Program>(PJRT_Program_STRUCT_SIZE);
  program.code = const_cast<char*>(mlir.data());
  program.code_size = mlir.size();
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  auto a = MakeArgs<PJRT_Client_Compile_Args>(PJRT_Client_Compile_Args_STRUCT_SIZE);
  a.client = client_;
  a.program = &program;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  Check(api_, PJRT_FN(api_, PJRT_Client_Compile)(&a), "compile");
  return Executable(api_, a.executable);
}

Executable Client::DeserializeExecutable(const std::string& bytes, const CompileOptions& opts) {
  std::string options = EncodeCompileOptions(opts);
  auto a = MakeArgs<PJRT_Executable_DeserializeAndLoad_Args>(PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  a.overridden_serialized_compile_options = options.data();
  a.overridden_serialized_compile_options_size = options.size();
  Check(api_, PJRT_FN(api_, PJRT_Executable_DeserializeAndLoad)(&a), "Executable_DeserializeAndLoad");
  return Executable(api_, a.loaded_executable);
}

Executable Client::DeserializeExecutable(const std::string& bytes) {
  auto a = MakeArgs<PJRT_Executable_DeserializeAndLoad_Args>(PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  Check(api_, PJRT_FN(api_, PJRT_Executable_DeserializeAndLoad)(&a), "Executable_DeserializeAndLoad");
  return Executable(api_, a.loaded_executable);
}

namespace {

// One PJRT_LoadedExecutable_Execute call. Outputs are not awaited: a failed
// computation surfaces when an output is read (Buffer::Await / ToHost).
std::vector<std::vector<Buffer>> RunExecutable(const PJRT_Api* api, const Executable& exe,
                                               const std::vector<std::vector<PJRT_Buffer*>>& args,
                                               PJRT_Device* execute_device) {
  if (exe.get() == nullptr) throw PjrtError("execute: empty executable");
  const size_t num_devices = args.size();
  if (num_devices == 0) throw PjrtError("execute: no devices to run on");
  const size_t num_args = args[0].size();
  for (const auto& list : args) {
    if (list.size() != num_args) throw PjrtError("execute: every device needs the same number of arguments");
    for (PJRT_Buffer* b : list) {
      if (b == nullptr) throw PjrtError("execute: an argument buffer is empty (deleted or moved from)");
    }
  }
  const size_t num_outputs = exe.NumOutputs();

  std::vector<PJRT_Buffer* const*> arg_lists(num_devices);
  for (size_t d = 0; d < num_devices; ++d) arg_lists[d] = args[d].data();
  std::vector<std::vector<PJRT_Buffer*>> outs(num_devices, std::vector<PJRT_Buffer*>(num_outputs, nullptr));
  std::vector<PJRT_Buffer**> out_lists(num_devices);
  for (size_t d = 0; d < num_devices; ++d) out_lists[d] = outs[d].data();

  auto options = MakeArgs<PJRT_ExecuteOptions>(PJRT_ExecuteOptions_STRUCT_SIZE);
  auto a = MakeArgs<PJRT_LoadedExecutable_Execute_Args>(PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE);
  a.executable = exe.get();
  a.options = &options;
  a.argument_lists = arg_lists.data();
  a.num_devices = num_devices;
  a.num_args = num_args;
  a.output_lists = out_lists.data();
  a.device_complete_events = nullptr;  // errors surface through the outputs' ready events
  a.execute_device = execute_device;
  Check(api, PJRT_FN(api, PJRT_LoadedExecutable_Execute)(&a), "execute");

  std::vector<std::vector<Buffer>> result(num_devices);
  for (size_t d = 0; d < num_devices; ++d) {
    result[d].reserve(num_outputs);
    for (PJRT_Buffer* b : outs[d]) result[d].emplace_back(api, b);
  }
  return result;
}

}  // namespace

std::vector<Buffer> Client::Execute(const Executable& exe, const std::vector<PJRT_Buffer*>& args, int device_index) {
  PJRT_Device* target = Device(device_index);
  if (exe.get() == nullptr) throw PjrtError("execute: empty executable");
  // Bound to exactly this device at compile time: let PJRT use that binding.
  // Otherwise ask for this device explicitly (the plugin may refuse; see the
  // comment at the top of this file).
  std::vector<PJRT_Device*> bound = exe.Devices();
  PJRT_Device* execute_device = (bound.size() == 1 && bound[0] == target) ? nullptr : target;
  auto outs = RunExecutable(api_, exe, {args}, execute_device);
  return std::move(outs[0]);
}

std::vector<std::vector<Buffer>> Client::ExecuteReplicated(const Executable& exe,
                                                          const std::vector<std::vector<PJRT_Buffer*>>& args,
                                                          const std::vector<int>& device_indices) {
  if (exe.get() == nullptr) throw PjrtError("execute: empty executable");
  if (args.size() != device_indices.size()) {
    throw PjrtError("execute_replicated: " + std::to_string(args.size()) + " argument lists for " +
                    std::to_string(device_indices.size()) + " devices");
  }
  // PJRT runs argument_lists[i] on the executable's i-th addressable device.
  std::vector<PJRT_Device*> bound = exe.Devices();
  if (bound.size() != device_indices.size()) {
    throw PjrtError("execute_replicated: the executable runs on " + std::to_string(bound.size()) +
                    " device(s) but " + std::to_string(device_indices.size()) + " were given");
  }
  for (size_t i = 0; i < bound.size(); ++i) {
    if (Device(device_indices[i]) != bound[i]) {
      throw PjrtError("execute_replicated: device_indices[" + std::to_string(i) + "] = " +
                      std::to_string(device_indices[i]) + " is not the executable's device " +
                      std::to_string(DescriptionId(api_, bound[i])) + " at that position");
    }
  }
  return RunExecutable(api_, exe, args, nullptr);
}

}  // namespace txla::runtime
