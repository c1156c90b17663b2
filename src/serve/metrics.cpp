// Prometheus text for GET /metrics; see include/dspark/serve/metrics.hpp.
#include "dspark/serve/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "dspark/error.hpp"

namespace dspark::serve {

namespace {

// Latency buckets (seconds), from one fast decode step to a long queue.
std::vector<double> latency_bounds() {
  return {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 20, 40, 80, 160};
}

std::vector<double> verify_bounds() {
  std::vector<double> b;
  for (int k = 0; k <= 16; ++k) b.push_back(k);
  return b;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A label value with \, " and newline escaped as the format requires.
std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class Writer {
 public:
  explicit Writer(const std::string& model) : model_label_("model=\"" + escaped(model) + "\"") {}

  void header(const std::string& name, const char* type, const std::string& help) {
    out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, double v, const std::string& labels = "") {
    out_ += name + "{" + model_label_ + (labels.empty() ? "" : "," + labels) + "} " + number(v) + "\n";
  }
  void metric(const std::string& name, const char* type, const std::string& help, double v) {
    header(name, type, help);
    sample(name, v);
  }
  void histogram(const std::string& name, const std::string& help, const Histogram& h) {
    header(name, "histogram", help);
    int64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds().size(); ++i) {
      cumulative += h.counts()[i];
      sample(name + "_bucket", static_cast<double>(cumulative), "le=\"" + number(h.bounds()[i]) + "\"");
    }
    sample(name + "_bucket", static_cast<double>(h.count()), "le=\"+Inf\"");
    sample(name + "_sum", h.sum());
    sample(name + "_count", static_cast<double>(h.count()));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string model_label_;
  std::string out_;
};

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end()))
    throw InvalidArgument("Histogram: the upper bounds must be ascending");
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), v);  // the first bound >= v: le semantics
  ++counts_[static_cast<size_t>(at - bounds_.begin())];
  sum_ += v;
  ++count_;
}

EngineMetrics::EngineMetrics()
    : time_to_first_token(latency_bounds()), time_per_output_token(latency_bounds()), queue_time(latency_bounds()),
      verify_length(verify_bounds()) {}

void RequestCounts::add(const std::string& route, int status) {
  std::lock_guard lk(mu_);
  ++counts_[{route, status}];
}

std::map<std::pair<std::string, int>, int64_t> RequestCounts::snapshot() const {
  std::lock_guard lk(mu_);
  return counts_;
}

std::string prometheus_text(const std::string& model, bool speculative, const EngineMetrics& m,
                            const ServerGauges& g, const std::map<std::pair<std::string, int>, int64_t>& requests) {
  Writer w(model);
  const EngineMetrics& e = m;
  const GenerateStats& t = m.totals;
  w.header("dspark_requests_total", "counter", "HTTP requests answered, by route and status code.");
  for (const auto& [key, n] : requests)
    w.sample("dspark_requests_total", static_cast<double>(n),
             "route=\"" + escaped(key.first) + "\",status=\"" + std::to_string(key.second) + "\"");
  w.header("dspark_requests_finished_total", "counter", "Generations ended, by reason.");
  for (const auto& [reason, n] : e.finished)
    w.sample("dspark_requests_finished_total", static_cast<double>(n), "reason=\"" + escaped(reason) + "\"");
  w.metric("dspark_prompt_tokens_total", "counter", "Prompt tokens prefilled.", static_cast<double>(e.prompt_tokens));
  w.metric("dspark_generation_tokens_total", "counter", "Tokens generated.", static_cast<double>(e.generated_tokens));
  w.metric("dspark_requests_active", "gauge", "Requests in decode slots.", g.active);
  w.metric("dspark_requests_queued", "gauge", "Requests waiting for a slot.", g.queued);
  w.metric("dspark_slots", "gauge", "Decode slots (--parallel).", g.parallel);
  w.metric("dspark_queue_limit", "gauge", "Waiting requests beyond which new ones get 503 (--max-queue; 0: none).",
           g.max_queue);
  w.metric("dspark_engine_steps_total", "counter", "Target forward calls.", static_cast<double>(e.steps));
  w.histogram("dspark_time_to_first_token_seconds", "From arrival to the first token, queueing included.",
              e.time_to_first_token);
  w.histogram("dspark_time_per_output_token_seconds", "Between consecutive tokens of a request.",
              e.time_per_output_token);
  w.histogram("dspark_queue_time_seconds", "From arrival to a decode slot.", e.queue_time);

  // Speculative decoding, over the requests that have ended.
  w.metric("dspark_speculative", "gauge", "1 when requests are decoded speculatively (a drafter or lookup drafts).",
           speculative ? 1 : 0);
  w.metric("dspark_spec_rounds_total", "counter", "Verify rounds.", static_cast<double>(t.rounds));
  w.metric("dspark_spec_draft_tokens_total", "counter", "Drafted tokens verified.", static_cast<double>(t.drafted));
  w.metric("dspark_spec_accepted_tokens_total", "counter", "Drafted tokens accepted.", static_cast<double>(t.accepted));
  w.metric("dspark_spec_tau", "gauge", "Tokens per verify round: (accepted + rounds) / rounds (0 before any round).",
           t.rounds > 0 ? static_cast<double>(t.accepted + t.rounds) / static_cast<double>(t.rounds) : 0.0);
  w.header("dspark_spec_acceptance_ratio", "gauge",
           "Acceptance of draft position k among rounds whose draft reached it.");
  for (size_t k = 0; k < t.reached_by_position.size(); ++k)
    if (t.reached_by_position[k] > 0)
      w.sample("dspark_spec_acceptance_ratio",
               static_cast<double>(t.accepted_by_position[k]) / static_cast<double>(t.reached_by_position[k]),
               "position=\"" + std::to_string(k) + "\"");
  w.header("dspark_spec_position_reached_total", "counter", "Rounds whose draft reached position k.");
  for (size_t k = 0; k < t.reached_by_position.size(); ++k)
    w.sample("dspark_spec_position_reached_total", static_cast<double>(t.reached_by_position[k]),
             "position=\"" + std::to_string(k) + "\"");
  w.header("dspark_spec_position_accepted_total", "counter", "Rounds that accepted draft position k.");
  for (size_t k = 0; k < t.accepted_by_position.size(); ++k)
    w.sample("dspark_spec_position_accepted_total", static_cast<double>(t.accepted_by_position[k]),
             "position=\"" + std::to_string(k) + "\"");
  w.metric("dspark_spec_lookup_rounds_total", "counter", "Rounds drafted by prompt lookup.",
           static_cast<double>(t.lookup_rounds));
  w.metric("dspark_spec_lookup_accepted_tokens_total", "counter", "Prompt-lookup tokens accepted.",
           static_cast<double>(t.lookup_accepted));
  w.metric("dspark_spec_lookup_share", "gauge", "Share of verify rounds drafted by prompt lookup.",
           t.rounds > 0 ? static_cast<double>(t.lookup_rounds) / static_cast<double>(t.rounds) : 0.0);
  w.histogram("dspark_spec_verify_length", "Drafted tokens verified per round, as the scheduler chose them.",
              e.verify_length);
  return w.take();
}

}  // namespace dspark::serve
