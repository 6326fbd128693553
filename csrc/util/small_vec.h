// A vector that holds up to N elements inside itself and only goes to the heap beyond that. IR nodes
// keep their operands and result shapes in one (issue #12): nearly every node has at most three
// operands and one result, so building a node no longer allocates two small heap blocks that the sync
// frees again by the thousand (glibc's fast bins then cost a consolidation at the next large
// allocation). The interface is the subset of std::vector the IR uses. Torch-free.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace txla::util {

template <class T, size_t N>
class SmallVec {
  static_assert(N > 0, "SmallVec needs room for at least one element inline");

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;
  using size_type = size_t;

  SmallVec() = default;
  SmallVec(std::initializer_list<T> xs) { Append(xs.begin(), xs.end()); }
  // Implicit, so code that builds a std::vector keeps passing it where a SmallVec is expected.
  SmallVec(std::vector<T>&& xs) {  // NOLINT(google-explicit-constructor)
    reserve(xs.size());
    for (T& x : xs) new (ptr_ + size_++) T(std::move(x));
  }
  SmallVec(const std::vector<T>& xs) { Append(xs.begin(), xs.end()); }  // NOLINT
  template <class It, class = std::enable_if_t<!std::is_integral_v<It>>>
  SmallVec(It b, It e) {
    for (; b != e; ++b) emplace_back(*b);
  }
  explicit SmallVec(size_t n, const T& v = T()) { resize(n, v); }
  SmallVec(const SmallVec& o) { Append(o.begin(), o.end()); }
  SmallVec(SmallVec&& o) noexcept { Steal(o); }
  SmallVec& operator=(const SmallVec& o) {
    if (this != &o) {
      clear();
      Append(o.begin(), o.end());
    }
    return *this;
  }
  SmallVec& operator=(SmallVec&& o) noexcept {
    if (this != &o) {
      Release();
      Steal(o);
    }
    return *this;
  }
  ~SmallVec() { Release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return cap_; }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  T& operator[](size_t i) { return ptr_[i]; }
  const T& operator[](size_t i) const { return ptr_[i]; }
  T& at(size_t i) {
    if (i >= size_) throw std::out_of_range("SmallVec::at");
    return ptr_[i];
  }
  const T& at(size_t i) const { return const_cast<SmallVec*>(this)->at(i); }
  T& front() { return ptr_[0]; }
  const T& front() const { return ptr_[0]; }
  T& back() { return ptr_[size_ - 1]; }
  const T& back() const { return ptr_[size_ - 1]; }
  T* begin() { return ptr_; }
  T* end() { return ptr_ + size_; }
  const T* begin() const { return ptr_; }
  const T* end() const { return ptr_ + size_; }

  void reserve(size_t n) {
    if (n <= cap_) return;
    T* p = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignof(T))));
    for (size_t i = 0; i < size_; ++i) {
      new (p + i) T(std::move(ptr_[i]));
      ptr_[i].~T();
    }
    FreeHeap();
    ptr_ = p;
    cap_ = static_cast<uint32_t>(n);
  }
  void push_back(const T& x) { emplace_back(x); }
  void push_back(T&& x) { emplace_back(std::move(x)); }
  template <class... A>
  T& emplace_back(A&&... a) {
    if (size_ == cap_) {
      T tmp(std::forward<A>(a)...);  // `a` may refer to an element that growing moves
      reserve(std::max<size_t>(2 * cap_, N));
      return *new (ptr_ + size_++) T(std::move(tmp));
    }
    return *new (ptr_ + size_++) T(std::forward<A>(a)...);
  }
  void pop_back() { ptr_[--size_].~T(); }
  void resize(size_t n, const T& v = T()) {
    reserve(n);
    while (size_ > n) pop_back();
    while (size_ < n) new (ptr_ + size_++) T(v);
  }
  template <class It>
  void assign(It b, It e) {
    clear();
    for (; b != e; ++b) emplace_back(*b);
  }
  T* insert(const T* pos, T x) {
    const size_t k = static_cast<size_t>(pos - ptr_);
    emplace_back(std::move(x));
    std::rotate(ptr_ + k, ptr_ + size_ - 1, ptr_ + size_);
    return ptr_ + k;
  }
  template <class It, class = std::enable_if_t<!std::is_integral_v<It>>>
  T* insert(const T* pos, It b, It e) {
    const size_t k = static_cast<size_t>(pos - ptr_);
    const size_t old = size_;
    for (; b != e; ++b) emplace_back(*b);
    std::rotate(ptr_ + k, ptr_ + old, ptr_ + size_);
    return ptr_ + k;
  }
  T* erase(const T* b, const T* e) {
    T* first = ptr_ + (b - ptr_);
    T* last = ptr_ + (e - ptr_);
    T* out = std::move(last, end(), first);
    while (end() != out) pop_back();
    return first;
  }
  T* erase(const T* pos) { return erase(pos, pos + 1); }
  // A copy as a std::vector, for code that takes one.
  operator std::vector<T>() const { return std::vector<T>(begin(), end()); }  // NOLINT
  void clear() {
    for (size_t i = 0; i < size_; ++i) ptr_[i].~T();
    size_ = 0;
  }
  std::vector<T> ToVector() const { return std::vector<T>(begin(), end()); }
  bool operator==(const SmallVec& o) const { return size_ == o.size_ && std::equal(begin(), end(), o.begin()); }
  bool operator!=(const SmallVec& o) const { return !(*this == o); }
  bool operator<(const SmallVec& o) const { return std::lexicographical_compare(begin(), end(), o.begin(), o.end()); }
  friend bool operator==(const SmallVec& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const std::vector<T>& b, const SmallVec& a) { return a == b; }
  friend bool operator!=(const SmallVec& a, const std::vector<T>& b) { return !(a == b); }
  friend bool operator!=(const std::vector<T>& b, const SmallVec& a) { return !(a == b); }

 private:
  bool Inline() const { return ptr_ == Buf(); }
  T* Buf() { return reinterpret_cast<T*>(buf_); }
  const T* Buf() const { return reinterpret_cast<const T*>(buf_); }
  template <class It>
  void Append(It b, It e) {
    reserve(size_ + static_cast<size_t>(e - b));
    for (; b != e; ++b) new (ptr_ + size_++) T(*b);
  }
  void FreeHeap() {
    if (!Inline()) ::operator delete(ptr_, std::align_val_t(alignof(T)));
  }
  void Release() {
    clear();
    FreeHeap();
    ptr_ = Buf();
    cap_ = N;
  }
  // Takes o's elements (its heap block, or moves its inline ones); o is left empty and inline.
  void Steal(SmallVec& o) {
    if (o.Inline()) {
      for (size_t i = 0; i < o.size_; ++i) {
        new (Buf() + i) T(std::move(o.ptr_[i]));
        o.ptr_[i].~T();
      }
      size_ = o.size_;
    } else {
      ptr_ = o.ptr_;
      size_ = o.size_;
      cap_ = o.cap_;
      o.ptr_ = o.Buf();
      o.cap_ = N;
    }
    o.size_ = 0;
  }

  T* ptr_ = Buf();
  uint32_t size_ = 0;
  uint32_t cap_ = N;
  alignas(T) unsigned char buf_[N * sizeof(T)];
};

}  // namespace txla::util
