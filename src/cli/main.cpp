// `dspark`: command-line front end. Exit status: 0 success, 2 bad input
// (bad option, bad file, bad prompt), 1 internal error.
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <vector>

#include "dspark/error.hpp"
#include "generate_cmd.hpp"

namespace dspark::cli {
std::unique_ptr<Command> make_init_drafter(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_bench(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_regen(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_train(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_serve(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_calibrate(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_profile(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_draft_vocab(CLI::App& app, CLI::App*& sub);
}  // namespace dspark::cli

int main(int argc, char** argv) {
  CLI::App app{"dspark: DSpark speculative decoding engine"};
  app.set_version_flag("--version", std::string("dspark ") + DSPARK_VERSION);
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, std::unique_ptr<dspark::cli::Command>>> commands;
  {
    auto g = std::make_unique<dspark::cli::GenerateCommand>(app);
    commands.emplace_back(g->app(), std::move(g));
    for (auto make : {dspark::cli::make_init_drafter, dspark::cli::make_bench, dspark::cli::make_regen,
                      dspark::cli::make_train, dspark::cli::make_calibrate, dspark::cli::make_profile,
                      dspark::cli::make_draft_vocab,
                      dspark::cli::make_serve}) {
      CLI::App* sub = nullptr;
      auto c = make(app, sub);
      commands.emplace_back(sub, std::move(c));
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  try {
    for (auto& [sub, cmd] : commands)
      if (sub->parsed()) return cmd->run();
  } catch (const dspark::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
