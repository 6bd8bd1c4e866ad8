// SPDX-License-Identifier: BSL-1.0
// expect: byte_count_overflows_64_bits
// 2^63 parameters of fp32 need 2^65 bytes: more than a 64-bit byte count holds.
#include <memalg/memalg.hpp>
using namespace memalg;
constexpr bytes too_many = storage_bytes(dtypes::fp32, 1ULL << 63) + bytes{1};
int main() { return static_cast<int>(too_many.value); }
