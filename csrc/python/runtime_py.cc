// pybind11 bindings of the runtime layer (torch_xla._core.runtime). No torch here.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "python/client_options.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace txla::python {
namespace {

using runtime::Buffer;
using runtime::Client;
using runtime::CompileOptions;
using runtime::ElementType;
using runtime::Executable;
using runtime::PjrtError;

using DeviceAssignment = std::optional<std::vector<std::vector<int>>>;

// Buffers and executables keep their client alive: PJRT handles must be
// destroyed before the client that made them.
struct PyBuffer {
  std::shared_ptr<Client> client;
  Buffer buffer;
};
struct PyExecutable {
  std::shared_ptr<Client> client;
  Executable exe;
};

const ElementType kAllTypes[] = {
    ElementType::kPred, ElementType::kS8,  ElementType::kS16, ElementType::kS32, ElementType::kS64,
    ElementType::kU8,   ElementType::kU16, ElementType::kU32, ElementType::kU64, ElementType::kF16,
    ElementType::kBF16, ElementType::kF32, ElementType::kF64, ElementType::kC64, ElementType::kC128,
    ElementType::kF8E4M3FN, ElementType::kF8E5M2,
};

ElementType TypeFromName(const std::string& name) {
  for (ElementType t : kAllTypes) {
    if (name == runtime::ElementTypeName(t)) return t;
  }
  // A few friendly aliases.
  if (name == "pred" || name == "bool") return ElementType::kPred;
  if (name == "bfloat16") return ElementType::kBF16;
  std::string known;
  for (ElementType t : kAllTypes) known += std::string(known.empty() ? "" : ", ") + runtime::ElementTypeName(t);
  throw py::value_error("unknown element type '" + name + "'; expected one of: " + known);
}

ElementType TypeFromDtype(const py::dtype& dt) {
  const char kind = dt.kind();
  const py::ssize_t size = dt.itemsize();
  switch (kind) {
    case 'b': return ElementType::kPred;
    case 'i':
      if (size == 1) return ElementType::kS8;
      if (size == 2) return ElementType::kS16;
      if (size == 4) return ElementType::kS32;
      if (size == 8) return ElementType::kS64;
      break;
    case 'u':
      if (size == 1) return ElementType::kU8;
      if (size == 2) return ElementType::kU16;
      if (size == 4) return ElementType::kU32;
      if (size == 8) return ElementType::kU64;
      break;
    case 'f':
      if (size == 2) return ElementType::kF16;
      if (size == 4) return ElementType::kF32;
      if (size == 8) return ElementType::kF64;
      break;
    case 'c':
      if (size == 8) return ElementType::kC64;
      if (size == 16) return ElementType::kC128;
      break;
    default: break;
  }
  throw py::type_error("numpy dtype " + py::str(dt).cast<std::string>() +
                       " has no device type (bfloat16: use Client.to_device_raw(bytes, 'bf16', dims))");
}

// numpy dtype for a device type; bf16 has none.
py::dtype DtypeFor(ElementType t) {
  switch (t) {
    case ElementType::kPred: return py::dtype("bool");
    case ElementType::kS8: return py::dtype("int8");
    case ElementType::kS16: return py::dtype("int16");
    case ElementType::kS32: return py::dtype("int32");
    case ElementType::kS64: return py::dtype("int64");
    case ElementType::kU8: return py::dtype("uint8");
    case ElementType::kU16: return py::dtype("uint16");
    case ElementType::kU32: return py::dtype("uint32");
    case ElementType::kU64: return py::dtype("uint64");
    case ElementType::kF16: return py::dtype("float16");
    case ElementType::kF32: return py::dtype("float32");
    case ElementType::kF64: return py::dtype("float64");
    case ElementType::kC64: return py::dtype("complex64");
    case ElementType::kC128: return py::dtype("complex128");
    case ElementType::kBF16: case ElementType::kF8E4M3FN: case ElementType::kF8E5M2: break;
  }
  throw py::type_error(std::string("device type ") + runtime::ElementTypeName(t) +
                       " has no numpy dtype; use Buffer.to_bytes()");
}

size_t NumElements(const std::vector<int64_t>& dims) {
  size_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) throw py::value_error("negative dimension " + std::to_string(d));
    n *= static_cast<size_t>(d);
  }
  return n;
}

CompileOptions MakeOptions(int num_replicas, int num_partitions, const DeviceAssignment& assignment,
                           bool use_spmd_partitioning) {
  CompileOptions opts;
  opts.num_replicas = num_replicas;
  opts.num_partitions = num_partitions;
  opts.use_spmd_partitioning = use_spmd_partitioning;
  if (assignment) opts.device_assignment = *assignment;
  return opts;
}

std::vector<PJRT_Buffer*> RawBuffers(const std::vector<PyBuffer*>& buffers) {
  std::vector<PJRT_Buffer*> raw;
  raw.reserve(buffers.size());
  for (PyBuffer* b : buffers) {
    if (b == nullptr) throw py::type_error("execute: arguments must be Buffers, not None");
    raw.push_back(b->buffer.get());
  }
  return raw;
}

std::vector<PyBuffer> Wrap(const std::shared_ptr<Client>& client, std::vector<Buffer> outs) {
  std::vector<PyBuffer> wrapped;
  wrapped.reserve(outs.size());
  for (Buffer& b : outs) wrapped.push_back(PyBuffer{client, std::move(b)});
  return wrapped;
}

std::string Repr(const PyBuffer& b) {
  if (!b.buffer) return "<Buffer (empty)>";
  std::string s = "<Buffer ";
  s += runtime::ElementTypeName(b.buffer.Type());
  s += "[";
  bool first = true;
  for (int64_t d : b.buffer.Dims()) {
    s += (first ? "" : ",") + std::to_string(d);
    first = false;
  }
  return s + "] on device " + std::to_string(b.buffer.DeviceId()) + ">";
}

}  // namespace

void BindRuntime(py::module_& m) {
  m.doc() = "PJRT runtime: plugin clients, device buffers and executables";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PjrtError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def(
      "encode_compile_options",
      [](int num_replicas, int num_partitions, const DeviceAssignment& device_assignment,
         bool use_spmd_partitioning) {
        return py::bytes(runtime::EncodeCompileOptions(
            MakeOptions(num_replicas, num_partitions, device_assignment, use_spmd_partitioning)));
      },
      py::arg("num_replicas") = 1, py::arg("num_partitions") = 1, py::arg("device_assignment") = py::none(),
      py::arg("use_spmd_partitioning") = false,
      "Serialized xla.CompileOptionsProto; device_assignment[replica][partition] = device id.");
  m.def(
      "element_size", [](const std::string& type_name) { return runtime::ElementSize(TypeFromName(type_name)); },
      py::arg("type_name"));

  py::class_<PyBuffer>(m, "Buffer")
      .def("dims", [](const PyBuffer& b) { return b.buffer.Dims(); })
      .def("type_name", [](const PyBuffer& b) { return std::string(runtime::ElementTypeName(b.buffer.Type())); })
      .def("device_id", [](const PyBuffer& b) { return b.buffer.DeviceId(); })
      .def("on_device_size_bytes", [](const PyBuffer& b) { return b.buffer.OnDeviceSizeBytes(); })
      .def("await_ready",
           [](const PyBuffer& b) {
             py::gil_scoped_release release;
             b.buffer.Await();
           })
      .def("to_bytes",
           [](const PyBuffer& b) {
             const size_t n = NumElements(b.buffer.Dims()) * runtime::ElementSize(b.buffer.Type());
             std::string out(n, '\0');
             {
               py::gil_scoped_release release;
               b.buffer.ToHost(out.data(), n);
             }
             return py::bytes(out);
           })
      .def("to_numpy",
           [](const PyBuffer& b) {
             const std::vector<int64_t> dims = b.buffer.Dims();
             const ElementType type = b.buffer.Type();
             py::array out(DtypeFor(type), std::vector<py::ssize_t>(dims.begin(), dims.end()));
             const size_t n = NumElements(dims) * runtime::ElementSize(type);
             void* dst = out.mutable_data();
             {
               py::gil_scoped_release release;
               b.buffer.ToHost(dst, n);
             }
             return out;
           })
      .def("__repr__", &Repr);

  py::class_<PyExecutable>(m, "Executable")
      .def("num_outputs", [](const PyExecutable& e) { return e.exe.NumOutputs(); });

  py::class_<Client, std::shared_ptr<Client>>(m, "Client")
      .def_static(
          "create",
          [](const std::string& plugin_path, int64_t cpu_device_count, const std::string& platform_hint,
             const py::dict& options) {
            runtime::ClientOptions opts;
            opts.plugin_path = plugin_path;
            opts.platform_hint = platform_hint;
            opts.cpu_device_count = cpu_device_count;
            opts.options = ClientOptionsFromDict(options);
            std::unique_ptr<Client> client;
            {
              py::gil_scoped_release release;
              client = Client::Create(opts);
            }
            return std::shared_ptr<Client>(std::move(client));
          },
          py::arg("plugin_path"), py::arg("cpu_device_count") = -1, py::arg("platform_hint") = "",
          py::arg("options") = py::dict(),
          "options: further PJRT create options {name: str | bool | int | float | [int]}.")
      .def("platform_name", &Client::PlatformName)
      .def("platform_version", &Client::PlatformVersion)
      .def("api_version", [](const Client& c) { return py::make_tuple(c.ApiMajor(), c.ApiMinor()); })
      .def("num_devices", &Client::NumDevices)
      .def("device_kind", &Client::DeviceKind, py::arg("index"))
      .def("device_id", &Client::DeviceId, py::arg("index"))
      .def(
          "to_device",
          [](const std::shared_ptr<Client>& c, const py::object& array, int device_index) {
            // Dense, row-major, native byte order (numpy scalars and lists are converted).
            py::array a = py::array::ensure(array, py::array::c_style);
            if (!a) {
              PyErr_Clear();
              throw py::type_error("to_device: expected a numpy array (or something numpy can convert)");
            }
            const char order = a.dtype().byteorder();
            if (order != '=' && order != '|') {  // non-native byte order: swap on the host
              py::object native = a.dtype().attr("newbyteorder")("=");
              a = py::array::ensure(a.attr("astype")(native), py::array::c_style);
            }
            const ElementType type = TypeFromDtype(a.dtype());
            std::vector<int64_t> dims(a.shape(), a.shape() + a.ndim());
            const void* data = a.data();
            Buffer buf;
            {
              py::gil_scoped_release release;
              buf = c->ToDevice(data, type, dims, device_index);
            }
            return PyBuffer{c, std::move(buf)};
          },
          py::arg("array"), py::arg("device_index") = 0)
      .def(
          "to_device_raw",
          [](const std::shared_ptr<Client>& c, const py::bytes& data, const std::string& type_name,
             const std::vector<int64_t>& dims, int device_index) {
            const ElementType type = TypeFromName(type_name);
            std::string_view view = data;
            const size_t expected = NumElements(dims) * runtime::ElementSize(type);
            if (view.size() != expected) {
              throw py::value_error("to_device_raw: " + std::to_string(view.size()) + " bytes given but " +
                                    type_name + " with these dims needs " + std::to_string(expected));
            }
            Buffer buf;
            {
              py::gil_scoped_release release;
              buf = c->ToDevice(view.data(), type, dims, device_index);
            }
            return PyBuffer{c, std::move(buf)};
          },
          py::arg("data"), py::arg("type_name"), py::arg("dims"), py::arg("device_index") = 0)
      .def(
          "compile",
          [](const std::shared_ptr<Client>& c, const std::string& mlir, int num_replicas, int num_partitions,
             const DeviceAssignment& device_assignment, bool use_spmd_partitioning) {
            CompileOptions opts = MakeOptions(num_replicas, num_partitions, device_assignment, use_spmd_partitioning);
            Executable exe;
            {
              py::gil_scoped_release release;
              exe = c->Compile(mlir, opts);
            }
            return PyExecutable{c, std::move(exe)};
          },
          py::arg("mlir"), py::arg("num_replicas") = 1, py::arg("num_partitions") = 1,
          py::arg("device_assignment") = py::none(), py::arg("use_spmd_partitioning") = false,
          "Compiles StableHLO (MLIR text as str, or text/bytecode as bytes).")
      .def(
          "execute",
          [](const std::shared_ptr<Client>& c, const PyExecutable& exe, const std::vector<PyBuffer*>& args,
             int device_index) {
            std::vector<PJRT_Buffer*> raw = RawBuffers(args);
            std::vector<Buffer> outs;
            {
              py::gil_scoped_release release;
              outs = c->Execute(exe.exe, raw, device_index);
            }
            return Wrap(c, std::move(outs));
          },
          py::arg("executable"), py::arg("args"), py::arg("device_index") = 0)
      .def(
          "execute_replicated",
          [](const std::shared_ptr<Client>& c, const PyExecutable& exe,
             const std::vector<std::vector<PyBuffer*>>& args, const std::vector<int>& device_indices) {
            std::vector<std::vector<PJRT_Buffer*>> raw;
            for (const auto& list : args) raw.push_back(RawBuffers(list));
            std::vector<std::vector<Buffer>> outs;
            {
              py::gil_scoped_release release;
              outs = c->ExecuteReplicated(exe.exe, raw, device_indices);
            }
            std::vector<std::vector<PyBuffer>> wrapped;
            for (auto& per_device : outs) wrapped.push_back(Wrap(c, std::move(per_device)));
            return wrapped;
          },
          py::arg("executable"), py::arg("args"), py::arg("device_indices"),
          "args[device][arg] -> outputs[device][output]; device_indices in the executable's device order.")
      .def("serialize", [](const Client&, const PyExecutable& exe) { return py::bytes(exe.exe.Serialize()); },
           py::arg("executable"))
      .def(
          "deserialize",
          [](const std::shared_ptr<Client>& c, const py::bytes& data, std::optional<int> num_replicas,
             std::optional<int> num_partitions, const DeviceAssignment& device_assignment) {
            std::string bytes = data;
            Executable exe;
            if (!num_replicas && !num_partitions && !device_assignment) {
              py::gil_scoped_release release;
              exe = c->DeserializeExecutable(bytes);  // options stored in the executable
            } else {
              CompileOptions opts = MakeOptions(num_replicas.value_or(1), num_partitions.value_or(1),
                                                device_assignment, false);
              py::gil_scoped_release release;
              exe = c->DeserializeExecutable(bytes, opts);
            }
            return PyExecutable{c, std::move(exe)};
          },
          py::arg("data"), py::arg("num_replicas") = py::none(), py::arg("num_partitions") = py::none(),
          py::arg("device_assignment") = py::none());
}

}  // namespace txla::python
