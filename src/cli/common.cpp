#include "common.hpp"

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include "dspark/error.hpp"
#include "dspark/serve/request_checks.hpp"

namespace dspark::cli {

namespace {

// The whole decimal integer `v`, or nullopt (with `overflow` set when it is
// one but past int64).
std::optional<int64_t> parse_integer(const std::string& v, bool& overflow) {
  overflow = false;
  const char* b = v.data() + (!v.empty() && v[0] == '+' ? 1 : 0);
  const char* e = v.data() + v.size();
  if (b == e) return std::nullopt;
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(b, e, x);
  if (end != e) return std::nullopt;
  if (ec == std::errc::result_out_of_range) overflow = true;
  if (ec != std::errc()) return std::nullopt;
  return x;
}

CLI::Validator integer_between(int64_t lo, int64_t hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& v) -> std::string {
        bool overflow = false;
        const auto x = parse_integer(v, overflow);
        if (x && *x >= lo && *x <= hi) return "";
        return "expected " + what + ", got '" + v + "'" + (overflow ? " (past the 64-bit range)" : "");
      },
      what);
}

CLI::Validator integer_at_least(int64_t lo, const std::string& what) {
  return integer_between(lo, std::numeric_limits<int64_t>::max(), what);
}

std::string bound_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

void refuse_existing_drafter(const std::string& dir, bool force) {
  if (!force && std::filesystem::exists(std::filesystem::path(dir) / "dspark.json"))
    throw Error(dir + ": already holds a drafter (dspark.json); pass --force to replace it");
}

void prepare_output_file(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec))
    throw Error(option + " " + path + ": is a directory, expected a file path");
  const fs::path parent = p.parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    fs::create_directories(parent, ec);
    if (ec || !fs::is_directory(parent))
      throw Error(option + " " + path + ": cannot create directory " + parent.string() +
                  (ec ? " (" + ec.message() + ")" : std::string()));
  }
  // The file is written atomically (a temporary file beside it, renamed):
  // try that directory now rather than after the work.
  const std::string probe =
      ((parent.empty() ? fs::path(".") : parent) / (".dspark-probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw Error(option + " " + path + ": cannot write a file in " + (parent.empty() ? "." : parent.string()) +
                " (" + std::strerror(errno) + ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

CLI::Validator path_text() {
  return CLI::Validator(
      [](std::string& v) -> std::string { return v.empty() ? "expected a path, got an empty string" : ""; },
      "PATH");
}

CLI::Validator positive_integer() { return integer_at_least(1, "a positive integer"); }
CLI::Validator non_negative_integer() { return integer_at_least(0, "a non-negative integer"); }
CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return integer_between(lo, hi, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}
CLI::Validator number_in(double lo, double hi) {
  const std::string what = "a number in [" + bound_text(lo) + ", " + bound_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, what](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
        if (!v.empty() && end == v.c_str() + v.size() && std::isfinite(x) && x >= lo && x <= hi) return "";
        return "expected " + what + ", got '" + v + "'";
      },
      what);
}

void ModelOptions::add(CLI::App& app) {
  app.add_option("-m,--model", model, "GGUF model file or alias (smollm2, gemma3)")->capture_default_str();
  app.add_option("-t,--threads", threads, "CPU threads")->check(integer_in(1, 256))->capture_default_str();
  app.add_option("-c,--ctx-size", ctx_size, "context length in tokens (0 = the model's)")
      ->check(non_negative_integer());
  app.add_option("--compute", compute,
                 "matrix products: quant (on the GGUF's quantized blocks, int8 activations) or bf16 "
                 "(weights dequantized to bf16)")
      ->check(CLI::IsMember({"quant", "bf16"}))
      ->capture_default_str();
}

ops::Compute ModelOptions::compute_mode() const { return compute == "bf16" ? ops::Compute::BF16 : ops::Compute::Quant; }

void ModelOptions::apply_threads() const {
#ifdef __SANITIZE_THREAD__
  // libgomp is not built with TSan, so the barriers of the kernels' OpenMP
  // regions are invisible to it and every kernel would be reported (and each
  // report symbolized, which made decoding ~1000x slower). A TSan build runs
  // the kernels on the calling thread and checks our own threads: the server,
  // the engine and the batch runner.
  at::set_num_threads(1);
#else
  at::set_num_threads(threads);
#endif
}

CLI::Option* add_sampling_options(CLI::App& app, SamplingParams& p) {
  app.add_option("--temp", p.temperature, "temperature (0 = greedy)")->capture_default_str();
  // The values mean what they mean to the server and the Python package
  // (request_checks.hpp): -1 and 0 disable top-k, -1 draws a random seed.
  app.add_option_function<int64_t>(
         "--top-k",
         [&p](const int64_t& k) {
           try {
             p.top_k = serve::top_k_value(k, "--top-k");
           } catch (const InvalidArgument& e) {
             throw CLI::ValidationError(e.what());
           }
         },
         "top-k (0 or -1 = disabled)")
      ->default_str(std::to_string(p.top_k));
  app.add_option("--top-p", p.top_p, "top-p (1 = disabled)")->capture_default_str();
  app.add_option("--min-p", p.min_p, "min-p (0 = disabled)")->capture_default_str();
  return app.add_option_function<std::string>(
         "--seed",
         [&p](const std::string& v) {
           std::optional<uint64_t> seed;
           try {
             seed = serve::seed_value(v, "--seed");
           } catch (const InvalidArgument& e) {
             throw CLI::ValidationError(e.what());
           }
           p.seed = seed ? *seed : serve::random_seed();
         },
         "RNG seed (-1 = a random seed)")
      ->default_str(std::to_string(p.seed));
}

void RuleOption::add(CLI::App& app, CLI::Option* seed) {
  seed_ = seed;
  app.add_option("--sampling-rule", rule,
                 "how sampled tokens are drawn and drafts verified: rejection (min(1, p/q), the best "
                 "acceptance), seed-stable (Gumbel-max coupling: the text depends only on the seed), auto "
                 "(seed-stable when --seed is given, else " +
                     std::string(to_string(kUnseededRule)) + ")")
      ->check(CLI::IsMember({"auto", "rejection", "seed-stable"}))
      ->capture_default_str();
}

SamplingRule RuleOption::resolve() const {
  if (rule == "rejection") return SamplingRule::Rejection;
  if (rule == "seed-stable") return SamplingRule::SeedStable;
  return seed_ != nullptr && seed_->count() > 0 ? SamplingRule::SeedStable : kUnseededRule;
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
    j["lookup_rounds"] = s.lookup_rounds;
    j["drafter_rounds"] = s.drafter_rounds;
    j["lookup_drafted"] = s.lookup_drafted;
    j["lookup_accepted"] = s.lookup_accepted;
  }
  return j;
}

}  // namespace dspark::cli
