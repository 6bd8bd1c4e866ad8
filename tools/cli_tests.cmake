# SPDX-License-Identifier: BSL-1.0
# Tests of the command-line tool: its functions through doctest, the binary through ctest.
add_executable(test_cli test_cli.cpp)
target_link_libraries(test_cli PRIVATE memalg_cli memalg_doctest_main doctest::doctest)
add_test(NAME cli.unit COMMAND test_cli)
set_tests_properties(cli.unit PROPERTIES LABELS "host;cli")

# Bad input: non-zero exit, exactly one line on stderr, nothing on stdout.
set(_bad_inputs
  "plan --params 7B --frobnicate"
  "plan --params 7B --dp 0"
  "plan --params abc"
  "plan --params -5"
  "plan --params 1.5"
  "plan --params 7B --zero 4"
  "plan --params 7B --precision fp64"
  "plan --params 7B --optimizer adagrad"
  "plan --params 7B --device tpu"
  "plan --params 7B --memory-cap 1.5"
  "plan --params 7B --memory-cap nan"
  "plan --params 7B --offload params"
  "plan --params 7B --ep 3 --dp 4"
  "plan --params 7B --tp 99999999999999999999"
  "plan --params 7B --stack deepspeed"
  "plan --params 7B --pp 2 --stage 2"
  "plan --params 7B --stage x"
  "plan --params 7B --optimizer-impl vectorized"
  "plan"
  "frobnicate")
set(_i 0)
foreach(args IN LISTS _bad_inputs)
  math(EXPR _i "${_i} + 1")
  add_test(NAME cli.bad_input.${_i}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${args}" -DEXPECT=bad
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
  set_tests_properties(cli.bad_input.${_i} PROPERTIES LABELS "host;cli")
endforeach()

add_test(NAME cli.stack COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool>
         "-DARGS=plan --preset gpt2-124m --seq 1024 --stack memalg --json"
         -DEXPECT=ok "-DMATCH=\"stack\": \"memalg\"" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
set_tests_properties(cli.stack PROPERTIES LABELS "host;cli")
add_test(NAME cli.help COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=plan --help"
         -DEXPECT=ok -DMATCH=--params -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
add_test(NAME cli.table COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool>
         "-DARGS=plan --params 7.5e9 --precision amp-fp16 --optimizer adam --dp 64 --zero 3"
         -DEXPECT=ok "-DMATCH=fits: yes" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
add_test(NAME cli.json COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool>
         "-DARGS=plan --params 175B --precision amp-fp16 --optimizer adam --dp 8 --json"
         -DEXPECT=ok "-DMATCH=\"fits\": false" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
set_tests_properties(cli.help cli.table cli.json PROPERTIES LABELS "host;cli")

# Layer-level models, recipes and schedules (--preset, the transformer shape, --seq, ...).
set(_layer_bad_inputs
  "plan --preset llama2-7b --tp 3 --seq 4096"
  "plan --preset gpt2-124m --pp 16"
  "plan --preset gpt2-124m --seq 4096"
  "plan --preset gpt-5"
  "plan --params 7B --preset llama2-7b"
  "plan --preset llama2-7b --recompute sometimes"
  "plan --preset llama2-7b --recompute every:0"
  "plan --preset llama2-7b --pp 2 --pp-schedule zigzag"
  "plan --preset llama2-7b --sp"
  "plan --preset llama2-7b --cp 3 --seq 4096"
  "plan --preset gpt2-124m --dropout 1.5"
  "plan --layers 12 --hidden 768"
  "plan --preset speech-tts-500m --layers 2")
set(_i 0)
foreach(args IN LISTS _layer_bad_inputs)
  math(EXPR _i "${_i} + 1")
  add_test(NAME cli.layer_bad_input.${_i}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${args}" -DEXPECT=bad
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
  set_tests_properties(cli.layer_bad_input.${_i} PROPERTIES LABELS "host;cli")
endforeach()
add_test(NAME cli.preset_table COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool>
         "-DARGS=plan --preset speech-tts-500m --precision fp32 --optimizer adam --dp 4 --micro-batch 16 --seq 1024"
         -DEXPECT=ok "-DMATCH=decoder.block +16" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
add_test(NAME cli.shape_json COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool>
         "-DARGS=plan --layers 24 --hidden 1024 --heads 16 --kv-heads 4 --ffn 2816 --vocab 32000 --swiglu --untied --norm rmsnorm --attention flash --dropout 0.1 --micro-batch 4 --seq 2048 --grad-accum 8 --recompute every:2 --tp 2 --sp --pp 2 --pp-schedule interleaved:3 --cp 2 --json"
         -DEXPECT=ok "-DMATCH=\"per_layer\"" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
set_tests_properties(cli.preset_table cli.shape_json PROPERTIES LABELS "host;cli")

# The version: `memalg --version` prints the CMake project version (through the generated
# memalg/version.hpp) and exits 0.
add_test(NAME cli.version COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=--version"
         -DEXPECT=ok "-DMATCH=^memalg ${PROJECT_VERSION}\n$" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
set_tests_properties(cli.version PROPERTIES LABELS "host;cli")
