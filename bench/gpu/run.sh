#!/usr/bin/env bash
# SPDX-License-Identifier: BSL-1.0
# bench/gpu/run.sh — the GPU benchmark in one command, run from the repository root:
#
#   bash bench/gpu/run.sh            (OUT=/some/dir to keep the logs and JSON there)
#
# For one machine with one NVIDIA GPU, nvcc, CMake, ninja and Python 3; Boost, doctest and MPI
# need not be installed: the headers come from .deps/ (bench/gpu/prepare_deps.sh writes it where
# they are installed; carry it along). It
#   1. configures a build for one architecture (MEMALG_BENCH_ARCH, default 90) without MPI and
#      builds only the GPU tests, train_gpt_cuda and train_gpt_cpu;
#   2. runs the GPU tests: every kernel against the CPU reference (the tensor- and
#      sequence-parallel ones in device.gpu.parallel: every memalg_device_* target is built and
#      every device.* test run, so a new test file is picked up), and the CUDA step backend
#      against the CPU step backend on the same step programs (GPT-2 and Llama-shaped, fp32 and
#      mixed-bf16; the speech model's, with batch norm and dropout, in device.gpu.speech_program;
#      the generation program's, in the serving plan's arena, in device.gpu.generation_program),
#      the plan's arena against the program's high-water mark (ctest, JUnit XML in $OUT/ctest.xml);
#   3. trains with train_gpt_cuda (the plan's step program on the CUDA step backend) the GPT-2
#      124M plan (mixed-bf16 AdamW, 16x1024 tokens a step) for MEMALG_BENCH_STEPS steps (default
#      40) and the tiny fp32 and bf16 plans, with --json (the multi-rank plans, tp2,
#      tp2-sp and pp2 among them, need one GPU per rank under mpirun: here only ctest's dry run checks them);
#   3a. trains the tiny fp32 plan with train_gpt_cpu too: the same program on the CPU step
#      backend, on the same batches; the first losses must agree within a relative 1e-5 and the
#      last, after 50 AdamW steps that amplify rounding differences, within 1e-2
#      ($OUT/same_program.txt);
#   3b. runs the PyTorch ground-truth harness (bench/torch/measure.py) on CUDA tensors, capped at
#      2 minutes ($OUT/measured_cuda.json), and sets the pytorch stack's plans beside it
#      ($OUT/compare_cuda.md);
#   4. prints one table: tokens/s, MFU, predicted vs measured arena, predicted vs measured device
#      peak, and every overhead layer (also $OUT/summary.md and $OUT/summary.json).
# Budget: under 8 minutes on one H200 (each stage has its own timeout; MEMALG_BENCH_BUILD_TIMEOUT
# lengthens the build's on a slow machine). Exit status: 0 when every stage passed.
#
# NCCL: the toolkit's when it has one, else a Python wheel's (nvidia-nccl-*), else none (one
# process, one rank; MEMALG_BENCH_NCCL=0 forces that).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:-$root/build-gpu-bench/results}
build=${MEMALG_BENCH_BUILD:-$root/build-gpu-bench}
arch=${MEMALG_BENCH_ARCH:-90}
steps=${MEMALG_BENCH_STEPS:-40}
jobs=${MEMALG_BENCH_JOBS:-$(nproc)}
mkdir -p "$out"
: > "$out/run.log"
status=0
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$out/run.log"; }
stage() {  # stage NAME TIMEOUT LOGFILE COMMAND...: runs, logs, records failure
  local name=$1 limit=$2 file=$3
  shift 3
  local t0=$SECONDS
  log "$name ..."
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$file" 2>&1
  local rc=$?
  log "$name: exit $rc after $((SECONDS - t0)) s (log: $file)"
  [ $rc -eq 0 ] || status=1
  return $rc
}

# ---- 0. headers, NCCL, the device -------------------------------------------------------------
if [ ! -f .deps/include/boost/hana.hpp ] || [ ! -f .deps/lib/cmake/doctest/doctestConfig.cmake ]; then
  if [ -f /usr/include/boost/hana.hpp ] && [ -f /usr/include/doctest/doctest.h ]; then
    bash bench/gpu/prepare_deps.sh | tee -a "$out/run.log"
  else
    log "no .deps/ and no Boost/doctest here: run bench/gpu/prepare_deps.sh on a machine that has them and carry .deps/"
    exit 1
  fi
fi
nccl_args=()
if [ "${MEMALG_BENCH_NCCL:-1}" = 0 ]; then
  nccl_args=(-DMEMALG_NCCL_INCLUDE_DIR=MEMALG_NCCL_INCLUDE_DIR-NOTFOUND -DMEMALG_NCCL_LIBRARY=MEMALG_NCCL_LIBRARY-NOTFOUND)
  log "NCCL: off (MEMALG_BENCH_NCCL=0)"
elif [ -f /usr/local/cuda/include/nccl.h ] || [ -f /usr/include/nccl.h ]; then
  log "NCCL: from the system"
else
  wheel=$(python3 - <<'PY' 2>/dev/null
import os
try:
    import nvidia.nccl as n
    for d in list(getattr(n, "__path__", [])):
        if os.path.isfile(os.path.join(d, "include", "nccl.h")) and os.path.isfile(os.path.join(d, "lib", "libnccl.so.2")):
            print(d)
            break
except Exception:
    pass
PY
)
  if [ -n "$wheel" ]; then
    nccl_args=(-DMEMALG_NCCL_INCLUDE_DIR="$wheel/include" -DMEMALG_NCCL_LIBRARY="$wheel/lib/libnccl.so.2")
    export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "NCCL: from the Python wheel in $wheel"
  else
    log "NCCL: none found, one rank without it"
  fi
fi
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
else
  echo "no nvidia-smi" > "$out/gpu.txt"
fi
log "GPU: $(head -1 "$out/gpu.txt")"

# ---- 1. configure and build --------------------------------------------------------------------
stage configure 180 "$out/configure.log" \
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMALG_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DMEMALG_BUILD_TOOLS=OFF -DMEMALG_BUILD_BENCH=OFF \
    -DMEMALG_BUILD_EXAMPLES=ON -DMEMALG_BUILD_TESTS=ON \
    -DCMAKE_PREFIX_PATH="$root/.deps" -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON \
    -DMEMALG_BOOST_INCLUDE_DIR="$root/.deps/include" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON "${nccl_args[@]}" ||
  { log "configure failed: see $out/configure.log"; tail -30 "$out/configure.log"; exit 1; }
targets=$(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's/^\(memalg_device_[a-z_0-9]*\): phony$/\1/p' | sort -u)
targets="$targets train_gpt_cuda train_gpt_cpu"
# The planner's tool, for stage 3b's comparison, where its dependencies were found.
ninja -C "$build" -t targets all 2>/dev/null | grep -q '^memalg_tool: ' && targets="$targets memalg_tool"
log "targets: $(echo $targets)"
stage build "${MEMALG_BENCH_BUILD_TIMEOUT:-330}" "$out/build.log" cmake --build "$build" -j "$jobs" --target $targets ||
  { log "build failed: see $out/build.log"; grep -m 20 -B2 -A8 'error' "$out/build.log"; }

# ---- 2. the GPU tests ----------------------------------------------------------------------------
stage tests 180 "$out/ctest.log" \
  ctest --test-dir "$build" -R '^(device\.|example\.train_gpt_cuda\.)' --output-on-failure --timeout 150 \
    --output-junit "$out/ctest.xml"
tail -25 "$out/ctest.log"

# ---- 3. training -------------------------------------------------------------------------------
bin=$build/examples/train_gpt_cuda
stage "train gpt2-124m ($steps steps)" 240 "$out/gpt2-124m.log" \
  bash -c "'$bin' --plan gpt2-124m --steps $steps --json > '$out/gpt2-124m.json'"
stage "train tiny-fp32 (50 steps)" 60 "$out/tiny-fp32.log" \
  bash -c "'$bin' --plan tiny-fp32 --steps 50 --json > '$out/tiny-fp32.json'"
stage "train tiny-bf16 (50 steps)" 60 "$out/tiny-bf16.log" \
  bash -c "'$bin' --plan tiny-bf16 --steps 50 --json > '$out/tiny-bf16.json'"

# ---- 3a. the same program on the CPU step backend ------------------------------------------------
stage "train tiny-fp32 on the CPU backend (50 steps)" 120 "$out/tiny-fp32-cpu.log" \
  bash -c "'$build/examples/train_gpt_cpu' --plan tiny-fp32 --steps 50 --json > '$out/tiny-fp32-cpu.json'"
stage "same program, CPU vs CUDA backend" 10 "$out/same_program.txt" python3 - "$out" <<'PY'
import json, os, re, sys
out = sys.argv[1]
def run(name):
    return json.loads(re.search(r'\{"plan".*\}', open(os.path.join(out, name)).read()).group(0))
gpu, cpu = run("tiny-fp32.json"), run("tiny-fp32-cpu.json")
first = abs(gpu["loss_first"] - cpu["loss_first"]) / abs(cpu["loss_first"])
last = abs(gpu["loss_last"] - cpu["loss_last"]) / abs(cpu["loss_last"])
print(f"tiny-fp32, 50 steps: CUDA {gpu['loss_first']:.6f} -> {gpu['loss_last']:.6f}, "
      f"CPU {cpu['loss_first']:.6f} -> {cpu['loss_last']:.6f}; relative difference first {first:.2e} "
      f"(tolerance 1e-5), last {last:.2e} (tolerance 1e-2)")
sys.exit(0 if first <= 1e-5 and last <= 1e-2 else 1)
PY
cat "$out/same_program.txt"

# ---- 3b. the PyTorch ground truth with CUDA tensors ----------------------------------------------
# bench/torch/measure.py on the GPU: the quick subset, torch.cuda.max_memory_allocated and
# max_memory_reserved next to the CPU figures of bench/torch/measured.json (docs/accuracy.md).
stage "torch harness on CUDA (quick subset)" 120 "$out/torch-cuda.log" \
  env HF_HUB_OFFLINE=1 python3 bench/torch/measure.py --device cuda --quick --out "$out/measured_cuda.json"
tail -25 "$out/torch-cuda.log"
if [[ -s $out/measured_cuda.json && -x $build/tools/memalg ]]; then  # the pytorch stack's plan of each case on this GPU
  python3 bench/torch/compare_cuda.py "$out/measured_cuda.json" --device h200 --memalg "$build/tools/memalg" \
    | tee "$out/compare_cuda.md" || echo "compare_cuda.py failed (see above)"
fi

# ---- 4. the table --------------------------------------------------------------------------------
python3 - "$out" <<'PY' | tee "$out/summary.md"
import json, os, re, sys
out = sys.argv[1]
def mib(b):
    return "-" if b is None else f"{b / 2**20:,.1f} MiB"
runs = []
for name in ("gpt2-124m", "tiny-fp32", "tiny-bf16"):
    try:
        text = open(os.path.join(out, name + ".json")).read()
        runs.append(json.loads(re.search(r'\{"plan".*\}', text).group(0)))
    except Exception as e:
        print(f"{name}: no JSON summary ({e}); see {name}.log")
gpu = open(os.path.join(out, "gpu.txt")).read().strip() if os.path.exists(os.path.join(out, "gpu.txt")) else "?"
print(f"## memalg GPU benchmark: {gpu}\n")
print("| plan | steps | loss first -> last | tokens/s | MFU | arena predicted | arena measured | device peak predicted | device peak measured | peak error |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    m = r["memory"]
    same = "=" if m["predicted_arena"] == m["measured_arena"] else "DIFFERENT"
    print(f"| {r['plan']} | {r['steps']} | {r['loss_first']:.4f} -> {r['loss_last']:.4f} | {r['tokens_per_s']:,.0f} | "
          f"{100 * r['mfu']:.2f}% | {m['predicted_arena']:,} B | {m['measured_arena']:,} B ({same}) | "
          f"{mib(m['predicted_peak'])} | {mib(m['measured_peak'])} | "
          f"{100 * (m['measured_peak'] - m['predicted_peak']) / m['predicted_peak']:+.2f}% |")
for r in runs:
    l = r["memory_layers"]
    print(f"\n### overhead layers, {r['plan']} (device used memory growth, cudaMemGetInfo)\n")
    print("| layer | measured | requested / predicted |")
    print("|---|---|---|")
    print(f"| CUDA context (after cudaFree(0)) | {mib(l['context'])} | reserve {mib(l['predicted_reserve'])} incl. workspace |")
    print(f"| NCCL (after first collective) | {mib(l['communicator'])} | - |")
    print(f"| cuBLASLt handle + workspace | {mib(l['libraries'])} | {mib(l['gemm_workspace'])} |")
    print(f"| backend scratch | {mib(l['scratch'])} | {mib(l['scratch_requested'])} |")
    print(f"| arena | {mib(l['arena'])} | {mib(l['arena_requested'])} |")
    print(f"| first step (lazy modules) | {mib(l['modules'])} | - |")
    overhead = l["context"] + l["communicator"] + l["libraries"] + l["scratch"] + l["modules"]
    print(f"| all but the arena | {mib(overhead)} | reserve {mib(l['predicted_reserve'])} |")
    print(f"| device total | {mib(l['total'])} | - |")
same = os.path.join(out, "same_program.txt")
if os.path.exists(same):
    print(f"\nsame step program on both backends: {open(same).read().strip()}")
tests = open(os.path.join(out, "ctest.log")).read() if os.path.exists(os.path.join(out, "ctest.log")) else ""
m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", tests)
skipped = len(re.findall(r"\*\*\*Skipped|Not Run", tests))
print(f"\nGPU tests: {m.group(0) if m else 'no ctest summary'}; skipped or not run: {skipped}")
json.dump({"gpu": gpu, "runs": runs, "tests": m.group(0) if m else None}, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
log "done in ${SECONDS} s, status $status; results in $out"
exit $status
