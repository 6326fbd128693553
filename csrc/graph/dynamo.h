// Compiled callables for torch.compile's openxla backends: an FX graph traced once through the
// lazy core becomes an executable plus a recipe binding each call's inputs to its parameters.
// A call binds buffers and runs: no tracing, no graph hashing. Torch-free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace txla::graph {

// What one executable parameter reads at each call.
struct DynamoParam {
  enum Kind { kInput, kConstant, kSeed } kind = kConstant;
  int input = -1;            // kInput: index into the call's tensor inputs
  ir::DeviceDataPtr data;    // kConstant: bound once (cached scalars, constants made by the graph)
};

struct DynamoCheck {
  int root = -1;
  std::string message;
  bool runtime_error = false;
};

class DynamoGraph {
 public:
  std::string name;
  int device = 0;
  std::shared_ptr<const runtime::Executable> exe;
  std::vector<DynamoParam> params;
  std::vector<ir::Shape> input_shapes;       // every tensor input (checked at each call)
  std::vector<ir::Shape> root_shapes;        // every executable result
  size_t num_outputs = 0;                    // results [0, num_outputs) are the graph's outputs
  std::vector<std::pair<int, int>> mutated;  // (input, result): inputs the graph writes in place
  int seed_root = -1;                        // result holding the advanced RNG seed, or -1
  std::vector<DynamoCheck> checks;           // in-graph index checks
  // Buffer donation (XLA_ENABLE_PARAM_ALIASING, default on): executables whose parameters of
  // written inputs are aliased to their new values, so XLA writes the new values in place (no
  // result buffer allocated, no old one freed). Tried in order (the widest first: parameters and
  // state of an optimizer step, then the state alone); a call uses the first whose donated
  // inputs' buffers are each held by that input alone, otherwise the plain executable.
  struct Donation {
    std::shared_ptr<const runtime::Executable> exe;
    std::vector<std::pair<int, int>> donate;  // (parameter, input) pairs it donates
  };
  std::vector<Donation> donations;
};

// State recorded before tracing the graph with the example inputs (inputs must be materialized).
struct DynamoTraceStart {
  int device = 0;
  std::vector<TensorPtr> inputs;
  std::vector<ir::DeviceDataPtr> input_data;  // their data when the trace began
  TensorPtr seed;
  ir::DeviceDataPtr seed_data;
  std::vector<bool> held_alone;  // per input: its buffer had no other holder once pending inputs ran
  size_t checks_before = 0;
  uint64_t executions_before = 0;
};
DynamoTraceStart DynamoBeginTrace(const std::vector<TensorPtr>& inputs, int device);

// After tracing: `inputs_after` are the inputs' lazy tensors now (a different tensor or a pending
// value: written in place), `outputs` the traced outputs. Compiles (through the graph cache) and
// returns the callable. Throws if the trace ran a graph (the FX graph read a value on the host).
// `may_donate[i]`: whether input i may give its buffer to its new value when the graph writes it
// (see DynamoGraph::donations): 0 never, 1 yes, 2 yes but only in a wider executable tried first
// (weights that require grad), compiled only if such an input held its buffer alone when the
// trace began (otherwise it would never be used: an nn.Parameter's buffer is also held by
// functionalization's base of the tensor it was made from).
std::shared_ptr<DynamoGraph> DynamoCompile(const DynamoTraceStart& start, const std::vector<TensorPtr>& inputs_after,
                                           const std::vector<TensorPtr>& outputs, const std::string& name,
                                           const std::vector<int>& may_donate = {});

// Whether `t`'s device buffer is held by `t` alone (its data, and the data leaf it caches for
// lazy use when no pending graph reads that leaf), and `t` by at most `tensor_refs` holders: a
// compiled call may then donate the buffer.
bool DynamoHeldAlone(const TensorPtr& t, long tensor_refs);

// One call: the inputs' current data (pending inputs are synced first) bound to the parameters.
// Returns every result (outputs, then written inputs' new values, seed, checks); updates the
// seed and registers the checks itself.
std::vector<ir::DeviceDataPtr> DynamoRun(const DynamoGraph& g, const std::vector<TensorPtr>& inputs);

}  // namespace txla::graph
