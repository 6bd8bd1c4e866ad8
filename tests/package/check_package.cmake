# SPDX-License-Identifier: BSL-1.0
# Installs the build tree into a scratch prefix and builds a tiny consumer against it with
# find_package(memalg CONFIG REQUIRED): any version, the project's major.minor (which must be
# accepted) and the next minor version (which must be refused). Then the same consumer with
# memalg added by add_subdirectory.
include(${CMAKE_CURRENT_LIST_DIR}/consume.cmake)
file(REMOVE_RECURSE ${WORKDIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORKDIR}/prefix
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed (${rc})")
endif()
memalg_consume(${WORKDIR}/prefix ${WORKDIR}/build "")
memalg_consume(${WORKDIR}/prefix ${WORKDIR}/build-${MEMALG_MAJOR_MINOR} ${MEMALG_MAJOR_MINOR})
memalg_refuse(${WORKDIR}/prefix ${WORKDIR}/build-${MEMALG_NEXT_MINOR} ${MEMALG_NEXT_MINOR})

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
execute_process(COMMAND ${WORKDIR}/sub/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "^memalg ${VERSION}: ")
  message(FATAL_ERROR "the subproject consumer failed (${rc}): ${out}")
endif()
message(STATUS "subproject consumer built and ran: ${out}")
