#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""The generated matrix: a seeded covering array of training-step configurations.

Every pair of values of two different axes (below) appears in at least one case of the matrix,
unless the pair is invalid (a family without that dropout site, GQA on GPT-2, ...): such pairs are
listed with their reason and excluded. Cases are drawn greedily (the AETG method: Cohen et al.,
"The AETG System", IEEE TSE 23(7), 1997): each new case is the best of a set of seeded candidates,
each candidate built around a pair not yet covered, its other axes chosen one by one to cover the
most new pairs. When every valid pair is covered and the group still has fewer cases than asked,
the same greedy step covers triples of axis values instead, so the rest of the budget goes to
three-way interactions, not to repeats.

The matrix is append-only: a group (one file `matrix/<group>.json`) is drawn once, with its seed,
and never redrawn. A later group (new families, new axes) starts from the pairs and triples the
committed groups already cover, and those of the drawn groups waiting in `pending/`, and draws
only what is missing. A case measured as `skipped`
(bench/torch/measured/, with its reason) covers nothing: a later group draws its pairs again.

    python bench/torch/generate.py --group pairwise-1 --seed 20261202 --min-cases 130
    python bench/torch/generate.py --group pairwise-2 --seed 20261203   # the pairs pairwise-1's skipped cases held
    python bench/torch/generate.py --group pairwise-3 --seed 20261204   # the families of 2024-2026
    python bench/torch/generate.py --group pairwise-4 --seed 20261205   # the pairs pairwise-3's skipped case held
    python bench/torch/generate.py --group pairwise-5 --seed 20261206   # the mixtures of experts of 2025-2026
    python bench/torch/generate.py --check          # every valid pair covered by the committed groups

The numeric values within a category (the sequence length of a "long" case, the vocabulary of a
"large" one, the width of a "wide" one, ...) are drawn by the same generator, and redrawn until a
rough estimate of the case's peak lies between 250 MB and 2.5 GB (the data is checked to lie
between 200 MB and 4 GB per rank) and its estimated time is under time_bound(), so that the whole
group runs in about 90 minutes on 2 cores. The three-way cases run on one rank. The estimate only steers the
draw; the case's recorded numbers are measured.
"""

import argparse
import itertools
import json
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MATRIX = os.path.join(HERE, "matrix")
PENDING = os.path.join(HERE, "pending")

# The axes and their values. A value names a category; the case's numbers are drawn within it.
AXES = [
    ("family", ["gpt2", "llama", "mistral", "mixtral", "qwen2", "gpt_neox", "falcon",
                "qwen3", "olmo2", "phi3", "starcoder2", "gpt_bigcode", "gemma2", "gemma3",
                "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4"]),
    ("precision", ["fp32", "bf16", "autocast-bf16"]),
    ("attention", ["eager", "sdpa"]),
    ("dropout", ["off", "embedding", "attention", "residual", "all"]),
    ("checkpointing", ["off", "non-reentrant", "reentrant"]),
    ("optimizer", ["adamw-foreach", "adamw-for-loop", "adamw-fused", "sgd", "sgd-momentum"]),
    ("accumulation", ["1", "more"]),
    ("micro_batch", ["1", "odd", "even"]),
    ("sequence", ["short", "odd", "long"]),
    ("vocabulary", ["small", "large"]),
    ("depth", ["shallow", "deep"]),
    ("width", ["narrow", "wide"]),
    ("embeddings", ["tied", "untied"]),
    ("head_dim", ["derived", "explicit"]),
    ("heads", ["mha", "gqa", "mqa"]),
    ("residual", ["sequential", "parallel"]),
    ("ranks", ["1", "ddp-2", "fsdp2-2"]),
]
AXIS_NAMES = [a for a, _ in AXES]
AXIS_INDEX = {a: i for i, a in enumerate(AXIS_NAMES)}
VALUES = dict(AXES)

LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2")
# The mixtures of experts of 2025-2026 (Mixtral is LLAMA_LIKE): every layer sparse but
# DeepSeek-V3's first (first_k_dense_replace 1) and Llama 4's odd ones (interleave_moe_layer_step 2).
MOE = ("qwen3_moe", "deepseek_v3", "gpt_oss", "llama4")
# Families whose config has a head_dim field (the others derive it as hidden / heads; DeepSeek-V3's
# latent attention has its own per-part widths).
HEAD_DIM_FIELD = LLAMA_LIKE + ("qwen3", "gemma2", "gemma3", "qwen3_moe", "gpt_oss", "llama4")
# Families with a gated MLP (SwiGLU, or Gemma's GeGLU).
GATED = LLAMA_LIKE + ("qwen3", "olmo2", "phi3", "gemma2", "gemma3") + MOE

# Where each family applies dropout (Hugging Face transformers 5.17 modelling code):
# GPT-2: embd_pdrop (wte + wpe), attn_pdrop (attention probabilities), resid_pdrop (c_proj outputs);
# Llama, Mistral, Mixtral, Qwen2: attention_dropout only (eager_attention_forward);
# GPT-NeoX: attention_dropout, hidden_dropout (emb_dropout, post_attention_dropout, post_mlp_dropout);
# Falcon: attention_dropout, hidden_dropout (dropout_add after attention and MLP); no embedding dropout.
DROPOUT_SITES = {
    "gpt2": ("embedding", "attention", "residual"),
    "llama": ("attention",), "mistral": ("attention",), "mixtral": ("attention",), "qwen2": ("attention",),
    "gpt_neox": ("attention", "residual"),
    "falcon": ("attention", "residual"),
    # Qwen3, OLMo 2, Gemma 2 and 3: attention_dropout only. Phi-3: attention_dropout and resid_pdrop
    # (resid_attn_dropout, resid_mlp_dropout; its embd_pdrop is read by no module). StarCoder2:
    # embedding_dropout, attention_dropout, residual_dropout (after o_proj and c_proj).
    # GPT-BigCode: GPT-2's embd_pdrop, attn_pdrop, resid_pdrop.
    "qwen3": ("attention",), "olmo2": ("attention",), "gemma2": ("attention",), "gemma3": ("attention",),
    "phi3": ("attention", "residual"),
    # Qwen3-MoE, DeepSeek-V3, gpt-oss, Llama 4: attention_dropout only.
    "qwen3_moe": ("attention",), "deepseek_v3": ("attention",), "gpt_oss": ("attention",), "llama4": ("attention",),
    "starcoder2": ("embedding", "attention", "residual"),
    "gpt_bigcode": ("embedding", "attention", "residual"),
}


def pair_reason(a, va, b, vb):
    """Why the pair (a = va, b = vb) cannot occur in any case, or None when it can."""
    p = {a: va, b: vb}
    fam = p.get("family")
    if fam is not None:
        other = b if a == "family" else a
        v = p[other]
        if other == "dropout":
            sites = DROPOUT_SITES[fam]
            if v == "embedding" and fam == "gpt_neox":
                return "GPT-NeoX's embedding dropout is hidden_dropout, the residual site's probability"
            if v in ("embedding", "residual") and v not in sites:
                return "%s has no %s dropout (its sites: %s)" % (fam, v, ", ".join(sites))
            if v == "all" and len(sites) == 1:
                return "%s has one dropout site: 'all' is 'attention'" % fam
        if other == "head_dim" and v == "explicit" and fam not in HEAD_DIM_FIELD:
            return "%s derives its head width from hidden / heads (no head_dim field)" % fam
        if other == "heads" and v != "mha" and fam in ("gpt2", "gpt_neox"):
            return "%s has no grouped or multi-query attention" % fam
        if other == "heads" and v == "gqa" and fam == "gpt_bigcode":
            return "gpt_bigcode has one key/value head (multi_query) or all of them, no groups"
        if other == "residual" and v == "parallel" and fam not in ("gpt_neox", "falcon"):
            return "%s has no parallel-residual block" % fam
        if other == "heads" and v != "mha" and fam == "deepseek_v3":
            return "DeepSeek-V3's latent attention lifts a key and a value for every query head"
        if other == "attention" and v == "sdpa" and fam == "gpt_oss":
            return "gpt-oss supports eager attention only (its sinks; the model declares no SDPA)"
    return None


def case_reason(c):
    """Why a whole case is invalid, or None."""
    for a, b in itertools.combinations(AXIS_NAMES, 2):
        if a in c and b in c:
            r = pair_reason(a, c[a], b, c[b])
            if r:
                return r
    if c.get("family") == "falcon" and c.get("heads") == "gqa" and c.get("residual") == "sequential":
        return "Falcon's grouped-query layout (new_decoder_architecture) is always parallel"
    return None


CONSTRAINED = ("family", "dropout", "head_dim", "heads", "residual", "attention")


def unsettled(c):
    """Whether a (partial) case holds a combination the harness could not bring to a steady state
    (FSDP2 over gloo with gradient accumulation: the pytorch envelope's `unsettled`,
    include/memalg/plan/envelope.hpp). A valid case, but a new one is never drawn with it: its
    pairs are drawn in cases that can be measured (from pairwise-4 on; the earlier groups were
    drawn before this rule and are never redrawn)."""
    return c.get("ranks") == "fsdp2-2" and c.get("accumulation") == "more"


def completable(p):
    """Whether a partial case `p` extends to a valid one (only CONSTRAINED axes interact)."""
    free = [a for a in CONSTRAINED if a not in p]
    for vals in itertools.product(*(VALUES[a] for a in free)):
        c = dict(p)
        c.update(zip(free, vals))
        if case_reason(c) is None:
            return True
    return False


def valid_pairs():
    """The pairs every case set must cover, and the others with their reasons."""
    out, invalid = [], []
    for a, b in itertools.combinations(AXIS_NAMES, 2):
        for va in VALUES[a]:
            for vb in VALUES[b]:
                r = pair_reason(a, va, b, vb)
                if r is None and not completable({a: va, b: vb}):
                    fams = lambda x, v: sorted(f for f in VALUES["family"] if completable({"family": f, x: v}))
                    r = "no family has both: %s=%s needs %s, %s=%s needs %s" % (
                        a, va, "/".join(fams(a, va)), b, vb, "/".join(fams(b, vb)))
                if r:
                    invalid.append({"pair": [[a, va], [b, vb]], "reason": r})
                else:
                    out.append(((a, va), (b, vb)))
    return out, invalid


def tuples_of(c, k):
    return {tuple((a, c[a]) for a in axes) for axes in itertools.combinations(AXIS_NAMES, k)}


# --------------------------------------------------------------------------------------------
# The numbers of a case, drawn within its categories.

def draw_numbers(c, rng):
    fam = c["family"]
    n = {}
    n["micro_batch"] = {"1": 1, "odd": rng.choice([3, 5, 7]), "even": rng.choice([2, 4, 6, 8])}[c["micro_batch"]]
    n["seq"] = {"short": rng.choice([64, 128, 256, 384, 512]), "odd": rng.randrange(101, 1000, 2),
                "long": rng.choice([1024, 1280, 1536, 2048])}[c["sequence"]]
    n["vocab"] = {"small": rng.randrange(2000, 10000), "large": rng.choice([32000, 32768, 50257, 65024])}[c["vocabulary"]]
    # (DeepSeek-V3's first layer and Llama 4's even ones are dense: two layers at least hold a sparse one)
    n["layers"] = {"shallow": rng.choice([2, 3] if fam in ("deepseek_v3", "llama4") else [1, 2, 3]),
                   "deep": rng.choice([4, 5, 6, 8])}[c["depth"]]
    hidden, heads = {"narrow": rng.choice([(256, 4), (384, 6)]), "wide": rng.choice([(768, 12), (1024, 16)])}[c["width"]]
    n["hidden"], n["heads"] = hidden, heads
    n["kv_heads"] = {"mha": heads, "gqa": rng.choice([heads // 2, heads // 4]) if heads % 4 == 0 else heads // 2,
                     "mqa": 1}[c["heads"]]
    d = hidden // heads
    n["head_dim"] = {"derived": None, "explicit": rng.choice([d // 2, 3 * d // 2, 2 * d])}[c["head_dim"]]
    if fam in GATED:
        n["ffn"] = 2 * hidden if fam == "mixtral" else rng.choice([2 * hidden, 8 * hidden // 3 // 64 * 64, 3 * hidden])
    else:
        n["ffn"] = 4 * hidden
    if fam == "mixtral":
        n["experts"] = rng.choice([4, 8])
        n["top_k"] = rng.choice([1, 2])
    if fam in ("qwen3_moe", "gpt_oss", "llama4"):
        # The experts' width (moe_intermediate_size, or intermediate_size for gpt-oss and Llama 4's
        # experts), as wide as the model or narrower, as the released models' are.
        n["ffn"] = rng.choice([hidden // 4, hidden // 2, hidden])
    if fam == "qwen3_moe":
        n["experts"] = rng.choice([8, 16, 32, 64, 128])
        n["top_k"] = rng.choice([k for k in (1, 2, 4, 8) if k <= n["experts"]])
    if fam == "deepseek_v3":
        # n_group 4 and topk_group 2 (measure.py): E a multiple of 4, k at most 2·E/4.
        n["experts"] = rng.choice([8, 16, 32])
        n["top_k"] = rng.choice([1, 2, 4])
    if fam == "gpt_oss":
        n["experts"] = rng.choice([8, 16, 32, 64])
        n["top_k"] = rng.choice([1, 2, 4])
    if fam == "llama4":
        # (every expert computes every token: E·T rows)
        n["experts"] = rng.choice([2, 4, 8])
        n["top_k"] = rng.choice([1, 2])
    if fam == "gpt_neox":
        n["rotary_pct"] = rng.choice([0.25, 1.0])
    if fam == "llama4":
        # The rotary layers' chunk: the released 8192 (longer than any drawn sequence) or half the
        # sequence (SDPA's mask, and chunks).
        n["window"] = rng.choice([8192, max(32, n["seq"] // 2)])
    if fam in ("gemma2", "gemma3"):
        # The local layers' window: longer than any drawn sequence (no mask under SDPA) or half
        # the sequence (a mask, and the key and value expanded to every head).
        n["window"] = rng.choice([4096, max(32, n["seq"] // 2)])
    n["grad_accum"] = 1 if c["accumulation"] == "1" else rng.choice([2, 3])
    n["dropout_p"] = 0.1
    return n


def estimate(c, n):
    """A rough peak (bytes) and time (seconds): they steer the draw, nothing else."""
    h, L, v, T = n["hidden"], n["layers"], n["vocab"], n["micro_batch"] * n["seq"]
    f, a = n["ffn"], n["heads"]
    d = n["head_dim"] or h // a
    kv = n["kv_heads"]
    gated = c["family"] in GATED
    experts = n.get("experts", 1)
    attn_p = h * (a * d + 2 * kv * d) + a * d * h
    mlp_p = (3 if gated else 2) * h * f * experts
    # Rows through the experts: k·T, or E·T where every expert computes every token (Llama 4).
    rows = {"llama4": experts}.get(c["family"], n.get("top_k", 1))
    active_mlp = (3 if gated else 2) * h * f * rows
    emb = v * h * (1 if c["embeddings"] == "tied" else 2)
    P = L * (attn_p + mlp_p) + emb
    wb = 2 if c["precision"] == "bf16" else 4
    states = {"adamw-foreach": 4, "adamw-for-loop": 4, "adamw-fused": 4, "sgd": 2, "sgd-momentum": 3}[c["optimizer"]]
    model_states = P * wb * states
    if c["ranks"] == "fsdp2-2":
        model_states /= 2
    if c["ranks"] == "ddp-2":
        model_states += P * wb
    e = 2 if c["precision"] != "fp32" else 4
    per_layer = T * (h * 20 + f * (8 if gated else 6) * rows + (2 * h * rows if rows > 1 else 0)) * e
    if c["attention"] == "eager":
        per_layer += n["micro_batch"] * a * n["seq"] ** 2 * e * 3
    acts = per_layer * (1 if c["checkpointing"] != "off" else L) + (L * T * h * e if c["checkpointing"] != "off" else 0)
    logits = T * v * 4 * 3
    peak = model_states + acts + logits
    # Seconds on 2 cores: three steps (a warm-up, two profiled), 6 flops per parameter and token
    # (the embedding's lookup is free), the attention core's 12·s²·d per head and layer; about
    # 60 GFLOP/s in fp32 and 0.5 in bf16 (under autocast too: matrix products without bf16
    # instructions), measured here with torch 2.11.
    # The output projection is counted once, tied or not (the input embedding is a lookup);
    # groups before pairwise-3 were drawn without it, which let bf16 cases with large
    # vocabularies through that took minutes.
    active = L * (attn_p + (active_mlp if "experts" in n else mlp_p)) + v * h
    flops = 6 * active * T * n["grad_accum"] + 12 * L * n["micro_batch"] * a * d * n["seq"] ** 2 * n["grad_accum"]
    rate = 60e9 if c["precision"] == "fp32" else 0.5e9
    # The profile's analysis: about 2 ms per operator event, some 200 events per layer and
    # micro-batch in a step (measured on the hand-picked cases).
    events = 200 * L * n["grad_accum"] * 3
    seconds = 3 * flops / rate + events * 2e-3 + 4
    if c["ranks"] != "1":
        seconds = 3 * seconds + 15  # two ranks of one thread each, gloo, and a process per rank
    return peak, seconds


def time_bound(c):
    """Seconds a case may take by the estimate: 40 on one rank in fp32, 90 in bf16 (whose
    matrix products this CPU runs some hundred times slower), 120 on two ranks."""
    if c["ranks"] != "1":
        return 120
    return 40 if c["precision"] == "fp32" else 90


def draw_case(c, rng, tries=400):
    for _ in range(tries):
        n = draw_numbers(c, rng)
        peak, work = estimate(c, n)
        if 250e6 <= peak <= 2.5e9 and work <= time_bound(c):
            return n
    return None


# --------------------------------------------------------------------------------------------
# The greedy covering step.

def build_candidate(rng, seed_tuple, covered, k, greedy_fill=True):
    c = dict(seed_tuple)
    if k == 3:
        c["ranks"] = "1"  # (see generate: three-way cases run on one rank)
    order = [a for a in AXIS_NAMES if a not in c]
    rng.shuffle(order)
    for axis in order:
        best, best_gain = [], -1
        for v in VALUES[axis]:
            trial = dict(c)
            trial[axis] = v
            if case_reason(trial) or unsettled(trial) or (axis in CONSTRAINED and not completable(trial)):
                continue
            gain = 0
            for others in itertools.combinations([x for x in trial if x != axis], k - 1):
                t = tuple(sorted(((x, trial[x]) for x in others + (axis,)), key=lambda p: AXIS_INDEX[p[0]]))
                if t not in covered:
                    gain += 1
            if not greedy_fill:
                best.append(v)  # any valid value: a lighter case when the greedy one cannot be drawn
            elif gain > best_gain:
                best, best_gain = [v], gain
            elif gain == best_gain:
                best.append(v)
        if not best:
            return None
        c[axis] = rng.choice(best)
    return None if case_reason(c) or unsettled(c) else c


def greedy(rng, wanted, covered, k, candidates=40):
    """One case covering the most of `wanted` - `covered` (k-tuples), or None when all are covered."""
    missing = sorted(t for t in wanted if t not in covered)
    if not missing:
        return None
    best, best_gain = None, -1
    for i in range(candidates):
        seed_tuple = rng.choice(missing)
        # Half the candidates fill their other axes greedily, half at random (drawable more often).
        c = build_candidate(rng, seed_tuple, covered, k, greedy_fill=i % 2 == 0)
        if c is None:
            continue
        gain = len(tuples_of(c, k) & wanted - covered)
        if gain <= best_gain:
            continue
        n = draw_case(c, rng, 200)  # a case whose numbers cannot meet the bounds is no candidate
        if n is not None:
            best, best_gain = (c, n), gain
    return best


def committed_groups(pending=False):
    """The groups in matrix/; with `pending`, also the drawn groups waiting in pending/ (measured,
    not yet meeting the bar: pending/README.md). A new group is drawn after both, never again over
    pairs a pending group holds."""
    out = []
    for d in [MATRIX] + ([PENDING] if pending else []):
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith(".json") and not f.endswith(".measured.json"):
                    with open(os.path.join(d, f)) as fh:
                        out.append(json.load(fh))
    return out


def unmeasured_cases():
    """The drawn cases whose result is `skipped` in measured/ (a group's file or its shard files):
    they cover nothing, so a later group draws their pairs again."""
    out = set()
    for d, suffix in ((os.path.join(HERE, "measured"), ".json"), (PENDING, ".measured.json")):
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith(suffix):
                    with open(os.path.join(d, f)) as fh:
                        out |= {r["name"] for r in json.load(fh).get("cases", []) if "skipped" in r}
    return out


def generate(group, seed, min_cases):
    rng = random.Random(seed)
    pairs, invalid = valid_pairs()
    wanted2 = set(tuple(sorted(p, key=lambda q: AXIS_INDEX[q[0]])) for p in pairs)
    skipped = unmeasured_cases()
    old = [c["axes"] for g in committed_groups(pending=True) for c in g["cases"] if c["name"] not in skipped]
    covered2 = set().union(*(tuples_of(c, 2) for c in old)) if old else set()
    covered3 = set().union(*(tuples_of(c, 3) for c in old)) if old else set()
    cases = []
    failures = 0
    while True:
        c = greedy(rng, wanted2, covered2, 2)
        if c is None:
            left = sorted(t for t in wanted2 if t not in covered2)
            if not left:
                break
            failures += 1
            if failures == 200:
                raise SystemExit("no case drawn within the bounds covers the pairs left: %s" % left[:5])
            continue
        cases.append(c)
        c = c[0]
        covered2 |= tuples_of(c, 2)
        covered3 |= tuples_of(c, 3)
    pairwise_cases = len(cases)
    if len(cases) < min_cases:
        # Valid triples, as the candidates build them (a triple is valid when a case holds it).
        # The three-way cases run on one rank: two-rank cases cost several times as much to
        # measure, and every pair with a rank count is covered above.
        wanted3 = set()
        for axes in itertools.combinations([a for a in AXIS_NAMES if a != "ranks"], 3):
            for vals in itertools.product(*(VALUES[a] for a in axes)):
                t = tuple(zip(axes, vals))
                if case_reason(dict(t)) is None and completable(dict(t)):
                    wanted3.add(t)
        covered3 = {t for t in covered3 if all(a != "ranks" for a, _ in t)}
        failures = 0
        while len(cases) < min_cases and failures < 200:
            c = greedy(rng, wanted3, covered3, 3, candidates=30)
            if c is None:  # no candidate drawn within the bounds this time: try other seeds
                failures += 1
                continue
            cases.append(c)
            covered3 |= tuples_of(c[0], 3)
    out = []
    prefix = group.replace("pairwise-", "pw")
    for i, (c, n) in enumerate(cases):
        name = "%s-%03d-%s" % (prefix, i, c["family"].replace("_", ""))
        out.append({"name": name, "axes": {a: c[a] for a in AXIS_NAMES}, "numbers": n})
    return {"group": group, "seed": seed, "generator": "bench/torch/generate.py",
            "command": "python bench/torch/generate.py --group %s --seed %d --min-cases %d" % (group, seed, min_cases),
            "axes": [{"axis": a, "values": v} for a, v in AXES], "invalid_pairs": invalid,
            "skipped_before": sorted(skipped),
            "pairwise_cases": pairwise_cases, "cases": out}


def check():
    pairs, _ = valid_pairs()
    skipped = unmeasured_cases()
    cases = [c["axes"] for g in committed_groups() for c in g["cases"] if c["name"] not in skipped]
    covered = set().union(*(tuples_of(c, 2) for c in cases)) if cases else set()
    missing = [p for p in pairs if tuple(sorted(p, key=lambda q: AXIS_INDEX[q[0]])) not in covered]
    print("%d cases measured or drawn (%d skipped), %d valid pairs, %d covered, %d missing"
          % (len(cases), len(skipped), len(pairs), len(pairs) - len(missing), len(missing)))
    for p in missing[:20]:
        print("  missing", p)
    return 1 if missing else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", help="the new group's name (its file: matrix/<group>.json; never an existing one)")
    ap.add_argument("--seed", type=int, help="the group's seed (committed with it)")
    ap.add_argument("--min-cases", type=int, default=0, help="draw at least this many cases (three-way after pairs)")
    ap.add_argument("--check", action="store_true", help="check that the committed groups cover every valid pair")
    args = ap.parse_args()
    if args.check:
        return check()
    if not args.group or args.seed is None:
        ap.error("--group and --seed are required (or --check)")
    path = os.path.join(MATRIX, args.group + ".json")
    if os.path.exists(path):
        ap.error("%s exists: committed groups are never redrawn; name a new group" % os.path.relpath(path))
    g = generate(args.group, args.seed, args.min_cases)
    os.makedirs(MATRIX, exist_ok=True)
    with open(path, "w") as f:
        json.dump(g, f, indent=1)
        f.write("\n")
    print("%s: %d cases (%d to cover every valid pair), %d invalid pairs listed"
          % (os.path.relpath(path), len(g["cases"]), g["pairwise_cases"], len(g["invalid_pairs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
