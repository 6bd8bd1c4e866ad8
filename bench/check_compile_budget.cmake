# SPDX-License-Identifier: BSL-1.0
# Compiles SOURCE (-O0, to an object) with COMPILER and fails when it takes longer than
# BUDGET_SECONDS of wall-clock time, or does not compile.
string(TIMESTAMP _start "%s%f")
execute_process(COMMAND ${COMPILER} -std=c++20 -O0 -I${INCLUDE} -c ${SOURCE} -o ${WORKDIR}/budget.o
                RESULT_VARIABLE rc ERROR_VARIABLE err)
string(TIMESTAMP _end "%s%f")
math(EXPR _ms "(${_end} - ${_start}) / 1000")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} does not compile:\n${err}")
endif()
math(EXPR _budget_ms "${BUDGET_SECONDS} * 1000")
if(_ms GREATER _budget_ms)
  message(FATAL_ERROR "${SOURCE} took ${_ms} ms to compile, more than the ${BUDGET_SECONDS} s budget")
endif()
message(STATUS "${SOURCE}: ${_ms} ms (budget ${BUDGET_SECONDS} s)")
