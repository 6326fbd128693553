// The `_C` module: Python entry points of the torch bridge (sync, devices, RNG, debugging).
#include <torch/csrc/utils/pybind.h>

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "bridge/bridge.h"

#include <map>
#include "lowering/stablehlo.h"
#include "python/client_options.h"
#include "runtime/fp_env.h"
#include "ops/op_table.h"
#include "util/host_pool.h"
#include "util/metrics.h"
#include "util/block_cache.h"

namespace py = pybind11;
using namespace txla;

namespace txla::bridge {
void RegisterSpmdBindings(py::module& m);  // spmd_py.cc
void RegisterDynamoBindings(py::module& m);  // dynamo_py.cc
void RegisterControlFlowBindings(py::module& m);  // control_flow_py.cc
void RegisterHostKernels(runtime::Client& client);  // host_kernels.cc
void SetHostKernelKinds(bool dots, bool convs);     // host_kernels.cc
void SetHostReductionKind(bool on);                 // host_kernels.cc
void SetHostNormKind(bool on);                      // host_kernels.cc
void SetHostBigDotKind(bool on);                    // host_kernels.cc
}

namespace {

std::vector<graph::TensorPtr> XlaTensors(const std::vector<at::Tensor>& ts) {
  std::vector<graph::TensorPtr> out;
  for (const auto& t : ts) out.push_back(bridge::XlaFromUser(t));
  return out;
}

// ---- StableHLO export / run (torch_xla.stablehlo).

// Every node the roots need, operands before users (iterative DFS, each node once).
std::vector<const ir::Node*> PostOrderOf(const std::vector<ir::Value>& roots) {
  std::vector<const ir::Node*> order;
  std::unordered_set<const ir::Node*> done;
  std::vector<std::pair<const ir::Node*, size_t>> stack;
  for (const auto& r : roots) {
    if (done.count(r.node.get())) continue;
    stack.emplace_back(r.node.get(), 0);
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->operands.size()) {
        const ir::Node* child = n->operands[i++].node.get();
        if (!done.count(child)) stack.emplace_back(child, 0);
        continue;
      }
      if (done.insert(n).second) order.push_back(n);
      stack.pop_back();
    }
  }
  return order;
}

// StableHLO of `outputs` as a function of `inputs` (in that order), followed by whatever other
// device data the graph reads (cached scalars, RNG state): returned as tensors so that a saved
// program can be run again with them. Inputs must be materialized (no pending IR).
py::tuple ExportStableHlo(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) {
  auto outs = XlaTensors(outputs);
  auto ins = XlaTensors(inputs);
  std::unordered_map<const ir::DeviceData*, size_t> input_index;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i]->HasPending() || !ins[i]->data()) {
      throw py::value_error("stablehlo export: input " + std::to_string(i) + " is not materialized (sync first)");
    }
    input_index.emplace(ins[i]->data().get(), i);
  }
  lowering::ModuleSpec spec;
  spec.name = "main";
  for (auto& t : outs) {
    if (!t->error().empty()) throw std::runtime_error(t->error());
    spec.roots.push_back(t->GetValue());
  }
  spec.post_order = PostOrderOf(spec.roots);
  // Parameter order: the inputs first (one per input, in order), then the other device data.
  std::vector<const ir::Node*> by_input(ins.size(), nullptr);
  std::vector<const ir::Node*> extra;
  py::list extra_tensors;
  py::list used;  // per input: whether the graph reads it
  for (const ir::Node* n : spec.post_order) {
    if (n->op != ir::Op::kDeviceData) continue;
    auto it = input_index.find(n->data.get());
    if (it != input_index.end() && by_input[it->second] == nullptr) {
      by_input[it->second] = n;
    } else {
      extra.push_back(n);
      auto t = util::MakeCachedShared<graph::TensorData>(n->data->shape, n->data->device);
      t->SetData(n->data);
      extra_tensors.append(bridge::MakeXla(t));
    }
  }
  for (size_t i = 0; i < ins.size(); ++i) {
    used.append(by_input[i] != nullptr);
    if (by_input[i]) spec.params.push_back(by_input[i]);
  }
  for (const ir::Node* n : extra) spec.params.push_back(n);
  return py::make_tuple(lowering::EmitStableHlo(spec), used, extra_tensors);
}

std::mutex g_run_mu;
std::unordered_map<std::string, std::shared_ptr<runtime::Executable>>& RunCache() {
  static auto* cache = new std::unordered_map<std::string, std::shared_ptr<runtime::Executable>>();
  return *cache;
}

// Compiles (once per text) and runs a StableHLO module on the arguments' device; the results are
// new XLA tensors.
std::vector<at::Tensor> RunStableHlo(const std::string& text, const std::vector<at::Tensor>& args, int device) {
  auto ts = XlaTensors(args);
  std::vector<graph::TensorPtr> pending;
  for (auto& t : ts) {
    if (!t->error().empty()) throw std::runtime_error(t->error());
    if (t->HasPending() || !t->data()) pending.push_back(t);
    if (t->device() != ts[0]->device()) throw py::value_error("run_stablehlo: arguments are on different devices");
  }
  if (!ts.empty()) device = ts[0]->device();
  graph::CheckDevice(device);
  if (!pending.empty()) {
    graph::SyncOptions o;
    o.wait = true;
    py::gil_scoped_release nogil;
    graph::SyncTensors(&pending, o);
  }
  std::vector<runtime::Buffer> results;
  {
    std::lock_guard<std::mutex> g(g_run_mu);
    auto& client = graph::GetClient();
    auto& slot = RunCache()[text];
    if (!slot) slot = std::make_shared<runtime::Executable>(client.Compile(text, runtime::CompileOptions{}));
    std::vector<PJRT_Buffer*> bufs;
    for (auto& t : ts) {
      if (t->data()->IsSpmd()) throw std::runtime_error("run_stablehlo: not supported in SPMD mode");
      bufs.push_back(t->data()->buffer.get());
    }
    results = client.Execute(*slot, bufs, device);
  }
  std::vector<at::Tensor> out;
  for (auto& b : results) {
    ir::Shape shape(b.Type(), b.Dims());
    auto t = util::MakeCachedShared<graph::TensorData>(shape, device);
    t->SetData(std::make_shared<ir::DeviceData>(std::move(b), shape, device));
    out.push_back(bridge::MakeXla(t));
  }
  return out;
}

ir::ReduceKind CollectiveReduceKind(const std::string& kind) {
  static const std::map<std::string, ir::ReduceKind> kinds = {
      {"sum", ir::ReduceKind::kSum}, {"mul", ir::ReduceKind::kProd}, {"min", ir::ReduceKind::kMin},
      {"max", ir::ReduceKind::kMax}, {"and", ir::ReduceKind::kAnd}, {"or", ir::ReduceKind::kOr}};
  auto it = kinds.find(kind);
  if (it == kinds.end()) throw py::value_error("unknown reduce type '" + kind + "'");
  return it->second;
}

// A collective's result times `scale`, as the host path computes it: floating types multiply,
// integer types go through f64 and truncate back.
ir::Value Scaled(ir::Value v, double scale) {
  if (scale == 1.0) return v;
  ir::DType t = v.dtype();
  if (ir::IsFloating(t)) return ir::Binary(ir::Op::kMul, v, ir::Full(scale, v.shape()));
  ir::Value f = ir::Convert(v, ir::DType::kF64);
  return ir::Convert(ir::Binary(ir::Op::kMul, f, ir::Full(scale, f.shape())), t);
}

// Applies a lazy collective `op` to each XLA tensor of `ts`; new XLA tensors on the same devices.
template <typename F>
std::vector<at::Tensor> InGraph(const std::vector<at::Tensor>& ts, F op) {
  std::vector<at::Tensor> out;
  for (const auto& x : XlaTensors(ts)) {
    if (!x->error().empty()) throw std::runtime_error(x->error());
    out.push_back(bridge::MakeXla(graph::TensorFromValue(op(x->GetValue()), x->device())));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_xla's aten bridge";
  bridge::RegisterKernels();
  graph::SetClientStartHook(&bridge::RegisterHostKernels);
  // After the interpreter has finalized, XLA tensors that C++ statics still hold are leaked at exit
  // (see graph::ProcessExiting).
  Py_AtExit(&graph::SetProcessExiting);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ir::ShapeError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());  // as eager's shape errors
    } catch (const runtime::PjrtError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("_set_config_resolver", [](py::function fn) {
    // Deliberately never freed: a py::function must not be released by C++ static destructors
    // after the interpreter has finalized (that aborts the process at exit).
    auto* holder = new py::function(std::move(fn));
    graph::SetConfigResolver([holder]() {
      py::gil_scoped_acquire gil;
      py::tuple t = (*holder)();
      graph::RuntimeConfig c;
      c.plugin_path = t[0].cast<std::string>();
      c.device_type = t[1].cast<std::string>();
      c.cpu_device_count = t[2].cast<int64_t>();
      if (t.size() > 3 && !t[3].is_none()) c.options = python::ClientOptionsFromDict(t[3].cast<py::dict>());
      return c;
    });
  });
  bridge::RegisterSpmdBindings(m);
  m.def("_client_started", &graph::ClientStarted);
  // True once ATen's CPU kernels serve large dots and convolutions inside executables (CPU plugin
  // with the FFI extension, TORCH_XLA_HOST_KERNELS not 0, not SPMD). Starts the client.
  m.def("_host_kernels", []() {
    graph::GetClient();
    return py::make_tuple(ir::HostDots(), ir::HostConvs());
  });
  m.def("_set_host_kernels", [](bool dots, bool convs) {
    graph::GetClient();
    bridge::SetHostKernelKinds(dots, convs);
  });
  // Host reductions (large floating sums through ATen's sum kernel): on / switch. Starts the client.
  m.def("_host_reductions", []() {
    graph::GetClient();
    return ir::HostReductions();
  });
  m.def("_set_host_reductions", [](bool on) {
    graph::GetClient();
    bridge::SetHostReductionKind(on);
  });
  // Host batch norm (training-mode batch norm through ATen's CPU kernels): on / switch. Starts the client.
  m.def("_host_norms", []() {
    graph::GetClient();
    return ir::HostNorms();
  });
  m.def("_set_host_norms", [](bool on) {
    graph::GetClient();
    bridge::SetHostNormKind(on);
  });
  // Big dots (float32 dots of at least 10^8 multiply-adds through oneDNN's matmul): on / switch.
  m.def("_host_big_dots", []() {
    graph::GetClient();
    return ir::HostBigDots();
  });
  m.def("_set_host_big_dots", [](bool on) {
    graph::GetClient();
    bridge::SetHostBigDotKind(on);
  });
  // Denormals on XLA:CPU (runtime/fp_env.h): (handler registered, graphs keep denormals now,
  // intra-op pool threads cleared). Starts the client.
  m.def("_denormals", []() {
    graph::GetClient();
    return py::make_tuple(runtime::FpEnvRegistered(), runtime::KeepDenormals(), runtime::FpEnvPoolThreadsCleared());
  });
  m.def("_set_keep_denormals", [](bool on) {
    graph::GetClient();
    runtime::SetFpEnvEnabled(on);
  });
  // Host dots for every large dot (False) or only the transposed-right-operand ones (True, "tdot").
  m.def("_host_dots_transposed_only", []() {
    graph::GetClient();
    return ir::HostDotsTransposedOnly();
  });
  m.def("_set_host_dots_transposed_only", [](bool only) {
    graph::GetClient();
    ir::SetHostDotsTransposedOnly(only);
  });
  m.def("_device_count", &graph::DeviceCount);
  m.def("_check_device", &graph::CheckDevice);
  m.def("_device_type", []() { return graph::Config().device_type; });
  m.def("_device_kind", [](int i) {
    graph::CheckDevice(i);
    return graph::GetClient().DeviceKind(i);
  });
  m.def("_platform", []() {
    auto& c = graph::GetClient();
    return py::make_tuple(c.PlatformName(), c.PlatformVersion(), c.ApiMajor(), c.ApiMinor());
  });

  m.def("_sync", [](std::optional<std::vector<at::Tensor>> tensors, bool wait, const std::string& name) {
    graph::SyncOptions o;
    o.wait = wait;
    o.name = name;
    if (tensors) {
      auto ts = XlaTensors(*tensors);
      py::gil_scoped_release nogil;
      graph::SyncTensors(&ts, o);
    } else {
      py::gil_scoped_release nogil;
      graph::SyncTensors(nullptr, o);
    }
  }, py::arg("tensors") = py::none(), py::arg("wait") = false, py::arg("name") = "");
  // Host collectives: a CPU tensor whose memory comes from the staging pool and goes back to it
  // when the last holder (the tensor, or the device buffer that adopted it) lets go.
  m.def("_pooled_empty", [](int64_t numel, at::ScalarType st) {
    size_t bytes = static_cast<size_t>(numel) * c10::elementSize(st);
    void* p = util::HostPoolAcquire(bytes);
    return at::from_blob(p, {numel}, [bytes](void* q) { util::HostPoolRelease(q, bytes); },
                         at::TensorOptions().dtype(st).device(at::kCPU));
  }, py::arg("numel"), py::arg("dtype"));
  m.def("_pool_stats", []() {
    py::dict d;
    d["free_bytes"] = util::HostPoolFreeBytes();
    d["hits"] = util::HostPoolHits();
    return d;
  });
  // Host collectives: read an XLA tensor into an existing contiguous CPU tensor (a reused staging
  // buffer, so large reads do not pay for a fresh allocation each time).
  m.def("_to_host_into", [](const at::Tensor& t, at::Tensor& out) {
    auto x = bridge::XlaFromUser(t);
    TORCH_CHECK(out.device().is_cpu() && out.is_contiguous(), "_to_host_into: out must be a contiguous CPU tensor");
    TORCH_CHECK(out.scalar_type() == t.scalar_type() && out.numel() == t.numel(),
                "_to_host_into: out must have the dtype and number of elements of the source");
    py::gil_scoped_release nogil;
    graph::TensorToHost(x, out.data_ptr());
  });
  // Host collectives (CPU plugin): a CPU tensor aliasing an XLA tensor's ready device buffer, so
  // gloo can send straight from it; None where that is not possible. NEVER written: other tensors
  // (and a user's CPU tensor the buffer may alias) see the same memory. Holds the buffer while it lives.
  m.def("_host_view", [](const at::Tensor& t) -> py::object {
    auto x = bridge::XlaFromUser(t);
    std::shared_ptr<const void> view = graph::HostView(x);
    if (!view) return py::none();
    const ir::Shape& shape = x->data()->shape;  // the buffer's own shape and dtype must be t's
    std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
    if (shape.dims != sizes || shape.dtype != bridge::ToDType(t.scalar_type())) return py::none();
    auto* keep = new std::shared_ptr<const void>(std::move(view));
    at::Tensor cpu = at::from_blob(const_cast<void*>(keep->get()), sizes,
                                   [keep](void*) { delete keep; },
                                   at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
    return py::cast(cpu);
  }, py::arg("t"));
  // Host collectives: a device tensor that takes over a private contiguous CPU tensor's memory (the
  // CPU plugin aliases it instead of copying). The CPU tensor must never be written afterwards; it
  // is kept alive until the plugin lets go of it.
  m.def("_from_cpu_adopt", [](const at::Tensor& cpu, int device) {
    TORCH_CHECK(cpu.device().is_cpu() && cpu.is_contiguous() && cpu.storage_offset() == 0 && !cpu.requires_grad(),
                "_from_cpu_adopt: expected a contiguous CPU tensor at storage offset 0");
    ir::Shape shape(bridge::ToDType(cpu.scalar_type()), std::vector<int64_t>(cpu.sizes().begin(), cpu.sizes().end()));
    // Keep the storage, not the tensor: the tensor's Python object must not be released off the GIL.
    auto keep = std::make_shared<c10::Storage>(cpu.storage());
    graph::TensorPtr t;
    {
      py::gil_scoped_release nogil;
      t = graph::TensorFromHostZeroCopy(cpu.data_ptr(), shape, device, [keep]() mutable { keep.reset(); });
    }
    return bridge::MakeXla(t);
  }, py::arg("cpu"), py::arg("device"));
  // xm.get_memory_info: the plugin's memory statistics, or None where it reports none (CPU).
  m.def("_memory_stats", [](int i) -> py::object {
    graph::CheckDevice(i);
    runtime::Client::MemoryStats st;
    if (!graph::GetClient().GetMemoryStats(i, &st)) return py::none();
    py::dict d;
    d["bytes_in_use"] = st.bytes_in_use;
    if (st.peak_bytes_in_use >= 0) d["peak_bytes_in_use"] = st.peak_bytes_in_use;
    if (st.bytes_limit >= 0) d["bytes_limit"] = st.bytes_limit;
    return d;
  });
  m.def("_wait_device_ops", []() {
    py::gil_scoped_release nogil;
    graph::WaitDeviceOps();
  });
  m.def("_get_stablehlo", [](const std::vector<at::Tensor>& ts) { return graph::GetStableHlo(XlaTensors(ts)); });
  m.def("_dump_ir", [](const std::vector<at::Tensor>& ts) { return graph::DumpIr(XlaTensors(ts)); });
  m.def("_is_xla_tensor", [](const at::Tensor& t) {
    try {
      bridge::XlaFromUser(t);
      return true;
    } catch (...) {
      return false;
    }
  });
  m.def("_has_pending", [](const at::Tensor& t) { return bridge::XlaFromUser(t)->HasPending(); });
  m.def("_tensor_id", [](const at::Tensor& t) { return bridge::XlaFromUser(t)->id(); });
  m.def("_live_tensor_count", []() { return graph::LiveTensors().size(); });
  m.def("_compile_cache_size", &graph::CompileCacheSize);
  m.def("_clear_compile_cache", &graph::ClearCompileCache);

  m.def("_set_seed", [](uint64_t seed, int device) { graph::SetSeed(seed, device); });
  m.def("_get_seed", [](int device) { return graph::GetSeed(device); });
  m.def("_functionalize_composite", &bridge::FunctionalizeCompositeForXla);
  m.def("_rng_state", [](int device) { return bridge::MakeXla(graph::RngStateSnapshot(device)); });
  m.def("_set_rng_state", [](const at::Tensor& state, int device) {
    graph::SetRngStateFrom(bridge::XlaFromUser(state), device);
  });

  m.def("_set_eager_mode", &graph::SetEagerMode);
  m.def("_eager_mode", &graph::EagerMode);
  m.def("_enter_compiled_region", &graph::EnterCompiledRegion);
  m.def("_exit_compiled_region", &graph::ExitCompiledRegion);
  m.def("_set_execution_forbidden", &graph::SetExecutionForbidden);
  m.def("_inject_compile_failure", &graph::InjectCompileFailure, py::arg("needle"));
  // Test hook: the value class the out= probe keys a Python number by (out_dtype_check.cc).
  m.def("_out_probe_value_class", [](py::object v) {
    if (py::isinstance<py::bool_>(v)) return bridge::OutProbeValueClass(c10::Scalar(v.cast<bool>()));
    if (py::isinstance<py::int_>(v)) return bridge::OutProbeValueClass(c10::Scalar(v.cast<int64_t>()));
    return bridge::OutProbeValueClass(c10::Scalar(v.cast<double>()));
  });
  m.def("_initialize_cache", [](const std::string& path, bool readonly) {
    try {
      graph::InitializeCache(path, readonly);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("_any_computation_ran", &graph::AnyComputationRan);
  m.def("_compile_report", &graph::CompileReport);
  m.def("_sync_hashes", [](const std::string& name) {
    // Runs all pending work as graph `name`; returns the hashes of the graphs that ran.
    std::vector<Hash128> hashes;
    graph::SyncOptions o;
    o.name = name;
    o.executed = &hashes;
    {
      py::gil_scoped_release nogil;
      graph::SyncTensors(nullptr, o);
    }
    std::vector<std::string> out;
    for (auto& h : hashes) out.push_back(h.ToString());
    return out;
  });
  graph::SetScopeProvider([]() -> std::string {
    // The innermost Python frame outside torch's and torch_xla's own code.
    py::gil_scoped_acquire gil;
    PyFrameObject* frame = PyEval_GetFrame();
    if (frame) Py_INCREF(frame);
    std::string found;
    while (frame) {
      PyCodeObject* code = PyFrame_GetCode(frame);
      std::string file = py::str(code->co_filename).cast<std::string>();
      int line = PyFrame_GetLineNumber(frame);
      Py_DECREF(code);
      bool internal = file.find("/torch/") != std::string::npos || file.find("/torch_xla/") != std::string::npos ||
                      file.rfind("<frozen", 0) == 0;
      if (!internal) {
        found = file + ":" + std::to_string(line);
        Py_DECREF(frame);
        break;
      }
      PyFrameObject* back = PyFrame_GetBack(frame);
      Py_DECREF(frame);
      frame = back;
    }
    return found;
  });

  m.def("_debug_strides", [](const at::Tensor& t) {
    std::vector<std::vector<int64_t>> out;
    out.push_back(t.strides().vec());
    if (at::functionalization::impl::isFunctionalTensor(t)) {
      out.push_back(at::functionalization::impl::from_functional_tensor(t).strides().vec());
    }
    auto y = at::_ops::transpose_int::call(t, 0, 1);
    out.push_back(y.strides().vec());
    out.push_back({(int64_t)y.key_set().has_backend(c10::BackendComponent::XLABit),
                   (int64_t)t.key_set().has_backend(c10::BackendComponent::XLABit)});
    return out;
  });
  m.def("_lowered_ops", []() { return bridge::RegisteredRows(); });
  bridge::RegisterDynamoBindings(m);
  bridge::RegisterControlFlowBindings(m);

  // ---- Hooks behind torch_xla._XLAC (the PyTorch/XLA names live in torch_xla/_XLAC.py).
  m.def("_set_mat_mul_precision", [](int p) {
    try {
      ir::SetMatMulPrecision(p);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("_get_mat_mul_precision", &ir::MatMulPrecision);
  m.def("_set_platform_f32_mat_mul_precision", [](int p) {
    try {
      ir::SetPlatformF32MatMulPrecision(p);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("_tensor_info", [](const at::Tensor& t) {
    // Lazy-tensor state of an XLA tensor, for _get_xla_tensor_debug_info.
    auto x = bridge::XlaFromUser(t);
    py::dict d;
    d["id"] = x->id();
    d["device"] = x->device();
    d["shape"] = x->shape().ToString();
    d["has_data"] = static_cast<bool>(x->data());
    d["has_pending"] = x->HasPending();
    d["pending_op"] = x->HasPending() ? std::string(ir::OpName(x->pending().node->op)) : std::string();
    d["error"] = x->error();
    return d;
  });
  m.def("_dot_general", [](const at::Tensor& lhs, const at::Tensor& rhs, const std::vector<int64_t>& lc,
                           const std::vector<int64_t>& rc, const std::vector<int64_t>& lb,
                           const std::vector<int64_t>& rb, int precision, std::optional<at::ScalarType> out) {
    // stablehlo.dot_general with explicit dimension numbers (torch_xla._XLAC._xla_dot_general).
    auto a = bridge::XlaFromUser(lhs), b = bridge::XlaFromUser(rhs);
    if (a->device() != b->device()) throw py::value_error("_xla_dot_general: operands are on different XLA devices");
    auto check = [](const std::vector<int64_t>& dims, int rank, const char* what) {
      for (int64_t d : dims) {
        if (d < 0 || d >= rank) throw py::value_error(std::string("_xla_dot_general: ") + what + " dimension " +
                                                      std::to_string(d) + " out of range for rank " + std::to_string(rank));
      }
    };
    check(lc, a->shape().rank(), "lhs contracting");
    check(lb, a->shape().rank(), "lhs batch");
    check(rc, b->shape().rank(), "rhs contracting");
    check(rb, b->shape().rank(), "rhs batch");
    ir::Value x = a->GetValue(), y = b->GetValue();
    ir::DType t = out ? bridge::ToDType(*out) : x.dtype();
    if (x.dtype() != y.dtype()) throw py::value_error("_xla_dot_general: operands must have the same dtype");
    int old = ir::MatMulPrecisionSetting();
    if (precision >= 0) ir::SetMatMulPrecision(precision);
    ir::Value r;
    try {
      r = ir::DotGeneral(x, y, lb, rb, lc, rc, t);
    } catch (...) {
      ir::RestoreMatMulPrecisionSetting(old);
      throw;
    }
    ir::RestoreMatMulPrecisionSetting(old);
    return bridge::MakeXla(graph::TensorFromValue(r, a->device()));
  });
  m.def("_set_buffer_donation", [](const at::Tensor& t, bool donate) {
    return graph::SetBufferDonation(bridge::XlaFromUser(t), donate);
  });
  m.def("_get_buffer_donation", [](const at::Tensor& t) { return graph::GetBufferDonation(bridge::XlaFromUser(t)); });
  m.def("_set_alias_with_buffer_donor_config", &graph::SetAliasWithBufferDonorConfig);
  m.def("_get_alias_with_buffer_donor_config", &graph::AliasWithBufferDonorConfig);
  m.def("_buffer_donated", [](const at::Tensor& t) {
    // True when the tensor lost its buffer to a donation (reading it raises).
    auto x = bridge::XlaFromUser(t);
    return !x->HasPending() && !x->data() && !x->error().empty();
  });
  m.def("_stablehlo_export", &ExportStableHlo, py::arg("outputs"), py::arg("inputs"));
  m.def("_run_stablehlo", &RunStableHlo, py::arg("text"), py::arg("args"), py::arg("device") = 0);
  // In-graph collectives: StableHLO collectives over replica groups (the ids of the replicas of a
  // multi-replica or multi-process PJRT computation), one op per tensor; lazy like any other op.
  m.def("_all_reduce_ingraph", [](const std::vector<at::Tensor>& ts, const std::string& kind, double scale,
                                   const std::vector<std::vector<int64_t>>& groups) {
    ir::ReduceKind k = CollectiveReduceKind(kind);
    return InGraph(ts, [&](const ir::Value& x) { return Scaled(ir::AllReduce(k, x, groups), scale); });
  }, py::arg("tensors"), py::arg("reduce_type"), py::arg("scale"), py::arg("groups"));
  m.def("_reduce_scatter_ingraph", [](const std::vector<at::Tensor>& ts, const std::string& kind, double scale,
                                       int64_t dim, const std::vector<std::vector<int64_t>>& groups) {
    ir::ReduceKind k = CollectiveReduceKind(kind);
    return InGraph(ts, [&](const ir::Value& x) { return Scaled(ir::ReduceScatter(k, x, dim, groups), scale); });
  }, py::arg("tensors"), py::arg("reduce_type"), py::arg("scale"), py::arg("dim"), py::arg("groups"));
  m.def("_all_gather_ingraph", [](const std::vector<at::Tensor>& ts, int64_t dim,
                                   const std::vector<std::vector<int64_t>>& groups) {
    return InGraph(ts, [&](const ir::Value& x) { return ir::AllGather(x, dim, groups); });
  }, py::arg("tensors"), py::arg("dim"), py::arg("groups"));
  m.def("_all_to_all_ingraph", [](const std::vector<at::Tensor>& ts, int64_t split_dim, int64_t concat_dim,
                                   const std::vector<std::vector<int64_t>>& groups) {
    return InGraph(ts, [&](const ir::Value& x) { return ir::AllToAll(x, split_dim, concat_dim, groups); });
  }, py::arg("tensors"), py::arg("split_dimension"), py::arg("concat_dimension"), py::arg("groups"));
  m.def("_optimization_barrier", [](const std::vector<at::Tensor>& ts) {
    // Routes the tensors' values through one stablehlo.optimization_barrier (same values).
    auto xs = XlaTensors(ts);
    if (xs.empty()) return;
    std::vector<ir::Value> values;
    for (const auto& x : xs) {
      if (x->device() != xs[0]->device()) {
        throw py::value_error("optimization_barrier_: all tensors must be on the same XLA device");
      }
      if (!x->error().empty()) throw std::runtime_error(x->error());
      values.push_back(x->GetValue());
    }
    auto out = ir::OptimizationBarrier(values);
    for (size_t i = 0; i < xs.size(); ++i) xs[i]->SetPending(out[i]);
    if (graph::EagerMode() && !graph::InCompiledRegion()) {  // eager: one op, run now (as upstream)
      graph::SyncOptions o;
      o.eager = true;
      py::gil_scoped_release nogil;
      graph::SyncTensors(&xs, o);
    }
  });
}

// ---- torch.autocast(device_type="xla"): torch defines the AutocastXLA key and the cast policies but
// registers no kernels for it (PyTorch/XLA does that in its extension). Same op lists and policies
// as torch's AutocastCPU; every other op falls through to the XLA kernels.
TORCH_LIBRARY_IMPL(_, AutocastXLA, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

#define TXLA_AUTOCAST(...) KERNEL(c10::DeviceType::XLA, __VA_ARGS__)
#define TXLA_AUTOCAST_LOWER(...) TXLA_AUTOCAST(__VA_ARGS__, lower_precision_fp)
#define TXLA_AUTOCAST_FP32(...) TXLA_AUTOCAST(__VA_ARGS__, fp32)
#define TXLA_AUTOCAST_FP32_OPT_DTYPE(...) TXLA_AUTOCAST(__VA_ARGS__, fp32_set_opt_dtype)
#define TXLA_AUTOCAST_PROMOTE(...) TXLA_AUTOCAST(__VA_ARGS__, promote)
#define TXLA_AUTOCAST_REDISPATCH(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE(c10::DeviceType::XLA, REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, \
                                        REDISPATCH_SIGNATURE, POLICY)

namespace txla_autocast {
#if __has_include(<ATen/core/Dimname.h>)
// torch with named tensors (2.11; gone by 2.13): its autocast op lists name DimnameList unqualified
// (norm.names_ScalarOpt_dim). Tested by the header itself, since the release that dropped it is not ours to pin.
using at::DimnameList;
#endif
using at::Scalar;
using at::ScalarType;
using at::Tensor;
using c10::IntArrayRef;

TORCH_LIBRARY_IMPL(aten, AutocastXLA, m) {
  AT_FORALL_LOWER_PRECISION_FP(TXLA_AUTOCAST_LOWER)
  AT_FORALL_FP32(TXLA_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TXLA_AUTOCAST_FP32_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(TXLA_AUTOCAST_REDISPATCH)
  AT_FORALL_PROMOTE(TXLA_AUTOCAST_PROMOTE)
}
}  // namespace txla_autocast
