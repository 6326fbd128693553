#include "lowering/stablehlo.h"
#include "ir/control_flow.h"
#include "runtime/fp_env.h"
#include "util/half.h"
#include "util/text.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

namespace txla::lowering {

using ir::DType;
using ir::Node;
using ir::Op;
using ir::Shape;
using ir::Value;

namespace {

// The physical float type of the module being emitted (XLA_USE_BF16: f32/f64 -> bf16).
thread_local DType t_float_type = DType::kF32;
DType Phys(DType t) {
  return (t_float_type != DType::kF32 && (t == DType::kF32 || t == DType::kF64)) ? t_float_type : t;
}
std::string T(const Shape& s) {
  if (Phys(s.dtype) == s.dtype) return s.ToString();
  return Shape(Phys(s.dtype), s.dims).ToString();
}
std::string ScalarT(DType t) { return Shape(Phys(t), {}).ToString(); }

std::string I64Array(const std::vector<int64_t>& v) {
  std::string s = "array<i64";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : ": ") + std::to_string(v[i]);
  return s + ">";
}

std::string List(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string PaddingAttr(const std::vector<int64_t>& lo_hi) {
  size_t n = lo_hi.size() / 2;
  std::string s = "dense<[";
  for (size_t i = 0; i < n; ++i) {
    s += (i ? ", [" : "[") + std::to_string(lo_hi[2 * i]) + ", " + std::to_string(lo_hi[2 * i + 1]) + "]";
  }
  if (n == 0) return "dense<> : tensor<0x2xi64>";
  return s + "]> : tensor<" + std::to_string(n) + "x2xi64>";
}

const char* CompareType(DType t) {
  if (ir::IsFloating(t) || ir::IsComplex(t)) return "FLOAT";
  if (ir::IsUnsigned(t)) return "UNSIGNED";
  return "SIGNED";
}

const char* DirName(int64_t d) {
  static const char* k[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  return k[d];
}

// Emission state for one module.
class Emitter {
 public:
  explicit Emitter(const ModuleSpec& spec) : spec_(spec) {}

  std::string Run() {
    for (size_t i = 0; i < spec_.params.size(); ++i) names_[spec_.params[i]] = "%arg" + std::to_string(i);
    if (spec_.keep_denormals) EmitFpEnv();
    for (const Node* n : spec_.post_order) {
      if (n->op == Op::kDeviceData) continue;
      if (spec_.locations && !n->scope.empty()) {
        // Every op emitted for the node carries its source location (not just the last one).
        util::Text outer;
        std::swap(outer, body_);
        EmitNode(*n);
        std::string chunk = body_.str();
        std::swap(outer, body_);
        body_ << TagLines(chunk, Location(n->scope));
      } else {
        EmitNode(*n);
      }
    }
    util::Text os;
    std::string name;
    for (char c : spec_.name) name += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.') ? c : '_';
    os << "module @" << (name.empty() ? "graph" : name) << " attributes {mhlo.num_partitions = "
       << spec_.num_partitions << " : i32, mhlo.num_replicas = " << spec_.num_replicas << " : i32} {\n";
    os << "  func.func public @main(";
    for (size_t i = 0; i < spec_.params.size(); ++i) {
      os << (i ? ", " : "") << "%arg" << i << ": " << T(spec_.params[i]->shapes[0]);
      std::vector<std::string> attrs;
      if (i < spec_.param_shardings.size() && !spec_.param_shardings[i].empty()) {
        attrs.push_back("mhlo.sharding = \"" + spec_.param_shardings[i] + "\"");
      }
      for (const auto& [param, result] : spec_.aliases) {
        if (param == static_cast<int>(i)) attrs.push_back("tf.aliasing_output = " + std::to_string(result) + " : i32");
      }
      for (size_t k = 0; k < attrs.size(); ++k) os << (k ? ", " : " {") << attrs[k];
      if (!attrs.empty()) os << "}";
    }
    os << ") -> (";
    for (size_t i = 0; i < spec_.roots.size(); ++i) {
      os << (i ? ", " : "") << T(spec_.roots[i].shape());
      if (i < spec_.result_shardings.size() && !spec_.result_shardings[i].empty()) {
        os << " {mhlo.sharding = \"" << spec_.result_shardings[i] << "\"}";
      }
    }
    os << ") {\n" << body_.str();
    os << "    \"func.return\"(";
    for (size_t i = 0; i < spec_.roots.size(); ++i) os << (i ? ", " : "") << Name(spec_.roots[i]);
    os << ") : (";
    for (size_t i = 0; i < spec_.roots.size(); ++i) os << (i ? ", " : "") << T(spec_.roots[i].shape());
    os << ") -> ()\n  }\n}\n";
    return os.str();
  }

 private:
  std::string Name(const Value& v) {
    const std::string& base = names_.at(v.node.get());
    if (v.node->shapes.size() == 1) return base;
    return base + "#" + std::to_string(v.index);
  }
  std::string Fresh() { return "%" + std::to_string(next_++); }

  // The floating-point environment call first, then the arguments through one optimization
  // barrier with its token: whatever reads an argument is scheduled after the call.
  void EmitFpEnv() {
    body_ << "    %fpenv = \"stablehlo.custom_call\"() {api_version = 4 : i32, call_target_name = \""
          << runtime::FpEnvTarget() << "\", has_side_effect = true} : () -> !stablehlo.token\n";
    if (spec_.params.empty()) return;
    const size_t n = spec_.params.size() + 1;
    std::string types = "!stablehlo.token";
    body_ << "    %fpbar:" << n << " = \"stablehlo.optimization_barrier\"(%fpenv";
    for (size_t i = 0; i < spec_.params.size(); ++i) {
      body_ << ", %arg" << i;
      types += ", " + T(spec_.params[i]->shapes[0]);
      names_[spec_.params[i]] = "%fpbar#" + std::to_string(i + 1);
    }
    body_ << ") : (" << types << ") -> (" << types << ")\n";
  }

  // Writes `%res = "op"(operands) attrs : (types) -> result types` and names node n.
  void Line(const Node& n, const std::string& op, const std::string& attrs, const std::string& region = "") {
    std::string res = Fresh();
    names_[&n] = res;
    body_ << "    " << res;
    if (n.shapes.size() > 1) body_ << ":" << n.shapes.size();
    body_ << " = \"" << op << "\"(";
    for (size_t i = 0; i < n.operands.size(); ++i) body_ << (i ? ", " : "") << Name(n.operands[i]);
    body_ << ")";
    if (!region.empty()) body_ << " (" << region << ")";
    if (!attrs.empty()) body_ << " {" << attrs << "}";
    body_ << " : (";
    for (size_t i = 0; i < n.operands.size(); ++i) body_ << (i ? ", " : "") << T(n.operands[i].shape());
    body_ << ") -> ";
    if (n.shapes.size() == 1) {
      body_ << T(n.shapes[0]);
    } else {
      body_ << "(";
      for (size_t i = 0; i < n.shapes.size(); ++i) body_ << (i ? ", " : "") << T(n.shapes[i]);
      body_ << ")";
    }
    if (spec_.locations && !n.scope.empty()) body_ << " " << Location(n.scope);
    body_ << "\n";
  }

  // "replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>" of a collective node's attributes.
  static std::string ReplicaGroups(const ir::Attrs& a) {
    auto groups = ir::CollectiveGroups(a);
    util::Text rg;
    rg << "replica_groups = dense<[";
    for (size_t g = 0; g < groups.size(); ++g) {
      rg << (g ? ", " : "") << "[";
      for (size_t k = 0; k < groups[g].size(); ++k) rg << (k ? ", " : "") << groups[g][k];
      rg << "]";
    }
    rg << "]> : tensor<" << groups.size() << "x" << groups[0].size() << "xi64>";
    return rg.str();
  }

  // ", precision_config = [...]" for a non-default mat mul precision (attrs.n of dot/conv nodes).
  static std::string PrecisionConfig(int64_t precision) {
    if (precision <= 0) return "";
    const char* p = precision == 1 ? "HIGH" : "HIGHEST";
    return std::string(", precision_config = [#stablehlo<precision ") + p + ">, #stablehlo<precision " + p + ">]";
  }

  // Appends `loc` to each top-level op line (4-space indent, ending in its result type) lacking one.
  static std::string TagLines(const std::string& chunk, const std::string& loc) {
    std::string out;
    size_t pos = 0;
    while (pos < chunk.size()) {
      size_t end = chunk.find('\n', pos);
      if (end == std::string::npos) end = chunk.size();
      std::string line = chunk.substr(pos, end - pos);
      bool top = line.size() > 5 && line.compare(0, 4, "    ") == 0 && (line[4] == '%' || line[4] == '}');
      if (top && line.back() == '>' && line.find(" loc(") == std::string::npos) line += " " + loc;
      out += line;
      if (end < chunk.size()) out += '\n';
      pos = end + 1;
    }
    return out;
  }

  // "file.py:12" -> loc("file.py":12:0)
  static std::string Location(const std::string& scope) {
    auto colon = scope.rfind(':');
    std::string file = colon == std::string::npos ? scope : scope.substr(0, colon);
    std::string line = colon == std::string::npos ? "0" : scope.substr(colon + 1);
    std::string esc;
    for (char c : file) {
      if (c == '"' || c == '\\') esc += '\\';
      esc += c;
    }
    for (char c : line) if (c < '0' || c > '9') return "loc(\"" + esc + "\")";
    return "loc(\"" + esc + "\":" + (line.empty() ? "0" : line) + ":0)";
  }

  // Emits a standalone scalar constant line and returns its name.
  std::string ScalarConst(double f, int64_t n, DType t) {
    std::string res = Fresh();
    body_ << "    " << res << " = \"stablehlo.constant\"() {value = " << ScalarLiteral(f, n, t) << " : "
          << ScalarT(t) << "} : () -> " << ScalarT(t) << "\n";
    return res;
  }

  std::string InitFor(ir::ReduceKind k, DType t) {
    using R = ir::ReduceKind;
    double inf = std::numeric_limits<double>::infinity();
    bool fl = ir::IsFloating(t);
    switch (k) {
      case R::kSum: return ScalarConst(0, 0, t);
      case R::kProd: return ScalarConst(1, 1, t);
      case R::kAnd: return ScalarConst(1, 1, t);
      case R::kOr: return ScalarConst(0, 0, t);
      case R::kMax: case R::kMaxRunning: return fl ? ScalarConst(-inf, 0, t) : ScalarConst(0, IntMin(t), t);
      case R::kMin: return fl ? ScalarConst(inf, 0, t) : ScalarConst(0, IntMax(t), t);
    }
    return "";
  }
  static int64_t IntMin(DType t) {
    switch (t) {
      case DType::kPred: case DType::kU8: case DType::kU16: case DType::kU32: case DType::kU64: return 0;
      case DType::kS8: return -128;
      case DType::kS16: return -32768;
      case DType::kS32: return std::numeric_limits<int32_t>::min();
      default: return std::numeric_limits<int64_t>::min();
    }
  }
  static int64_t IntMax(DType t) {
    switch (t) {
      case DType::kPred: return 1;
      case DType::kU8: return 255;
      case DType::kU16: return 65535;
      case DType::kU32: return 4294967295LL;
      case DType::kU64: return -1;  // printed as unsigned below
      case DType::kS8: return 127;
      case DType::kS16: return 32767;
      case DType::kS32: return std::numeric_limits<int32_t>::max();
      default: return std::numeric_limits<int64_t>::max();
    }
  }

  static const char* ReducerOp(ir::ReduceKind k, DType t) {
    using R = ir::ReduceKind;
    switch (k) {
      case R::kSum: return t == DType::kPred ? "stablehlo.or" : "stablehlo.add";
      case R::kProd: return t == DType::kPred ? "stablehlo.and" : "stablehlo.multiply";
      case R::kMax: case R::kMaxRunning: return "stablehlo.maximum";
      case R::kMin: return "stablehlo.minimum";
      case R::kAnd: return "stablehlo.and";
      case R::kOr: return "stablehlo.or";
    }
    return "";
  }

  // Eager's max/min propagate NaN; StableHLO's maximum/minimum on this XLA do not. For floats:
  // select(isnan(b), b, select(isnan(a), a, max(a, b))).
  std::string NanMinMaxLines(const std::string& indent, const std::string& res, const char* op, const std::string& a,
                             const std::string& b, const std::string& ty, const std::string& pty) {
    std::string m = "%r" + std::to_string(next_++), na = "%r" + std::to_string(next_++);
    std::string t1 = "%r" + std::to_string(next_++), nb = "%r" + std::to_string(next_++);
    auto isnan = [&](const std::string& r, const std::string& v) {
      return indent + r + " = \"stablehlo.compare\"(" + v + ", " + v +
             ") {comparison_direction = #stablehlo<comparison_direction NE>, compare_type = "
             "#stablehlo<comparison_type FLOAT>} : (" + ty + ", " + ty + ") -> " + pty + "\n";
    };
    return indent + m + " = \"" + op + "\"(" + a + ", " + b + ") : (" + ty + ", " + ty + ") -> " + ty + "\n" +
           isnan(na, a) + indent + t1 + " = \"stablehlo.select\"(" + na + ", " + a + ", " + m + ") : (" + pty +
           ", " + ty + ", " + ty + ") -> " + ty + "\n" + isnan(nb, b) + indent + res + " = \"stablehlo.select\"(" +
           nb + ", " + b + ", " + t1 + ") : (" + pty + ", " + ty + ", " + ty + ") -> " + ty + "\n";
  }

  // Elementwise max/min exactly as eager's CPU kernels: max(a, b) = a > b ? a : b, NaN if either
  // is NaN. Ties give b, which decides the sign of a zero: maximum(-0.0, 0.0) and relu(-0.0) are
  // +0.0 in eager, and stablehlo.maximum returned -0.0.
  void EmitNanMinMax(const Node& n) {
    const Shape& out = n.shapes[0];
    Shape pred(DType::kPred, out.dims);
    std::string res = Fresh();
    names_[&n] = res;
    std::string a = Name(n.operands[0]), b = Name(n.operands[1]), ty = T(out), pty = T(pred);
    std::string gt = "%r" + std::to_string(next_++), pick = "%r" + std::to_string(next_++);
    std::string na = "%r" + std::to_string(next_++);
    auto cmp = [&](const std::string& r, const std::string& x, const std::string& y, const char* dir) {
      return "    " + r + " = \"stablehlo.compare\"(" + x + ", " + y +
             ") {comparison_direction = #stablehlo<comparison_direction " + dir +
             ">, compare_type = #stablehlo<comparison_type FLOAT>} : (" + ty + ", " + ty + ") -> " + pty + "\n";
    };
    auto sel = [&](const std::string& r, const std::string& p, const std::string& x, const std::string& y) {
      return "    " + r + " = \"stablehlo.select\"(" + p + ", " + x + ", " + y + ") : (" + pty + ", " + ty + ", " +
             ty + ") -> " + ty + "\n";
    };
    body_ << cmp(gt, a, b, n.op == Op::kMax ? "GT" : "LT") << sel(pick, gt, a, b) << cmp(na, a, a, "NE")
          << sel(res, na, a, pick);
  }

  // XLA:CPU's log treats a denormal input as the smallest normal number and its rsqrt treats one as
  // zero (f32) or loses precision (f64). With denormals kept (runtime/fp_env.h), an input below the
  // smallest normal is scaled by 2^k first (exact) and the result corrected:
  // log(x) = log(x * 2^k) - k ln 2, rsqrt(x) = rsqrt(x * 2^k) * 2^(k/2). bf16 runs this in f32 (as
  // XLA computes its bf16 log), rounding once at the end. Returns false where nothing is needed.
  bool EmitDenormalSafe(const Node& n) {
    if (!spec_.keep_denormals || (n.op != Op::kLog && n.op != Op::kRsqrt && n.op != Op::kExp)) return false;
    const Shape& out = n.shapes[0];
    const DType phys = Phys(out.dtype);
    const bool bf16 = phys == DType::kBF16 && t_float_type == DType::kF32;
    const bool f32 = phys == DType::kF32 && out.dtype == DType::kF32;
    const bool f64 = phys == DType::kF64 && out.dtype == DType::kF64 && n.op != Op::kLog;
    if (!bf16 && !f32 && !f64) return false;
    const DType ct = f64 ? DType::kF64 : DType::kF32;
    const std::string ty = Shape(ct, out.dims).ToString(), pty = Shape(DType::kPred, out.dims).ToString();
    // One line `%r = "stablehlo.<op>"(args) : (types) -> result` per helper; operands are computed
    // before the line is written (each helper writes to body_).
    auto line = [&](const std::string& op, const std::vector<std::string>& args, const std::string& types,
                    const std::string& result, std::string r = "") {
      if (r.empty()) r = "%r" + std::to_string(next_++);
      body_ << "    " << r << " = \"stablehlo." << op << "\"(";
      for (size_t i = 0; i < args.size(); ++i) body_ << (i ? ", " : "") << args[i];
      body_ << ")" << types << " -> " << result << "\n";
      return r;
    };
    auto splat = [&](double v) {
      return line("constant", {}, " {value = " + ScalarLiteral(v, 0, ct) + " : " + ty + "} : ()", ty);
    };
    auto un = [&](const char* op, const std::string& x) { return line(op, {x}, " : (" + ty + ")", ty); };
    auto bin = [&](const char* op, const std::string& a, const std::string& b) {
      return line(op, {a, b}, " : (" + ty + ", " + ty + ")", ty);
    };
    auto less = [&](const std::string& x, const std::string& c) {
      return line("compare", {x, c},
                  " {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = "
                  "#stablehlo<comparison_type FLOAT>} : (" + ty + ", " + ty + ")",
                  pty);
    };
    auto sel = [&](const std::string& p, const std::string& a, const std::string& b) {
      return line("select", {p, a, b}, " : (" + pty + ", " + ty + ", " + ty + ")", ty);
    };
    std::string x = Name(n.operands[0]);
    if (bf16) x = line("convert", {x}, " : (" + T(out) + ")", ty);
    std::string r;
    if (n.op == Op::kExp) {
      // exp underflows to 0 below the smallest normal result; there exp(x) = exp(x/2)^2 (x/2 exact,
      // one rounding into the denormal range), written exp(h) * select(small, exp(h), 1) so that
      // XLA's simplifier does not turn exp(h) * exp(h) back into exp(2h).
      const std::string small = less(x, splat(f64 ? -708.39641853226408 : -87.336544750553102));
      const std::string e = un("exponential", sel(small, bin("multiply", x, splat(0.5)), x));
      r = bin("multiply", e, sel(small, e, splat(1.0)));
    } else {
      const std::string small = less(x, splat(f64 ? 0x1p-1022 : 0x1p-126));
      const int k = f64 ? 54 : 24;
      const std::string f = un(n.op == Op::kLog ? "log" : "rsqrt", sel(small, bin("multiply", x, splat(std::ldexp(1.0, k))), x));
      const std::string fixed = n.op == Op::kLog ? bin("subtract", f, splat(k * 0.69314718055994530942))
                                                 : bin("multiply", f, splat(std::ldexp(1.0, k / 2)));
      r = sel(small, fixed, f);
    }
    // The node's name: r itself, or r converted back to bf16.
    names_[&n] = bf16 ? line("convert", {r}, " : (" + ty + ")", T(out), Fresh()) : r;
    return true;
  }

  // The region of a reduction of kind k over scalars of type t (NaN-propagating max/min for floats).
  std::string ReducerRegion(ir::ReduceKind k, DType t) {
    if (k == ir::ReduceKind::kMaxRunning) return RunningMaxRegion(t, /*keep=*/false);
    bool minmax = k == ir::ReduceKind::kMax || k == ir::ReduceKind::kMin;
    if (!minmax || !ir::IsFloating(t)) return BinaryRegion(ReducerOp(k, t), t);
    std::string a = "%r" + std::to_string(next_++), b = "%r" + std::to_string(next_++);
    std::string r = "%r" + std::to_string(next_++);
    std::string st = ScalarT(t), pt = ScalarT(DType::kPred);
    return "{\n    ^bb0(" + a + ": " + st + ", " + b + ": " + st + "):\n" +
           NanMinMaxLines("      ", r, ReducerOp(k, t), a, b, st, pt) + "      \"stablehlo.return\"(" + r +
           ") : (" + st + ") -> ()\n    }";
  }

  // A region computing one binary op over scalars of type t.
  std::string BinaryRegion(const char* op, DType t) {
    std::string a = "%r" + std::to_string(next_++), b = "%r" + std::to_string(next_++);
    std::string r = "%r" + std::to_string(next_++);
    std::string st = ScalarT(t);
    return "{\n    ^bb0(" + a + ": " + st + ", " + b + ": " + st + "):\n      " + r + " = \"" + op + "\"(" + a +
           ", " + b + ") : (" + st + ", " + st + ") -> " + st + "\n      \"stablehlo.return\"(" + r + ") : (" +
           st + ") -> ()\n    }";
  }

  void EmitNode(const Node& n) {
    const auto& A = n.attrs;
    const Shape& out = n.shapes[0];
    switch (n.op) {
      case Op::kConstant:
        Line(n, "stablehlo.constant", "value = " + ScalarLiteral(A.f, A.n, out.dtype) + " : " + T(out));
        return;
      case Op::kIota:
        Line(n, "stablehlo.iota", "iota_dimension = " + std::to_string(A.ints[0][0]) + " : i64");
        return;
      case Op::kConvert: {
        Line(n, "stablehlo.convert", "");
        return;
      }
      case Op::kLog: case Op::kRsqrt: case Op::kExp:
        if (EmitDenormalSafe(n)) return;
        Line(n, std::string("stablehlo.") + ir::OpName(n.op), "");
        return;
      case Op::kNeg: case Op::kAbs: case Op::kSqrt:
      case Op::kSin: case Op::kCos: case Op::kTan: case Op::kTanh: case Op::kLogistic: case Op::kFloor:
      case Op::kCeil: case Op::kRoundEven: case Op::kRoundAfz: case Op::kSign: case Op::kLog1p:
      case Op::kExpm1: case Op::kNot: case Op::kIsFinite: case Op::kCbrt: case Op::kReal: case Op::kImag:
      case Op::kAdd: case Op::kSub: case Op::kMul: case Op::kDiv: case Op::kRem: case Op::kPow:
      case Op::kAnd: case Op::kOr: case Op::kXor: case Op::kAtan2:
      case Op::kShiftLeft: case Op::kShiftRightArithmetic: case Op::kShiftRightLogical:
      case Op::kSelect: case Op::kClamp: case Op::kReshape:
        Line(n, std::string("stablehlo.") + ir::OpName(n.op), "");
        return;
      case Op::kMax: case Op::kMin:
        if (ir::IsFloating(out.dtype)) {
          EmitNanMinMax(n);
          return;
        }
        Line(n, std::string("stablehlo.") + ir::OpName(n.op), "");
        return;
      case Op::kErf: Line(n, "chlo.erf", ""); return;
      case Op::kErfInv: Line(n, "chlo.erf_inv", ""); return;
      case Op::kLgamma: Line(n, "chlo.lgamma", ""); return;
      case Op::kDigamma: Line(n, "chlo.digamma", ""); return;
      case Op::kErfc: Line(n, "chlo.erfc", ""); return;
      case Op::kBesselI1e: Line(n, "chlo.bessel_i1e", ""); return;
      case Op::kPolygamma: Line(n, "chlo.polygamma", ""); return;
      case Op::kNextAfter: Line(n, "chlo.next_after", ""); return;
      case Op::kZeta: Line(n, "chlo.zeta", ""); return;
      case Op::kBitcastConvert: Line(n, "stablehlo.bitcast_convert", ""); return;
      case Op::kCholesky: Line(n, "stablehlo.cholesky", A.n ? "lower = true" : "lower = false"); return;
      case Op::kEigh: {
        // XLA's EighExpander reads "lower,sort_eigenvalues,max_iter,tol"; results (vectors, values).
        util::Text cfg;  // (not printf's %e: the C locale's decimal point must not reach XLA)
        cfg << (A.n ? 1 : 0) << ",1," << A.ints[0][0] << ",";
        cfg.Append(A.f, std::chars_format::scientific, 9);
        Line(n, "stablehlo.custom_call", "backend_config = \"" + cfg.str() + "\", call_target_name = \"Eigh\"");
        return;
      }
      case Op::kTriangularSolve: {
        auto flag = [](int64_t v) { return v ? std::string("true") : std::string("false"); };
        const auto& f = A.ints[0];
        Line(n, "stablehlo.triangular_solve",
             "left_side = " + flag(f[0]) + ", lower = " + flag(f[1]) + ", transpose_a = #stablehlo<transpose " +
                 (f[3] ? "TRANSPOSE" : "NO_TRANSPOSE") + ">, unit_diagonal = " + flag(f[2]));
        return;
      }
      case Op::kCompare:
        Line(n, "stablehlo.compare", std::string("comparison_direction = #stablehlo<comparison_direction ") +
                                         DirName(A.n) + ">, compare_type = #stablehlo<comparison_type " +
                                         CompareType(n.operands[0].dtype()) + ">");
        return;
      case Op::kBroadcastInDim:
        Line(n, "stablehlo.broadcast_in_dim", "broadcast_dimensions = " + I64Array(A.ints[0]));
        return;
      case Op::kTranspose:
        Line(n, "stablehlo.transpose", "permutation = " + I64Array(A.ints[0]));
        return;
      case Op::kSlice:
        Line(n, "stablehlo.slice", "start_indices = " + I64Array(A.ints[0]) + ", limit_indices = " +
                                       I64Array(A.ints[1]) + ", strides = " + I64Array(A.ints[2]));
        return;
      case Op::kConcatenate:
        Line(n, "stablehlo.concatenate", "dimension = " + std::to_string(A.ints[0][0]) + " : i64");
        return;
      case Op::kPad:
        Line(n, "stablehlo.pad", "edge_padding_low = " + I64Array(A.ints[0]) + ", edge_padding_high = " +
                                     I64Array(A.ints[1]) + ", interior_padding = " + I64Array(A.ints[2]));
        return;
      case Op::kReverse:
        Line(n, "stablehlo.reverse", "dimensions = " + I64Array(A.ints[0]));
        return;
      case Op::kDynamicSlice:
        Line(n, "stablehlo.dynamic_slice", "slice_sizes = " + I64Array(A.ints[0]));
        return;
      case Op::kDynamicUpdateSlice:
        Line(n, "stablehlo.dynamic_update_slice", "");
        return;
      case Op::kReduce: EmitReduce(n); return;
      case Op::kArgReduce: EmitArgReduce(n); return;
      case Op::kReduceWindow: {
        auto kind = static_cast<ir::ReduceKind>(A.n);
        std::string region = ReducerRegion(kind, out.dtype);
        Line(n, "stablehlo.reduce_window",
             "window_dimensions = " + I64Array(A.ints[0]) + ", window_strides = " + I64Array(A.ints[1]) +
                 ", base_dilations = " + I64Array(A.ints[2]) + ", window_dilations = " + I64Array(A.ints[3]) +
                 ", padding = " + PaddingAttr(A.ints[4]),
             region);
        return;
      }
      case Op::kCumulative: EmitCumulative(n); return;
      case Op::kArgReduceWindow: EmitArgMaxWindow(n); return;
      case Op::kSelectAndScatter: EmitSelectAndScatter(n); return;
      case Op::kSort: EmitSort(n); return;
      case Op::kDotGeneral:
        Line(n, "stablehlo.dot_general",
             "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = " + List(A.ints[0]) +
                 ", rhs_batching_dimensions = " + List(A.ints[1]) + ", lhs_contracting_dimensions = " +
                 List(A.ints[2]) + ", rhs_contracting_dimensions = " + List(A.ints[3]) + ">" +
                 PrecisionConfig(A.n));
        return;
      case Op::kConvolution: {
        int nsp = static_cast<int>(A.ints[0].size());
        std::string dn = A.s;
        if (dn.empty()) {
          std::string sp;
          for (int i = 0; i < nsp; ++i) sp += ", " + std::to_string(i);
          dn = "[b, f" + sp + "]x[o, i" + sp + "]->[b, f" + sp + "]";
        }
        Line(n, "stablehlo.convolution",
             "batch_group_count = " + std::to_string(A.ints[4][1]) + " : i64, dimension_numbers = #stablehlo.conv<" +
                 dn + ">, feature_group_count = " + std::to_string(A.ints[4][0]) + " : i64, lhs_dilation = " +
                 I64Array(A.ints[2]) + ", padding = " + PaddingAttr(A.ints[1]) + ", rhs_dilation = " +
                 I64Array(A.ints[3]) + ", window_strides = " + I64Array(A.ints[0]) + PrecisionConfig(A.n));
        return;
      }
      case Op::kGather:
        Line(n, "stablehlo.gather",
             "dimension_numbers = #stablehlo.gather<offset_dims = " + List(A.ints[0]) + ", collapsed_slice_dims = " +
                 List(A.ints[1]) + ", start_index_map = " + List(A.ints[2]) + ", index_vector_dim = " +
                 std::to_string(A.ints[3][0]) + ">, indices_are_sorted = false, slice_sizes = " + I64Array(A.ints[4]));
        return;
      case Op::kScatter: {
        DType t = out.dtype;
        std::string region;
        if (A.n == 1) {
          region = BinaryRegion(t == DType::kPred ? "stablehlo.or" : "stablehlo.add", t);
        } else if (A.n == 2) {
          region = BinaryRegion(t == DType::kPred ? "stablehlo.and" : "stablehlo.multiply", t);
        } else if (A.n == 3 || A.n == 4) {  // max / min (NaN-propagating for floats)
          region = ReducerRegion(A.n == 3 ? ir::ReduceKind::kMax : ir::ReduceKind::kMin, t);
        } else {
          std::string a = "%r" + std::to_string(next_++), b = "%r" + std::to_string(next_++);
          std::string st = ScalarT(t);
          region = "{\n    ^bb0(" + a + ": " + st + ", " + b + ": " + st + "):\n      \"stablehlo.return\"(" + b +
                   ") : (" + st + ") -> ()\n    }";
        }
        Line(n, "stablehlo.scatter",
             "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = " +
                 List(A.ints[0]) + ", inserted_window_dims = " + List(A.ints[1]) +
                 ", scatter_dims_to_operand_dims = " + List(A.ints[2]) + ", index_vector_dim = " +
                 std::to_string(A.ints[3][0]) + ">, unique_indices = false",
             region);
        return;
      }
      case Op::kRngBitGenerator:
        Line(n, "stablehlo.rng_bit_generator", "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>");
        return;
      case Op::kOptimizationBarrier:
        Line(n, "stablehlo.optimization_barrier", "");
        return;
      case Op::kAllReduce: {
        auto kind = static_cast<ir::ReduceKind>(ir::CollectiveParams(A)[0]);
        // A plain reducer: collectives accept only a single combining op (no NaN-propagating select).
        Line(n, "stablehlo.all_reduce", ReplicaGroups(A), BinaryRegion(ReducerOp(kind, out.dtype), out.dtype));
        return;
      }
      case Op::kAllGather:
        Line(n, "stablehlo.all_gather",
             "all_gather_dim = " + std::to_string(ir::CollectiveParams(A)[0]) + " : i64, " + ReplicaGroups(A));
        return;
      case Op::kReduceScatter: {
        const auto& p = ir::CollectiveParams(A);
        auto kind = static_cast<ir::ReduceKind>(p[0]);
        Line(n, "stablehlo.reduce_scatter",
             ReplicaGroups(A) + ", scatter_dimension = " + std::to_string(p[1]) + " : i64",
             BinaryRegion(ReducerOp(kind, out.dtype), out.dtype));
        return;
      }
      case Op::kAllToAll: {
        const auto& p = ir::CollectiveParams(A);
        Line(n, "stablehlo.all_to_all",
             "concat_dimension = " + std::to_string(p[1]) + " : i64, " + ReplicaGroups(A) +
                 ", split_count = " + std::to_string(p[2]) + " : i64, split_dimension = " + std::to_string(p[0]) +
                 " : i64");
        return;
      }
      case Op::kHostCall:
        // A typed FFI call (api_version 4): the parameters travel as one i64 array attribute.
        Line(n, "stablehlo.custom_call",
             "api_version = 4 : i32, backend_config = {p = " + I64Array(A.ints[0]) + "}, call_target_name = \"" +
                 ir::HostKernelTarget(A.s) + "\"");
        return;
      case Op::kSharding:
        Line(n, "stablehlo.custom_call", "call_target_name = \"Sharding\", mhlo.sharding = \"" + A.s + "\"");
        return;
      case Op::kWhile:
        Line(n, "stablehlo.while", "", EmitRegion(*n.regions[0]) + ", " + EmitRegion(*n.regions[1]));
        return;
      case Op::kParameter:
        throw std::runtime_error(
            "a value computed inside a loop body (while_loop / fori_loop / scan) is used outside its loop: "
            "only the loop's results can be");
      case Op::kFmaF32:
        EmitFmaF32(n);
        return;
      case Op::kDeviceData:
      case Op::kNumOps:
        break;
    }
    throw std::runtime_error(std::string("no StableHLO emitter for op ") + ir::OpName(n.op));
  }

  // round_f32(a * b + c), correctly rounded: the product is exact in float64 (24 + 24 bits); the sum
  // is rounded to odd there (TwoSum's error term says whether it was inexact, and an inexact sum
  // whose last bit is even moves one ulp towards the error), and rounding a round-to-odd float64 to
  // float32 is the correctly rounded result (53 >= 24 + 2 bits). Infinities and NaN keep the plain
  // sum. XLA does not reassociate these float operations.
  void EmitFmaF32(const Node& n) {
    const Shape& out = n.shapes[0];
    const std::string t32 = T(out), t64 = Shape(DType::kF64, out.dims).ToString(),
                      ti = Shape(DType::kS64, out.dims).ToString(), tp = Shape(DType::kPred, out.dims).ToString();
    auto line = [&](const std::string& op, const std::vector<std::string>& args, const std::string& types,
                    const std::string& result) {
      std::string r = "%r" + std::to_string(next_++);
      body_ << "    " << r << " = \"stablehlo." << op << "\"(";
      for (size_t i = 0; i < args.size(); ++i) body_ << (i ? ", " : "") << args[i];
      body_ << ")" << types << " -> " << result << "\n";
      return r;
    };
    auto to64 = [&](const Value& v) { return line("convert", {Name(v)}, " : (" + t32 + ")", t64); };
    auto bin = [&](const char* op, const std::string& a, const std::string& b, const std::string& t) {
      return line(op, {a, b}, " : (" + t + ", " + t + ")", t);
    };
    auto splat = [&](double v, DType d, const std::string& t) {
      return line("constant", {}, " {value = " + ScalarLiteral(v, static_cast<int64_t>(v), d) + " : " + t + "} : ()", t);
    };
    auto cmp = [&](const char* dir, const char* kind, const std::string& a, const std::string& b, const std::string& t) {
      return line("compare", {a, b},
                  std::string(" {comparison_direction = #stablehlo<comparison_direction ") + dir +
                      ">, compare_type = #stablehlo<comparison_type " + kind + ">} : (" + t + ", " + t + ")",
                  tp);
    };
    const std::string a = to64(n.operands[0]), b = to64(n.operands[1]), c = to64(n.operands[2]);
    const std::string p = bin("multiply", a, b, t64), sum = bin("add", p, c, t64);
    const std::string bb = bin("subtract", sum, p, t64);
    const std::string err = bin("add", bin("subtract", p, bin("subtract", sum, bb, t64), t64),
                                bin("subtract", c, bb, t64), t64);
    const std::string bits = line("bitcast_convert", {sum}, " : (" + t64 + ")", ti);
    const std::string one = splat(1, DType::kS64, ti), zero_i = splat(0, DType::kS64, ti), zero = splat(0, DType::kF64, t64);
    const std::string even = cmp("EQ", "SIGNED", bin("and", bits, one, ti), zero_i, ti);
    const std::string inexact = cmp("NE", "FLOAT", err, zero, t64);
    const std::string finite = line("is_finite", {sum}, " : (" + t64 + ")", tp);
    const std::string nudge = bin("and", bin("and", even, inexact, tp), finite, tp);
    // the error has the sum's sign: away from zero (+1 in the bits), else towards it (-1)
    const std::string away = line("not", {bin("xor", cmp("GT", "FLOAT", err, zero, t64), cmp("GT", "FLOAT", sum, zero, t64), tp)},
                                  " : (" + tp + ")", tp);
    const std::string step = line("select", {away, one, splat(-1, DType::kS64, ti)}, " : (" + tp + ", " + ti + ", " + ti + ")", ti);
    const std::string moved = line("select", {nudge, bin("add", bits, step, ti), bits}, " : (" + tp + ", " + ti + ", " + ti + ")", ti);
    const std::string odd = line("bitcast_convert", {moved}, " : (" + ti + ")", t64);
    names_[&n] = line("convert", {odd}, " : (" + t64 + ")", t32);
  }

  // A region (control_flow.h) as an MLIR region: its parameters are the block arguments; its nodes
  // are emitted with their own names (a fresh scope), ending in stablehlo.return of its results.
  std::string EmitRegion(const ir::Region& r) {
    std::unordered_map<const Node*, std::string> outer_names;
    std::swap(outer_names, names_);
    util::Text outer_body;
    std::swap(outer_body, body_);
    std::string head = "{\n    ^bb0(";
    for (size_t i = 0; i < r.params.size(); ++i) {
      std::string a = "%a" + std::to_string(next_++);
      names_[r.params[i].get()] = a;
      head += (i ? ", " : "") + a + ": " + T(r.params[i]->shapes[0]);
    }
    head += "):\n";
    std::string error;
    try {
      for (const Node* n : ir::RegionPostOrder(r)) {
        if (n->op == Op::kParameter) {
          if (!names_.count(n)) throw std::runtime_error("while: a loop region reads a parameter of another loop");
          continue;
        }
        if (n->op == Op::kDeviceData) throw std::runtime_error("while: a loop region reads device data directly");
        EmitNode(*n);
      }
    } catch (...) {
      std::swap(outer_names, names_);
      std::swap(outer_body, body_);
      throw;
    }
    std::string ret = "    \"stablehlo.return\"(";
    for (size_t i = 0; i < r.results.size(); ++i) ret += (i ? ", " : "") + Name(r.results[i]);
    ret += ") : (";
    for (size_t i = 0; i < r.results.size(); ++i) ret += (i ? ", " : "") + T(r.results[i].shape());
    ret += ") -> ()\n";
    std::string text = head + body_.str() + ret + "    }";
    std::swap(outer_names, names_);
    std::swap(outer_body, body_);
    return text;
  }

  void EmitReduce(const Node& n) {
    auto kind = static_cast<ir::ReduceKind>(n.attrs.n);
    DType t = n.shapes[0].dtype;
    std::string init = InitFor(kind, t);
    std::string region = ReducerRegion(kind, t);
    std::string res = Fresh();
    names_[&n] = res;
    const Value& x = n.operands[0];
    body_ << "    " << res << " = \"stablehlo.reduce\"(" << Name(x) << ", " << init << ") (" << region
          << ") {dimensions = " << I64Array(n.attrs.ints[0]) << "} : (" << T(x.shape()) << ", " << ScalarT(t)
          << ") -> " << T(n.shapes[0]) << "\n";
  }

  void EmitArgReduce(const Node& n) {
    const Value& x = n.operands[0];
    DType t = x.dtype();
    int64_t dim = n.attrs.ints[0][0];
    bool is_max = static_cast<ir::ArgKind>(n.attrs.n) == ir::ArgKind::kArgMax;
    Shape idx_shape(DType::kS64, x.dims());
    std::string iota = Fresh();
    body_ << "    " << iota << " = \"stablehlo.iota\"() {iota_dimension = " << dim << " : i64} : () -> "
          << T(idx_shape) << "\n";
    std::string initv = InitFor(is_max ? ir::ReduceKind::kMax : ir::ReduceKind::kMin, t);
    std::string initi = ScalarConst(0, 0, DType::kS64);
    std::string st = ScalarT(t), it = ScalarT(DType::kS64), pt = ScalarT(DType::kPred);
    auto r = [&]() { return "%r" + std::to_string(next_++); };
    std::string av = r(), ai = r(), bv = r(), bi = r();
    std::string cmp = r(), eq = r(), lti = r(), tie = r(), pick = r(), nan = r(), pick2 = r(), v = r(), i = r();
    std::string ct = CompareType(t);
    util::Text rg;
    rg << "{\n    ^bb0(" << av << ": " << st << ", " << ai << ": " << it << ", " << bv << ": " << st << ", " << bi
       << ": " << it << "):\n";
    auto cmpline = [&](const std::string& res, const std::string& a, const std::string& b, const char* dir,
                       const std::string& ty, const std::string& ctype) {
      rg << "      " << res << " = \"stablehlo.compare\"(" << a << ", " << b
         << ") {comparison_direction = #stablehlo<comparison_direction " << dir
         << ">, compare_type = #stablehlo<comparison_type " << ctype << ">} : (" << ty << ", " << ty << ") -> "
         << pt << "\n";
    };
    cmpline(cmp, av, bv, is_max ? "GT" : "LT", st, ct);
    cmpline(eq, av, bv, "EQ", st, ct);
    cmpline(lti, ai, bi, "LT", it, "SIGNED");
    rg << "      " << tie << " = \"stablehlo.and\"(" << eq << ", " << lti << ") : (" << pt << ", " << pt << ") -> " << pt << "\n";
    rg << "      " << pick << " = \"stablehlo.or\"(" << cmp << ", " << tie << ") : (" << pt << ", " << pt << ") -> " << pt << "\n";
    if (ir::IsFloating(t)) {
      cmpline(nan, av, av, "NE", st, ct);  // NaN wins, as in eager
      rg << "      " << pick2 << " = \"stablehlo.or\"(" << pick << ", " << nan << ") : (" << pt << ", " << pt << ") -> " << pt << "\n";
    } else {
      pick2 = pick;
    }
    rg << "      " << v << " = \"stablehlo.select\"(" << pick2 << ", " << av << ", " << bv << ") : (" << pt << ", "
       << st << ", " << st << ") -> " << st << "\n";
    rg << "      " << i << " = \"stablehlo.select\"(" << pick2 << ", " << ai << ", " << bi << ") : (" << pt << ", "
       << it << ", " << it << ") -> " << it << "\n";
    rg << "      \"stablehlo.return\"(" << v << ", " << i << ") : (" << st << ", " << it << ") -> ()\n    }";
    std::string res = Fresh();
    names_[&n] = res;
    body_ << "    " << res << ":2 = \"stablehlo.reduce\"(" << Name(x) << ", " << iota << ", " << initv << ", "
          << initi << ") (" << rg.str() << ") {dimensions = array<i64: " << dim << ">} : (" << T(x.shape())
          << ", " << T(idx_shape) << ", " << st << ", " << it << ") -> (" << T(n.shapes[0]) << ", "
          << T(n.shapes[1]) << ")\n";
  }

  // Variadic reduce_window over (values, flat indices): max value, first index on ties.
  void EmitArgMaxWindow(const Node& n) {
    const Value& x = n.operands[0];
    DType t = x.dtype();
    const auto& A = n.attrs;
    int rank = x.rank();
    int idx_dims = static_cast<int>(A.ints[4][0]);
    Shape idx_shape(DType::kS64, x.dims());
    // Flat index over the trailing idx_dims dims: sum_i iota_i * stride_i.
    std::string acc;
    int64_t stride = 1;
    for (int d = rank - 1; d >= rank - idx_dims; --d) {
      std::string io = Fresh();
      body_ << "    " << io << " = \"stablehlo.iota\"() {iota_dimension = " << d << " : i64} : () -> " << T(idx_shape) << "\n";
      std::string term = io;
      if (stride != 1) {
        std::string c = ScalarConst(0, stride, DType::kS64);
        std::string b = Fresh();
        body_ << "    " << b << " = \"stablehlo.broadcast_in_dim\"(" << c << ") {broadcast_dimensions = array<i64>} : ("
              << ScalarT(DType::kS64) << ") -> " << T(idx_shape) << "\n";
        term = Fresh();
        body_ << "    " << term << " = \"stablehlo.multiply\"(" << io << ", " << b << ") : (" << T(idx_shape) << ", "
              << T(idx_shape) << ") -> " << T(idx_shape) << "\n";
      }
      if (acc.empty()) {
        acc = term;
      } else {
        std::string sum = Fresh();
        body_ << "    " << sum << " = \"stablehlo.add\"(" << acc << ", " << term << ") : (" << T(idx_shape) << ", "
              << T(idx_shape) << ") -> " << T(idx_shape) << "\n";
        acc = sum;
      }
      stride *= x.dims()[d];
    }
    std::string initv = InitFor(ir::ReduceKind::kMax, t);
    std::string initi = ScalarConst(0, -1, DType::kS64);
    std::string st = ScalarT(t), it = ScalarT(DType::kS64), pt = ScalarT(DType::kPred);
    auto r = [&]() { return "%r" + std::to_string(next_++); };
    std::string av = r(), ai = r(), bv = r(), bi = r(), gt = r(), eq = r(), lt = r(), tie = r(), pick = r(),
                binvalid = r(), pick3 = r(), v = r(), i = r(), minus1 = r(), ainvalid = r(), avalid = r(),
                pick_b_inv = r();
    const char* ct = CompareType(t);
    util::Text rg;
    auto cmp = [&](const std::string& res, const std::string& a, const std::string& b, const char* dir,
                   const std::string& ty, const char* ctype) {
      rg << "      " << res << " = \"stablehlo.compare\"(" << a << ", " << b
         << ") {comparison_direction = #stablehlo<comparison_direction " << dir
         << ">, compare_type = #stablehlo<comparison_type " << ctype << ">} : (" << ty << ", " << ty << ") -> " << pt << "\n";
    };
    auto bin = [&](const std::string& res, const char* op, const std::string& a, const std::string& b) {
      rg << "      " << res << " = \"stablehlo." << op << "\"(" << a << ", " << b << ") : (" << pt << ", " << pt
         << ") -> " << pt << "\n";
    };
    auto sel = [&](const std::string& res, const std::string& c, const std::string& a, const std::string& b) {
      rg << "      " << res << " = \"stablehlo.select\"(" << c << ", " << a << ", " << b << ") : (" << pt << ", " << pt
         << ", " << pt << ") -> " << pt << "\n";
    };
    // Eager's scan (a later element replaces the running max when greater or NaN) as an
    // order-free rule over flat indices, which grow in scan order: with a NaN in either, the NaN
    // of the larger index wins; else the greater value, ties to the smaller index. Invalid entries
    // (init and padding: index -1) never win over a real element, so a window of -inf picks its
    // first element as eager does.
    rg << "{\n    ^bb0(" << av << ": " << st << ", " << ai << ": " << it << ", " << bv << ": " << st << ", " << bi << ": "
       << it << "):\n";
    cmp(gt, av, bv, "GT", st, ct);
    cmp(eq, av, bv, "EQ", st, ct);
    cmp(lt, ai, bi, "LT", it, "SIGNED");
    rg << "      " << minus1 << " = \"stablehlo.constant\"() {value = dense<-1> : " << it << "} : () -> " << it << "\n";
    cmp(binvalid, bi, minus1, "EQ", it, "SIGNED");
    cmp(ainvalid, ai, minus1, "EQ", it, "SIGNED");
    rg << "      " << avalid << " = \"stablehlo.not\"(" << ainvalid << ") : (" << pt << ") -> " << pt << "\n";
    std::string tie0 = r();
    bin(tie0, "and", eq, lt);
    bin(tie, "and", tie0, avalid);
    bin(pick, "or", gt, tie);
    bin(pick_b_inv, "and", binvalid, avalid);
    if (ir::IsFloating(t)) {
      std::string na = r(), nb = r(), anynan = r(), notnb = r(), gti = r(), later = r(), nanpick = r(), ordinary = r();
      cmp(na, av, av, "NE", st, ct);
      cmp(nb, bv, bv, "NE", st, ct);
      bin(anynan, "or", na, nb);
      rg << "      " << notnb << " = \"stablehlo.not\"(" << nb << ") : (" << pt << ") -> " << pt << "\n";
      cmp(gti, ai, bi, "GT", it, "SIGNED");
      bin(later, "or", notnb, gti);
      bin(nanpick, "and", na, later);
      bin(ordinary, "or", pick, pick_b_inv);
      sel(pick3, anynan, nanpick, ordinary);
    } else {
      bin(pick3, "or", pick, pick_b_inv);
    }
    rg << "      " << v << " = \"stablehlo.select\"(" << pick3 << ", " << av << ", " << bv << ") : (" << pt << ", " << st << ", " << st << ") -> " << st << "\n";
    rg << "      " << i << " = \"stablehlo.select\"(" << pick3 << ", " << ai << ", " << bi << ") : (" << pt << ", " << it << ", " << it << ") -> " << it << "\n";
    rg << "      \"stablehlo.return\"(" << v << ", " << i << ") : (" << st << ", " << it << ") -> ()\n    }";
    std::vector<int64_t> ones(rank, 1);
    std::string res = Fresh();
    names_[&n] = res;
    body_ << "    " << res << ":2 = \"stablehlo.reduce_window\"(" << Name(x) << ", " << acc << ", " << initv << ", " << initi
          << ") (" << rg.str() << ") {base_dilations = " << I64Array(ones) << ", padding = " << PaddingAttr(A.ints[3])
          << ", window_dilations = " << I64Array(A.ints[2]) << ", window_dimensions = " << I64Array(A.ints[0])
          << ", window_strides = " << I64Array(A.ints[1]) << "} : (" << T(x.shape()) << ", " << T(idx_shape) << ", "
          << st << ", " << it << ") -> (" << T(n.shapes[0]) << ", " << T(n.shapes[1]) << ")\n";
  }

  void EmitCumulative(const Node& n) {
    const Value& x = n.operands[0];
    auto kind = static_cast<ir::ReduceKind>(n.attrs.n);
    DType t = x.dtype();
    int64_t dim = n.attrs.ints[0][0];
    int rank = x.rank();
    std::vector<int64_t> window(rank, 1), strides(rank, 1), ones(rank, 1), pad(2 * rank, 0);
    window[dim] = x.dims()[dim];
    pad[2 * dim] = x.dims()[dim] - 1;
    std::string init = InitFor(kind, t);
    std::string region = ReducerRegion(kind, t);
    std::string res = Fresh();
    names_[&n] = res;
    body_ << "    " << res << " = \"stablehlo.reduce_window\"(" << Name(x) << ", " << init << ") (" << region
          << ") {window_dimensions = " << I64Array(window) << ", window_strides = " << I64Array(strides)
          << ", base_dilations = " << I64Array(ones) << ", window_dilations = " << I64Array(ones)
          << ", padding = " << PaddingAttr(pad) << "} : (" << T(x.shape()) << ", " << ScalarT(t) << ") -> "
          << T(n.shapes[0]) << "\n";
  }

  // Max pooling's running max as a region over (a = accumulator / selected, b = next element): b
  // replaces a when b > a or b is NaN (eager's CPU kernels: ties keep the earlier element, a NaN
  // wins and stays). keep = false: the region returns the winner (reduce_window); keep = true: it
  // returns whether a stays selected (select_and_scatter's select).
  std::string RunningMaxRegion(DType t, bool keep) {
    std::string st = ScalarT(t), pt = ScalarT(DType::kPred);
    auto r = [&]() { return "%r" + std::to_string(next_++); };
    std::string a = r(), b = r(), gt = r(), take = gt, res = r();
    std::string s = "{\n    ^bb0(" + a + ": " + st + ", " + b + ": " + st + "):\n";
    auto cmp = [&](const std::string& out, const std::string& x, const std::string& y, const char* dir) {
      s += "      " + out + " = \"stablehlo.compare\"(" + x + ", " + y +
           ") {comparison_direction = #stablehlo<comparison_direction " + dir +
           ">, compare_type = #stablehlo<comparison_type " + CompareType(t) + ">} : (" + st + ", " + st + ") -> " +
           pt + "\n";
    };
    cmp(gt, b, a, "GT");
    if (ir::IsFloating(t)) {
      std::string nb = r();
      take = r();
      cmp(nb, b, b, "NE");
      s += "      " + take + " = \"stablehlo.or\"(" + gt + ", " + nb + ") : (" + pt + ", " + pt + ") -> " + pt + "\n";
    }
    if (keep) {
      s += "      " + res + " = \"stablehlo.not\"(" + take + ") : (" + pt + ") -> " + pt + "\n";
      return s + "      \"stablehlo.return\"(" + res + ") : (" + pt + ") -> ()\n    }";
    }
    s += "      " + res + " = \"stablehlo.select\"(" + take + ", " + b + ", " + a + ") : (" + pt + ", " + st + ", " +
         st + ") -> " + st + "\n";
    return s + "      \"stablehlo.return\"(" + res + ") : (" + st + ") -> ()\n    }";
  }

  // select_and_scatter selecting as eager's max pooling does (RunningMaxRegion). No row builds it
  // today: XLA:CPU rewrites it into a variadic reduce_window, slower than the scatter from indices
  // that max pooling's backward uses (see MaxPoolTaps in ops/rows_conv.cc).
  void EmitSelectAndScatter(const Node& n) {
    DType t = n.operands[0].dtype();
    std::string select = RunningMaxRegion(t, /*keep=*/true);
    std::string scatter = BinaryRegion("stablehlo.add", n.operands[1].dtype());
    Line(n, "stablehlo.select_and_scatter",
         "padding = " + PaddingAttr(n.attrs.ints[2]) + ", window_dimensions = " + I64Array(n.attrs.ints[0]) +
             ", window_strides = " + I64Array(n.attrs.ints[1]),
         select + ", " + scatter);
  }

  void EmitSort(const Node& n) {
    bool descending = n.attrs.n & 1;
    bool stable = n.attrs.n & 2;
    util::Text rg;
    std::vector<std::string> args;
    rg << "{\n    ^bb0(";
    for (size_t i = 0; i < n.operands.size(); ++i) {
      std::string st = ScalarT(n.operands[i].dtype());
      std::string a = "%r" + std::to_string(next_++), b = "%r" + std::to_string(next_++);
      args.push_back(a);
      args.push_back(b);
      rg << (i ? ", " : "") << a << ": " << st << ", " << b << ": " << st;
    }
    DType t0 = n.operands[0].dtype();
    std::string st0 = ScalarT(t0), pt = ScalarT(DType::kPred);
    std::string c = "%r" + std::to_string(next_++);
    auto cmp = [&](const std::string& r, const std::string& a, const std::string& b, const char* dir, const char* ct) {
      rg << "      " << r << " = \"stablehlo.compare\"(" << a << ", " << b
         << ") {comparison_direction = #stablehlo<comparison_direction " << dir
         << ">, compare_type = #stablehlo<comparison_type " << ct << ">} : (" << st0 << ", " << st0 << ") -> " << pt
         << "\n";
    };
    rg << "):\n";
    if (ir::IsFloating(t0)) {
      // Eager: NaN is the largest value (last ascending, first descending); -0.0 equals +0.0.
      const std::string& a = args[0];
      const std::string& b = args[1];
      std::string lt = "%r" + std::to_string(next_++), nan_hi = "%r" + std::to_string(next_++);
      std::string nan_lo = "%r" + std::to_string(next_++), not_lo = "%r" + std::to_string(next_++);
      std::string nan_rule = "%r" + std::to_string(next_++);
      const std::string& hi = descending ? a : b;  // the operand that must be NaN for "a before b"
      const std::string& lo = descending ? b : a;
      cmp(lt, a, b, descending ? "GT" : "LT", "FLOAT");
      cmp(nan_hi, hi, hi, "NE", "FLOAT");
      cmp(nan_lo, lo, lo, "NE", "FLOAT");
      rg << "      " << not_lo << " = \"stablehlo.not\"(" << nan_lo << ") : (" << pt << ") -> " << pt << "\n";
      rg << "      " << nan_rule << " = \"stablehlo.and\"(" << nan_hi << ", " << not_lo << ") : (" << pt << ", " << pt
         << ") -> " << pt << "\n";
      rg << "      " << c << " = \"stablehlo.or\"(" << lt << ", " << nan_rule << ") : (" << pt << ", " << pt << ") -> "
         << pt << "\n";
    } else {
      cmp(c, args[0], args[1], descending ? "GT" : "LT", CompareType(t0));
    }
    rg << "      \"stablehlo.return\"(" << c << ") : (" << pt << ") -> ()\n    }";
    Line(n, "stablehlo.sort",
         "dimension = " + std::to_string(n.attrs.ints[0][0]) + " : i64, is_stable = " + (stable ? "true" : "false"),
         rg.str());
  }

  const ModuleSpec& spec_;
  std::unordered_map<const Node*, std::string> names_;
  util::Text body_;
  int64_t next_ = 0;
};

}  // namespace

std::string ScalarLiteral(double f, int64_t n, DType t) {
  char buf[64];
  switch (Phys(t)) {
    case DType::kPred: return (n != 0 || f != 0) ? "dense<true>" : "dense<false>";
    case DType::kF32: {
      float v = static_cast<float>(f);
      uint32_t b;
      std::memcpy(&b, &v, 4);
      std::snprintf(buf, sizeof buf, "dense<0x%08X>", b);
      return buf;
    }
    case DType::kF64: {
      uint64_t b;
      std::memcpy(&b, &f, 8);
      std::snprintf(buf, sizeof buf, "dense<0x%016llX>", (unsigned long long)b);
      return buf;
    }
    case DType::kF16:
      std::snprintf(buf, sizeof buf, "dense<0x%04X>", FloatToHalfBits(static_cast<float>(f)));
      return buf;
    case DType::kBF16:
      std::snprintf(buf, sizeof buf, "dense<0x%04X>", FloatToBf16Bits(static_cast<float>(f)));
      return buf;
    case DType::kF8E4M3FN:  // eager converts a double through float
      std::snprintf(buf, sizeof buf, "dense<0x%02X>", FloatToF8E4M3FNBits(static_cast<float>(f)));
      return buf;
    case DType::kF8E5M2:
      std::snprintf(buf, sizeof buf, "dense<0x%02X>", FloatToF8E5M2Bits(static_cast<float>(f)));
      return buf;
    case DType::kC64: case DType::kC128:
      return "dense<(" + util::Scientific(f, 17) + ",0.000000e+00)>";  // exponent form: always a float literal
    case DType::kU64:
      std::snprintf(buf, sizeof buf, "dense<%llu>", (unsigned long long)n);
      return buf;
    default:
      std::snprintf(buf, sizeof buf, "dense<%lld>", (long long)n);
      return buf;
  }
}

std::string EmitStableHlo(const ModuleSpec& spec) {
  struct Restore {
    DType prev = t_float_type;
    ~Restore() { t_float_type = prev; }
  } restore;
  t_float_type = spec.float_type;
  return Emitter(spec).Run();
}

}  // namespace txla::lowering
