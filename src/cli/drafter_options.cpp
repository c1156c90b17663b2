#include "drafter_options.hpp"

#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "dspark/error.hpp"
#include "dspark/spec/checkpoint.hpp"
#include "dspark/spec/sps_profile.hpp"

namespace dspark::cli {

void DrafterOptions::add(CLI::App& app, bool with_schedule) {
  app.add_option("--drafter", drafter,
                 "drafter directory, 'none' for plain decoding, or 'auto' (the drafter shipped for "
                 "the model, if any)")
      ->capture_default_str();
  app.add_option("--gamma", gamma, "draft block size γ (0 = the drafter's)")
      ->check(CLI::Range(0, kMaxGamma));
  app.add_option("--min-conf", min_conf, "uniform confidence threshold for pruning (overrides calibration)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--thresholds", thresholds,
                 "per-position confidence thresholds a,b,... ('none' disables calibration thresholds)");
  app.add_flag("--no-prune", no_prune, "verify every drafted token (no confidence pruning)");
  if (!with_schedule) {
    schedule = "thresholds";  // the caller schedules verify lengths itself
    return;
  }
  app.add_option("--schedule", schedule,
                 "verify length: off (all drafted tokens), thresholds (confidence pruning), sps "
                 "(hardware-aware scheduler on the SPS profile), auto (sps when this machine has a "
                 "profile, else thresholds)")
      ->check(CLI::IsMember({"auto", "off", "thresholds", "sps"}))
      ->capture_default_str();
  app.add_option("--profile", profile,
                 "SPS profile for --schedule sps (default: $DSPARK_HOME/profiles/<model id>.json)");
}

namespace {
const std::vector<std::string>& drafter_bases() {
  static const std::vector<std::string> bases = {std::string(DSPARK_DATA_DIR) + "/drafters/", "drafters/"};
  return bases;
}
}  // namespace

std::string shipped_drafter_dir(const std::string& model_arg) {
  namespace fs = std::filesystem;
  if (model_arg.find('/') != std::string::npos || model_arg.find(".gguf") != std::string::npos)
    return "";
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
  std::string dir = drafter;
  if (dir == "none") return nullptr;
  if (dir == "auto") {
    dir = shipped_drafter_dir(model_arg);
    if (dir.empty()) dir = shipped_drafter_for_target(target.info().id);
    if (dir.empty()) return nullptr;
  }
  resolved_dir_ = dir;
  auto d = std::make_unique<Drafter>(load_drafter(dir));
  check_drafter_matches(d->config(), target.info());
  d->bind(target);
  return d;
}

SpecOptions DrafterOptions::spec() const {
  if (std::isnan(min_conf)) throw InvalidArgument("--min-conf: expected a number in [0, 1], got nan");
  SpecOptions s;
  s.gamma = gamma;
  std::string schedule = this->schedule;
  if (schedule == "auto") {
    const bool have_profile =
        !profile.empty() || (!target_id_.empty() && std::filesystem::exists(default_profile_path(target_id_)));
    const bool explicit_pruning = min_conf >= 0 || !thresholds.empty();
    schedule = no_prune ? "off" : have_profile && !explicit_pruning ? "sps" : "thresholds";
  }
  s.prune = !no_prune && schedule == "thresholds";
  if (no_prune && schedule == "sps")
    throw InvalidArgument("--no-prune conflicts with --schedule sps (use --schedule off)");
  if (schedule == "sps") {
    const std::string path = !profile.empty()         ? profile
                             : !target_id_.empty()    ? default_profile_path(target_id_)
                                                      : throw InvalidArgument("--schedule sps: no model loaded");
    const SpsProfile prof = load_sps_profile(path);
    if (const std::string w = sps_profile_mismatch(prof, path, target_id_); !w.empty())
      std::cerr << "warning: " << w << "\n";
    s.sps = prof.sps;
  }
  s.min_conf = min_conf;
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
  return s;
}

}  // namespace dspark::cli
