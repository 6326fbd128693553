// Python entry points of compiled callables (torch.compile(backend="openxla"/"openxla_eval"), see
// torch_xla/_dynamo/dynamo_bridge.py and csrc/graph/dynamo.h): begin a trace with the example
// inputs, compile the traced outputs, and run a compiled graph on new inputs (the hot path).
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "bridge/bridge.h"
#include "graph/dynamo.h"
#include "util/metrics.h"

namespace py = pybind11;
using namespace txla;

namespace {

// An FX graph's arguments: XLA tensors (graph inputs, bound per call) and other values (SymInt
// sizes, flags) the executable was specialized on.
struct ArgLayout {
  size_t nargs = 0;
  std::vector<int> tensor_pos;                    // positions of tensor arguments
  std::vector<std::pair<int, py::object>> other;  // positions and values of the rest
};

graph::TensorPtr XlaOrNull(PyObject* o) {
  if (!THPVariable_Check(o)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!t.defined() || t.device().type() != c10::DeviceType::XLA) return nullptr;  // no exception per CPU input
  try {
    return bridge::XlaFromUser(t);
  } catch (const std::invalid_argument&) {
    return nullptr;
  }
}

// Whether no other functional tensor shares `w`'s storage: the wrapper's reference, and at most
// a Python storage object that only the storage itself keeps alive (made by an
// `untyped_storage()` call, e.g. when Dynamo made a fake tensor of it).
bool SoleWrapper(at::FunctionalTensorWrapper* w) {
  const auto n = w->storage().use_count();
  if (n == 1) return true;
  if (n != 2) return false;
  const c10::impl::PyObjectSlot* slot = w->storage().unsafeGetStorageImpl()->pyobj_slot();
  return slot->load_pyobj() != nullptr && slot->has_unique_reference();
}

// XLA_DYNAMO_DONATE_WEIGHTS=0: weights keep their aliasing and never donate (the behaviour
// before; for A/B measurements).
bool DonateWeights() {
  static const bool on = [] {
    const char* e = std::getenv("XLA_DYNAMO_DONATE_WEIGHTS");
    return !(e && (std::string(e) == "0" || std::string(e) == "false"));
  }();
  return on;
}

// A whole-tensor alias no other tensor shares storage with (an nn.Parameter: it wraps a detach()
// of the tensor it was made from, long gone) becomes a base tensor: nothing can observe the
// aliasing, and later writes then skip functionalization's view replay (two detach_copy per
// parameter and step) and the old base no longer holds the buffer (so a compiled step can
// donate it).
void MaybeMakeBase(const at::Tensor& t) {
  if (!DonateWeights() || !at::functionalization::impl::isFunctionalTensor(t)) return;
  auto* w = static_cast<at::FunctionalTensorWrapper*>(t.unsafeGetTensorImpl());
  if (!w->isBaseTensor() && SoleWrapper(w) && w->is_up_to_date() && !w->is_multi_output_view() &&
      w->storage_offset() == 0 && w->is_contiguous() && w->value().defined() &&
      w->value().sizes().equals(w->sizes())) {
    w->_unsafe_reset_storage();
  }
}

// Gives `arg` (a tensor the graph wrote in place) the value `value`, as an in-place op would:
// through functionalization, so views of it see the write, and with a version bump for autograd.
void WriteBack(const at::Tensor& arg, graph::TensorPtr value) {
  if (at::functionalization::impl::isFunctionalTensor(arg)) {
    // Fast path: a base tensor no other tensor shares storage with (no view can observe the
    // write) and no pending updates: give its inner XLA tensor the new value directly.
    MaybeMakeBase(arg);
    auto* w = static_cast<at::FunctionalTensorWrapper*>(arg.unsafeGetTensorImpl());
    // The inner tensor must also be the storage's base, so a view made later regenerates from
    // the new value.
    if (w->isBaseTensor() && SoleWrapper(w) && w->is_up_to_date() &&
        static_cast<at::functionalization::FunctionalStorageImpl*>(w->storage().unsafeGetStorageImpl())->base().unsafeGetTensorImpl() == w->value().unsafeGetTensorImpl()) {
      if (auto* impl = dynamic_cast<bridge::XLATensorImpl*>(w->value().unsafeGetTensorImpl())) {
        impl->set_tensor(std::move(value));
        if (!arg.is_inference()) arg.unsafeGetTensorImpl()->bump_version();
        return;
      }
    }
    at::Tensor inner(c10::make_intrusive<bridge::XLATensorImpl>(std::move(value)));
    at::functionalization::impl::replace_(arg, inner);
    at::functionalization::impl::commit_update(arg);
    at::functionalization::impl::sync(arg);
  } else if (auto* impl = dynamic_cast<bridge::XLATensorImpl*>(arg.unsafeGetTensorImpl())) {
    impl->set_tensor(std::move(value));
  } else {
    throw std::runtime_error("internal: a compiled graph wrote to a tensor that is not an XLA tensor");
  }
  if (!arg.is_inference()) arg.unsafeGetTensorImpl()->bump_version();
}

struct Trace {
  ArgLayout layout;
  graph::DynamoTraceStart start;
  std::vector<at::Tensor> tensors;  // the example inputs
};

struct Handle {
  ArgLayout layout;
  std::shared_ptr<graph::DynamoGraph> g;
};

ArgLayout LayoutOf(const py::sequence& args, std::vector<graph::TensorPtr>* xs, std::vector<at::Tensor>* ts) {
  ArgLayout l;
  l.nargs = py::len(args);
  for (size_t i = 0; i < l.nargs; ++i) {
    py::object a = args[i];
    if (THPVariable_Check(a.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(a.ptr());
      graph::TensorPtr x = XlaOrNull(a.ptr());
      if (!x) {
        throw py::type_error("compiled graph input " + std::to_string(i) + " is a tensor on " + t.device().str() +
                             ", not on an XLA device");
      }
      l.tensor_pos.push_back(static_cast<int>(i));
      xs->push_back(std::move(x));
      ts->push_back(t);
    } else {
      l.other.emplace_back(static_cast<int>(i), a);
    }
  }
  return l;
}

std::shared_ptr<Trace> Begin(const py::sequence& args) {
  auto tr = std::make_shared<Trace>();
  std::vector<graph::TensorPtr> xs;
  tr->layout = LayoutOf(args, &xs, &tr->tensors);
  // Aliases held alone become bases now, so that the buffers they hold alone are seen so by the
  // donation check (DynamoBeginTrace) and the first write-back already takes the fast path.
  for (const auto& t : tr->tensors) MaybeMakeBase(t);
  int device = xs.empty() ? 0 : xs[0]->device();
  for (const auto& x : xs) {
    if (x->device() != device) {
      throw py::value_error("a compiled graph's inputs are on XLA devices " + std::to_string(device) + " and " +
                            std::to_string(x->device()) + "; one graph runs on one device");
    }
  }
  tr->start = graph::DynamoBeginTrace(xs, device);
  return tr;
}

std::vector<graph::TensorPtr> InputsNow(const Trace& tr) {
  std::vector<graph::TensorPtr> now;
  for (const auto& t : tr.tensors) now.push_back(bridge::XlaFromUser(t));
  return now;
}

// Undo what a failed trace did to the inputs and the RNG seed, and drop its pending checks.
void Restore(const Trace& tr) {
  auto now = InputsNow(tr);
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i] == tr.start.inputs[i] && now[i]->HasPending()) {
      now[i]->SetData(tr.start.input_data[i]);  // written into the same lazy tensor (BatchNorm's statistics)
    } else if (now[i] != tr.start.inputs[i]) {
      WriteBack(tr.tensors[i], tr.start.inputs[i]);
    }
  }
  graph::TensorPtr seed = graph::RngSeedTensor(tr.start.device);
  if (seed == tr.start.seed && seed->HasPending() && tr.start.seed_data) seed->SetData(tr.start.seed_data);
  graph::TakePendingChecks(tr.start.device, tr.start.checks_before);
}

std::shared_ptr<Handle> Compile(const Trace& tr, const std::vector<at::Tensor>& outputs, const std::string& name,
                                const std::vector<int>& may_donate, const std::vector<int>& may_donate_wide) {
  std::vector<graph::TensorPtr> outs;
  for (const auto& o : outputs) outs.push_back(bridge::XlaFromUser(o));
  auto h = std::make_shared<Handle>();
  h->layout = tr.layout;
  // Argument positions -> tensor input indices; 1: may donate, 2: only in the wider executable.
  std::vector<int> donate(tr.layout.tensor_pos.size(), 0);
  for (int tier : {2, 1}) {
    if (tier == 2 && !DonateWeights()) continue;
    for (int pos : tier == 1 ? may_donate : may_donate_wide) {
      for (size_t k = 0; k < tr.layout.tensor_pos.size(); ++k) {
        if (tr.layout.tensor_pos[k] == pos) donate[k] = tier;
      }
    }
  }
  h->g = graph::DynamoCompile(tr.start, InputsNow(tr), outs, name, donate);
  return h;
}

// The hot path: None when the arguments do not fit this executable (other shapes or values).
py::object Run(const Handle& h, const py::sequence& args) {
  const ArgLayout& l = h.layout;
  if (static_cast<size_t>(PySequence_Size(args.ptr())) != l.nargs) return py::none();
  std::vector<graph::TensorPtr> inputs;
  std::vector<PyObject*> objs;
  inputs.reserve(l.tensor_pos.size());
  objs.reserve(l.tensor_pos.size());
  for (size_t k = 0; k < l.tensor_pos.size(); ++k) {
    py::object o = args[l.tensor_pos[k]];
    graph::TensorPtr x = XlaOrNull(o.ptr());
    if (!x && THPVariable_Check(o.ptr())) {
      // A CPU tensor (a 0-dim optimizer step, a value computed on the CPU part of the graph): the
      // executable reads it as an input, uploaded at each call.
      const at::Tensor& t = THPVariable_Unpack(o.ptr());
      if (t.device().is_cpu()) {
        ir::Shape s(bridge::ToDType(t.scalar_type()), std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
        if (s != h.g->input_shapes[k]) return py::none();
        x = bridge::FromCpu(t, h.g->device);
      }
    }
    if (!x || x->shape() != h.g->input_shapes[k]) return py::none();
    inputs.push_back(std::move(x));
    objs.push_back(o.ptr());
  }
  for (const auto& [pos, value] : l.other) {
    py::object o = args[pos];
    if (!o.equal(value)) return py::none();
  }
  std::vector<ir::DeviceDataPtr> results = graph::DynamoRun(*h.g, inputs);
  const graph::DynamoGraph& g = *h.g;
  py::list out(g.num_outputs);
  for (size_t i = 0; i < g.num_outputs; ++i) {
    at::Tensor t = bridge::MakeXla(graph::TensorFromData(results[i]));
    out[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
  }
  for (const auto& [input, root] : g.mutated) {
    WriteBack(THPVariable_Unpack(objs[input]), graph::TensorFromData(results[root]));
  }
  return std::move(out);
}


// A 0-dim CPU tensor (an optimizer's `step` counter) read or written directly; nullptr if `o` is
// anything else (another device, a view with a grad function, requires_grad).
at::TensorImpl* CpuScalar(PyObject* o) {
  if (!THPVariable_Check(o)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(o);
  if (!t.defined() || !t.device().is_cpu() || t.dim() != 0 || t.requires_grad() || t.is_sparse() ||
      t.is_quantized() || t.is_conj() || t.is_neg() || !t.has_storage()) {
    return nullptr;
  }
  return t.unsafeGetTensorImpl();
}

// torch.stack of 0-dim CPU tensors of one dtype, without the dispatcher: one 1-d CPU tensor per
// group of argument positions (the packed upload of a compiled graph's CPU scalars). None when an
// argument is not such a tensor or the dtypes differ (the caller stacks them itself).
py::object PackCpuScalars(const py::sequence& args, const std::vector<std::vector<int>>& groups) {
  if (!PyTuple_Check(args.ptr()) && !PyList_Check(args.ptr())) return py::none();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(args.ptr());
  py::list out(groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    const auto& g = groups[k];
    if (g.empty()) return py::none();
    std::vector<at::TensorImpl*> impls;
    impls.reserve(g.size());
    for (int i : g) {
      if (i < 0 || i >= n) return py::none();
      at::TensorImpl* impl = CpuScalar(PySequence_Fast_GET_ITEM(args.ptr(), i));
      if (!impl || (!impls.empty() && impl->dtype() != impls[0]->dtype())) return py::none();
      impls.push_back(impl);
    }
    at::Tensor packed = at::empty({static_cast<int64_t>(g.size())},
                                  at::TensorOptions().dtype(impls[0]->dtype()).device(at::kCPU));
    const size_t es = impls[0]->dtype().itemsize();
    char* dst = static_cast<char*>(packed.data_ptr());
    for (size_t j = 0; j < impls.size(); ++j) std::memcpy(dst + j * es, impls[j]->data(), es);
    out[k] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(packed)));
  }
  return std::move(out);
}

template <typename T, typename Op>
void AddScalar(at::TensorImpl* impl, Op c) {
  T* p = static_cast<T*>(impl->mutable_data());
  *p = static_cast<T>(*p + c);
}

// `s += c` for every 0-dim CPU tensor at the given positions, as `torch._foreach_add_(ss, c)`
// computes it (the sum in the tensor's dtype; float32 adds in float) with a version bump each.
// False (nothing written) when one is not such a tensor or its dtype is not handled here.
bool AddCpuScalars(const py::sequence& args, const std::vector<std::pair<std::vector<int>, py::object>>& incs) {
  if (!PyTuple_Check(args.ptr()) && !PyList_Check(args.ptr())) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(args.ptr());
  std::vector<std::pair<at::TensorImpl*, py::handle>> todo;
  for (const auto& [positions, c] : incs) {
    const bool is_int = PyLong_Check(c.ptr()) && !PyBool_Check(c.ptr());
    if (!is_int && !PyFloat_Check(c.ptr())) return false;
    for (int i : positions) {
      if (i < 0 || i >= n) return false;
      at::TensorImpl* impl = CpuScalar(PySequence_Fast_GET_ITEM(args.ptr(), i));
      if (!impl || impl->is_inference()) return false;
      const auto st = impl->dtype().toScalarType();
      const bool ok = st == at::kFloat || st == at::kDouble || (is_int && (st == at::kLong || st == at::kInt));
      if (!ok) return false;
      todo.emplace_back(impl, c);
    }
  }
  for (auto& [impl, c] : todo) {
    switch (impl->dtype().toScalarType()) {
      case at::kFloat:
        AddScalar<float>(impl, PyLong_Check(c.ptr()) ? static_cast<float>(PyLong_AsLongLong(c.ptr()))
                                                     : static_cast<float>(PyFloat_AsDouble(c.ptr())));
        break;
      case at::kDouble:
        AddScalar<double>(impl, PyLong_Check(c.ptr()) ? static_cast<double>(PyLong_AsLongLong(c.ptr()))
                                                      : PyFloat_AsDouble(c.ptr()));
        break;
      case at::kLong:
        AddScalar<int64_t>(impl, static_cast<int64_t>(PyLong_AsLongLong(c.ptr())));
        break;
      case at::kInt:
        AddScalar<int32_t>(impl, static_cast<int32_t>(PyLong_AsLongLong(c.ptr())));
        break;
      default:
        break;
    }
    impl->bump_version();
  }
  return true;
}

// Debugging/tests: how a functional XLA tensor's value is held (see WriteBack and DynamoRun's
// donation check).
py::dict WriteInfo(const at::Tensor& t) {
  py::dict d;
  if (at::functionalization::impl::isFunctionalTensor(t)) {
    auto* w = static_cast<at::FunctionalTensorWrapper*>(t.unsafeGetTensorImpl());
    d["is_base"] = w->isBaseTensor();
    d["storage_use_count"] = w->storage().use_count();
    d["view_metas"] = w->view_metas().size();
    d["sole_wrapper"] = SoleWrapper(w);
  }
  graph::TensorPtr x = bridge::XlaFromUser(t);
  d["tensor_use_count"] = x.use_count() - 1;  // less this function's reference
  d["data_use_count"] = x->data() ? x->data().use_count() : 0;
  d["held_alone"] = graph::DynamoHeldAlone(x, 2);  // x here + the tensor's own reference
  return d;
}

}  // namespace

namespace txla::bridge {

void RegisterDynamoBindings(py::module& m) {
  py::class_<Trace, std::shared_ptr<Trace>>(m, "_DynamoTrace");
  py::class_<Handle, std::shared_ptr<Handle>>(m, "_DynamoGraph")
      .def_property_readonly("name", [](const Handle& h) { return h.g->name; })
      .def_property_readonly("num_params", [](const Handle& h) { return h.g->params.size(); })
      .def_property_readonly("num_outputs", [](const Handle& h) { return h.g->num_outputs; })
      .def_property_readonly("num_constants", [](const Handle& h) {
        size_t n = 0;
        for (const auto& p : h.g->params) n += p.kind == graph::DynamoParam::kConstant;
        return n;
      })
      .def_property_readonly("mutated_inputs", [](const Handle& h) {
        std::vector<int> v;
        for (const auto& [input, root] : h.g->mutated) v.push_back(h.layout.tensor_pos[input]);
        return v;
      })
      .def_property_readonly("donated_inputs", [](const Handle& h) {
        // The widest donating executable's donated inputs (argument positions).
        std::vector<int> v;
        if (!h.g->donations.empty()) {
          for (const auto& [param, input] : h.g->donations[0].donate) v.push_back(h.layout.tensor_pos[input]);
        }
        return v;
      })
      .def_property_readonly("donation_variants", [](const Handle& h) {
        // Per donating executable, in the order a call tries them: the inputs it donates.
        std::vector<std::vector<int>> out;
        for (const auto& d : h.g->donations) {
          std::vector<int> v;
          for (const auto& [param, input] : d.donate) v.push_back(h.layout.tensor_pos[input]);
          out.push_back(std::move(v));
        }
        return out;
      })
      .def_property_readonly("uses_rng", [](const Handle& h) { return h.g->seed_root >= 0; })
      .def_property_readonly("input_shapes", [](const Handle& h) {
        std::vector<std::string> v;
        for (const auto& s : h.g->input_shapes) v.push_back(s.ToString());
        return v;
      });
  m.def("_dynamo_begin", &Begin, py::arg("args"));
  m.def("_dynamo_restore", &Restore, py::arg("trace"));
  m.def("_dynamo_compile", &Compile, py::arg("trace"), py::arg("outputs"), py::arg("name"),
        py::arg("may_donate") = std::vector<int>{}, py::arg("may_donate_wide") = std::vector<int>{});
  m.def("_dynamo_run", &Run, py::arg("graph"), py::arg("args"));
  m.def("_dynamo_write_info", &WriteInfo, py::arg("tensor"));
  m.def("_dynamo_pack_cpu_scalars", &PackCpuScalars, py::arg("args"), py::arg("groups"));
  m.def("_dynamo_add_cpu_scalars", &AddCpuScalars, py::arg("args"), py::arg("increments"));
  m.def("_dynamo_debug_enabled", []() {
    graph::RefreshDebugLevel();
    return graph::DebugLevel() > 0;
  });
  m.def("_dynamo_debug", [](const std::string& msg) {
    std::fprintf(metrics::DebugStream(), "[PT_XLA_DEBUG] %s\n", msg.c_str());
  });
  m.def("_add_time_sample", [](const std::string& name, double ns) {
    metrics::AddSample(name, ns, metrics::Unit::kTime);
  });
}

}  // namespace txla::bridge
