// SPDX-License-Identifier: BSL-1.0
// memalg/memalg.hpp — everything host-side: the memory algebra, plans and their diagnostics.
// CUDA headers (backend/cuda/*.cuh) are included separately, by CUDA translation units only, and
// so is the Boost.Hana type-level search (plan/search_hana.hpp), which is host only.
#pragma once

#include "memalg/config.hpp"
#include "memalg/core/bytes.hpp"
#include "memalg/core/dtype.hpp"
#include "memalg/device/device.hpp"
#include "memalg/model/compose.hpp"
#include "memalg/model/families.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/model/layers.hpp"
#include "memalg/model/parameters.hpp"
#include "memalg/model/presets.hpp"
#include "memalg/model/transformer.hpp"
#include "memalg/parallel/mesh.hpp"
#include "memalg/plan/activations.hpp"
#include "memalg/plan/envelope.hpp"
#include "memalg/plan/breakdown.hpp"
#include "memalg/plan/comm.hpp"
#include "memalg/plan/diagnostics.hpp"
#include "memalg/plan/evaluate.hpp"
#include "memalg/plan/events.hpp"
#include "memalg/plan/issues.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/plan/plan.hpp"
#include "memalg/plan/report.hpp"
#include "memalg/plan/search.hpp"
#include "memalg/plan/timeline.hpp"
#include "memalg/train/optimizer.hpp"
#include "memalg/train/precision.hpp"
#include "memalg/train/recipe.hpp"
