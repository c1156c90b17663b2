#include "common.hpp"

#include <ATen/Parallel.h>

namespace dspark::cli {

void ModelOptions::add(CLI::App& app) {
  app.add_option("-m,--model", model, "GGUF model file or alias (smollm2)")->capture_default_str();
  app.add_option("-t,--threads", threads, "CPU threads")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("-c,--ctx-size", ctx_size, "context length in tokens (0 = the model's)")
      ->check(CLI::NonNegativeNumber);
}

void ModelOptions::apply_threads() const { at::set_num_threads(threads); }

void add_sampling_options(CLI::App& app, SamplingParams& p) {
  app.add_option("--temp", p.temperature, "temperature (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", p.top_k, "top-k (0 = disabled)")->capture_default_str();
  app.add_option("--top-p", p.top_p, "top-p (1 = disabled)")->capture_default_str();
  app.add_option("--min-p", p.min_p, "min-p (0 = disabled)")->capture_default_str();
  app.add_option("--seed", p.seed, "RNG seed")->capture_default_str();
}

nlohmann::json stats_json(const GenerateStats& s) {
  nlohmann::json j = {
      {"prompt_tokens", s.prompt_tokens},
      {"generated_tokens", s.generated_tokens},
      {"prefill_tok_s", s.prefill_tok_s()},
      {"decode_tok_s", s.decode_tok_s()},
      {"prefill_s", s.prefill_s},
      {"decode_s", s.decode_s},
      {"target_calls", s.target_calls},
  };
  if (s.rounds > 0) {
    j["tau"] = s.tau();
    j["drafted"] = s.drafted;
    j["accepted"] = s.accepted;
    j["acceptance_by_position"] = s.acceptance_by_position();
    j["draft_ms"] = s.draft_s * 1e3;
    j["verify_ms"] = s.verify_s * 1e3;
  }
  return j;
}

}  // namespace dspark::cli
