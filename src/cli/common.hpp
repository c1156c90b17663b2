// Shared pieces of the `dspark` subcommands: option groups and output helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>

#include "dspark/ops/linear.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/sampling.hpp"

namespace dspark::cli {

/// Options every model-running command takes (llama.cpp flag names).
struct ModelOptions {
  std::string model = "smollm2";  // -m: GGUF path or alias
  int threads = 2;                // -t
  int64_t ctx_size = 0;           // -c: 0 = the model's context length
  std::string compute = "quant";  // --compute: quant | bf16

  void add(CLI::App& app);
  /// The --compute choice.
  ops::Compute compute_mode() const;
  /// Applies the thread count to ATen (at::set_num_threads); 1 in a
  /// ThreadSanitizer build (see common.cpp).
  void apply_threads() const;
};

/// Option validators for integer counts: accept only a whole decimal number
/// (no sign for positive_integer) that fits int64, and otherwise fail with
/// "expected a positive integer, got '...'" (resp. non-negative).
CLI::Validator positive_integer();
CLI::Validator non_negative_integer();

/// CLI::Range with messages that say what was expected: "expected an
/// integer in [lo, hi], got '...'" (whole decimal numbers that fit int64) or
/// "expected a number in [lo, hi], got '...'" (finite decimals).
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator number_in(double lo, double hi);

/// Refuses an empty value: "expected a path, got an empty string".
CLI::Validator path_text();

/// Checks, before any long work, that `path` can be written as a file:
/// not a directory, its parent directories creatable (they are created),
/// a file creatable in its directory (a probe file, removed at once).
/// Throws dspark::Error naming `option` and the path.
void prepare_output_file(const std::string& path, const std::string& option);

/// Refuses to write a drafter into `dir` when it already holds one
/// (dspark.json) unless `force`. Throws dspark::Error saying how to replace it.
void refuse_existing_drafter(const std::string& dir, bool force);

/// --temp --top-k --top-p --min-p --seed. Returns the --seed option (its
/// count() tells whether a seed was named).
CLI::Option* add_sampling_options(CLI::App& app, SamplingParams& p);

/// --sampling-rule auto|rejection|seed-stable (dspark/speculative/sampling.hpp,
/// docs/sampling.md).
struct RuleOption {
  std::string rule = "auto";
  /// Registers the option; `seed` is add_sampling_options()'s result.
  void add(CLI::App& app, CLI::Option* seed);
  /// The rule asked for: "auto" is seed-stable when --seed was given and
  /// kUnseededRule otherwise.
  SamplingRule resolve() const;

 private:
  CLI::Option* seed_ = nullptr;
};

/// The stats object of `--json` output.
nlohmann::json stats_json(const GenerateStats& s);

/// A subcommand: registers its options on construction, runs when selected.
class Command {
 public:
  virtual ~Command() = default;
  virtual int run() = 0;
};

}  // namespace dspark::cli
