// SPDX-License-Identifier: BSL-1.0
// Compile-time cost of including the umbrella header.
#include <memalg/memalg.hpp>
int main() { return 0; }
