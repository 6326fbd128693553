// The in-memory compile cache's policy: a bounded LRU map, and the process's memory-map budget.
//
// Every executable XLA:CPU compiles holds its JIT-ed kernels in their own memory mappings (about
// 48 for a small graph: code, read-only and data pages per kernel module). Linux caps a process's
// mappings (vm.max_map_count, 65,530 by default), and an XLA compile that cannot map its code fails
// in a way that can take the interpreter down. So the cache is bounded twice: by entries
// (XLA_COMPILATION_CACHE_SIZE, default 2048 as upstream PyTorch/XLA) and by the mapping count, which
// is checked every few compiles and makes the least recently used half go when past half the limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <utility>

namespace txla::graph {

// A map that keeps at most `capacity` entries, dropping the least recently used one first.
template <class K, class V, class H>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // The value of `key` (now the most recently used), or nullptr.
  V* Find(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  // Inserts or replaces; returns how many entries were evicted to stay within capacity.
  size_t Insert(const K& key, V value) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
      return 0;
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    return EvictTo(capacity_);
  }

  // Drops least recently used entries until at most `n` remain; returns how many went.
  size_t EvictTo(size_t n) {
    size_t evicted = 0;
    while (order_.size() > n) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evicted;
    }
    return evicted;
  }

  void Clear() {
    index_.clear();
    order_.clear();
  }
  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::list<std::pair<K, V>> order_;  // most recently used first
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator, H> index_;
};

// XLA_COMPILATION_CACHE_SIZE (default 2048; read once).
size_t CompileCacheCapacity();

// The process's memory mappings now (lines of /proc/self/maps), or -1 where unknown.
int64_t ProcessMapCount();
// The kernel's per-process limit (vm.max_map_count; TXLA_MAX_MAP_COUNT overrides it, for tests),
// or -1 where unknown.
int64_t MaxMapCount();

// Called after each new compile: true when the cache should shed its least recently used half
// because the process holds more than half its mapping limit (checked every 32nd call, and at
// the first one, so its cost stays well below a compile's).
bool MapPressure();

}  // namespace txla::graph
