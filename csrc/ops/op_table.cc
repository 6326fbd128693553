#include "ops/op_table.h"

#include "ops/rows.h"

namespace txla::ops {

const std::vector<OpRow>& OpTable() {
  static const std::vector<OpRow>* table = [] {
    auto* rows = new std::vector<OpRow>();
    AddElementwiseRows(*rows);
    AddShapeRows(*rows);
    AddReductionRows(*rows);
    AddNnRows(*rows);
    AddFactoryRows(*rows);
    AddConvRows(*rows);
    AddIndexRows(*rows);
    AddMathRows(*rows);
    AddSpecialRows(*rows);
    AddExtraRows(*rows);
    AddLinalgRows(*rows);
    AddBesselRows(*rows);
    AddHistcRows(*rows);
    AddAsStridedRows(*rows);
    WrapLegality(*rows);
    AddForeachRows(*rows);
    return rows;
  }();
  return *table;
}

const OpRow* FindOp(const std::string& aten) {
  static const auto* index = [] {
    auto* m = new std::unordered_map<std::string, const OpRow*>();
    for (const auto& r : OpTable()) (*m)[r.aten] = &r;
    return m;
  }();
  auto it = index->find(aten);
  return it == index->end() ? nullptr : it->second;
}

}  // namespace txla::ops
