// `dspark export`: writes a drafter in another project's format (llama.cpp's
// dflash GGUF, DeepSpec's Hugging Face layout); see dspark/speculative/interop.hpp.
#include <filesystem>
#include <iostream>

#include "common.hpp"
#include "drafter_options.hpp"
#include "dspark/error.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/speculative/interop.hpp"

namespace dspark::cli {

class ExportCommand : public Command {
 public:
  explicit ExportCommand(CLI::App& parent) {
    app_ = parent.add_subcommand("export",
                                 "write a drafter as a llama.cpp GGUF (--spec-type draft-dspark) or in DeepSpec's "
                                 "Hugging Face layout (vLLM, SGLang)");
    model_.add(*app_);
    app_->add_option("--drafter", drafter_, "drafter directory, or 'auto' (the drafter shipped for the model)")
        ->capture_default_str();
    app_->add_option("--format", format_, "gguf (one .gguf file) or hf (a directory)")
        ->check(CLI::IsMember({"gguf", "hf"}))
        ->required();
    app_->add_option("-o,--out", out_, "output file (gguf) or directory (hf)")->check(path_text())->required();
    app_->add_option("--mask-row", opts_.mask_row,
                     "token row that holds a learned mask embedding (default: the target's mask token, else its "
                     "highest-id control token not used as a special token or in the chat template)")
        ->check(non_negative_integer());
    app_->add_flag("--force", force_, "replace an existing --out");
  }
  CLI::App* app() const { return app_; }

  int run() override {
    namespace fs = std::filesystem;
    const DrafterFormat format = parse_drafter_format(format_);
    if (!force_ && fs::exists(out_)) throw Error(out_ + ": already exists; pass --force to replace it");
    if (format == DrafterFormat::GGUF) prepare_output_file(out_, "--out");
    std::string dir = drafter_;
    if (dir == "auto") {
      dir = shipped_drafter_dir(model_.model);
      if (dir.empty()) throw Error("--drafter auto: no drafter is shipped for model '" + model_.model + "'");
    }
    const Drafter drafter = load_drafter(dir);
    auto target = load_target(model_.model, model_.compute_mode());
    for (const std::string& note : export_drafter(drafter, target->info(), format, out_, opts_))
      std::cerr << "note: " << note << "\n";
    std::cerr << "wrote " << out_ << " (" << format_ << ", from " << dir << ")\n";
    return 0;
  }

 private:
  CLI::App* app_;
  ModelOptions model_;
  std::string drafter_ = "auto", format_, out_;
  ExportOptions opts_;
  bool force_ = false;
};

std::unique_ptr<Command> make_export(CLI::App& app, CLI::App*& sub) {
  auto c = std::make_unique<ExportCommand>(app);
  sub = c->app();
  return c;
}

}  // namespace dspark::cli
