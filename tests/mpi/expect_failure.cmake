# SPDX-License-Identifier: BSL-1.0
# Runs COMMAND (a ;-list) and succeeds only if it exits non-zero and its output contains EXPECT:
# a deliberately failing rank must fail the whole MPI job, not just print a message.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status, got 0")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "exit status ${rc}, but the output does not contain '${EXPECT}'")
endif()
