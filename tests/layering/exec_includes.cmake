# SPDX-License-Identifier: BSL-1.0
# The exec/ include check (cmake/check_exec_includes.cmake, SCRIPT): the source tree (SOURCE_DIR)
# passes; a small tree passes while its exec/ includes no backend, then fails naming the file and
# line of each one that does, in exec/ and in its subfolders.
function(run_check dir out_rc out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DMEMALG_SOURCE_DIR=${dir} -P ${SCRIPT}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  set(${out_rc} ${_rc} PARENT_SCOPE)
  set(${out_text} "${_out}${_err}" PARENT_SCOPE)
endfunction()

run_check(${SOURCE_DIR} rc text)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the source tree's exec/ includes a backend:\n${text}")
endif()

set(tree ${WORKDIR}/exec_includes)
file(REMOVE_RECURSE ${tree})
file(WRITE ${tree}/include/memalg/exec/clean.hpp
     "// includes; [brackets] and \"memalg/backend/cpu/linear.hpp\" in a comment\n#include \"memalg/exec/program.hpp\"\n")
run_check(${tree} rc text)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a tree without backend includes was refused:\n${text}")
endif()

file(WRITE ${tree}/include/memalg/exec/mixed.hpp
     "// x; y\n\n#include <memalg/exec/run.hpp>\n  #  include <memalg/backend/cpu/linear.hpp>\n#include \"../backend/cpu/gpt_run.hpp\"\n")
# a front-end's folder is checked too
file(WRITE ${tree}/include/memalg/exec/front/nested.hpp
     "#include \"memalg/exec/program.hpp\"\n#include \"../../backend/cuda/gpt_run.cuh\"\n")
run_check(${tree} rc text)
if(rc EQUAL 0)
  message(FATAL_ERROR "exec/mixed.hpp includes backend headers, but the check passed:\n${text}")
endif()
foreach(expect "include/memalg/exec/mixed.hpp:4: #  include <memalg/backend/cpu/linear.hpp>"
               "include/memalg/exec/mixed.hpp:5: #include \"../backend/cpu/gpt_run.hpp\""
               "include/memalg/exec/front/nested.hpp:2: #include \"../../backend/cuda/gpt_run.cuh\"")
  string(FIND "${text}" "${expect}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the check's message lacks `${expect}`:\n${text}")
  endif()
endforeach()
if(text MATCHES "clean\\.hpp")
  message(FATAL_ERROR "the check names a file without backend includes:\n${text}")
endif()
message(STATUS "exec/ includes no backend; the check names file and line")
