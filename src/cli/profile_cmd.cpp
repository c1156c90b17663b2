// `dspark profile`: measures the target's throughput curve SPS(B) (target
// forward steps per second at B verify tokens) for the hardware-aware
// scheduler (dspark-method.md §6) and saves it as JSON, atomically.
#include <cstdio>
#include <iostream>

#include <ATen/Parallel.h>

#include "common.hpp"
#include "dspark/model/target.hpp"
#include "dspark/ops/kernel_level.hpp"
#include "dspark/speculative/sps_profile.hpp"

namespace dspark::cli {

class ProfileCommand : public Command {
 public:
  explicit ProfileCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("profile", "measure SPS(B), target steps per second at B verify tokens");
    model_.add(*app_);
    app_->add_option("--bmax", o_.bmax, "largest B measured")->check(integer_in(1, 1024))->capture_default_str();
    app_->add_option("--context", o_.context, "tokens already in the context")
        ->check(integer_in(int64_t{1}, int64_t{1} << 20))
        ->capture_default_str();
    app_->add_option("--reps", o_.repetitions, "timed calls per B (median)")
        ->check(integer_in(1, 1000))
        ->capture_default_str();
    app_->add_option("--requests", o_.requests,
                     "also measure R sequences sharing B tokens (1 = single sequence only)")
        ->check(integer_in(1, 1024))
        ->capture_default_str();
    app_->add_option("--out", out_, "output file (default: $DSPARK_HOME/profiles/<model id>.json)")->check(path_text());
  }
  CLI::App* app() const { return app_; }

  int run() override {
    model_.apply_threads();
    auto target = load_target(model_.model, model_.compute_mode());
    const std::string path =
        out_.empty() ? default_profile_path(sps_profile_key(target->info()), at::get_num_threads()) : out_;
    check_sps_options(target->info(), o_);
    prepare_output_file(path, "--out");
    std::printf("kernels %s, %d threads\n", ops::kernel_description().c_str(), model_.threads);
    std::printf("%6s %12s %12s\n", "B", "steps/s", "ms/step");
    const SpsProfile p = measure_sps(*target, o_, [](int b, double sps) {
      std::printf("%6d %12.2f %12.3f\n", b, sps, 1e3 / sps);
      std::fflush(stdout);
    });
    if (p.requests > 1) {
      std::printf("\n%d sequences sharing B tokens:\n%6s %12s\n", p.requests, "B", "steps/s");
      for (size_t i = 0; i < p.multi_b.size(); ++i) std::printf("%6d %12.2f\n", p.multi_b[i], p.multi_sps[i]);
    }
    save_sps_profile(path, p);
    std::printf("wrote %s (model %s, %d threads, context %lld)\n", path.c_str(), p.model.c_str(), p.threads,
                static_cast<long long>(p.context));
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  SpsProfileOptions o_;
  std::string out_;
};

std::unique_ptr<Command> make_profile(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<ProfileCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
