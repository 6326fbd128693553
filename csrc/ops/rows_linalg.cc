// Op table rows: linear algebra on StableHLO's cholesky and triangular_solve (XLA expands both):
// linalg_cholesky_ex (LAPACK's `info`: the order of the first leading minor that is not
// positive-definite, found by bisection over masked leading blocks), linalg_solve_triangular,
// triangular_solve, _cholesky_solve_helper (cholesky_solve), cholesky_inverse. float32/float64 only;
// complex, reduced precision, empty and malformed inputs go to the CPU fallback (eager's errors).
#include <algorithm>
#include <cstdint>
#include <optional>

#include "graph/graph.h"
#include "ir/control_flow.h"
#include "ops/rows.h"

namespace txla::ops {

using ir::CompareDir;
using ir::Op;
using V = std::vector<Value>;

namespace {

bool LinalgType(DType t) { return t == DType::kF32 || t == DType::kF64; }

// A [..., n, n] float matrix (or batch) eager's kernel accepts; anything else stays on the CPU.
void RequireSquare(const Value& a) {
  int r = a.rank();
  if (r < 2 || a.dims()[r - 1] != a.dims()[r - 2] || !LinalgType(a.dtype())) {
    throw NotLowered{};
  }
}

std::vector<int64_t> BatchOf(const Value& x) { return {x.dims().begin(), x.dims().end() - 2}; }

// x broadcast to batch dims `batch` (its own last two dims kept).
Value ToBatch(const Value& x, const std::vector<int64_t>& batch) {
  std::vector<int64_t> dims = batch;
  dims.push_back(x.dims()[x.rank() - 2]);
  dims.push_back(x.dims()[x.rank() - 1]);
  return BroadcastTo(x, dims);
}

// pred[..., i, j] = i <cmp> j (shape of x, pred).
Value IndexCompare(const Value& x, CompareDir d) {
  int r = x.rank();
  ir::Shape s(DType::kS64, x.dims());
  return ir::Compare(d, ir::Iota(s, r - 2), ir::Iota(s, r - 1));
}

// x with the opposite triangle zeroed (lower: keep i >= j).
Value KeepTriangle(const Value& x, bool lower) {
  return ir::Select(IndexCompare(x, lower ? CompareDir::kGE : CompareDir::kLE), x, ir::Full(0, x.shape()));
}

// Per matrix: does the Cholesky factor have a positive diagonal (eager's success criterion)?
Value DiagonalPositive(const Value& l) {
  int r = l.rank();
  Value diag_ok = ir::Select(IndexCompare(l, CompareDir::kEQ),
                             ir::Compare(CompareDir::kGT, l, ir::Full(0, l.shape())),
                             ir::Full(1, ir::Shape(DType::kPred, l.dims())));
  return ir::Reduce(ir::ReduceKind::kAnd, diag_ok, {r - 2, r - 1});
}

// LAPACK's info of potrf: 0 when the whole factor succeeded, else the order k of the first leading
// minor that is not positive-definite. ok(p) (the leading p x p block factors) is monotone in p, so
// a bisection over p finds k: each step factors the matrix with the block beyond p replaced by I.
Value CholeskyInfo(const Value& a, const Value& full_ok, bool lower) {
  int r = a.rank();
  int64_t n = a.dims()[r - 1];
  std::vector<int64_t> batch = BatchOf(a);
  ir::Shape bs(DType::kS32, batch);
  Value lo = ir::Full(0, bs), hi = ir::Full(static_cast<double>(n), bs);
  ir::Shape is(DType::kS32, a.dims());
  Value row = ir::Iota(is, r - 2), col = ir::Iota(is, r - 1);
  std::vector<int64_t> bdims(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) bdims[i] = static_cast<int64_t>(i);
  Value eye = ir::Select(ir::Compare(CompareDir::kEQ, row, col), ir::Full(1, a.shape()), ir::Full(0, a.shape()));
  for (int64_t span = n; span > 1; span = (span + 1) / 2) {
    Value mid = ir::Binary(Op::kDiv, ir::Binary(Op::kAdd, lo, hi), ir::Full(2, bs));
    Value m = ir::BroadcastInDim(mid, a.dims(), bdims);
    Value inside = ir::Binary(Op::kAnd, ir::Compare(CompareDir::kLT, row, m), ir::Compare(CompareDir::kLT, col, m));
    Value ok = DiagonalPositive(ir::Cholesky(ir::Select(inside, a, eye), lower));
    // Only while the bracket is open (hi - lo > 1) does the step move it.
    Value open = ir::Compare(CompareDir::kGT, ir::Binary(Op::kSub, hi, lo), ir::Full(1, bs));
    lo = ir::Select(ir::Binary(Op::kAnd, open, ok), mid, lo);
    hi = ir::Select(ir::Binary(Op::kAnd, open, ir::Unary(Op::kNot, ok)), mid, hi);
  }
  return ir::Select(full_ok, ir::Full(0, bs), hi);
}

// Solves A X = B with A = L L^H (lower) or U^H U (upper), from its factor.
Value CholeskySolve(const Value& b, const Value& f, bool upper) {
  if (!upper) {
    Value y = ir::TriangularSolve(f, b, true, true, false, false);
    return ir::TriangularSolve(f, y, true, true, false, true);
  }
  Value y = ir::TriangularSolve(f, b, true, false, false, true);
  return ir::TriangularSolve(f, y, true, false, false, false);
}


// ---- LU with partial pivoting (LAPACK getrf's pivot choice: the first row of largest magnitude;
// a zero pivot column is left unscaled and reported in info), one step per column: unrolled up to
// kMaxUnrolledLu columns (compile time grows fast with the unrolling: ~20 s at n = 32 and ~35 s at
// n = 64 on this machine), and as one stablehlo.while over the columns above (ir::ForLoop: the
// step is traced once, so compile time no longer depends on n).
constexpr int64_t kMaxUnrolledLu = 16;
// Above this size the LU stays on the CPU (n sequential steps of O(n^2) work each: LAPACK's blocked
// kernel is the better tool for large matrices).
constexpr int64_t kMaxLu = 512;

// x: [B, n, m]; idx: [B, k] (s64) -> rows x[b, idx[b, i], :] as [B, k, m].
Value GatherRows(const Value& x, const Value& idx) {
  int64_t b = x.dims()[0], m = x.dims()[2], k = idx.dims()[1];
  ir::Shape is(DType::kS64, {b, k, 1});
  Value coords = ir::Concatenate({ir::Iota(is, 0), ir::Reshape(idx, {b, k, 1})}, 2);
  return ir::Gather(x, coords, {2}, {0, 1}, {0, 1}, 2, {1, 1, m});
}

struct Lu {
  Value lu;      // [B, n, n]: L below the diagonal (unit diagonal implied), U on and above
  Value perm;    // [B, n] s64: row i of P A is row perm[i] of A
  Value pivots;  // [B, n] s32: LAPACK's 1-based ipiv
  Value info;    // [B] s32
};

Lu LuFactorLoop(const Value& a, bool rounded_products);

// rounded_products: each update a - l * u rounds l * u to the dtype first, as LAPACK's getrf does.
// XLA:CPU always lets LLVM contract a multiply feeding one add into an FMA (one rounding), which
// leaves ~1e-8 where LAPACK's elimination of an exactly singular matrix reaches an exact zero
// pivot. LLVM contracts only a multiply with a single use: a second use that cannot change the
// value (select(p != p, p, a - p): a - p is NaN whenever p is) keeps the product rounded.
Value UpdateSub(const Value& m, const Value& outer, bool rounded_products) {
  Value upd = ir::Binary(Op::kSub, m, outer);
  if (!rounded_products) return upd;
  return ir::Select(ir::Compare(CompareDir::kNE, outer, outer), outer, upd);
}

Lu LuFactor(const Value& a, bool rounded_products = false) {  // a: [B, m, n] float
  int64_t bt = a.dims()[0], rows = a.dims()[1], n = a.dims()[2];
  if (std::max(rows, n) > kMaxUnrolledLu) return LuFactorLoop(a, rounded_products);
  ir::Shape vs(DType::kS64, {bt, rows}), ms(DType::kS64, {bt, rows, n});
  Value row_v = ir::Iota(vs, 1);
  Value row = ir::Iota(ms, 1), col = ir::Iota(ms, 2);
  Value m = a, perm = row_v;
  Value info = ir::Full(0, ir::Shape(DType::kS32, {bt}));
  std::vector<Value> pivots;
  auto kv = [](double v, const ir::Shape& s) { return ir::Full(v, s); };
  for (int64_t k = 0; k < std::min(rows, n); ++k) {
    Value colk = ir::Reshape(ir::Slice(m, {0, 0, k}, {bt, rows, k + 1}, {1, 1, 1}), {bt, rows});
    Value mag = ir::Unary(Op::kAbs, colk);
    Value skip = ir::Binary(Op::kOr, ir::Compare(CompareDir::kNE, mag, mag),
                            ir::Compare(CompareDir::kLT, row_v, kv(static_cast<double>(k), vs)));
    mag = ir::Select(skip, kv(-1, mag.shape()), mag);
    Value p = ir::ArgReduce(ir::ArgKind::kArgMax, mag, 1).second;  // [B] s64, first on ties
    pivots.push_back(ir::Reshape(Cast(ir::Binary(Op::kAdd, p, ir::Full(1, p.shape())), DType::kS32), {bt, 1}));
    Value pb = ir::BroadcastInDim(p, {bt, rows}, {0});
    Value kk = kv(static_cast<double>(k), vs);
    Value swap = ir::Select(ir::Compare(CompareDir::kEQ, row_v, kk), pb,
                            ir::Select(ir::Compare(CompareDir::kEQ, row_v, pb), kk, row_v));
    m = GatherRows(m, swap);
    perm = ir::Reshape(GatherRows(ir::Reshape(perm, {bt, rows, 1}), swap), {bt, rows});
    Value pivot = ir::Reshape(ir::Slice(m, {0, k, k}, {bt, k + 1, k + 1}, {1, 1, 1}), {bt});
    Value nz = ir::Compare(CompareDir::kNE, pivot, ir::Full(0, pivot.shape()));
    info = ir::Select(ir::Binary(Op::kAnd, ir::Unary(Op::kNot, nz),
                                 ir::Compare(CompareDir::kEQ, info, ir::Full(0, info.shape()))),
                      ir::Full(static_cast<double>(k + 1), info.shape()), info);
    colk = ir::Reshape(ir::Slice(m, {0, 0, k}, {bt, rows, k + 1}, {1, 1, 1}), {bt, rows});
    // getrf2 scales by the reciprocal of the pivot (divides only below the smallest normal).
    double tiny = a.dtype() == DType::kF64 ? 2.2250738585072014e-308 : 1.1754943508222875e-38;
    Value pv = ir::BroadcastInDim(pivot, {bt, rows}, {0});
    Value recip = ir::Binary(Op::kMul, colk, ir::Binary(Op::kDiv, ir::Full(1, pv.shape()), pv));
    Value normal = ir::Compare(CompareDir::kGE, ir::Unary(Op::kAbs, pv), ir::Full(tiny, pv.shape()));
    Value l = ir::Select(ir::BroadcastInDim(nz, {bt, rows}, {0}),
                         ir::Select(normal, recip, ir::Binary(Op::kDiv, colk, pv)), colk);
    Value rowk = ir::Reshape(ir::Slice(m, {0, k, 0}, {bt, k + 1, n}, {1, 1, 1}), {bt, n});
    Value lb = ir::BroadcastInDim(l, {bt, rows, n}, {0, 1});
    Value outer = ir::Binary(Op::kMul, lb, ir::BroadcastInDim(rowk, {bt, rows, n}, {0, 2}));
    Value below = ir::Compare(CompareDir::kGT, row, ir::Full(static_cast<double>(k), ms));
    Value right = ir::Compare(CompareDir::kGT, col, ir::Full(static_cast<double>(k), ms));
    Value atk = ir::Compare(CompareDir::kEQ, col, ir::Full(static_cast<double>(k), ms));
    m = ir::Select(ir::Binary(Op::kAnd, below, right), UpdateSub(m, outer, rounded_products), m);
    m = ir::Select(ir::Binary(Op::kAnd, below, atk), lb, m);
  }
  return {m, perm, ir::Concatenate(pivots, 1), info};
}

// The same steps as LuFactor's, as a loop over k = 0 .. min(m, n) - 1 (k a runtime s64 scalar).
Lu LuFactorLoop(const Value& a, bool rounded_products) {
  int64_t bt = a.dims()[0], rows = a.dims()[1], n = a.dims()[2], steps = std::min(rows, n);
  ir::Shape vs(DType::kS64, {bt, rows}), ms(DType::kS64, {bt, rows, n});
  Value row_v0 = ir::Iota(vs, 1);
  std::vector<Value> init{a, row_v0, ir::Full(0, ir::Shape(DType::kS32, {bt})),
                          ir::Full(0, ir::Shape(DType::kS32, {bt, steps}))};
  double tiny = a.dtype() == DType::kF64 ? 2.2250738585072014e-308 : 1.1754943508222875e-38;
  auto step = [&](const Value& k, const std::vector<Value>& c) -> std::vector<Value> {
    Value m = c[0], perm = c[1], info = c[2], piv = c[3];
    Value zero = ir::ConstantInt(0, DType::kS64);
    auto kb = [&](const ir::Shape& s) { return ir::BroadcastInDim(Cast(k, s.dtype), s.dims, {}); };
    Value row_v = ir::Iota(vs, 1);
    Value row = ir::Iota(ms, 1), col = ir::Iota(ms, 2);
    Value colk = ir::Reshape(ir::DynamicSlice(m, {zero, zero, k}, {bt, rows, 1}), {bt, rows});
    Value mag = ir::Unary(Op::kAbs, colk);
    Value skip = ir::Binary(Op::kOr, ir::Compare(CompareDir::kNE, mag, mag), ir::Compare(CompareDir::kLT, row_v, kb(vs)));
    mag = ir::Select(skip, ir::Full(-1, mag.shape()), mag);
    Value p = ir::ArgReduce(ir::ArgKind::kArgMax, mag, 1).second;  // [B] s64, first on ties
    Value p1 = Cast(ir::Binary(Op::kAdd, p, ir::Full(1, p.shape())), DType::kS32);
    piv = ir::DynamicUpdateSlice(piv, ir::Reshape(p1, {bt, 1}), {zero, k});
    Value pb = ir::BroadcastInDim(p, {bt, rows}, {0});
    Value kk = kb(vs);
    Value swap = ir::Select(ir::Compare(CompareDir::kEQ, row_v, kk), pb,
                            ir::Select(ir::Compare(CompareDir::kEQ, row_v, pb), kk, row_v));
    m = GatherRows(m, swap);
    perm = ir::Reshape(GatherRows(ir::Reshape(perm, {bt, rows, 1}), swap), {bt, rows});
    Value pivot = ir::Reshape(ir::DynamicSlice(m, {zero, k, k}, {bt, 1, 1}), {bt});
    Value nz = ir::Compare(CompareDir::kNE, pivot, ir::Full(0, pivot.shape()));
    Value k1 = ir::Binary(Op::kAdd, kb(info.shape()), ir::Full(1, info.shape()));
    info = ir::Select(ir::Binary(Op::kAnd, ir::Unary(Op::kNot, nz),
                                 ir::Compare(CompareDir::kEQ, info, ir::Full(0, info.shape()))),
                      k1, info);
    colk = ir::Reshape(ir::DynamicSlice(m, {zero, zero, k}, {bt, rows, 1}), {bt, rows});
    Value pv = ir::BroadcastInDim(pivot, {bt, rows}, {0});
    Value recip = ir::Binary(Op::kMul, colk, ir::Binary(Op::kDiv, ir::Full(1, pv.shape()), pv));
    Value normal = ir::Compare(CompareDir::kGE, ir::Unary(Op::kAbs, pv), ir::Full(tiny, pv.shape()));
    Value l = ir::Select(ir::BroadcastInDim(nz, {bt, rows}, {0}),
                         ir::Select(normal, recip, ir::Binary(Op::kDiv, colk, pv)), colk);
    Value rowk = ir::Reshape(ir::DynamicSlice(m, {zero, k, zero}, {bt, 1, n}), {bt, n});
    Value lb = ir::BroadcastInDim(l, {bt, rows, n}, {0, 1});
    Value outer = ir::Binary(Op::kMul, lb, ir::BroadcastInDim(rowk, {bt, rows, n}, {0, 2}));
    Value kms = kb(ms);
    Value below = ir::Compare(CompareDir::kGT, row, kms);
    Value right = ir::Compare(CompareDir::kGT, col, kms);
    Value atk = ir::Compare(CompareDir::kEQ, col, kms);
    m = ir::Select(ir::Binary(Op::kAnd, below, right), UpdateSub(m, outer, rounded_products), m);
    m = ir::Select(ir::Binary(Op::kAnd, below, atk), lb, m);
    return {m, perm, info, piv};
  };
  std::vector<Value> out = ir::ForLoop(steps, init, step);
  return {out[0], out[1], out[3], out[2]};
}

// [..., n, n] -> [B, n, n] and back.
Value FlattenBatch(const Value& x) {
  int r = x.rank();
  return ir::Reshape(x, {ProductOf(BatchOf(x)), x.dims()[r - 2], x.dims()[r - 1]});
}
std::vector<int64_t> With(std::vector<int64_t> batch, std::initializer_list<int64_t> tail) {
  batch.insert(batch.end(), tail);
  return batch;
}

// Square float matrices of a size the unrolled LU takes.
void RequireLu(const Value& a, bool allow_empty = false) {
  RequireSquare(a);
  if (a.dims()[a.rank() - 1] > kMaxLu || (!allow_empty && a.shape().numel() == 0)) throw NotLowered{};
}

// X = A^-1 B (B: [B, n, k]) from A's LU.
Value LuSolve(const Lu& f, const Value& b) {
  Value pb = GatherRows(b, f.perm);
  Value y = ir::TriangularSolve(f.lu, pb, true, true, true, false);
  return ir::TriangularSolve(f.lu, y, true, false, false, false);
}

// X = A^-T B from A's LU (A^T = U^T L^T P): X = P^T (L^-T (U^-T B)).
Value LuSolveTransposed(const Lu& f, const Value& b) {
  Value y = ir::TriangularSolve(f.lu, b, true, false, false, true);
  Value z = ir::TriangularSolve(f.lu, y, true, true, true, true);
  // (P^T z)[perm[i]] = z[i]: gather with the inverse permutation.
  int64_t bt = z.dims()[0], n = z.dims()[1];
  ir::Shape is(DType::kS64, {bt, n, 1});
  Value coords = ir::Concatenate({ir::Iota(is, 0), ir::Reshape(f.perm, {bt, n, 1})}, 2);
  Value inv = ir::Scatter(ir::Full(0, ir::Shape(DType::kS64, {bt, n})), coords, ir::Iota(ir::Shape(DType::kS64, {bt, n}), 1),
                          {}, {0, 1}, {0, 1}, 2, 0);
  return GatherRows(z, inv);
}

// The permutation (row i of P A is row perm[i] of A) of LAPACK pivots [B, n] (1-based, s32).
Value PermOfPivots(const Value& pivots) {
  int64_t bt = pivots.dims()[0], n = pivots.dims()[1];
  ir::Shape vs(DType::kS64, {bt, n});
  Value row_v = ir::Iota(vs, 1), perm = row_v;
  if (n > kMaxUnrolledLu) {
    auto step = [&](const Value& k, const std::vector<Value>& c) -> std::vector<Value> {
      Value piv = c[1], zero = ir::ConstantInt(0, DType::kS64);
      Value rv = ir::Iota(vs, 1);
      Value p = ir::Binary(Op::kSub, Cast(ir::Reshape(ir::DynamicSlice(piv, {zero, k}, {bt, 1}), {bt}), DType::kS64),
                           ir::Full(1, ir::Shape(DType::kS64, {bt})));
      Value pb = ir::BroadcastInDim(p, {bt, n}, {0});
      Value kk = ir::BroadcastInDim(k, {bt, n}, {});
      Value swap = ir::Select(ir::Compare(CompareDir::kEQ, rv, kk), pb,
                              ir::Select(ir::Compare(CompareDir::kEQ, rv, pb), kk, rv));
      return {ir::Reshape(GatherRows(ir::Reshape(c[0], {bt, n, 1}), swap), {bt, n}), piv};
    };
    return ir::ForLoop(n, {perm, pivots}, step)[0];
  }
  for (int64_t k = 0; k < n; ++k) {
    Value p = ir::Binary(Op::kSub, Cast(ir::Reshape(ir::Slice(pivots, {0, k}, {bt, k + 1}, {1, 1}), {bt}), DType::kS64),
                         ir::Full(1, ir::Shape(DType::kS64, {bt})));
    Value pb = ir::BroadcastInDim(p, {bt, n}, {0});
    Value kk = ir::Full(static_cast<double>(k), vs);
    Value swap = ir::Select(ir::Compare(CompareDir::kEQ, row_v, kk), pb,
                            ir::Select(ir::Compare(CompareDir::kEQ, row_v, pb), kk, row_v));
    perm = ir::Reshape(GatherRows(ir::Reshape(perm, {bt, n, 1}), swap), {bt, n});
  }
  return perm;
}

// The diagonal of each matrix (det = prod(diag U), negated for an odd number of row swaps).
Value DiagOf(const Value& lu) {  // [B, n, n] -> [B, n]
  Value eq = ir::Compare(CompareDir::kEQ, ir::Iota(ir::Shape(DType::kS64, lu.dims()), 1),
                         ir::Iota(ir::Shape(DType::kS64, lu.dims()), 2));
  return ir::Reduce(ir::ReduceKind::kSum, ir::Select(eq, lu, ir::Full(0, lu.shape())), {2});
}
Value OddSwaps(const Value& pivots) {  // [B] pred
  int64_t bt = pivots.dims()[0], n = pivots.dims()[1];
  Value k1 = ir::Binary(Op::kAdd, ir::Iota(ir::Shape(DType::kS32, {bt, n}), 1), ir::Full(1, ir::Shape(DType::kS32, {bt, n})));
  Value swaps = ir::Reduce(ir::ReduceKind::kSum, Cast(ir::Compare(CompareDir::kNE, pivots, k1), DType::kS32), {1});
  return ir::Compare(CompareDir::kEQ, ir::Binary(Op::kRem, swaps, ir::Full(2, swaps.shape())), ir::Full(1, swaps.shape()));
}
Value MatT(const Value& x) {
  int r = x.rank();
  std::vector<int64_t> perm(r);
  for (int i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[r - 1], perm[r - 2]);
  return ir::Transpose(x, perm);
}

// ---- Householder QR with LAPACK's reflectors (dgeqrf/dlarfg: beta = -sign(alpha) ||x||, tau =
// (beta - alpha) / beta, v = x / (alpha - beta) with v0 = 1 (scaled by the reciprocal, as dlarfg);
// a zero sub-column gives tau = 0, H = I), so R's diagonal signs are LAPACK's; Q = H0 ... H(k-1)
// applied to the identity's first columns (dorgqr), accumulated backwards. Both are loops over
// the columns (ir::ForLoop).
struct Qr {
  Value q, r;
};

Qr HouseholderQr(const Value& a, bool complete) {  // a: [B, m, n] float
  int64_t bt = a.dims()[0], m = a.dims()[1], n = a.dims()[2], k = std::min(m, n);
  DType t = a.dtype();
  ir::Shape vs(DType::kS64, {bt, m});
  auto factor = [&](const Value& j, const std::vector<Value>& c) -> std::vector<Value> {
    Value A = c[0], V = c[1], taus = c[2];
    Value zero = ir::ConstantInt(0, DType::kS64);
    Value row = ir::Iota(vs, 1);
    Value jb = ir::BroadcastInDim(j, {bt, m}, {});
    Value below = ir::Compare(CompareDir::kGT, row, jb), at = ir::Compare(CompareDir::kEQ, row, jb);
    Value col = ir::Reshape(ir::DynamicSlice(A, {zero, zero, j}, {bt, m, 1}), {bt, m});
    Value alpha = ir::Reshape(ir::DynamicSlice(A, {zero, j, j}, {bt, 1, 1}), {bt});
    Value x = ir::Select(below, col, ir::Full(0, col.shape()));
    Value xnorm = ir::Unary(Op::kSqrt, ir::Reduce(ir::ReduceKind::kSum, ir::Binary(Op::kMul, x, x), {1}));
    Value h = ir::Unary(Op::kSqrt, ir::Binary(Op::kAdd, ir::Binary(Op::kMul, alpha, alpha), ir::Binary(Op::kMul, xnorm, xnorm)));
    Value nonneg = ir::Compare(CompareDir::kGE, alpha, ir::Full(0, alpha.shape()));
    Value identity = ir::Compare(CompareDir::kEQ, xnorm, ir::Full(0, xnorm.shape()));
    Value beta = ir::Select(identity, alpha, ir::Select(nonneg, ir::Unary(Op::kNeg, h), h));
    Value tau = ir::Select(identity, ir::Full(0, beta.shape()), ir::Binary(Op::kDiv, ir::Binary(Op::kSub, beta, alpha), beta));
    Value scale = ir::Binary(Op::kDiv, ir::Full(1, beta.shape()), ir::Binary(Op::kSub, alpha, beta));
    scale = ir::Select(identity, ir::Full(0, scale.shape()), scale);
    Value v = ir::Select(below, ir::Binary(Op::kMul, col, ir::BroadcastInDim(scale, {bt, m}, {0})),
                         ir::Select(at, ir::Full(1, col.shape()), ir::Full(0, col.shape())));
    // A[:, j+1:] -= tau v (v^T A); column j becomes R's: beta on the diagonal, zeros below.
    Value w = ir::DotGeneral(v, A, {0}, {0}, {1}, {1}, t);  // [B, n]
    Value upd = ir::Binary(Op::kMul, ir::BroadcastInDim(ir::Binary(Op::kMul, v, ir::BroadcastInDim(tau, {bt, m}, {0})), {bt, m, n}, {0, 1}),
                           ir::BroadcastInDim(w, {bt, m, n}, {0, 2}));
    ir::Shape ms(DType::kS64, {bt, m, n});
    Value cols = ir::Iota(ms, 2), rows3 = ir::Iota(ms, 1), j3 = ir::BroadcastInDim(j, ms.dims, {});
    Value right = ir::Compare(CompareDir::kGT, cols, j3), atcol = ir::Compare(CompareDir::kEQ, cols, j3);
    A = ir::Select(right, ir::Binary(Op::kSub, A, upd), A);
    Value rcol = ir::Select(ir::Compare(CompareDir::kEQ, rows3, j3), ir::BroadcastInDim(beta, {bt, m, n}, {0}),
                            ir::Select(ir::Compare(CompareDir::kGT, rows3, j3), ir::Full(0, A.shape()), A));
    A = ir::Select(atcol, rcol, A);
    V = ir::DynamicUpdateSlice(V, ir::Reshape(v, {bt, m, 1}), {zero, zero, j});
    taus = ir::DynamicUpdateSlice(taus, ir::Reshape(tau, {bt, 1}), {zero, j});
    return {A, V, taus};
  };
  std::vector<Value> f = ir::ForLoop(k, {a, ir::Full(0, ir::Shape(t, {bt, m, k})), ir::Full(0, ir::Shape(t, {bt, k}))}, factor);
  int64_t qc = complete ? m : k;
  ir::Shape qs(t, {bt, m, qc});
  Value eye = ir::Select(ir::Compare(CompareDir::kEQ, ir::Iota(ir::Shape(DType::kS64, qs.dims), 1),
                                     ir::Iota(ir::Shape(DType::kS64, qs.dims), 2)),
                         ir::Full(1, qs), ir::Full(0, qs));
  auto accumulate = [&](const Value& i, const std::vector<Value>& c) -> std::vector<Value> {
    Value Q = c[0], V = c[1], taus = c[2];
    Value zero = ir::ConstantInt(0, DType::kS64);
    Value j = ir::Binary(Op::kSub, ir::ConstantInt(k - 1, DType::kS64), i);
    Value v = ir::Reshape(ir::DynamicSlice(V, {zero, zero, j}, {bt, m, 1}), {bt, m});
    Value tau = ir::Reshape(ir::DynamicSlice(taus, {zero, j}, {bt, 1}), {bt});
    Value w = ir::DotGeneral(v, Q, {0}, {0}, {1}, {1}, t);  // [B, qc]
    Value upd = ir::Binary(Op::kMul, ir::BroadcastInDim(ir::Binary(Op::kMul, v, ir::BroadcastInDim(tau, {bt, m}, {0})), qs.dims, {0, 1}),
                           ir::BroadcastInDim(w, qs.dims, {0, 2}));
    return {ir::Binary(Op::kSub, Q, upd), V, taus};
  };
  Value q = ir::ForLoop(k, {eye, f[1], f[2]}, accumulate)[0];
  Value r = f[0];
  if (!complete && m > k) r = ir::Slice(r, {0, 0, 0}, {bt, k, n}, {1, 1, 1});
  // R is upper triangular (the loop leaves the reflectors' zeros below the diagonal already, and
  // columns beyond k keep their rows below k only when m > n... which cannot happen: k = n there).
  return {q, KeepTriangle(r, false)};
}


// ---- Symmetric eigendecomposition and SVD on XLA's Jacobi eigensolver (a custom call @Eigh that
// XLA's EighExpander expands; ir::Eigh), refined here: XLA's loop stops with off-diagonal residues
// of ~1e-9 relative (f64), accurate eigenvalues but eigenvectors whose V diag(w) V^T misses A by
// that much. kRefineSweeps sweeps of parallel two-sided Jacobi on B = V^T A V (quadratically
// convergent from there; one sweep is enough for distinct eigenvalues, a repeated one needed the
// second: tests/test_eigh_svd.py) bring the residue to rounding level, as LAPACK's.
constexpr int64_t kEighMaxSweeps = 100;
constexpr int64_t kRefineSweeps = 2;
// Above this size (n for eigh, m + n for the SVD's symmetric embedding) they stay on the CPU
// (LAPACK through the fallback): the Jacobi loops cost O(n^3) per sweep, and a cached call already
// takes ~20-30 ms at n = 32 and ~1 s at n = 128 on XLA:CPU, where LAPACK takes well under a
// millisecond; a user's 128 x 128 eigh must not become 300x slower because it is lowered.
constexpr int64_t kMaxEigh = 64;
// The SVD's embedding is (m + n)^2: lowered up to m + n = 64 (e.g. 32 x 32, ~0.3 s per cached call).
constexpr int64_t kMaxSvd = 64;
double EighTol(DType t) { return t == DType::kF64 ? 2.220446049250313e-16 : 1.1920928955078125e-07; }

// Rotates row pairs of x [B, N, M]: rows top[k], bot[k] (idx [B, N/2] s64, together a permutation of
// 0..N-1) become c x_top - s x_bot and s x_top + c x_bot (c, s: [B, N/2]); inv[B, N] gives each
// row's place in the concatenation [tops; bots].
Value RotateRows(const Value& x, const Value& top, const Value& bot, const Value& inv, const Value& c,
                 const Value& s) {
  int64_t bt = x.dims()[0], h = top.dims()[1], m = x.dims()[2];
  Value xt = GatherRows(x, top), xb = GatherRows(x, bot);
  Value cb = ir::BroadcastInDim(c, {bt, h, m}, {0, 1}), sb = ir::BroadcastInDim(s, {bt, h, m}, {0, 1});
  Value nt = ir::Binary(Op::kSub, ir::Binary(Op::kMul, cb, xt), ir::Binary(Op::kMul, sb, xb));
  Value nb = ir::Binary(Op::kAdd, ir::Binary(Op::kMul, sb, xt), ir::Binary(Op::kMul, cb, xb));
  return GatherRows(ir::Concatenate({nt, nb}, 1), inv);
}

// Parallel (round-robin ordered) two-sided Jacobi sweeps on a symmetric b [B, n, n] with its
// accumulated eigenvectors vt (V^T, rows = eigenvectors) [B, n, n]; returns (b, vt) rotated.
std::pair<Value, Value> JacobiSweeps(Value b, Value vt, int64_t sweeps) {
  int64_t bt = b.dims()[0], n = b.dims()[1];
  if (n < 2) return {b, vt};
  int64_t big = n + (n % 2), h = big / 2;  // an odd size gets a zero row/column that never rotates
  DType t = b.dtype();
  if (big != n) {
    Value z = ir::Constant(0, t);
    b = ir::Pad(b, z, {0, 0, 0}, {0, 1, 1}, {0, 0, 0});
    vt = ir::Pad(vt, z, {0, 0, 0}, {0, 1, 1}, {0, 0, 0});
  }
  auto step = [&](const Value& i, const std::vector<Value>& cv) -> std::vector<Value> {
    Value B = cv[0], Vt = cv[1];
    ir::Shape hs(DType::kS64, {h}), ns(DType::kS64, {big});
    Value r = ir::Binary(Op::kRem, i, ir::ConstantInt(big - 1, DType::kS64));
    auto player = [&](const Value& pos) {  // pos 0 stays; the others rotate by r
      Value one = ir::Full(1, pos.shape()), mod = ir::Full(static_cast<double>(big - 1), pos.shape());
      Value p = ir::Binary(Op::kAdd, ir::Binary(Op::kRem, ir::Binary(Op::kAdd, ir::Binary(Op::kSub, pos, one),
                                                                      ir::BroadcastInDim(r, pos.dims(), {})), mod), one);
      return ir::Select(ir::Compare(CompareDir::kEQ, pos, ir::Full(0, pos.shape())), pos, p);
    };
    Value k = ir::Iota(hs, 0);
    Value top1 = player(k);
    Value bot1 = player(ir::Binary(Op::kSub, ir::Full(static_cast<double>(big - 1), hs), k));
    // inverse: player q sits at pos(q) = 1 + ((q - 1 - r) mod (N - 1)) (q > 0), its concat index is
    // pos for pos < N/2, else N/2 + (N - 1 - pos)
    Value q = ir::Iota(ns, 0);
    Value nm1 = ir::Full(static_cast<double>(big - 1), ns), one = ir::Full(1, ns);
    Value shifted = ir::Binary(Op::kSub, ir::Binary(Op::kAdd, q, nm1), ir::Binary(Op::kAdd, one, ir::BroadcastInDim(r, {big}, {})));
    Value pos = ir::Binary(Op::kAdd, ir::Binary(Op::kRem, shifted, nm1), one);
    pos = ir::Select(ir::Compare(CompareDir::kEQ, q, ir::Full(0, ns)), q, pos);
    Value inv1 = ir::Select(ir::Compare(CompareDir::kLT, pos, ir::Full(static_cast<double>(h), ns)), pos,
                            ir::Binary(Op::kSub, ir::Full(static_cast<double>(big - 1 + h), ns), pos));
    Value top = ir::BroadcastInDim(top1, {bt, h}, {1}), bot = ir::BroadcastInDim(bot1, {bt, h}, {1});
    Value inv = ir::BroadcastInDim(inv1, {bt, big}, {1});
    // b_pp, b_qq, b_pq of each pair
    Value d = ir::Reshape(DiagOf(B), {bt, big, 1});
    Value app = ir::Reshape(GatherRows(d, top), {bt, h}), aqq = ir::Reshape(GatherRows(d, bot), {bt, h});
    Value rows = GatherRows(B, top);  // [B, h, N]
    ir::Shape rs(DType::kS64, {bt, h, big});
    Value hit = ir::Compare(CompareDir::kEQ, ir::Iota(rs, 2), ir::BroadcastInDim(bot, {bt, h, big}, {0, 1}));
    Value apq = ir::Reduce(ir::ReduceKind::kSum, ir::Select(hit, rows, ir::Full(0, rows.shape())), {2});
    // Golub & Van Loan's sym.schur2: tau = (a_qq - a_pp) / (2 a_pq), t = sign(tau) / (|tau| + sqrt(1 + tau^2))
    ir::Shape ps(t, {bt, h});
    Value zero = ir::Full(0, ps), onef = ir::Full(1, ps);
    Value skip = ir::Compare(CompareDir::kEQ, apq, zero);
    Value safe = ir::Select(skip, onef, apq);
    Value tau = ir::Binary(Op::kDiv, ir::Binary(Op::kSub, aqq, app), ir::Binary(Op::kMul, ir::Full(2, ps), safe));
    Value root = ir::Unary(Op::kSqrt, ir::Binary(Op::kAdd, onef, ir::Binary(Op::kMul, tau, tau)));
    Value tt = ir::Binary(Op::kDiv, onef, ir::Binary(Op::kAdd, ir::Unary(Op::kAbs, tau), root));
    tt = ir::Select(ir::Compare(CompareDir::kLT, tau, zero), ir::Unary(Op::kNeg, tt), tt);
    tt = ir::Select(skip, zero, tt);
    Value c = ir::Unary(Op::kRsqrt, ir::Binary(Op::kAdd, onef, ir::Binary(Op::kMul, tt, tt)));
    Value s = ir::Binary(Op::kMul, tt, c);
    // B <- J^T B J (rows, then columns), V <- V J (rows of V^T)
    Value b1 = RotateRows(B, top, bot, inv, c, s);
    Value b2 = MatT(RotateRows(MatT(b1), top, bot, inv, c, s));
    return {b2, RotateRows(Vt, top, bot, inv, c, s)};
  };
  std::vector<Value> out = ir::ForLoop(sweeps * (big - 1), {b, vt}, step);
  b = out[0];
  vt = out[1];
  if (big != n) {
    b = ir::Slice(b, {0, 0, 0}, {bt, n, n}, {1, 1, 1});
    vt = ir::Slice(vt, {0, 0, 0}, {bt, n, n}, {1, 1, 1});
  }
  return {b, vt};
}

// Eigendecomposition of symmetric [B, n, n] matrices (the `lower` or upper triangle is read):
// (eigenvalues [B, n] ascending, eigenvectors [B, n, n] as columns).
std::pair<Value, Value> SymmetricEigen(const Value& x, bool lower) {
  int64_t bt = x.dims()[0], n = x.dims()[1];
  Value a = ir::Select(IndexCompare(x, lower ? CompareDir::kGE : CompareDir::kLE), x, MatT(x));
  auto [vecs, vals] = ir::Eigh(a, true, kEighMaxSweeps, EighTol(x.dtype()));
  DType t = x.dtype();
  Value b = ir::DotGeneral(vecs, ir::DotGeneral(a, vecs, {0}, {0}, {2}, {1}, t), {0}, {0}, {1}, {1}, t);  // V^T A V
  auto [bd, vt] = JacobiSweeps(b, MatT(vecs), kRefineSweeps);
  Value w = DiagOf(bd);
  // ascending (refinement can reorder near-equal eigenvalues); rows of V^T follow
  std::vector<Value> sorted = ir::Sort({w, ir::Iota(ir::Shape(DType::kS64, {bt, n}), 1)}, 1, false, true);
  return {sorted[0], MatT(GatherRows(vt, sorted[1]))};
}

// Eager's LAPACK (syevd) fails to converge on a NaN in the triangle it reads and raises
// LinAlgError from the host (an infinity gives NaN eigenvalues, no error): the same condition as a
// check, raised at the next sync or host read.
void CheckNoNan(const Value& x, bool lower, int device) {
  Value tri = ir::Select(IndexCompare(x, lower ? CompareDir::kGE : CompareDir::kLE), x, ir::Full(0, x.shape()));
  std::vector<int64_t> all(x.rank());
  for (int i = 0; i < x.rank(); ++i) all[i] = i;
  Value ok = ir::Reduce(ir::ReduceKind::kAnd, ir::Compare(CompareDir::kEQ, tri, tri), all);
  graph::AddCheck(ok, "linalg.eigh: The algorithm failed to converge because the input matrix is ill-conditioned or "
                      "has too many repeated eigenvalues (the input holds a NaN)", device, /*runtime_error=*/true);
}

// Q of a [B, m, k] matrix's Householder QR, each column's sign set so that R's diagonal is >= 0
// (columns beyond k, in complete mode, as Householder leaves them).
Value OrthonormalColumns(const Value& x, bool complete) {
  Qr f = HouseholderQr(x, complete);
  int64_t bt = x.dims()[0], m = x.dims()[1], k = x.dims()[2], qc = f.q.dims()[2];
  Value d = DiagOf(ir::Slice(f.r, {0, 0, 0}, {bt, k, k}, {1, 1, 1}));  // [B, k]
  Value neg = ir::Compare(CompareDir::kLT, d, ir::Full(0, d.shape()));
  Value sg = ir::Select(neg, ir::Full(-1, d.shape()), ir::Full(1, d.shape()));
  if (qc > k) sg = ir::Concatenate({sg, ir::Full(1, ir::Shape(d.dtype(), {bt, qc - k}))}, 1);
  return ir::Binary(Op::kMul, f.q, ir::BroadcastInDim(sg, {bt, m, qc}, {0, 2}));
}

// SVD of [B, m, n] through the eigendecomposition of its symmetric embedding [[0, A], [A^T, 0]]:
// eigenvalues +-sigma (and |m - n| zeros), eigenvectors [u; +-v] / sqrt(2). The k = min(m, n)
// largest give S (descending) and the matching halves u, v; a Householder QR of each half makes
// them orthonormal to working precision (and completes them for zero singular values or
// full_matrices), keeping the pairing signs (R's diagonal made positive).
struct Svd {
  Value u, s, vh;
};
Svd SymmetricEmbeddingSvd(const Value& a, bool full, bool compute_uv) {
  int64_t bt = a.dims()[0], m = a.dims()[1], n = a.dims()[2], k = std::min(m, n), sz = m + n;
  DType t = a.dtype();
  Value zero = ir::Constant(0, t);
  Value top = ir::Pad(a, zero, {0, 0, m}, {0, 0, 0}, {0, 0, 0});              // [B, m, m + n]
  Value bottom = ir::Pad(MatT(a), zero, {0, 0, 0}, {0, 0, n}, {0, 0, 0});     // [B, n, m + n]
  Value j = ir::Concatenate({top, bottom}, 1);
  auto [vals, vecs] = SymmetricEigen(j, true);
  Value s = ir::Reverse(ir::Slice(vals, {0, sz - k}, {bt, sz}, {1, 1}), {1});
  s = ir::Binary(Op::kMax, s, ir::Full(0, s.shape()));
  if (!compute_uv) return {Value(), s, Value()};
  Value x = ir::Reverse(ir::Slice(vecs, {0, 0, sz - k}, {bt, sz, sz}, {1, 1, 1}), {2});  // [B, m + n, k]
  Value uh = ir::Slice(x, {0, 0, 0}, {bt, m, k}, {1, 1, 1});
  Value vv = ir::Slice(x, {0, m, 0}, {bt, sz, k}, {1, 1, 1});
  Value u = OrthonormalColumns(uh, full);
  Value v = OrthonormalColumns(vv, full);
  return {u, s, MatT(v)};
}
}  // namespace

void AddLinalgRows(std::vector<OpRow>& rows) {
  rows.push_back({"linalg_qr", [](OpArgs& a) -> V {
    Value x = a.V(0);
    std::string mode = a.IsNone(1) ? "reduced" : a.Str(1);
    int r = x.rank();
    if (r < 2 || !LinalgType(x.dtype())) throw NotLowered{};
    if (mode != "reduced" && mode != "complete" && mode != "r") throw NotLowered{};  // eager's error
    int64_t m = x.dims()[r - 2], n = x.dims()[r - 1];
    if (std::max(m, n) > kMaxLu) throw NotLowered{};
    auto batch = BatchOf(x);
    if (x.shape().numel() == 0) {  // Q: the identity's first columns; R: zeros
      int64_t k0 = std::min(m, n), qc = mode == "complete" ? m : k0;
      ir::Shape qs(x.dtype(), With(batch, {m, qc}));
      Value eye = ir::Select(IndexCompare(ir::Full(0, qs), CompareDir::kEQ), ir::Full(1, qs), ir::Full(0, qs));
      Value R = ir::Full(0, ir::Shape(x.dtype(), With(batch, {mode == "complete" ? m : k0, n})));
      if (mode == "r") return {ir::Full(0, ir::Shape(x.dtype(), {0})), R};
      return {eye, R};
    }
    Qr f = HouseholderQr(ir::Reshape(x, {ProductOf(batch), m, n}), mode == "complete");
    int64_t k = std::min(m, n);
    Value R = ir::Reshape(f.r, With(batch, {mode == "complete" ? m : k, n}));
    if (mode == "r") return {ir::Full(0, ir::Shape(x.dtype(), {0})), R};
    return {ir::Reshape(f.q, With(batch, {m, mode == "complete" ? m : k})), R};
  }});
  rows.push_back({"linalg_cholesky_ex", [](OpArgs& a) -> V {
    Value x = a.V(0);
    bool upper = a.Bool(1);
    if (a.Bool(2)) throw NotLowered{};  // check_errors: eager's kernel raises from the host
    RequireSquare(x);
    if (x.shape().numel() == 0) return {ir::Full(0, x.shape()), ir::Full(0, ir::Shape(DType::kS32, BatchOf(x)))};
    Value l = ir::Cholesky(x, !upper);
    Value ok = DiagonalPositive(l);
    Value info = CholeskyInfo(x, ok, !upper);
    return {KeepTriangle(l, !upper), info};
  }});
  rows.push_back({"linalg_solve_triangular", [](OpArgs& a) -> V {
    Value A = a.V(0), B = a.V(1);
    bool upper = a.Bool(2), left = a.Bool(3, true), unit = a.Bool(4);
    RequireSquare(A);
    if (B.rank() < 2 || B.dtype() != A.dtype()) throw NotLowered{};
    int64_t n = A.dims()[A.rank() - 1];
    if (B.dims()[B.rank() - (left ? 2 : 1)] != n) throw NotLowered{};
    auto batch = BroadcastShapes(BatchOf(A), BatchOf(B));
    if (ProductOf(batch) * B.shape().numel() == 0 || A.shape().numel() == 0) {
      auto dims = batch;
      dims.push_back(B.dims()[B.rank() - 2]);
      dims.push_back(B.dims()[B.rank() - 1]);
      return {ir::Full(0, ir::Shape(B.dtype(), dims))};
    }
    return {ir::TriangularSolve(ToBatch(A, batch), ToBatch(B, batch), left, !upper, unit, false)};
  }});
  rows.push_back({"triangular_solve", [](OpArgs& a) -> V {
    Value B = a.V(0), A = a.V(1);
    bool upper = a.Bool(2, true), transpose = a.Bool(3), unit = a.Bool(4);
    RequireSquare(A);
    if (B.rank() < 2 || B.dtype() != A.dtype()) throw NotLowered{};
    if (B.dims()[B.rank() - 2] != A.dims()[A.rank() - 1]) throw NotLowered{};
    auto batch = BroadcastShapes(BatchOf(A), BatchOf(B));
    Value Ab = ToBatch(A, batch);
    if (Ab.shape().numel() == 0 || ProductOf(batch) * B.shape().numel() == 0) {
      auto dims = batch;
      dims.push_back(B.dims()[B.rank() - 2]);
      dims.push_back(B.dims()[B.rank() - 1]);
      return {ir::Full(0, ir::Shape(B.dtype(), dims)), Ab};
    }
    return {ir::TriangularSolve(Ab, ToBatch(B, batch), true, !upper, unit, transpose), Ab};
  }});
  rows.push_back({"_cholesky_solve_helper", [](OpArgs& a) -> V {
    Value B = a.V(0), F = a.V(1);
    bool upper = a.Bool(2);
    RequireSquare(F);
    if (B.rank() != F.rank() || B.dtype() != F.dtype() || BatchOf(B) != BatchOf(F) ||
        B.dims()[B.rank() - 2] != F.dims()[F.rank() - 1]) {
      throw NotLowered{};
    }
    if (B.shape().numel() == 0 || F.shape().numel() == 0) return {ir::Full(0, B.shape())};
    return {CholeskySolve(B, F, upper)};
  }});

  rows.push_back({"linalg_lu_factor_ex", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (!a.Bool(1, true) || a.Bool(2)) throw NotLowered{};  // pivot=False / check_errors: the CPU's
    int r = x.rank();
    if (r < 2 || !LinalgType(x.dtype())) throw NotLowered{};
    int64_t rows = x.dims()[r - 2], n = x.dims()[r - 1], k = std::min(rows, n);
    if (std::max(rows, n) > kMaxLu) throw NotLowered{};
    auto batch = BatchOf(x);
    if (x.shape().numel() == 0) {
      return {ir::Full(0, x.shape()), ir::Full(1, ir::Shape(DType::kS32, With(batch, {k}))),
              ir::Full(0, ir::Shape(DType::kS32, batch))};
    }
    Lu f = LuFactor(ir::Reshape(x, {ProductOf(batch), rows, n}));
    return {ir::Reshape(f.lu, x.dims()), ir::Reshape(f.pivots, With(batch, {k})), ir::Reshape(f.info, batch)};
  }});
  rows.push_back({"linalg_inv_ex", [](OpArgs& a) -> V {
    Value x = a.V(0);
    if (a.Bool(1)) throw NotLowered{};
    RequireLu(x, true);
    if (x.shape().numel() == 0) return {ir::Full(0, x.shape()), ir::Full(0, ir::Shape(DType::kS32, BatchOf(x)))};
    Value xf = FlattenBatch(x);
    Lu f = LuFactor(xf);
    Value eye = ir::Select(ir::Compare(CompareDir::kEQ, ir::Iota(ir::Shape(DType::kS64, xf.dims()), 1),
                                       ir::Iota(ir::Shape(DType::kS64, xf.dims()), 2)),
                           ir::Full(1, xf.shape()), ir::Full(0, xf.shape()));
    return {ir::Reshape(LuSolve(f, eye), x.dims()), ir::Reshape(f.info, BatchOf(x))};
  }});
  // det: eager factors A^T (contiguous A; XLA tensors always are), and returns that LU.
  // _linalg_slogdet (below) uses the same LU, with rounded products (see LuFactor).
  rows.push_back({"_linalg_det", [](OpArgs& a) -> V {
    Value x = a.V(0);
    RequireLu(x, true);
    auto batch = BatchOf(x);
    int64_t n = x.dims()[x.rank() - 1];
    if (x.shape().numel() == 0) {  // det of a 0 x 0 matrix is 1
      return {ir::Full(1, ir::Shape(x.dtype(), batch)), ir::Full(0, x.shape()),
              ir::Full(1, ir::Shape(DType::kS32, With(batch, {n})))};
    }
    Lu f = LuFactor(FlattenBatch(MatT(x)), /*rounded_products=*/true);  // exact zeros as LAPACK
    Value det = ir::Reduce(ir::ReduceKind::kProd, DiagOf(f.lu), {1});
    det = ir::Select(OddSwaps(f.pivots), ir::Unary(Op::kNeg, det), det);
    return {ir::Reshape(det, batch), ir::Reshape(f.lu, x.dims()), ir::Reshape(f.pivots, With(batch, {n}))};
  }});
  // _linalg_slogdet(A) -> (sign, logabsdet, LU, pivots), as eager: the LU of A^T, sign = the product
  // of sgn(diag U) ((0 < u) - (u < 0): NaN gives 0, as torch.sgn) times the permutation's sign,
  // logabsdet = sum log|diag U| (-inf for an exact zero pivot).
  rows.push_back({"_linalg_slogdet", [](OpArgs& a) -> V {
    Value x = a.V(0);
    RequireLu(x, true);
    auto batch = BatchOf(x);
    int64_t n = x.dims()[x.rank() - 1];
    if (x.shape().numel() == 0) {  // a 0 x 0 matrix: sign 1, logabsdet 0
      return {ir::Full(1, ir::Shape(x.dtype(), batch)), ir::Full(0, ir::Shape(x.dtype(), batch)),
              ir::Full(0, x.shape()), ir::Full(1, ir::Shape(DType::kS32, With(batch, {n})))};
    }
    Lu f = LuFactor(FlattenBatch(MatT(x)), /*rounded_products=*/true);
    Value d = DiagOf(f.lu);  // [B, n]
    Value zero = ir::Full(0, d.shape());
    Value sgn = ir::Binary(Op::kSub, Cast(ir::Compare(CompareDir::kGT, d, zero), d.dtype()),
                           Cast(ir::Compare(CompareDir::kLT, d, zero), d.dtype()));
    Value sign = ir::Reduce(ir::ReduceKind::kProd, sgn, {1});
    sign = ir::Select(OddSwaps(f.pivots), ir::Unary(Op::kNeg, sign), sign);
    Value logabs = ir::Reduce(ir::ReduceKind::kSum, ir::Unary(Op::kLog, ir::Unary(Op::kAbs, d)), {1});
    return {ir::Reshape(sign, batch), ir::Reshape(logabs, batch), ir::Reshape(f.lu, x.dims()),
            ir::Reshape(f.pivots, With(batch, {n}))};
  }});
  // _linalg_solve_ex(A, B, left, check_errors) -> (result, LU, pivots, info); LU is A's.
  rows.push_back({"_linalg_solve_ex", [](OpArgs& a) -> V {
    Value A = a.V(0), B = a.V(1);
    bool left = a.Bool(2, true);
    if (a.Bool(3)) throw NotLowered{};
    RequireLu(A, true);
    if (B.dtype() != A.dtype() || B.rank() < 1) throw NotLowered{};
    int64_t n = A.dims()[A.rank() - 1];
    auto abatch = BatchOf(A);
    // eager's vector case: B is [n] or A's batch + [n]
    std::vector<int64_t> vec_dims = abatch;
    vec_dims.push_back(n);
    bool vector = B.rank() == 1 || (B.rank() == A.rank() - 1 && B.dims() == vec_dims);
    if (vector && !left) throw NotLowered{};  // eager's error
    Value b = vector ? ir::Reshape(B, With(B.rank() == 1 ? std::vector<int64_t>{} : std::vector<int64_t>(B.dims().begin(), B.dims().end() - 1), {n, 1})) : B;
    if (b.rank() < 2 || b.dims()[b.rank() - (left ? 2 : 1)] != n) throw NotLowered{};
    auto batch = BroadcastShapes(abatch, BatchOf(b));
    Value Ab = ToBatch(A, batch);
    if (Ab.shape().numel() == 0 || ProductOf(batch) * b.shape().numel() == 0) {
      std::vector<int64_t> rd = With(batch, {b.dims()[b.rank() - 2], b.dims()[b.rank() - 1]});
      Value r = ir::Full(0, ir::Shape(B.dtype(), vector ? With(batch, {n}) : rd));
      return {r, ir::Full(0, Ab.shape()), ir::Full(1, ir::Shape(DType::kS32, With(batch, {n}))),
              ir::Full(0, ir::Shape(DType::kS32, batch))};
    }
    Value af = FlattenBatch(Ab);
    Lu f = LuFactor(af);
    Value bb = FlattenBatch(ToBatch(b, batch));
    Value r = left ? LuSolve(f, bb) : MatT(LuSolveTransposed(f, MatT(bb)));
    std::vector<int64_t> rdims = batch;
    rdims.push_back(b.dims()[b.rank() - 2]);
    rdims.push_back(b.dims()[b.rank() - 1]);
    r = ir::Reshape(r, rdims);
    if (vector) r = ir::Reshape(r, With(batch, {n}));
    return {r, ir::Reshape(f.lu, With(batch, {n, n})), ir::Reshape(f.pivots, With(batch, {n})), ir::Reshape(f.info, batch)};
  }});
  // linalg_lu_solve(LU, pivots, B, left, adjoint)
  rows.push_back({"linalg_lu_solve", [](OpArgs& a) -> V {
    Value LU = a.V(0), piv = a.V(1), B = a.V(2);
    bool left = a.Bool(3, true), adjoint = a.Bool(4);
    RequireLu(LU, true);
    if (B.dtype() != LU.dtype() || B.rank() < 2 || piv.dtype() != DType::kS32 || BatchOf(LU) != BatchOf(B) ||
        std::vector<int64_t>(piv.dims().begin(), piv.dims().end() - 1) != BatchOf(LU)) {
      throw NotLowered{};
    }
    int64_t n = LU.dims()[LU.rank() - 1];
    if (B.dims()[B.rank() - (left ? 2 : 1)] != n) throw NotLowered{};
    if (B.shape().numel() == 0 || LU.shape().numel() == 0) return {ir::Full(0, B.shape())};
    Lu f;
    f.lu = FlattenBatch(LU);
    f.pivots = ir::Reshape(piv, {f.lu.dims()[0], n});
    f.perm = PermOfPivots(f.pivots);
    Value b = FlattenBatch(B);
    // left: A X = B (or A^T X = B); right: X A = B <=> A^T X^T = B^T (or X A^T = B <=> A X^T = B^T).
    Value r;
    if (left) {
      r = adjoint ? LuSolveTransposed(f, b) : LuSolve(f, b);
    } else {
      r = MatT(adjoint ? LuSolve(f, MatT(b)) : LuSolveTransposed(f, MatT(b)));
    }
    return {ir::Reshape(r, B.dims())};
  }});

  // _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues ascending, eigenvectors as columns): XLA's
  // Jacobi eigensolver on the UPLO triangle (eigenvector signs are the solver's, not LAPACK's).
  rows.push_back({"_linalg_eigh", [](OpArgs& a) -> V {
    Value x = a.V(0);
    std::string uplo = a.IsNone(1) ? "L" : a.Str(1);
    bool compute_v = a.Bool(2, true);
    RequireSquare(x);
    if ((uplo != "L" && uplo != "U" && uplo != "l" && uplo != "u") || x.dims()[x.rank() - 1] > kMaxEigh) {
      throw NotLowered{};  // eager's error / LAPACK for large matrices
    }
    auto batch = BatchOf(x);
    int64_t n = x.dims()[x.rank() - 1];
    Value none = ir::Full(0, ir::Shape(x.dtype(), {0}));
    if (x.shape().numel() == 0) {
      return {ir::Full(0, ir::Shape(x.dtype(), With(batch, {n}))), compute_v ? ir::Full(0, x.shape()) : none};
    }
    CheckNoNan(x, uplo == "L" || uplo == "l", a.device);
    auto [vals, vecs] = SymmetricEigen(FlattenBatch(x), uplo == "L" || uplo == "l");
    return {ir::Reshape(vals, With(batch, {n})), compute_v ? ir::Reshape(vecs, x.dims()) : none};
  }});
  // _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S descending, Vh).
  rows.push_back({"_linalg_svd", [](OpArgs& a) -> V {
    Value x = a.V(0);
    bool full = a.Bool(1), compute_uv = a.Bool(2, true);
    if (!a.IsNone(3)) throw NotLowered{};  // driver=: eager's error (cuSOLVER only)
    int r = x.rank();
    if (r < 2 || !LinalgType(x.dtype())) throw NotLowered{};
    int64_t m = x.dims()[r - 2], n = x.dims()[r - 1], k = std::min(m, n);
    if (m + n > kMaxSvd) throw NotLowered{};
    auto batch = BatchOf(x);
    DType t = x.dtype();
    int64_t uc = full ? m : k, vr = full ? n : k;
    Value none = ir::Full(0, ir::Shape(t, {0}));
    if (x.shape().numel() == 0) {  // S empty; U, Vh: the identity's leading columns / rows
      Value s = ir::Full(0, ir::Shape(t, With(batch, {k})));
      if (!compute_uv) return {none, s, none};
      auto eye = [&](int64_t rows, int64_t cols) {
        ir::Shape es(t, With(batch, {rows, cols}));
        Value z = ir::Full(0, es);
        return ir::Select(IndexCompare(z, CompareDir::kEQ), ir::Full(1, es), z);
      };
      return {eye(m, uc), s, eye(vr, n)};
    }
    Svd f = SymmetricEmbeddingSvd(ir::Reshape(x, {ProductOf(batch), m, n}), full, compute_uv);
    Value s = ir::Reshape(f.s, With(batch, {k}));
    if (!compute_uv) return {none, s, none};
    return {ir::Reshape(f.u, With(batch, {m, uc})), s, ir::Reshape(f.vh, With(batch, {vr, n}))};
  }});
  // linalg_pinv(A, atol, rtol, hermitian) as eager's composite: the SVD's (or, hermitian, the
  // eigendecomposition's) values above max(atol, rtol * largest) inverted, the others dropped; rtol
  // defaults to eps * max(m, n), or 0 when a positive atol is given.
  rows.push_back({"linalg_pinv.atol_rtol_tensor", [](OpArgs& a) -> V {
    Value x = a.V(0);
    bool herm = a.Bool(3);
    int r = x.rank();
    if (r < 2 || !LinalgType(x.dtype())) throw NotLowered{};
    int64_t m = x.dims()[r - 2], n = x.dims()[r - 1];
    if (herm ? (m != n || n > kMaxEigh) : (m + n > kMaxSvd)) throw NotLowered{};
    DType t = x.dtype();
    auto batch = BatchOf(x);
    std::optional<Value> atol = a.OptV(1), rtol = a.OptV(2);
    // The tolerance is computed in the promoted type of atol, rtol and A (pinverse and the float
    // overload pass float64 tensors): S is compared in that type.
    DType ct = t;
    for (const auto& v : {atol, rtol}) {
      if (v && ((v->dtype() != t && v->dtype() != DType::kF64) || BroadcastShapes(batch, v->dims()) != batch)) {
        throw NotLowered{};
      }
      if (v && v->dtype() == DType::kF64) ct = DType::kF64;
    }
    if (x.shape().numel() == 0) return {ir::Full(0, ir::Shape(t, With(batch, {n, m})))};
    int64_t bt = ProductOf(batch);
    ir::Shape cs(ct, {bt, 1});
    auto column = [&](const Value& v) { return Cast(ir::Reshape(BroadcastTo(v, batch), {bt, 1}), ct); };
    Value at = atol ? column(*atol) : ir::Full(0, cs);
    Value rt;
    if (rtol) {
      rt = column(*rtol);
    } else {
      double eps = t == DType::kF64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
      Value def = ir::Full(eps * static_cast<double>(std::max(m, n)), cs);
      rt = atol ? ir::Select(ir::Compare(CompareDir::kGT, at, ir::Full(0, cs)), ir::Full(0, cs), def) : def;
    }
    Value xf = ir::Reshape(x, {bt, m, n});
    auto invert = [&](const Value& s, const Value& mag, const Value& largest) {
      Value tol = ir::Binary(Op::kMax, at, ir::Binary(Op::kMul, rt, Cast(largest, ct)));
      Value tb = ir::BroadcastInDim(ir::Reshape(tol, {bt}), s.dims(), {0});
      return ir::Select(ir::Compare(CompareDir::kGT, Cast(mag, ct), tb), ir::Binary(Op::kDiv, ir::Full(1, s.shape()), s),
                        ir::Full(0, s.shape()));
    };
    Value res;
    if (herm) {
      CheckNoNan(xf, true, a.device);
      auto [w, v] = SymmetricEigen(xf, true);
      Value mag = ir::Unary(Op::kAbs, w);
      Value largest = ir::Reshape(ir::Reduce(ir::ReduceKind::kMax, mag, {1}), {bt, 1});
      Value sp = invert(w, mag, largest);
      Value vs = ir::Binary(Op::kMul, v, ir::BroadcastInDim(sp, {bt, n, n}, {0, 2}));
      res = ir::DotGeneral(vs, v, {0}, {0}, {2}, {2}, t);
    } else {
      Svd f = SymmetricEmbeddingSvd(xf, false, true);
      int64_t k = std::min(m, n);
      Value largest = ir::Slice(f.s, {0, 0}, {bt, 1}, {1, 1});
      Value sp = invert(f.s, f.s, largest);
      Value vs = ir::Binary(Op::kMul, MatT(f.vh), ir::BroadcastInDim(sp, {bt, n, k}, {0, 2}));
      res = ir::DotGeneral(vs, f.u, {0}, {0}, {2}, {2}, t);  // [B, n, m]
    }
    return {ir::Reshape(res, With(batch, {n, m}))};
  }});
  rows.push_back({"cholesky_inverse", [](OpArgs& a) -> V {
    Value F = a.V(0);
    bool upper = a.Bool(1);
    RequireSquare(F);
    if (F.shape().numel() == 0) return {ir::Full(0, F.shape())};
    int r = F.rank();
    Value eye = ir::Select(IndexCompare(F, CompareDir::kEQ), ir::Full(1, F.shape()), ir::Full(0, F.shape()));
    Value inv = CholeskySolve(eye, F, upper);
    // Eager's result is exactly symmetric (LAPACK's potri fills one triangle, torch mirrors it).
    std::vector<int64_t> perm(r);
    for (int i = 0; i < r; ++i) perm[i] = i;
    std::swap(perm[r - 1], perm[r - 2]);
    return {ir::Select(IndexCompare(F, CompareDir::kGE), inv, ir::Transpose(inv, perm))};
  }});
}

}  // namespace txla::ops
