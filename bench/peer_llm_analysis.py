#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Side-by-side throughput of a Python peer estimator on memalg's configurations.

The peer is llm-analysis (PyPI `llm-analysis`, cli99/llm-analysis), a pure-Python estimator of
training memory (weights, gradients, optimizer states, activations per GPU) under Megatron tensor,
sequence and pipeline parallelism and DeepSpeed ZeRO. It is a reference measurement only, never
part of the build or the tests:

    python3 -m venv /tmp/peer && /tmp/peer/bin/pip install llm-analysis==0.2.2
    build/bench/sweep_throughput --dump /tmp/configs.jsonl
    /tmp/peer/bin/python bench/peer_llm_analysis.py /tmp/configs.jsonl
    build/bench/sweep_throughput --time-list /tmp/configs.jsonl

It evaluates the configurations both tools can express (context parallelism 1, no offload:
llm-analysis has neither) of Llama-2 7B, sequence 4096, bf16 weights and activations with fp32
master weights and Adam, FlashAttention, on an A100 80 GB, and prints configurations per second
(median of 5 passes over the list) and how its per-GPU total compares with memalg's peak.
"""
import json
import logging
import statistics
import sys
import time

logging.disable(logging.CRITICAL)  # llm-analysis logs every step at INFO

from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis  # noqa: E402
from llm_analysis.config import (  # noqa: E402
    DtypeConfig,
    ParallelismConfig,
    get_gpu_config_by_name,
    get_model_config_by_name,
)

RECOMPUTE = {
    "none": ActivationRecomputation.NONE,
    "selective": ActivationRecomputation.SELECTIVE,
    "full": ActivationRecomputation.FULL,
}
ZERO = [DSZeRO.NONE, DSZeRO.STAGE_1, DSZeRO.STAGE_2, DSZeRO.STAGE_3]


def main(path):
    configs = [json.loads(line) for line in open(path)]
    configs = [c for c in configs if c["cp"] == 1 and c["offload"] == "none" and c["memalg_peak"] > 0]
    model = get_model_config_by_name("NousResearch_Llama-2-7b-hf")
    model.ffn_embed_dim = 11008  # its bundled config has 4h; Llama-2 7B's MLP is 11008 wide (SwiGLU)
    gpu = get_gpu_config_by_name("a100-sxm-80gb")
    dtype = DtypeConfig()  # 16-bit weights and activations

    def evaluate(c):
        parallel = ParallelismConfig(tp_size=c["tp"], pp_size=c["pp"], dp_size=c["dp"],
                                     sp_size=c["tp"] if c["sp"] else 1)
        analysis = LLMAnalysis(model, gpu, dtype, parallel)
        try:
            s = analysis.training(batch_size_per_gpu=c["micro_batch"], gradient_accumulation_steps=1, seq_len=4096,
                                  activation_recomputation=RECOMPUTE[c["recompute"]], ds_zero=ZERO[c["zero"]],
                                  flash_attn=True, mlp_gated_linear_units=True)
        except (AssertionError, ValueError, ZeroDivisionError):
            return None  # configurations it refuses (e.g. when they do not fit)
        return (s["weight_memory_per_gpu"] + s["gradient_memory_per_gpu"] + s["optimizer_state_memory_per_gpu"] +
                s["activation_memory_per_gpu"])

    rates, results = [], []
    for _ in range(5):
        start = time.perf_counter()
        results = [evaluate(c) for c in configs]
        rates.append(len(configs) / (time.perf_counter() - start))
    answered = [(r, c["memalg_peak"]) for r, c in zip(results, configs) if r is not None]
    ratios = sorted(r / m for r, m in answered)
    print(f"llm-analysis 0.2.2: {len(configs)} configurations, {statistics.median(rates):.3g} configurations/s "
          f"(median of 5; {len(answered)} answered, the rest refused)")
    if ratios:
        print(f"its per-GPU total / memalg's peak: median {statistics.median(ratios):.3f}, "
              f"range {ratios[0]:.3f} to {ratios[-1]:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
