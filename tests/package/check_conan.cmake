# SPDX-License-Identifier: BSL-1.0
# `conan create` of the recipe against the local source, in a scratch Conan home, offline (Boost
# from the system, the default): the recipe's test_package builds and runs the package consumer.
# Conan is not a build dependency (it comes from PyPI): without it the test reports itself skipped.
find_program(CONAN conan)
if(NOT CONAN)
  message(STATUS "SKIPPED: conan is not installed (pip install conan, then rerun this test)")
  return()  # with SKIP_REGULAR_EXPRESSION the test shows as skipped
endif()
file(REMOVE_RECURSE ${WORKDIR})
# The test package runs from a scratch copy, so that nothing is written into the source tree; it
# builds ../tests/package/consumer, which is copied beside it.
file(COPY ${SOURCE_DIR}/test_package DESTINATION ${WORKDIR})
file(COPY ${SOURCE_DIR}/tests/package/consumer DESTINATION ${WORKDIR}/tests/package)
set(ENV{CONAN_HOME} ${WORKDIR}/home)
execute_process(COMMAND ${CONAN} profile detect RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "conan profile detect failed (${rc})")
endif()
execute_process(COMMAND ${CONAN} create ${SOURCE_DIR} -tf ${WORKDIR}/test_package -s compiler.cppstd=20
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "conan create failed (${rc}):\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "memalg/${VERSION} \\(test package\\)" OR NOT "${out}${err}" MATCHES "memalg ${VERSION}: ")
  message(FATAL_ERROR "conan create did not run the test package against memalg ${VERSION}:\n${out}${err}")
endif()
message(STATUS "conan create: memalg/${VERSION} packaged and its test package ran")
