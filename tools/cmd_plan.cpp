// SPDX-License-Identifier: BSL-1.0
// tools/cmd_plan.cpp — `memalg plan`: the memory of the most loaded rank for one configuration.
#include <iostream>

#include "cli.hpp"

namespace memalg::cli {

int run_plan(const plan_flags& f, bool json) {
  const plan_inputs in = make_inputs(f);
  const plan_result r = evaluate(in.model, in.training, in.mesh, in.device);
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
