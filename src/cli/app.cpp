// The `dspark` command line, run in-process: see app.hpp.
#include "app.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/ops/kernel_level.hpp"
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
std::unique_ptr<Command> make_export_data(CLI::App& app, CLI::App*& sub);

namespace {

// CLI11's parse error in words that say what was expected: the commands when
// none was given, the kind of value an option takes, how often it may be given.
std::string parse_error_text(const CLI::ParseError& e, const std::vector<CLI::App*>& apps, const std::string& names) {
  const std::string m = e.what();
  if (m == "A subcommand is required")
    return "a command is required (expected one of: " + names + "; `dspark --help` describes them)";
  if (const std::string conv = "Could not convert: "; m.rfind(conv, 0) == 0) {
    const size_t eq = m.find(" = ", conv.size());
    if (eq != std::string::npos) {
      const std::string name = m.substr(conv.size(), eq - conv.size());
      for (const CLI::App* a : apps)
        if (const CLI::Option* o = a->get_option_no_throw(name)) {
          const std::string type = o->get_type_name();
          const char* kind = type.rfind("FLOAT", 0) == 0  ? "a number"
                             : type.rfind("UINT", 0) == 0 ? "a non-negative integer"
                             : type.rfind("INT", 0) == 0  ? "an integer"
                                                          : nullptr;
          if (kind) return name + ": expected " + kind + ", got '" + m.substr(eq + 3) + "'";
        }
    }
  }
  const std::string many = "At Most 1 required but received ";
  if (const size_t at = m.find(many); at != std::string::npos)
    return m.substr(0, at) + "given " + m.substr(at + many.size()) + " times, expected once";
  return m;
}

}  // namespace

int run(int argc, char** argv, bool* invalid_argument) {
  if (invalid_argument) *invalid_argument = false;
  const auto refused = [&] {
    if (invalid_argument) *invalid_argument = true;
    return 2;
  };
  CLI::App app{"dspark: DSpark speculative decoding engine"};
  // The kernel level is fixed for the process (DSPARK_KERNELS may force a
  // lower one): refuse a bad choice before any work.
  try {
    ops::active_kernel_level();
  } catch (const dspark::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  std::string levels;
  for (ops::KernelLevel l : ops::supported_kernel_levels()) levels += (levels.empty() ? "" : " ") + ops::to_string(l);
  app.set_version_flag("--version", std::string("dspark ") + DSPARK_VERSION + " (kernels " +
                                        ops::kernel_description() + "; this CPU runs: " + levels + ")");
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, std::unique_ptr<Command>>> commands;
  {
    auto g = std::make_unique<GenerateCommand>(app);
    commands.emplace_back(g->app(), std::move(g));
    for (auto make : {make_init_drafter, make_bench, make_regen, make_train, make_calibrate, make_profile,
                      make_draft_vocab, make_perplexity, make_export, make_import, make_export_data, make_serve}) {
      CLI::App* sub = nullptr;
      auto c = make(app, sub);
      commands.emplace_back(sub, std::move(c));
    }
  }
  std::string names;
  std::vector<CLI::App*> apps{&app};
  for (const auto& [sub, cmd] : commands) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    apps.push_back(sub);
  }
  // A first word that is neither an option nor a command: name it.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const auto& [sub, cmd] : commands) known = known || sub->get_name() == argv[1];
    if (!known) {
      std::cerr << "error: unknown command '" << argv[1] << "' (expected one of: " << names << ")\n";
      return refused();
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
    std::cerr << "error: " << parse_error_text(e, apps, names) << "\n";
    return refused();
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
  } catch (const dspark::InvalidArgument& e) {
    std::cerr << "error: " << e.what() << "\n";
    return refused();
  } catch (const dspark::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace dspark::cli
