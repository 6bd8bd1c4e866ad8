# SPDX-License-Identifier: BSL-1.0
# Tests of the command-line tool: its functions through doctest, the binary through ctest.
add_executable(test_cli test_cli.cpp)
target_link_libraries(test_cli PRIVATE memalg_cli memalg_doctest_main doctest::doctest)
target_compile_definitions(test_cli PRIVATE MEMALG_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME cli.unit COMMAND test_cli)
memalg_cli_test_flags(test_cli cli.unit)
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
         "-DARGS=plan --params 7.5e9 --precision mixed-fp16 --optimizer adam --dp 64 --zero 3"
         -DEXPECT=ok "-DMATCH=fits: yes" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
add_test(NAME cli.json COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool>
         "-DARGS=plan --params 175B --precision mixed-fp16 --optimizer adam --dp 8 --json"
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

# The single-GPU user's inputs: each refused with its own one-line reason, exit status 2.
function(memalg_cli_refused name args err)
  add_test(NAME cli.refused.${name} COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${args}"
           -DEXPECT=bad -DRC=2 "-DERR_MATCH=${err}" -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
  set_tests_properties(cli.refused.${name} PROPERTIES LABELS "host;cli")
endfunction()
memalg_cli_refused(no_seq "plan --preset gpt2-124m --device rtx4090" "give --seq N .* or --states-only")
memalg_cli_refused(emit_no_seq "emit --preset gpt2-124m" "give --seq N")
memalg_cli_refused(sweep_no_seq "sweep --preset gpt2-124m --world 2" "give --seq N")
memalg_cli_refused(overflow "plan --preset llama2-7b --seq 16777216 --micro-batch 16777216"
  "--micro-batch 16777216 with --seq 16777216 makes a byte count past 64 bits")
memalg_cli_refused(emit_overflow "emit --preset llama2-7b --seq 16777216 --micro-batch 16777216" "--micro-batch 16777216")
memalg_cli_refused(reserve_huge "plan --params 7B --reserve-mib 9999999999999999999" "--reserve-mib .* leaves nothing")
memalg_cli_refused(reserve_device "plan --params 7B --reserve-mib 81920" "--reserve-mib 81920 leaves nothing")
memalg_cli_refused(fp8_a100 "plan --params 7B --precision fp8 --device a100-80gb" "no fp8 tensor cores")
memalg_cli_refused(bf16_v100 "plan --params 7B --precision bf16 --device v100-32gb" "no bfloat16")
memalg_cli_refused(autocast_t4 "plan --params 1B --device t4" "--precision autocast-bf16 on t4")
memalg_cli_refused(capacity_unit "plan --params 7B --device-memory 24" "a capacity with a unit")
memalg_cli_refused(two_devices "plan --params 7B --device h200 --device-memory 24GB" "give one")
memalg_cli_refused(namespace_keyword "emit --params 7B --namespace class" "'class' is a C[+][+] keyword")
memalg_cli_refused(unknown_subcommand "frobnicate --params 7B" "'frobnicate' is not a sub-command: plan, fit")
memalg_cli_refused(twice "plan --params 7B --dp 2 --dp 4" "^memalg: error: --dp takes one value")
memalg_cli_refused(extra "plan --params 7B --seq 1 2" "^memalg: error: unexpected '2'")
memalg_cli_refused(not_a_flag "sweep --params 7B --world 8 --stage 0" "'--stage' is not a flag of `memalg sweep`")
memalg_cli_refused(states_only_seq "plan --preset gpt2-124m --states-only --seq 1024" "without --seq")
memalg_cli_refused(fit_no_layers "fit --params 7B --seq 1024" "fit needs a model with layers")
memalg_cli_refused(fit_no_seq "fit --preset gpt2-124m" "fit needs --seq")
memalg_cli_refused(fit_range "fit --preset gpt2-124m --seq 1024 --micro-batch 8..2" "is empty")
memalg_cli_refused(sweep_wide_range "sweep --preset gpt2-124m --seq 1024 --world 1 --micro-batch 1..64"
  "--micro-batch 1[.][.]64 is 64 choices, more than the 32 .*memalg fit --micro-batch 1[.][.]64")
memalg_cli_refused(fit_no_divisor "fit --preset gpt2-124m --seq 1024 --micro-batch 5..7 --global-batch 8" "no micro-batch in 5..7 divides the 8 sequences")
# --stack megatron refuses what Megatron-core does not implement (Llama 4's chunked attention) and
# what its rules do not follow (docs/algebra.md, "The megatron stack"): exit status 2, one line.
set(_hf_configs ${PROJECT_SOURCE_DIR}/tests/data/hf)
memalg_cli_refused(megatron_llama4 "plan --config ${_hf_configs}/llama-4-scout.json --seq 4096 --stack megatron"
  "^memalg: error: Megatron-core does not implement Llama 4: it has no chunked attention")
memalg_cli_refused(megatron_mla "plan --config ${_hf_configs}/deepseek-v3.json --seq 4096 --stack megatron"
  "^memalg: error: Transformer Engine trains this latent attention's heads [(]query and key wider than the values[)] with neither cuDNN's fused kernel nor flash-attention on this device")
memalg_cli_refused(megatron_mla_tp "plan --config ${_hf_configs}/deepseek-v3.json --seq 4096 --tp 2 --sp --device h100-80gb --stack megatron"
  "^memalg: error: the megatron stack models multi-head latent attention [(]Megatron-core's MLASelfAttention[)] on one tensor-parallel and one context-parallel rank")
memalg_cli_refused(megatron_olmo2 "plan --config ${_hf_configs}/olmo-2-7b.json --seq 4096 --stack megatron"
  "^memalg: error: the megatron stack does not model norms after the sub-layers")
memalg_cli_refused(megatron_softcap "plan --config ${_hf_configs}/gemma-2-9b.json --seq 4096 --stack megatron"
  "^memalg: error: the megatron stack does not model soft-capped attention scores or logits")
memalg_cli_refused(megatron_moe_tp "plan --layers 4 --hidden 512 --heads 8 --vocab 50304 --ffn 1344 --swiglu --no-linear-bias --experts 4 --top-k 1 --moe-router sinkhorn --seq 1024 --dp 2 --tp 2 --stack megatron"
  "^memalg: error: the megatron stack models mixture-of-experts layers on one tensor-parallel rank")
memalg_cli_refused(pytorch_sinkhorn "plan --layers 4 --hidden 512 --heads 8 --vocab 50304 --ffn 1344 --swiglu --experts 4 --top-k 1 --moe-router sinkhorn --seq 1024"
  "^memalg: error: a Sinkhorn router is Megatron's")

# memalg serve's refusals (docs/serving.md).
memalg_cli_refused(serve_no_prompt "serve --preset llama3-8b" "^memalg: error: memalg serve needs --prompt N")
memalg_cli_refused(serve_bad_cache "serve --preset llama3-8b --prompt 8 --cache ring" "^memalg: error: unknown --cache 'ring'")
memalg_cli_refused(serve_bad_weights "serve --preset llama3-8b --prompt 8 --weights int3" "^memalg: error: unknown --weights 'int3'")
memalg_cli_refused(serve_block_size "serve --preset llama3-8b --prompt 8 --block-size 32" "it needs --cache paged or --stack megatron")
memalg_cli_refused(serve_megatron_buffer "serve --preset llama3-8b --prompt 8 --stack megatron" "needs --kv-buffer SIZE")
memalg_cli_refused(serve_short_static "serve --preset llama3-8b --prompt 64 --cache static --max-cache-len 32" "max_cache_len is shorter")
memalg_cli_refused(serve_memalg_tp "serve --preset llama3-8b --prompt 64 --new-tokens 8 --stack memalg --tp 2"
  "^memalg: error: the memalg runtime generates on one device")
memalg_cli_refused(serve_memalg_cache "serve --preset llama3-8b --prompt 64 --stack memalg --cache static"
  "^memalg: error: --stack memalg keeps one cache buffer per layer: give no --cache")
memalg_cli_refused(serve_memalg_moe "serve --config ${_hf_configs}/qwen3-30b-a3b.json --prompt 64 --new-tokens 8 --stack memalg"
  "^memalg: error: the memalg runtime generates with sequential dense blocks")

# What the single-GPU user sees.
function(memalg_cli_ok name args match)
  add_test(NAME cli.${name} COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:memalg_tool> "-DARGS=${args}"
           -DEXPECT=ok "-DMATCH=${match}" ${ARGN} -P ${CMAKE_CURRENT_SOURCE_DIR}/check_cli.cmake)
  set_tests_properties(cli.${name} PROPERTIES LABELS "host;cli")
endfunction()
memalg_cli_ok(serve_table "serve --preset llama3-8b --prompt 2048 --new-tokens 512 --batch 32 --device h100-80gb"
  "peak: .* in prefill .*kv cache: +128.00 KiB per token and sequence.*largest batch at 2048 [+] 512 tokens: [0-9]+")
memalg_cli_ok(serve_paged "serve --preset llama3-8b --prompt 2048 --new-tokens 512 --cache paged --device h100-80gb"
  "blocks: +[0-9]+ blocks of 2.00 MiB: [0-9]+ sequences of 2560 tokens at once.*validated: +no")
# memalg's runtime: 32 layers of 4 × 2559 positions × 2 × 8 heads × 128 × bf16 = 39.98 MiB a
# layer, after the 14.96 GiB of weights.
memalg_cli_ok(serve_memalg "serve --preset llama3-8b --prompt 2048 --new-tokens 512 --batch 4 --stack memalg --device h100-80gb"
  "engine: +memalg's runtime, one arena [(]the cache at 14.96 GiB, 39.98 MiB a layer[)].*kv cache +1.25 GiB")
memalg_cli_ok(states_only "plan --preset gpt2-124m --device rtx4090 --states-only"
  "fits: yes.*note: model states only [(]--states-only[)]")
memalg_cli_ok(states_alone_do_not_fit "plan --preset llama2-70b --device l4"
  "fits: NO.*the model states alone do not fit")
memalg_cli_ok(sweep_states_only "sweep --preset gpt2-124m --world 2 --states-only" "note: model states only")
memalg_cli_ok(default_precision "plan --preset gpt2-124m --seq 1024" "precision autocast-bf16")
memalg_cli_ok(megatron_precision "plan --preset gpt2-124m --seq 1024 --stack megatron" "precision mixed-bf16-fp32-grads")
# Expert parallelism and the softmax router under megatron: planned, and said to be outside the
# measured envelope.
memalg_cli_ok(megatron_moe_ep "plan --layers 4 --hidden 512 --heads 8 --vocab 50304 --positions 1024 --ffn 1344 --swiglu --no-linear-bias --experts 4 --top-k 1 --moe-router sinkhorn --attention flash --seq 1024 --micro-batch 4 --dp 8 --ep 2 --optimizer adam --device h100-80gb --stack megatron"
  "ep=2 .*note: outside the megatron stack's measured envelope [(]ep: 2 [(]measured 1[.][.]1[)][)]")
memalg_cli_ok(megatron_mixtral "plan --config ${_hf_configs}/mixtral-8x7b-v0.1.json --seq 4096 --dp 8 --ep 8 --pp 4 --recompute full --device h100-80gb --stack megatron"
  "stack megatron.*note: outside the megatron stack's measured envelope [(]family: mixtral, .*moe: softmax[)]")
memalg_cli_ok(megatron_mixtral_alltoall "plan --config ${_hf_configs}/mixtral-8x7b-v0.1.json --seq 4096 --dp 8 --ep 8 --pp 4 --recompute full --moe-dispatcher alltoall --device h100-80gb --stack megatron"
  "stack megatron.*note: outside the megatron stack's measured envelope [(]family: mixtral, .*moe: softmax [+] alltoall[)]")
memalg_cli_refused(pytorch_alltoall "plan --config ${_hf_configs}/mixtral-8x7b-v0.1.json --seq 4096 --moe-dispatcher alltoall"
  "^memalg: error: the all-to-all token dispatcher is Megatron's")
memalg_cli_ok(megatron_qwen3_moe "plan --config ${_hf_configs}/qwen3-30b-a3b.json --seq 4096 --dp 8 --ep 8 --recompute full --device h100-80gb --stack megatron"
  "stack megatron.*note: outside the megatron stack's measured envelope [(]family: qwen3_moe, .*moe: softmax, qk-norm: per head[)]")
memalg_cli_ok(megatron_deepseek_v3 "plan --config ${_hf_configs}/deepseek-v3.json --seq 4096 --dp 64 --ep 64 --pp 16 --recompute full --device h100-80gb --stack megatron"
  "stack megatron.*note: outside the megatron stack's measured envelope [(]family: deepseek_v3, .*moe: sigmoid[)]")
memalg_cli_ok(megatron_router_fp32 "plan --layers 12 --hidden 512 --heads 8 --vocab 50304 --positions 1024 --ffn 1024 --no-linear-bias --experts 8 --top-k 2 --moe-router-dtype fp32 --attention flash --dropout 0.1 --seq 1024 --micro-batch 4 --dp 8 --ep 8 --zero 1 --optimizer adam --device h100-80gb --stack megatron"
  "ep=8 .*note: outside the megatron stack's measured envelope [(]ep: 8 [(]measured 1[.][.]1[)], moe: softmax[)]")
memalg_cli_refused(pytorch_router_fp32 "plan --config ${_hf_configs}/mixtral-8x7b-v0.1.json --seq 4096 --moe-router-dtype fp32"
  "^memalg: error: --moe-router-dtype is Megatron's")
memalg_cli_ok(megatron_gpt_oss "plan --config ${_hf_configs}/gpt-oss-20b.json --seq 4096 --dp 8 --ep 8 --device h100-80gb --stack megatron"
  "stack megatron.*note: outside the megatron stack's measured envelope [(]family: gpt_oss, .*moe: softmax[)]")
memalg_cli_ok(megatron_moe "plan --layers 4 --hidden 512 --heads 8 --vocab 50304 --positions 1024 --ffn 1344 --swiglu --no-linear-bias --experts 4 --top-k 1 --moe-router sinkhorn --attention flash --dropout 0.1 --seq 1024 --micro-batch 4 --dp 8 --optimizer adam --device h100-80gb --stack megatron --json"
  "\"parameters\": 63521792")
memalg_cli_ok(deprecated_precision "plan --params 7B --precision amp-bf16" "precision mixed-bf16-fp32-grads"
  "-DERR_MATCH=^memalg: note: --precision amp-bf16 is deprecated")
memalg_cli_ok(precision_help "plan --help" "autocast-fp16 +the Trainer's fp16=True")
memalg_cli_ok(device_memory "plan --params 1B --device-memory 24GiB --json" "\"capacity\": 25769803776")
memalg_cli_ok(devices "devices" "t4.*capacity 16106127360 B.*no bf16.*h100-nvl.*rtx5090")
memalg_cli_ok(tebibytes "plan --params 175B --precision fp32" "weights +651[.]93 GiB.*optimizer_states +1[.]27 TiB.*total [(]peak[)] +2[.]55 TiB")
memalg_cli_ok(preset_vs_config "plan --preset gpt2-124m --precision fp32 --micro-batch 8 --seq 1024"
  "note: --config with this model's Hugging Face config.json plans")
