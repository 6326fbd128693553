// Pointer -> int map with open addressing (linear probing) in one array: std::unordered_map
// allocates a node per entry, and a sync indexes every node of its graph (thousands per step).
// Torch-free. Null pointers are not valid keys.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace txla::util {

class PtrIndex {
 public:
  // Room for n keys without growing.
  void reserve(size_t n) {
    if (2 * n > slots_.size()) Rehash(2 * n);
  }
  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size() / 2; }
  // Empties the index, keeping its slots.
  void clear() {
    if (size_ != 0) std::fill(slots_.begin(), slots_.end(), Slot{});
    size_ = 0;
  }
  void swap(PtrIndex& o) noexcept {
    slots_.swap(o.slots_);
    std::swap(size_, o.size_);
  }
  bool count(const void* p) const { return find(p) != nullptr; }
  const int* find(const void* p) const {
    if (slots_.empty()) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = Hash(p) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key == p) return &s.value;
      if (s.key == nullptr) return nullptr;
    }
  }
  int at(const void* p) const {
    const int* v = find(p);
    if (v == nullptr) throw std::out_of_range("PtrIndex::at: key not present");
    return *v;
  }
  // Inserts p -> v; false (and no change) when p is already present.
  bool try_emplace(const void* p, int v) {
    if (p == nullptr) throw std::invalid_argument("PtrIndex: null key");
    if (2 * (size_ + 1) > slots_.size()) Rehash(2 * (size_ + 1));
    const size_t mask = slots_.size() - 1;
    for (size_t i = Hash(p) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.key == p) return false;
      if (s.key == nullptr) {
        s.key = p;
        s.value = v;
        ++size_;
        return true;
      }
    }
  }

 private:
  struct Slot {
    const void* key = nullptr;
    int value = 0;
  };
  static size_t Hash(const void* p) {
    uint64_t x = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<size_t>(x);
  }
  void Rehash(size_t want) {
    size_t cap = 16;
    while (cap < want) cap *= 2;
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(cap, Slot{});
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key != nullptr) try_emplace(s.key, s.value);
    }
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace txla::util
