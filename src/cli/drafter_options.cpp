#include "drafter_options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <utility>

#include <unistd.h>

#include <ATen/Parallel.h>

#include "dspark/error.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/speculative/sps_profile.hpp"

namespace dspark::cli {

void DrafterOptions::add(CLI::App& app, bool with_schedule) {
  app.add_option("--drafter", drafter,
                 "drafter directory, 'none' for plain decoding, or 'auto' (the drafter shipped for "
                 "the model, if any)")
      ->capture_default_str();
  drafter_only_opts_ = {
      app.add_option("--gamma", gamma, "draft block size γ (0 = the drafter's)")->check(integer_in(0, kMaxGamma)),
      app.add_option("--min-conf", min_conf, "uniform confidence threshold for pruning (overrides calibration)")
          ->check(number_in(0.0, 1.0))};
  thresholds_opt_ = app.add_option("--thresholds", thresholds,
                                   "per-position confidence thresholds a,b,... ('none' disables calibration "
                                   "thresholds)");
  drafter_only_opts_.push_back(thresholds_opt_);
  drafter_only_opts_.push_back(
      app.add_flag("--no-prune", no_prune, "verify every drafted token (no confidence pruning)"));
  lookup_opt_ = app.add_option("--lookup-ngram", lookup.min_ngram,
                 "prompt-lookup drafts: shortest n-gram of the text so far matched earlier in it; a "
                 "match drafts what followed it, other rounds use the drafter (0 = off; on by default "
                 "with a drafter; with --drafter none, lookup drafts alone when given)")
      ->check(integer_in(0, 64))
      ->capture_default_str();
  lookup_max_opt_ = app.add_option("--lookup-ngram-max", lookup.max_ngram,
                                   "prompt-lookup drafts: longest n-gram tried first (at least --lookup-ngram)")
      ->check(integer_in(1, 64))
      ->capture_default_str();
  app.add_option("--lookup-draft-max", lookup.max_draft, "prompt-lookup drafts: most tokens per draft")
      ->check(integer_in(1, kMaxGamma))
      ->capture_default_str();
  with_schedule_ = with_schedule;
  if (!with_schedule) {
    schedule = "thresholds";  // the caller schedules verify lengths itself
    return;
  }
  app.add_option("--schedule", schedule,
                 "verify length: off (all drafted tokens), thresholds (confidence pruning), sps "
                 "(hardware-aware scheduler on the SPS profile), auto (sps on this machine's "
                 "profile, measured on first use; thresholds with --min-conf or --thresholds)")
      ->check(CLI::IsMember({"auto", "off", "thresholds", "sps"}))
      ->capture_default_str();
  app.add_option("--profile", profile,
                 "SPS profile for --schedule sps (default: $DSPARK_HOME/profiles/<model id>.json)");
}

namespace {
// Where shipped drafters (<base>/<model alias>/) are looked for: $DSPARK_DRAFTERS
// alone when set, else the source tree's drafters/ and ./drafters/.
std::vector<std::string> drafter_bases() {
  if (const char* env = std::getenv("DSPARK_DRAFTERS"); env != nullptr && *env != '\0') return {env};
  return {std::string(DSPARK_DATA_DIR) + "/drafters", "drafters"};
}

std::string joined_bases() {
  std::string s;
  for (const std::string& b : drafter_bases()) s += (s.empty() ? "" : ", ") + b + "/";
  return s;
}
}  // namespace

bool is_alias(const std::string& model_arg) {
  return model_arg.find('/') == std::string::npos && model_arg.find(".gguf") == std::string::npos;
}

std::string shipped_drafter_dir(const std::string& model_arg) {
  namespace fs = std::filesystem;
  if (!is_alias(model_arg)) return "";
  for (const std::string& base : drafter_bases()) {
    const fs::path p = fs::path(base) / model_arg;
    if (fs::exists(p / "dspark.json")) return p.string();
  }
  return "";
}

std::string shipped_drafter_for_target(const std::string& target_id) {
  namespace fs = std::filesystem;
  for (const std::string& base : drafter_bases()) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      const fs::path json = entry.path() / "dspark.json";
      if (!fs::exists(json, ec)) continue;
      try {
        if (read_drafter_json(entry.path().string()).value("target_id", std::string()) == target_id)
          return entry.path().string();
      } catch (const std::exception&) {
        // An unreadable drafter is not a match; loading it by name reports why.
      }
    }
  }
  return "";
}

std::unique_ptr<Drafter> DrafterOptions::load(const std::string& model_arg, const TargetModel& target) const {
  target_id_ = target.info().id;
  profile_key_ = sps_profile_key(target.info());
  std::string dir = drafter;
  if (dir.empty()) throw InvalidArgument("--drafter: expected a directory, 'none' or 'auto', got an empty string");
  if (dir == "none") {
    no_drafter_why_ = "--drafter none";
    return nullptr;
  }
  if (dir == "auto") {
    dir = shipped_drafter_dir(model_arg);
    if (dir.empty()) dir = shipped_drafter_for_target(target.info().id);
    if (dir.empty()) {
      // An alias has a drafter shipped with the source: say that it is missing.
      if (is_alias(model_arg))
        std::cerr << "warning: no drafter for '" << model_arg << "' in " << joined_bases()
                  << " (DSPARK_DRAFTERS may name the directory that holds it); decoding without one\n";
      no_drafter_why_ = "no drafter";
      return nullptr;
    }
  }
  resolved_dir_ = dir;
  auto d = std::make_unique<Drafter>(load_drafter(dir));
  check_drafter_matches(d->config(), target.info());
  d->bind(target, target.info().compute == "quant");
  drafter_gamma_ = d->gamma();
  return d;
}

void DrafterOptions::warn_unused_drafter_options(const std::string& why) const {
  std::string given;
  for (const CLI::Option* o : drafter_only_opts_)
    if (o != nullptr && o->count() > 0) given += (given.empty() ? "" : ", ") + o->get_name();
  if (!given.empty())
    std::cerr << "warning: " << given << " ignored with " << why << " (they set a drafter's blocks and pruning)\n";
}

std::string DrafterOptions::profile_path() const {
  return default_profile_path(profile_key_, at::get_num_threads());
}

void DrafterOptions::measure_profile(TargetModel& target) const {
  SpsProfileOptions o;
  o.bmax = std::max({16, (gamma > 0 ? gamma : drafter_gamma_) + 1, lookup.enabled() ? lookup.max_draft + 1 : 0});
  o.context = std::min<int64_t>(256, target.info().context - o.bmax - 1);
  if (o.context < 1) return;
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  measured_sps_ = current_sps_profile(target, profile_path(), o, tty ? &std::cerr : nullptr);
}

void DrafterOptions::read_or_measure_profile(TargetModel* target, bool warn) const {
  if (measured_sps_) return;
  if (target != nullptr) {
    measure_profile(*target);
    return;
  }
  // No target to measure on (dspark serve keeps its own curve current): the
  // saved profile, if any.
  if (!std::filesystem::exists(profile_path())) return;
  try {
    measured_sps_ = load_sps_profile(profile_path()).sps;
    make_sps_monotone(*measured_sps_);
  } catch (const Error& e) {
    if (warn) std::cerr << "warning: ignoring the SPS profile " << profile_path() << ": " << e.what() << "\n";
  }
}

SpecOptions DrafterOptions::spec(TargetModel* target) const {
  if (std::isnan(min_conf)) throw InvalidArgument("--min-conf: expected a number in [0, 1], got nan");
  // With no drafter, lookup drafts only when asked for: `--drafter none` is plain decoding.
  LookupOptions lk = lookup;
  const bool given = lookup_explicit || (lookup_opt_ != nullptr && lookup_opt_->count() > 0);
  if (drafter_gamma_ == 0 && !given) lk.min_ngram = 0;
  // The longest n-gram follows a larger shortest one unless it was set too.
  if (lookup_max_opt_ == nullptr || lookup_max_opt_->count() == 0) lk.max_ngram = std::max(lk.max_ngram, lk.min_ngram);
  SpecOptions s;
  s.gamma = gamma;
  if (lk.enabled() && lk.max_ngram < lk.min_ngram)
    throw InvalidArgument("--lookup-ngram-max: expected at least --lookup-ngram = " + std::to_string(lk.min_ngram) +
                          ", got " + std::to_string(lk.max_ngram));
  s.lookup = lk;
  std::string schedule = this->schedule;
  if (schedule == "auto") {
    const bool explicit_pruning = min_conf >= 0 || !thresholds.empty();
    bool have_profile = !profile.empty() || measured_sps_.has_value();
    const bool wants_profile = !explicit_pruning && !no_prune && (drafter_gamma_ > 0 || lk.enabled());
    if (!have_profile && wants_profile) {
      read_or_measure_profile(target, /*warn=*/true);
      have_profile = measured_sps_.has_value();
    }
    schedule = no_prune ? "off" : have_profile && !explicit_pruning ? "sps" : "thresholds";
  }
  s.prune = !no_prune && schedule == "thresholds";
  if (no_prune && schedule == "sps")
    throw InvalidArgument("--no-prune conflicts with --schedule sps (use --schedule off)");
  if (schedule == "sps" && profile.empty() && measured_sps_) {
    s.sps = *measured_sps_;
  } else if (schedule == "sps") {
    const std::string path = !profile.empty()         ? profile
                             : !profile_key_.empty()  ? profile_path()
                                                      : throw InvalidArgument("--schedule sps: no model loaded");
    const SpsProfile prof = load_sps_profile(path);
    if (const std::string w = sps_profile_mismatch(prof, path, profile_key_); !w.empty())
      std::cerr << "warning: " << w << "\n";
    s.sps = prof.sps;
  }
  // Confidence pruning alone still skips the drafter where it does not pay:
  // the skip rule prices rounds on this machine's profile (measured on first
  // use, as for `auto`). `off` verifies every drafted token of every round.
  if (schedule == "thresholds" && drafter_gamma_ > 0 && with_schedule_) {
    // The schedule does not need it: unreadable, the rule drafts every round.
    read_or_measure_profile(target, /*warn=*/false);
    if (measured_sps_) s.gate_sps = *measured_sps_;
  }
  s.min_conf = min_conf;
  s.gate_memory = std::make_shared<DrafterGateMemory>();
  if (thresholds.empty() && thresholds_opt_ != nullptr && thresholds_opt_->count() > 0)
    throw InvalidArgument("--thresholds: expected numbers in [0, 1] separated by commas, or 'none', got an empty string");
  if (thresholds == "none") {
    s.thresholds = std::vector<double>{};
  } else if (!thresholds.empty()) {
    if (thresholds.back() == ',')
      throw InvalidArgument("--thresholds: expected numbers in [0, 1] separated by commas, got a trailing comma");
    std::vector<double> v;
    std::stringstream ss(thresholds);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        size_t used = 0;
        const double x = std::stod(item, &used);
        if (used != item.size() || !(x >= 0 && x <= 1)) throw std::invalid_argument(item);
        v.push_back(x);
      } catch (const std::exception&) {
        throw InvalidArgument("--thresholds: expected numbers in [0, 1] separated by commas, got '" +
                              item + "'");
      }
    }
    s.thresholds = v;
  }
  // Said once every option is known to be valid (errors come alone).
  if (!no_drafter_why_.empty()) warn_unused_drafter_options(std::exchange(no_drafter_why_, ""));
  return s;
}

}  // namespace dspark::cli
