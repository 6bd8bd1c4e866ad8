# SPDX-License-Identifier: BSL-1.0
# Builds the Debian package with CPack, unpacks it into a scratch root with `dpkg -x` (no
# installation on this machine), checks its control data and its files, runs the packaged tool,
# and builds the package consumer against the unpacked /usr.
include(${CMAKE_CURRENT_LIST_DIR}/consume.cmake)
file(REMOVE_RECURSE ${WORKDIR})
file(MAKE_DIRECTORY ${WORKDIR})
execute_process(COMMAND ${CPACK} -G DEB --config ${BINARY_DIR}/CPackConfig.cmake -B ${WORKDIR}/cpack
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cpack -G DEB failed (${rc}):\n${out}${err}")
endif()
file(GLOB debs ${WORKDIR}/cpack/*.deb)
list(LENGTH debs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected one .deb in ${WORKDIR}/cpack, found ${n}: ${debs}")
endif()
message(STATUS "package: ${debs}")

execute_process(COMMAND dpkg-deb --field ${debs} Package Version Depends Architecture
  RESULT_VARIABLE rc OUTPUT_VARIABLE control)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dpkg-deb --field failed (${rc})")
endif()
message(STATUS "control:\n${control}")
foreach(re "Package: memalg" "Version: ${VERSION}" "Depends:.*libboost-dev \\(>= 1\\.71\\)" "Depends:.*libstdc\\+\\+6")
  if(NOT control MATCHES "${re}")
    message(FATAL_ERROR "the package's control data lacks '${re}':\n${control}")
  endif()
endforeach()

execute_process(COMMAND dpkg -x ${debs} ${WORKDIR}/root RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "dpkg -x failed (${rc})")
endif()
set(root ${WORKDIR}/root/usr)
foreach(f include/memalg/memalg.hpp include/memalg/version.hpp share/doc/memalg/LICENSE
          share/doc/memalg/NOTICE share/doc/memalg/CHANGELOG.md share/doc/memalg/index.md
          lib/cmake/memalg/memalgConfig.cmake lib/cmake/memalg/memalgConfigVersion.cmake bin/memalg)
  if(NOT EXISTS ${root}/${f})
    message(FATAL_ERROR "the package lacks /usr/${f}")
  endif()
endforeach()
execute_process(COMMAND ${root}/bin/memalg --version RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out STREQUAL "memalg ${VERSION}\n")
  message(FATAL_ERROR "the packaged tool's --version: exit ${rc}, '${out}'")
endif()
memalg_consume(${root} ${WORKDIR}/build ${MEMALG_MAJOR_MINOR})
