// Typed 128-bit hashing: Hash(T) overloads and a variadic combiner.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "util/small_vec.h"

namespace txla {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Hash128& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
  std::string ToString() const;
};

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ULL)); }
};

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

inline Hash128 HashCombine(Hash128 h, uint64_t v) {
  h.lo = Mix64(h.lo ^ (v + 0x9E3779B97F4A7C15ULL + (h.lo << 6) + (h.lo >> 2)));
  h.hi = Mix64(h.hi + v * 0xD6E8FEB86659FD93ULL + 0x632BE59BD9B4E019ULL);
  return h;
}
inline Hash128 HashCombine(Hash128 h, Hash128 v) { return HashCombine(HashCombine(h, v.lo), v.hi); }

inline uint64_t HashValue(int64_t v) { return static_cast<uint64_t>(v); }
inline uint64_t HashValue(uint64_t v) { return v; }
inline uint64_t HashValue(int v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); }
inline uint64_t HashValue(bool v) { return v ? 0x51ULL : 0x17ULL; }
inline uint64_t HashValue(double v) { uint64_t b; std::memcpy(&b, &v, sizeof b); return b ^ 0xD0D0ULL; }
inline uint64_t HashValue(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) { h ^= c; h *= 1099511628211ULL; }
  return h;
}

inline Hash128 HashAll(Hash128 h) { return h; }
template <typename T, typename... Rest>
Hash128 HashAll(Hash128 h, const T& v, const Rest&... rest);

// A sequence: its length, then its elements. A SmallVec hashes as the std::vector of its elements.
template <typename Seq>
inline Hash128 HashSequence(Hash128 h, const Seq& v) {
  h = HashCombine(h, static_cast<uint64_t>(v.size()) ^ 0xABCDULL);
  for (const auto& x : v) h = HashOne(h, x);
  return h;
}
template <typename T>
inline Hash128 HashOne(Hash128 h, const std::vector<T>& v) { return HashSequence(h, v); }
template <typename T, size_t N>
inline Hash128 HashOne(Hash128 h, const util::SmallVec<T, N>& v) { return HashSequence(h, v); }
template <typename T>
inline Hash128 HashOne(Hash128 h, const T& v) { return HashCombine(h, HashValue(v)); }
inline Hash128 HashOne(Hash128 h, const Hash128& v) { return HashCombine(h, v); }
inline Hash128 HashOne(Hash128 h, const std::string& v) { return HashCombine(h, HashValue(std::string_view(v))); }

template <typename T, typename... Rest>
Hash128 HashAll(Hash128 h, const T& v, const Rest&... rest) {
  return HashAll(HashOne(h, v), rest...);
}

}  // namespace txla
