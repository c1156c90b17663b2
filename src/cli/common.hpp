// Shared pieces of the `dspark` subcommands: option groups and output helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>

#include "dspark/spec/generate.hpp"
#include "dspark/spec/sampling.hpp"

namespace dspark::cli {

/// Options every model-running command takes (llama.cpp flag names).
struct ModelOptions {
  std::string model = "smollm2";  // -m: GGUF path or alias
  int threads = 2;                // -t
  int64_t ctx_size = 0;           // -c: 0 = the model's context length

  void add(CLI::App& app);
  /// Applies the thread count to ATen (at::set_num_threads).
  void apply_threads() const;
};

/// --temp --top-k --top-p --min-p --seed.
void add_sampling_options(CLI::App& app, SamplingParams& p);

/// The stats object of `--json` output.
nlohmann::json stats_json(const GenerateStats& s);

/// A subcommand: registers its options on construction, runs when selected.
class Command {
 public:
  virtual ~Command() = default;
  virtual int run() = 0;
};

}  // namespace dspark::cli
