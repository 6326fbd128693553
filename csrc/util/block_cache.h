// Per-thread caches of freed fixed-size blocks for the few objects that every traced op creates and
// every sync frees by the thousand (IR nodes, tensor records, tensor impls). glibc serves blocks of
// these sizes (> its fastbin limit) from its bins: once a sync has freed the previous graph, the next
// step's allocations sort and split the coalesced free chunks, which cost more host time than
// the tracing itself on some machines (issue #12: a 2x slower forward than with mimalloc). A cache
// hands a freed block back to the next allocation of the same size on that thread, LIFO.
//
// Any thread may free a block any other thread allocated: the block joins the freeing thread's
// cache, and blocks beyond kMaxBlocks (or freed while a thread exits) go back to ::operator delete.
// Torch-free.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

namespace txla::util {

// TXLA_BLOCK_CACHE=0 turns the caches off (every block from ::operator new; for A/B measurements).
inline bool BlockCacheEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("TXLA_BLOCK_CACHE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

template <size_t kSize>
class BlockCache {
  static_assert(kSize >= sizeof(void*), "a block must hold the free-list link");

 public:
  static constexpr size_t kMaxBlocks = size_t{1} << 16;  // per thread and size

  static void* Get() {
    if (!BlockCacheEnabled()) return ::operator new(kSize);
    State& s = state();
    if (Free* f = s.head) {
      s.head = f->next;
      --s.count;
      return f;
    }
    return ::operator new(kSize);
  }

  static void Put(void* p) noexcept {
    State& s = state();
    if (s.closed || s.count >= kMaxBlocks || !BlockCacheEnabled()) {
      ::operator delete(p);
      return;
    }
    Free* f = static_cast<Free*>(p);
    f->next = s.head;
    s.head = f;
    ++s.count;
    if (!s.drain_registered) RegisterDrain(&s);
  }

 private:
  struct Free { Free* next; };
  // Trivially destructible, so reading it is valid for the whole life of the thread, including from
  // other thread-local destructors that run after the drain below.
  struct State {
    Free* head;
    size_t count;
    bool closed;
    bool drain_registered;
  };
  static State& state() {
    thread_local State s{nullptr, 0, false, false};
    return s;
  }
  // Frees the cached blocks when the thread exits; later Puts go straight to ::operator delete.
  struct Drain {
    State* s = nullptr;
    ~Drain() {
      if (!s) return;
      s->closed = true;
      while (Free* f = s->head) {
        s->head = f->next;
        ::operator delete(f);
      }
      s->count = 0;
    }
  };
  static void RegisterDrain(State* s) noexcept {
    thread_local Drain d;
    d.s = s;
    s->drain_registered = true;
  }
};

// A std allocator that takes single objects from BlockCache (arrays go to ::operator new): for
// std::allocate_shared, which rebinds it to its control block + object type.
template <class T>
struct CachedAllocator {
  using value_type = T;
  CachedAllocator() noexcept = default;
  template <class U>
  CachedAllocator(const CachedAllocator<U>&) noexcept {}
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned types are not cached");
  T* allocate(size_t n) {
    if (n == 1) return static_cast<T*>(BlockCache<sizeof(T)>::Get());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n == 1) {
      BlockCache<sizeof(T)>::Put(p);
    } else {
      ::operator delete(p);
    }
  }
  template <class U>
  bool operator==(const CachedAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CachedAllocator<U>&) const noexcept { return false; }
};

// std::make_shared through the block caches.
template <class T, class... Args>
std::shared_ptr<T> MakeCachedShared(Args&&... args) {
  return std::allocate_shared<T>(CachedAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace txla::util
