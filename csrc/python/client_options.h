// Python values -> PJRT client create options (runtime::ClientOptions::Option). Header-only, shared
// by the runtime module (_core) and the aten bridge (_C); needs pybind11, not torch.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace txla::python {

// {name: value} with value a str, bool, int, float or a list/tuple of ints.
inline std::vector<runtime::ClientOptions::Option> ClientOptionsFromDict(const pybind11::dict& d) {
  namespace py = pybind11;
  using Option = runtime::ClientOptions::Option;
  std::vector<Option> out;
  for (const auto& item : d) {
    Option o;
    o.name = py::cast<std::string>(item.first);
    py::handle v = item.second;
    if (py::isinstance<py::str>(v)) {
      o.kind = Option::Kind::kString;
      o.string_value = py::cast<std::string>(v);
    } else if (py::isinstance<py::bool_>(v)) {
      o.kind = Option::Kind::kBool;
      o.bool_value = py::cast<bool>(v);
    } else if (py::isinstance<py::int_>(v)) {
      o.kind = Option::Kind::kInt64;
      o.ints = {py::cast<int64_t>(v)};
    } else if (py::isinstance<py::float_>(v)) {
      o.kind = Option::Kind::kFloat;
      o.float_value = py::cast<float>(v);
    } else if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
      o.kind = Option::Kind::kInt64List;
      for (auto e : v) {
        if (!py::isinstance<py::int_>(e) || py::isinstance<py::bool_>(e)) {
          throw py::type_error("client option '" + o.name + "': a list value must hold ints");
        }
        o.ints.push_back(py::cast<int64_t>(e));
      }
    } else {
      throw py::type_error("client option '" + o.name + "': expected str, bool, int, float or a list of ints, got " +
                           std::string(py::str(v.get_type().attr("__name__"))));
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace txla::python
