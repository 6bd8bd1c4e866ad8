# SPDX-License-Identifier: BSL-1.0
# Tests of the planner sub-commands (sweep, emit, import, charts): their functions through doctest,
# the binary through ctest.
add_executable(test_planner test_planner.cpp)
target_link_libraries(test_planner PRIVATE memalg_cli memalg_doctest_main doctest::doctest)
target_compile_definitions(test_planner PRIVATE MEMALG_TEST_DATA="${PROJECT_SOURCE_DIR}/tests/data")
add_test(NAME planner.unit COMMAND test_planner)
memalg_cli_test_flags(test_planner planner.unit)
set_tests_properties(planner.unit PROPERTIES LABELS "host;cli")

set(_hf ${PROJECT_SOURCE_DIR}/tests/data/hf)
set(_out ${CMAKE_CURRENT_BINARY_DIR}/planner_tests)
file(MAKE_DIRECTORY ${_out})

# Bad input: non-zero exit, exactly one line on stderr, nothing on stdout.
set(_planner_bad_inputs
  "sweep --params 7B"
  "sweep --params 7B --world 0"
  "sweep --params 7B --world 8 --zero 0,5"
  "sweep --params 7B --world 8 --tp 3,,4"
  "sweep --params 7B --world 8 --dp 8"
  "sweep --params 7B --world 8 --sort fastest"
  "sweep --params 7B --world 8 --top 0"
  "sweep --params 7B --world 8 --micro-batch 0"
  "sweep --params 7B --world 8 --svg ${_out}/no/such/dir/x.svg"
  "sweep --world 8"
  "import ${_hf}/no-such-file.json"
  "import ${_hf}"
  "import ${PROJECT_SOURCE_DIR}/tools/planner_tests.cmake"
  "plan --config ${_hf}/no-such-file.json"
  "plan --config ${_hf}/gpt2.json --params 7B"
  "plan --config ${_hf}/gpt2.json --attention eager"
  "plan --params 7B --attention naive"
  "plan --preset speech-tts-500m --attention flash"
  "plan --params 7B --svg ${_out}/no/such/dir/x.svg"
  "emit --params 7B --namespace 1bad"
  "emit --params 7B -o ${_out}/no/such/dir/x.hpp")
set(_i 0)
foreach(args IN LISTS _planner_bad_inputs)
  math(EXPR _i "${_i} + 1")
  add_test(NAME planner.bad_input.${_i}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${args}" -DEXPECT=bad
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
  set_tests_properties(planner.bad_input.${_i} PROPERTIES LABELS "host;cli")
endforeach()

# Output that must match.
function(memalg_planner_ok name args match)
  add_test(NAME planner.${name} COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${args}"
           -DEXPECT=ok "-DMATCH=${match}" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
  set_tests_properties(planner.${name} PROPERTIES LABELS "host;cli")
endfunction()
memalg_planner_ok(sweep_json
  "sweep --config ${_hf}/llama-2-7b.json --seq 4096 --world 8 --micro-batch 1,2,4 --recompute none,full --json"
  "\"evaluated\": [0-9]+,.*\"feasible\": [1-9][0-9]*,.*\"results\": \\[.*\"config\".*\"per_rank\"")
memalg_planner_ok(sweep_table "sweep --params 7.5e9 --precision mixed-fp16 --optimizer adam --world 64 --tp 1 --pp 1 --cp 1"
  "best 3 by memory")
memalg_planner_ok(sweep_nothing_fits "sweep --params 175B --world 8" "nothing fits. The closest")
# Identical plans are listed once: at dp = 1 ZeRO-0, 1 and 2 are one plan (ZeRO shards over dp x cp).
set(_folds "sweep --config ${_hf}/llama-2-7b.json --seq 4096 --world 8 --micro-batch 1,2,4,8 --recompute none,selective,full --global-batch 64 --top 3 --stack paper")
memalg_planner_ok(sweep_folds "${_folds}"
  "best 3 by memory:.* 1 +1 +0 +8 +on +1 +1 +1 +full +none +14.92 GiB.* 2 +1 +0 +4 +on +2 +1 +1 +full +none +15.09 GiB.* 3 +1 +3 +8 +on +1 +1 +1 +full +none +15.11 GiB.*folded 4 more configurations")
memalg_planner_ok(sweep_folds_json "${_folds} --json"
  "\"distinct\": 3,.*\"evaluated\": 2304,.*\"folded\": 4,.*\"results\": \\[.*\"zero\": 0.*\"folded\": 2,")
memalg_planner_ok(import_table "import ${_hf}/mixtral-8x7b-v0.1.json" "parameters: +46702792704")
memalg_planner_ok(plan_config "plan --config ${_hf}/gpt2.json --seq 1024 --micro-batch 8" "fits: yes")
memalg_planner_ok(help_sweep "sweep --help" "--world")

# `memalg fit`: the largest micro-batch or sequence, with the first size that does not fit.
memalg_planner_ok(fit_table "fit --config ${_hf}/qwen2-0.5b.json --device-memory 24GB --seq 2048"
  "largest micro-batch at sequence 2048 in 1..1048576: [1-9].* yes\n.* no, short by ")
memalg_planner_ok(fit_json "fit --config ${_hf}/gpt2.json --device t4 --precision autocast-fp16 --seq 1024 --micro-batch 1..64 --json"
  "\"answer\": {.*\"headroom\": [0-9]+.*\"first_not_fitting\": {.*\"largest\": [1-9]")
memalg_planner_ok(fit_sequence "fit --config ${_hf}/llama-2-7b.json --device h200 --precision mixed-bf16 --recompute full --seq max --micro-batch 1"
  "largest sequence length at micro-batch 1 in 1..1048576: [1-9]")
memalg_planner_ok(fit_global_batch "fit --config ${_hf}/gpt2.json --device rtx4090 --seq 1024 --global-batch 512"
  "with gradient accumulation [0-9]+ [(][0-9]+ x [0-9]+ x dp 1 = 512 sequences per step[)]")
memalg_planner_ok(fit_nothing "fit --config ${_hf}/llama-2-7b.json --device-memory 24GiB --seq 4096"
  "none: even the smallest does not fit.* 1 +1 +[0-9.]+ GiB +- +no, short by")
# A sweep where nothing is valid says why; ranges where lists are; one GPU lists ZeRO-0 alone.
memalg_planner_ok(sweep_invalid_mesh "sweep --params 7B --world 8 --tp 3"
  "nothing fits. no configuration is valid: tp x pp x cp = 3 x 1 x 1 = 3 does not divide --world 8")
memalg_planner_ok(sweep_invalid_batch "sweep --config ${_hf}/llama-2-7b.json --seq 4096 --world 8 --micro-batch 4 --global-batch 2"
  "--global-batch 2 is not a multiple of dp x micro-batch")
memalg_planner_ok(sweep_interleaved "sweep --config ${_hf}/llama-2-7b.json --seq 4096 --world 8 --pp 2,4 --pp-schedule interleaved:2 --micro-batch 1..4"
  "searched 384 configurations: [1-9]")
memalg_planner_ok(sweep_one_gpu "sweep --config ${_hf}/gpt2.json --seq 1024 --world 1 --micro-batch 1..8 --top 20"
  "searched 8 configurations")
# Output files: a link, a pipe or an empty name is refused and left as it was.
add_test(NAME planner.output_refused
  COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> -DHF=${_hf} -DWORKDIR=${_out}/refused
          -P ${CMAKE_CURRENT_SOURCE_DIR}/check_output_refused.cmake)
set_tests_properties(planner.output_refused PROPERTIES LABELS "host;cli")

# Charts: written whole and well-formed (xmllint when installed; the unit test checks without it).
find_program(MEMALG_XMLLINT xmllint)
foreach(kind plan sweep serve)
  if(kind STREQUAL "plan")
    set(_args "plan --config ${_hf}/llama-2-7b.json --seq 4096 --dp 8 --zero 1 --svg ${_out}/plan.svg")
  elseif(kind STREQUAL "serve")
    set(_args "serve --config ${_hf}/llama-3-8b.json --prompt 2048 --new-tokens 512 --batch 32 --device h100-80gb --svg ${_out}/serve.svg")
  else()
    set(_args "sweep --config ${_hf}/llama-2-7b.json --seq 4096 --world 8 --micro-batch 1,2,4 --top 12 --svg ${_out}/sweep.svg")
  endif()
  add_test(NAME planner.svg_${kind}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${_args}" -DSVG=${_out}/${kind}.svg
            -DXMLLINT=${MEMALG_XMLLINT} -P ${CMAKE_CURRENT_SOURCE_DIR}/check_svg.cmake)
  set_tests_properties(planner.svg_${kind} PROPERTIES LABELS "host;cli")
endforeach()

# The step as a picture (--timeline): rendered by rsvg-convert (librsvg2-bin), the peak's marker on
# the peak's moment; and every moment's bytes against plan --json. Skipped, saying so, without
# rsvg-convert or Python.
find_program(MEMALG_RSVG_CONVERT rsvg-convert)
find_package(Python3 COMPONENTS Interpreter QUIET)
set(_timeline_render_args "--config ${_hf}/llama-2-7b.json --seq 4096 --dp 8 --zero 1")
set(_timeline_json_cases
  "llama_zero1|--config ${_hf}/llama-2-7b.json --seq 4096 --dp 8 --zero 1"
  "gpt2_checkpointed|--config ${_hf}/gpt2.json --seq 1024 --micro-batch 8 --recompute full --grad-accum 2 --dp 2"
  "speech_64|--preset speech-tts-500m --precision fp32 --optimizer adam --dp 4 --micro-batch 64 --seq 1024"
  "llama_pipeline|--config ${_hf}/llama-2-7b.json --seq 4096 --tp 2 --pp 4 --grad-accum 8 --stack megatron --recompute selective"
  "gpt2_memalg_zero3|--config ${_hf}/gpt2.json --seq 1024 --micro-batch 4 --stack memalg --dp 4 --zero 3"
  "params_only|--params 7B --dp 8 --zero 2")
if(Python3_Interpreter_FOUND AND MEMALG_RSVG_CONVERT)
  separate_arguments(_a UNIX_COMMAND "${_timeline_render_args}")
  add_test(NAME planner.timeline_render
    COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/check_timeline.py render $<TARGET_FILE:memalg_tool>
            ${MEMALG_RSVG_CONVERT} ${_out}/timeline_render ${_a})
else()
  add_test(NAME planner.timeline_render COMMAND ${CMAKE_COMMAND} -E echo "skipped: needs rsvg-convert and python3")
  set_tests_properties(planner.timeline_render PROPERTIES SKIP_REGULAR_EXPRESSION "skipped:")
endif()
set_tests_properties(planner.timeline_render PROPERTIES LABELS "host;cli")
foreach(case IN LISTS _timeline_json_cases)
  string(REPLACE "|" ";" _parts "${case}")
  list(GET _parts 0 _name)
  list(GET _parts 1 _args)
  if(Python3_Interpreter_FOUND)
    separate_arguments(_a UNIX_COMMAND "${_args}")
    add_test(NAME planner.timeline_json_${_name}
      COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/check_timeline.py json $<TARGET_FILE:memalg_tool>
              ${_out}/timeline_${_name} ${_a})
  else()
    add_test(NAME planner.timeline_json_${_name} COMMAND ${CMAKE_COMMAND} -E echo "skipped: needs python3")
    set_tests_properties(planner.timeline_json_${_name} PROPERTIES SKIP_REGULAR_EXPRESSION "skipped:")
  endif()
  set_tests_properties(planner.timeline_json_${_name} PROPERTIES LABELS "host;cli")
endforeach()

# Emitted headers compile when the plan fits and fail with its numbers when it does not.
set(_emit_cases
  "fits_params|--params 7.5e9 --precision mixed-fp16 --optimizer adam --dp 64 --zero 2|fits"
  "device_memory|--config ${_hf}/gpt2.json --seq 1024 --micro-batch 4 --precision autocast-fp16 --device-memory 16GB|fits"
  "fits_llama|--config ${_hf}/llama-2-7b.json --seq 4096 --micro-batch 2 --recompute selective --dp 4 --tp 2 --sp --zero 1|fits"
  "oom_params|--params 7.5e9 --precision mixed-fp16 --optimizer adam --dp 64|oom"
  "oom_mixtral|--config ${_hf}/mixtral-8x7b-v0.1.json --seq 4096 --dp 8 --zero 1 --device h100-80gb|oom"
  "stack_paper|--config ${_hf}/llama-2-7b.json --seq 4096 --micro-batch 1 --recompute selective --dp 4 --zero 1 --stack paper|fits"
  "stack_memalg|--config ${_hf}/gpt2.json --seq 1024 --micro-batch 4 --stack memalg|fits"
  "torch_cpu_for_loop|--config ${_hf}/gpt2.json --seq 1024 --micro-batch 2 --precision fp32 --device cpu --optimizer-impl for-loop|fits"
  "qlora_24gb|--config ${_hf}/llama-3-8b.json --seq 2048 --micro-batch 4 --precision bf16 --lora 16 --lora-dropout 0.05 --base-storage nf4-dq --device-memory 24GiB|fits"
  "lora_oom|--config ${_hf}/llama-3-8b.json --seq 2048 --precision bf16 --lora 16 --lora-targets q_proj,v_proj --device-memory 24GiB|oom")
foreach(case IN LISTS _emit_cases)
  string(REPLACE "|" ";" _parts "${case}")
  list(GET _parts 0 _name)
  list(GET _parts 1 _args)
  list(GET _parts 2 _expect)
  add_test(NAME planner.emit_${_name}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${_args}" -DEXPECT=${_expect}
            -DCOMPILER=${CMAKE_CXX_COMPILER} -DINCLUDE=${PROJECT_SOURCE_DIR}/include -DWORKDIR=${_out}/emit_${_name}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_emit.cmake)
  set_tests_properties(planner.emit_${_name} PROPERTIES LABELS "host;cli")
endforeach()

# Emitted serving headers (memalg serve --emit) likewise.
set(_emit_serve_cases
  "llama3_h100|--config ${_hf}/llama-3-8b.json --prompt 2048 --new-tokens 512 --batch 64 --device h100-80gb|fits"
  "llama3_int4_paged|--config ${_hf}/llama-3-8b.json --prompt 2048 --new-tokens 512 --weights awq-int4 --cache paged --kv-dtype fp8 --device h100-80gb|fits"
  "llama3_24gb_oom|--config ${_hf}/llama-3-8b.json --prompt 4096 --batch 16 --device rtx3090|oom")
foreach(case IN LISTS _emit_serve_cases)
  string(REPLACE "|" ";" _parts "${case}")
  list(GET _parts 0 _name)
  list(GET _parts 1 _args)
  list(GET _parts 2 _expect)
  add_test(NAME planner.emit_serve_${_name}
    COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${_args}" -DEXPECT=${_expect}
            -DCOMPILER=${CMAKE_CXX_COMPILER} -DINCLUDE=${PROJECT_SOURCE_DIR}/include -DWORKDIR=${_out}/emit_serve_${_name}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_emit_serve.cmake)
  set_tests_properties(planner.emit_serve_${_name} PROPERTIES LABELS "host;cli")
endforeach()

# The committed PyTorch ground truth (bench/torch/measured.json) read without torch.
add_executable(test_measured test_measured.cpp)
target_link_libraries(test_measured PRIVATE memalg_cli memalg_doctest_main doctest::doctest)
target_compile_definitions(test_measured PRIVATE MEMALG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME planner.measured COMMAND test_measured)
memalg_cli_test_flags(test_measured planner.measured)
set_tests_properties(planner.measured PROPERTIES LABELS "host;cli;accuracy")

add_executable(test_serve test_serve.cpp)
target_link_libraries(test_serve PRIVATE memalg_cli memalg_doctest_main doctest::doctest)
target_compile_definitions(test_serve PRIVATE MEMALG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME planner.serve COMMAND test_serve)
memalg_cli_test_flags(test_serve planner.serve)
set_tests_properties(planner.serve PROPERTIES LABELS "host;cli;accuracy")
