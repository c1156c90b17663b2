// Drafter-related options shared by generate, bench and serve.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common.hpp"
#include "dspark/spec/drafter.hpp"
#include "dspark/spec/speculative.hpp"

namespace dspark::cli {

struct DrafterOptions {
  std::string drafter = "auto";  // DIR, "none", or "auto" (the shipped drafter for the model, if any)
  int gamma = 0;
  double min_conf = -1.0;
  std::string thresholds;        // "a,b,..."; "" = unset; "none" = empty list (disables)
  bool no_prune = false;

  void add(CLI::App& app);
  /// Loads and binds the drafter for `target` (nullptr when none/auto finds nothing).
  /// `model_arg` is the -m value (used by "auto"). Throws Error / FormatError.
  std::unique_ptr<Drafter> load(const std::string& model_arg, const TargetModel& target) const;
  SpecOptions spec() const;
};

/// Directory of the drafter shipped for a model alias, or "" when none.
std::string shipped_drafter_dir(const std::string& model_arg);

}  // namespace dspark::cli
