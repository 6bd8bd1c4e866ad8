// SPDX-License-Identifier: BSL-1.0
// memalg/backend/cuda/gemm.cuh — the linear layer on cuBLASLt.
//
// Row-major, PyTorch nn.Linear convention:
//   forward:   out[N,OC] = in[N,IC]·W[OC,IC]ᵀ (+ bias[OC]) (then GeLU, optionally keeping the
//              pre-activation in pre_gelu[N,OC])
//   backward:  din = dout·W                (=)
//              dW += doutᵀ·in              (+=, one rounding: cuBLASLt computes W + doutᵀ·in in fp32)
//              dbias += Σ_n dout           (+=, fixed-order column reduction)
// A row-major [r,c] matrix is the column-major [c,r] one, so the forward is the column-major
// "TN" product outᵀ = op_T(W)·inᵀ with m = OC, n = N, k = IC (the layout fp8 kernels require).
//
// Every GEMM accumulates in fp32 (CUBLAS_COMPUTE_32F, never TF32). The workspace is passed in
// (gemm_context) so that the memory plan accounts for it: default_gemm_workspace_bytes() gives
// 32 MiB on Hopper and 4 MiB before. Bias is fused into the GEMM epilogue; GeLU is fused only when
// gemm_context::fuse_gelu is set (cuBLASLt evaluates tanh its own way, so the fused result is not
// bit-compatible with the CPU reference), otherwise it runs as activation.cuh's kernel. If cuBLASLt
// offers no algorithm for a fused epilogue the unfused path is taken.
//
// fp8 (compute capability ≥ 8.9): linear_forward_fp8 multiplies e4m3/e5m2 inputs and weights with
// per-tensor scales (device pointers, out = in_scale·weight_scale·in·Wᵀ + bias) into an fp32,
// bf16 or fp16 output; every dimension must be a multiple of 16.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "memalg/backend/cuda/activation.cuh"
#include "memalg/backend/cuda/check.cuh"
#include "memalg/backend/cuda/device.cuh"
#include "memalg/backend/cuda/dtype.cuh"
#include "memalg/backend/cuda/launch.cuh"
#include "memalg/backend/cuda/pointwise.cuh"
#include "memalg/backend/cuda/reduce.cuh"

namespace memalg::backend::cuda {

/// Owns a cuBLASLt handle.
class blaslt_handle {
 public:
  blaslt_handle() { MEMALG_CUBLAS_CHECK(cublasLtCreate(&handle_)); }
  ~blaslt_handle() {
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }
  blaslt_handle(blaslt_handle&& o) noexcept : handle_(o.handle_) { o.handle_ = nullptr; }
  blaslt_handle& operator=(blaslt_handle&& o) noexcept {
    if (this != &o) {
      if (handle_ != nullptr) cublasLtDestroy(handle_);
      handle_ = o.handle_;
      o.handle_ = nullptr;
    }
    return *this;
  }
  blaslt_handle(const blaslt_handle&) = delete;
  blaslt_handle& operator=(const blaslt_handle&) = delete;
  cublasLtHandle_t get() const noexcept { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

/// What every GEMM call needs besides its operands.
struct gemm_context {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;           ///< device memory, 256-byte aligned (may be null)
  std::size_t workspace_bytes = 0;
  bool fuse_gelu = false;              ///< GeLU in the cuBLASLt epilogue (faster, not bit-compatible)
};

/// The workspace the plan reserves for cuBLASLt on `device` (current device when negative).
inline std::size_t gemm_workspace_bytes(int device = -1) {
  return default_gemm_workspace_bytes(device_compute_capability(device).major);
}

enum class linear_epilogue { none, gelu };

/// Bias element type of an fp8 GEMM producing Out (cuBLASLt: bf16 for fp32 outputs).
template <class Out>
using fp8_bias_t = std::conditional_t<std::is_same_v<Out, float>, bf16, Out>;

namespace detail {

template <class Handle, auto Destroy>
class lt_object {
 public:
  lt_object() = default;
  ~lt_object() {
    if (h_ != nullptr) Destroy(h_);
  }
  lt_object(const lt_object&) = delete;
  lt_object& operator=(const lt_object&) = delete;
  Handle* out() noexcept { return &h_; }
  Handle get() const noexcept { return h_; }

 private:
  Handle h_ = nullptr;
};

using lt_desc = lt_object<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using lt_layout = lt_object<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using lt_pref = lt_object<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

/// One column-major cuBLASLt call: D[m,n] = alpha·op(A)·op(B) + beta·D (C aliases D).
struct lt_call {
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  cudaDataType_t a_type = CUDA_R_32F;
  std::int64_t lda = 0;
  const void* b = nullptr;
  cudaDataType_t b_type = CUDA_R_32F;
  std::int64_t ldb = 0;
  void* d = nullptr;
  cudaDataType_t d_type = CUDA_R_32F;
  std::int64_t ldd = 0;
  float alpha = 1.0f, beta = 0.0f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

template <class V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  MEMALG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

template <class V>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
  MEMALG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

inline std::uint32_t lt_alignment(const void* p) {
  return static_cast<std::uint32_t>(alignment_of(reinterpret_cast<std::uintptr_t>(p)));
}

/// Runs the call. Returns CUBLAS_STATUS_SUCCESS when it ran, CUBLAS_STATUS_NOT_SUPPORTED when
/// cuBLASLt offers no algorithm, or the heuristic's error (nothing ran in either of those cases).
inline cublasStatus_t try_lt_matmul(const gemm_context& ctx, const lt_call& c, cudaStream_t stream) {
  if (ctx.handle == nullptr) throw std::invalid_argument("gemm: gemm_context has no cuBLASLt handle");
  lt_desc desc;
  MEMALG_CUBLAS_CHECK(cublasLtMatmulDescCreate(desc.out(), CUBLAS_COMPUTE_32F, gemm_scale_type));
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(c.transa));
  set_desc(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(c.transb));
  if (c.epilogue != CUBLASLT_EPILOGUE_DEFAULT) set_desc(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, c.epilogue);
  if (c.bias != nullptr) {
    set_desc(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
    set_desc(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(c.bias_type));
  }
  if (c.aux != nullptr) {
    set_desc(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux);
    set_desc(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.aux_ld);
  }
  if (c.a_scale != nullptr) set_desc(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, c.a_scale);
  if (c.b_scale != nullptr) set_desc(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, c.b_scale);

  const bool ta = c.transa != CUBLAS_OP_N;
  const bool tb = c.transb != CUBLAS_OP_N;
  lt_layout la, lb, ld;
  MEMALG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(la.out(), c.a_type, static_cast<std::uint64_t>(ta ? c.k : c.m),
                                                 static_cast<std::uint64_t>(ta ? c.m : c.k), c.lda));
  MEMALG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(lb.out(), c.b_type, static_cast<std::uint64_t>(tb ? c.n : c.k),
                                                 static_cast<std::uint64_t>(tb ? c.k : c.n), c.ldb));
  MEMALG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(ld.out(), c.d_type, static_cast<std::uint64_t>(c.m),
                                                 static_cast<std::uint64_t>(c.n), c.ldd));

  lt_pref pref;
  MEMALG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(pref.out()));
  const std::uint64_t ws = ctx.workspace != nullptr ? ctx.workspace_bytes : 0;
  set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
  set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, lt_alignment(c.a));
  set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, lt_alignment(c.b));
  set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, lt_alignment(c.d));
  set_pref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, lt_alignment(c.d));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(ctx.handle, desc.get(), la.get(), lb.get(), ld.get(),
                                                               ld.get(), pref.get(), 1, &result, &found);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  MEMALG_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, desc.get(), &c.alpha, c.a, la.get(), c.b, lb.get(), &c.beta, c.d,
                                     ld.get(), c.d, ld.get(), &result.algo, ctx.workspace, ws, stream));
  return CUBLAS_STATUS_SUCCESS;
}

inline void lt_matmul(const gemm_context& ctx, const lt_call& c, cudaStream_t stream, const char* what) {
  const cublasStatus_t s = try_lt_matmul(ctx, c, stream);
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": no cuBLASLt algorithm for m=" + std::to_string(c.m) +
                             ", n=" + std::to_string(c.n) + ", k=" + std::to_string(c.k) + " (" +
                             cublasLtGetStatusString(s) + ")");
}

/// The forward product, column-major: outᵀ[OC,N] = op_T(W: [IC,OC] col-major)·(inᵀ: [IC,N]).
inline lt_call linear_call(const void* in, cudaDataType_t in_type, const void* weight, cudaDataType_t w_type, void* out,
                           cudaDataType_t out_type, std::int64_t rows, std::int64_t in_features,
                           std::int64_t out_features) {
  lt_call c;
  c.transa = CUBLAS_OP_T;
  c.transb = CUBLAS_OP_N;
  c.m = out_features;
  c.n = rows;
  c.k = in_features;
  c.a = weight;
  c.a_type = w_type;
  c.lda = in_features;
  c.b = in;
  c.b_type = in_type;
  c.ldb = in_features;
  c.d = out;
  c.d_type = out_type;
  c.ldd = out_features;
  return c;
}

template <class T>
struct bias_add_op {
  T* out;
  const T* bias;
  std::int64_t cols;
  template <int W>
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t c = (i * W) % cols;
    packed<T, W> y = load_packed<W>(out, i);
    const packed<T, W> b = load_packed<W>(bias + c, 0);
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = from_float<T>(to_float(y.v[k]) + to_float(b.v[k]));
    store_packed<W>(out, i, y);
  }
};

template <class T>
struct bias_grad_term {
  const T* dout;
  std::int64_t cols;
  __device__ void operator()(std::int64_t n, std::int64_t c, float (&acc)[1]) const {
    acc[0] += to_float(dout[n * cols + c]);
  }
};

template <class T>
struct bias_grad_store {
  T* dbias;
  __device__ void operator()(std::int64_t c, const float (&sum)[1]) const {
    dbias[c] = from_float<T>(to_float(dbias[c]) + sum[0]);
  }
};

}  // namespace detail

/// out[rows,OC] = in[rows,IC]·W[OC,IC]ᵀ + bias (bias may be null). With linear_epilogue::gelu the
/// result goes through GeLU and, when pre_gelu is not null, the value before it is kept there.
template <storage_type T>
void linear_forward(const gemm_context& ctx, T* out, const T* in, const T* weight, const T* bias, std::int64_t rows,
                    std::int64_t in_features, std::int64_t out_features, cudaStream_t stream = nullptr,
                    linear_epilogue epilogue = linear_epilogue::none, T* pre_gelu = nullptr) {
  if (rows <= 0 || out_features <= 0) return;
  constexpr cudaDataType_t type = dtype_traits<T>::cuda;
  const bool gelu = epilogue == linear_epilogue::gelu;
  detail::lt_call c = detail::linear_call(in, type, weight, type, out, type, rows, in_features, out_features);
  // Fused attempt: bias always, GeLU when asked for (its aux output needs ld % 8 == 0).
  const bool fuse_gelu = gelu && ctx.fuse_gelu && (pre_gelu == nullptr || out_features % 8 == 0);
  if (!gelu || fuse_gelu) {
    detail::lt_call f = c;
    if (bias != nullptr) {
      f.bias = bias;
      f.bias_type = type;
    }
    if (fuse_gelu) {
      if (pre_gelu != nullptr) {
        f.aux = pre_gelu;
        f.aux_ld = out_features;
        f.epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      } else {
        f.epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      }
    } else if (bias != nullptr) {
      f.epilogue = CUBLASLT_EPILOGUE_BIAS;
    }
    if (detail::try_lt_matmul(ctx, f, stream) == CUBLAS_STATUS_SUCCESS) return;
  }
  // Unfused: GEMM with the bias epilogue if possible, then GeLU from activation.cuh.
  T* pre = gelu ? (pre_gelu != nullptr ? pre_gelu : out) : out;
  c.d = pre;
  bool bias_done = false;
  if (bias != nullptr) {
    detail::lt_call f = c;
    f.bias = bias;
    f.bias_type = type;
    f.epilogue = CUBLASLT_EPILOGUE_BIAS;
    bias_done = detail::try_lt_matmul(ctx, f, stream) == CUBLAS_STATUS_SUCCESS;
  }
  if (!bias_done) {
    detail::lt_matmul(ctx, c, stream, "linear_forward");
    if (bias != nullptr) {
      constexpr int w = max_vec_width(sizeof(T));
      launch_pointwise<w>(rows * out_features, common_vec_width(w, out_features, pre, bias),
                          detail::bias_add_op<T>{pre, bias, out_features}, stream, "bias_add");
    }
  }
  if (gelu) gelu_forward(out, pre, rows * out_features, stream);
}

/// din[rows,IC] = dout[rows,OC]·W[OC,IC] + beta·din: beta 0 writes din, beta 1 adds to it (an input
/// several products read).
template <storage_type T>
void linear_backward_input(const gemm_context& ctx, T* din, const T* dout, const T* weight, std::int64_t rows,
                           std::int64_t in_features, std::int64_t out_features, cudaStream_t stream = nullptr,
                           float beta = 0.0f) {
  if (rows <= 0 || in_features <= 0) return;
  constexpr cudaDataType_t type = dtype_traits<T>::cuda;
  // Column-major: dinᵀ[IC,N] = (W: [IC,OC])·(doutᵀ: [OC,N]).
  detail::lt_call c;
  c.transa = CUBLAS_OP_N;
  c.transb = CUBLAS_OP_N;
  c.m = in_features;
  c.n = rows;
  c.k = out_features;
  c.a = weight;
  c.a_type = type;
  c.lda = in_features;
  c.b = dout;
  c.b_type = type;
  c.ldb = out_features;
  c.d = din;
  c.d_type = type;
  c.ldd = in_features;
  c.beta = beta;
  detail::lt_matmul(ctx, c, stream, "linear_backward_input");
}

/// dW[OC,IC] += dout[rows,OC]ᵀ·in[rows,IC].
template <storage_type T>
void linear_backward_weight(const gemm_context& ctx, T* dweight, const T* dout, const T* in, std::int64_t rows,
                            std::int64_t in_features, std::int64_t out_features, cudaStream_t stream = nullptr) {
  if (in_features <= 0 || out_features <= 0 || rows <= 0) return;
  constexpr cudaDataType_t type = dtype_traits<T>::cuda;
  // Column-major: dWᵀ[IC,OC] += (inᵀ: [IC,N])·op_T(doutᵀ: [OC,N]).
  detail::lt_call c;
  c.transa = CUBLAS_OP_N;
  c.transb = CUBLAS_OP_T;
  c.m = in_features;
  c.n = out_features;
  c.k = rows;
  c.a = in;
  c.a_type = type;
  c.lda = in_features;
  c.b = dout;
  c.b_type = type;
  c.ldb = out_features;
  c.d = dweight;
  c.d_type = type;
  c.ldd = in_features;
  c.beta = 1.0f;
  detail::lt_matmul(ctx, c, stream, "linear_backward_weight");
}

/// dbias[OC] += Σ_n dout[n,:].
template <storage_type T>
void linear_backward_bias(T* dbias, const T* dout, std::int64_t rows, std::int64_t out_features,
                          cudaStream_t stream = nullptr) {
  column_reduce<1>(rows, out_features, detail::bias_grad_term<T>{dout, out_features}, detail::bias_grad_store<T>{dbias},
                   stream);
}

/// All three backward products; any of din, dweight, dbias may be null.
template <storage_type T>
void linear_backward(const gemm_context& ctx, T* din, T* dweight, T* dbias, const T* dout, const T* in,
                     const T* weight, std::int64_t rows, std::int64_t in_features, std::int64_t out_features,
                     cudaStream_t stream = nullptr) {
  if (dbias != nullptr) linear_backward_bias(dbias, dout, rows, out_features, stream);
  if (dweight != nullptr) linear_backward_weight(ctx, dweight, dout, in, rows, in_features, out_features, stream);
  if (din != nullptr) linear_backward_input(ctx, din, dout, weight, rows, in_features, out_features, stream);
}

/// fp8 forward: out[rows,OC] = (*in_scale)·(*weight_scale)·in[rows,IC]·W[OC,IC]ᵀ + bias.
/// Needs compute capability ≥ 8.9, all dimensions multiples of 16, and not both operands e5m2.
template <fp8_type In, fp8_type Wt, storage_type Out>
void linear_forward_fp8(const gemm_context& ctx, Out* out, const In* in, const Wt* weight, const float* in_scale,
                        const float* weight_scale, const fp8_bias_t<Out>* bias, std::int64_t rows,
                        std::int64_t in_features, std::int64_t out_features, cudaStream_t stream = nullptr) {
  static_assert(!(std::is_same_v<In, fp8_e5m2> && std::is_same_v<Wt, fp8_e5m2>),
                "cuBLASLt has no e5m2 x e5m2 GEMM");
  const compute_capability cc = device_compute_capability();
  if (!fp8_gemm_supported(cc.major, cc.minor))
    throw std::runtime_error("linear_forward_fp8: fp8 GEMMs need compute capability 8.9 or newer, the device has " +
                             std::to_string(cc.major) + "." + std::to_string(cc.minor));
  if (!fp8_gemm_dims_ok(rows, in_features, out_features))
    throw std::invalid_argument("linear_forward_fp8: rows, in_features and out_features must be multiples of 16");
  detail::lt_call c = detail::linear_call(in, dtype_traits<In>::cuda, weight, dtype_traits<Wt>::cuda, out,
                                          dtype_traits<Out>::cuda, rows, in_features, out_features);
  c.a_scale = weight_scale;  // A is the weight in the column-major view
  c.b_scale = in_scale;
  if (bias != nullptr) {
    c.bias = bias;
    c.bias_type = dtype_traits<fp8_bias_t<Out>>::cuda;
    c.epilogue = CUBLASLT_EPILOGUE_BIAS;
  }
  detail::lt_matmul(ctx, c, stream, "linear_forward_fp8");
}

}  // namespace memalg::backend::cuda
