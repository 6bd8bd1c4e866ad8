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
#   .deps/include/kissfft, .deps/lib/libkissfft-float.so.*, .deps/lib/cmake/kissfft/,
#   .deps/share/doc/kissfft/copyright
#                                                     KissFFT (memalg/data/mel.hpp) as the target
#                                                     kissfft::kissfft-float, when it is installed
#   .deps/data/speech/                                a small speech dataset (docs/speech-data.md:
#                                                     40 utterances, no WAV files), made here by
#                                                     make_speech_data when it is built (MEMALG_SPEECH_TOOL)
#                                                     and espeak-ng is installed; configure the GPU
#                                                     build with -DMEMALG_SPEECH_DATA_DIR=<root>/.deps/data/speech
# The top-level CMakeLists.txt takes Boost from MEMALG_BOOST_INCLUDE_DIR when no Boost package is
# found. Afterwards every Boost header memalg's own headers reach is checked to come from the copy.
# Source: MEMALG_DEPS_FROM (default /usr/include); KissFFT's library from MEMALG_KISSFFT_LIB
# (default /usr/lib/x86_64-linux-gnu).
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

# KissFFT: the headers, the shared library and a package that names them (optional: without it
# the GPU build has no memalg/data/mel.hpp users, which the CMake files already allow).
kiss_lib=${MEMALG_KISSFFT_LIB:-/usr/lib/x86_64-linux-gnu}
if [ -f "$from/kissfft/kiss_fftr.h" ] && [ -e "$kiss_lib/libkissfft-float.so" ]; then
  cp -r "$from/kissfft" "$deps/include/"
  # One plain file under the library's soname (what the loader asks for): links may not travel.
  soname=$(basename "$(readlink "$kiss_lib/libkissfft-float.so" || echo libkissfft-float.so)")
  cp -L "$kiss_lib/libkissfft-float.so" "$deps/lib/$soname"
  # BSD-3-Clause: the copyright notice and license travel with the binary.
  for c in /usr/share/doc/libkissfft-float131/copyright /usr/share/doc/libkissfft-dev/copyright; do
    [ -f "$c" ] && { mkdir -p "$deps/share/doc/kissfft"; cp "$c" "$deps/share/doc/kissfft/copyright"; break; }
  done
  mkdir -p "$deps/lib/cmake/kissfft"
  cat > "$deps/lib/cmake/kissfft/kissfft-config.cmake" <<CONFIG
# Written by bench/gpu/prepare_deps.sh: KissFFT's float build in .deps as kissfft::kissfft-float.
if(NOT TARGET kissfft::kissfft-float)
  get_filename_component(_memalg_deps "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
  add_library(kissfft::kissfft-float SHARED IMPORTED)
  set_target_properties(kissfft::kissfft-float PROPERTIES
    IMPORTED_LOCATION "\${_memalg_deps}/lib/${soname}"
    IMPORTED_SONAME "${soname}"
    INTERFACE_INCLUDE_DIRECTORIES "\${_memalg_deps}/include/kissfft"
    INTERFACE_COMPILE_DEFINITIONS "kiss_fft_scalar=float;KISS_FFT_SHARED")
endif()
set(kissfft_FOUND ON)
CONFIG
  kiss_version=$(grep -h "KISSFFT_VERSION" /usr/lib/x86_64-linux-gnu/cmake/kissfft/kissfft-config.cmake 2>/dev/null |
                 sed -n 's/.*KISSFFT_VERSION \([0-9.]*\).*/\1/p' | head -1)
  echo "set(PACKAGE_VERSION \"${kiss_version:-0}\")" > "$deps/lib/cmake/kissfft/kissfft-config-version.cmake"
  echo 'set(PACKAGE_VERSION_COMPATIBLE TRUE)' >> "$deps/lib/cmake/kissfft/kissfft-config-version.cmake"
else
  echo "prepare_deps: KissFFT not found ($from/kissfft, $kiss_lib/libkissfft-float.so): not carried" >&2
fi

# A small speech dataset: the GPU machine has no espeak-ng to make one.
tool=${MEMALG_SPEECH_TOOL:-$root/build/tools/make_speech_data}
if [ -x "$tool" ] && command -v espeak-ng > /dev/null; then
  "$tool" --out "$deps/data/speech" --utterances 40 --no-wav
else
  echo "prepare_deps: no $tool or no espeak-ng: no speech dataset carried (build make_speech_data first)" >&2
fi

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
