#include "util/metrics.h"

#include <chrono>
#include <thread>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace txla::metrics {
namespace {

constexpr size_t kMaxSamples = 1024;

struct Metric {
  Unit unit = Unit::kCount;
  int64_t total = 0;
  double accumulator = 0;
  std::vector<std::pair<double, double>> samples;  // ring buffer of (ts_ns, value)
  size_t next = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, std::atomic<int64_t>> counters;  // 0 means absent
  std::map<std::string, Metric> metrics;
};

Registry& Reg() {
  static Registry* r = new Registry();  // leaked on purpose: usable during interpreter teardown
  return *r;
}

std::string FormatTime(double ns) {
  // PyTorch/XLA's style: 06m09s401ms746.001us, leading zero units omitted.
  double us_total = ns / 1000.0;
  int64_t whole_us = static_cast<int64_t>(us_total);
  double frac_us = us_total - static_cast<double>(whole_us);
  int64_t ms = whole_us / 1000, us = whole_us % 1000;
  int64_t s = ms / 1000; ms %= 1000;
  int64_t m = s / 60; s %= 60;
  int64_t h = m / 60; m %= 60;
  char buf[128];
  std::string out;
  bool started = false;
  if (h) { std::snprintf(buf, sizeof buf, "%02lldh", (long long)h); out += buf; started = true; }
  if (started || m) { std::snprintf(buf, sizeof buf, "%02lldm", (long long)m); out += buf; started = true; }
  if (started || s) { std::snprintf(buf, sizeof buf, "%02llds", (long long)s); out += buf; started = true; }
  if (started || ms) { std::snprintf(buf, sizeof buf, "%03lldms", (long long)ms); out += buf; started = true; }
  std::snprintf(buf, sizeof buf, "%07.3fus", static_cast<double>(us) + frac_us);
  out += buf;
  return out;
}

std::string FormatBytes(double b) {
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (std::fabs(b) >= 1024.0 && u < 5) { b /= 1024.0; ++u; }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f%s", b, kUnits[u]);
  return buf;
}

std::string FormatValue(double v, Unit unit) {
  switch (unit) {
    case Unit::kTime: return FormatTime(v);
    case Unit::kBytes: return FormatBytes(v);
    default: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f", v);
      return buf;
    }
  }
}

void AppendMetric(std::string* out, const std::string& name, const Metric& m) {
  *out += "Metric: " + name + "\n";
  *out += "  TotalSamples: " + std::to_string(m.total) + "\n";
  *out += "  Accumulator: " + FormatValue(m.accumulator, m.unit) + "\n";
  if (m.samples.size() >= 2) {
    double t0 = 1e300, t1 = -1e300, vsum = 0;
    for (auto& s : m.samples) { t0 = std::min(t0, s.first); t1 = std::max(t1, s.first); vsum += s.second; }
    double secs = (t1 - t0) / 1e9;
    if (secs > 0) {
      *out += "  ValueRate: " + FormatValue(vsum / secs, m.unit) + " / second\n";
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", static_cast<double>(m.samples.size()) / secs);
      *out += std::string("  Rate: ") + buf + " / second\n";
    }
  }
  if (!m.samples.empty()) {
    std::vector<double> vals;
    for (auto& s : m.samples) vals.push_back(s.second);
    std::sort(vals.begin(), vals.end());
    *out += "  Percentiles: ";
    const int pcts[] = {1, 5, 10, 20, 50, 80, 90, 95, 99};
    for (size_t i = 0; i < 9; ++i) {
      size_t idx = std::min(vals.size() - 1, static_cast<size_t>(pcts[i] / 100.0 * vals.size()));
      *out += std::to_string(pcts[i]) + "%=" + FormatValue(vals[idx], m.unit);
      *out += (i + 1 < 9) ? "; " : "\n";
    }
  }
}

}  // namespace

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

void IncrementCounter(const std::string& name, int64_t delta) {
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  r.counters[name].fetch_add(delta, std::memory_order_relaxed);
}

std::atomic<int64_t>* CounterSlot(const std::string& name) {
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  return &r.counters[name];  // std::map nodes are stable
}

void AddSample(const std::string& name, double value, Unit unit) {
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  Metric& m = r.metrics[name];
  m.unit = unit;
  m.total += 1;
  m.accumulator += value;
  std::pair<double, double> s(static_cast<double>(NowNs()), value);
  if (m.samples.size() < kMaxSamples) {
    m.samples.push_back(s);
  } else {
    m.samples[m.next] = s;
    m.next = (m.next + 1) % kMaxSamples;
  }
}

namespace {
std::atomic<int64_t> g_pending_samples{0};
void AwaitPendingSamples() {
  // Bounded: a sample that never arrives (a plugin that drops callbacks) must not hang a report.
  for (int i = 0; i < 600000 && g_pending_samples.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}
}  // namespace

void BeginPendingSample() { g_pending_samples.fetch_add(1); }

void EndPendingSample(const std::string& name, double value, Unit unit) {
  AddSample(name, value, unit);
  g_pending_samples.fetch_sub(1);
}

std::vector<std::string> CounterNames() {
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<std::string> out;
  for (auto& kv : r.counters) {
    if (kv.second.load() != 0) out.push_back(kv.first);
  }
  return out;
}

bool CounterValue(const std::string& name, int64_t* value) {
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.counters.find(name);
  if (it == r.counters.end() || it->second.load() == 0) return false;
  *value = it->second.load();
  return true;
}

std::vector<std::string> MetricNames() {
  AwaitPendingSamples();
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<std::string> out;
  for (auto& kv : r.metrics) out.push_back(kv.first);
  return out;
}

bool MetricData(const std::string& name, int64_t* total, double* accumulator,
                std::vector<std::pair<double, double>>* samples) {
  AwaitPendingSamples();
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.metrics.find(name);
  if (it == r.metrics.end()) return false;
  *total = it->second.total;
  *accumulator = it->second.accumulator;
  *samples = it->second.samples;
  return true;
}

std::string MetricsReport(const std::vector<std::string>& counter_names, bool all_counters,
                          const std::vector<std::string>& metric_names, bool all_metrics) {
  AwaitPendingSamples();
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  std::string out;
  auto wanted = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  for (auto& kv : r.metrics) {
    if (all_metrics || wanted(metric_names, kv.first)) AppendMetric(&out, kv.first, kv.second);
  }
  for (auto& kv : r.counters) {
    if (kv.second.load() == 0) continue;
    bool is_fallback = kv.first.rfind("aten::", 0) == 0;
    if (all_counters || is_fallback || wanted(counter_names, kv.first)) {
      out += "Counter: " + kv.first + "\n  Value: " + std::to_string(kv.second.load()) + "\n";
    }
  }
  return out;
}

void ClearCounters() {
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  for (auto& kv : r.counters) kv.second.store(0);
}

void ClearMetrics() {
  // Samples of executions launched before the clear (ExecuteTime arrives from the ready callback)
  // land first, then go with the rest: none of them can appear after clear_all().
  AwaitPendingSamples();
  auto& r = Reg();
  std::lock_guard<std::mutex> g(r.mu);
  r.metrics.clear();
}

Timer::Timer(const char* name) : name_(name), start_ns_(NowNs()) {}
Timer::~Timer() { AddSample(name_, static_cast<double>(NowNs() - start_ns_), Unit::kTime); }

std::FILE* DebugStream() {
  static std::FILE* stream = [] {
    const char* path = std::getenv("PT_XLA_DEBUG_FILE");
    if (path == nullptr || *path == '\0') return stderr;
    std::FILE* f = std::fopen(path, "a");
    if (f == nullptr) {
      std::fprintf(stderr, "[torch_xla] PT_XLA_DEBUG_FILE=%s cannot be opened; debug output goes to stderr\n", path);
      return stderr;
    }
    std::setvbuf(f, nullptr, _IOLBF, 1 << 16);
    return f;
  }();
  return stream;
}

}  // namespace txla::metrics
