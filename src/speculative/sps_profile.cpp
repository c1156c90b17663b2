// SPS(B) measurement and profile files; see include/dspark/speculative/sps_profile.hpp.
#include "dspark/io/regular_file.hpp"
#include "dspark/speculative/sps_profile.hpp"

#include "dspark/ops/kernel_level.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <span>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"

namespace dspark {

namespace fs = std::filesystem;

namespace {


std::vector<TokenId> filler_tokens(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((i * 7919 + salt * 104729 + 13) % vocab);
  return t;
}

// Seconds of the fastest call of each entry of `sets` (`sets[i][r]` new tokens
// on cache r). Every repetition times the entries in turn, so that load from
// other work that comes or goes during the measurement lands on every entry
// alike: measured one entry after another, a machine that got busy half-way
// gave a curve whose small blocks looked fast and large ones slow, and the
// scheduler then found that no draft pays. Load only ever adds time, so the
// fastest call of each entry is kept.
std::vector<double> time_calls(TargetModel& target, std::vector<KVCache>& caches,
                               const std::vector<std::vector<int>>& sets, const SpsProfileOptions& o) {
  const int64_t vocab = target.info().vocab;
  int longest = 0;
  for (const auto& sizes : sets) longest = std::max(longest, *std::max_element(sizes.begin(), sizes.end()));
  std::vector<std::vector<TokenId>> toks;
  for (size_t r = 0; r < caches.size(); ++r) toks.push_back(filler_tokens(longest, vocab, 1000 + r));
  std::vector<double> best(sets.size(), std::numeric_limits<double>::infinity());
  for (int rep = 0; rep < o.warmup + o.repetitions; ++rep) {
    for (size_t i = 0; i < sets.size(); ++i) {
      const std::vector<int>& sizes = sets[i];
      std::vector<ForwardSeq> batch;
      for (size_t r = 0; r < sizes.size(); ++r)
        if (sizes[r] > 0)
          batch.push_back(ForwardSeq{&caches[r], std::span<const TokenId>(toks[r].data(), sizes[r]), Logits::All});
      const auto t0 = std::chrono::steady_clock::now();
      auto out = target.forward(batch);
      const auto t1 = std::chrono::steady_clock::now();
      for (size_t r = 0; r < sizes.size(); ++r) caches[r].trim(sizes[r]);
      if (rep >= o.warmup) best[i] = std::min(best[i], std::chrono::duration<double>(t1 - t0).count());
    }
  }
  return best;
}

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw FormatError(where + ": missing key '" + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw FormatError(where + ": key '" + key + "' has the wrong type");
  }
}

void check_sps_values(const std::vector<double>& v, const std::string& where) {
  for (double x : v)
    if (!(x > 0) || !std::isfinite(x)) throw FormatError(where + ": sps values must be positive and finite");
}

}  // namespace

void check_sps_options(const TargetInfo& info, const SpsProfileOptions& o) {
  if (o.bmax < 1 || o.context < 1 || o.repetitions < 1 || o.warmup < 0 || o.requests < 1 ||
      o.requests > o.bmax)
    throw InvalidArgument("profile: need bmax >= 1, context >= 1, repetitions >= 1, 1 <= requests <= bmax");
  if (o.context + o.bmax > info.context)
    throw InvalidArgument("profile: context " + std::to_string(o.context) + " + bmax " +
                          std::to_string(o.bmax) + " exceeds the model's context length " +
                          std::to_string(info.context));
}

SpsProfile measure_sps(TargetModel& target, const SpsProfileOptions& o,
                       const std::function<void(int, double)>& progress) {
  const TargetInfo& info = target.info();
  check_sps_options(info, o);
  SpsProfile p;
  p.model = sps_profile_key(info);
  p.threads = at::get_num_threads();
  p.context = o.context;
  p.repetitions = o.repetitions;
  p.requests = o.requests;

  auto make_caches = [&](int n) {
    std::vector<KVCache> caches;
    for (int r = 0; r < n; ++r) {
      caches.push_back(target.new_cache(o.context + o.bmax + 1));
      const auto ctx = filler_tokens(o.context, info.vocab, r);
      target.forward_one(caches.back(), ctx, Logits::None);
    }
    return caches;
  };

  {
    auto caches = make_caches(1);
    std::vector<std::vector<int>> sets;
    for (int b = 1; b <= o.bmax; ++b) sets.push_back({b});
    const std::vector<double> t = time_calls(target, caches, sets, o);
    for (int b = 1; b <= o.bmax; ++b) {
      p.b.push_back(b);
      p.sps.push_back(1.0 / std::max(t[static_cast<size_t>(b - 1)], 1e-9));
      if (progress) progress(b, p.sps.back());
    }
  }
  if (o.requests > 1) {
    auto caches = make_caches(o.requests);
    std::vector<std::vector<int>> sets;
    for (int b = o.requests; b <= o.bmax; ++b) {
      std::vector<int> sizes(static_cast<size_t>(o.requests), b / o.requests);
      for (int r = 0; r < b % o.requests; ++r) ++sizes[r];
      sets.push_back(std::move(sizes));
    }
    const std::vector<double> t = time_calls(target, caches, sets, o);
    for (int b = o.requests; b <= o.bmax; ++b) {
      p.multi_b.push_back(b);
      p.multi_sps.push_back(1.0 / std::max(t[static_cast<size_t>(b - o.requests)], 1e-9));
    }
  }
  make_sps_monotone(p.sps);
  make_sps_monotone(p.multi_sps);
  return p;
}

void make_sps_monotone(std::vector<double>& sps) {
  for (size_t i = sps.size(); i-- > 1;) sps[i - 1] = std::max(sps[i - 1], sps[i]);
}

bool sps_profile_too_slow(TargetModel& target, const SpsProfile& p, int b_probe, double margin) {
  const TargetInfo& info = target.info();
  if (p.sps.empty()) return false;
  b_probe = std::clamp<int>(b_probe, 1, static_cast<int>(p.sps.size()));
  const int64_t context = std::min<int64_t>(64, info.context - b_probe - 1);
  if (context < 1) return false;
  SpsProfileOptions o;
  o.repetitions = 3;
  std::vector<KVCache> caches;
  caches.push_back(target.new_cache(context + b_probe + 1));
  target.forward_one(caches.back(), filler_tokens(context, info.vocab, 0), Logits::None);
  const std::vector<double> t = time_calls(target, caches, {{1}, {b_probe}}, o);
  return t[0] < margin / p.sps[0] || t[1] < margin / p.sps[static_cast<size_t>(b_probe - 1)];
}

std::vector<double> current_sps_profile(TargetModel& target, const std::string& path, const SpsProfileOptions& o,
                                        std::ostream* log) {
  const auto remeasure = [&](const std::string& why, const SpsProfile* old) {
    if (log) *log << why << ": measuring verify costs for B = 1.." << o.bmax << " ..." << std::endl;
    SpsProfile p = measure_sps(target, o);
    // Keep the old curve only where it is at least as fast at every B: each
    // curve's points share the load of one measurement, and mixing the two
    // point by point kept a small block's figure from a quiet moment beside
    // a large block's from a busy one, for good (no draft paid after that).
    const size_t n = old ? std::min(p.sps.size(), old->sps.size()) : 0;
    bool old_faster = old && old->threads == p.threads && old->context == p.context && n == p.sps.size();
    for (size_t i = 0; old_faster && i < n; ++i) old_faster = old->sps[i] >= p.sps[i];
    if (old_faster) p.sps.assign(old->sps.begin(), old->sps.begin() + static_cast<std::ptrdiff_t>(n));
    make_sps_monotone(p.sps);
    // A longer curve (`dspark serve` measures up to parallel·(γ + 1), and
    // its multi-sequence curve) keeps its points past this measurement,
    // scaled to meet it, so that a short run does not make the next server
    // measure the whole curve again.
    if (old && old->model == p.model && old->threads == p.threads && old->sps.size() > p.sps.size()) {
      const size_t n = p.sps.size();
      const double r = p.sps[n - 1] / old->sps[n - 1];
      for (size_t i = n; i < old->sps.size(); ++i) {
        p.b.push_back(static_cast<int>(i) + 1);
        p.sps.push_back(std::min(p.sps[i - 1], old->sps[i] * r));
      }
      if (p.requests == 1 && old->requests > 1) {
        p.requests = old->requests;
        p.multi_b = old->multi_b;
        p.multi_sps = old->multi_sps;
      }
    }
    try {
      save_sps_profile(path, p);
      if (log) *log << "saved " << path << " (`dspark profile -m MODEL` measures it again)" << std::endl;
    } catch (const std::exception& e) {
      std::cerr << "warning: the SPS profile is used for this run only: " << e.what() << "\n";
    }
    return p.sps;
  };
  if (!fs::exists(path)) return remeasure("no SPS profile for this machine yet", nullptr);
  SpsProfile old;
  try {
    old = load_sps_profile(path);
  } catch (const Error& e) {
    // The default profile was written by this program; when it cannot be
    // read (damaged, or from an incompatible version), measure a new one
    // rather than failing every run.
    std::cerr << "warning: ignoring the SPS profile " << path << ": " << e.what() << "\n";
    return remeasure("the SPS profile could not be read", nullptr);
  }
  // Say which of the three differs: a longer curve than a short run left
  // (`serve` needs up to parallel·(γ + 1) tokens) is the common case.
  const std::string key = sps_profile_key(target.info());
  if (old.model != key)
    return remeasure("the SPS profile " + path + " is for " + old.model + ", not " + key, nullptr);
  if (old.threads != at::get_num_threads())
    return remeasure("the SPS profile " + path + " was measured with " + std::to_string(old.threads) +
                         " threads, not " + std::to_string(at::get_num_threads()),
                     nullptr);
  if (static_cast<int>(old.sps.size()) < o.bmax)
    return remeasure("the SPS profile " + path + " covers blocks of up to " + std::to_string(old.sps.size()) +
                         " tokens; this run verifies up to " + std::to_string(o.bmax),
                     nullptr);
  if (sps_profile_too_slow(target, old, std::min(o.bmax, 8))) return remeasure("this machine now verifies faster than its SPS profile says", &old);
  make_sps_monotone(old.sps);
  return old.sps;
}

nlohmann::json sps_profile_to_json(const SpsProfile& p) {
  nlohmann::json j = {{"model", p.model},     {"threads", p.threads}, {"context", p.context},
                      {"repetitions", p.repetitions}, {"b", p.b},     {"sps", p.sps}};
  if (p.requests > 1)
    j["multi"] = {{"requests", p.requests}, {"b", p.multi_b}, {"sps", p.multi_sps}};
  return j;
}

SpsProfile sps_profile_from_json(const nlohmann::json& j, const std::string& where) {
  SpsProfile p;
  p.model = get<std::string>(j, "model", where);
  p.threads = get<int>(j, "threads", where);
  p.context = j.is_object() ? j.value("context", int64_t{0}) : 0;
  p.repetitions = j.is_object() ? j.value("repetitions", 0) : 0;
  p.b = get<std::vector<int>>(j, "b", where);
  p.sps = get<std::vector<double>>(j, "sps", where);
  if (p.sps.empty() || p.sps.size() != p.b.size())
    throw FormatError(where + ": 'b' and 'sps' must be non-empty and of equal length");
  for (size_t i = 0; i < p.b.size(); ++i)
    if (p.b[i] != static_cast<int>(i) + 1) throw FormatError(where + ": 'b' must be 1, 2, ..., n");
  check_sps_values(p.sps, where);
  if (j.contains("multi")) {
    const std::string mw = where + " multi";
    p.requests = get<int>(j.at("multi"), "requests", mw);
    p.multi_b = get<std::vector<int>>(j.at("multi"), "b", mw);
    p.multi_sps = get<std::vector<double>>(j.at("multi"), "sps", mw);
    if (p.multi_b.size() != p.multi_sps.size())
      throw FormatError(mw + ": 'b' and 'sps' differ in length");
    check_sps_values(p.multi_sps, mw);
  }
  return p;
}

std::string dspark_home_dir() {
  if (const char* h = std::getenv("DSPARK_HOME"); h && *h) return h;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/dspark";
}

std::string sps_profile_key(const TargetInfo& t) {
  return t.id + "@" + t.compute + "@" + ops::to_string(ops::active_kernel_level());
}

std::string default_profile_path(const std::string& model_id, int threads) {
  std::string name = model_id.empty() ? "model" : model_id;
  for (char& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  return (fs::path(dspark_home_dir()) / "profiles" / (name + "_t" + std::to_string(threads) + ".json")).string();
}

void save_sps_profile(const std::string& path, const SpsProfile& p) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw Error(parent.string() + ": cannot create directory: " + ec.message());
  }
  io::write_json_atomic(path, sps_profile_to_json(p));
}

SpsProfile load_sps_profile(const std::string& path) {
  if (!fs::exists(path))
    throw Error(path + ": no SPS profile; run `dspark profile -m MODEL` first (or name a profile file: --profile FILE, or --sps FILE for dspark serve)");
  io::require_regular_file(path, "an SPS profile (JSON file)");
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open SPS profile");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ": invalid JSON: " + e.what());
  }
  return sps_profile_from_json(j, path);
}

std::string sps_profile_mismatch(const SpsProfile& p, const std::string& path, const std::string& target_id) {
  if (p.model.empty() || target_id.empty() || p.model == target_id) return "";
  return "SPS profile " + path + " was measured for model " + p.model + ", not " + target_id +
         "; its verify costs may not fit this model (run `dspark profile -m MODEL` for it)";
}

}  // namespace dspark
