// The torch-free Python module: runtime (PJRT) bindings for tests, metrics, StableHLO emission.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "util/metrics.h"

namespace py = pybind11;

namespace txla::python {
void BindRuntime(py::module_& m);

void BindMetrics(py::module_& m) {
  m.def("counter_names", &metrics::CounterNames);
  m.def("counter_value", [](const std::string& name) -> py::object {
    int64_t v;
    if (!metrics::CounterValue(name, &v)) return py::none();
    return py::int_(v);
  });
  m.def("metric_names", &metrics::MetricNames);
  m.def("metric_data", [](const std::string& name) -> py::object {
    int64_t total;
    double acc;
    std::vector<std::pair<double, double>> samples;
    if (!metrics::MetricData(name, &total, &acc, &samples)) return py::none();
    return py::make_tuple(total, acc, samples);
  });
  m.def("metrics_report", [](std::optional<std::vector<std::string>> counters,
                             std::optional<std::vector<std::string>> metric_names) {
    return metrics::MetricsReport(counters.value_or(std::vector<std::string>{}), !counters.has_value(),
                                  metric_names.value_or(std::vector<std::string>{}), !metric_names.has_value());
  }, py::arg("counter_names") = py::none(), py::arg("metric_names") = py::none());
  m.def("clear_counters", &metrics::ClearCounters);
  m.def("clear_metrics", &metrics::ClearMetrics);
  m.def("increment_counter", [](const std::string& n, int64_t d) { metrics::IncrementCounter(n, d); },
        py::arg("name"), py::arg("delta") = 1);
}
}  // namespace txla::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "torch_xla's torch-free core: PJRT runtime and metrics";
  auto rt = m.def_submodule("runtime", "PJRT runtime");
  txla::python::BindRuntime(rt);
  auto met = m.def_submodule("metrics", "counters and metrics");
  txla::python::BindMetrics(met);
}
