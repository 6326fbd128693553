#include "ir/sharding.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <unordered_set>

namespace txla::ir {

Sharding Sharding::Tiled(std::vector<int64_t> tile_dims, std::vector<int64_t> devices, bool replicate_last) {
  int64_t n = 1;
  for (int64_t d : tile_dims) {
    if (d < 1) throw std::invalid_argument("sharding: tile assignment dimensions must be positive");
    n *= d;
  }
  if (n != static_cast<int64_t>(devices.size())) {
    throw std::invalid_argument("sharding: the tile assignment has " + std::to_string(devices.size()) +
                                " device ids for " + std::to_string(n) + " tiles");
  }
  std::unordered_set<int64_t> seen;
  for (int64_t d : devices) {
    if (!seen.insert(d).second) throw std::invalid_argument("sharding: device id " + std::to_string(d) + " appears twice");
  }
  if (replicate_last && tile_dims.empty()) throw std::invalid_argument("sharding: no tile dimension to replicate");
  Sharding s;
  bool all_one = true;
  for (size_t i = 0; i + (replicate_last ? 1 : 0) < tile_dims.size(); ++i) all_one = all_one && tile_dims[i] == 1;
  if (all_one) return Replicated();  // every device holds the whole array
  s.kind = Kind::kTiled;
  s.tile_dims = std::move(tile_dims);
  s.devices = std::move(devices);
  s.replicate_last = replicate_last;
  // A replicated last dimension of size 1 is plain tiling.
  if (s.replicate_last && s.tile_dims.back() == 1) {
    s.tile_dims.pop_back();
    s.replicate_last = false;
  }
  return s;
}

std::string Sharding::ToString() const {
  if (kind == Kind::kReplicated) return "{replicated}";
  if (kind == Kind::kMaximal) return "{maximal device=" + std::to_string(devices.empty() ? 0 : devices[0]) + "}";
  std::string s = "{devices=[";
  for (size_t i = 0; i < tile_dims.size(); ++i) s += (i ? "," : "") + std::to_string(tile_dims[i]);
  s += "]";
  for (size_t i = 0; i < devices.size(); ++i) s += (i ? "," : "") + std::to_string(devices[i]);
  if (replicate_last) s += " last_tile_dim_replicate";
  return s + "}";
}

std::vector<int64_t> Sharding::ShardDims(const std::vector<int64_t>& dims) const {
  if (kind != Kind::kTiled) return dims;
  if (DataRank() != static_cast<int>(dims.size())) {
    throw std::invalid_argument("sharding " + ToString() + " has " + std::to_string(DataRank()) +
                                " tiled dimensions but the tensor has rank " + std::to_string(dims.size()));
  }
  std::vector<int64_t> out(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] % tile_dims[i] != 0) {
      throw std::invalid_argument("dimension " + std::to_string(i) + " of size " + std::to_string(dims[i]) +
                                  " does not divide into " + std::to_string(tile_dims[i]) + " shards");
    }
    out[i] = dims[i] / tile_dims[i];
  }
  return out;
}

namespace {
// Position of `device` in the tile assignment (multi-index over tile_dims).
std::vector<int64_t> TileIndex(const Sharding& s, int64_t device) {
  auto it = std::find(s.devices.begin(), s.devices.end(), device);
  if (it == s.devices.end()) {
    throw std::invalid_argument("sharding " + s.ToString() + " does not place device " + std::to_string(device));
  }
  int64_t flat = it - s.devices.begin();
  std::vector<int64_t> idx(s.tile_dims.size());
  for (int i = static_cast<int>(s.tile_dims.size()) - 1; i >= 0; --i) {
    idx[i] = flat % s.tile_dims[i];
    flat /= s.tile_dims[i];
  }
  return idx;
}
}  // namespace

std::vector<int64_t> Sharding::ShardOffsets(int64_t device, const std::vector<int64_t>& dims) const {
  std::vector<int64_t> off(dims.size(), 0);
  if (kind != Kind::kTiled) return off;
  std::vector<int64_t> shard = ShardDims(dims);
  std::vector<int64_t> idx = TileIndex(*this, device);
  for (size_t i = 0; i < dims.size(); ++i) off[i] = idx[i] * shard[i];
  return off;
}

bool Sharding::IsFirstReplica(int64_t device) const {
  if (kind == Kind::kReplicated) return device == 0;
  if (kind == Kind::kMaximal) return !devices.empty() && device == devices[0];
  if (!replicate_last) return true;
  return TileIndex(*this, device).back() == 0;
}

ShardingPtr ParseShardingText(const std::string& text) {
  auto fail = [&]() { throw std::invalid_argument("cannot parse sharding '" + text + "'"); };
  if (text == "{replicated}") return std::make_shared<Sharding>(Sharding::Replicated());
  const std::string head = "{devices=[", tail = " last_tile_dim_replicate}";
  if (text.compare(0, head.size(), head) != 0 || text.back() != '}') fail();
  size_t i = head.size();
  // Comma-separated integers up to (not including) the first character that is neither.
  auto read_list = [&]() {
    std::vector<int64_t> out;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      size_t j = i;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      out.push_back(std::stoll(text.substr(i, j - i)));
      i = j;
      if (i < text.size() && text[i] == ',') ++i;
    }
    return out;
  };
  std::vector<int64_t> dims = read_list();
  if (i >= text.size() || text[i] != ']') fail();
  ++i;
  std::vector<int64_t> devices = read_list();
  bool replicate_last = false;
  if (text.compare(i, std::string::npos, tail) == 0) {
    replicate_last = true;
  } else if (text.compare(i, std::string::npos, "}") != 0) {
    fail();
  }
  return std::make_shared<Sharding>(Sharding::Tiled(dims, devices, replicate_last));
}

}  // namespace txla::ir
