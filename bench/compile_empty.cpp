// Baseline for compile-time measurements: an empty translation unit with <cstdint>.
#include <cstdint>
int main() { return 0; }
