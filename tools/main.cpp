// tools/main.cpp — the `memalg` command-line planner.
//
// Exit status: 0 success (whether a plan fits is in its output), 2 bad input (one line on stderr),
// 1 an unexpected internal error.
#include <exception>
#include <iostream>

#include "cli.hpp"

int main(int argc, char** argv) {
  using namespace memalg::cli;
  CLI::App app{"memalg — GPU memory of every rank of a training step, computed before you run it"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "print help for every sub-command");

  plan_flags flags;
  bool json = false;
  CLI::App* plan = app.add_subcommand("plan", "memory of the most loaded rank for one configuration");
  flags.add_to(*plan);
  plan->add_flag("--json", json, "print one JSON object");

  CLI::App* devices = app.add_subcommand("devices", "list the device catalog");

  try {
    app.parse(argc, argv);
    if (*plan) return run_plan(flags, json);
    if (*devices) {
      for (const memalg::device_desc& d : memalg::device::catalog)
        std::cout << d.name << "\tcapacity " << d.capacity.value << " B (" << memalg::to_string(d.capacity)
                  << ")\treserve " << memalg::to_string(d.reserve) << "\n";
      return 0;
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "memalg: error: " << e.what() << "\n";
    return 2;
  } catch (const usage_error& e) {
    std::cerr << "memalg: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "memalg: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
