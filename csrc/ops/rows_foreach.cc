// The foreach ops the optimizers use (`_foreach_add`, `_foreach_lerp`, `_foreach_addcdiv`, ...): one
// op-table row per functional overload that runs the per-tensor row for every element. Without them
// torch's slow foreach kernel dispatches one aten op per tensor (about 300 dispatches per AdamW step
// of a small GPT); with them the whole list is one dispatch. Values, dtypes and errors are the
// per-tensor rows' own: this file only maps arguments. The in-place variants (`_foreach_add_`) reach
// these rows through functionalization.
#include <string>
#include <vector>

#include "ops/op_table.h"
#include "ops/rows.h"

namespace txla::ops {
namespace {

using V = std::vector<Value>;

// How one foreach argument becomes the element row's argument for element i.
enum class Map {
  kList,        // Tensor[] -> its i-th tensor
  kScalarList,  // Scalar[] -> its i-th scalar
  kSame,        // passed unchanged (a Scalar, a Tensor, a dtype, ...)
};

struct Plan {
  std::string foreach;           // "_foreach_add.List"
  std::string element;           // "add.Tensor"
  std::vector<Map> maps;         // one per foreach argument, in order
  std::vector<Arg> extra;        // appended element arguments (defaults the foreach schema lacks)
};

Arg ScalarArg(int64_t v) {
  Arg a;
  a.kind = Arg::kScalar;
  a.s.kind = Scalar::kInt;
  a.s.i = v;
  return a;
}

Arg NoneArg() { return Arg{}; }

OpFn Foreach(Plan plan) {
  return [plan](OpArgs& a) -> V {
    const OpRow* element = FindOp(plan.element);
    size_t n = 0;
    bool have_list = false;
    for (size_t k = 0; k < plan.maps.size() && k < a.size(); ++k) {
      if (plan.maps[k] == Map::kList) {
        size_t len = a.args[k].tl.size();
        if (have_list && len != n) {
          a.Fail("Tensor lists must have the same number of tensors, got " + std::to_string(n) + " and " +
                 std::to_string(len));
        }
        n = len;
        have_list = true;
      } else if (plan.maps[k] == Map::kScalarList) {
        if (a.args[k].kind != Arg::kScalarList) a.Fail("argument " + std::to_string(k) + " is not a scalar list");
        if (a.args[k].sl.size() != n) {
          a.Fail("Tensor list must have same number of elements as scalar list, got " + std::to_string(n) + " and " +
                 std::to_string(a.args[k].sl.size()));
        }
      }
    }
    V out;
    out.reserve(n);
    OpArgs sub;
    sub.device = a.device;
    sub.op_name = plan.element;
    for (size_t i = 0; i < n; ++i) {
      sub.args.clear();
      sub.writebacks.clear();
      for (size_t k = 0; k < plan.maps.size() && k < a.size(); ++k) {
        const Arg& src = a.args[k];
        switch (plan.maps[k]) {
          case Map::kList: {
            Arg t;
            t.kind = src.tl[i].defined() ? Arg::kTensor : Arg::kNone;
            t.t = src.tl[i];
            sub.args.push_back(std::move(t));
            break;
          }
          case Map::kScalarList: {
            Arg s;
            s.kind = Arg::kScalar;
            s.s = src.sl[i];
            sub.args.push_back(std::move(s));
            break;
          }
          case Map::kSame: sub.args.push_back(src); break;
        }
      }
      for (const Arg& e : plan.extra) sub.args.push_back(e);
      V r = element->fn(sub);
      if (r.size() != 1 || !sub.writebacks.empty()) a.Fail("internal: " + plan.element + " is not a one-result op");
      out.push_back(std::move(r[0]));
    }
    return out;
  };
}

}  // namespace

void AddForeachRows(std::vector<OpRow>& rows) {
  auto have = [&](const std::string& name) {
    for (const auto& r : rows) {
      if (r.aten == name) return true;
    }
    return false;
  };
  std::vector<Plan> plans;
  const Map L = Map::kList, SL = Map::kScalarList, S = Map::kSame;
  // Binary arithmetic: .Scalar / .ScalarList -> X.Scalar, .List / .Tensor -> X.Tensor.
  for (const char* op : {"add", "sub"}) {
    std::string f = std::string("_foreach_") + op, e = op;
    plans.push_back({f + ".Scalar", e + ".Scalar", {L, S}, {ScalarArg(1)}});
    plans.push_back({f + ".ScalarList", e + ".Scalar", {L, SL}, {ScalarArg(1)}});
    plans.push_back({f + ".List", e + ".Tensor", {L, L, S}, {}});
    if (std::string(op) == "add") plans.push_back({f + ".Tensor", e + ".Tensor", {L, S, S}, {}});
  }
  for (const char* op : {"mul", "div"}) {
    std::string f = std::string("_foreach_") + op, e = op;
    plans.push_back({f + ".Scalar", e + ".Scalar", {L, S}, {}});
    plans.push_back({f + ".ScalarList", e + ".Scalar", {L, SL}, {}});
    plans.push_back({f + ".List", e + ".Tensor", {L, L}, {}});
    plans.push_back({f + ".Tensor", e + ".Tensor", {L, S}, {}});
  }
  // maximum/minimum with a scalar are clamps (torch's own definition of the foreach overloads).
  plans.push_back({"_foreach_maximum.List", "maximum", {L, L}, {}});
  plans.push_back({"_foreach_minimum.List", "minimum", {L, L}, {}});
  plans.push_back({"_foreach_maximum.Scalar", "clamp_min", {L, S}, {}});
  plans.push_back({"_foreach_minimum.Scalar", "clamp_max", {L, S}, {}});
  plans.push_back({"_foreach_maximum.ScalarList", "clamp_min", {L, SL}, {}});
  plans.push_back({"_foreach_minimum.ScalarList", "clamp_max", {L, SL}, {}});
  plans.push_back({"_foreach_clamp_min.Scalar", "clamp_min", {L, S}, {}});
  plans.push_back({"_foreach_clamp_max.Scalar", "clamp_max", {L, S}, {}});
  plans.push_back({"_foreach_clamp_min.List", "clamp_min.Tensor", {L, L}, {}});
  plans.push_back({"_foreach_clamp_max.List", "clamp_max.Tensor", {L, L}, {}});
  plans.push_back({"_foreach_pow.List", "pow.Tensor_Tensor", {L, L}, {}});
  plans.push_back({"_foreach_pow.Scalar", "pow.Tensor_Scalar", {L, S}, {}});
  plans.push_back({"_foreach_pow.ScalarList", "pow.Tensor_Scalar", {L, SL}, {}});
  // Ternary.
  plans.push_back({"_foreach_lerp.List", "lerp.Tensor", {L, L, L}, {}});
  plans.push_back({"_foreach_lerp.Scalar", "lerp.Scalar", {L, L, S}, {}});
  plans.push_back({"_foreach_lerp.ScalarList", "lerp.Scalar", {L, L, SL}, {}});
  for (const char* op : {"addcmul", "addcdiv"}) {
    std::string f = std::string("_foreach_") + op;
    plans.push_back({f + ".Scalar", op, {L, L, L, S}, {}});
    plans.push_back({f + ".ScalarList", op, {L, L, L, SL}, {}});
  }
  // Unary.
  for (const char* op : {"sqrt", "rsqrt", "neg", "reciprocal", "abs", "exp", "expm1", "log", "log1p", "log2",
                         "log10", "sign", "sigmoid", "tanh", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
                         "cosh", "erf", "erfc", "ceil", "floor", "round", "trunc", "frac", "lgamma", "zero"}) {
    plans.push_back({std::string("_foreach_") + op, op, {L}, {}});
  }
  // clip_grad_norm_(foreach=True): one norm per tensor.
  plans.push_back({"_foreach_norm.Scalar", "linalg_vector_norm", {L, S, S}, {}});
  for (auto& p : plans) {
    if (!have(p.element)) continue;  // only where the element op is lowered: never a CPU fallback
    if (p.foreach == "_foreach_norm.Scalar") {
      // linalg_vector_norm(self, ord, dim=None, keepdim=False, *, dtype=None): foreach gives (ord, dtype).
      // Reorders the arguments once per call, then runs the usual per-tensor loop (built once).
      OpFn each = Foreach({p.foreach, p.element, {Map::kList, Map::kSame, Map::kSame, Map::kSame, Map::kSame}, {}});
      Arg keepdim;
      keepdim.kind = Arg::kBool;
      rows.push_back({p.foreach, [each, keepdim](OpArgs& a) -> V {
                        OpArgs b;
                        b.device = a.device;
                        b.op_name = a.op_name;
                        b.args = {a.args.at(0), a.args.at(1), NoneArg(), keepdim, a.size() > 2 ? a.args[2] : NoneArg()};
                        return each(b);
                      }});
      continue;
    }
    rows.push_back({p.foreach, Foreach(p)});
  }
}

}  // namespace txla::ops
