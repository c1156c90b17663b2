// `dspark draft-vocab`: chooses a drafter's draft vocabulary from its
// training data and stores it in the drafter's dspark.json
// (`config.draft_vocab`), replacing only that file, atomically.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common.hpp"
#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/train/draft_vocab.hpp"

namespace dspark::cli {

class DraftVocabCommand : public Command {
 public:
  explicit DraftVocabCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("draft-vocab",
                                 "restrict a drafter's proposals to the most frequent tokens of its "
                                 "training data (fewer LM-head rows per drafting pass)");
    model_.add(*app_);
    app_->add_option("--data", data_, "data set directory (dspark regen --out); repeat to count over several")
        ->required();
    app_->add_option("--drafter", drafter_, "drafter directory to update")->required();
    app_->add_option("-n,--size", size_, "draft vocabulary size in tokens (0: remove it, use the whole vocabulary)")
        ->check(non_negative_integer())
        ->capture_default_str();
    app_->add_flag("--dry-run", dry_run_, "report only; do not modify dspark.json");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    namespace fs = std::filesystem;
    LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());
    const std::string path = (fs::path(drafter_) / "dspark.json").string();
    nlohmann::json j = read_drafter_json(drafter_);
    DrafterConfig cfg = config_from_json(j, path);
    check_drafter_matches(cfg, m.target->info());
    const int64_t V = m.target->info().vocab;
    train::check_draft_vocab_size(size_, V, "--size", "draft on the whole vocabulary");
    if (size_ == 0) {
      j["config"].erase("draft_vocab");
      std::printf("draft vocabulary: the whole vocabulary (%lld tokens)\n", static_cast<long long>(V));
    } else {
      const train::TrainDataset data = train::TrainDataset::load(data_);
      const std::string label = train::data_label(data_);
      if (data.target_id != m.target->info().id)
        throw Error(label + ": data set was made for target '" + data.target_id + "', the model is '" +
                    m.target->info().id + "'");
      const train::DraftVocab dv = train::select_draft_vocab(data, size_, V, m.stop_ids);
      std::printf("draft vocabulary: %zu of %lld tokens; covers %.2f%% of %lld supervised tokens "
                  "(%lld distinct) in %s\n",
                  dv.ids.size(), static_cast<long long>(V), 100.0 * dv.coverage(),
                  static_cast<long long>(dv.supervised), static_cast<long long>(dv.distinct), label.c_str());
      j["config"]["draft_vocab"] = dv.ids;
    }
    config_from_json(j, path);  // the result must load
    if (!dry_run_) {
      io::write_json_atomic(path, j);
      std::printf("wrote config.draft_vocab to %s\n", path.c_str());
    }
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  std::vector<std::string> data_;
  std::string drafter_;
  int64_t size_ = 8192;
  bool dry_run_ = false;
};

std::unique_ptr<Command> make_draft_vocab(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<DraftVocabCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
