// Internal: row groups of the op table.
#pragma once
#include "ops/op_table.h"

namespace txla::ops {
void AddElementwiseRows(std::vector<OpRow>& rows);
void AddShapeRows(std::vector<OpRow>& rows);
void AddReductionRows(std::vector<OpRow>& rows);
void AddNnRows(std::vector<OpRow>& rows);
void AddFactoryRows(std::vector<OpRow>& rows);
void AddConvRows(std::vector<OpRow>& rows);
void AddIndexRows(std::vector<OpRow>& rows);
void AddMathRows(std::vector<OpRow>& rows);
void AddSpecialRows(std::vector<OpRow>& rows);
void AddExtraRows(std::vector<OpRow>& rows);
void AddLinalgRows(std::vector<OpRow>& rows);
void AddBesselRows(std::vector<OpRow>& rows);
void AddHistcRows(std::vector<OpRow>& rows);
void AddAsStridedRows(std::vector<OpRow>& rows);
// After WrapLegality: foreach rows run the (checked) per-tensor rows.
void AddForeachRows(std::vector<OpRow>& rows);
// Eager's legality rules (legality.cc) run before the rows they name.
void WrapLegality(std::vector<OpRow>& rows);
// The type eager computes in: reduced-precision floats (bf16/f16) in float32, rounded once per aten
// op; composite rows do the same so intermediates are not rounded.
inline DType OpMath(DType t) { return t == DType::kBF16 || t == DType::kF16 ? DType::kF32 : t; }
// An operand of an op whose result dtype is t, in t's compute type. Eager's TensorIterator first
// converts every input to the common dtype on the CPU, so with a bf16/f16 result a 0-dim float32
// tensor, a Python number or an integer tensor is rounded to t before the float32 compute
// (float16 x ** 0-dim 1.0001 is x ** 1; fuzz seed 83783). Kernels that read a one-element operand
// 2 unrounded (mul, div: `original_scalar_value`) use Cast(v, OpMath(t)) for it instead.
inline Value ToOpMath(const Value& v, DType t) {
  return OpMath(t) != t && v.dtype() != t ? Cast(Cast(v, t), OpMath(t)) : Cast(v, OpMath(t));
}
// ScalarType names as eager prints them in messages ('Long', 'Bool', 'Float', ...).
const char* ScalarTypeName(DType t);
}  // namespace txla::ops
