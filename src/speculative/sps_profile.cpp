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

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"

namespace dspark {

namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<TokenId> filler_tokens(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((i * 7919 + salt * 104729 + 13) % vocab);
  return t;
}

// Median seconds of a call of `sizes[r]` new tokens on each cache.
double time_call(TargetModel& target, std::vector<KVCache>& caches, const std::vector<int>& sizes,
                 const SpsProfileOptions& o) {
  const int64_t vocab = target.info().vocab;
  std::vector<std::vector<TokenId>> toks;
  for (size_t r = 0; r < sizes.size(); ++r) toks.push_back(filler_tokens(sizes[r], vocab, 1000 + r));
  std::vector<double> times;
  for (int rep = 0; rep < o.warmup + o.repetitions; ++rep) {
    std::vector<ForwardSeq> batch;
    for (size_t r = 0; r < sizes.size(); ++r)
      if (sizes[r] > 0) batch.push_back(ForwardSeq{&caches[r], toks[r], Logits::All});
    const auto t0 = std::chrono::steady_clock::now();
    auto out = target.forward(batch);
    const auto t1 = std::chrono::steady_clock::now();
    for (size_t r = 0; r < sizes.size(); ++r) caches[r].trim(sizes[r]);
    if (rep >= o.warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return median(times);
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

SpsProfile measure_sps(TargetModel& target, const SpsProfileOptions& o,
                       const std::function<void(int, double)>& progress) {
  if (o.bmax < 1 || o.context < 1 || o.repetitions < 1 || o.warmup < 0 || o.requests < 1 ||
      o.requests > o.bmax)
    throw InvalidArgument("profile: need bmax >= 1, context >= 1, repetitions >= 1, 1 <= requests <= bmax");
  const TargetInfo& info = target.info();
  if (o.context + o.bmax > info.context)
    throw InvalidArgument("profile: context " + std::to_string(o.context) + " + bmax " +
                          std::to_string(o.bmax) + " exceeds the model's context length " +
                          std::to_string(info.context));
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
    for (int b = 1; b <= o.bmax; ++b) {
      const double t = time_call(target, caches, {b}, o);
      p.b.push_back(b);
      p.sps.push_back(1.0 / std::max(t, 1e-9));
      if (progress) progress(b, p.sps.back());
    }
  }
  if (o.requests > 1) {
    auto caches = make_caches(o.requests);
    for (int b = o.requests; b <= o.bmax; ++b) {
      std::vector<int> sizes(static_cast<size_t>(o.requests), b / o.requests);
      for (int r = 0; r < b % o.requests; ++r) ++sizes[r];
      const double t = time_call(target, caches, sizes, o);
      p.multi_b.push_back(b);
      p.multi_sps.push_back(1.0 / std::max(t, 1e-9));
    }
  }
  return p;
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

std::string default_profile_path(const std::string& model_id) {
  std::string name = model_id.empty() ? "model" : model_id;
  for (char& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  return (fs::path(dspark_home_dir()) / "profiles" / (name + ".json")).string();
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
