#pragma once

#include "common.hpp"
#include "drafter_options.hpp"

namespace dspark::cli {

class GenerateCommand : public Command {
 public:
  explicit GenerateCommand(CLI::App& parent);
  CLI::App* app() const { return app_; }
  int run() override;

 private:
  std::string prompt_text() const;

  CLI::App* app_;
  ModelOptions model_;
  DrafterOptions drafter_;
  SamplingParams sampling_;
  RuleOption rule_;
  std::string prompt_;
  std::string prompt_file_;
  int64_t n_predict_ = 256;
  bool chat_ = false;
  bool json_ = false;
};

}  // namespace dspark::cli
