// Drafter-related options shared by generate, bench and serve.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/speculative.hpp"

namespace dspark::cli {

struct DrafterOptions {
  std::string drafter = "auto";  // DIR, "none", or "auto" (the shipped drafter for the model, if any)
  int gamma = 0;
  double min_conf = -1.0;
  std::string thresholds;        // "a,b,..."; "" = unset; "none" = empty list (disables)
  bool no_prune = false;
  /// Prompt-lookup drafts (--lookup-ngram, 0 = off). On by default at n = 2
  /// next to a drafter (on the dev prompts it beat the drafter alone at T = 0
  /// and 0.7, docs/interop.md); with no drafter only when --lookup-ngram is
  /// given, so that `--drafter none` stays plain decoding.
  LookupOptions lookup = default_lookup();
  /// Set by callers without a command line (the Python package): lookup.min_ngram
  /// was chosen explicitly, as if --lookup-ngram had been given.
  bool lookup_explicit = false;
  static LookupOptions default_lookup() {
    LookupOptions o;
    o.min_ngram = 2;
    return o;
  }
  /// Verify-length schedule: "off" (verify all γ), "thresholds" (confidence
  /// pruning), "sps" (hardware-aware scheduler, Alg. 1 with R = 1, on the
  /// SPS profile `profile`; default $DSPARK_HOME/profiles/<model id>.json),
  /// or "auto": sps unless --min-conf or --thresholds is given (then
  /// thresholds) — on the profile that exists, else one spec(target)
  /// measures; with --no-prune, off.
  std::string schedule = "auto";
  std::string profile;

  /// Registers the options; with_schedule = false leaves out --schedule and
  /// --profile (the server schedules with its own --sps option).
  void add(CLI::App& app, bool with_schedule = true);
  /// Loads and binds the drafter for `target` (nullptr when none/auto finds nothing).
  /// `model_arg` is the -m value (used by "auto"). Throws Error / FormatError.
  /// Records the target id for the default SPS profile path of spec().
  std::unique_ptr<Drafter> load(const std::string& model_arg, const TargetModel& target) const;
  /// Warns on stderr when --gamma, --min-conf, --thresholds or --no-prune was
  /// given but no drafter runs (`why`: "--drafter none", "no drafter"); spec()
  /// calls it after load() found no drafter.
  void warn_unused_drafter_options(const std::string& why) const;
  /// Throws InvalidArgument for conflicting options and Error when the SPS
  /// profile of --schedule sps is missing ("run dspark profile").
  /// With `target`, "auto", a drafter loaded, no pruning flags and no
  /// profile on this machine yet, the SPS profile is measured first (B up to
  /// max(16, γ+1, 1 + the longest lookup draft) at a 256-token context, about a second; a progress line on
  /// a terminal) and saved to the default path, so that "auto" schedules
  /// with it from the first run on.
  /// With confidence pruning alone (--min-conf, --thresholds, --schedule
  /// thresholds) the profile is read or measured the same way for the
  /// drafter-skip rule (SpecOptions::gate_sps); --schedule off and --no-prune
  /// draft every round.
  SpecOptions spec(TargetModel* target = nullptr) const;

  /// The directory load() read the drafter from ("" before, or when none).
  const std::string& resolved_dir() const { return resolved_dir_; }

 private:
  void measure_profile(TargetModel& target) const;  // sets measured_sps_: the default profile, kept current
  // measured_sps_ unless set: measured on `target`, else read from the saved default profile (`warn`: say
  // when it cannot be read).
  void read_or_measure_profile(TargetModel* target, bool warn) const;
  std::string profile_path() const;  // the default profile of profile_key_ at this thread count

  CLI::Option* thresholds_opt_ = nullptr;  // set by add(): tells "--thresholds ''" from no option
  std::vector<CLI::Option*> drafter_only_opts_;  // set by add(): options that need a drafter
  mutable std::string no_drafter_why_;            // set by load() when no drafter runs
  CLI::Option* lookup_opt_ = nullptr;      // set by add(): whether --lookup-ngram was given
  CLI::Option* lookup_max_opt_ = nullptr;  // set by add(): whether --lookup-ngram-max was given
  mutable std::string target_id_;     // set by load()
  mutable std::string profile_key_;   // sps_profile_key of the target, set by load()
  mutable std::string resolved_dir_;  // set by load()
  mutable int drafter_gamma_ = 0;     // set by load() when a drafter is loaded
  bool with_schedule_ = true;         // set by add(): false where the caller schedules verify lengths
  mutable std::optional<std::vector<double>> measured_sps_;  // the default profile, read or measured by spec()
};

/// True when `model_arg` names a model by alias (smollm2), not by file.
bool is_alias(const std::string& model_arg);

/// Directory of the drafter shipped for a model alias, or "" when none:
/// <base>/<alias>/ for the bases $DSPARK_DRAFTERS (alone, when set), else the
/// source tree's drafters/ and ./drafters/.
std::string shipped_drafter_dir(const std::string& model_arg);

/// Directory of a shipped drafter whose dspark.json names `target_id` (a
/// target given as a GGUF path rather than an alias), or "" when none.
std::string shipped_drafter_for_target(const std::string& target_id);

}  // namespace dspark::cli
