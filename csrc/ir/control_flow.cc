#include "ir/control_flow.h"

#include <map>
#include <unordered_map>
#include <unordered_set>
#include "util/block_cache.h"

namespace txla::ir {

namespace {

[[noreturn]] void Fail(const std::string& what) { throw ShapeError(what); }

// Closes a loop's cond and body graphs (see control_flow.h).
class Closer {
 public:
  void AddParams(const std::vector<Value>& params) {
    for (size_t i = 0; i < params.size(); ++i) {
      const Node* n = params[i].node.get();
      if (!n || n->op != Op::kParameter) Fail("while: region parameters must be Parameter() values");
      auto [it, fresh] = param_index_.emplace(n, static_cast<int>(i));
      if (!fresh && it->second != static_cast<int>(i)) Fail("while: a region parameter is listed twice");
    }
  }

  // Pass 1: the values the regions read that do not depend on their parameters (and are not cheap
  // constant expressions), in first-seen order.
  void CollectCaptures(const std::vector<Value>& results) {
    for (const Value& r : results) Visit(r);
  }
  const std::vector<Value>& captures() const { return captures_; }

  // Pass 2: the region over `nparams` fresh parameters (carried values, then captures).
  std::shared_ptr<Region> Close(const std::vector<Value>& results, const std::vector<Shape>& shapes) {
    auto region = std::make_shared<Region>();
    for (size_t i = 0; i < shapes.size(); ++i) {
      Attrs a;
      a.n = static_cast<int64_t>(i);
      region->params.push_back(util::MakeCachedShared<Node>(Op::kParameter, std::vector<Value>{}, std::vector<Shape>{shapes[i]}, a));
    }
    region_ = region.get();
    clones_.clear();
    for (const Value& r : results) region->results.push_back(Clone(r));
    return region;
  }

 private:
  bool DependsOnParams(const Node* n) {
    if (param_index_.count(n)) return true;
    if (!n->in_region) return false;  // built outside any loop body: cannot read our parameters
    auto it = dep_.find(n);
    if (it != dep_.end()) return it->second;
    bool d = false;
    for (const Value& v : n->operands) d = DependsOnParams(v.node.get()) || d;
    dep_[n] = d;
    return d;
  }

  // A small expression of constants only (no device data, no parameters): kept inside the region.
  bool Pure(const Node* root) {
    auto it = pure_.find(root);
    if (it != pure_.end()) return it->second;
    size_t seen = 0;
    bool ok = true;
    std::vector<const Node*> stack{root};
    std::unordered_set<const Node*> done;
    while (!stack.empty() && ok) {
      const Node* n = stack.back();
      stack.pop_back();
      if (!done.insert(n).second) continue;
      if (n->op == Op::kDeviceData || n->op == Op::kParameter || n->in_region || ++seen > 64) ok = false;
      for (const Value& v : n->operands) stack.push_back(v.node.get());
    }
    pure_[root] = ok;
    return ok;
  }

  void Visit(const Value& v) {
    const Node* n = v.node.get();
    if (param_index_.count(n)) return;
    if (!DependsOnParams(n)) {
      if (Pure(n)) return;
      auto key = std::make_pair(n, v.index);
      if (!capture_index_.count(key)) {
        capture_index_[key] = captures_.size();
        captures_.push_back(v);
      }
      return;
    }
    if (!visited_.insert(n).second) return;
    for (const Value& o : n->operands) Visit(o);
  }

  Value Clone(const Value& v) {
    const Node* n = v.node.get();
    auto p = param_index_.find(n);
    if (p != param_index_.end()) return Value(region_->params[p->second], 0);
    if (!DependsOnParams(n)) {
      if (Pure(n)) return v;
      size_t ci = capture_index_.at(std::make_pair(n, v.index));
      return Value(region_->params[region_->params.size() - captures_.size() + ci], 0);
    }
    auto it = clones_.find(n);
    if (it == clones_.end()) {
      std::vector<Value> ops;
      for (const Value& o : n->operands) ops.push_back(Clone(o));
      auto c = util::MakeCachedShared<Node>(n->op, std::move(ops), n->shapes, n->attrs, n->data);
      c->regions = n->regions;
      c->scope = n->scope;
      it = clones_.emplace(n, c).first;
    }
    return Value(it->second, v.index);
  }

  std::unordered_map<const Node*, int> param_index_;
  std::unordered_map<const Node*, bool> dep_, pure_;
  std::unordered_set<const Node*> visited_;
  std::map<std::pair<const Node*, int>, size_t> capture_index_;
  std::vector<Value> captures_;
  std::unordered_map<const Node*, NodePtr> clones_;
  const Region* region_ = nullptr;
};

Hash128 RegionHash(const Region& r) {
  std::vector<const Node*> po = RegionPostOrder(r);
  std::unordered_map<const Node*, uint64_t> index;
  Hash128 h{0x5E610AULL, static_cast<uint64_t>(r.params.size())};
  for (size_t i = 0; i < r.params.size(); ++i) index[r.params[i].get()] = i;  // params by position
  for (const Node* n : po) {
    if (index.count(n) && n->op == Op::kParameter) {
      h = HashCombine(h, index[n] ^ 0xBA5EULL);
      continue;
    }
    index[n] = r.params.size() + static_cast<uint64_t>(index.size());
    h = HashCombine(h, n->op_hash);
    for (const Value& v : n->operands) h = HashCombine(h, index.at(v.node.get()) * 64 + static_cast<uint64_t>(v.index));
  }
  for (const Value& v : r.results) h = HashCombine(h, index.at(v.node.get()) * 64 + static_cast<uint64_t>(v.index));
  return h;
}

}  // namespace

std::vector<Shape> Region::ParamShapes() const {
  std::vector<Shape> s;
  for (const auto& p : params) s.push_back(p->shapes[0]);
  return s;
}

Value Parameter(int64_t index, const Shape& shape) {
  Attrs a;
  a.n = index;
  return Value(util::MakeCachedShared<Node>(Op::kParameter, std::vector<Value>{}, std::vector<Shape>{shape}, a), 0);
}

std::vector<const Node*> RegionPostOrder(const Region& r) {
  std::vector<const Node*> order;
  std::unordered_set<const Node*> done;
  std::vector<std::pair<const Node*, size_t>> stack;
  for (const auto& res : r.results) {
    if (done.count(res.node.get())) continue;
    stack.emplace_back(res.node.get(), 0);
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (i < n->operands.size()) {
        const Node* child = n->operands[i++].node.get();
        if (!done.count(child)) stack.emplace_back(child, 0);
        continue;
      }
      if (done.insert(n).second) order.push_back(n);
      stack.pop_back();
    }
  }
  return order;
}

std::vector<Value> While(const std::vector<Value>& init, const std::vector<Value>& cond_params, const Value& cond_result,
                         const std::vector<Value>& body_params, const std::vector<Value>& body_results) {
  size_t n = init.size();
  if (n == 0) Fail("while_loop: there must be at least one carried value");
  if (cond_params.size() != n || body_params.size() != n) Fail("while_loop: one region parameter per carried value");
  for (size_t i = 0; i < n; ++i) {
    if (cond_params[i].shape() != init[i].shape() || body_params[i].shape() != init[i].shape()) {
      Fail("while_loop: region parameter " + std::to_string(i) + " does not match carried value " + init[i].shape().ToString());
    }
  }
  if (cond_result.shape() != Shape(DType::kPred, {})) {
    Fail("while_loop: cond_fn must return a boolean scalar tensor, got " + cond_result.shape().ToString());
  }
  if (body_results.size() != n) {
    Fail("while_loop: body_fn returned " + std::to_string(body_results.size()) + " values for " + std::to_string(n) +
         " carried values");
  }
  for (size_t i = 0; i < n; ++i) {
    if (body_results[i].shape() != init[i].shape()) {
      Fail("while_loop: body_fn returned " + body_results[i].shape().ToString() + " for carried value " + std::to_string(i) +
           ", which is " + init[i].shape().ToString() +
           " (a loop body must keep each carried value's shape and dtype)");
    }
  }
  // One closer sees both regions: cond and body parameter i are both carried value i, and the
  // captures of either region are shared extra carried values.
  Closer closer;
  closer.AddParams(cond_params);
  closer.AddParams(body_params);
  closer.CollectCaptures({cond_result});
  closer.CollectCaptures(body_results);
  const std::vector<Value>& caps = closer.captures();
  std::vector<Shape> shapes;
  std::vector<Value> operands = init;
  for (const Value& v : init) shapes.push_back(v.shape());
  for (const Value& c : caps) {
    shapes.push_back(c.shape());
    operands.push_back(c);
  }
  std::shared_ptr<Region> cond = closer.Close({cond_result}, shapes);
  std::shared_ptr<Region> body = closer.Close(body_results, shapes);
  for (size_t i = 0; i < caps.size(); ++i) body->results.push_back(Value(body->params[n + i], 0));
  cond->hash = RegionHash(*cond);
  body->hash = RegionHash(*body);
  Attrs a;
  a.ints = {{static_cast<int64_t>(n)},
            {static_cast<int64_t>(cond->hash.lo), static_cast<int64_t>(cond->hash.hi),
             static_cast<int64_t>(body->hash.lo), static_cast<int64_t>(body->hash.hi)}};
  auto node = util::MakeCachedShared<Node>(Op::kWhile, operands, shapes, a);
  node->regions = {cond, body};
  std::vector<Value> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(node, static_cast<int>(i));
  return out;
}

std::vector<Value> ForLoop(int64_t trip_count, const std::vector<Value>& init,
                           const std::function<std::vector<Value>(const Value& i, const std::vector<Value>&)>& body) {
  std::vector<Value> carried{ConstantInt(0, DType::kS64)};
  carried.insert(carried.end(), init.begin(), init.end());
  std::vector<Value> params;
  for (size_t k = 0; k < carried.size(); ++k) params.push_back(Parameter(static_cast<int64_t>(k), carried[k].shape()));
  Value pred = Compare(CompareDir::kLT, params[0], ConstantInt(trip_count, DType::kS64));
  std::vector<Value> inner(params.begin() + 1, params.end());
  std::vector<Value> results{Binary(Op::kAdd, params[0], ConstantInt(1, DType::kS64))};
  std::vector<Value> b = body(params[0], inner);
  results.insert(results.end(), b.begin(), b.end());
  std::vector<Value> out = While(carried, params, pred, params, results);
  return std::vector<Value>(out.begin() + 1, out.end());
}

}  // namespace txla::ir
