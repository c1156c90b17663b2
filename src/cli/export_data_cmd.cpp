// `dspark export-data`: a `dspark regen` data set as conversations for
// another trainer (DeepSpec on GPUs); see dspark/train/export_data.hpp.
#include <cstdio>
#include <filesystem>

#include "common.hpp"
#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/export_data.hpp"
#include "dspark/train/regen.hpp"

namespace dspark::cli {

class ExportDataCommand : public Command {
 public:
  explicit ExportDataCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("export-data",
                                 "write a regen data set as conversations (JSONL) for DeepSpec's trainer");
    model_.add(*app_);
    app_->add_option("--data", data_, "data set directory (dspark regen --out)")->required();
    app_->add_option("--prompts", prompts_,
                     "the prompts file the data was generated from (default: the manifest's prompts_file)");
    app_->add_option("--format", format_, "deepspec (role/content turns) or sharegpt (from/value turns)")
        ->check(CLI::IsMember({"deepspec", "sharegpt"}))
        ->capture_default_str();
    app_->add_option("-o,--out", out_, "output JSONL file")->check(path_text())->required();
    app_->add_flag("--drop-unfinished", opts_.drop_unfinished,
                   "leave out responses cut by the length limit (no end-of-turn token)");
    app_->add_flag("--force", force_, "replace an existing --out");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    if (!force_ && std::filesystem::exists(out_)) throw Error(out_ + ": already exists; pass --force to replace it");
    prepare_output_file(out_, "--out");
    opts_.format = train::parse_conversation_format(format_);
    const train::TrainDataset data = train::TrainDataset::load(data_);
    std::string prompts = prompts_;
    if (prompts.empty()) {
      prompts = data.manifest.value("prompts_file", "");
      if (prompts.empty()) throw InvalidArgument(data_ + ": the manifest names no prompts_file; pass --prompts");
      if (!std::filesystem::exists(prompts))
        throw InvalidArgument(prompts + " (the prompts_file that " + data_ +
                              "/manifest.json names) does not exist here; pass the file as --prompts");
    }
    LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());
    const train::ConversationExportStats s =
        train::export_conversations(data, train::read_prompts_jsonl(prompts), m, out_, opts_);
    std::printf("%s: %lld conversations (%s) from %s; %lld responses unfinished (cut by the length limit)%s; "
                "%lld of %lld re-tokenize to exactly the stored ids\n",
                out_.c_str(), static_cast<long long>(s.written), format_.c_str(), data_.c_str(),
                static_cast<long long>(s.unfinished), s.dropped ? ", left out" : ", kept",
                static_cast<long long>(s.reencoded_exactly), static_cast<long long>(s.written));
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  std::string data_, prompts_, format_ = "deepspec", out_;
  train::ConversationExportOptions opts_;
  bool force_ = false;
};

std::unique_ptr<Command> make_export_data(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<ExportDataCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
