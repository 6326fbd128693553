// Text: a string builder with `<<`, for the core's generated text (StableHLO, IR dumps, messages).
//
// Why not std::ostringstream: a stream formats numbers through its locale's num_put facet. That
// makes the output depend on the process's global C++ locale (a library that calls
// std::locale::global can turn 1000 into "1,000" inside our MLIR), and it crashed on the GPU
// machine: with the core linked against a static libstdc++ inside a process that had already loaded
// the shared one, a stream built by one copy looked its facets up with the other copy's ids
// (SIGSEGV in ostream::_M_insert<long> at the first number of EmitStableHlo). std::to_chars
// formats without any locale, and faster.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace txla::util {

class Text {
 public:
  Text() = default;

  Text& operator<<(std::string_view s) {
    s_.append(s.data(), s.size());
    return *this;
  }
  Text& operator<<(const std::string& s) {
    s_.append(s);
    return *this;
  }
  Text& operator<<(const char* s) {
    s_.append(s);
    return *this;
  }
  Text& operator<<(char c) {
    s_.push_back(c);
    return *this;
  }
  // bool prints as 1/0 (as a stream does by default).
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, char>, int> = 0>
  Text& operator<<(T v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, static_cast<std::conditional_t<std::is_same_v<T, bool>, int, T>>(v));
    s_.append(buf, r.ptr);
    return *this;
  }
  // Floating point as a stream prints it by default (printf's %g, 6 significant digits).
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Text& operator<<(T v) {
    return Append(static_cast<double>(v), std::chars_format::general, 6);
  }
  // `v` in `fmt` with `precision` (as printf's %e/%f/%g with that precision), in the "C" locale always.
  Text& Append(double v, std::chars_format fmt, int precision) {
    char buf[400];  // %f of 1e308 with a small precision fits
    auto r = std::to_chars(buf, buf + sizeof buf, v, fmt, precision);
    s_.append(buf, r.ptr);
    return *this;
  }

  const std::string& str() const { return s_; }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

// printf's "%.<precision>e" of `v`, independent of the C locale's decimal point.
inline std::string Scientific(double v, int precision) {
  Text t;
  t.Append(v, std::chars_format::scientific, precision);
  return t.take();
}

}  // namespace txla::util
