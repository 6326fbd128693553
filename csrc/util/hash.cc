#include "util/hash.h"

#include <cstdio>

namespace txla {
std::string Hash128::ToString() const {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)hi, (unsigned long long)lo);
  return buf;
}
}  // namespace txla
