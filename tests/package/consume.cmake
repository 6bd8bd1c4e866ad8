# SPDX-License-Identifier: BSL-1.0
# memalg_consume(PREFIX DIR REQUEST) configures, builds and runs tests/package/consumer against the
# memalg package installed under PREFIX, asking find_package for REQUEST, and checks that the
# consumer prints memalg VERSION. Needs SOURCE_DIR, WORKDIR, GENERATOR, CXX and VERSION set.
# memalg_refuse(PREFIX DIR REQUEST) checks that the same configuration fails because the installed
# version is not compatible with REQUEST.
function(_memalg_configure prefix dir request)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${dir}
    -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
    -DMEMALG_REQUEST=${request}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(_rc ${rc} PARENT_SCOPE)
  set(_out "${out}${err}" PARENT_SCOPE)
endfunction()

function(memalg_consume prefix dir request)
  _memalg_configure(${prefix} ${dir} "${request}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "configuring the consumer (find_package(memalg ${request})) failed:\n${_out}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${dir} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building the consumer failed:\n${out}${err}")
  endif()
  execute_process(COMMAND ${dir}/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the consumer failed (${rc}):\n${out}")
  endif()
  if(NOT out MATCHES "^memalg ${VERSION}: ")
    message(FATAL_ERROR "the consumer compiled against another version than ${VERSION}: ${out}")
  endif()
  message(STATUS "consumer (find_package(memalg ${request})): ${out}")
endfunction()

function(memalg_refuse prefix dir request)
  _memalg_configure(${prefix} ${dir} "${request}")
  if(_rc EQUAL 0)
    message(FATAL_ERROR "find_package(memalg ${request}) accepted version ${VERSION}")
  endif()
  if(NOT _out MATCHES "compatible[ \n]+with[ \n]+requested[ \n]+version[ \n]+\"${request}\"")
    message(FATAL_ERROR "find_package(memalg ${request}) failed for another reason:\n${_out}")
  endif()
  message(STATUS "find_package(memalg ${request}) refuses version ${VERSION}, as it must")
endfunction()

# The smallest version above VERSION that SameMinorVersion compatibility must refuse.
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _mm "${VERSION}")
math(EXPR _next_minor "${CMAKE_MATCH_2} + 1")
set(MEMALG_NEXT_MINOR "${CMAKE_MATCH_1}.${_next_minor}")
set(MEMALG_MAJOR_MINOR "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
