# SPDX-License-Identifier: BSL-1.0
# Runs a binary (COMMAND, a ;-list) that must refuse its command line: exit status EXPECT_RC,
# nothing on stdout, exactly one line on stderr, matching MATCH.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "`${COMMAND}` exited with ${rc}, not ${EXPECT_RC}:\n${out}${err}")
endif()
string(REGEX MATCHALL "\n" _lines "${err}")
list(LENGTH _lines _n)
if(NOT _n EQUAL 1 OR NOT err MATCHES "${MATCH}")
  message(FATAL_ERROR "`${COMMAND}` must print one line matching '${MATCH}' on stderr, printed:\n${err}")
endif()
if(NOT out STREQUAL "")
  message(FATAL_ERROR "`${COMMAND}` printed on stdout:\n${out}")
endif()
message(STATUS "refused (${rc}): ${err}")
