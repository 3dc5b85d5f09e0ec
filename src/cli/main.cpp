// sparse-engine: the command-line entry point. Subcommands live one per file (cli/*_command.cpp).
#include <CLI/CLI.hpp>

#include "base/logging.h"
#include "cli/commands.h"
#include "cli/serve_command.h"

int main(int argc, char** argv) {
  CLI::App app{"SparseEngine: a sparse-first LLM inference engine"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error | off")->capture_default_str();
  int exit_code = 0;
  se::cli::add_serve_command(app, exit_code);
  se::cli::add_generate_command(app, exit_code);
  se::cli::add_inspect_command(app, exit_code);
  se::cli::add_tokenize_command(app, exit_code);
  se::cli::add_bench_command(app, exit_code);
  se::cli::add_methods_command(app, exit_code);
  se::cli::add_eval_command(app, exit_code);
  app.parse_complete_callback([&] { se::set_log_level(log_level); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
