// Structured control flow in the IR: regions (small closed IR graphs over their own parameters)
// and stablehlo.while built from them. Torch-free.
//
// A loop body is traced as ordinary IR over Parameter() values; While() then closes the cond and
// body graphs: every value they read that does not depend on their parameters (a captured tensor,
// an outer loop's value) becomes an extra carried value passed through the loop unchanged, so each
// region reads only its own parameters and constants. The regions' structure is hashed into the
// While node (and so into the graph cache key) like any other attribute.
#pragma once

#include <functional>
#include <vector>

#include "ir/ir.h"

namespace txla::ir {

struct Region {
  std::vector<NodePtr> params;  // kParameter nodes, one per block argument, in order
  std::vector<Value> results;   // what the region returns
  Hash128 hash;                 // structure (ops, attributes, shapes, wiring); never values
  std::vector<Shape> ParamShapes() const;
};

// A fresh region parameter (a placeholder for a carried value while a body is traced). `index` is
// informational; While() identifies parameters by the values it is given.
Value Parameter(int64_t index, const Shape& shape);

// stablehlo.while over `init` (the carried values). cond: its parameters (one per carried value,
// in order) and a pred[] result; body: its parameters and one result per carried value with the
// carried value's exact shape and dtype (else ShapeError naming the mismatch). Returns the final
// carried values.
std::vector<Value> While(const std::vector<Value>& init, const std::vector<Value>& cond_params,
                         const Value& cond_result, const std::vector<Value>& body_params,
                         const std::vector<Value>& body_results);

// Convenience for ops code: for (i = 0; i < trip_count; ++i) carried = body(i, carried), with i an
// s64 scalar; `body` builds IR over its arguments (the carried parameters and i).
std::vector<Value> ForLoop(int64_t trip_count, const std::vector<Value>& init,
                           const std::function<std::vector<Value>(const Value& i, const std::vector<Value>&)>& body);

// Every node a region's results need, operands before users (its parameters included).
std::vector<const Node*> RegionPostOrder(const Region& r);

}  // namespace txla::ir
