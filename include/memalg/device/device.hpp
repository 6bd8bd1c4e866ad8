// SPDX-License-Identifier: BSL-1.0
// memalg/device/device.hpp — devices: capacity, a reserve for runtime overheads, a memory cap.
//
// capacity: the total memory the driver reports for the board (nvidia-smi "Total" in MiB, or
//           rocm-smi "VRAM Total Memory (B)" for MI300X), i.e. what a process can see, not the
//           marketing number (an "80 GB" H100 reports 81559 MiB = 79.65 GiB).
// reserve:  what the process needs outside its tensors: the CUDA context (about 300–500 MB on
//           recent GPUs with lazy module loading, CUDA ≥ 12.2, growing with the SM count) plus the
//           cuBLAS/cuBLASLt workspace (32 MiB recommended on Hopper and later, 4 MiB before).
//           memalg's default is an estimate — 512 MiB context on boards with ≥ 100 SMs (or CUs),
//           384 MiB below — and is meant to be replaced by a measurement (bench/gpu/run.sh
//           measures it; users override it with `with_reserve`).
// cap:      a fraction of capacity the process may use (like
//           torch.cuda.set_per_process_memory_fraction). The limit is floor(capacity·cap), and the
//           reserve counts inside it: usable = floor(capacity·cap) − reserve (conservative: the
//           context counts against the cap too).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "memalg/core/bytes.hpp"

namespace memalg {

struct device_desc {
  std::string_view name{};
  bytes capacity{};
  bytes reserve{};
  std::uint64_t cap_numerator = 1;    ///< memory cap as a fraction of capacity
  std::uint64_t cap_denominator = 1;
  /// The host's CPU rather than an accelerator: the pytorch stack then follows PyTorch's CPU
  /// kernels (dropout keeps its noise in the input's dtype, SDPA with dropout takes the math path).
  bool host = false;
  /// One cuBLAS workspace as PyTorch and Transformer Engine allocate it from the caching allocator
  /// (torch's CUBLAS_WORKSPACE_CONFIG default: 32 MiB from Hopper on, 8 MiB + 128 KiB before); a
  /// stack that runs several handles keeps several (the megatron stack: timeline.hpp).
  bytes blas_workspace{};
  /// What the device computes in (its data sheet): bfloat16 arithmetic (Ampere / CDNA2 and later)
  /// and fp8 tensor-core GEMMs (Ada, Hopper, Blackwell, CDNA3). A device of your own claims both;
  /// a precision that needs one the device lacks is refused (`precision_device_error`).
  bool bf16 = true;
  bool fp8 = true;

  /// floor(capacity × cap): the most this process may hold, reserve included.
  constexpr bytes limit() const {
    const auto scaled = static_cast<unsigned __int128>(capacity.value) * cap_numerator / cap_denominator;
    return bytes{static_cast<std::uint64_t>(scaled)};
  }
  /// What tensors may use: limit − reserve (zero when the reserve alone exceeds the limit).
  constexpr bytes usable() const { return limit() < reserve ? bytes{} : limit() - reserve; }
};

/// Why a device is invalid, or empty.
constexpr std::string_view device_error(const device_desc& d) {
  if (d.capacity.value == 0) return "a device needs a capacity above zero";
  if (d.cap_denominator == 0 || d.cap_numerator == 0 || d.cap_numerator > d.cap_denominator)
    return "the memory cap must be a fraction in (0, 1]";
  return {};
}

/// Why `d` cannot run a precision whose 16-bit type is bf16 (`needs_bf16`) or which computes in
/// fp8 (`needs_fp8`), or empty.
constexpr std::string_view precision_device_error(const device_desc& d, bool needs_bf16, bool needs_fp8) {
  if (needs_fp8 && !d.fp8) return "the device has no fp8 tensor cores (fp8 needs Ada, Hopper, Blackwell or MI300)";
  if (needs_bf16 && !d.bf16) return "the device has no bfloat16 arithmetic (bf16 needs Ampere, MI200 or later; use an fp16 precision)";
  return {};
}

namespace device {

using namespace memalg::literals;

/// Default reserve: context estimate + cuBLAS workspace (see the header comment).
constexpr bytes default_reserve(bool large_chip, bool hopper_or_later) {
  return (large_chip ? 512_MiB : 384_MiB) + (hopper_or_later ? 32_MiB : 4_MiB);
}

/// What a GPU computes in: bf16 only, or bf16 and fp8.
enum class math { fp16_only, bf16, bf16_fp8 };

/// A GPU of the catalog: its reserve, its cuBLAS workspace and what it computes in.
constexpr device_desc gpu(std::string_view name, bytes capacity, bool large_chip, bool hopper_or_later,
                          math m = math::bf16_fp8) {
  device_desc d{name, capacity, default_reserve(large_chip, hopper_or_later)};
  d.blas_workspace = hopper_or_later ? 32_MiB : 8_MiB + 128_KiB;
  d.bf16 = m != math::fp16_only;
  d.fp8 = m == math::bf16_fp8;
  return d;
}

// nvidia-smi totals (MiB) as printed by the boards' drivers; MI300X from rocm-smi (bytes). The
// capability fields follow the architectures: Volta and Turing compute in fp16 only, Ampere adds
// bf16, Ada, Hopper and Blackwell (and CDNA3) add fp8 tensor cores.
struct v100_16gb { static constexpr device_desc value = gpu("v100-16gb", 16160_MiB, false, false, math::fp16_only); };
struct v100_32gb { static constexpr device_desc value = gpu("v100-32gb", 32510_MiB, false, false, math::fp16_only); };
struct a100_40gb { static constexpr device_desc value = gpu("a100-40gb", 40960_MiB, true, false, math::bf16); };
struct a100_80gb { static constexpr device_desc value = gpu("a100-80gb", 81920_MiB, true, false, math::bf16); };
struct h100_80gb { static constexpr device_desc value = gpu("h100-80gb", 81559_MiB, true, true); };
struct h200 { static constexpr device_desc value = gpu("h200", 143771_MiB, true, true); };
struct b200 { static constexpr device_desc value = gpu("b200", 183359_MiB, true, true); };
struct l4 { static constexpr device_desc value = gpu("l4", 23034_MiB, false, false); };
struct l40s { static constexpr device_desc value = gpu("l40s", 46068_MiB, true, false); };
struct rtx3090 { static constexpr device_desc value = gpu("rtx3090", 24576_MiB, false, false, math::bf16); };
struct rtx4090 { static constexpr device_desc value = gpu("rtx4090", 24564_MiB, true, false); };
struct mi300x { static constexpr device_desc value = gpu("mi300x", bytes{205'822'885'888}, true, true); };
// Data-sheet capacities (decimal GB as the vendors print them) and the totals their drivers report
// in nvidia-smi (MiB), which is what `capacity` holds; ECC, on by default on the data-centre
// boards, takes its share before the total is reported (T4: 16 GiB of GDDR6, 15360 MiB visible).
/// NVIDIA T4 Tensor Core GPU data sheet: 16 GB GDDR6 (Turing, 40 SMs; no bf16).
struct t4 { static constexpr device_desc value = gpu("t4", 15360_MiB, false, false, math::fp16_only); };
/// Amazon EC2 G5 instances (NVIDIA A10G Tensor Core GPU): 24 GB GDDR6 per GPU (Ampere, 80 SMs).
struct a10g { static constexpr device_desc value = gpu("a10g", 23028_MiB, false, false, math::bf16); };
/// NVIDIA RTX A6000 data sheet: 48 GB GDDR6 with ECC (Ampere, 84 SMs).
struct rtx_a6000 { static constexpr device_desc value = gpu("rtx-a6000", 49140_MiB, false, false, math::bf16); };
/// NVIDIA GeForce RTX 5090 specifications: 32 GB GDDR7 (Blackwell, 170 SMs).
struct rtx5090 { static constexpr device_desc value = gpu("rtx5090", 32607_MiB, true, true); };
/// NVIDIA H100 Tensor Core GPU data sheet, H100 PCIe: 80 GB HBM2e (114 SMs).
struct h100_pcie { static constexpr device_desc value = gpu("h100-pcie", 81559_MiB, true, true); };
/// NVIDIA H100 Tensor Core GPU data sheet, H100 NVL: 94 GB HBM3 (132 SMs).
struct h100_nvl { static constexpr device_desc value = gpu("h100-nvl", 95830_MiB, true, true); };
/// The host CPU, as PyTorch's CPU tensors use it: no runtime reserve (no CUDA context); the
/// capacity is a nominal 256 GiB (cap it with `capped` or --memory-cap to the machine's memory).
/// bench/torch measures its ground truth here. PyTorch computes bf16 on CPUs; it has no fp8 GEMM.
struct cpu {
  static constexpr device_desc value{"cpu", 262144_MiB, bytes{0}, 1, 1, true, bytes{}, true, false};
};

inline constexpr std::array<device_desc, 19> catalog{
    v100_16gb::value, v100_32gb::value, t4::value,        a100_40gb::value, a100_80gb::value, a10g::value,
    h100_pcie::value, h100_80gb::value, h100_nvl::value,  h200::value,      b200::value,      l4::value,
    l40s::value,      rtx3090::value,   rtx_a6000::value, rtx4090::value,   rtx5090::value,   mi300x::value,
    cpu::value};

/// Reserve of a device given by its capacity alone (`of_capacity`, `memalg --device-memory`): the
/// catalog's largest default, 512 MiB of context and a 32 MiB cuBLAS workspace (544 MiB), so that
/// an unknown board is not planned with less than a known one. Override it with `with_reserve`.
inline constexpr bytes capacity_only_reserve = default_reserve(true, true);

/// A device of `capacity` bytes and nothing else known: the conservative reserve above, a 32 MiB
/// cuBLAS workspace, and bf16 and fp8 not refused (a board of your own is taken at its word).
constexpr device_desc by_capacity(bytes capacity) { return gpu("device-memory", capacity, true, true); }
template <std::uint64_t CapacityBytes>
struct of_capacity {
  static_assert(CapacityBytes > 0, "device::of_capacity: a device needs a capacity above zero");
  static constexpr device_desc value = by_capacity(bytes{CapacityBytes});
};

/// Runtime lookup by name; returns false when unknown.
constexpr bool from_name(std::string_view name, device_desc& out) {
  for (const device_desc& d : catalog)
    if (d.name == name) {
      out = d;
      return true;
    }
  return false;
}

/// A device of your own: any capacity, any reserve.
template <std::uint64_t CapacityBytes, std::uint64_t ReserveBytes = 0>
struct custom {
  static_assert(CapacityBytes > 0, "device::custom: a device needs a capacity above zero");
  static constexpr device_desc value{"custom", bytes{CapacityBytes}, bytes{ReserveBytes}};
};

/// `Device` with its reserve replaced (e.g. by a measured context + workspace).
template <class Device, std::uint64_t ReserveBytes>
struct with_reserve {
  static constexpr device_desc value = [] {
    device_desc d = Device::value;
    d.reserve = bytes{ReserveBytes};
    return d;
  }();
};

/// `Device` limited to Numerator/Denominator of its capacity (a per-process memory fraction).
template <class Device, std::uint64_t Numerator, std::uint64_t Denominator>
struct capped {
  static_assert(Denominator > 0 && Numerator > 0 && Numerator <= Denominator,
                "device::capped: the memory cap must be a fraction in (0, 1]");
  static constexpr device_desc value = [] {
    device_desc d = Device::value;
    d.cap_numerator = Numerator;
    d.cap_denominator = Denominator;
    return d;
  }();
};

}  // namespace device

template <class D>
concept device_type = requires {
  { D::value } -> std::convertible_to<device_desc>;
};

}  // namespace memalg
