// SPDX-License-Identifier: BSL-1.0
// memalg/plan/serve.hpp — the serving plan: the memory of generating text with a trained model.
//
//   using s = memalg::serving_plan<presets::llama3_8b, serving::request<serving::batch<32>,
//                                  serving::prompt<2048>, serving::new_tokens<512>>, device::h100_80gb>;
//   static_assert(s::fits);
//   memalg::require_fits<s>();   // fails the build with need, limit and the breakdown
//
// A serving step holds the weights in their stored format, the key/value cache, and the
// transients of one forward pass: the prefill over the whole prompt (nothing is saved for a
// backward pass) and then one decode step per new token over the cache. The peak is the larger of
// the prefill's and the longest decode step's. The terms, each with its source, are in
// docs/serving.md; `serve_stack::pytorch` follows Hugging Face's `generate` (transformers 5.17),
// `serve_stack::paged` vLLM's block manager (v1 engine, planned from its source), and
// `serve_stack::megatron` Megatron-core's dynamic inference context, `serve_stack::memalg` the
// runtime's generation program (one arena: the weights, the whole cache, one forward's stacks).
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>

#include "memalg/core/bytes.hpp"
#include "memalg/core/dtype.hpp"
#include "memalg/device/device.hpp"
#include "memalg/model/layer.hpp"
#include "memalg/plan/diagnostics.hpp"
#include "memalg/plan/model_states.hpp"
#include "memalg/train/recipe.hpp"

namespace memalg {

/// How the key/value cache is allocated.
enum class kv_cache_kind : std::uint8_t {
  /// Hugging Face's DynamicCache (cache_utils.py, DynamicLayer.update): each layer's keys and values
  /// grow by concatenation, so for a moment a layer's old and new copy coexist; sliding-window
  /// layers keep a view of their last window − 1 tokens on the whole concatenation's storage
  /// (DynamicSlidingWindowLayer).
  dynamic,
  /// Hugging Face's StaticCache: every layer's keys and values for max_cache_len tokens, allocated
  /// at the layer's first update in the prefill (StaticLayer.lazy_initialization) and written in
  /// place after (index_copy_); sliding-window layers hold min(window, max_cache_len)
  /// (StaticSlidingWindowLayer).
  fixed,
  /// vLLM's paged cache: blocks of `block_size` tokens for every layer, as many as fit in the
  /// memory the engine leaves after the weights and its profiling run (gpu_memory_utilization).
  paged,
};

/// Which serving engine the plan follows: Hugging Face's generate, vLLM's paged cache,
/// Megatron-core's dynamic inference engine, or memalg's own runtime (its generation program,
/// exec/gpt/build_generation.hpp, laid out in exactly the planned arena).
enum class serve_stack : std::uint8_t { pytorch, paged, megatron, memalg };

/// The attention kernel of a Hugging Face model (`attn_implementation`).
enum class serve_attention : std::uint8_t { sdpa, eager };

/// Which parameters a quantized checkpoint stores in `serving_desc::weights`.
enum class quant_scope : std::uint8_t {
  /// every linear layer of the blocks (GPTQ, AWQ, bitsandbytes, fp8 checkpoints: the embedding and
  /// the output layer stay in the compute dtype; transformers' `modules_to_not_convert` default)
  linear,
  /// the routed experts only (gpt-oss's released MXFP4 checkpoints: quantization_config
  /// `modules_to_not_convert` lists attention, router, embedding and output)
  experts,
};

/// A serving request and its engine, literal (as training_desc is for a training step).
struct serving_desc {
  std::uint64_t batch = 1;       ///< sequences generated together
  std::uint64_t prompt = 0;      ///< prompt tokens per sequence
  std::uint64_t new_tokens = 0;  ///< generated tokens per sequence
  dtype compute = dtypes::bf16;  ///< the activations' and, unless quantized, the weights' dtype
  dtype weights = dtypes::none;  ///< the quantized matrices' storage (none: compute)
  quant_scope scope = quant_scope::linear;
  dtype kv = dtypes::none;       ///< the cache's dtype (none: compute)
  kv_cache_kind cache = kv_cache_kind::dynamic;
  std::uint64_t max_cache_len = 0;  ///< static cache: tokens per sequence (0: prompt + new_tokens − 1, generate's)
  std::uint64_t prefill_chunk = 0;  ///< chunked prefill: prompt tokens per forward (0: the whole prompt)
  serve_stack stack = serve_stack::pytorch;
  serve_attention attention = serve_attention::sdpa;
  std::uint64_t block_size = 16;             ///< paged: tokens per block (vLLM 0.10's default on CUDA; 0.34: 64)
  std::uint64_t utilization_permille = 900;  ///< paged: gpu_memory_utilization × 1000 (vLLM 0.10's default 0.9)
  std::uint64_t max_num_batched_tokens = 8192;  ///< paged: tokens of the profiling run's forward
  std::uint64_t max_num_seqs = 256;             ///< paged: sequences the sampler's profile takes
  /// megatron: the dynamic inference context's key/value pool (--inference-dynamic-batching-buffer-size-gb)
  std::uint64_t kv_buffer_bytes = 0;
  std::uint64_t tp = 1;  ///< tensor-parallel ranks (heads and matrices split; the cache by key/value heads)
  std::uint64_t pp = 1;  ///< pipeline stages (blocks split; the most loaded stage is planned)
};

enum class serve_phase : std::uint8_t { prefill, decode };

constexpr std::string_view serve_phase_name(serve_phase p) { return p == serve_phase::prefill ? "prefill" : "decode"; }

/// The bytes live at a moment of a serving step.
struct serve_breakdown {
  bytes weights{};      ///< parameters in their stored format (and the quantization scales)
  bytes kv_cache{};     ///< keys and values (or latents) in the cache
  bytes activations{};  ///< the forward's transients: hidden states, projections, attention, MLP
  bytes logits{};       ///< the output layer's logits and the loop's fp32 copy of them
  bytes generation{};   ///< the loop's own tensors: token ids, attention masks, positions
  bytes reserve{};      ///< the device's runtime reserve (CUDA context)
  constexpr bytes total() const { return weights + kv_cache + activations + logits + generation + reserve; }
};

struct serve_result {
  serve_breakdown at_peak{};
  serve_phase peak_phase = serve_phase::prefill;
  std::uint64_t peak_length = 0;  ///< tokens in the cache per sequence at the peak
  bytes prefill_peak{};           ///< tensors only (no reserve)
  bytes decode_peak{};            ///< tensors only; zero without new tokens
  bytes cache_bytes{};            ///< the whole cache at the longest length (or its allocation)
  bytes cache_per_token{};        ///< one token of one sequence in every layer of the planned stage
  bytes limit{};
  bool fits = false;
  /// paged: the cache's blocks, bytes per block (all layers), and sequences of
  /// prompt + new_tokens that fit at once (vLLM's "maximum concurrency")
  std::uint64_t blocks = 0;
  bytes block_bytes{};
  std::uint64_t concurrent_sequences = 0;
  std::string_view reason{};  ///< non-empty: the request is invalid (and nothing was planned)
  /// memalg: where the runtime's arena holds the cache (layer l's at cache_offset +
  /// l·cache_layer_bytes, after the weights) and the stacks' peak above the weights and the cache
  bytes cache_offset{};
  bytes cache_layer_bytes{};
  bytes stack_peak{};
  constexpr bytes peak() const { return at_peak.total(); }
};

namespace detail {

/// torch.long: token ids, positions, top-k indices.
inline constexpr dtype index_dtype{"int64", 64, dtype_kind::integer};
constexpr std::uint64_t serve_min(std::uint64_t a, std::uint64_t b) { return a < b ? a : b; }
constexpr std::uint64_t serve_max(std::uint64_t a, std::uint64_t b) { return a < b ? b : a; }
constexpr bytes serve_max(bytes a, bytes b) { return a < b ? b : a; }

/// Live bytes over a sequence of allocations and frees: what a forward pass without autograd
/// holds, tensor by tensor, as its Python references die.
struct tape {
  bytes live{};
  bytes peak{};
  bytes cache{};          ///< of `live`, the key/value cache's storage
  bytes cache_at_peak{};  ///< of `peak`, the cache's
  constexpr void alloc(bytes b) {
    live += b;
    if (peak < live) {
      peak = live;
      cache_at_peak = cache;
    }
  }
  constexpr void free(bytes b) { live = live < b ? bytes{} : live - b; }
  constexpr void alloc_cache(bytes b) {
    cache += b;
    alloc(b);
  }
  constexpr void free_cache(bytes b) {
    cache = cache < b ? bytes{} : cache - b;
    free(b);
  }
  /// A tensor made and dropped at once (its maker's output, read by the next operation).
  constexpr void touch(bytes b) {
    alloc(b);
    free(b);
  }
};

/// What a block's forward reads: T query tokens (B sequences × q new tokens) in dtype `e`, split
/// by tp, on the CPU's kernels or an accelerator's.
struct step_shape {
  std::uint64_t batch = 1;
  std::uint64_t queries = 1;  ///< new tokens per sequence in this forward
  dtype e = dtypes::bf16;
  std::uint64_t tp = 1;
  serve_attention attention = serve_attention::sdpa;
  bool cpu = false;  ///< the host's CPU kernels (device_desc::host)
  /// bitsandbytes' 4-bit linear layers dequantize their weight for this forward: its matrices
  /// exist in `e` while each product runs (gemm_4bit's dequantize + F.linear: always on the CPU,
  /// on CUDA above 1536 rows, backends/cuda/ops.py _gemm_4bit_custom_max_m)
  bool dequantize = false;
  constexpr std::uint64_t tokens() const { return checked_mul(batch, queries); }
  constexpr bytes act(std::uint64_t width) const { return storage_bytes(e, checked_mul(tokens(), width)); }
  constexpr bytes fp32(std::uint64_t width) const { return storage_bytes(dtypes::fp32, checked_mul(tokens(), width)); }
  constexpr bool wide() const { return e.bits >= 32; }
};

/// A linear layer's output of `width` on the tape, with the dequantized `in × out` weight beside
/// it while the product runs when the layer is 4-bit (step_shape::dequantize).
constexpr void hf_linear(tape& t, const step_shape& s, std::uint64_t in, std::uint64_t width) {
  const bytes w = s.dequantize ? storage_bytes(s.e, checked_mul(in, width)) : bytes{};
  t.alloc(w);
  t.alloc(s.act(width));
  t.free(w);
}

constexpr std::uint64_t split_heads(std::uint64_t heads, std::uint64_t tp) {
  return heads == 0 ? 0 : (heads >= tp ? ceil_div(heads, tp) : 1);
}
constexpr std::uint64_t head_dim_of(const layer_shape& s) {
  return s.head_dim != 0 ? s.head_dim : (s.heads != 0 ? s.hidden / s.heads : 0);
}
constexpr std::uint64_t kv_heads_of(const layer_shape& s) { return s.kv_heads != 0 ? s.kv_heads : s.heads; }
constexpr bool is_mla(const layer_shape& s) { return s.kv_lora_rank != 0; }

/// RMSNorm over `width` of the step's tokens, its input alive (the caller's); returns with the
/// output allocated. LlamaRMSNorm (modeling_llama.py): `hidden_states.to(torch.float32)` (a copy
/// when narrower), `pow(2).mean(-1)`, the product with rsqrt (fp32), `.to(input_dtype)`, the
/// weight's product. With `weight_fp32`, Gemma3RMSNorm (modeling_gemma3.py): `_norm(x.float())`
/// then `output * (1.0 + self.weight.float())` in fp32, `.type_as(x)`.
constexpr void rms_norm(tape& t, const step_shape& s, std::uint64_t width, bool weight_fp32 = false) {
  const bytes x32 = s.fp32(width), out = s.act(width);
  if (!s.wide()) t.alloc(x32);  // the fp32 copy of the input
  t.touch(x32);                 // its square (the mean is T floats)
  t.alloc(x32);                 // x · rsqrt(variance + ε)
  if (!s.wide()) t.free(x32);   // the copy dies with the rebinding
  if (weight_fp32) {
    t.alloc(x32);               // · (1 + weight.float())
    t.free(x32);
    if (!s.wide()) {
      t.alloc(out);             // .type_as(x)
      t.free(x32);
    }
    return;
  }
  if (!s.wide()) {
    t.alloc(out);               // .to(input_dtype)
    t.free(x32);
    t.alloc(out);               // weight · …
    t.free(out);
  } else {
    t.alloc(out);               // weight · hidden_states
    t.free(x32);
  }
}

/// Lmax of a static cache: generate's `max_length - 1` (the last new token is never fed back,
/// generation/utils.py `max_cache_length`), or the request's max_cache_len when larger.
constexpr std::uint64_t static_length(const serving_desc& d) {
  const std::uint64_t fed = d.prompt + (d.new_tokens > 0 ? d.new_tokens - 1 : 0);
  return serve_max(fed, d.max_cache_len);
}

/// One block's cache in one forward of Hugging Face's cache layers (cache_utils.py), in tokens
/// per sequence of storage.
struct cache_step {
  std::uint64_t key_width = 0, value_width = 0;  ///< elements per token of the key and the value tensor
  std::uint64_t before = 0;  ///< storage before the update
  std::uint64_t after = 0;   ///< storage after it
  std::uint64_t read = 0;    ///< tokens the attention reads
  std::uint64_t returned = 0;  ///< tokens the update returns (a static cache: its whole buffer)
  std::uint64_t roll = 0;    ///< static sliding layer, full: the two rolled copies' tokens
  bool both_first = false;   ///< both concatenations run before the old tensors die (sliding layers)
  bool mask = false;         ///< SDPA: a 4-D mask exists for the layer's type (so grouped keys are repeated)
};

/// `total` tokens per sequence have been fed after the forward, `q` of them by it, `q_prev` by
/// the forward before (P: the prefill).
constexpr cache_step hf_cache_step(const layer_shape& sh, const serving_desc& d, std::uint64_t total, std::uint64_t q,
                                   std::uint64_t q_prev) {
  cache_step c{};
  const std::uint64_t k = split_heads(kv_heads_of(sh), d.tp);
  if (is_mla(sh)) {
    // DeepseekV3Attention.forward: `past_key_values.update(kv_nope, k_rot)`, the normalised
    // latent and the rotated shared key, one "head" each (the heads' keys and values are
    // re-expanded from them by expand_kv in every forward).
    c.key_width = sh.kv_lora_rank;
    c.value_width = sh.rotary_dim;
  } else {
    c.key_width = k * head_dim_of(sh);
    c.value_width = k * head_dim_of(sh);
  }
  const std::uint64_t W = sh.window;
  const std::uint64_t fed_before = total - q;
  if (d.cache == kv_cache_kind::fixed) {
    const std::uint64_t lmax = static_length(d);
    const std::uint64_t size = W != 0 ? serve_min(W, lmax) : lmax;
    c.after = size;
    c.returned = size;
    c.before = fed_before == 0 ? 0 : size;  // StaticLayer.lazy_initialization at the first update
    if (fed_before == 0) {
      // prefill: SDPA reads the new keys only (sdpa_attention.py slices a causal prefill's keys to
      // q); a sliding layer returns the whole prompt once it fills its window
      c.read = W != 0 && q >= W ? q : (W != 0 ? size : q);
      if (W != 0 && q >= W) c.returned = q;  // StaticSlidingWindowLayer returns the whole prompt's keys
      c.mask = W != 0;  // (the sliding layer's window needs a mask, masking_utils.py)
    } else {
      c.read = size;
      c.mask = true;  // compileable caches build their decode masks (B×1×1×Lmax) before the forward
      if (W != 0 && fed_before >= W) c.roll = size;  // StaticSlidingWindowLayer.update: roll(-1) of K and V
    }
    return c;
  }
  // A chunk of a chunked prefill after the first reads more keys than it has queries, at an
  // offset: _ignore_causal_mask_sdpa cannot skip its mask (masking_utils.py).
  const bool chunk_after_first = fed_before > 0 && q > 1;
  if (W == 0) {
    c.before = fed_before;
    c.after = total;
    c.read = total;
    c.returned = total;
    c.mask = chunk_after_first;
    return c;
  }
  // DynamicSlidingWindowLayer.update: the whole concatenation is returned; the layer keeps a
  // view of its last W − 1 tokens (the concatenation's storage); both concatenations are made
  // before the old tensors die.
  const std::uint64_t before_before = fed_before >= q_prev ? fed_before - q_prev : 0;
  c.before = fed_before == 0 ? 0 : serve_min(before_before, W - 1) + q_prev;
  c.after = serve_min(fed_before, W - 1) + q;
  c.read = c.after;
  c.returned = c.after;
  c.both_first = true;
  c.mask = c.read >= W || chunk_after_first;  // _ignore_causal_mask_sdpa: kv_length ≥ local size keeps the mask
  return c;
}

/// The cache's bytes of `tokens` per sequence for one block, keys and values.
constexpr bytes cache_bytes_of(const cache_step& c, std::uint64_t tokens, std::uint64_t batch, dtype kv) {
  return storage_bytes(kv, checked_mul(checked_mul(c.key_width + c.value_width, tokens), batch));
}

/// The cache update of one block on the tape: the new keys' and values' storage, the old freed
/// as each rebinding drops it (DynamicLayer: `self.keys = torch.cat(...)` then the values).
constexpr void hf_cache_update(tape& t, const cache_step& c, std::uint64_t batch, dtype kv) {
  const auto k = [&](std::uint64_t n) { return storage_bytes(kv, checked_mul(checked_mul(c.key_width, n), batch)); };
  const auto v = [&](std::uint64_t n) { return storage_bytes(kv, checked_mul(checked_mul(c.value_width, n), batch)); };
  if (c.roll != 0) {
    t.alloc_cache(k(c.roll) + v(c.roll));  // the rolled copies, copied back in place
    t.free_cache(k(c.roll) + v(c.roll));
    return;
  }
  if (c.before == c.after && c.before != 0 && c.read != 0 && !c.both_first) return;  // static: in place
  if (c.both_first) {
    t.alloc_cache(k(c.after));
    t.alloc_cache(v(c.after));
    t.free_cache(k(c.before) + v(c.before));
    return;
  }
  t.alloc_cache(k(c.after));
  t.free_cache(k(c.before));
  t.alloc_cache(v(c.after));
  t.free_cache(v(c.before));
}

/// Rotary embedding of `heads` heads of `width` rotated dimensions on the tape
/// (apply_rotary_pos_emb: q·cos, rotate_half's negated half and concatenation, its product
/// with sin, the sum), the input alive; returns with the rotated tensor allocated.
constexpr void hf_rotate(tape& t, const step_shape& s, std::uint64_t width) {
  const bytes full = s.act(width);
  t.alloc(full);             // x · cos
  t.alloc(s.act(width / 2)); // −x2
  t.alloc(full);             // cat((−x2, x1))
  t.free(s.act(width / 2));
  t.alloc(full);             // · sin
  t.free(full);
  t.alloc(full);             // the sum
  t.free(full + full);
}

/// The attention core on the tape: the query (`qd` per head), `read` cached tokens per sequence
/// of keys (`kd`) and values (`vd`) for `a` heads, `kh` key/value heads; returns with the
/// attention's output (tokens × a·vd, contiguous) allocated and its transients freed. `probs`
/// receives the eager attention's probabilities, which the block keeps until it returns.
constexpr void hf_core(tape& t, const layer_shape& sh, const step_shape& s, std::uint64_t a, std::uint64_t kh,
                       std::uint64_t kd, std::uint64_t vd, std::uint64_t read, bool mask, bytes& probs) {
  const std::uint64_t rows = checked_mul(checked_mul(s.batch, a), s.queries);
  const bool repeat = kh < a && (mask || s.attention == serve_attention::eager);
  // repeat_kv: the grouped keys and values copied to every head (sdpa_attention.py when a mask
  // is given, eager_attention_forward always)
  const bytes rk = repeat ? storage_bytes(s.e, checked_mul(checked_mul(s.batch, a), read) * kd) : bytes{};
  const bytes rv = repeat ? storage_bytes(s.e, checked_mul(checked_mul(s.batch, a), read) * vd) : bytes{};
  t.alloc(rk + rv);
  const bytes out = s.act(a * vd);
  if (s.attention == serve_attention::eager) {
    const std::uint64_t cols = read + (sh.attention_sinks ? 1 : 0);
    const bytes scores = storage_bytes(s.e, checked_mul(rows, read));
    t.alloc(scores);  // q·kᵀ
    t.alloc(scores);  // · scaling
    t.free(scores);
    t.alloc(scores);  // + the mask
    t.free(scores);
    if (sh.attention_sinks) {
      // gpt-oss: the sinks' column concatenated, the row maximum subtracted (GptOssAttention's eager path)
      t.alloc(storage_bytes(s.e, checked_mul(rows, cols)));
      t.alloc(storage_bytes(s.e, checked_mul(rows, cols)));
      t.free(storage_bytes(s.e, checked_mul(rows, cols)));
    }
    const bytes wide = storage_bytes(dtypes::fp32, checked_mul(rows, cols));
    const bytes narrow = storage_bytes(s.e, checked_mul(rows, cols));
    if (sh.attention_sinks) {
      t.alloc(narrow);  // gpt-oss: softmax in the logits' dtype (combined_logits lives to the return)
      probs = narrow;
    } else {
      // softmax(dtype=float32): a narrower input is first copied to fp32 (aten::softmax's
      // _to_copy), alive beside the softmax's output; then .to(query.dtype)
      if (!s.wide()) t.alloc(wide);
      t.alloc(wide);
      if (!s.wide()) {
        t.free(wide);
        t.alloc(narrow);
        t.free(wide);
      }
      probs = s.wide() ? wide : narrow;
    }
    t.free(scores);
    t.alloc(out);   // probs · v
    t.alloc(out);   // transpose(1, 2).contiguous()
    t.free(out);
    if (sh.attention_sinks) t.free(narrow);  // combined_logits
  } else if (s.cpu && kd != vd) {
    // F.scaled_dot_product_attention on the CPU with keys wider than values (latent attention):
    // no fused kernel takes them, so the math path runs (aten/src/ATen/native/transformers/
    // attention.cpp, _scaled_dot_product_attention_math): bf16 and fp16 inputs copied to fp32,
    // a causal prefill's q×S mask, the scaled query and keys, the scores, _safe_softmax's output
    // and its isneginf mask, the product with the values, cast back.
    const bool up = !s.wide();
    const dtype acc = dtypes::fp32;
    const std::uint64_t heads_rows = checked_mul(s.batch, a);
    const bytes q32 = storage_bytes(acc, checked_mul(rows, kd));
    const bytes k32 = storage_bytes(acc, checked_mul(checked_mul(heads_rows, read), kd));
    const bytes v32 = storage_bytes(acc, checked_mul(checked_mul(heads_rows, read), vd));
    const std::uint64_t cells = checked_mul(rows, read);
    const bytes causal = s.queries > 1 && !mask ? storage_bytes(s.wide() ? s.e : acc, checked_mul(s.queries, read)) : bytes{};
    if (causal > bytes{}) {
      t.alloc(bytes{checked_mul(s.queries, read)});      // ones(q, S).tril()
      t.alloc(bytes{checked_mul(s.queries, read)});
      t.free(bytes{checked_mul(s.queries, read)});
      t.alloc(causal);                                   // where(mask, 0, -inf)
      t.free(bytes{checked_mul(s.queries, read)});
    }
    if (up) t.alloc(q32 + k32 + v32);
    t.alloc(q32);                                        // q · √scale
    t.alloc(k32);                                        // kᵀ · √scale
    t.alloc(storage_bytes(acc, cells));                  // the scores (bmm)
    t.free(k32);
    t.alloc(storage_bytes(acc, cells));                  // softmax
    t.alloc(bytes{cells});                               // isneginf
    t.touch(bytes{rows});                                // all(…, -1)
    t.free(bytes{cells});
    t.alloc(storage_bytes(acc, checked_mul(rows, vd)));  // · v
    t.free(storage_bytes(acc, cells) * 2 + q32 + causal + (up ? q32 + k32 + v32 : bytes{}));
    if (up) {
      t.alloc(out);                                      // cast back
      t.free(storage_bytes(acc, checked_mul(rows, vd)));
    }
    t.alloc(out);                                        // transpose(1, 2).contiguous()
    t.free(up ? out : storage_bytes(acc, checked_mul(rows, vd)));
  } else {
    // F.scaled_dot_product_attention (its output and fp32 log-sum-exp), then the transposed copy
    t.alloc(out);
    t.touch(storage_bytes(dtypes::fp32, rows));
    t.alloc(out);
    t.free(out);
  }
  t.free(rk + rv);
}

/// An MLP of width `f` on the tape, its input alive; returns with its output allocated. LlamaMLP:
/// down(act(gate(x)) · up(x)): gate, its activation (gate dies), up, the product; a GeLU MLP
/// (no gate): up, the activation, down.
constexpr void hf_mlp(tape& t, const step_shape& s, std::uint64_t f, std::uint64_t h, bool gated) {
  if (gated) {
    hf_linear(t, s, h, f);  // gate_proj
    t.alloc(s.act(f));      // its activation
    t.free(s.act(f));
    hf_linear(t, s, h, f);  // up_proj
    t.alloc(s.act(f));      // the product
    t.free(s.act(f) + s.act(f));
  } else {
    hf_linear(t, s, h, f);
    t.alloc(s.act(f));
    t.free(s.act(f));
  }
  hf_linear(t, s, f, h);  // down_proj
  t.free(s.act(f));
}

/// One block's forward without autograd, its input alive (the model's loop holds it); returns
/// with the block's output allocated. LlamaDecoderLayer (modeling_llama.py) and the layers
/// built like it: Qwen3 (QK-norm per head), Gemma 3 (four norms, fp32 weight products), gpt-oss
/// (sinks, experts with biases), DeepSeek-V3 (latent attention, routed and shared experts),
/// Qwen3-MoE.
constexpr void hf_block(tape& t, const layer_desc& l, const step_shape& s, const cache_step& c, dtype kv) {
  const layer_shape& sh = l.shape;
  const std::uint64_t h = sh.hidden;
  const bool sandwich = (sh.flags & layer_flags::norms_sandwich) != 0;
  const bool wfp32 = (sh.flags & layer_flags::rms_weight_fp32) != 0;
  const std::uint64_t a = split_heads(sh.heads, s.tp);
  const std::uint64_t d = head_dim_of(sh);
  const bool rotary = (sh.flags & layer_flags::rotary) != 0;

  rms_norm(t, s, h, wfp32);  // input_layernorm → n1
  bytes probs{};
  std::uint64_t vd = d;
  if (is_mla(sh)) {
    const std::uint64_t dr = sh.rotary_dim, dn = d - dr;
    vd = sh.v_head_dim;
    const bytes q = s.act(a * d);
    if (sh.q_lora_rank != 0) {
      t.alloc(s.act(sh.q_lora_rank));  // q_a_proj
      rms_norm(t, s, sh.q_lora_rank);  // q_a_layernorm
      t.alloc(q);                      // q_b_proj
      t.free(s.act(sh.q_lora_rank) + s.act(sh.q_lora_rank));
    } else {
      t.alloc(q);  // q_proj
    }
    t.alloc(s.act(sh.kv_lora_rank + dr));  // kv_a_proj_with_mqa (kv_nope and k_rot are views)
    rms_norm(t, s, sh.kv_lora_rank);       // kv_a_layernorm(kv_nope)
    // apply_rotary_pos_emb_interleave: the interleaved copies of q_rot and k_rot, then the rotation
    t.alloc(s.act(a * dr));
    hf_rotate(t, s, a * dr);
    t.free(s.act(a * dr));
    t.alloc(s.act(dr));
    hf_rotate(t, s, dr);
    t.free(s.act(dr));
    hf_cache_update(t, c, s.batch, kv);
    t.free(s.act(sh.kv_lora_rank) + s.act(dr));  // the latent and k_rot rebound to the cache's
    t.alloc(q);  // query_states = cat((q_pass, q_rot))
    // expand_kv over every cached token: kv_b_proj's output (k_nope and the values are views of
    // it) and the keys made whole
    const std::uint64_t rows = checked_mul(s.batch, c.returned);  // (a static cache returns its whole buffer)
    t.alloc(storage_bytes(s.e, checked_mul(rows, a * (dn + vd))));
    t.alloc(storage_bytes(s.e, checked_mul(rows, a * d)));
    hf_core(t, sh, s, a, a, d, vd, c.read, false, probs);
    t.alloc(s.act(h));  // o_proj
    t.free(s.act(a * vd) + storage_bytes(s.e, checked_mul(rows, a * (dn + vd))) +
           storage_bytes(s.e, checked_mul(rows, a * d)) + q + q + s.act(a * dr) + s.act(dr) +
           s.act(sh.kv_lora_rank + dr));
  } else {
    const std::uint64_t kh = split_heads(kv_heads_of(sh), s.tp);
    const bytes q = s.act(a * d), k = s.act(kh * d), v = s.act(kh * d);
    hf_linear(t, s, h, a * d);   // q_proj
    hf_linear(t, s, h, kh * d);  // k_proj
    hf_linear(t, s, h, kh * d);  // v_proj
    if ((sh.flags & layer_flags::qk_norm_per_head) != 0) {
      rms_norm(t, s, a * d, wfp32);  // q_norm (the projection dies with the rebinding)
      t.free(q);
      rms_norm(t, s, kh * d, wfp32); // k_norm
      t.free(k);
    }
    if (rotary) {
      hf_rotate(t, s, a * d);
      hf_rotate(t, s, kh * d);
      t.free(q + k);  // the unrotated q and k
    }
    hf_cache_update(t, c, s.batch, kv);
    t.free(k + v);  // key_states and value_states rebound to the cache's
    hf_core(t, sh, s, a, kh, d, d, c.read, c.mask, probs);
    hf_linear(t, s, a * d, h);  // o_proj
    t.free(s.act(a * d) + q);
  }
  t.free(s.act(h));  // n1 (rebound to the attention's output)
  if (sandwich) {
    rms_norm(t, s, h, wfp32);  // post_attention_layernorm
    t.free(s.act(h));
  }
  t.alloc(s.act(h));  // residual + attention
  t.free(s.act(h));   // the attention's output
  rms_norm(t, s, h, wfp32);  // post_attention_layernorm / pre_feedforward_layernorm → n2
  const std::uint64_t T = s.tokens();
  if ((sh.flags & layer_flags::moe) != 0) {
    const std::uint64_t E = sh.experts, K = sh.top_k, f = sh.ffn;
    const bytes ids = storage_bytes(index_dtype, checked_mul(T, K));
    // The router: logits, their fp32 softmax (Qwen3MoeTopKRouter) or sigmoid with group-limited
    // choice (DeepseekV3TopkRouter, from fp32 casts of the input and weight), the top-k weights
    // and indices.
    bytes router_kept{};
    if (sh.router_fp32) {
      // DeepseekV3TopkRouter: fp32 casts of the input and weight, the logits; route_tokens_to_experts:
      // the sigmoid, plus the correction bias, the group scores and mask, the expanded score
      // mask, the masked scores; the chosen ids, their gathered and normalised weights
      t.alloc(s.wide() ? bytes{} : s.fp32(h));
      t.alloc(s.fp32(E));
      t.free(s.wide() ? bytes{} : s.fp32(h));
      t.alloc(s.fp32(E) * 4);
      t.alloc(ids + s.fp32(K));
      t.free(s.fp32(E) * 4);
      router_kept = s.fp32(E) + ids + s.fp32(K);
    } else if (sh.router_topk_softmax) {
      // GptOssTopKRouter: logits (with bias), top-k of them, softmax over the k
      t.alloc(s.act(E));
      t.alloc(s.act(K) + ids);
      t.alloc(s.act(K));
      t.free(s.act(K));
      router_kept = s.act(E) + ids + s.act(K);
    } else {
      // Qwen3MoeTopKRouter: logits, softmax(dtype=float) (a narrower input copied to fp32 first),
      // top-k, the renormalisation, the cast back
      t.alloc(s.act(E));
      if (!s.wide()) t.alloc(s.fp32(E));
      t.alloc(s.fp32(E));
      if (!s.wide()) t.free(s.fp32(E));
      t.alloc(ids + s.fp32(K));
      t.touch(s.fp32(1));
      if (!s.wide()) {
        t.alloc(s.act(K));
        t.free(s.fp32(K));
      }
      t.free(s.fp32(E));
      router_kept = s.act(E) + ids + s.act(K);
    }
    // The experts, as transformers' grouped_mm_experts_forward runs them (integrations/moe.py,
    // the experts implementation on torch ≥ 2.9): the S = T·k token-expert pairs sorted by
    // expert, their states gathered, one grouped product up (plus the gathered biases), the
    // masked copy, the gate, one grouped product down, its masked copy, the weighting, the
    // restored order and the sum over k. Every size is S rows whatever the routing.
    const std::uint64_t S = checked_mul(T, K);
    const auto rows = [&](std::uint64_t w) { return storage_bytes(s.e, checked_mul(S, w)); };
    const bytes sid = storage_bytes(index_dtype, S);
    const bytes weights_g = sh.router_fp32 ? storage_bytes(dtypes::fp32, S) : rows(1);
    const bool bias = sh.clamped_swiglu;  // gpt-oss's experts carry biases
    t.alloc(sid + sid);                   // sort: expert_ids_g, perm
    t.alloc(sid);                         // perm // k
    t.alloc(rows(h));                     // selected_hidden_states_g
    t.free(sid);
    t.alloc(weights_g);                   // sample_weights_g
    if (s.cpu) t.alloc(storage_bytes(dtypes::fp32, S));  // histc's float input
    const bytes offsets = storage_bytes(dtypes::fp32, E) + bytes{4 * E};  // tokens_per_expert (fp32), offsets (int32)
    t.alloc(offsets);
    t.alloc(bytes{S});                    // sentinel_mask
    if (bias) t.alloc(rows(2 * f));       // the up biases gathered
    t.alloc(rows(2 * f));                 // grouped product up
    t.alloc(rows(2 * f));                 // masked_fill
    t.free(rows(2 * f));
    if (sh.clamped_swiglu) {
      // GptOssExperts._apply_gate: the clamped gate and up, gate·α, its sigmoid, their product,
      // up + 1, the product
      t.alloc(rows(f) * 2);
      t.alloc(rows(f));
      t.alloc(rows(f));
      t.free(rows(f));
      t.alloc(rows(f));
      t.free(rows(f));
      t.alloc(rows(f));
      t.alloc(rows(f));
      t.free(rows(f) * 4);
    } else {
      t.alloc(rows(f));                   // act(gate)
      t.alloc(rows(f));                   // · up
      t.free(rows(f));
    }
    t.free(rows(2 * f));
    if (bias) {
      t.alloc(rows(h));                   // the down biases gathered
      t.free(rows(2 * f));
    }
    t.alloc(rows(h));                     // grouped product down
    t.alloc(rows(h));                     // masked_fill
    t.free(rows(h) + rows(f));
    t.alloc(rows(h));                     // · the routing weights (proj_out stays)
    t.alloc(sid);                         // inv_perm
    t.touch(sid);                         // arange
    t.alloc(rows(h));                     // weighted_out[inv_perm]
    t.free(rows(h));
    t.alloc(s.act(h));                    // the sum over k
    t.free(rows(h) * 2 + sid + sid + sid + rows(h) + weights_g + (s.cpu ? storage_bytes(dtypes::fp32, S) : bytes{}) +
           bytes{S} + (bias ? rows(h) : bytes{}) + offsets);
    t.free(router_kept);
    if (sh.shared_ffn != 0) {
      // DeepseekV3MoE: the shared experts' MLP on the same input, added to the routed output
      hf_mlp(t, s, sh.shared_ffn, h, true);
      t.alloc(s.act(h));
      t.free(s.act(h) + s.act(h));
    }
  } else {
    hf_mlp(t, s, ceil_div(sh.ffn, s.tp), h, (sh.flags & layer_flags::gated) != 0);
  }
  t.free(s.act(h));  // n2
  if (sandwich) {
    rms_norm(t, s, h, wfp32);  // post_feedforward_layernorm
    t.free(s.act(h));
  }
  t.alloc(s.act(h));              // residual + mlp
  t.free(s.act(h) + s.act(h));    // the MLP's output and the first residual sum
  t.free(probs);                  // `hidden_states, _ = self.self_attn(...)`: held to the block's end
}

}  // namespace detail

namespace detail {
constexpr std::string_view memalg_serving_error(const model_desc& m, const serving_desc& d);
}

/// Why a serving request cannot be planned, or empty.
constexpr std::string_view serving_error(const model_desc& m, const serving_desc& d) {
  if (d.batch == 0) return "a serving plan needs a batch of at least one sequence";
  if (d.prompt == 0) return "a serving plan needs a prompt of at least one token";
  if (d.tp == 0 || d.pp == 0) return "tensor and pipeline degrees start at 1";
  if (d.cache == kv_cache_kind::fixed && d.max_cache_len != 0 &&
      d.max_cache_len < d.prompt + (d.new_tokens > 0 ? d.new_tokens - 1 : 0))
    return "the static cache's max_cache_len is shorter than the tokens fed (the prompt and the new tokens but the last)";
  if (d.cache == kv_cache_kind::paged && d.block_size == 0) return "a paged cache needs a block size";
  if (d.cache == kv_cache_kind::paged && (d.utilization_permille == 0 || d.utilization_permille > 1000))
    return "gpu_memory_utilization lies in (0, 1]";
  bool blocks = false;
  for (const layer_desc& l : m) blocks = blocks || l.kind == layer_kind::transformer_block;
  if (!blocks) return "a serving plan needs a model with transformer blocks (a preset, --config or the shape flags)";
  if (d.stack == serve_stack::memalg) return detail::memalg_serving_error(m, d);
  return {};
}


namespace detail {

constexpr bool quantized_entry(const layer_desc& l, const serving_desc& d) {
  if (d.weights.is_none() || d.weights == d.compute) return false;
  switch (l.kind) {
    case layer_kind::transformer_block:
    case layer_kind::attention:
    case layer_kind::mlp:
    case layer_kind::gated_mlp:
    case layer_kind::moe:
    case layer_kind::linear: return true;
    default: return false;
  }
}

/// The weights one rank of stage `stage` holds: quantized matrices in `weights`, the rest (norms,
/// biases, embedding, output layer) in the compute dtype; module buffers beside them.
constexpr bytes serving_weights(const model_desc& m, const serving_desc& d, std::uint64_t stage) {
  mesh_desc mesh{};
  mesh.tp = d.tp;
  mesh.pp = d.pp;
  bytes w{};
  for (const layer_desc& l : m) {
    const std::uint64_t n = instances_on_stage(l, stage, d.pp);
    if (n == 0) continue;
    const rank_elements e = elements_per_rank(l, mesh);
    const std::uint64_t total = e.total();
    bytes one{};
    if (quantized_entry(l, d)) {
      const std::uint64_t q = d.scope == quant_scope::experts ? serve_min(e.expert, e.matrix) : e.matrix;
      one = storage_bytes(d.weights, q) + storage_bytes(d.compute, total - q);
    } else {
      one = storage_bytes(l.weight_storage.is_none() ? d.compute : l.weight_storage, total);
    }
    // DeepseekV3TopkRouter's e_score_correction_bias, an fp32 buffer of one value per expert
    const bytes router_buffer = l.shape.router_fp32 && l.shape.experts != 0 ? storage_bytes(dtypes::fp32, l.shape.experts) : bytes{};
    w += (one + bytes{l.buffer_bytes} + router_buffer) * n;
  }
  return w;
}

/// The rotary embedding's inv_freq buffer(s): fp32, half the rotated width, one per table
/// (LlamaRotaryEmbedding's `register_buffer("inv_freq", ...)`; Gemma 3: one per layer type).
constexpr bytes rotary_buffers(const model_desc& m) {
  bytes b{};
  for (const layer_desc& l : m) {
    if (l.kind != layer_kind::transformer_block || (l.shape.flags & layer_flags::rotary) == 0) continue;
    const std::uint64_t width = is_mla(l.shape) ? l.shape.rotary_dim : head_dim_of(l.shape);
    const std::uint64_t tables = l.shape.rotary_tables > 1 ? l.shape.rotary_tables : 1;
    b = serve_max(b, storage_bytes(dtypes::fp32, width / 2) * tables);
  }
  return b;
}

/// Rotary tables of one forward (cos and sin of every new token, per sequence), in the compute dtype.
constexpr bytes rotary_tables(const model_desc& m, const step_shape& s) {
  bytes b{};
  for (const layer_desc& l : m) {
    if (l.kind != layer_kind::transformer_block || (l.shape.flags & layer_flags::rotary) == 0) continue;
    std::uint64_t width = is_mla(l.shape) ? l.shape.rotary_dim : head_dim_of(l.shape);
    if (l.shape.rotary_half_table) width /= 2;
    const std::uint64_t tables = l.shape.rotary_tables > 1 ? l.shape.rotary_tables : 1;
    b = serve_max(b, s.act(width) * (2 * tables));
  }
  return b;
}

/// The peak of one forward and what is live at it.
struct forward_peak {
  bytes peak{};
  serve_breakdown at{};
  constexpr void see(const serve_breakdown& b) {
    if (peak < b.total()) {
      peak = b.total();
      at = b;
    }
  }
};

/// One Hugging Face forward over `q` new tokens per sequence, `total` fed after it (`q_prev` by
/// the forward before), on top of `base` (what the generation loop holds; its kv_cache: none).
/// The model's loop holds the embedding's output (`inputs_embeds`), the rotary tables and the
/// masks over every block (modeling_llama.py, LlamaModel.forward); the cache grows block by block.
constexpr forward_peak hf_forward(const model_desc& m, const serving_desc& d, std::uint64_t stage, std::uint64_t q,
                                  std::uint64_t total, std::uint64_t q_prev, const serve_breakdown& base, bool host) {
  forward_peak f{};
  const dtype kvt = d.kv.is_none() ? d.compute : d.kv;
  step_shape s{};
  s.batch = d.batch;
  s.queries = q;
  s.e = d.compute;
  s.tp = d.tp;
  s.attention = d.attention;
  s.cpu = host;
  s.dequantize = (d.weights == dtypes::nf4 || d.weights == dtypes::nf4_double_quant || d.weights == dtypes::fp4 ||
                  d.weights == dtypes::fp4_double_quant) &&
                 (host || s.tokens() > 1536);
  std::uint64_t hidden = 0;
  bool sliding = false, full = false;
  for (const layer_desc& l : m) {
    if (l.kind != layer_kind::transformer_block || instances_on_stage(l, stage, d.pp) == 0) continue;
    hidden = l.shape.hidden;
    (l.shape.window != 0 ? sliding : full) = true;
  }
  // The cache of every block as it stands before this forward.
  bytes cache{};
  for (const layer_desc& l : m) {
    const std::uint64_t n = instances_on_stage(l, stage, d.pp);
    if (n == 0 || l.kind != layer_kind::transformer_block) continue;
    const cache_step c = hf_cache_step(l.shape, d, total, q, q_prev);
    cache += cache_bytes_of(c, c.before, d.batch, kvt) * n;
  }
  // The masks, one per layer type, alive over the forward (masking_utils.py: SDPA's bool mask
  // when it cannot be skipped, eager's in the model dtype always).
  bytes masks{};
  for (int kind = 0; kind < 2; ++kind) {
    if (!(kind == 0 ? full : sliding)) continue;
    for (const layer_desc& l : m) {
      if (l.kind != layer_kind::transformer_block || instances_on_stage(l, stage, d.pp) == 0) continue;
      if ((l.shape.window != 0) != (kind == 1)) continue;
      const cache_step c = hf_cache_step(l.shape, d, total, q, q_prev);
      const std::uint64_t cells = checked_mul(checked_mul(d.batch, q), c.read);
      if (d.attention == serve_attention::eager) masks += storage_bytes(d.compute, cells);
      else if (c.mask) masks += bytes{cells};
      break;
    }
  }
  serve_breakdown live = base;
  live.kv_cache = cache;
  // (the embedding's output on the first stage, the received hidden states on a later one)
  live.activations += s.act(hidden) + rotary_tables(m, s) + masks;
  f.see(live);
  bool x_own = false;  // the block's input is a tensor of its own (after the first block)
  for (const layer_desc& l : m) {
    const std::uint64_t n = instances_on_stage(l, stage, d.pp);
    if (n == 0) continue;
    if (l.kind != layer_kind::transformer_block) continue;
    const cache_step c = hf_cache_step(l.shape, d, total, q, q_prev);
    const bytes grown = cache_bytes_of(c, c.after, d.batch, kvt), gone = cache_bytes_of(c, c.before, d.batch, kvt);
    for (std::uint64_t i = 0; i < n; ++i) {
      // the block's tape starts with its own cache (before the update) and its input
      tape t{};
      t.alloc_cache(gone);
      t.alloc(x_own ? s.act(hidden) : bytes{});
      hf_block(t, l, s, c, kvt);
      serve_breakdown at = live;
      at.kv_cache = live.kv_cache - gone + t.cache_at_peak;
      at.activations += t.peak - t.cache_at_peak;
      f.see(at);
      live.kv_cache = live.kv_cache - gone + grown;
      x_own = true;
      // identical instances: after the first, only the last can set a new peak
      if (n > 2 && i == 0) {
        live.kv_cache = live.kv_cache + grown * (n - 2) - gone * (n - 2);
        i = n - 2;
      }
    }
  }
  // The final norm over every new token, then the output layer on the last position only
  // (generate sets logits_to_keep=1): B×V logits in the model dtype.
  {
    tape t{};
    rms_norm(t, s, hidden);
    serve_breakdown at = live;
    at.activations += s.act(hidden) + t.peak;
    f.see(at);
  }
  return f;
}

/// The cache's bytes on the stage after `total` fed tokens (the storage each layer keeps).
constexpr bytes hf_cache_after(const model_desc& m, const serving_desc& d, std::uint64_t stage, std::uint64_t total,
                               std::uint64_t q, std::uint64_t q_prev) {
  const dtype kvt = d.kv.is_none() ? d.compute : d.kv;
  bytes c{};
  for (const layer_desc& l : m) {
    const std::uint64_t n = instances_on_stage(l, stage, d.pp);
    if (n == 0 || l.kind != layer_kind::transformer_block) continue;
    c += cache_bytes_of(hf_cache_step(l.shape, d, total, q, q_prev), hf_cache_step(l.shape, d, total, q, q_prev).after,
                        d.batch, kvt) * n;
  }
  return c;
}

constexpr std::uint64_t vocab_of(const model_desc& m) {
  std::uint64_t v = 0;
  for (const layer_desc& l : m)
    if (l.kind == layer_kind::output || l.kind == layer_kind::embedding) v = serve_max(v, l.shape.vocab);
  return v;
}

/// Bytes of `n` elements of `e` padded to 16 (the memalg runtime's arena alignment:
/// exec/arena_layout.hpp; exec/gpt/build_generation.hpp, generation_bytes).
constexpr bytes padded16(dtype e, std::uint64_t n) {
  const std::uint64_t b = storage_bytes(e, n).value;
  return bytes{(b + 15) / 16 * 16};
}

/// The block every transformer block of `m` is, for the memalg stack; `count` blocks.
struct memalg_blocks {
  layer_shape shape{};
  std::uint64_t count = 0;
  std::string_view error{};
};
constexpr memalg_blocks memalg_serving_blocks(const model_desc& m) {
  memalg_blocks b{};
  for (const layer_desc& l : m) {
    if (l.kind != layer_kind::transformer_block) continue;
    const layer_shape& s = l.shape;
    if (b.count == 0) b.shape = s;
    else if (s.hidden != b.shape.hidden || s.heads != b.shape.heads || kv_heads_of(s) != kv_heads_of(b.shape) ||
             head_dim_of(s) != head_dim_of(b.shape) || s.ffn != b.shape.ffn || s.flags != b.shape.flags)
      b.error = "the memalg runtime generates with identical blocks";
    b.count += l.count;
    constexpr std::uint32_t refused = layer_flags::moe | layer_flags::cross_attention | layer_flags::parallel_residual |
                                      layer_flags::shared_norm | layer_flags::norms_after | layer_flags::norms_sandwich |
                                      layer_flags::qk_norm_whole | layer_flags::adapted;
    if ((s.flags & refused) != 0 || s.window != 0 || is_mla(s) || s.experts != 0 || s.attention_sinks || s.l2_qk_norm ||
        s.complex_rotary)
      b.error = "the memalg runtime generates with sequential dense blocks (GPT, Llama, Qwen2 and Qwen3 shapes: no "
                "mixture of experts, latent attention, sliding window, parallel residual or post-norms)";
  }
  if (b.count == 0) b.error = "a serving plan needs a model with transformer blocks";
  return b;
}

/// Why the memalg stack cannot plan a request, or empty.
constexpr std::string_view memalg_serving_error(const model_desc& m, const serving_desc& d) {
  if (d.tp != 1 || d.pp != 1) return "the memalg runtime generates on one device (no tensor or pipeline parallelism)";
  if (!(d.compute == dtypes::fp32 || d.compute == dtypes::bf16 || d.compute == dtypes::fp16))
    return "the memalg runtime generates in fp32, bf16 or fp16";
  if (!(d.weights.is_none() || d.weights == d.compute) || !(d.kv.is_none() || d.kv == d.compute))
    return "the memalg runtime keeps its weights and its cache in the compute dtype (no quantized weights or cache)";
  if (d.cache == kv_cache_kind::paged) return "the memalg runtime's cache is one buffer per layer, not paged";
  if (d.prefill_chunk != 0) return "the memalg runtime prefills the whole prompt in one forward (no --prefill-chunk)";
  if (d.max_cache_len != 0 && d.max_cache_len != d.prompt + (d.new_tokens > 0 ? d.new_tokens - 1 : 0))
    return "the memalg runtime's cache holds exactly the tokens fed (the prompt and the new tokens but the last)";
  if (d.attention == serve_attention::eager) return "the memalg runtime's attention is the model's own (naive or flash), not eager";
  if (d.new_tokens == 0) return "the memalg runtime generates at least one new token";
  return memalg_serving_blocks(m).error;
}

/// The stacks of one forward of the memalg runtime's generation program over q new tokens per
/// sequence, replayed tensor by tensor in its order (exec/gpt/build_generation.hpp: each tensor
/// released after its last reader; the prefill runs the model's attention core, whose
/// statistics are dropped at once; a decode step attends over the cache), and the logits' share
/// at the peak.
struct memalg_forward {
  bytes peak{}, logits_at_peak{};
};
constexpr memalg_forward memalg_forward_stacks(const memalg_blocks& blk, std::uint64_t vocab, std::uint64_t batch,
                                               std::uint64_t q, bool prefill, dtype e) {
  const layer_shape& s = blk.shape;
  const std::uint64_t C = s.hidden, H = s.heads, D = head_dim_of(s), Q = (H + 2 * kv_heads_of(s)) * D;
  const std::uint64_t F = s.ffn, F1 = (s.flags & layer_flags::gated) != 0 ? 2 * F : F;
  const std::uint64_t N = checked_mul(batch, q);
  const auto act = [&](std::uint64_t width) { return padded16(e, checked_mul(N, width)); };
  tape t{};
  const bytes x = act(C);
  t.alloc(x);  // the residual stream, from the embedding to the last block
  {  // one block: every block is alike and ends holding what it started with, so one holds the peak
    t.alloc(act(C));   // ln1_out
    t.alloc(act(Q));   // qkv
    t.free(act(C));
    t.alloc(act(H * D));  // attention_out
    if (prefill) {  // the core's statistics: flash's log-sum-exp (fp32) or naive's probabilities
      const bytes core = (s.flags & layer_flags::flash) != 0
                             ? padded16(dtypes::fp32, checked_mul(checked_mul(batch, H), q))
                             : padded16(e, checked_mul(checked_mul(checked_mul(batch, H), q), q));
      t.touch(core);
    }
    t.free(act(Q));
    t.alloc(act(C));   // proj_out
    t.free(act(H * D));
    t.free(act(C));
    t.alloc(act(C));   // ln2_out
    t.alloc(act(F1));  // fc1_out
    t.free(act(C));
    t.alloc(act(F));   // the activation's output
    t.free(act(F1));
    t.alloc(act(C));   // fc2_out
    t.free(act(F));
    t.free(act(C));
  }
  // The last position of each sequence: its rows, the final norm, the logits.
  const bytes row = padded16(e, checked_mul(batch, C)), logits = padded16(e, checked_mul(batch, vocab));
  t.alloc(row);
  t.free(x);
  t.alloc(row);
  t.free(row);
  const bytes body = t.peak;
  t.alloc(logits);
  memalg_forward f{t.peak, body < t.peak ? logits : bytes{}};
  return f;
}

}  // namespace detail

/// The serving plan of `d` for `m` on `dev`: Hugging Face's generate with greedy decoding (the
/// pytorch stack) or vLLM's paged cache (serve_stack::paged). The peak is the larger of the
/// prefill's and every decode step's.
constexpr serve_result evaluate_serving(const model_desc& m, const serving_desc& d, const device_desc& dev) {
  using namespace detail;
  serve_result r{};
  r.reason = serving_error(m, d);
  if (!r.reason.empty()) return r;
  r.limit = dev.limit();
  if (d.stack == serve_stack::memalg) {
    // memalg's runtime (exec/gpt/build_generation.hpp): one arena of the weights (every parameter
    // in the compute dtype, unit after unit, as training lays them out), then each layer's cache
    // kv [B, L, 2·Hkv·D] for L = prompt + new tokens − 1 positions (allocated whole before the
    // prefill; the last new token is never fed back), then the stacks of one forward at a time.
    // The token ids live outside the arena, as training's do.
    const detail::memalg_blocks blk = detail::memalg_serving_blocks(m);
    const dtype e = d.compute;
    bytes w{};
    for (const layer_desc& l : m) w += storage_bytes(e, l.params) * l.count;
    const std::uint64_t L = detail::static_length(d);
    const std::uint64_t kv_width = 2 * detail::kv_heads_of(blk.shape) * detail::head_dim_of(blk.shape);
    r.cache_layer_bytes = detail::padded16(e, checked_mul(checked_mul(d.batch, L), kv_width));
    r.cache_offset = w;
    r.cache_bytes = r.cache_layer_bytes * blk.count;
    r.cache_per_token = storage_bytes(e, kv_width) * blk.count;
    const std::uint64_t V = detail::vocab_of(m);
    const detail::memalg_forward pre = detail::memalg_forward_stacks(blk, V, d.batch, d.prompt, true, e);
    const detail::memalg_forward dec = d.new_tokens > 1 ? detail::memalg_forward_stacks(blk, V, d.batch, 1, false, e)
                                                        : detail::memalg_forward{};
    const bool decode = pre.peak < dec.peak;
    const detail::memalg_forward& top = decode ? dec : pre;
    r.stack_peak = top.peak;
    r.at_peak.weights = w;
    r.at_peak.kv_cache = r.cache_bytes;
    r.at_peak.activations = top.peak - top.logits_at_peak;
    r.at_peak.logits = top.logits_at_peak;
    r.at_peak.reserve = dev.reserve;
    r.prefill_peak = w + r.cache_bytes + pre.peak;
    r.decode_peak = d.new_tokens > 1 ? w + r.cache_bytes + dec.peak : bytes{};
    r.peak_phase = decode ? serve_phase::decode : serve_phase::prefill;
    r.peak_length = decode ? L : d.prompt;
    r.fits = r.peak() <= r.limit;
    return r;
  }
  const dtype kvt = d.kv.is_none() ? d.compute : d.kv;
  const std::uint64_t B = d.batch, P = d.prompt, N = d.new_tokens;
  const std::uint64_t fed = P + (N > 0 ? N - 1 : 0);  // the last forward's tokens per sequence

  // The most loaded stage: its weights and its cache at the longest.
  std::uint64_t stage = 0;
  bytes best{};
  for (std::uint64_t st = 0; st < d.pp; ++st) {
    const bytes total = serving_weights(m, d, st) + hf_cache_after(m, d, st, fed, fed > P ? 1 : P, P);
    if (st == 0 || best < total) {
      best = total;
      stage = st;
    }
  }
  const bytes weights = serving_weights(m, d, stage) + rotary_buffers(m);
  for (const layer_desc& l : m) {
    const std::uint64_t n = instances_on_stage(l, stage, d.pp);
    if (n == 0 || l.kind != layer_kind::transformer_block) continue;
    const cache_step c = hf_cache_step(l.shape, d, 2, 1, 1);
    r.cache_per_token += storage_bytes(kvt, c.key_width + c.value_width) * n;
  }
  const std::uint64_t V = vocab_of(m);
  const bytes ids = storage_bytes(index_dtype, checked_mul(B, P));
  const bytes logits_e = storage_bytes(d.compute, checked_mul(B, V));
  const bytes logits32 = storage_bytes(dtypes::fp32, checked_mul(B, V));

  if (d.stack == serve_stack::megatron) {
    // Megatron-core's dynamic inference engine (megatron/core/inference/contexts/dynamic_context.py):
    // one pool of `kv_buffer_bytes` on every rank, in blocks of block_size tokens × every layer's
    // keys and values of the rank's query groups (bf16: the parameters' dtype), allocated as one
    // tensor of ⌊buffer / block⌋ blocks; the weights in bf16 (Float16Module, no optimizer); two
    // cuBLAS/Transformer Engine workspaces; and one step's logits with log-probs of every padded
    // row: the previous step's fp32 logits, this step's bf16 output and its fp32 upcast
    // (module.py Float16Module, text_generation_controller.py), 10 bytes per token and vocabulary
    // entry. A step's tokens: the prompt's, padded to a multiple of 64 (TOKEN_ROUNDER), or the chunk.
    r.block_bytes = r.cache_per_token * d.block_size;
    r.blocks = r.block_bytes.value == 0 ? 0 : d.kv_buffer_bytes / r.block_bytes.value;
    const std::uint64_t per_seq = ceil_div(P + N, d.block_size);
    r.concurrent_sequences = r.blocks > 1 ? (r.blocks - 1) / per_seq : 0;
    const std::uint64_t step = d.prefill_chunk != 0 ? ceil_div(serve_min(d.prefill_chunk, B * P), 64) * 64
                                                    : ceil_div(serve_min(B * P, d.max_num_batched_tokens), 64) * 64;
    r.at_peak.weights = weights;
    r.at_peak.kv_cache = r.block_bytes * r.blocks;
    r.at_peak.logits = bytes{checked_mul(checked_mul(step, V), 10)};
    r.at_peak.activations = dev.blas_workspace * 2;
    r.at_peak.reserve = dev.reserve;
    r.peak_phase = serve_phase::prefill;
    r.peak_length = P + N;
    r.prefill_peak = r.peak() - dev.reserve;
    r.cache_bytes = r.at_peak.kv_cache;
    r.fits = r.blocks > 0 && r.concurrent_sequences >= B && r.peak() <= r.limit;
    return r;
  }
  if (d.stack == serve_stack::paged) {
    // vLLM's v1 engine (vllm/v1/worker/gpu_worker.py determine_available_memory; v1/core/
    // kv_cache_utils.py get_num_blocks): the engine takes gpu_memory_utilization of the device;
    // what its profiling run leaves after the weights and the run's activation peak (a forward
    // over max_num_batched_tokens tokens) becomes blocks of `block_size` tokens for every layer,
    // 2·block·kv_heads·head_dim (one latent of kv_lora_rank + rope for MLA) per layer. One block
    // is the null block (v1/core/block_pool.py). Sliding-window layers are planned as full ones,
    // as under --disable-hybrid-kv-cache-manager (an upper bound on each sequence's blocks).
    serve_breakdown profile{};
    profile.weights = weights;
    serving_desc run = d;
    run.batch = 1;
    run.prompt = d.max_num_batched_tokens;
    run.new_tokens = 0;
    run.cache = kv_cache_kind::dynamic;
    run.stack = serve_stack::pytorch;
    const forward_peak f = hf_forward(m, run, stage, run.prompt, run.prompt, run.prompt, profile, dev.host);
    const bytes activations = f.at.activations + storage_bytes(dtypes::fp32, checked_mul(serve_min(d.max_num_batched_tokens, d.max_num_seqs), V));
    const bytes engine{static_cast<std::uint64_t>(static_cast<unsigned __int128>(dev.capacity.value) * d.utilization_permille / 1000)};
    r.block_bytes = r.cache_per_token * d.block_size;
    const bytes fixed = weights + activations;
    r.blocks = engine < fixed || r.block_bytes.value == 0 ? 0 : (engine - fixed).value / r.block_bytes.value;
    const std::uint64_t per_seq = ceil_div(P + N, d.block_size);
    r.concurrent_sequences = r.blocks > 1 ? (r.blocks - 1) / per_seq : 0;
    r.at_peak.weights = weights;
    r.at_peak.activations = activations;
    r.at_peak.kv_cache = r.block_bytes * r.blocks;
    r.at_peak.reserve = dev.reserve;
    r.peak_phase = serve_phase::prefill;
    r.peak_length = P + N;
    r.prefill_peak = weights + activations + r.at_peak.kv_cache;
    r.cache_bytes = r.at_peak.kv_cache;
    r.fits = r.blocks > 0 && r.concurrent_sequences >= B && r.peak() <= r.limit;
    return r;
  }

  // Prefill (generate's _prefill): the prompt's ids, its attention mask and position ids (held
  // by generate's frame over the call) and prepare_inputs_for_generation's clone of the ids.
  serve_breakdown base{};
  base.weights = weights;
  base.reserve = dev.reserve;
  // (and _sample's unfinished_sequences, B int64, with a scalar of _prepare_special_tokens; each
  // static layer's cumulative_length and each dynamic sliding layer's _sliding_window_tensor, an
  // int64 scalar, cache_utils.py)
  std::uint64_t scalars = B + 1;
  for (const layer_desc& l : m)
    if (l.kind == layer_kind::transformer_block && (d.cache == kv_cache_kind::fixed || l.shape.window != 0))
      scalars += instances_on_stage(l, stage, d.pp);
  const bytes flags = storage_bytes(index_dtype, scalars);
  base.generation = ids * 4 + flags;
  // Chunked prefill (generation/utils.py _prefill with prefill_chunk_size): the prompt split in
  // chunks, each cloned for its forward, the previous chunk's logits alive during the next.
  const std::uint64_t chunk = d.prefill_chunk != 0 ? serve_min(d.prefill_chunk, P) : P;
  forward_peak prefill{};
  std::uint64_t q_prev = 0;
  for (std::uint64_t done = 0; done < P; done += chunk) {
    const std::uint64_t q = serve_min(chunk, P - done);
    serve_breakdown b = base;
    b.generation = ids * 3 + storage_bytes(index_dtype, checked_mul(B, q)) + flags;
    if (done > 0) b.logits = logits_e;
    const forward_peak f = hf_forward(m, d, stage, q, done + q, q_prev == 0 ? q : q_prev, b, dev.host);
    if (prefill.peak < f.peak) prefill = f;
    q_prev = q;
    // (the chunks between the second and the last are alike but for a shorter cache)
    if (done > 0 && done + 2 * chunk < P) done = (P - 1) / chunk * chunk - chunk;
  }
  // After the prefill: the logits (B×1×V), generate's fp32 copy of them, the grown mask and positions.
  {
    serve_breakdown at = base;
    at.kv_cache = hf_cache_after(m, d, stage, P, q_prev, q_prev);
    at.logits = logits_e + logits32;
    at.generation = ids * 3 + storage_bytes(index_dtype, checked_mul(B, P + 1)) * 2 + flags;
    prefill.see(at);
  }
  r.prefill_peak = prefill.peak - dev.reserve;
  r.at_peak = prefill.at;
  r.peak_phase = serve_phase::prefill;
  r.peak_length = P;

  // Decode: N − 1 forwards of one token per sequence. Beside each: the prompt's three tensors,
  // the loop's ids, mask and positions grown to the fed length, the model inputs' clones and the
  // previous step's fp32 logits; after it, its logits and their new fp32 copy beside the old.
  // Every term grows with the length, so the longest step is the decode peak; the first step
  // after a long prompt is planned too (a sliding layer still holds the prompt's storage).
  for (std::uint64_t k = 1; k < N; ++k) {
    if (k != 1 && k != N - 1) continue;
    const std::uint64_t total = P + k;
    serve_breakdown b{};
    b.weights = weights;
    b.reserve = dev.reserve;
    b.generation = ids * 3 + storage_bytes(index_dtype, checked_mul(B, total)) * 3 + storage_bytes(index_dtype, B) * 4 + flags;
    b.logits = logits32;
    forward_peak f = hf_forward(m, d, stage, 1, total, k == 1 ? q_prev : 1, b, dev.host);
    serve_breakdown after = b;
    after.kv_cache = hf_cache_after(m, d, stage, total, 1, k == 1 ? q_prev : 1);
    after.logits = logits_e + logits32 * 2;
    f.see(after);
    const bytes tensors = f.peak - dev.reserve;
    if (r.decode_peak < tensors) r.decode_peak = tensors;
    if (r.at_peak.total() < f.peak) {
      r.at_peak = f.at;
      r.peak_phase = serve_phase::decode;
      r.peak_length = total;
    }
  }
  r.cache_bytes = hf_cache_after(m, d, stage, fed, fed > P ? 1 : q_prev, q_prev);
  r.fits = r.peak() <= r.limit;
  return r;
}

/// The largest batch that fits at the request's lengths, and the longest prompt that fits at its
/// batch (0 when not even one sequence of one token fits); the request's new tokens are kept.
struct serve_search {
  std::uint64_t max_batch = 0;
  std::uint64_t max_context = 0;
};

namespace detail {
/// Largest n in [1, hi] with fits(n), fits monotone (memory grows with n); 0 when fits(1) fails.
template <class Fits>
constexpr std::uint64_t largest_fitting(std::uint64_t hi, Fits fits) {
  if (!fits(1)) return 0;
  std::uint64_t lo = 1;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
}  // namespace detail

constexpr serve_search search_serving(const model_desc& m, const serving_desc& d, const device_desc& dev) {
  serve_search s{};
  if (!serving_error(m, d).empty()) return s;
  s.max_batch = detail::largest_fitting(1u << 20, [&](std::uint64_t b) {
    serving_desc x = d;
    x.batch = b;
    return evaluate_serving(m, x, dev).fits;
  });
  s.max_context = detail::largest_fitting(1u << 24, [&](std::uint64_t p) {
    serving_desc x = d;
    x.prompt = p;
    if (x.cache == kv_cache_kind::fixed && x.max_cache_len != 0 && x.max_cache_len < p + x.new_tokens)
      x.max_cache_len = p + x.new_tokens;
    return evaluate_serving(m, x, dev).fits;
  });
  return s;
}

template <class S>
concept serving_type = requires {
  { S::value } -> std::convertible_to<serving_desc>;
};

/// `serving_plan<Model, Serving, Device>`: the serving plan at compile time.
template <model_type Model, serving_type Serving, device_type Device>
struct serving_plan {
  using model_type = Model;
  using serving_type = Serving;
  using device_type = Device;
  static constexpr model_desc model = Model::value;
  static constexpr serving_desc serving = Serving::value;
  static constexpr device_desc device = Device::value;
  static_assert(serving_error(model, serving).empty(), "serving_plan: the request is invalid (see serving_error)");
  static constexpr serve_result result = evaluate_serving(model, serving, device);
  static constexpr bytes peak = result.peak();
  static constexpr bytes limit = result.limit;
  static constexpr bool fits = result.fits;
  static constexpr bool is_serving_plan = true;
};

template <class P>
concept serving_plan_type = requires {
  { P::is_serving_plan } -> std::convertible_to<bool>;
};

namespace detail {
template <std::uint64_t N> struct kv_cache {};
template <std::uint64_t N> struct logits {};
template <std::uint64_t N> struct generation_state {};
/// 0 prefill, 1 decode
template <int N> struct at_serving_phase {};
template <std::uint64_t N> struct at_cache_length {};

template <class Need, class Limit, class Phase, class Length, class... Breakdown>
struct require_serving_fits {
  static_assert(Need::value <= Limit::value,
                "memalg: the serving plan does not fit in device memory (need_bytes > limit_bytes; the breakdown "
                "follows in the template arguments): try a smaller batch or context, quantized weights, an fp8 "
                "cache, or more tensor parallelism");
  static constexpr bool value = Need::value <= Limit::value;
};
}  // namespace detail

/// Fails the build when the serving plan does not fit, printing the numbers.
template <class Plan>
  requires serving_plan_type<Plan>
constexpr bool require_fits() {
  constexpr const serve_result& r = Plan::result;
  constexpr const serve_breakdown& b = r.at_peak;
  return detail::require_serving_fits<
      detail::need_bytes<r.peak().value>, detail::limit_bytes<r.limit.value>,
      detail::at_serving_phase<static_cast<int>(r.peak_phase)>, detail::at_cache_length<r.peak_length>,
      detail::weights<b.weights.value>, detail::kv_cache<b.kv_cache.value>, detail::activations<b.activations.value>,
      detail::logits<b.logits.value>, detail::generation_state<b.generation.value>, detail::reserve<b.reserve.value>>::value;
}

/// The request as types: serving::request<serving::batch<8>, serving::prompt<1024>, ...>.
namespace serving {
template <std::uint64_t N> struct batch { static constexpr void apply(serving_desc& d) { d.batch = N; } };
template <std::uint64_t N> struct prompt { static constexpr void apply(serving_desc& d) { d.prompt = N; } };
template <std::uint64_t N> struct new_tokens { static constexpr void apply(serving_desc& d) { d.new_tokens = N; } };
/// D: a dtype type (model::dt::bf16, model::dt::int4_g128, ...).
template <class D> struct compute { static constexpr void apply(serving_desc& d) { d.compute = D::value; } };
template <class D, quant_scope S = quant_scope::linear>
struct weights {
  static constexpr void apply(serving_desc& d) {
    d.weights = D::value;
    d.scope = S;
  }
};
template <class D> struct kv_dtype { static constexpr void apply(serving_desc& d) { d.kv = D::value; } };
struct dynamic_cache { static constexpr void apply(serving_desc& d) { d.cache = kv_cache_kind::dynamic; } };
template <std::uint64_t MaxLen = 0>
struct static_cache {
  static constexpr void apply(serving_desc& d) {
    d.cache = kv_cache_kind::fixed;
    d.max_cache_len = MaxLen;
  }
};
template <std::uint64_t BlockSize = 16, std::uint64_t UtilizationPermille = 900>
struct paged_cache {
  static constexpr void apply(serving_desc& d) {
    d.cache = kv_cache_kind::paged;
    d.stack = serve_stack::paged;
    d.block_size = BlockSize;
    d.utilization_permille = UtilizationPermille;
  }
};
struct eager { static constexpr void apply(serving_desc& d) { d.attention = serve_attention::eager; } };
template <std::uint64_t N> struct prefill_chunk { static constexpr void apply(serving_desc& d) { d.prefill_chunk = N; } };
template <std::uint64_t TP, std::uint64_t PP = 1>
struct parallel {
  static constexpr void apply(serving_desc& d) {
    d.tp = TP;
    d.pp = PP;
  }
};

template <class... Options>
struct request {
  static constexpr serving_desc make() {
    serving_desc d{};
    (Options::apply(d), ...);
    return d;
  }
  static constexpr serving_desc value = make();
};
}  // namespace serving

}  // namespace memalg
