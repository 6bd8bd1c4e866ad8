// SPDX-License-Identifier: BSL-1.0
// tools/cmd_plan.cpp — `memalg plan`: the memory of the most loaded rank for one configuration.
#include <iostream>
#include <string>

#include "cli.hpp"

namespace memalg::cli {

int run_plan(const plan_flags& f, bool json) {
  const plan_inputs in = make_inputs(f);
  plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
  if (!f.stage.empty()) {
    if (f.stage.empty() || f.stage.size() > 9 || f.stage.find_first_not_of("0123456789") != std::string::npos)
      throw usage_error("--stage must be a pipeline stage number (0 is the first), not '" + f.stage + "'");
    const std::uint64_t stage = std::stoull(f.stage);
    if (stage >= in.mesh.pp)
      throw usage_error("--stage " + f.stage + " is not a pipeline stage (there are " + std::to_string(in.mesh.pp) + ")");
    r = evaluate_stage(in.model, in.training, in.mesh, in.device, stage);
  }
  if (json) {
    std::cout << plan_json(in, r).dump(2) << "\n";
  } else {
    std::cout << "model: " << r.parameters << " parameters, precision " << in.training.precision.name
              << ", optimizer " << in.training.optimizer.name << ", stack " << stack_name(in.training.stack) << "\n"
              << "mesh: dp=" << in.mesh.dp << " (ZeRO-" << in.mesh.zero_stage << ") tp=" << in.mesh.tp
              << " pp=" << in.mesh.pp << " ep=" << in.mesh.ep << " world=" << in.mesh.world << "\n\n"
              << breakdown_table(r, in.device) << "\n"
              << phase_table(r);
    if (has_layer_structure(in.model))
      std::cout << "\n" << memalg::layer_table(in.model, in.training, in.mesh, r, in.device);
  }
  return 0;  // a plan was computed; whether it fits is in the output ("fits")
}

}  // namespace memalg::cli
