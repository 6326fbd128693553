#include "util/host_pool.h"

#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace txla::util {
namespace {

constexpr size_t kMaxFreeBytes = size_t(512) << 20;  // at most this much memory kept idle
constexpr size_t kMaxPerSize = 4;                     // buffers kept per size

struct Pool {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free;  // size -> idle buffers
  std::deque<std::pair<size_t, void*>> order;  // release order, to drop the oldest first
  size_t free_bytes = 0;
  int64_t hits = 0;
};

Pool& GetPool() {
  static Pool* pool = new Pool();  // never destroyed: buffers may come back during shutdown
  return *pool;
}

size_t RoundUp(size_t bytes) { return bytes == 0 ? 64 : (bytes + 63) / 64 * 64; }

}  // namespace

void* HostPoolAcquire(size_t bytes) {
  size_t size = RoundUp(bytes);
  Pool& pool = GetPool();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    auto it = pool.free.find(size);
    if (it != pool.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      pool.free_bytes -= size;
      ++pool.hits;
      for (auto o = pool.order.begin(); o != pool.order.end(); ++o) {
        if (o->second == p) {
          pool.order.erase(o);
          break;
        }
      }
      return p;
    }
  }
  void* p = std::aligned_alloc(64, size);
  if (!p) throw std::bad_alloc();
  return p;
}

void HostPoolRelease(void* p, size_t bytes) {
  if (!p) return;
  size_t size = RoundUp(bytes);
  Pool& pool = GetPool();
  std::vector<void*> drop;
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    auto& list = pool.free[size];
    if (size > kMaxFreeBytes || list.size() >= kMaxPerSize) {
      drop.push_back(p);
    } else {
      list.push_back(p);
      pool.order.emplace_back(size, p);
      pool.free_bytes += size;
      while (pool.free_bytes > kMaxFreeBytes && !pool.order.empty()) {
        auto [s, q] = pool.order.front();
        pool.order.pop_front();
        auto& l = pool.free[s];
        for (auto it = l.begin(); it != l.end(); ++it) {
          if (*it == q) {
            l.erase(it);
            break;
          }
        }
        pool.free_bytes -= s;
        drop.push_back(q);
      }
    }
  }
  for (void* q : drop) std::free(q);
}

size_t HostPoolFreeBytes() {
  std::lock_guard<std::mutex> lock(GetPool().mu);
  return GetPool().free_bytes;
}

int64_t HostPoolHits() {
  std::lock_guard<std::mutex> lock(GetPool().mu);
  return GetPool().hits;
}

}  // namespace txla::util
