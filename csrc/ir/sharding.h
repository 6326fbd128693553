// An XLA sharding of one array (the subset of HloSharding that SPMD here produces and reads back):
// replicated, or tiled over a tile-assignment array of device (partition) ids, optionally with the
// last tile dimension replicated (partial replication). Torch-free, runtime-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace txla::ir {

struct Sharding {
  enum class Kind { kReplicated, kTiled, kMaximal };
  Kind kind = Kind::kReplicated;
  std::vector<int64_t> tile_dims;  // tile assignment shape: rank dims (+1 when replicate_last)
  std::vector<int64_t> devices;    // the tile assignment, row-major (kMaximal: the one device)
  bool replicate_last = false;     // last_tile_dim_replicate

  static Sharding Replicated() { return Sharding(); }
  // Validates (ids unique, product of tile_dims = number of ids); throws std::invalid_argument.
  static Sharding Tiled(std::vector<int64_t> tile_dims, std::vector<int64_t> devices, bool replicate_last);

  bool IsReplicated() const { return kind == Kind::kReplicated; }
  // XLA's text: "{replicated}", "{devices=[2,1]0,1}", "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}".
  std::string ToString() const;
  bool operator==(const Sharding& o) const {
    return kind == o.kind && tile_dims == o.tile_dims && devices == o.devices && replicate_last == o.replicate_last;
  }
  bool operator!=(const Sharding& o) const { return !(*this == o); }

  // Number of data dimensions the tiling covers (tile_dims minus the replicated one).
  int DataRank() const { return static_cast<int>(tile_dims.size()) - (replicate_last ? 1 : 0); }
  // Shape of every shard of an array of `dims` (even tiling only; throws std::invalid_argument when a
  // dimension does not divide).
  std::vector<int64_t> ShardDims(const std::vector<int64_t>& dims) const;
  // Offset of device `device`'s shard in the global array (all zeros when replicated).
  std::vector<int64_t> ShardOffsets(int64_t device, const std::vector<int64_t>& dims) const;
  // Whether this device holds the first copy of its shard (replica 0 of its tile); for assembling.
  bool IsFirstReplica(int64_t device) const;
};
using ShardingPtr = std::shared_ptr<const Sharding>;
// Parses the text ToString() writes; throws std::invalid_argument for anything else.
ShardingPtr ParseShardingText(const std::string& text);

}  // namespace txla::ir
