// SPDX-License-Identifier: BSL-1.0
// tools/main.cpp — the `memalg` command-line planner.
//
// Exit status: 0 success (whether a plan fits is in its output), 2 bad input (one line on stderr),
// 1 an unexpected internal error.
#include <exception>
#include <iostream>
#include <string>

#include <memalg/version.hpp>

#include <CLI/CLI.hpp>

#include "cli.hpp"
#include "planner.hpp"

int main(int argc, char** argv) {
  using namespace memalg::cli;
  CLI::App app{"memalg — GPU memory of every rank of a training step, computed before you run it"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "print help for every sub-command");
  app.set_version_flag("--version", "memalg " MEMALG_VERSION_STRING, "print the version and exit");

  plan_flags flags;
  bool json = false;
  CLI::App* plan = app.add_subcommand("plan", "memory of the most loaded rank for one configuration");
  flags.add_to(*plan);
  plan->add_flag("--json", json, "print one JSON object");
  plan->add_option("--stage", flags.stage, "report pipeline stage N (0 first) instead of the most loaded one");
  std::string plan_svg;
  plan->add_option("--svg", plan_svg, "also write a stacked-bar chart of the rank's memory to FILE");
  std::string plan_timeline;
  plan->add_option("--timeline", plan_timeline,
                   "also write the rank's memory through one step (by category, the peak marked) to FILE as SVG");

  plan_flags fit_model;
  fit_flags fit;
  CLI::App* fit_cmd = app.add_subcommand(
      "fit", "the largest micro-batch (or with --seq max the longest sequence) that fits one configuration");
  fit_model.add_to(*fit_cmd);
  fit_cmd->get_option("--micro-batch")
      ->description("micro-batch sizes to search, LOW..HIGH (default 1..1048576), or one size with --seq max");
  fit_cmd->get_option("--seq")->description("tokens per sequence (required); max, or LOW..HIGH, searches the sequence length");
  fit_cmd->add_option("--global-batch", fit.global_batch,
                      "sequences per optimizer step over the data-parallel ranks: only micro-batches dividing it, "
                      "with the gradient accumulation that reaches it");
  fit_cmd->add_flag("--json", fit.json, "print one JSON object");

  plan_flags sweep_model;
  sweep_flags sweep;
  CLI::App* sweep_cmd = app.add_subcommand("sweep", "search parallel strategies for a world size: what fits, best first");
  add_sweep_flags(*sweep_cmd, sweep_model, sweep);

  plan_flags emit_model;
  emit_flags emit;
  CLI::App* emit_cmd = app.add_subcommand("emit", "print a C++ header whose static_assert checks the plan at compile time");
  emit_model.add_to(*emit_cmd);
  emit_cmd->add_option("--namespace", emit.name_space, "namespace of the emitted types (default memalg_plan)");
  emit_cmd->add_option("-o,--output", emit.output, "write the header to FILE instead of standard output");

  std::string import_path;
  bool import_json = false;
  CLI::App* import_cmd = app.add_subcommand("import", "read a Hugging Face config.json: architecture and exact parameters");
  import_cmd->add_option("config", import_path, "path of config.json")->required();
  import_cmd->add_flag("--json", import_json, "print one JSON object");

  serve_flags serve;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve", "memory of generating text: weights, the key/value cache, the prefill and decode peaks, the largest batch");
  serve.add_to(*serve_cmd);

  CLI::App* devices = app.add_subcommand("devices", "list the device catalog");

  try {
    bool known = argc < 2 || argv[1][0] == '-';
    for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->get_name() == argv[1];
    if (!known)
      throw usage_error("'" + std::string(argv[1]) +
                        "' is not a sub-command: plan, fit, sweep, emit, serve, import or devices (see memalg --help)");
    app.parse(argc, argv);
    if (*plan) {
      if (plan->count("--svg") != 0) write_plan_svg(flags, plan_svg);  // before any output: an error leaves none
      if (plan->count("--timeline") != 0) write_plan_timeline(flags, plan_timeline);
      return run_plan(flags, json);
    }
    if (*fit_cmd) {
      fit.micro_batch_given = fit_cmd->count("--micro-batch") != 0;
      return run_fit(fit_model, fit);
    }
    if (*sweep_cmd) {
      if (sweep_cmd->count("--svg") != 0 && sweep.svg.empty()) throw usage_error("--svg needs a file name, not an empty one");
      return run_sweep(sweep_model, sweep);
    }
    if (*emit_cmd) {
      emit.output_given = emit_cmd->count("--output") != 0;
      std::string command = "memalg";
      for (int i = 1; i < argc; ++i) (command += ' ') += argv[i];
      return run_emit(emit_model, emit, command);
    }
    if (*import_cmd) return run_import(import_path, import_json);
    if (*serve_cmd) {
      if (serve_cmd->count("--svg") != 0 && serve.svg.empty()) throw usage_error("--svg needs a file name, not an empty one");
      if (serve_cmd->count("--emit") != 0 && serve.emit.empty()) throw usage_error("--emit needs a file name, not an empty one");
      std::string command = "memalg";
      for (int i = 1; i < argc; ++i) (command += ' ') += argv[i];
      return run_serve(serve, command);
    }
    if (*devices) {
      for (const memalg::device_desc& d : memalg::device::catalog)
        std::cout << d.name << "\tcapacity " << d.capacity.value << " B (" << memalg::to_string(d.capacity)
                  << ")\treserve " << memalg::to_string(d.reserve) << "\t" << (d.bf16 ? "bf16" : "no bf16") << ", "
                  << (d.fp8 ? "fp8" : "no fp8") << "\n";
      std::cout << "(any other: --device-memory 24GiB, reserve "
                << memalg::to_string(memalg::device::capacity_only_reserve) << " unless --reserve-mib)\n";
      return 0;
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string command;
    for (const CLI::App* sub : app.get_subcommands({}))
      if (sub->parsed() != 0) command = sub->get_name();
    std::cerr << "memalg: error: " << parse_error_sentence(e, command) << "\n";
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
