#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# bench/gpu/prepare_deps.sh — copies the header-only dependencies into .deps/ (ignored by git) so
# that bench/gpu/run.sh can configure and build on a machine that has a CUDA toolkit, CMake and
# ninja but not these packages. Run it here, where they are installed; carry .deps/ along.
#
#   .deps/include/boost/{hana,hana.hpp,version.hpp}   Boost.Hana, the only Boost memalg uses
#   .deps/include/{doctest,nlohmann,CLI,fmt}          doctest (tests), JSON/CLI11/fmt (the tool)
#   .deps/lib/cmake/<pkg>/<pkg>Config.cmake           minimal packages for find_package(doctest,
#                                                     CLI11, nlohmann_json): INTERFACE targets
# The top-level CMakeLists.txt takes Boost from MEMALG_BOOST_INCLUDE_DIR when no Boost package is
# found. Afterwards every Boost header memalg's own headers reach is checked to come from the copy.
# Source: MEMALG_DEPS_FROM (default /usr/include).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
from=${MEMALG_DEPS_FROM:-/usr/include}
deps=$root/.deps
for need in boost/hana.hpp boost/hana boost/version.hpp doctest/doctest.h nlohmann/json.hpp CLI/CLI.hpp fmt/format.h; do
  [ -e "$from/$need" ] || { echo "prepare_deps: $from/$need not found (set MEMALG_DEPS_FROM)" >&2; exit 1; }
done
rm -rf "$deps"
mkdir -p "$deps/include/boost" "$deps/lib/cmake"
cp -r "$from/boost/hana" "$from/boost/hana.hpp" "$from/boost/version.hpp" "$deps/include/boost/"
cp -r "$from/doctest" "$from/nlohmann" "$from/CLI" "$from/fmt" "$deps/include/"

version_of() {  # the version a header tree declares, from its MAJOR/MINOR/PATCH macros
  local where=$1 prefix=$2 part out=
  for part in MAJOR MINOR PATCH; do
    out+=$(grep -rh "^#define ${prefix}${part} [0-9]" "$where" | head -1 | sed "s/^#define ${prefix}${part} \([0-9]*\).*/\1/").
  done
  out=${out%.}
  echo "${out:-0}"
}
package() {  # package target version
  local pkg=$1 target=$2 version=$3 dir=$deps/lib/cmake/$1
  mkdir -p "$dir"
  cat > "$dir/${pkg}Config.cmake" <<CONFIG
# Written by bench/gpu/prepare_deps.sh: the headers in .deps/include as ${target}.
if(NOT TARGET ${target})
  add_library(${target} INTERFACE IMPORTED)
  get_filename_component(_memalg_deps_include "\${CMAKE_CURRENT_LIST_DIR}/../../../include" ABSOLUTE)
  target_include_directories(${target} INTERFACE "\${_memalg_deps_include}")
endif()
CONFIG
  cat > "$dir/${pkg}ConfigVersion.cmake" <<CONFIG
set(PACKAGE_VERSION "${version}")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CONFIG
}
package doctest doctest::doctest "$(version_of "$deps/include/doctest" DOCTEST_VERSION_)"
package CLI11 CLI11::CLI11 "$(version_of "$deps/include/CLI" CLI11_VERSION_)"
package nlohmann_json nlohmann_json::nlohmann_json "$(version_of "$deps/include/nlohmann" NLOHMANN_JSON_VERSION_)"

# Every Boost header the library reaches must come from the copy.
if command -v g++ > /dev/null; then
  for h in memalg/memalg.hpp memalg/plan/search_hana.hpp; do
    missing=$(g++ -std=c++20 -I"$root/include" -I"$deps/include" -M -x c++ "$root/include/$h" | tr ' \\' '\n\n' |
              grep '/boost/' | grep -v "^$deps/" || true)
    if [ -n "$missing" ]; then
      echo "prepare_deps: $h reaches Boost headers outside the copy:" >&2
      echo "$missing" >&2
      exit 1
    fi
  done
fi
size=$(du -sk "$deps" | cut -f1)
echo "prepare_deps: $deps holds $((size / 1024)) MiB ($size KiB)"
if [ "$size" -gt 16384 ]; then
  echo "prepare_deps: more than 16 MiB; the carried tree must stay well under 64 MiB" >&2
  exit 1
fi
