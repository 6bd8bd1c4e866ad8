# SPDX-License-Identifier: BSL-1.0
# `memalg serve ARGS --emit FILE` writes a header; a translation unit including it must compile
# (EXPECT=fits), or fail with the plan's peak, as `memalg serve ARGS --json` reports it, in
# need_bytes<...> (EXPECT=oom).
separate_arguments(_args UNIX_COMMAND "${ARGS}")
file(MAKE_DIRECTORY ${WORKDIR})
execute_process(COMMAND ${EXE} serve ${_args} --emit ${WORKDIR}/serve.hpp RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "`memalg serve ${ARGS} --emit` failed (${rc}):\n${err}")
endif()
execute_process(COMMAND ${EXE} serve ${_args} --json RESULT_VARIABLE rc OUTPUT_VARIABLE json)
string(JSON _peak GET "${json}" peak_with_reserve_bytes)
file(WRITE ${WORKDIR}/use.cpp "#include \"serve.hpp\"\nstatic_assert(memalg_serve::plan::peak.value == memalg_serve::emitted_peak_bytes);\nstatic_assert(memalg_serve::plan::peak.value == ${_peak}ULL);\nint main() {}\n")
execute_process(COMMAND ${COMPILER} -std=c++20 -fsyntax-only -I${INCLUDE} -I${WORKDIR} ${WORKDIR}/use.cpp
                RESULT_VARIABLE crc OUTPUT_VARIABLE cout ERROR_VARIABLE cerr)
if(EXPECT STREQUAL "fits")
  if(NOT crc EQUAL 0)
    message(FATAL_ERROR "the emitted header of a serving plan that fits does not compile:\n${cerr}")
  endif()
  message(STATUS "compiles; peak ${_peak} bytes")
else()
  if(crc EQUAL 0)
    message(FATAL_ERROR "the emitted header of a serving plan that does not fit compiled")
  endif()
  if(NOT "${cout}${cerr}" MATCHES "serving plan does not fit in device memory" OR NOT "${cout}${cerr}" MATCHES "need_bytes<${_peak}")
    message(FATAL_ERROR "the compiler did not print need_bytes<${_peak}>:\n${cerr}")
  endif()
  message(STATUS "fails with need_bytes<${_peak}>")
endif()
