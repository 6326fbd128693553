// Helpers shared by our typed XLA FFI handlers (host kernels in the bridge, the floating-point
// environment call in the runtime). Torch-free; only built where XLA's FFI C API header was found.
#pragma once
#ifdef TXLA_HAVE_XLA_FFI

#include <algorithm>
#include <cstring>
#include <string>

#include <xla/ffi/api/c_api.h>

namespace txla::runtime {

// XLA first asks a handler for its metadata (API version, traits) through an extension of the call
// frame; returns true when this call was that question (answered). A plugin ignores handlers that
// claim a newer FFI API than its own (the custom call then "has no handler"), so we claim the older
// of our header's version and the plugin's; what we use of the API is the same in every 0.x minor.
inline bool AnswerFfiMetadata(XLA_FFI_CallFrame* cf) {
  for (XLA_FFI_Extension_Base* e = cf->extension_start; e != nullptr; e = e->next) {
    if (e->type != XLA_FFI_Extension_Metadata) continue;
    auto* m = reinterpret_cast<XLA_FFI_Metadata_Extension*>(e)->metadata;
    int minor = XLA_FFI_API_MINOR;
    if (cf->api != nullptr && cf->api->api_version.major_version == XLA_FFI_API_MAJOR) {
      minor = std::min(minor, cf->api->api_version.minor_version);
    }
    m->api_version.major_version = XLA_FFI_API_MAJOR;
    m->api_version.minor_version = minor;
    m->traits = 0;
    return true;
  }
  return false;
}

// An XLA FFI error carrying msg (XLA copies it); the execution fails with it.
inline XLA_FFI_Error* FfiError(XLA_FFI_CallFrame* cf, const std::string& msg) {
  XLA_FFI_Error_Create_Args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  a.message = msg.c_str();
  a.errc = XLA_FFI_Error_Code_INTERNAL;
  return cf->api->XLA_FFI_Error_Create(&a);
}

}  // namespace txla::runtime

#endif  // TXLA_HAVE_XLA_FFI
