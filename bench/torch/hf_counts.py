#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Reference parameter counts of the Hugging Face configurations in tests/data/hf/.

Every `tests/data/hf/*.json` is given to transformers' own configuration class and the model
class its `architectures` names is built on the meta device (no memory, no weights, no
download). The counts come from the modules transformers builds, so the importer
(`memalg import`, tools/hf_config.cpp) can be tested against them:

    python bench/torch/hf_counts.py --out tests/data/hf/counts.json   # regenerate
    python bench/torch/hf_counts.py --check                           # recompute, compare
    python bench/torch/hf_counts.py --files 'gpt-oss*'                # print only

Recorded per file (see README.md, "Parameter counts"):

  parameters              model.num_parameters(): every parameter once (tied weights once)
  parameters_dedup        the sum over named_parameters(remove_duplicate=False), each tensor
                          counted once by identity: the cross-check of `parameters`
  language_model, vision  multimodal classes only: the language model and lm_head, and
                          everything else (vision tower, multimodal projector); `split` says
                          which module prefixes went where
  active_*                mixture-of-experts models only: the parameters minus the routed
                          experts a token does not select (experts_per_token of num_experts
                          in every MoE layer); shared experts, routers and dense layers stay
  per_layer_breakdown     parameter path -> numel of the first dense and the first MoE layer
                          of the language model, with the shapes and buffers of those layers
  groups                  embedding, lm_head, final norm, layers and vision totals
"""

import argparse
import contextlib
import fnmatch
import glob
import io
import json
import os
import platform
import re
import shlex
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

warnings.filterwarnings("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(REPO, "tests", "data", "hf")
DEFAULT_OUT = os.path.join(DATA, "counts.json")
PINNED = {"torch": "2.11.0", "transformers": "5.17.0"}

# Fields of a released config.json that describe the file or the checkpoint, not the modules:
# they are recorded, never given to the configuration class.
NOT_ARCHITECTURE = ("quantization_config", "auto_map", "transformers_version", "torch_dtype", "dtype")

# model_type values transformers does not register, and the type it builds instead.
#   kimi_k2: Kimi K2 is published with the DeepSeek-V3 architecture (DeepseekV3ForCausalLM) and
#            model_type "kimi_k2"; transformers reads such a text config as deepseek_v3
#            (models/kimi_k25 does the same for its text_config).
#   RefinedWeb, RefinedWebModel: the Falcon checkpoints' first model types. The new decoder
#            architecture is RefinedWeb's default, and the n_* names are the old field names.
ALIASES = {"kimi_k2": "deepseek_v3", "RefinedWeb": "falcon", "RefinedWebModel": "falcon"}
REFINEDWEB_FIELDS = {"n_embed": "hidden_size", "n_embd": "hidden_size", "n_layer": "num_hidden_layers",
                     "n_head": "num_attention_heads", "n_head_kv": "num_kv_heads"}

# Component names that start the language-model and the vision side of a multimodal model.
LANGUAGE_PARTS = ("language_model", "lm_head")
VISION_PARTS = ("vision_tower", "vision_model", "multi_modal_projector", "visual", "vision_adapter")
# Names of the routed experts' container; shared experts are never routed.
EXPERT_PARTS = ("experts",)
LAYER_RE = re.compile(r"^(.*?(?:^|\.)(?:layers|h|blocks))\.(\d+)\.(.*)$")


def fields_of(path):
    with open(path) as f:
        return json.load(f)


def build_config(raw):
    """The transformers configuration of one config.json, and notes on what was changed."""
    notes = []
    fields = dict(raw)
    dropped = {k: fields.pop(k) for k in NOT_ARCHITECTURE if k in fields}
    if "quantization_config" in dropped:
        notes.append("quantization_config (%s) recorded, not applied: the count is of the modules "
                     "transformers builds from the configuration" % dropped["quantization_config"].get("quant_method"))
    written = fields.pop("model_type")
    model_type = written
    if written not in CONFIG_MAPPING:
        if written not in ALIASES:
            raise SystemExit("unknown model_type %r" % written)
        model_type = ALIASES[written]
        notes.append("model_type %r is not registered in transformers %s; built as %r"
                     % (written, transformers.__version__, model_type))
        if written in ("RefinedWeb", "RefinedWebModel"):
            for old, new in REFINEDWEB_FIELDS.items():
                if old in fields and new not in fields:
                    fields[new] = fields.pop(old)
            fields.setdefault("new_decoder_architecture", written == "RefinedWeb")
    for key in ("text_config", "vision_config"):
        sub = fields.get(key)
        if isinstance(sub, dict) and sub.get("model_type") in ALIASES and sub["model_type"] not in CONFIG_MAPPING:
            notes.append("%s.model_type %r built as %r" % (key, sub["model_type"], ALIASES[sub["model_type"]]))
            fields[key] = dict(sub, model_type=ALIASES[sub["model_type"]])
    config = AutoConfig.for_model(model_type, **fields)
    return config, written, model_type, notes


def model_class(raw, config):
    for name in raw.get("architectures") or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return AutoModelForCausalLM._model_mapping[type(config)]


def text_config(config):
    sub = config.get_text_config() if hasattr(config, "get_text_config") else config
    return sub if sub is not None else config


def first_attr(config, names):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return name, value
    return None, None


def side(name):
    """'language', 'vision' or None for one parameter path of a multimodal model."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in LANGUAGE_PARTS:
            return "language", ".".join(parts[: i + 1])
        if part in VISION_PARTS:
            return "vision", ".".join(parts[: i + 1])
    return None, parts[0]


def expert_slot(name):
    """For a routed-expert parameter: (container path, expert index or None when fused)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in EXPERT_PARTS:
            nxt = parts[i + 1] if i + 1 < len(parts) else ""
            return ".".join(parts[: i + 1]), int(nxt) if nxt.isdigit() else None
    return None


def kind(rel):
    """norm, attention, mlp or other: the group of one parameter path inside a layer."""
    parts = rel.split(".")
    if any("norm" in q or q.startswith("ln_") for q in parts[:-1]):
        return "norms"
    if any(q in ("self_attn", "self_attention", "attn", "attention") for q in parts):
        return "attention"
    if any(q in ("mlp", "feed_forward", "block_sparse_moe") for q in parts):
        return "mlp"
    return "other"


def kinds(ps):
    out = {}
    for rel, p in ps.items():
        out[kind(rel)] = out.get(kind(rel), 0) + p.numel()
    return out


def count(path):
    raw = fields_of(path)
    config, written, built, notes = build_config(raw)
    cls = model_class(raw, config)
    with torch.device("meta"):
        model = cls(config)
    model.eval()

    params = dict(model.named_parameters())  # each tensor once (tied weights once)
    seen, dedup, aliases = {}, 0, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases[name] = seen[id(p)]
            continue
        seen[id(p)] = name
        dedup += p.numel()
    total = model.num_parameters()
    out = {
        "class": cls.__name__,
        "config_class": type(config).__name__,
        "model_type": written,
        "model_type_built": built,
        "parameters": total,
        "parameters_dedup": dedup,
        "parameters_without_embeddings": model.num_parameters(exclude_embeddings=True),
        "tied": {k: v for k, v in sorted(aliases.items())},
    }
    if notes:
        out["notes"] = notes

    # Embedding and output tables.
    emb = model.get_input_embeddings()
    emb_name = next(n for n, p in params.items() if p is emb.weight)
    out_emb = model.get_output_embeddings()
    head_name = None
    if out_emb is not None:
        head_name = next((n for n, p in params.items() if p is out_emb.weight), aliases.get("lm_head.weight"))
        if head_name is None:
            head_name = next(n for n, p in model.named_parameters(remove_duplicate=False) if p is out_emb.weight)
    head_tied = out_emb is not None and out_emb.weight is emb.weight
    emb_numel = emb.weight.numel()
    head_numel = 0 if out_emb is None or head_tied else out_emb.weight.numel()

    # Multimodal split.
    multimodal = any(side(n)[0] == "vision" for n in params)
    lang_names = set(params)
    if multimodal:
        split = {"language_model": set(), "vision": set(), "unassigned": set()}
        lang_names = set()
        for n in params:
            s, prefix = side(n)
            if s == "language":
                split["language_model"].add(prefix)
                lang_names.add(n)
            elif s == "vision":
                split["vision"].add(prefix)
            else:
                split["unassigned"].add(prefix)
        if split["unassigned"]:
            raise SystemExit("%s: parameters outside the language model and the vision side: %s"
                             % (path, sorted(split["unassigned"])))
        del split["unassigned"]
        out["language_model"] = sum(params[n].numel() for n in lang_names)
        out["vision"] = total - out["language_model"]
        out["split"] = {k: sorted(v) for k, v in split.items()}
        vision_parts = {}
        for n, p in params.items():
            s, prefix = side(n)
            if s == "vision":
                vision_parts[prefix] = vision_parts.get(prefix, 0) + p.numel()
        out["vision_parts"] = vision_parts

    # Layers of the language model.
    layers = {}
    for n, p in params.items():
        m = LAYER_RE.match(n)
        if m and n in lang_names:
            layers.setdefault((m.group(1), int(m.group(2))), {})[m.group(3)] = p
    prefixes = sorted({k[0] for k in layers})
    if len(prefixes) != 1:
        raise SystemExit("%s: language-model layer prefixes %s" % (path, prefixes))
    prefix = prefixes[0]

    # Mixture of experts: routed experts per layer.
    tc = text_config(config)
    e_key, n_experts = first_attr(tc, ("num_local_experts", "num_experts", "n_routed_experts"))
    k_key, top_k = first_attr(tc, ("num_experts_per_tok", "experts_per_token", "moe_topk"))
    routed = {}  # layer index -> routed-expert numel
    routed_tensors = {}
    for (pre, i), ps in layers.items():
        for rel, p in ps.items():
            slot = expert_slot(rel)
            if slot is None:
                continue
            container, index = slot
            if index is None and p.shape[0] != n_experts:
                raise SystemExit("%s: %s.%d.%s has shape %s, not [%s, ...]"
                                 % (path, pre, i, rel, list(p.shape), n_experts))
            if index is not None and not 0 <= index < n_experts:
                raise SystemExit("%s: expert index %d of %s" % (path, index, rel))
            routed[i] = routed.get(i, 0) + p.numel()
            routed_tensors.setdefault(i, []).append(rel)
    if routed:
        if not n_experts or not top_k:
            raise SystemExit("%s: routed experts without num_experts/top_k in the config" % path)
        inactive = 0
        for i, numel in routed.items():
            if numel % n_experts:
                raise SystemExit("%s: layer %d routed experts %d not a multiple of %d" % (path, i, numel, n_experts))
            inactive += numel // n_experts * (n_experts - top_k)
        lang_total = out.get("language_model", total)
        active = total - inactive
        out["moe"] = {
            "num_experts": n_experts, "num_experts_field": e_key,
            "experts_per_token": top_k, "experts_per_token_field": k_key,
            "moe_layers": sorted(routed), "dense_layers": sorted(i for (_, i) in layers if i not in routed),
            "routed_expert_parameters": sum(routed.values()),
            "inactive_parameters": inactive,
            "routed_tensors_first_moe_layer": sorted(routed_tensors[min(routed)]),
        }
        out["active_with_embedding"] = active
        out["active_without_embedding"] = active - (0 if head_tied else emb_numel)
        out["active_without_embedding_and_lm_head"] = active - emb_numel - head_numel
        if multimodal:
            out["language_model_active_with_embedding"] = lang_total - inactive
            out["language_model_active_without_embedding"] = lang_total - inactive - (0 if head_tied else emb_numel)

    # Per-layer breakdown and group totals.
    def layer_dump(i):
        ps = layers[(prefix, i)]
        mod = model.get_submodule("%s.%d" % (prefix, i))
        saved = set(mod.state_dict(keep_vars=True))  # parameters and persistent buffers
        return {
            "index": i,
            "parameters": {rel: p.numel() for rel, p in sorted(ps.items())},
            "shapes": {rel: list(p.shape) for rel, p in sorted(ps.items())},
            "buffers": {rel: {"shape": list(b.shape), "persistent": rel in saved}
                        for rel, b in sorted(mod.named_buffers())},
            "kinds": kinds(ps),
            "total": sum(p.numel() for p in ps.values()),
        }
    indices = sorted(i for (_, i) in layers)
    dense = [i for i in indices if i not in routed]
    moe = [i for i in indices if i in routed]
    out["per_layer_breakdown"] = {
        "layer_prefix": prefix,
        "first_dense_layer": layer_dump(dense[0]) if dense else None,
        "first_moe_layer": layer_dump(moe[0]) if moe else None,
    }
    if multimodal:
        # The vision encoder's first layer, and what lies outside its layers, by path.
        vis = {}
        for n, p in params.items():
            m = LAYER_RE.match(n)
            if n not in lang_names and m:
                vis.setdefault((m.group(1), int(m.group(2))), {})[m.group(3)] = p
        (vpre, vi), vps = min(vis.items())
        vin = {"%s.%d.%s" % (pre, i, rel) for (pre, i), ps in vis.items() for rel in ps}
        out["per_layer_breakdown"]["vision_layer"] = {
            "layer_prefix": vpre, "index": vi, "num_layers": sum(1 for (pre, _) in vis if pre == vpre),
            "parameters": {rel: p.numel() for rel, p in sorted(vps.items())},
            "shapes": {rel: list(p.shape) for rel, p in sorted(vps.items())},
            "total": sum(p.numel() for p in vps.values()),
            "outside_layers": {n: list(p.shape) for n, p in sorted(params.items())
                               if n not in lang_names and n not in vin},
        }
    layer_total = sum(p.numel() for ps in layers.values() for p in ps.values())
    in_layers = {"%s.%d.%s" % (prefix, i, rel) for (_, i), ps in layers.items() for rel in ps}
    rest = {n: p.numel() for n, p in params.items() if n in lang_names and n not in in_layers}
    out["groups"] = {
        "embedding": {emb_name: emb_numel},
        "lm_head": None if out_emb is None else {head_name: out_emb.weight.numel(), "tied": head_tied},
        "layers": layer_total,
        "num_layers": len(indices),
        "outside_layers": rest,
        "vision": out.get("vision", 0),
    }
    out["top_level_buffers"] = {n: list(b.shape) for n, b in model.named_buffers()
                                if not any(n.startswith("%s.%d." % (prefix, i)) for i in indices)
                                and side(n)[0] != "vision"}
    if out["parameters"] != out["parameters_dedup"]:
        raise SystemExit("%s: num_parameters() %d != dedup sum %d" % (path, total, dedup))
    return out


def human(n):
    return "%.3fB" % (n / 1e9) if n >= 1e8 else "%.2fM" % (n / 1e6)


def report(name, r, verbose):
    line = "%-24s %-34s total %s" % (name, r["class"], human(r["parameters"]))
    if "active_with_embedding" in r:
        line += "  active %s (no input emb %s)" % (human(r["active_with_embedding"]),
                                                   human(r["active_without_embedding"]))
    if "vision" in r:
        line += "  language %s vision %s" % (human(r["language_model"]), human(r["vision"]))
    print(line)
    for note in r.get("notes", []):
        print("    note:", note)
    if not verbose:
        return
    g = r["groups"]
    print("    embedding %s  lm_head %s  layers %s x%d  outside layers %s  vision %s"
          % (g["embedding"], g["lm_head"], human(g["layers"]), g["num_layers"],
             g["outside_layers"], human(g["vision"])))
    if "split" in r:
        print("    split:", r["split"])
    if "vision_parts" in r:
        print("    vision parts:", r["vision_parts"])
    for key in ("first_dense_layer", "first_moe_layer", "vision_layer"):
        lay = r["per_layer_breakdown"].get(key)
        if lay is None:
            continue
        pre = lay.get("layer_prefix", r["per_layer_breakdown"]["layer_prefix"])
        print("    %s: %s.%d  (%s) %s" % (key, pre, lay["index"], human(lay["total"]), lay.get("kinds", "")))
        for rel, n in lay["parameters"].items():
            print("      %-52s %-22s %d" % (rel, lay["shapes"][rel], n))
        for rel, shape in lay.get("outside_layers", {}).items():
            print("      outside the layers: %-40s %s" % (rel, shape))
        for rel, b in lay.get("buffers", {}).items():
            print("      buffer %-45s %-22s persistent=%s" % (rel, b["shape"], b["persistent"]))


def run(files, verbose):
    results = {}
    for path in files:
        name = os.path.basename(path)
        with contextlib.redirect_stderr(io.StringIO()):
            results[name] = count(path)
        report(name, results[name], verbose)
    return results


def document(results, argv):
    return {
        "command": "python bench/torch/hf_counts.py " + " ".join(shlex.quote(a) for a in argv),
        "python": platform.python_version(),
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "files": results,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the counts here (JSON)")
    ap.add_argument("--check", nargs="?", const=DEFAULT_OUT, metavar="FILE",
                    help="recompute and compare with FILE (default tests/data/hf/counts.json)")
    ap.add_argument("--files", default="*.json", help="glob of tests/data/hf/ file names (default *.json)")
    ap.add_argument("--quiet", action="store_true", help="print one line per file, not the breakdowns")
    args = ap.parse_args()

    versions = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__}
    if versions != PINNED:
        print("warning: torch %(torch)s, transformers %(transformers)s; the counts are of " % versions
              + "torch %(torch)s, transformers %(transformers)s (requirements.txt)" % PINNED, file=sys.stderr)
    files = sorted(p for p in glob.glob(os.path.join(DATA, "*.json"))
                   if os.path.basename(p) != "counts.json" and fnmatch.fnmatch(os.path.basename(p), args.files))
    if not files:
        raise SystemExit("no file matches %r in tests/data/hf/" % args.files)
    results = run(files, not args.quiet)

    if args.check:
        with open(args.check) as f:
            committed = json.load(f)
        mismatched = ["%s: %s here, %s in %s" % (k, v, committed.get(k), args.check)
                      for k, v in versions.items() if committed.get(k) != v]
        for name, r in results.items():
            want = committed["files"].get(name)
            if want is None:
                mismatched.append("%s: not in %s" % (name, args.check))
            elif json.loads(json.dumps(r)) != want:
                keys = sorted(k for k in set(want) | set(r) if json.loads(json.dumps(r.get(k))) != want.get(k))
                mismatched.append("%s: %s differ" % (name, ", ".join(keys)))
        if args.files == "*.json":
            mismatched += ["%s: in %s, no such file" % (n, args.check) for n in committed["files"] if n not in results]
        for m in mismatched:
            print("MISMATCH", m)
        print("check: %d files, %s" % (len(results), "%d mismatched" % len(mismatched) if mismatched else "all equal"))
        sys.exit(1 if mismatched else 0)
    if args.out:
        argv = ["--out", os.path.relpath(args.out, REPO) if os.path.isabs(args.out) else args.out]
        with open(args.out, "w") as f:
            json.dump(document(results, argv), f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
