// `dspark bench`: plain and speculative decoding of every prompt in one
// process, alternating, with τ, acceptance by position, tokens/s, speedup and
// a losslessness check (greedy: identical outputs).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <iostream>

#include "common.hpp"
#include "drafter_options.hpp"
#include "dspark/error.hpp"
#include "dspark/ops/kernel_level.hpp"
#include "dspark/train/regen.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/speculative/runner.hpp"
#include "dspark/speculative/session.hpp"

namespace dspark::cli {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

class BenchCommand : public Command {
 public:
  explicit BenchCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("bench", "benchmark plain vs speculative decoding over a prompt set");
    model_.add(*app_);
    drafter_.add(*app_);
    app_->add_option("--prompts", prompts_, "JSONL file with 'id' and 'prompt'")->required();
    app_->add_option("-n,--n-predict", n_predict_, "tokens per prompt")
        ->check(positive_integer())
        ->capture_default_str();
    sampling_.temperature = 0.f;  // greedy unless --temp says otherwise
    rule_.add(*app_, add_sampling_options(*app_, sampling_));
    app_->add_option("--runs", runs_, "repetitions (medians reported)")->check(integer_in(1, 100));
    app_->add_option("--limit", limit_, "use only the first N prompts (0 = all)")->check(non_negative_integer());
    app_->add_flag("--raw", raw_, "do not apply the chat template (models without one never do)");
    app_->add_flag("--json", json_, "print one JSON object");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    sampling_.validate();
    sampling_.rule = rule_.resolve();
    model_.apply_threads();
    LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());
    auto drafter = drafter_.load(model_.model, *m.target);
    auto prompts = train::read_prompts_jsonl(prompts_);
    if (limit_ > 0 && static_cast<size_t>(limit_) < prompts.size()) prompts.resize(limit_);
    const SpecOptions spec = drafter_.spec(m.target.get());
    const bool speculative = drafter != nullptr || spec.lookup.enabled();

    GenerateOptions opts;
    opts.n_predict = n_predict_;
    opts.ctx_size = model_.ctx_size;
    opts.sampling = sampling_;
    opts.stop_ids = m.stop_ids;

    // Greedy and seed-stable outputs must equal plain decoding token for
    // token; rejection sampling only in distribution.
    const bool exact = sampling_.greedy() || sampling_.rule == SamplingRule::SeedStable;
    nlohmann::json rows = nlohmann::json::array();
    std::vector<double> agg_plain, agg_spec, agg_prefill;
    GenerateStats total_spec;
    bool all_lossless = true;
    // Per prompt, across runs: the rows report medians of rates and speedups
    // (a noisy machine), and lossless only when every run was.
    std::vector<std::vector<double>> p_plain(prompts.size()), p_spec(prompts.size()), p_speedup(prompts.size());
    std::vector<char> p_same(prompts.size(), 1);
    // A base model has no chat template: its prompts are plain-text completions.
    const bool chat = !raw_ && m.chat.has_value();
    if (!raw_ && !chat) std::fprintf(stderr, "the model declares no chat template: prompts are plain completions\n");
    for (int run = 0; run < runs_; ++run) {
      double plain_tokens = 0, plain_s = 0, spec_tokens = 0, spec_s = 0, pre_tokens = 0, pre_s = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<TokenId> ids;
        try {
          ids = m.encode_prompt(prompts[i].text, chat);
        } catch (const Error& e) {
          throw Error("prompt '" + prompts[i].id + "': " + e.what());
        }
        GenerateResult plain, sp;
        auto run_plain = [&] { plain = generate_plain(*m.target, ids, opts); };
        auto run_spec = [&] {
          if (!speculative) return;
          SpecSession session(*m.target, drafter.get(), ids, opts, spec);
          sp = run_session(*m.target, drafter.get(), session, spec);
        };
        // Alternate the order so neither mode always runs on a warmer cache.
        try {
          if (i % 2 == 0) { run_plain(); run_spec(); } else { run_spec(); run_plain(); }
        } catch (const Error& e) {
          throw Error("prompt '" + prompts[i].id + "': " + e.what());
        }
        // Decode rates count the tokens after the first, as decode_tok_s() does.
        plain_tokens += plain.stats.decode_tokens();
        plain_s += plain.stats.decode_s;
        pre_tokens += plain.stats.prompt_tokens;
        pre_s += plain.stats.prefill_s;
        nlohmann::json row = {{"id", prompts[i].id},
                              {"prompt_tokens", plain.stats.prompt_tokens},
                              {"plain_tokens", plain.stats.generated_tokens},
                              {"prefill_tok_s", plain.stats.prefill_tok_s()}};
        p_plain[i].push_back(plain.stats.decode_tok_s());
        if (speculative) {
          spec_tokens += sp.stats.decode_tokens();
          spec_s += sp.stats.decode_s;
          const bool same = sp.tokens == plain.tokens;
          if (exact) all_lossless &= same;
          p_same[i] &= static_cast<char>(same);
          p_spec[i].push_back(sp.stats.decode_tok_s());
          p_speedup[i].push_back(plain.stats.decode_tok_s() > 0 ? sp.stats.decode_tok_s() / plain.stats.decode_tok_s()
                                                                : 0.0);
          total_spec += sp.stats;
          row["tau"] = sp.stats.tau();
          row["acceptance_by_position"] = sp.stats.acceptance_by_position();
          row["rounds"] = sp.stats.rounds;
          row["drafter_rounds"] = sp.stats.drafter_rounds;
        }
        // The last run's counts (a deterministic run repeats them), the
        // median rates of all runs.
        if (run == runs_ - 1) {
          row["plain_tok_s"] = median(p_plain[i]);
          if (speculative) {
            row["spec_tok_s"] = median(p_spec[i]);
            row["speedup"] = median(p_speedup[i]);
            row["lossless"] = exact ? nlohmann::json(p_same[i] != 0) : nlohmann::json(nullptr);
          }
          rows.push_back(row);
        }
        if (!json_ && isatty(fileno(stderr)))
          std::fprintf(stderr, "\rrun %d/%d prompt %zu/%zu", run + 1, runs_, i + 1, prompts.size());
      }
      agg_plain.push_back(plain_s > 0 ? plain_tokens / plain_s : 0);
      agg_prefill.push_back(pre_s > 0 ? pre_tokens / pre_s : 0);
      if (speculative) agg_spec.push_back(spec_s > 0 ? spec_tokens / spec_s : 0);
    }
    if (!json_ && isatty(fileno(stderr))) std::fprintf(stderr, "\r%60s\r", "");

    nlohmann::json agg = {{"prompts", prompts.size()},
                          {"runs", runs_},
                          {"n_predict", n_predict_},
                          {"temperature", sampling_.temperature},
                          {"sampling_rule", sampling_.greedy() ? nlohmann::json() : nlohmann::json(to_string(sampling_.rule))},
                          {"threads", model_.threads},
                          {"kernels", ops::kernel_description()},
                          {"plain_tok_s", median(agg_plain)},
                          {"prefill_tok_s", median(agg_prefill)},
                          {"plain_tok_s_runs", agg_plain}};
    if (speculative) {
      agg["drafter"] = drafter ? nlohmann::json(drafter_.resolved_dir()) : nlohmann::json();
      agg["gamma"] = drafter ? (spec.gamma > 0 ? spec.gamma : drafter->config().gamma) : 0;
      agg["lookup"] = spec.lookup.enabled()
                          ? nlohmann::json{{"min_ngram", spec.lookup.min_ngram},
                                           {"max_ngram", spec.lookup.max_ngram},
                                           {"max_draft", spec.lookup.max_draft},
                                           {"rounds", total_spec.lookup_rounds},
                                           {"drafted", total_spec.lookup_drafted},
                                           {"accepted", total_spec.lookup_accepted}}
                          : nlohmann::json();
      agg["tau"] = total_spec.tau();
      agg["spec_tok_s"] = median(agg_spec);
      agg["spec_tok_s_runs"] = agg_spec;
      agg["speedup"] = median(agg_plain) > 0 ? median(agg_spec) / median(agg_plain) : 0.0;
      agg["acceptance_by_position"] = total_spec.acceptance_by_position();
      agg["drafted"] = total_spec.drafted;
      agg["accepted"] = total_spec.accepted;
      agg["rounds"] = total_spec.rounds;
      agg["drafter_rounds"] = total_spec.drafter_rounds;
      agg["target_calls"] = total_spec.target_calls;
      agg["draft_ms_per_round"] = total_spec.rounds ? total_spec.draft_s * 1e3 / total_spec.rounds : 0;
      agg["verify_ms_per_round"] = total_spec.rounds ? total_spec.verify_s * 1e3 / total_spec.rounds : 0;
      agg["lossless"] = exact ? nlohmann::json(all_lossless) : nlohmann::json(nullptr);
    }
    if (json_) {
      std::cout << nlohmann::json{{"aggregate", agg}, {"prompts", rows}}.dump(2) << std::endl;
    } else {
      print_table(agg, rows, speculative);
    }
    return 0;
  }

 private:
  static void print_table(const nlohmann::json& agg, const nlohmann::json& rows, bool spec) {
    std::printf("kernels %s, %d threads\n", agg["kernels"].get<std::string>().c_str(), agg["threads"].get<int>());
    int w = 10;  // the id column: as wide as the longest prompt id
    for (const auto& r : rows) w = std::max(w, static_cast<int>(r["id"].get<std::string>().size()));
    if (spec) {
      std::printf("%-*s %6s %10s %10s %8s %9s\n", w, "prompt", "tau", "plain t/s", "spec t/s", "speedup", "lossless");
      for (const auto& r : rows) {
        std::printf("%-*s %6.2f %10.1f %10.1f %7.2fx %9s\n", w, r["id"].get<std::string>().c_str(),
                    r["tau"].get<double>(), r["plain_tok_s"].get<double>(), r["spec_tok_s"].get<double>(),
                    r["speedup"].get<double>(), r["lossless"].is_null() ? "-" : r["lossless"].get<bool>() ? "yes" : "NO");
      }
      std::printf("\naggregate: tau %.2f | plain %.1f tok/s | speculative %.1f tok/s | speedup %.2fx | prefill %.1f tok/s | lossless %s\n",
                  agg["tau"].get<double>(), agg["plain_tok_s"].get<double>(), agg["spec_tok_s"].get<double>(),
                  agg["speedup"].get<double>(), agg["prefill_tok_s"].get<double>(),
                  agg["lossless"].is_null() ? "n/a (sampling)" : agg["lossless"].get<bool>() ? "yes" : "NO");
      std::printf("acceptance by position:");
      for (double a : agg["acceptance_by_position"]) std::printf(" %.2f", a);
      if (agg["acceptance_by_position"].empty()) std::printf(" none (no drafted position was verified)");
      std::printf("\ndraft %.2f ms/round, verify %.2f ms/round; the drafter drafted %lld of %lld rounds (all runs)\n",
                  agg["draft_ms_per_round"].get<double>(), agg["verify_ms_per_round"].get<double>(),
                  agg["drafter_rounds"].get<long long>(), agg["rounds"].get<long long>());
      if (const auto& lk = agg["lookup"]; !lk.is_null()) {
        const auto drafted = lk["drafted"].get<long long>(), accepted = lk["accepted"].get<long long>();
        std::printf("lookup drafts: %lld of %lld rounds, %lld of %lld drafted tokens accepted\n",
                    lk["rounds"].get<long long>(), agg["rounds"].get<long long>(), accepted, drafted);
      }
    } else {
      std::printf("%-*s %8s %12s %12s\n", w, "prompt", "tokens", "decode t/s", "prefill t/s");
      for (const auto& r : rows)
        std::printf("%-*s %8lld %12.1f %12.1f\n", w, r["id"].get<std::string>().c_str(),
                    r["plain_tokens"].get<long long>(), r["plain_tok_s"].get<double>(), r["prefill_tok_s"].get<double>());
      std::printf("\naggregate (plain decoding, no drafter): decode %.1f tok/s | prefill %.1f tok/s\n",
                  agg["plain_tok_s"].get<double>(), agg["prefill_tok_s"].get<double>());
    }
  }

  CLI::App* app_;
  ModelOptions model_;
  DrafterOptions drafter_;
  SamplingParams sampling_;
  RuleOption rule_;
  std::string prompts_;
  int64_t n_predict_ = 128;
  int runs_ = 1;
  int64_t limit_ = 0;
  bool raw_ = false, json_ = false;
};

std::unique_ptr<Command> make_bench(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<BenchCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
