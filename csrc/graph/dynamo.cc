#include "graph/dynamo.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "util/metrics.h"

namespace txla::graph {

DynamoTraceStart DynamoBeginTrace(const std::vector<TensorPtr>& inputs, int device) {
  DynamoTraceStart s;
  s.device = device;
  std::vector<TensorPtr> pending;
  for (const auto& t : inputs) {
    if (!t->error().empty()) throw std::runtime_error("this XLA tensor has no value: " + t->error());
    if (t->HasPending() || !t->data()) pending.push_back(t);
  }
  s.seed = RngSeedTensor(device);
  if (s.seed->HasPending()) pending.push_back(s.seed);
  if (!pending.empty()) SyncTensors(&pending, SyncOptions{});
  pending.clear();
  // Held by the caller's tensor and the caller's list alone (as a call will check it).
  for (const auto& t : inputs) s.held_alone.push_back(DynamoHeldAlone(t, 2));
  s.inputs = inputs;
  for (const auto& t : inputs) s.input_data.push_back(t->data());
  s.seed_data = s.seed->data();
  s.checks_before = PendingCheckCount(device);
  s.executions_before = SyncExecutionCount();
  return s;
}

std::shared_ptr<DynamoGraph> DynamoCompile(const DynamoTraceStart& start, const std::vector<TensorPtr>& inputs_after,
                                           const std::vector<TensorPtr>& outputs, const std::string& name,
                                           const std::vector<int>& may_donate) {
  if (SyncExecutionCount() != start.executions_before) {
    throw std::runtime_error("the graph ran a computation while it was traced (it reads a value on the host)");
  }
  if (inputs_after.size() != start.inputs.size()) throw std::runtime_error("internal: input count changed while tracing");
  auto g = std::make_shared<DynamoGraph>();
  g->name = name;
  g->device = start.device;
  std::vector<ir::Value> roots;
  for (const auto& t : outputs) {
    if (!t->error().empty()) throw std::runtime_error("this XLA tensor has no value: " + t->error());
    if (t->device() != start.device) {
      throw std::runtime_error("a compiled graph's outputs are on XLA devices " + std::to_string(t->device()) +
                               " and " + std::to_string(start.device) + "; one graph runs on one device");
    }
    roots.push_back(t->GetValue());
  }
  g->num_outputs = roots.size();
  for (size_t i = 0; i < inputs_after.size(); ++i) {
    const TensorPtr& now = inputs_after[i];
    if (now != start.inputs[i] || now->HasPending()) {
      g->mutated.emplace_back(static_cast<int>(i), static_cast<int>(roots.size()));
      roots.push_back(now->GetValue());
    }
  }
  TensorPtr seed = RngSeedTensor(start.device);
  if (seed == start.seed && seed->HasPending()) {
    g->seed_root = static_cast<int>(roots.size());
    roots.push_back(seed->pending());
  }
  for (auto& c : TakePendingChecks(start.device, start.checks_before)) {
    g->checks.push_back({static_cast<int>(roots.size()), c.message, c.runtime_error});
    roots.push_back(c.pred);
  }
  if (roots.empty()) return g;  // nothing to compute
  std::vector<const ir::Node*> params;
  {
    metrics::Timer timer("DynamoCompileGraphTime");
    g->exe = CompileGraph(roots, start.device, name, &params);
  }
  std::unordered_map<const ir::DeviceData*, int> input_of;
  for (size_t i = 0; i < start.inputs.size(); ++i) input_of.emplace(start.input_data[i].get(), static_cast<int>(i));
  for (const ir::Node* p : params) {
    DynamoParam dp;
    auto it = input_of.find(p->data.get());
    if (it != input_of.end()) {
      dp.kind = DynamoParam::kInput;
      dp.input = it->second;
    } else if (p->data == start.seed_data) {
      dp.kind = DynamoParam::kSeed;
    } else {
      if (p->data->device != start.device) {
        throw std::runtime_error("a compiled graph reads a tensor of XLA device " + std::to_string(p->data->device) +
                                 " while it runs on device " + std::to_string(start.device));
      }
      dp.kind = DynamoParam::kConstant;
      dp.data = p->data;
    }
    g->params.push_back(std::move(dp));
  }
  for (const auto& t : start.inputs) g->input_shapes.push_back(t->shape());
  for (const auto& r : roots) g->root_shapes.push_back(r.shape());
  // The donating executable: each written input that the graph reads gives its buffer to its new
  // value (same shape and dtype by construction).
  if (ParamAliasingEnabled() && !g->mutated.empty()) {
    std::unordered_map<int, int> param_of_input;
    for (size_t p = 0; p < g->params.size(); ++p) {
      if (g->params[p].kind == DynamoParam::kInput) param_of_input.emplace(g->params[p].input, static_cast<int>(p));
    }
    // (parameter, result, input, tier) of every written input that may donate.
    std::vector<std::tuple<int, int, int, int>> cands;
    for (const auto& [input, root] : g->mutated) {
      auto it = param_of_input.find(input);
      if (it == param_of_input.end() || g->input_shapes[input] != g->root_shapes[root]) continue;
      const int tier = static_cast<size_t>(input) < may_donate.size() ? may_donate[input] : 0;
      if (tier <= 0 || (tier >= 2 && !start.held_alone[input])) continue;
      const ir::DeviceDataPtr& d = start.input_data[input];
      if (!d || d->IsSpmd()) continue;
      cands.emplace_back(it->second, root, input, tier);
    }
    bool has_wide = false, has_narrow = false;
    for (const auto& c : cands) (std::get<3>(c) >= 2 ? has_wide : has_narrow) = true;
    // The wide executable (every candidate) first, then the narrow one (tier 1 alone).
    for (int max_tier : {2, 1}) {
      if (max_tier == 2 ? !has_wide : !has_narrow) continue;
      std::vector<std::pair<int, int>> aliases;
      DynamoGraph::Donation don;
      for (const auto& [param, root, input, tier] : cands) {
        if (tier > max_tier) continue;
        aliases.emplace_back(param, root);
        don.donate.emplace_back(param, input);
      }
      std::sort(aliases.begin(), aliases.end());
      std::vector<const ir::Node*> params2;
      metrics::Timer timer("DynamoCompileGraphTime");
      don.exe = CompileGraph(roots, start.device, name, &params2, aliases);
      if (params2.size() != params.size()) throw std::runtime_error("internal: the donating executable's parameters differ");
      g->donations.push_back(std::move(don));
    }
  }
  return g;
}

bool DynamoHeldAlone(const TensorPtr& t, long tensor_refs) {
  if (!t || t.use_count() > tensor_refs || !t->error().empty() || t->HasPending()) return false;
  const ir::DeviceDataPtr& d = t->data();
  if (!d || !d->donatable || d->donated || d->IsSpmd() || d->buffer.get() == nullptr) return false;
  if (d.use_count() == 1) return true;
  // The tensor's cached data leaf (made when it was first used lazily) holds the data too; it
  // counts as the tensor's own as long as no pending graph holds that leaf.
  ir::Value leaf = t->GetValue();
  return leaf.node && leaf.node->data == d && leaf.node.use_count() == 2 && d.use_count() == 2;
}

std::vector<ir::DeviceDataPtr> DynamoRun(const DynamoGraph& g, const std::vector<TensorPtr>& inputs) {
  std::vector<ir::DeviceDataPtr> results;
  if (!g.exe) return results;
  int64_t start_ns = metrics::NowNs();
  TensorPtr seed;
  if (g.seed_root >= 0) seed = RngSeedTensor(g.device);
  std::vector<TensorPtr> pending;
  for (const auto& p : g.params) {
    if (p.kind == DynamoParam::kInput) {
      const TensorPtr& t = inputs[p.input];
      if ((t->HasPending() && !MaterializeConstant(t)) || !t->data()) pending.push_back(t);
    } else if (p.kind == DynamoParam::kSeed) {
      if (!seed) seed = RngSeedTensor(g.device);
      if (seed->HasPending()) pending.push_back(seed);
    }
  }
  if (!pending.empty()) {
    // As PyTorch/XLA: counts the calls whose inputs were still lazy values and had to run first.
    TXLA_COUNTER_ADD("DynamoSyncInputExecuteTime", 1);
    SyncTensors(&pending, SyncOptions{});
  }
  // Donate when every written input's buffer is held by that input alone: its device data by its
  // one lazy tensor (no other tensor, pending graph or cache reads it), that tensor by the input's
  // tensor and this call (no second argument or alias shares it). Tensors sharing the input's
  // storage (a `detach()`, `.data`) go through functionalization, which regenerates them from the
  // written value, never from the donated buffer.
  const DynamoGraph::Donation* donation = nullptr;
  for (const auto& v : g.donations) {
    bool ok = true;
    for (size_t k = 0; k < v.donate.size() && ok; ++k) {
      ok = DynamoHeldAlone(inputs[v.donate[k].second], 2);
    }
    if (ok) {
      donation = &v;
      break;
    }
  }
  const bool donate = donation != nullptr;
  std::vector<PJRT_Buffer*> args;
  args.reserve(g.params.size());
  for (const auto& p : g.params) {
    const ir::DeviceData* d = nullptr;
    switch (p.kind) {
      case DynamoParam::kInput: {
        const TensorPtr& t = inputs[p.input];
        if (!t->error().empty()) throw std::runtime_error("this XLA tensor has no value: " + t->error());
        d = t->data().get();
        if (d->device != g.device) {
          throw std::runtime_error("compiled graph '" + g.name + "' runs on XLA device " + std::to_string(g.device) +
                                   " but input " + std::to_string(p.input) + " is on device " +
                                   std::to_string(d->device));
        }
        break;
      }
      case DynamoParam::kSeed:
        d = seed->data().get();
        break;
      case DynamoParam::kConstant:
        d = p.data.get();
        break;
    }
    args.push_back(d->buffer.get());
  }
  std::vector<runtime::Buffer> outs;
  {
    int64_t launch = metrics::NowNs();
    outs = GetClient().Execute(donate ? *donation->exe : *g.exe, args, g.device);
    // The donated buffers now belong to the results. Their PJRT handles are released once the
    // execution is done (destroying a donated handle earlier waits for it: see the sync's donation).
    auto donated_buffers = std::make_shared<std::vector<runtime::Buffer>>();
    if (donate) {
      TXLA_COUNTER_ADD("DynamoDonatingCall", 1);
      TXLA_COUNTER_ADD("DynamoDonatedBuffers", static_cast<int64_t>(donation->donate.size()));
      for (const auto& [param, input] : donation->donate) {
        ir::DeviceData* d = inputs[input]->data().get();
        d->donated = true;
        donated_buffers->push_back(std::move(d->buffer));
      }
    }
    metrics::AddSample("DynamoCallTime", static_cast<double>(metrics::NowNs() - start_ns),
                       metrics::Unit::kTime);
    if (!outs.empty()) {
      metrics::BeginPendingSample();
      bool registered = false;
      try {
        registered = outs[0].OnReady([launch, donated_buffers] {
          metrics::EndPendingSample("ExecuteTime", static_cast<double>(metrics::NowNs() - launch), metrics::Unit::kTime);
          donated_buffers->clear();  // the donation is confirmed once the results are defined
        });
      } catch (...) {
      }
      if (!registered) {
        metrics::EndPendingSample("ExecuteTime", static_cast<double>(metrics::NowNs() - launch), metrics::Unit::kTime);
      }
    }
  }
  MarkComputationRan();
  if (outs.size() != g.root_shapes.size()) throw std::runtime_error("internal: executable returned a wrong number of outputs");
  results.reserve(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    results.push_back(std::make_shared<ir::DeviceData>(std::move(outs[i]), g.root_shapes[i], g.device));
  }
  if (g.seed_root >= 0) seed->SetData(results[g.seed_root]);
  for (const auto& c : g.checks) AddExecutedCheck(results[c.root], c.message, c.runtime_error);
  return results;
}

}  // namespace txla::graph
