// `dspark import`: reads a drafter in another project's format (llama.cpp's
// dflash GGUF, DeepSpec's Hugging Face layout) into a dspark checkpoint.
#include <filesystem>
#include <iostream>

#include "common.hpp"
#include "dspark/error.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/speculative/interop.hpp"

namespace dspark::cli {

class ImportCommand : public Command {
 public:
  explicit ImportCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("import",
                                 "read a drafter from a llama.cpp GGUF or DeepSpec's Hugging Face layout into a "
                                 "dspark drafter directory");
    model_.add(*app_);
    app_->add_option("--from", from_, "GGUF file or Hugging Face directory")->required();
    app_->add_option("--format", format_, "auto (by content), gguf or hf")
        ->check(CLI::IsMember({"auto", "gguf", "hf"}))
        ->capture_default_str();
    app_->add_option("-o,--out", out_, "output drafter directory")->check(path_text())->required();
    app_->add_flag("--force", force_, "replace a drafter already in --out");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    refuse_existing_drafter(out_, force_);
    const DrafterFormat format = format_ == "auto" ? detect_drafter_format(from_) : parse_drafter_format(format_);
    auto target = load_target(model_.model, model_.compute_mode());
    InteropNotes notes;
    const Drafter drafter = import_drafter(from_, target->info(), format, &notes);
    for (const std::string& note : notes) std::cerr << "note: " << note << "\n";
    // bf16 when that stores every value exactly (as the formats ship), else fp32.
    const bool bf16 = bf16_exact(drafter);
    save_drafter(drafter, out_, bf16, {{"imported_from", {{"format", to_string(format)}, {"path", from_}}}});
    const auto& c = drafter.config();
    std::cerr << "wrote " << out_ << " (" << to_string(c.seq_head) << " head, " << c.n_layers
              << (c.n_layers == 1 ? " layer" : " layers") << ", gamma " << c.gamma << ", "
              << (bf16 ? "bf16" : "f32") << ", target " << c.target_id << ")\n";
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  std::string from_, format_ = "auto", out_;
  bool force_ = false;
};

std::unique_ptr<Command> make_import(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<ImportCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
