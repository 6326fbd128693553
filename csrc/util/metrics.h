// Counters and metrics (PyTorch/XLA names and report format). Torch-free, thread-safe.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace txla::metrics {

void IncrementCounter(const std::string& name, int64_t delta = 1);
// A stable slot for a hot counter (per-op counters): increment it with fetch_add, no lookup.
std::atomic<int64_t>* CounterSlot(const std::string& name);
// IncrementCounter for a hot path with a literal name: the slot is looked up once per call site
// (no string built, no map lookup, no lock on later calls).
#define TXLA_COUNTER_ADD(name, delta)                                                           \
  do {                                                                                          \
    static std::atomic<int64_t>* const txla_counter_slot_ = ::txla::metrics::CounterSlot(name); \
    txla_counter_slot_->fetch_add((delta), std::memory_order_relaxed);                          \
  } while (0)
// Records one sample of a metric. Time metrics are in nanoseconds; byte metrics in bytes.
enum class Unit { kTime, kBytes, kCount };
void AddSample(const std::string& name, double value, Unit unit);

// A sample recorded later, from another thread (the end of an asynchronous execution): readers of
// metrics (MetricNames, MetricData, MetricsReport) wait until every pending sample has arrived.
void BeginPendingSample();
void EndPendingSample(const std::string& name, double value, Unit unit);

std::vector<std::string> CounterNames();
bool CounterValue(const std::string& name, int64_t* value);
std::vector<std::string> MetricNames();
// (total_samples, accumulator, recent samples as (timestamp_ns, value))
bool MetricData(const std::string& name, int64_t* total, double* accumulator,
                std::vector<std::pair<double, double>>* samples);
std::string MetricsReport(const std::vector<std::string>& counter_names = {}, bool all_counters = true,
                          const std::vector<std::string>& metric_names = {}, bool all_metrics = true);
void ClearCounters();
void ClearMetrics();

// Scoped timer adding a kTime sample on destruction.
class Timer {
 public:
  explicit Timer(const char* name);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
 private:
  const char* name_;
  int64_t start_ns_;
};
int64_t NowNs();

// Where PT_XLA_DEBUG output goes: the file named by PT_XLA_DEBUG_FILE (opened once, appended to,
// line-buffered), else stderr.
std::FILE* DebugStream();

}  // namespace txla::metrics
