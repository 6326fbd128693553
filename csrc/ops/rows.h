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
// ScalarType names as eager prints them in messages ('Long', 'Bool', 'Float', ...).
const char* ScalarTypeName(DType t);
}  // namespace txla::ops
