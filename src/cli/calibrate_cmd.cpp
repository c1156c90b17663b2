// `dspark calibrate`: STS calibration of a drafter's confidence head
// (dspark-method.md §6). Runs real speculative decoding at full γ without
// pruning over a prompt set, fits one temperature per position and the
// precision-target thresholds, and stores them in the drafter's dspark.json
// (`config.sts`), replacing only that file, atomically; the weights are not
// touched.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "common.hpp"
#include "drafter_options.hpp"
#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/speculative/calibration.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/train/regen.hpp"

namespace dspark::cli {

namespace {

std::string fmt(double x, const char* f = "%.3f") {
  if (!std::isfinite(x)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

}  // namespace

class CalibrateCommand : public Command {
 public:
  explicit CalibrateCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("calibrate",
                                 "fit STS temperatures and precision thresholds of a drafter's "
                                 "confidence head and store them in its dspark.json");
    model_.add(*app_);
    app_->add_option("--drafter", drafter_, "drafter directory ('auto': the drafter shipped for the model)")
        ->required();
    auto* prompts = app_->add_option("--prompts", prompts_, "JSONL file with a string 'prompt' per line");
    auto* rounds = app_->add_option("--rounds", rounds_in_,
                                    "fit on verify rounds recorded earlier (--save-rounds) instead of decoding prompts");
    prompts->excludes(rounds);
    rounds->excludes(prompts);
    app_->add_option("--save-rounds", rounds_out_, "also write the recorded verify rounds to this JSONL file")->check(path_text());
    app_->add_option("-n,--n-predict", n_predict_, "tokens generated per prompt")
        ->check(positive_integer())
        ->capture_default_str();
    app_->add_option("--limit", limit_, "use only the first K prompts (0 = all)")->check(non_negative_integer());
    sampling_.temperature = 0.f;  // greedy unless --temp says otherwise
    add_sampling_options(*app_, sampling_);
    app_->add_option("--target-precision", target_, "acceptance precision the thresholds must reach")
        ->check(number_in(0.0, 1.0))
        ->capture_default_str();
    app_->add_option("--bins", bins_, "ECE bins (equal width)")->check(integer_in(2, 100))->capture_default_str();
    app_->add_option("--plot", plot_,
                     "reliability diagram: a .png path (an .svg with labels is written next to it) "
                     "or an .svg path")
        ->check(path_text());
    app_->add_flag("--raw", raw_, "do not apply the chat template");
    app_->add_flag("--dry-run", dry_run_, "report only; do not modify dspark.json");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    namespace fs = std::filesystem;
    sampling_.validate();
    model_.apply_threads();
    if (drafter_ == "none") throw InvalidArgument("calibrate needs a drafter: pass --drafter DIR or --drafter auto");
    std::string dir = drafter_;
    if (dir == "auto") {
      dir = shipped_drafter_dir(model_.model);
      if (dir.empty()) throw Error("no drafter is shipped for model '" + model_.model + "'; pass --drafter DIR");
    }
    if (!plot_.empty()) {
      const std::string ext = fs::path(plot_).extension().string();
      if (ext != ".png" && ext != ".svg")
        throw InvalidArgument("--plot " + plot_ + ": expected a .png or .svg file name, got '" + ext + "'");
      prepare_output_file(plot_, "--plot");
    }
    if (prompts_.empty() && rounds_in_.empty())
      throw InvalidArgument("calibrate: pass --prompts FILE (decode and record rounds) or --rounds FILE");
    if (!rounds_out_.empty()) prepare_output_file(rounds_out_, "--save-rounds");
    std::vector<CalibrationRound> rounds;
    int gamma = 0;
    if (!rounds_in_.empty()) {
      gamma = config_from_json(read_drafter_json(dir), (std::filesystem::path(dir) / "dspark.json").string()).gamma;
      rounds = read_rounds_jsonl(rounds_in_);
      for (const auto& r : rounds)
        if (static_cast<int>(r.conf_logits.size()) > gamma)
          throw FormatError(rounds_in_ + ": a round verifies " + std::to_string(r.conf_logits.size()) +
                            " positions, more than the drafter's gamma " + std::to_string(gamma));
    } else {
      rounds = record_rounds(dir, gamma);
    }
    if (!rounds_out_.empty()) {
      write_rounds_jsonl(rounds_out_, rounds);
      std::printf("wrote %zu rounds to %s\n", rounds.size(), rounds_out_.c_str());
    }

    StsOptions so;
    so.bins = bins_;
    const StsReport rep = calibrate_sts(rounds, gamma, target_, so);
    print_table(rep);

    if (dry_run_) std::printf("dry run: %s not modified\n", (fs::path(dir) / "dspark.json").c_str());
    if (!dry_run_) {
      nlohmann::json j = read_drafter_json(dir);
      const std::string path = (fs::path(dir) / "dspark.json").string();
      if (!j.is_object() || !j.contains("config") || !j["config"].is_object())
        throw FormatError(path + ": missing key 'config'");
      j["config"]["sts"] = sts_to_json(rep, bins_);
      config_from_json(j, path);  // the result must load
      io::write_json_atomic(path, j);
      std::printf("wrote config.sts to %s (%lld rounds)\n", path.c_str(), static_cast<long long>(rep.samples));
    }
    if (!plot_.empty()) {
      const fs::path p(plot_);
      if (p.extension() == ".svg") {
        io::write_file_atomic(plot_, reliability_svg(rep));
      } else {
        io::write_file_atomic(plot_, reliability_png(rep));
        fs::path svg = p;
        svg.replace_extension(".svg");
        io::write_file_atomic(svg.string(), reliability_svg(rep));
        std::printf("wrote %s and %s (left: before, right: after; colours by position)\n", plot_.c_str(),
                    svg.string().c_str());
      }
    }
    return 0;
  }

 private:
  // Real speculative decoding at full γ (no pruning) over the prompt set.
  std::vector<CalibrationRound> record_rounds(const std::string& dir, int& gamma) const {
    LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());
    Drafter d = load_drafter(dir);
    check_drafter_matches(d.config(), m.target->info());
    d.bind(*m.target, m.target->info().compute == "quant");  // as generate and serve draft
    gamma = d.config().gamma;

    auto prompts = train::read_prompts_jsonl(prompts_);
    if (limit_ > 0 && static_cast<size_t>(limit_) < prompts.size()) prompts.resize(limit_);

    GenerateOptions opts;
    opts.n_predict = n_predict_;
    opts.ctx_size = model_.ctx_size;
    opts.sampling = sampling_;
    opts.stop_ids = m.stop_ids;
    SpecOptions spec;
    spec.prune = false;  // full γ every round
    std::vector<CalibrationRound> rounds;
    spec.on_round = collect_rounds(rounds);
    const bool tty = isatty(fileno(stderr));
    for (size_t i = 0; i < prompts.size(); ++i) {
      generate_speculative(*m.target, d, m.encode_prompt(prompts[i].text, !raw_), opts, spec);
      if (tty) std::fprintf(stderr, "\rprompt %zu/%zu, %zu rounds", i + 1, prompts.size(), rounds.size());
    }
    if (tty) std::fprintf(stderr, "\r%60s\r", "");
    return rounds;
  }

  void print_table(const StsReport& r) const {
    std::printf("STS calibration: %lld rounds, gamma %d, %d ECE bins, precision target %.2f\n",
                static_cast<long long>(r.samples), r.gamma, bins_, r.target);
    std::printf("%4s %7s %8s %8s %8s %8s %8s %8s %8s %9s\n", "pos", "rounds", "accept", "survive",
                "T", "ECE pre", "ECE post", "AUC pre", "AUC post", "threshold");
    for (int k = 0; k < r.gamma; ++k) {
      std::printf("%4d %7lld %8s %8s %8s %8s %8s %8s %8s %9s\n", k + 1, static_cast<long long>(r.reached[k]),
                  fmt(r.acceptance[k]).c_str(), fmt(r.survival_rate[k]).c_str(),
                  fmt(r.temperatures[k]).c_str(), fmt(r.ece_before[k], "%.4f").c_str(),
                  fmt(r.ece_after[k], "%.4f").c_str(), fmt(r.auroc_before[k]).c_str(),
                  fmt(r.auroc_after[k]).c_str(), fmt(r.thresholds[k], "%.4f").c_str());
    }
  }

  CLI::App* app_;
  ModelOptions model_;
  SamplingParams sampling_;
  std::string drafter_, prompts_, plot_, rounds_in_, rounds_out_;
  int64_t n_predict_ = 128;
  int64_t limit_ = 0;
  double target_ = 0.5;
  int bins_ = 15;
  bool raw_ = false, dry_run_ = false;
};

std::unique_ptr<Command> make_calibrate(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<CalibrateCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
