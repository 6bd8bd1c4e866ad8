# SPDX-License-Identifier: BSL-1.0
# Installs the build tree into a scratch prefix and builds a tiny consumer against it with
# find_package(memalg CONFIG REQUIRED), then runs the consumer.
file(REMOVE_RECURSE ${WORKDIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORKDIR}/prefix
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORKDIR}/build
  -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${WORKDIR}/prefix
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed:\n${out}${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORKDIR}/build RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed:\n${out}${err}")
endif()
execute_process(COMMAND ${WORKDIR}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed (${rc}):\n${out}")
endif()
message(STATUS "consumer: ${out}")

# The same consumer with memalg added by add_subdirectory.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/subproject -B ${WORKDIR}/sub
  -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DMEMALG_SOURCE_DIR=${SOURCE_DIR} -DMEMALG_WITH_CUDA=OFF
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the subproject consumer failed:\n${out}${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORKDIR}/sub RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the subproject consumer failed:\n${out}${err}")
endif()
execute_process(COMMAND ${WORKDIR}/sub/consumer RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the subproject consumer failed (${rc})")
endif()
message(STATUS "subproject consumer built and ran")
