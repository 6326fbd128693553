#include "graph/spmd.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

#include "util/metrics.h"

namespace txla::graph::spmd {

using ir::DType;
using ir::Sharding;

namespace {
std::atomic<bool> g_enabled{false};
std::mutex g_enable_mu;

size_t PhysElementSize(DType logical) { return runtime::ElementSize(PhysicalDType(logical)); }

// Copies the block [offsets, offsets + block) between a whole row-major array of `dims` and a dense
// block buffer: to_block = true reads the array into the block, false writes the block into it.
void CopyBlock(char* array, const std::vector<int64_t>& dims, char* block, const std::vector<int64_t>& block_dims,
               const std::vector<int64_t>& offsets, size_t elem, bool to_block) {
  int rank = static_cast<int>(dims.size());
  if (rank == 0) {
    if (to_block) std::memcpy(block, array, elem); else std::memcpy(array, block, elem);
    return;
  }
  // Strides (elements) of the array; the innermost dimension is copied as one run.
  std::vector<int64_t> stride(rank, 1);
  for (int i = rank - 2; i >= 0; --i) stride[i] = stride[i + 1] * dims[i + 1];
  int64_t rows = 1;
  for (int i = 0; i + 1 < rank; ++i) rows *= block_dims[i];
  size_t run = static_cast<size_t>(block_dims[rank - 1]) * elem;
  std::vector<int64_t> idx(rank, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = offsets[rank - 1];
    for (int i = 0; i + 1 < rank; ++i) off += (offsets[i] + idx[i]) * stride[i];
    char* a = array + off * elem;
    char* b = block + r * run;
    if (to_block) std::memcpy(b, a, run); else std::memcpy(a, b, run);
    for (int i = rank - 2; i >= 0; --i) {  // next row of the block
      if (++idx[i] < block_dims[i]) break;
      idx[i] = 0;
    }
  }
}

int64_t Numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

void CheckCovers(const Sharding& s, int n) {
  if (s.kind != Sharding::Kind::kTiled) return;
  if (static_cast<int>(s.devices.size()) != n) {
    throw std::invalid_argument("the sharding " + s.ToString() + " places " + std::to_string(s.devices.size()) +
                                " devices but SPMD runs on all " + std::to_string(n) + " devices of the process");
  }
  for (int64_t d : s.devices) {
    if (d < 0 || d >= n) {
      throw std::invalid_argument("device " + std::to_string(d) + " is outside this process (devices 0.." +
                                  std::to_string(n - 1) + ")");
    }
  }
}
}  // namespace

bool Enabled() { return g_enabled.load(std::memory_order_relaxed); }

int NumDevices() { return GetClient().NumDevices(); }

std::vector<runtime::Buffer> UploadShards(const void* data, runtime::ElementType phys, const std::vector<int64_t>& dims,
                                          const ir::Sharding* sharding) {
  auto& client = GetClient();
  int n = client.NumDevices();
  std::vector<runtime::Buffer> out;
  out.reserve(n);
  if (sharding == nullptr || sharding->kind != Sharding::Kind::kTiled) {
    for (int d = 0; d < n; ++d) out.push_back(client.ToDevice(data, phys, dims, d));
    return out;
  }
  CheckCovers(*sharding, n);
  std::vector<int64_t> shard = sharding->ShardDims(dims);
  size_t elem = runtime::ElementSize(phys);
  std::vector<char> block(static_cast<size_t>(Numel(shard)) * elem);
  for (int d = 0; d < n; ++d) {
    CopyBlock(const_cast<char*>(static_cast<const char*>(data)), dims, block.data(), shard,
              sharding->ShardOffsets(d, dims), elem, /*to_block=*/true);
    out.push_back(client.ToDevice(block.data(), phys, shard, d));
  }
  return out;
}

std::vector<int64_t> ShardDims(const ir::DeviceData& d) {
  return d.sharding ? d.sharding->ShardDims(d.shape.dims) : std::vector<int64_t>(d.shape.dims);
}

std::vector<int64_t> ShardOffsets(const ir::DeviceData& d, int device) {
  return d.sharding ? d.sharding->ShardOffsets(device, d.shape.dims) : std::vector<int64_t>(d.shape.dims.size(), 0);
}

void ShardToHost(const ir::DeviceData& d, int device, void* dst, size_t nbytes) {
  if (!d.IsSpmd()) throw std::runtime_error("internal: not SPMD data");
  if (device < 0 || device >= static_cast<int>(d.shards.size())) throw std::out_of_range("no shard on that device");
  d.shards[device].ToHost(dst, nbytes);
}

size_t ShardDeviceBytes(const ir::DeviceData& d, int device) {
  if (!d.IsSpmd()) return d.buffer.OnDeviceSizeBytes();
  return d.shards.at(device).OnDeviceSizeBytes();
}

void AssembleToHost(const ir::DeviceData& d, void* dst, size_t nbytes) {
  if (!d.IsSpmd()) throw std::runtime_error("internal: not SPMD data");
  const Sharding* s = d.sharding.get();
  if (s == nullptr || s->kind == Sharding::Kind::kReplicated) {
    d.shards[0].ToHost(dst, nbytes);
    return;
  }
  if (s->kind == Sharding::Kind::kMaximal) {
    d.shards.at(s->devices.at(0)).ToHost(dst, nbytes);
    return;
  }
  std::vector<int64_t> shard = s->ShardDims(d.shape.dims);
  size_t elem = nbytes / std::max<int64_t>(1, d.shape.numel());
  std::vector<char> block(static_cast<size_t>(Numel(shard)) * elem);
  for (int dev = 0; dev < static_cast<int>(d.shards.size()); ++dev) {
    if (!s->IsFirstReplica(dev)) continue;
    d.shards[dev].ToHost(block.data(), block.size());
    CopyBlock(static_cast<char*>(dst), d.shape.dims, block.data(), shard, s->ShardOffsets(dev, d.shape.dims), elem,
              /*to_block=*/false);
  }
}

// ------------------------------------------------------------------ enabling
void Enable() {
  std::lock_guard<std::mutex> g(g_enable_mu);
  if (Enabled()) return;
  for (auto& t : LiveTensors()) {
    if (t->device() != 0) {
      throw std::runtime_error(
          "use_spmd(): a tensor lives on xla:" + std::to_string(t->device()) +
          "; SPMD mode has one virtual device (xla:0) standing for all devices. Move such tensors to the CPU or "
          "xla:0 (or drop them) before calling use_spmd()");
    }
  }
  SyncOptions o;
  o.wait = true;
  SyncTensors(nullptr, o);
  // Replicate the data of every live tensor on every device, in place (aliases share DeviceData).
  std::unordered_set<ir::DeviceData*> done;
  for (auto& t : LiveTensors()) {
    ir::DeviceDataPtr d = t->data();
    if (!d || d->IsSpmd() || !done.insert(d.get()).second) continue;
    DType phys = PhysicalDType(d->shape.dtype);
    std::vector<char> host(static_cast<size_t>(d->shape.numel()) * runtime::ElementSize(phys));
    if (!host.empty()) d->buffer.ToHost(host.data(), host.size());
    d->shards = UploadShards(host.data(), phys, d->shape.dims, nullptr);
    d->buffer = runtime::Buffer();
    d->sharding = nullptr;
  }
  ForgetCachedScalars();  // single-device buffers; re-uploaded replicated on next use
  ClearCompileCache();
  // Host kernels are single-device custom calls XLA's partitioner could only replicate.
  ir::SetHostKernels(false, false);
  ir::SetHostReductions(false);
  ir::SetHostNorms(false);
  ir::SetHostBigDots(false);
  g_enabled = true;
}

// ------------------------------------------------------------------ graphs
runtime::CompileOptions PrepareModule(lowering::ModuleSpec* spec) {
  int n = NumDevices();
  spec->num_partitions = n;
  spec->num_replicas = 1;
  spec->param_shardings.clear();
  for (const ir::Node* p : spec->params) {
    if (!p->data->IsSpmd()) {
      throw std::runtime_error("a graph in SPMD mode reads device data created outside SPMD mode (" +
                               p->data->shape.ToString() + "); recreate it after use_spmd()");
    }
    spec->param_shardings.push_back(p->data->ShardingText());
  }
  spec->result_shardings.assign(spec->roots.size(), "");
  for (size_t r = 0; r < spec->roots.size(); ++r) {
    const ir::Value& v = spec->roots[r];
    if (v.node->op == ir::Op::kSharding) spec->result_shardings[r] = v.node->attrs.s;
  }
  // A donated parameter's result keeps the parameter's layout (the buffers are reused in place); an
  // annotation that disagrees wins and the donation is dropped.
  std::vector<std::pair<int, int>> kept;
  for (const auto& [param, result] : spec->aliases) {
    std::string& rs = spec->result_shardings[result];
    if (rs.empty()) rs = spec->param_shardings[param];
    if (rs == spec->param_shardings[param]) kept.emplace_back(param, result);
  }
  spec->aliases = kept;
  runtime::CompileOptions o;
  o.num_replicas = 1;
  o.num_partitions = n;
  o.use_spmd_partitioning = true;
  std::vector<int> row;
  for (int d = 0; d < n; ++d) row.push_back(GetClient().DeviceId(d));
  o.device_assignment = {row};
  for (const auto& rs : spec->result_shardings) o.allow_spmd_sharding_propagation_to_output.push_back(rs.empty());
  return o;
}

Hash128 HashParamShardings(Hash128 key, const std::vector<const ir::Node*>& params) {
  key = HashCombine(key, 0x5B3Dull);
  for (const ir::Node* p : params) {
    key = HashAll(key, p->data->ShardingText());  // null and replicated are the same layout
  }
  return key;
}

// ---- Reading XLA's output shardings from the optimized program (a serialized HloModuleProto):
// a minimal protobuf wire-format reader for the few fields needed.
namespace {
struct Wire {
  const uint8_t* p;
  const uint8_t* end;
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      uint8_t b = *p++;
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // Next field: number, wire type, and for length-delimited fields the payload.
  bool Next(int* field, int* wire, uint64_t* value, std::string_view* bytes) {
    if (p >= end) return false;
    uint64_t key;
    if (!Varint(&key)) throw std::runtime_error("bad protobuf");
    *field = static_cast<int>(key >> 3);
    *wire = static_cast<int>(key & 7);
    switch (*wire) {
      case 0: if (!Varint(value)) throw std::runtime_error("bad protobuf"); return true;
      case 1: if (end - p < 8) throw std::runtime_error("bad protobuf"); p += 8; return true;
      case 5: if (end - p < 4) throw std::runtime_error("bad protobuf"); p += 4; return true;
      case 2: {
        uint64_t n;
        if (!Varint(&n) || static_cast<uint64_t>(end - p) < n) throw std::runtime_error("bad protobuf");
        *bytes = std::string_view(reinterpret_cast<const char*>(p), n);
        p += n;
        return true;
      }
      default: throw std::runtime_error("bad protobuf wire type");
    }
  }
};
Wire WireOf(std::string_view b) {
  return Wire{reinterpret_cast<const uint8_t*>(b.data()), reinterpret_cast<const uint8_t*>(b.data()) + b.size()};
}

// A repeated integer field, packed (wire 2) or not (wire 0).
void AppendInts(int wire, uint64_t value, std::string_view bytes, std::vector<int64_t>* out) {
  if (wire == 0) {
    out->push_back(static_cast<int64_t>(value));
    return;
  }
  Wire w = WireOf(bytes);
  uint64_t v;
  while (w.p < w.end) {
    if (!w.Varint(&v)) throw std::runtime_error("bad packed field");
    out->push_back(static_cast<int64_t>(v));
  }
}

struct OpSharding {
  int64_t type = 0;  // REPLICATED 0, MAXIMAL 1, TUPLE 2, OTHER 3, MANUAL 4, UNKNOWN 5
  std::vector<int64_t> tile_dims, devices, last_tile_dims, iota_dims, iota_perm;
  bool replicate_last = false;
  std::vector<OpSharding> tuple;
};

OpSharding ParseOpSharding(std::string_view b) {
  OpSharding s;
  Wire w = WireOf(b);
  int f, wt;
  uint64_t v = 0;
  std::string_view bytes;
  while (w.Next(&f, &wt, &v, &bytes)) {
    switch (f) {
      case 1: s.type = static_cast<int64_t>(v); break;
      case 3: AppendInts(wt, v, bytes, &s.tile_dims); break;
      case 4: AppendInts(wt, v, bytes, &s.devices); break;
      case 5: s.tuple.push_back(ParseOpSharding(bytes)); break;
      case 6: s.replicate_last = v != 0; break;
      case 8: AppendInts(wt, v, bytes, &s.last_tile_dims); break;
      case 9: AppendInts(wt, v, bytes, &s.iota_dims); break;
      case 10: AppendInts(wt, v, bytes, &s.iota_perm); break;
      default: break;
    }
  }
  return s;
}

// Device ids of an iota tile assignment: iota(prod dims) reshaped to `dims`, transposed by `perm`.
std::vector<int64_t> IotaDevices(const std::vector<int64_t>& dims, const std::vector<int64_t>& perm) {
  int k = static_cast<int>(dims.size());
  std::vector<int64_t> tdims(k);
  for (int j = 0; j < k; ++j) tdims[j] = dims[perm[j]];
  std::vector<int64_t> stride(k, 1);  // of the original (untransposed) array
  for (int i = k - 2; i >= 0; --i) stride[i] = stride[i + 1] * dims[i + 1];
  int64_t n = Numel(dims);
  std::vector<int64_t> out(n), idx(k, 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t orig = 0;
    for (int j = 0; j < k; ++j) orig += idx[j] * stride[perm[j]];
    out[flat] = orig;
    for (int j = k - 1; j >= 0; --j) {
      if (++idx[j] < tdims[j]) break;
      idx[j] = 0;
    }
  }
  return out;
}

ir::ShardingPtr ToSharding(const OpSharding& o) {
  switch (o.type) {
    case 0: return std::make_shared<Sharding>(Sharding::Replicated());
    case 1: {
      Sharding s;
      s.kind = Sharding::Kind::kMaximal;
      s.devices = o.devices.empty() ? std::vector<int64_t>{0} : o.devices;
      return std::make_shared<Sharding>(s);
    }
    case 3: {
      std::vector<int64_t> devices = o.devices;
      if (devices.empty() && !o.iota_dims.empty()) {
        std::vector<int64_t> perm = o.iota_perm;
        if (perm.empty()) for (size_t i = 0; i < o.iota_dims.size(); ++i) perm.push_back(static_cast<int64_t>(i));
        devices = IotaDevices(o.iota_dims, perm);
      }
      bool replicate_last = o.replicate_last;
      if (!o.last_tile_dims.empty()) {
        if (o.last_tile_dims.size() != 1 || o.last_tile_dims[0] != 0) {
          throw std::runtime_error("XLA chose a sharding with manual or unreduced subgroups, which is not supported");
        }
        replicate_last = true;
      }
      return std::make_shared<Sharding>(Sharding::Tiled(o.tile_dims, devices, replicate_last));
    }
    default:
      throw std::runtime_error("XLA chose an output sharding of type " + std::to_string(o.type) +
                               ", which is not supported");
  }
}

// HloModuleProto.spmd_output_sharding (field 12); the program may come wrapped in
// HloModuleProtoWithConfig (hlo_module = field 1).
bool FindOutputSharding(std::string_view module, OpSharding* out) {
  Wire w = WireOf(module);
  int f, wt;
  uint64_t v = 0;
  std::string_view bytes;
  while (w.Next(&f, &wt, &v, &bytes)) {
    if (f == 12 && wt == 2) {
      *out = ParseOpSharding(bytes);
      return true;
    }
  }
  return false;
}
}  // namespace

std::vector<ir::ShardingPtr> OutputShardings(const runtime::Executable& exe, const std::vector<ir::Value>& roots) {
  std::string format;
  std::string program = exe.OptimizedProgram(&format);
  std::string_view module = program;
  if (format == "hlo_with_config") {
    Wire w = WireOf(program);
    int f, wt;
    uint64_t v = 0;
    std::string_view bytes;
    module = std::string_view();
    while (w.Next(&f, &wt, &v, &bytes)) {
      if (f == 1 && wt == 2) module = bytes;
    }
  } else if (format != "hlo") {
    throw std::runtime_error("SPMD: the plugin returned its optimized program as '" + format +
                             "', which cannot be read for output shardings");
  }
  OpSharding o;
  bool found = FindOutputSharding(module, &o);
  if (!found && NumDevices() == 1) {  // one partition: XLA does not partition, everything is whole
    return std::vector<ir::ShardingPtr>(roots.size(), std::make_shared<Sharding>(Sharding::Replicated()));
  }
  if (!found) {
    throw std::runtime_error("SPMD: the compiled program carries no output shardings (spmd_output_sharding)");
  }
  std::vector<ir::ShardingPtr> out;
  if (o.type == 2) {
    if (o.tuple.size() != roots.size()) {
      throw std::runtime_error("SPMD: " + std::to_string(o.tuple.size()) + " output shardings for " +
                               std::to_string(roots.size()) + " results");
    }
    for (const auto& e : o.tuple) out.push_back(ToSharding(e));
  } else {
    ir::ShardingPtr s = ToSharding(o);
    out.assign(roots.size(), s);
    if (roots.size() != 1) throw std::runtime_error("SPMD: one output sharding for several results");
  }
  for (size_t i = 0; i < out.size(); ++i) out[i]->ShardDims(roots[i].shape().dims);  // even tiling only
  return out;
}

std::vector<ir::DeviceDataPtr> Execute(const runtime::Executable& exe, const std::vector<const ir::Node*>& params,
                                       const std::vector<ir::Value>& roots,
                                       const std::vector<ir::ShardingPtr>& output_shardings, int device,
                                       const char* time_metric) {
  auto& client = GetClient();
  int n = client.NumDevices();
  std::vector<std::vector<PJRT_Buffer*>> args(n);
  for (int d = 0; d < n; ++d) args[d].reserve(params.size());
  for (const ir::Node* p : params) {
    const ir::DeviceData& data = *p->data;
    if (static_cast<int>(data.shards.size()) != n) {
      throw std::runtime_error("a graph in SPMD mode reads device data created outside SPMD mode (" +
                               data.shape.ToString() + ")");
    }
    for (int d = 0; d < n; ++d) args[d].push_back(data.shards[d].get());
  }
  std::vector<int> devices(n);
  for (int d = 0; d < n; ++d) devices[d] = d;
  int64_t start = metrics::NowNs();
  std::vector<std::vector<runtime::Buffer>> outs = client.ExecuteReplicated(exe, args, devices);
  metrics::IncrementCounter("ExecuteReplicated");
  std::string name = time_metric;
  bool registered = false;
  if (!outs.empty() && !outs[0].empty()) {
    metrics::BeginPendingSample();
    try {
      registered = outs[0][0].OnReady([name, start] {
        metrics::EndPendingSample(name, static_cast<double>(metrics::NowNs() - start), metrics::Unit::kTime);
      });
    } catch (...) {
    }
    if (!registered) metrics::EndPendingSample(name, static_cast<double>(metrics::NowNs() - start), metrics::Unit::kTime);
  } else {
    metrics::AddSample(name, static_cast<double>(metrics::NowNs() - start), metrics::Unit::kTime);
  }
  std::vector<ir::DeviceDataPtr> datas;
  datas.reserve(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    std::vector<runtime::Buffer> shards;
    shards.reserve(n);
    for (int d = 0; d < n; ++d) {
      if (outs[d].size() != roots.size()) throw std::runtime_error("internal: executable returned a wrong number of outputs");
      shards.push_back(std::move(outs[d][i]));
    }
    ir::ShardingPtr s = i < output_shardings.size() ? output_shardings[i] : nullptr;
    std::vector<int64_t> expect = s ? s->ShardDims(roots[i].shape().dims) : std::vector<int64_t>(roots[i].shape().dims);
    if (!shards.empty() && shards[0].Dims() != expect) {
      throw std::runtime_error("internal: SPMD result " + std::to_string(i) + " has a shard of the wrong shape for " +
                               (s ? s->ToString() : std::string("{replicated}")));
    }
    datas.push_back(std::make_shared<ir::DeviceData>(std::move(shards), roots[i].shape(), device, s));
  }
  return datas;
}

// ------------------------------------------------------------------ tensors
namespace {
void RequireEnabled(const char* what) {
  if (!Enabled()) {
    throw std::runtime_error(std::string(what) + " needs SPMD mode: call torch_xla.runtime.use_spmd() first");
  }
}

ir::Value Unannotated(const ir::Value& v) {
  return v.node->op == ir::Op::kSharding ? v.node->operands[0] : v;
}

// Re-lays out materialized data (assembles it on the host, uploads the new shards).
ir::DeviceDataPtr Relayout(const ir::DeviceData& d, ir::ShardingPtr s) {
  DType phys = PhysicalDType(d.shape.dtype);
  std::vector<char> host(static_cast<size_t>(d.shape.numel()) * runtime::ElementSize(phys));
  if (!host.empty()) AssembleToHost(d, host.data(), host.size());
  metrics::Timer timer("TransferToDeviceTime");
  auto out = std::make_shared<ir::DeviceData>(UploadShards(host.data(), phys, d.shape.dims, s.get()), d.shape, d.device,
                                              s);
  return out;
}
}  // namespace

void MarkSharding(const TensorPtr& t, const ir::Sharding& sharding) {
  RequireEnabled("mark_sharding()");
  if (!t->error().empty()) throw std::runtime_error("this XLA tensor has no value: " + t->error());
  CheckCovers(sharding, NumDevices());
  sharding.ShardDims(t->shape().dims);  // throws std::invalid_argument when it does not fit
  auto s = std::make_shared<Sharding>(sharding);
  if (t->HasPending()) {
    t->SetPending(ir::AnnotateSharding(Unannotated(t->pending()), sharding));
    return;
  }
  const ir::DeviceDataPtr& d = t->data();
  if (!d) throw std::runtime_error("internal: XLA tensor has neither data nor a pending value");
  if (d->sharding && *d->sharding == sharding) return;
  if (!d->sharding && sharding.IsReplicated()) {  // laid out so already: now also annotated
    d->sharding = s;
    return;
  }
  t->SetData(Relayout(*d, s));
}

void ClearSharding(const TensorPtr& t) {
  RequireEnabled("clear_sharding()");
  if (!t->error().empty()) throw std::runtime_error("this XLA tensor has no value: " + t->error());
  if (t->HasPending()) {
    t->SetPending(Unannotated(t->pending()));
    return;
  }
  const ir::DeviceDataPtr& d = t->data();
  if (d && d->sharding) t->SetData(Relayout(*d, nullptr));
}

ir::ShardingPtr ShardingOf(const TensorPtr& t) {
  if (t->HasPending()) {
    const ir::Value& v = t->pending();
    if (v.node->op != ir::Op::kSharding) return nullptr;
    return ir::ParseShardingText(v.node->attrs.s);
  }
  return t->data() ? t->data()->sharding : nullptr;
}

std::string ShardingSpec(const TensorPtr& t) {
  if (t->HasPending()) {
    const ir::Value& v = t->pending();
    return v.node->op == ir::Op::kSharding ? v.node->attrs.s : std::string();
  }
  return t->data() && t->data()->sharding ? t->data()->sharding->ToString() : std::string();
}

}  // namespace txla::graph::spmd
