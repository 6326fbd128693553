// SPMD: one program over every device of the process, partitioned by XLA (never by us).
//
// After Enable() (torch_xla.runtime.use_spmd()), xla:0 is a virtual device standing for all N
// runtime devices: every tensor's data is N buffers, one per device, each holding that device's
// shard of the tensor's sharding (replicated: the whole array on each). Graphs are compiled once
// for all devices (num_partitions = N, use_spmd_partitioning, device assignment 0..N-1), with
// mhlo.sharding on the arguments and the annotated values, and run with one argument list per
// device; results keep the shardings XLA chose (read back from the compiled program), so a next
// step needs no resharding. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "ir/ir.h"
#include "lowering/stablehlo.h"
#include "runtime/runtime.h"

namespace txla::graph::spmd {

bool Enabled();
// Turns SPMD mode on for the process (idempotent). Pending work is run first; the data of every
// live tensor (all on xla:0) is replicated on every device. Throws std::runtime_error when live
// tensors sit on other devices (xla:1...), which SPMD mode has no name for.
void Enable();
int NumDevices();  // devices the virtual device spans (runtime devices)

// Host bytes (physical type, dense row-major, the whole array) -> one buffer per device.
std::vector<runtime::Buffer> UploadShards(const void* data, runtime::ElementType phys,
                                          const std::vector<int64_t>& dims, const ir::Sharding* sharding);
// The whole array (physical type) from the shards, nbytes = numel * physical element size.
void AssembleToHost(const ir::DeviceData& d, void* dst, size_t nbytes);
// One device's shard (physical type): its dims and its offset in the whole array.
std::vector<int64_t> ShardDims(const ir::DeviceData& d);
std::vector<int64_t> ShardOffsets(const ir::DeviceData& d, int device);
void ShardToHost(const ir::DeviceData& d, int device, void* dst, size_t nbytes);
size_t ShardDeviceBytes(const ir::DeviceData& d, int device);  // PJRT's on-device size

// ---- Graphs.
// Adds the shardings of the parameters (their data) and the results (annotations, donated
// parameters) to the module and returns the compile options.
runtime::CompileOptions PrepareModule(lowering::ModuleSpec* spec);
// The parameters' shardings are part of the graph's cache key.
Hash128 HashParamShardings(Hash128 key, const std::vector<const ir::Node*>& params);
// The shardings XLA gave the results (from the optimized HLO's spmd_output_sharding).
std::vector<ir::ShardingPtr> OutputShardings(const runtime::Executable& exe, const std::vector<ir::Value>& roots);
// Runs on every device; results are sharded device data.
std::vector<ir::DeviceDataPtr> Execute(const runtime::Executable& exe, const std::vector<const ir::Node*>& params,
                                       const std::vector<ir::Value>& roots,
                                       const std::vector<ir::ShardingPtr>& output_shardings, int device,
                                       const char* time_metric);

// ---- Tensors.
// Annotates t: a pending value gets a sharding node (re-annotation replaces it), device data is
// re-laid out across the devices. Throws std::invalid_argument for a sharding that does not fit.
void MarkSharding(const TensorPtr& t, const ir::Sharding& sharding);
// Back to replicated, unannotated.
void ClearSharding(const TensorPtr& t);
// XLA's sharding text of t's annotation or data ("" when it has none).
std::string ShardingSpec(const TensorPtr& t);
ir::ShardingPtr ShardingOf(const TensorPtr& t);  // null when none

}  // namespace txla::graph::spmd
