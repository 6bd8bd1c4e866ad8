# SPDX-License-Identifier: BSL-1.0
# exec/ is host-only and backend-neutral: the step program, its builder, its interpreter and the
# plan-side rules include no backend. memalg_check_exec_includes(SOURCE_DIR) fails, naming file and
# line, when a file of SOURCE_DIR/include/memalg/exec/ or of its front-end folders (exec/gpt/,
# exec/speech/, ...) includes a backend header (`#include "memalg/backend/...`,
# `<memalg/backend/...`, or a relative `../backend/...`, `../../backend/...`).
#   include(cmake/check_exec_includes.cmake)   at configure time (the top-level CMakeLists.txt)
#   cmake -DMEMALG_SOURCE_DIR=<dir> -P cmake/check_exec_includes.cmake   as a build step
if(CMAKE_SCRIPT_MODE_FILE AND NOT CMAKE_PARENT_LIST_FILE)
  cmake_minimum_required(VERSION 3.25)  # -P: the policies the project sets (IN_LIST)
endif()

function(memalg_check_exec_includes source_dir)
  file(GLOB_RECURSE _files RELATIVE ${source_dir} ${source_dir}/include/memalg/exec/*)
  list(SORT _files)
  set(_found "")
  foreach(_f IN LISTS _files)
    if(IS_DIRECTORY ${source_dir}/${_f})
      continue()
    endif()
    file(STRINGS ${source_dir}/${_f} _hits REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](memalg/|(\\.\\./)+)backend/")
    if(NOT _hits)
      continue()
    endif()
    file(READ ${source_dir}/${_f} _text)
    set(_from 0)
    foreach(_hit IN LISTS _hits)
      # The line number: newlines before the hit, searched from the end of the previous one.
      string(SUBSTRING "${_text}" ${_from} -1 _rest)
      string(FIND "${_rest}" "${_hit}" _pos)
      math(EXPR _at "${_from} + ${_pos}")
      string(SUBSTRING "${_text}" 0 ${_at} _before)
      string(REGEX MATCHALL "\n" _newlines "${_before}")
      list(LENGTH _newlines _line)
      math(EXPR _line "${_line} + 1")
      string(STRIP "${_hit}" _hit)
      string(APPEND _found "\n  ${_f}:${_line}: ${_hit}")
      math(EXPR _from "${_at} + 1")
    endforeach()
  endforeach()
  if(NOT _found STREQUAL "")
    message(FATAL_ERROR "exec/ is host-only and includes no backend (move the backend binding under "
                        "include/memalg/backend/):${_found}")
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND NOT CMAKE_PARENT_LIST_FILE)
  if(NOT MEMALG_SOURCE_DIR)
    message(FATAL_ERROR "check_exec_includes: pass -DMEMALG_SOURCE_DIR=<source tree>")
  endif()
  memalg_check_exec_includes(${MEMALG_SOURCE_DIR})
endif()
