// Python entry points of SPMD (torch_xla.runtime.use_spmd, torch_xla.distributed.spmd, and the
// upstream _XLAC sharding hooks). The work is in graph/spmd.cc; this file converts tensors.
#include <torch/csrc/utils/pybind.h>

#include "bridge/bridge.h"
#include "graph/spmd.h"

namespace py = pybind11;
using namespace txla;

namespace txla::bridge {
namespace {

// Materializes t (runs its pending graph) and returns its device data.
ir::DeviceDataPtr Materialized(const graph::TensorPtr& t) {
  if (!t->error().empty()) throw std::runtime_error("this XLA tensor has no value: " + t->error());
  if (t->HasPending()) {
    std::vector<graph::TensorPtr> one{t};
    graph::SyncOptions o;
    o.wait = true;
    py::gil_scoped_release nogil;
    graph::SyncTensors(&one, o);
  }
  return t->data();
}

int ShardingType(const ir::ShardingPtr& s) {  // upstream's ShardingType numbering
  if (!s) return -1;
  switch (s->kind) {
    case ir::Sharding::Kind::kReplicated: return 0;
    case ir::Sharding::Kind::kMaximal: return 1;
    case ir::Sharding::Kind::kTiled: return s->replicate_last ? 5 : 3;
  }
  return 6;
}

}  // namespace

void RegisterSpmdBindings(py::module& m) {
  m.def("_use_spmd", [] {
    py::gil_scoped_release nogil;
    graph::spmd::Enable();
  });
  m.def("_is_spmd", &graph::spmd::Enabled);
  m.def("_runtime_device_count", &graph::RuntimeDeviceCount);
  m.def("_xla_mark_sharding", [](const at::Tensor& t, std::vector<int64_t> tile_dims, std::vector<int64_t> devices,
                                 bool replicate_last) {
    graph::spmd::MarkSharding(XlaFromUser(t), ir::Sharding::Tiled(std::move(tile_dims), std::move(devices), replicate_last));
  });
  m.def("_xla_mark_sharding_text", [](const at::Tensor& t, const std::string& text) {
    graph::spmd::MarkSharding(XlaFromUser(t), *ir::ParseShardingText(text));
  });
  // A CPU tensor uploaded straight into its shards (SPMD input pipelines): no replicated copy first.
  m.def("_xla_tensor_from_cpu_sharded", [](const at::Tensor& cpu_in, std::vector<int64_t> tile_dims,
                                           std::vector<int64_t> devices, bool replicate_last) {
    if (!graph::spmd::Enabled()) throw std::runtime_error("sharded upload needs SPMD mode: call use_spmd() first");
    TORCH_CHECK(cpu_in.device().is_cpu(), "_xla_tensor_from_cpu_sharded expects a CPU tensor");
    at::Tensor cpu = cpu_in.contiguous();
    ir::Shape shape(ToDType(cpu.scalar_type()), std::vector<int64_t>(cpu.sizes().begin(), cpu.sizes().end()));
    auto s = std::make_shared<ir::Sharding>(ir::Sharding::Tiled(std::move(tile_dims), std::move(devices), replicate_last));
    s->ShardDims(shape.dims);  // std::invalid_argument (ValueError) when it does not divide
    return MakeXla(graph::TensorFromHost(cpu.data_ptr(), shape, 0, s));
  });
  m.def("_xla_clear_sharding", [](const at::Tensor& t) { graph::spmd::ClearSharding(XlaFromUser(t)); });
  m.def("_get_xla_sharding_spec", [](const at::Tensor& t) { return graph::spmd::ShardingSpec(XlaFromUser(t)); });
  m.def("_get_xla_sharding_type", [](const at::Tensor& t) -> py::object {
    int k = ShardingType(graph::spmd::ShardingOf(XlaFromUser(t)));
    return k < 0 ? py::object(py::none()) : py::object(py::int_(k));
  });
  // [(cpu shard, offsets, device)] for every device, in device order.
  m.def("_get_local_shards", [](const at::Tensor& t) {
    auto x = XlaFromUser(t);
    ir::DeviceDataPtr d = Materialized(x);
    py::list out;
    if (!d->IsSpmd()) throw std::runtime_error("_get_local_shards: the tensor is not SPMD data (call use_spmd() first)");
    std::vector<int64_t> dims = graph::spmd::ShardDims(*d);
    for (int dev = 0; dev < static_cast<int>(d->shards.size()); ++dev) {
      ir::DType phys = graph::PhysicalDType(d->shape.dtype);
      at::Tensor cpu = at::empty(c10::IntArrayRef(dims.data(), dims.size()),
                                 at::TensorOptions().dtype(ToScalarType(phys)).device(at::kCPU));
      if (cpu.numel() > 0) graph::spmd::ShardToHost(*d, dev, cpu.data_ptr(), cpu.nbytes());
      if (phys != d->shape.dtype) cpu = cpu.to(ToScalarType(d->shape.dtype));
      out.append(py::make_tuple(cpu, graph::spmd::ShardOffsets(*d, dev), dev));
    }
    return out;
  });
  // Bytes each device holds for the tensor (PJRT's on-device sizes), in device order.
  m.def("_spmd_device_bytes", [](const at::Tensor& t) {
    ir::DeviceDataPtr d = Materialized(XlaFromUser(t));
    std::vector<int64_t> out;
    if (!d->IsSpmd()) {
      out.push_back(static_cast<int64_t>(d->buffer.OnDeviceSizeBytes()));
      return out;
    }
    for (int dev = 0; dev < static_cast<int>(d->shards.size()); ++dev) {
      out.push_back(static_cast<int64_t>(graph::spmd::ShardDeviceBytes(*d, dev)));
    }
    return out;
  });
}

}  // namespace txla::bridge
