# SPDX-License-Identifier: BSL-1.0
# A bounded fuzzing run: SECONDS of FUZZER from CORPUS (read only), new inputs and any crash
# reproducer in WORKDIR. Fails, printing the reproducer, when the fuzzer finds a crash or a hang.
file(REMOVE_RECURSE ${WORKDIR})
file(MAKE_DIRECTORY ${WORKDIR}/new)
execute_process(
  COMMAND ${FUZZER} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1
          -artifact_prefix=${WORKDIR}/ ${WORKDIR}/new ${CORPUS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  file(GLOB _artifacts ${WORKDIR}/crash-* ${WORKDIR}/timeout-* ${WORKDIR}/leak-* ${WORKDIR}/oom-*)
  message(FATAL_ERROR "${FUZZER} failed (${rc}); reproducers: ${_artifacts}\n${err}")
endif()
string(REGEX MATCH "stat::number_of_executed_units: [0-9]+" _runs "${err}")
message(STATUS "${_runs}")
