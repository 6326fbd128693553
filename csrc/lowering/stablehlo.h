// Lowers a post-ordered IR graph to a StableHLO module in MLIR's generic op form. Torch-free.
#pragma once
#include <string>
#include <vector>

#include "ir/ir.h"

namespace txla::lowering {

struct ModuleSpec {
  std::string name = "SyncTensorsGraph";
  std::vector<const ir::Node*> post_order;  // every node, operands before users
  std::vector<const ir::Node*> params;      // kDeviceData nodes, in argument order
  std::vector<ir::Value> roots;             // results, in order
  int num_replicas = 1;
  int num_partitions = 1;
  bool locations = false;  // emit loc("file":line:0) from node scopes
  // (parameter index, result index): the parameter's buffer is donated to that result
  // (tf.aliasing_output; XLA aliases them and PJRT donates the input buffer at execution).
  std::vector<std::pair<int, int>> aliases;
  // SPMD: mhlo.sharding of each parameter / result (XLA's text; "" = none, XLA chooses). Empty
  // vectors: no sharding attributes at all.
  std::vector<std::string> param_shardings;
  std::vector<std::string> result_shardings;
  // XLA_USE_BF16 / XLA_USE_F16: f32 and f64 values are emitted as this type (kF32 = no downcast).
  ir::DType float_type = ir::DType::kF32;
  // XLA:CPU keeps denormals (runtime/fp_env.h): the module starts with the `txla_fp_env` custom
  // call, and every argument passes through an optimization barrier with its token.
  bool keep_denormals = false;
};

std::string EmitStableHlo(const ModuleSpec& spec);

// Text of a scalar constant of type t as an MLIR dense literal (hex for floats: exact, inf/nan-safe).
// Inside EmitStableHlo, t is first mapped to the module's physical type (ModuleSpec::float_type).
std::string ScalarLiteral(double f, int64_t n, ir::DType t);

}  // namespace txla::lowering
