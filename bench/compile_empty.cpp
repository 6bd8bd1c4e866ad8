// SPDX-License-Identifier: BSL-1.0
// Baseline for compile-time measurements: an empty translation unit with <cstdint>.
#include <cstdint>
int main() { return 0; }
