#include "graph/compile_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace txla::graph {

namespace {

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(e, &end, 10);
  return (end && *end == '\0' && v > 0) ? static_cast<int64_t>(v) : fallback;
}

// Newlines in a /proc file (read with plain read(2): no stdio buffering, nothing allocated).
int64_t CountLines(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  static thread_local char buf[1 << 16];
  int64_t lines = 0;
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      ::close(fd);
      return -1;
    }
    if (r == 0) break;
    for (const char* p = buf; (p = static_cast<const char*>(std::memchr(p, '\n', buf + r - p))) != nullptr; ++p) ++lines;
  }
  ::close(fd);
  return lines;
}

}  // namespace

size_t CompileCacheCapacity() {
  static const size_t n = static_cast<size_t>(EnvInt("XLA_COMPILATION_CACHE_SIZE", 2048));
  return n;
}

int64_t ProcessMapCount() { return CountLines("/proc/self/maps"); }

int64_t MaxMapCount() {
  static const int64_t limit = [] {
    int64_t v = EnvInt("TXLA_MAX_MAP_COUNT", -1);
    if (v > 0) return v;
    int fd = ::open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return int64_t{-1};
    char b[32] = {0};
    ssize_t r = ::read(fd, b, sizeof(b) - 1);
    ::close(fd);
    return r > 0 ? static_cast<int64_t>(std::strtoll(b, nullptr, 10)) : int64_t{-1};
  }();
  return limit;
}

bool MapPressure() {
  static std::atomic<uint64_t> calls{0};
  if (calls.fetch_add(1) % 32 != 0) return false;
  const int64_t limit = MaxMapCount();
  if (limit <= 0) return false;
  const int64_t now = ProcessMapCount();
  return now > limit / 2;
}

}  // namespace txla::graph
