// SPDX-License-Identifier: BSL-1.0
// memalg/exec/hparams.hpp — the optimizer's hyper-parameter defaults and the clipping epsilon,
// written once for every runtime configuration (gpt_config, speech_config), both training
// binaries' flags and both backends' kernels. Host- and device-safe: no dependency.
#pragma once

namespace memalg::exec {

/// The optimizer's hyper-parameters a run chooses: the training binaries' flags
/// (examples/train_common.hpp, docs/runtime.md), with these defaults. None changes a byte of
/// memory, so none is part of a plan: a plan fixes the optimizer's kind and states, not its step.
///   lr 3e-3           the step of the Adam family on the small models the binaries train
///   weight_decay 0    no decay unless asked (AdamW's decay is decoupled, Loshchilov & Hutter 2019)
///   beta1 0.9         Kingma & Ba 2015
///   beta2 0.95        GPT-3's (Brown et al. 2020, appendix B), as Megatron-LM and nanoGPT train
///   eps 1e-8          Kingma & Ba 2015
///   momentum 0.9      heavy-ball SGD's usual value (PyTorch torch.optim.SGD has no default)
///   max_grad_norm 1   GPT-3's global-norm clipping at 1.0
struct optimizer_hparams {
  float lr = 3e-3f;            ///< learning rate (≥ 0; 0 leaves the weights as they are)
  float weight_decay = 0.0f;   ///< decoupled (AdamW) or L2 (SGD, momentum, Adam) decay (≥ 0)
  float beta1 = 0.9f;          ///< Adam's first-moment decay, in [0, 1)
  float beta2 = 0.95f;         ///< Adam's second-moment decay, in [0, 1)
  float eps = 1e-8f;           ///< Adam's denominator term (> 0)
  float momentum = 0.9f;       ///< heavy-ball momentum, in [0, 1)
  float max_grad_norm = 1.0f;  ///< clip the global gradient norm to this (≥ 0; 0: no clipping)
};

/// The defaults, as one value.
inline constexpr optimizer_hparams default_hparams{};

/// The clipping coefficient's epsilon: coef = min(1, max_norm / (norm + clip_epsilon)), as
/// PyTorch's torch.nn.utils.clip_grad_norm_ (1e-6); both backends' clip_coefficient use it.
inline constexpr float clip_epsilon = 1e-6f;

}  // namespace memalg::exec
