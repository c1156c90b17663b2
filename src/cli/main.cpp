// `dspark`: command-line front end. Exit status: 0 success, 2 bad input
// (bad option, bad file, bad prompt), 1 internal error.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
std::unique_ptr<Command> make_perplexity(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_export(CLI::App& app, CLI::App*& sub);
std::unique_ptr<Command> make_import(CLI::App& app, CLI::App*& sub);
}  // namespace dspark::cli

namespace {

// The OpenMP runtime under ATen reads its wait settings once, when it is
// loaded, before main runs. By default an idle worker spins for about 300,000
// iterations before it sleeps: on an idle machine that is what makes the
// forward's many short parallel regions cheap, but when other processes
// compete for the cores the spinning workers take the time the working ones
// need (plain decode on 2 busy cores: 12.5 tok/s spinning, 35 tok/s with
// GOMP_SPINCOUNT=1000 or OMP_WAIT_POLICY=PASSIVE; on an idle machine 121,
// 115-120 and 75-80 tok/s). A spin count of 1000 keeps both. When the user
// has chosen neither setting, set it and restart this process image so the
// runtime sees it.
void ensure_short_openmp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // execv returned: keep going with the default settings.
}

}  // namespace

int main(int argc, char** argv) {
  ensure_short_openmp_spin(argv);
  CLI::App app{"dspark: DSpark speculative decoding engine"};
  app.set_version_flag("--version", std::string("dspark ") + DSPARK_VERSION);
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, std::unique_ptr<dspark::cli::Command>>> commands;
  {
    auto g = std::make_unique<dspark::cli::GenerateCommand>(app);
    commands.emplace_back(g->app(), std::move(g));
    for (auto make : {dspark::cli::make_init_drafter, dspark::cli::make_bench, dspark::cli::make_regen,
                      dspark::cli::make_train, dspark::cli::make_calibrate, dspark::cli::make_profile,
                      dspark::cli::make_draft_vocab, dspark::cli::make_perplexity, dspark::cli::make_export,
                      dspark::cli::make_import,
                      dspark::cli::make_serve}) {
      CLI::App* sub = nullptr;
      auto c = make(app, sub);
      commands.emplace_back(sub, std::move(c));
    }
  }
  // A first word that is neither an option nor a command: name it.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto& [sub, cmd] : commands) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "error: unknown command '" << argv[1] << "' (expected one of: " << names << ")\n";
      return 2;
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
    for (auto& [sub, cmd] : commands) {
      if (!sub->parsed()) continue;
      const int rc = cmd->run();
      // Output that could not be written (a full disk, a closed pipe) is an error, not a success.
      std::cout.flush();
      if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout)
        throw dspark::Error(std::string("cannot write the output: ") +
                            (errno != 0 ? std::strerror(errno) : "write error"));
      return rc;
    }
  } catch (const dspark::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
