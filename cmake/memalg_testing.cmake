# SPDX-License-Identifier: BSL-1.0
# How memalg's own test executables are compiled. The library, the `memalg` tool and the examples
# (what users build and run) keep the build type's flags; only test programs are affected.
#
#   MEMALG_TEST_OPTIMIZE  optimisation flags of the test executables (default -Og): the runtime
#                         tests instantiate the CPU backend for many plans; -Og compiles them in
#                         about half the time of -O1 and they still run in seconds (-O0 compiles
#                         faster again but runs them 5 times slower; bench/RESULTS.md).
#   MEMALG_TEST_SANITIZE  ON: build the host test executables with AddressSanitizer and the
#                         value checks of UndefinedBehaviorSanitizer (listed below). scripts/test.sh
#                         turns it on: the test suite's only build is also its sanitizer build.
#
# The UBSan checks are those on values (integer overflow, shifts, division by zero, float-to-int
# overflow, array bounds, bool/enum loads, a missing return, unreachable code). The checks on
# every pointer use (null, alignment, pointer-overflow, object-size, vptr) are left out: they
# double the compile time of the template-heavy tests again, and AddressSanitizer reports the
# invalid accesses they would lead to. The fuzz targets (fuzz/) run clang's full
# -fsanitize=address,undefined over the command-line tool.
set(MEMALG_TEST_OPTIMIZE "-Og" CACHE STRING "Optimisation flags of memalg's test executables")
option(MEMALG_TEST_SANITIZE "Build and run memalg's host test executables under ASan and UBSan" OFF)
set(MEMALG_TEST_UBSAN_CHECKS
  signed-integer-overflow shift integer-divide-by-zero float-cast-overflow bounds bool enum return
  unreachable vla-bound)
list(JOIN MEMALG_TEST_UBSAN_CHECKS "," _memalg_ubsan)
set(MEMALG_TEST_SANITIZER_FLAGS -fsanitize=address,${_memalg_ubsan} -fno-sanitize-recover=all
    -fno-omit-frame-pointer -g1)
unset(_memalg_ubsan)
# Open MPI's own allocations are reported as leaks at exit, so the sanitized programs linked with it
# run without the leak check (memalg's code is leak-checked by the other host tests).
set(MEMALG_TEST_SANITIZER_MPI_ENV)
if(MEMALG_TEST_SANITIZE)
  set(MEMALG_TEST_SANITIZER_MPI_ENV "ASAN_OPTIONS=detect_leaks=0")
endif()

# memalg_test_flags(<target> [NO_SANITIZE])
#   The test flags for one executable (or object library). NO_SANITIZE: optimised as a test but
#   never sanitized (CUDA targets, and the MPI tests that train each plan twice and would take
#   minutes under the sanitizers).
function(memalg_test_flags target)
  cmake_parse_arguments(arg "NO_SANITIZE" "" "" ${ARGN})
  separate_arguments(_opt UNIX_COMMAND "${MEMALG_TEST_OPTIMIZE}")
  # Target options come after CMAKE_<LANG>_FLAGS_<CONFIG> on the command line, so they win; nvcc
  # hands them to the host compiler (its own -O would be a second, conflicting -O for nvcc).
  list(JOIN _opt "," _host_opt)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${_opt}>
                                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_host_opt}>)
  if(MEMALG_TEST_SANITIZE AND NOT arg_NO_SANITIZE)
    target_compile_options(${target} PRIVATE ${MEMALG_TEST_SANITIZER_FLAGS})
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      target_link_options(${target} PRIVATE ${MEMALG_TEST_SANITIZER_FLAGS})
    endif()
  endif()
endfunction()

# memalg_compile_check_flags(<target>)
#   Targets that are only compiled (static tests, self-contained headers): -O0, the quickest.
function(memalg_compile_check_flags target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0> $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-O0>)
endfunction()
