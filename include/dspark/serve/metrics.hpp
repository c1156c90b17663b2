// dspark/serve/metrics.hpp — the figures `dspark serve` exposes at
// GET /metrics, in Prometheus' text exposition format (version 0.0.4).
//
// The format is written here directly rather than with prometheus-cpp: the
// server needs a dozen counters, gauges and histograms rendered on request,
// while that library brings its own registry, metric families and, for
// serving, an embedded HTTP server (civetweb) beside cpp-httplib; the text
// format is a few lines per metric (docs/serving.md, "Metrics").
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dspark/speculative/stats.hpp"

namespace dspark::serve {

/// A Prometheus histogram over fixed upper bounds (ascending); values above
/// the last bound land in the +Inf bucket.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  /// Observations per bucket, not cumulative: [bounds().size() + 1], the last for +Inf.
  const std::vector<int64_t>& counts() const { return counts_; }
  double sum() const { return sum_; }
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  double sum_ = 0;
  int64_t count_ = 0;
};

/// What the engine counts (Engine::metrics() returns a snapshot). Times are
/// seconds; speculative figures sum the requests that have ended.
struct EngineMetrics {
  EngineMetrics();
  Histogram time_to_first_token;    // submit → first token (queueing and prefill included)
  Histogram time_per_output_token;  // between consecutive tokens of a request, as a client sees them
  Histogram queue_time;             // submit → a slot
  Histogram verify_length;          // drafted tokens verified per speculative round (0: the anchor only)
  int64_t prompt_tokens = 0;        // prompt tokens of requests that produced their first token
  int64_t generated_tokens = 0;     // tokens emitted
  std::map<std::string, int64_t> finished;  // requests ended, by reason (FinishReason's to_string)
  int64_t steps = 0;                // target forward calls
  GenerateStats totals;             // the figures of every ended request, summed
};

/// HTTP requests answered, by route and status code. Thread-safe.
class RequestCounts {
 public:
  void add(const std::string& route, int status);
  std::map<std::pair<std::string, int>, int64_t> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> counts_;
};

/// Instantaneous values beside the engine's counters.
struct ServerGauges {
  int active = 0;     // requests in decode slots
  int queued = 0;     // requests waiting for a slot
  int parallel = 0;   // slots
  int max_queue = 0;  // waiting requests beyond which new ones get 503 (0: no limit)
};

/// The /metrics body: every metric carries the label model="<model>".
std::string prometheus_text(const std::string& model, bool speculative, const EngineMetrics& engine,
                            const ServerGauges& gauges,
                            const std::map<std::pair<std::string, int>, int64_t>& requests);

}  // namespace dspark::serve
