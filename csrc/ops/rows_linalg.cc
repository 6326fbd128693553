// Op table rows: linear algebra on StableHLO's cholesky and triangular_solve (XLA expands both):
// linalg_cholesky_ex (LAPACK's `info`: the order of the first leading minor that is not
// positive-definite, found by bisection over masked leading blocks), linalg_solve_triangular,
// triangular_solve, _cholesky_solve_helper (cholesky_solve), cholesky_inverse. float32/float64 only;
// complex, reduced precision, empty and malformed inputs go to the CPU fallback (eager's errors).
#include <algorithm>
#include <cstdint>

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

}  // namespace

void AddLinalgRows(std::vector<OpRow>& rows) {
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
