// Op table rows: as_strided_copy and as_strided_scatter, which read and write the input's storage.
//
// Sizes, strides and the offset are static at trace time, so the element map (result element ->
// storage position) is known when the row runs. The storage is the input's elements in its layout
// order: the row needs the input's eager strides (the bridge fills TensorArg::strides for rows named
// as_strided*) and handles a dense input at storage offset 0 (contiguous or permuted, e.g. a
// transposed CPU tensor moved with .to()). Anything else (a view's offset, a non-dense layout, an
// out-of-bounds map, negative strides) throws NotLowered: the CPU fallback raises eager's error or
// computes it as before.
//
// Emission, on the flat storage F (a reshape, after a transpose for a permuted layout):
//  - "nested" maps (dims sorted by stride, each stride at least the span of the next dims: what
//    contiguous and strided blocks of a flat buffer are, e.g. DDP's gradient bucket views): slices and
//    reshapes to read, dynamic_update_slice (a contiguous block) or pad + select to write;
//  - other maps: a gather / a scatter with the positions computed in the graph from iotas
//    (offset + sum_k iota_k * stride_k), no constant index array;
//  - broadcast (stride 0) dims of a read: a broadcast of the read without them.
// as_strided_scatter whose map hits an element twice (eager writes them in its iteration order)
// stays on the CPU fallback, which runs eager's kernel.
//
// TORCH_XLA_AS_STRIDED_FALLBACK=1 sends every call to the CPU fallback (A/B measurements).
#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "ops/rows.h"

namespace txla::ops {

using ir::Op;
using V = std::vector<Value>;

namespace {

bool ForcedFallback() {
  static bool on = [] {
    const char* e = std::getenv("TORCH_XLA_AS_STRIDED_FALLBACK");
    return e && *e && std::string(e) != "0";
  }();
  return on;
}

// The input's storage as a flat value, or NotLowered when its storage is not all of its elements
// in a dense layout starting at offset 0.
Value FlatStorage(const TensorArg& t, std::vector<int64_t>* perm_out) {
  const Value& x = t.v;
  const std::vector<int64_t>& dims = x.dims();
  int r = x.rank();
  std::vector<int64_t> perm(r);
  std::iota(perm.begin(), perm.end(), 0);
  if (t.has_layout) {
    if (t.storage_offset != 0 || static_cast<int>(t.strides.size()) != r) throw NotLowered{};
    const auto& st = t.strides;
    auto dense_in = [&](const std::vector<int64_t>& order) {
      int64_t expect = 1;
      for (int i = r - 1; i >= 0; --i) {
        int64_t d = order[i];
        if (dims[d] == 1) continue;
        if (st[d] != expect) return false;
        expect *= dims[d];
      }
      return true;
    };
    if (!dense_in(perm)) {
      // A permuted dense layout: dims of size > 1 outermost first (larger strides first); size-1
      // dims last (they do not change the order of the elements).
      std::vector<int64_t> big, ones;
      for (int64_t d = 0; d < r; ++d) (dims[d] == 1 ? ones : big).push_back(d);
      std::stable_sort(big.begin(), big.end(), [&](int64_t a, int64_t b) { return st[a] > st[b]; });
      perm = big;
      perm.insert(perm.end(), ones.begin(), ones.end());
      if (!dense_in(perm)) throw NotLowered{};  // overlapping or with holes
    }
  }
  *perm_out = perm;
  bool identity = true;
  for (int i = 0; i < r; ++i) identity = identity && perm[i] == i;
  Value p = identity ? x : ir::Transpose(x, perm);
  return ir::Reshape(p, {x.shape().numel()});
}

// The inverse of FlatStorage: a flat storage back to the logical value of shape `dims`.
Value Unflatten(const Value& flat, const std::vector<int64_t>& dims, const std::vector<int64_t>& perm) {
  std::vector<int64_t> pd;
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) {
    pd.push_back(dims[perm[i]]);
    identity = identity && perm[i] == static_cast<int64_t>(i);
  }
  Value p = ir::Reshape(flat, pd);
  if (identity) return p;
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return ir::Transpose(p, inv);
}

struct Map {
  std::vector<int64_t> size, stride;
  int64_t offset = 0, numel = 0;
  // Dims of size > 1 and stride > 0, in the caller's order, and the broadcast ones (stride 0).
  std::vector<int64_t> live, bcast;
  // `live` sorted outermost first (stride descending), then adjacent dims merged.
  std::vector<int64_t> sorted;
  std::vector<std::pair<int64_t, int64_t>> merged;  // (size, stride)
  bool nested = false;
};

// Checks what eager's as_strided checks (else NotLowered: the fallback raises eager's error).
Map Analyze(const std::vector<int64_t>& size, const std::vector<int64_t>& stride, std::optional<int64_t> offset_in,
            int64_t storage_numel) {
  if (size.size() != stride.size()) throw NotLowered{};
  Map m;
  m.size = size;
  m.stride = stride;
  m.offset = offset_in.value_or(0);
  if (m.offset < 0) throw NotLowered{};
  m.numel = 1;
  int64_t last = m.offset;
  for (size_t k = 0; k < size.size(); ++k) {
    if (size[k] < 0 || stride[k] < 0) throw NotLowered{};
    m.numel *= size[k];
  }
  if (m.numel == 0) return m;
  for (size_t k = 0; k < size.size(); ++k) last += (size[k] - 1) * stride[k];
  if (last >= storage_numel) throw NotLowered{};  // out of bounds: eager's setStorage error
  for (size_t k = 0; k < size.size(); ++k) {
    if (size[k] == 1) continue;
    (stride[k] == 0 ? m.bcast : m.live).push_back(static_cast<int64_t>(k));
  }
  m.sorted = m.live;
  std::stable_sort(m.sorted.begin(), m.sorted.end(), [&](int64_t a, int64_t b) { return stride[a] > stride[b]; });
  m.nested = true;
  for (size_t i = 0; i + 1 < m.sorted.size(); ++i) {
    int64_t a = m.sorted[i], b = m.sorted[i + 1];
    if (stride[a] < size[b] * stride[b]) m.nested = false;
  }
  if (m.nested) {
    for (int64_t d : m.sorted) {
      if (!m.merged.empty() && m.merged.back().second == size[d] * stride[d]) {
        m.merged.back() = {m.merged.back().first * size[d], stride[d]};
      } else {
        m.merged.push_back({size[d], stride[d]});
      }
    }
  }
  return m;
}

std::vector<int64_t> DimsOf(const Map& m, const std::vector<int64_t>& which) {
  std::vector<int64_t> d;
  for (int64_t k : which) d.push_back(m.size[k]);
  return d;
}

// Storage positions of the live dims (caller's order), computed in the graph: [numel_live] s64.
Value Positions(const Map& m) {
  std::vector<int64_t> d = DimsOf(m, m.live);
  ir::Shape s(DType::kS64, d);
  Value pos = ir::BroadcastInDim(ir::ConstantInt(m.offset, DType::kS64), d, {});
  for (size_t i = 0; i < m.live.size(); ++i) {
    Value term = ir::Iota(s, static_cast<int64_t>(i));
    int64_t st = m.stride[m.live[i]];
    if (st != 1) term = ir::Binary(Op::kMul, term, ir::BroadcastInDim(ir::ConstantInt(st, DType::kS64), d, {}));
    pos = ir::Binary(Op::kAdd, pos, term);
  }
  return ir::Reshape(pos, {ProductOf(d)});
}

// The permutation taking the live dims from order `from` to order `to`.
std::vector<int64_t> PermBetween(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  std::vector<int64_t> perm;
  for (int64_t d : to) perm.push_back(std::find(from.begin(), from.end(), d) - from.begin());
  return perm;
}

bool IsIdentity(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// Reads the live dims of the map from the flat storage, in the caller's order of `live`.
Value ReadLive(const Value& flat, const Map& m) {
  int64_t n = flat.dims()[0];
  if (m.live.empty()) return ir::Reshape(ir::Slice(flat, {m.offset}, {m.offset + 1}, {1}), {});
  if (!m.nested) {
    Value idx = ir::Reshape(Positions(m), {ProductOf(DimsOf(m, m.live)), 1});
    Value g = ir::Gather(flat, idx, {}, {0}, {0}, 1, {1});
    return ir::Reshape(g, DimsOf(m, m.live));
  }
  const auto& L = m.merged;
  size_t depth = L.size();
  Value x;
  std::vector<int64_t> lead;  // dims produced so far
  if (depth == 1) {
    x = ir::Slice(flat, {m.offset}, {m.offset + (L[0].first - 1) * L[0].second + 1}, {L[0].second});
  } else {
    int64_t need = m.offset + L[0].first * L[0].second;
    Value f = flat;
    if (need > n) f = ir::Pad(flat, ir::Constant(0, flat.dtype()), {0}, {need - n}, {0});
    x = ir::Reshape(ir::Slice(f, {m.offset}, {need}, {1}), {L[0].first, L[0].second});
    lead.push_back(L[0].first);
    for (size_t k = 1; k < depth; ++k) {
      std::vector<int64_t> st(lead.size() + 1, 0), lim = x.dims(), str(lead.size() + 1, 1);
      if (k + 1 < depth) {
        lim.back() = L[k].first * L[k].second;
        x = ir::Slice(x, st, lim, str);
        std::vector<int64_t> d = lead;
        d.push_back(L[k].first);
        d.push_back(L[k].second);
        x = ir::Reshape(x, d);
        lead.push_back(L[k].first);
      } else {
        lim.back() = (L[k].first - 1) * L[k].second + 1;
        str.back() = L[k].second;
        x = ir::Slice(x, st, lim, str);
      }
    }
  }
  // x: merged dims in sorted order -> the sorted live dims -> the caller's order.
  x = ir::Reshape(x, DimsOf(m, m.sorted));
  std::vector<int64_t> perm = PermBetween(m.sorted, m.live);
  return IsIdentity(perm) ? x : ir::Transpose(x, perm);
}

// Writes `src` (the live dims, caller's order) into the flat storage at the map.
Value WriteLive(const Value& flat, const Value& src, const Map& m) {
  int64_t n = flat.dims()[0];
  if (m.live.empty()) {
    return ir::DynamicUpdateSlice(flat, ir::Reshape(src, {1}), {ir::ConstantInt(m.offset, DType::kS64)});
  }
  if (!m.nested) {
    Value idx = ir::Reshape(Positions(m), {m.numel, 1});
    return ir::Scatter(flat, idx, ir::Reshape(src, {m.numel}), {}, {0}, {0}, 1, /*replace*/ 0);
  }
  std::vector<int64_t> perm = PermBetween(m.live, m.sorted);
  Value x = IsIdentity(perm) ? src : ir::Transpose(src, perm);
  const auto& L = m.merged;
  size_t depth = L.size();
  std::vector<int64_t> md;
  for (auto& [sz, st] : L) md.push_back(sz);
  x = ir::Reshape(x, md);
  if (depth == 1 && L[0].second == 1) {  // a contiguous block
    return ir::DynamicUpdateSlice(flat, x, {ir::ConstantInt(m.offset, DType::kS64)});
  }
  // Pad src (and a mask) out to the storage's layout, innermost level first, then select.
  Value mask = ir::Full(1, ir::Shape(DType::kPred, md));
  Value zero = ir::Constant(0, x.dtype()), no = ir::Constant(0, DType::kPred);
  auto pad_last = [&](Value v, const Value& pv, int64_t high, int64_t interior) {
    int r = v.rank();
    std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
    hi[r - 1] = high;
    in[r - 1] = interior;
    return ir::Pad(v, pv, lo, hi, in);
  };
  for (size_t k = depth; k-- > 0;) {
    // The innermost level's elements sit L[k].second apart; an outer level's rows are already laid
    // out (n * stride long). Each level's row then fills the row of the level above (L[k-1].second).
    bool innermost = k + 1 == depth;
    int64_t interior = innermost ? L[k].second - 1 : 0;
    int64_t len = innermost ? (L[k].first - 1) * L[k].second + 1 : L[k].first * L[k].second;
    int64_t high = k > 0 ? L[k - 1].second - len : 0;
    if (high > 0 || interior > 0) {
      x = pad_last(x, zero, high, interior);
      mask = pad_last(mask, no, high, interior);
    }
    if (k > 0) {  // merge this level into the row of the level above
      std::vector<int64_t> d = x.dims();
      int64_t inner = d.back();
      d.pop_back();
      d.back() *= inner;
      x = ir::Reshape(x, d);
      mask = ir::Reshape(mask, d);
    }
  }
  int64_t len = x.dims()[0];
  int64_t total = std::max(n, m.offset + len);
  x = ir::Pad(x, zero, {m.offset}, {total - m.offset - len}, {0});
  mask = ir::Pad(mask, no, {m.offset}, {total - m.offset - len}, {0});
  Value f = total > n ? ir::Pad(flat, zero, {0}, {total - n}, {0}) : flat;
  Value out = ir::Select(mask, x, f);
  return total > n ? ir::Slice(out, {0}, {n}, {1}) : out;
}

// True when the nested-or-not map hits some storage element twice (trace-time check).
bool Overlaps(const Map& m) {
  if (m.nested) return false;  // nested maps are one-to-one
  std::vector<int64_t> d = DimsOf(m, m.live), idx(d.size(), 0);
  int64_t last = m.offset;
  for (int64_t k : m.live) last += (m.size[k] - 1) * m.stride[k];
  std::vector<bool> seen(static_cast<size_t>(last + 1), false);
  for (int64_t e = 0; e < m.numel; ++e) {
    int64_t p = m.offset;
    for (size_t i = 0; i < d.size(); ++i) p += idx[i] * m.stride[m.live[i]];
    if (seen[p]) return true;
    seen[p] = true;
    for (size_t i = d.size(); i-- > 0;) {
      if (++idx[i] < d[i]) break;
      idx[i] = 0;
    }
  }
  return false;
}

V AsStridedCopy(OpArgs& a) {
  if (ForcedFallback()) throw NotLowered{};
  const TensorArg& t = a.T(0);
  const Value& x = t.v;
  Map m = Analyze(a.Ints(1), a.Ints(2), a.OptInt(3), x.shape().numel());
  if (m.numel == 0) return {ir::Full(0, ir::Shape(x.dtype(), m.size))};
  std::vector<int64_t> perm;
  Value flat = FlatStorage(t, &perm);
  Value live = ReadLive(flat, m);
  // Into the requested shape: live dims at their places, broadcast and size-1 dims around them.
  return {ir::BroadcastInDim(live, m.size, m.live)};
}

V AsStridedScatter(OpArgs& a) {
  if (ForcedFallback()) throw NotLowered{};
  const TensorArg& t = a.T(0);
  const Value& self = t.v;
  const Value& src_in = a.V(1);
  std::vector<int64_t> size = a.Ints(2), stride = a.Ints(3);
  Map m = Analyze(size, stride, a.OptInt(4), self.shape().numel());
  if (src_in.dims() != size) {
    a.Fail("expected src to have a size equal to the slice of self. src size = " + ir::DimsToString(src_in.dims()) +
           ", slice size = " + ir::DimsToString(size));
  }
  if (m.numel == 0) return {self};
  if (!m.bcast.empty() || Overlaps(m)) throw NotLowered{};  // eager's error / its write order
  std::vector<int64_t> perm;
  Value flat = FlatStorage(t, &perm);
  Value src = ir::Reshape(Cast(src_in, self.dtype()), DimsOf(m, m.live));
  return {Unflatten(WriteLive(flat, src, m), self.dims(), perm)};
}

}  // namespace

void AddAsStridedRows(std::vector<OpRow>& rows) {
  rows.push_back({"as_strided_copy", AsStridedCopy});
  rows.push_back({"as_strided_scatter", AsStridedScatter});
}

}  // namespace txla::ops
