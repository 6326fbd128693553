// Python entry points of structured control flow (ir/control_flow.h): region parameters as XLA
// tensors, and stablehlo.while over traced cond/body graphs. Used by torch_xla.experimental's
// fori_loop / while_loop / scan.
#include <torch/csrc/utils/pybind.h>

#include <limits>

#include "bridge/bridge.h"
#include "ir/control_flow.h"

namespace py = pybind11;

namespace txla::bridge {

namespace {

std::vector<ir::Value> ValuesOf(const std::vector<at::Tensor>& ts, int device, const char* what) {
  std::vector<ir::Value> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto x = XlaFromUser(ts[i]);
    if (!x->error().empty()) throw std::runtime_error(x->error());
    if (x->device() != device) {
      throw py::value_error(std::string("while_loop: ") + what + " " + std::to_string(i) +
                            " is on a different XLA device than the carried inputs");
    }
    out.push_back(x->GetValue());
  }
  return out;
}

}  // namespace

void RegisterControlFlowBindings(py::module& m) {
  // A region parameter shaped like `like` (an XLA tensor), on its device: the placeholder of a
  // carried value while a loop body is traced.
  m.def("_cf_parameter", [](int64_t index, const at::Tensor& like) {
    auto x = XlaFromUser(like);
    return MakeXla(graph::TensorFromValue(ir::Parameter(index, x->shape()), x->device()));
  });
  // stablehlo.while: the final carried values.
  m.def("_cf_while", [](const std::vector<at::Tensor>& init, const std::vector<at::Tensor>& cond_params,
                        const at::Tensor& cond_result, const std::vector<at::Tensor>& body_params,
                        const std::vector<at::Tensor>& body_results, int64_t check_mark) {
    if (init.empty()) throw py::value_error("while_loop: there must be at least one carried value");
    int device = XlaFromUser(init[0])->device();
    auto iv = ValuesOf(init, device, "carried input");
    auto cp = ValuesOf(cond_params, device, "cond parameter");
    auto cr = ValuesOf({cond_result}, device, "cond_fn result");
    auto bp = ValuesOf(body_params, device, "body parameter");
    auto br = ValuesOf(body_results, device, "body_fn result");
    size_t n = iv.size();
    // In-graph checks the traced ops added (index bounds...): each becomes a carried value, checked
    // on the loop's result. A boolean check is and-ed every iteration. An index check (an s64 scalar:
    // the first bad index, INT64_MIN when all hold) carries the first failing iteration's bad index
    // (the one eager raises at): kept once set, so the message names it as at the top level.
    std::vector<graph::LoopCheck> checks;
    if (check_mark >= 0) checks = graph::TakeLoopChecks(device, static_cast<size_t>(check_mark));
    const int64_t kNone = std::numeric_limits<int64_t>::min();
    for (size_t k = 0; k < checks.size(); ++k) {
      const bool index = checks[k].pred.dtype() == ir::DType::kS64 && checks[k].pred.rank() == 0;
      ir::Value p = ir::Parameter(static_cast<int64_t>(n + k), ir::Shape(index ? ir::DType::kS64 : ir::DType::kPred, {}));
      cp.push_back(p);
      bp.push_back(p);
      if (index) {
        iv.push_back(ir::ConstantInt(kNone, ir::DType::kS64));
        ir::Value unset = ir::Compare(ir::CompareDir::kEQ, p, ir::ConstantInt(kNone, ir::DType::kS64));
        br.push_back(ir::Select(unset, checks[k].pred, p));
      } else {
        iv.push_back(ir::Constant(1, ir::DType::kPred));
        br.push_back(ir::Binary(ir::Op::kAnd, p, graph::CheckPred(checks[k].pred)));
        checks[k].message = graph::CheckMessage(checks[k].message, std::nullopt);  // a pred: no index
      }
    }
    std::vector<ir::Value> out;
    try {
      out = ir::While(iv, cp, cr[0], bp, br);
    } catch (const ir::ShapeError& e) {
      throw py::value_error(e.what());
    }
    for (size_t k = 0; k < checks.size(); ++k) {
      graph::LoopCheck c = checks[k];
      c.pred = out[n + k];
      graph::RestoreCheck(device, c);
    }
    std::vector<at::Tensor> res;
    for (size_t i = 0; i < n; ++i) res.push_back(MakeXla(graph::TensorFromValue(out[i], device)));
    return res;
  }, py::arg("init"), py::arg("cond_params"), py::arg("cond_result"), py::arg("body_params"),
     py::arg("body_results"), py::arg("check_mark") = -1);
  // The device's pending check count (the mark passed to _cf_while).
  m.def("_cf_check_mark", [](const at::Tensor& like) {
    return static_cast<int64_t>(graph::PendingCheckCount(XlaFromUser(like)->device()));
  });
  // Whether the tensor's value is one of a loop body being traced (it depends on a region parameter).
  m.def("_cf_in_region", [](const at::Tensor& t) {
    auto x = XlaFromUser(t);
    return x->HasPending() && x->pending().node->in_region;
  });
}

}  // namespace txla::bridge
