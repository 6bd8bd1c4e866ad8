// SPDX-License-Identifier: BSL-1.0
// What the CUDA runtime accepts (exec/gpt/plan_cuda.hpp), decided on the host: fp32 and
// mixed-bf16 only, bf16 on many ranks (NCCL reduces it), the attention kernels' head widths; and
// the MFU arithmetic: parameter count, 6N + 6LCT flops per token, the devices' dense bf16 peaks.
#include <doctest/doctest.h>

#include <memalg/exec/gpt/plan_cuda.hpp>

namespace m = memalg;
namespace ex = memalg::exec;

namespace {
constexpr m::lm_config gpt2(std::uint64_t vocab) {
  m::lm_config c{};
  c.layers = 12;
  c.hidden = 768;
  c.heads = 12;
  c.vocab = vocab;
  c.positions = 1024;
  c.logits = m::dtypes::bf16;
  c.flash = true;
  return c;
}
struct gpt2_small {
  static constexpr m::lm_config value = gpt2(50304);
};
template <class Precision, class Mesh = m::parallel::mesh<>>
constexpr ex::cuda_runtime_issue issue(m::lm_config c) {
  using recipe = m::train::recipe<Precision, m::optim::adamw<>, m::train::batch<4, 64>, m::train::reference_kernels>;
  c.logits = Precision::value.weights;
  return ex::find_cuda_runtime_issue(c, recipe::value, Mesh::value);
}
}  // namespace

TEST_CASE("the CUDA runtime implements fp32 and mixed-bf16, on one rank or many") {
  const m::lm_config c = gpt2(50304);
  CHECK(issue<m::precision::fp32>(c) == ex::cuda_runtime_issue::none);
  CHECK(issue<m::precision::mixed_bf16>(c) == ex::cuda_runtime_issue::none);
  CHECK(issue<m::precision::amp_fp16>(c) == ex::cuda_runtime_issue::precision);
  CHECK(issue<m::precision::amp_bf16>(c) == ex::cuda_runtime_issue::precision);  // fp32 gradients
  using dp2 = m::parallel::mesh<m::parallel::data<2, m::parallel::zero<2>>>;
  CHECK(issue<m::precision::mixed_bf16, dp2>(c) == ex::cuda_runtime_issue::none);
  // The CPU runtime runs the same plan too: mpi_communicator reduces bf16 (MPI user operations).
  using recipe = m::train::recipe<m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<4, 64>,
                                  m::train::reference_kernels>;
  CHECK(ex::find_cpu_runtime_issue(c, recipe::value, dp2::value) == ex::runtime_issue::none);
  using pp2 = m::parallel::mesh<m::parallel::pipeline<2>>;
  // Pipeline stages: the CPU runtime's rule (fp32, an untied output layer).
  CHECK(issue<m::precision::fp32, pp2>(c) == ex::cuda_runtime_issue::pipeline);
  m::lm_config untied = c;
  untied.tied = false;
  CHECK(issue<m::precision::fp32, pp2>(untied) == ex::cuda_runtime_issue::none);
  CHECK(issue<m::precision::mixed_bf16, pp2>(untied) == ex::cuda_runtime_issue::pipeline);
  CHECK_FALSE(ex::describe_cuda(ex::cuda_runtime_issue::precision).empty());
}

TEST_CASE("the CUDA runtime takes the step program's parallel-residual blocks (the same ops as the sequential block's)") {
  m::lm_config neox = gpt2(50304);
  neox.positions = 0;
  neox.rotary = true;
  neox.rotary_dim = 16;
  neox.parallel_residual = true;
  CHECK(issue<m::precision::fp32>(neox) == ex::cuda_runtime_issue::none);
  CHECK(issue<m::precision::mixed_bf16>(neox) == ex::cuda_runtime_issue::none);
  m::lm_config falcon = neox;
  falcon.shared_norm = true;
  falcon.kv_heads = 1;
  falcon.bias = false;
  CHECK(issue<m::precision::mixed_bf16>(falcon) == ex::cuda_runtime_issue::none);
  falcon.parallel_residual = false;  // a shared norm only between parallel branches
  CHECK(issue<m::precision::mixed_bf16>(falcon) == ex::cuda_runtime_issue::architecture);
  m::mesh_desc sp{};
  sp.tp = 2;
  sp.world = 2;
  sp.sequence_parallel = true;
  using recipe = m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<4, 64>, m::train::reference_kernels>;
  neox.logits = m::dtypes::fp32;
  CHECK(ex::find_cuda_runtime_issue(neox, recipe::value, sp) == ex::cuda_runtime_issue::sequence_parallel);
}

TEST_CASE("the CUDA runtime takes the step program's tensor-parallel layouts: vocabulary-parallel, sequence-parallel") {
  const m::lm_config c = gpt2(50304);
  m::mesh_desc tp{};
  tp.tp = 2;
  tp.world = 2;
  using fp32 = m::train::recipe<m::precision::fp32, m::optim::adamw<>, m::train::batch<4, 64>, m::train::reference_kernels>;
  using bf16 = m::train::recipe<m::precision::mixed_bf16, m::optim::adamw<>, m::train::batch<4, 64>,
                                m::train::reference_kernels>;
  m::lm_config c32 = c;
  c32.logits = m::dtypes::fp32;
  CHECK(ex::find_cuda_runtime_issue(c32, fp32::value, tp) == ex::cuda_runtime_issue::none);
  CHECK(ex::find_cuda_runtime_issue(c, bf16::value, tp) == ex::cuda_runtime_issue::none);
  m::lm_config odd = c32;
  odd.vocab = 50257;  // not divisible by tp = 2: no vocabulary-parallel embedding
  CHECK(ex::find_cuda_runtime_issue(odd, fp32::value, tp) == ex::cuda_runtime_issue::vocab);
  CHECK(ex::describe_cuda(ex::cuda_runtime_issue::vocab).find("divisible") != std::string_view::npos);
  m::mesh_desc sp = tp;
  sp.sequence_parallel = true;
  CHECK(ex::find_cuda_runtime_issue(c32, fp32::value, sp) == ex::cuda_runtime_issue::none);
  // The step program's sequence parallelism is fp32-only, without selective recomputation.
  CHECK(ex::find_cuda_runtime_issue(c, bf16::value, sp) == ex::cuda_runtime_issue::sequence_parallel);
  m::training_desc selective = fp32::value;
  selective.recompute = m::recompute_kind::selective;
  CHECK(ex::find_cuda_runtime_issue(c32, selective, sp) == ex::cuda_runtime_issue::sequence_parallel);
  CHECK(ex::describe_cuda(ex::cuda_runtime_issue::sequence_parallel).find("CUDA runtime's sequence parallelism") !=
        std::string_view::npos);
}

TEST_CASE("the CUDA attention kernels bound the head width") {
  m::lm_config c = gpt2(256);
  c.hidden = 256;
  c.heads = 1;  // head width 256: too wide for flash, fine for the naive kernels
  CHECK(issue<m::precision::fp32>(c) == ex::cuda_runtime_issue::head_width);
  c.flash = false;
  CHECK(issue<m::precision::fp32>(c) == ex::cuda_runtime_issue::none);
  c.hidden = 512;
  CHECK(issue<m::precision::fp32>(c) == ex::cuda_runtime_issue::head_width);
}

TEST_CASE("the CUDA runtime trains Llama-style blocks, as the CPU runtime does") {
  m::lm_config c = gpt2(256);  // flash attention
  c.positions = 0;             // rotary positions
  c.rotary = true;
  c.kv_heads = 4;              // grouped-query attention, 3 query heads per key/value head
  c.rms_norm = true;
  c.gated = true;
  c.bias = false;
  c.tied = false;
  CHECK(issue<m::precision::fp32>(c) == ex::cuda_runtime_issue::none);
  CHECK(issue<m::precision::mixed_bf16>(c) == ex::cuda_runtime_issue::none);
  CHECK(issue<m::precision::amp_fp16>(c) == ex::cuda_runtime_issue::precision);
  // On several ranks too, as on the CPU (the program splits the block variants over dp and tp).
  using dp2 = m::parallel::mesh<m::parallel::data<2, m::parallel::zero<1>>>;
  CHECK(issue<m::precision::fp32, dp2>(c) == ex::cuda_runtime_issue::none);
  CHECK(issue<m::precision::mixed_bf16, dp2>(c) == ex::cuda_runtime_issue::none);
  // Fewer key/value heads need flash attention; so does the CPU runtime.
  c.flash = false;
  CHECK(issue<m::precision::fp32>(c) == ex::cuda_runtime_issue::heads);
  c.flash = true;
  c.head_dim = 192;  // wider than the flash kernels' 128
  CHECK(issue<m::precision::fp32>(c) == ex::cuda_runtime_issue::head_width);
}

TEST_CASE("MFU: a tiny GPT's training flops per token, counted matmul by matmul") {
  // GPT-2's structure (tied output, learned positions) in one block of width C = 4, one head, MLP
  // width 16, vocabulary 8, sequence T = 2.
  m::lm_config c = gpt2(8);
  c.layers = c.heads = 1;
  c.hidden = 4;
  c.positions = 2;
  // Per token, a weight matrix of in × out costs 2·in·out flops forward and twice that backward
  // (the input's gradient and the weight's): 6·in·out.
  const double qkv = 6 * (4 * 12), proj = 6 * (4 * 4), fc1 = 6 * (4 * 16), fc2 = 6 * (16 * 4), head = 6 * (4 * 8);
  CHECK(qkv + proj + fc1 + fc2 + head == 1344);
  // Attention: each token's scores against T keys (T·C multiply-adds) and its weighted sum of T
  // values (T·C more): 4·T·C flops forward over the full square, 12·T·C with the backward; the
  // causal mask keeps half of the square (llm.c's convention, PaLM's appendix B halved): 6·T·C = 48.
  const double attention = 12.0 * 2 * 4 / 2;
  // The parameters no matmul reads, which llm.c's 6N counts as if one did: the position table
  // (T·C = 8), two LayerNorms in the block and the final one (3 · 2C = 24), the biases of qkv,
  // proj, fc1 and fc2 (12 + 4 + 16 + 4 = 36): 68 parameters, 408 flops.
  const double outside = 6.0 * (8 + 24 + 36);
  CHECK(ex::flops_per_token(c, 2) == qkv + proj + fc1 + fc2 + head + attention + outside);  // 1800
  // 1000 tokens/s need 1.8 Mflop/s: half the peak of two devices of 1.8 Mflop/s each.
  CHECK(ex::model_flops_utilisation(c, 2, 1000.0, 1.8e6, 2) == doctest::Approx(0.5));
}

TEST_CASE("MFU: GPT-2 124M parameters and 6N + 6LCT flops per token") {
  // Hugging Face's gpt2 (vocab 50257) has 124,439,808 parameters; llm.c pads the vocabulary to
  // 50304 and prints num_parameters 124,475,904.
  CHECK(ex::gpt_parameters(gpt2(50257)) == 124'439'808u);
  CHECK(ex::gpt_parameters(gpt2(50304)) == 124'475'904u);
  // The runtime's model descriptor counts the same parameters.
  CHECK(m::exec::runtime_gpt<gpt2_small>::value.parameters() == ex::gpt_parameters(gpt2_small::value));
  // An independently computed case (by hand, from PaLM's appendix B as llm.c applies it):
  // 6 · 124,475,904 = 746,855,424 and 6 · 12 · 768 · 1024 = 56,623,104, so 803,478,528 flops per
  // token; 100k tokens/s on one H200 (989.4 TFLOP/s dense bf16, its data sheet) is
  // 8.03478528e13 / 9.894e14 = 0.0812087 of its peak, and so is 200k tokens/s on two.
  CHECK(ex::flops_per_token(gpt2(50304), 1024) == 803'478'528.0);
  CHECK(ex::model_flops_utilisation(gpt2(50304), 1024, 1e5, 989.4e12, 1) == doctest::Approx(0.0812087).epsilon(1e-6));
  CHECK(ex::model_flops_utilisation(gpt2(50304), 1024, 2e5, 989.4e12, 2) == doctest::Approx(0.0812087).epsilon(1e-6));
  // The device table's matching: the longer name wins where one contains another, an unknown
  // device has no peak (the binary then asks for --peak-tflops).
  CHECK(ex::dense_bf16_peak_flops("NVIDIA H100 PCIe") < ex::dense_bf16_peak_flops("NVIDIA H100 80GB HBM3"));
  CHECK(ex::dense_bf16_peak_flops("NVIDIA H200 NVL") < ex::dense_bf16_peak_flops("NVIDIA H200"));
  CHECK(ex::dense_bf16_peak_flops("NVIDIA L40S") > ex::dense_bf16_peak_flops("NVIDIA L4"));
  CHECK(ex::dense_bf16_peak_flops("Unknown Accelerator") == 0.0);
  CHECK(ex::model_flops_utilisation(gpt2(50304), 1024, 1e5, 0.0, 1) == 0.0);
}
