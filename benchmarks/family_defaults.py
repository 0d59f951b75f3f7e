"""Count the parameters of each 2026 model type's default config, exactly, with transformers.

    PYTHONPATH=. .venv/bin/python benchmarks/family_defaults.py [--check] [TYPE ...]

For every model type of issue 22 this builds the type's default config (`AutoConfig.for_model`,
transformers 5.24.0) and instantiates the class a fine-tuner loads on the meta device: the
image-text-to-text class for a type that has one (its count includes the vision tower and the
projector), else the causal-LM class. It writes

* `tests/data/families/<type>.json`: the default config (`config.to_dict()`), the fixture the
  families' parameter-count test builds from;
* `tests/data/families/counts.csv`: type, class, exact count (`sum(p.numel())` over
  `model.parameters()`, shared tensors once, buffers not counted: `model.num_parameters()`);
* `benchmarks/family_defaults.md`: the same counts split into parts (embedding, head, per-layer
  attention / linear attention / SSM / convolution / MLP / routed experts / router / shared
  experts / norms, vision tower, projector) and the layer kinds.

`--check` rebuilds every config from its committed fixture and fails if a count moved.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "families"
TABLE = ROOT / "benchmarks" / "family_defaults.md"

#: The 34 model types of issue 22, in the issue's order.
TYPES = (
    "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5", "gemma3_text", "gemma3",
    "gpt_oss", "llama4_text", "llama4", "glm4", "glm4_moe", "olmo3", "seed_oss", "smollm3",
    "mistral3", "phi3", "granitemoehybrid", "deepseek_v3", "minimax_m2", "lfm2", "nemotron_h",
    "jamba", "falcon_h1", "ernie4_5_moe", "exaone4", "apertus", "qwen2_5_vl", "qwen3_vl",
    "mllama", "llava", "internvl", "idefics3", "paligemma",
)

PARTS = ("embedding", "head", "attention", "cross_attn", "linear_attn", "ssm", "conv", "mlp",
         "experts", "router", "shared", "norms", "vision", "projector", "other")

#: Top-level modules of a vision-language model that belong to the image side.
_VISION_ROOTS = ("vision_tower", "vision_model", "visual")
#: Modules that carry vision features into the language model's width.
_PROJECTOR = re.compile(r"(^|\.)(multi_modal_projector|connector|merger|deepstack_merger_list|"
                        r"vision_adapter)(\.|$)")
_LAYER = re.compile(r"^(?P<prefix>.*\blayers)\.(?P<index>\d+)\.(?P<rest>.+)$")


@dataclass
class Count:
    model_type: str
    cls: str
    total: int
    parts: Counter[str] = field(default_factory=Counter)
    layer_kinds: Counter[str] = field(default_factory=Counter)
    layer_params: dict[str, set[int]] = field(default_factory=dict)
    unclassified: list[str] = field(default_factory=list)


def model_class(model_type: str) -> Any:
    """The auto class a fine-tuner loads: image-text-to-text where the type has one."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto import modeling_auto

    if model_type in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def build_config(model_type: str, fields: dict[str, Any] | None = None) -> Any:
    from transformers import AutoConfig

    clean = {k: v for k, v in (fields or {}).items()
             if k not in ("model_type", "transformers_version", "architectures")}
    return AutoConfig.for_model(model_type, **clean)


def instantiate(config: Any) -> Any:
    import torch

    with torch.device("meta"):
        return model_class(config.model_type).from_config(config)


def _layer_part(rest: str, classes: list[str]) -> str:
    """The part of a decoder layer a parameter belongs to, from its path and module classes."""
    chain = " ".join(classes)
    segments = rest.split(".")
    if "experts" in segments and not {"shared_experts", "shared_expert"} & set(segments):
        return "experts"
    if re.search(r"Router", chain) or "router" in segments or "shared_expert_gate" in segments:
        return "router"
    if "gate" in segments and re.search(r"Moe|MoE", chain) and segments[-1] != "gate":
        return "router"  # the router of a MoE block is its `gate` Linear
    if {"shared_expert", "shared_experts", "shared_mlp"} & set(segments):
        return "shared"
    if "GatedDeltaNet" in chain:
        return "linear_attn"
    if re.search(r"Mamba|Mixer", chain):
        return "ssm"
    if "ShortConv" in chain:
        return "conv"
    if "cross_attn" in segments[0]:
        return "cross_attn"
    if "Attention" in chain:
        return "attention"
    if re.search(r"MLP|FeedForward|Mlp", chain):
        return "mlp"
    return "norms"


def count(model_type: str, config: Any) -> Count:
    import torch

    model = instantiate(config)
    embedding = {id(p) for p in model.get_input_embeddings().parameters()}
    out = model.get_output_embeddings()
    head = {id(p) for p in out.parameters()} if out is not None else set()
    modules = dict(model.named_modules())
    result = Count(model_type, type(model).__name__,
                   sum(p.numel() for p in model.parameters()))
    per_layer: dict[tuple[str, int], Counter[str]] = {}
    seen: set[int] = set()
    for name, param in model.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        n = param.numel()
        first = name.removeprefix("model.").split(".")[0]
        if _PROJECTOR.search(name):
            part = "projector"
        elif first in _VISION_ROOTS:
            part = "vision"
        elif id(param) in embedding:
            part = "embedding"
        elif id(param) in head:
            part = "head"
        elif match := _LAYER.match(name):
            prefix, index, rest = match["prefix"], int(match["index"]), match["rest"]
            path = f"{prefix}.{index}"
            classes = []
            for segment in rest.split(".")[:-1]:
                path = f"{path}.{segment}"
                classes.append(type(modules[path]).__name__)
            part = _layer_part(rest, classes)
            per_layer.setdefault((prefix, index), Counter())[part] += n
        else:
            part = "other"
        result.parts[part] += n
    for counter in per_layer.values():
        kind = "+".join(p for p in PARTS if counter.get(p) and p != "norms") or "norms"
        result.layer_kinds[kind] += 1
        result.layer_params.setdefault(kind, set()).add(sum(counter.values()))
    assert sum(result.parts.values()) == result.total, model_type
    del torch
    return result


#: `PreTrainedConfig` bookkeeping that no shape depends on (dropped from the fixtures).
_NOISE = frozenset({
    "_name_or_path", "architectures", "chunk_size_feed_forward", "dtype", "id2label",
    "label2id", "output_attentions", "output_hidden_states", "problem_type", "return_dict",
    "transformers_version", "is_encoder_decoder",
})


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in _NOISE}
    return value


def write_fixture(model_type: str, config: Any) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    data = _clean(config.to_dict())
    path = FIXTURES / f"{model_type}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_fixture(model_type: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{model_type}.json").read_text())
    return data


def _kinds(c: Count) -> str:
    parts = []
    for kind, n in c.layer_kinds.items():
        sizes = sorted(c.layer_params[kind])
        each = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}..{sizes[-1]:,}"
        parts.append(f"{n}× {kind} ({each} each)")
    return "; ".join(parts)


#: What the default configs hold that a reader of the table would not guess.
NOTES = """
## Notes

- Every type builds from its default config with no settings (none needed one).
- `lfm2`: the default config's `full_attn_idxs` lists every layer, so it has no short-convolution
  layers at all; the convolution physics needs a checkpoint's config (`layer_types`).
- `granitemoehybrid`: the default's `layer_types` are all Mamba-2 (no attention layer).
- `nemotron_h`: the default has 4 layers, one of each block type (Mamba-2, MoE, attention, MLP).
- `llama4_text` / `llama4`: every layer is MoE (`interleave_moe_layer_step` 1, Scout's layout);
  3 of 4 layers use chunked attention (`attention_chunk_size` 8192), every 4th has no RoPE.
- `glm4_moe`, `deepseek_v3`: `num_nextn_predict_layers` (the multi-token-prediction layer) is
  not built by transformers and not counted.
- `ernie4_5_moe`: the router's `e_score_correction_bias` is an `nn.Parameter` (counted under
  `router`); DeepSeek-V3's is a buffer (not counted).
- `mllama`: the input embedding has 8 more rows than the head (128,264 vs 128,256).
- `apertus`: the xIELU activation has 2 parameters per layer (`alpha_p`, `alpha_n`, in `mlp`).
"""


def markdown(counts: list[Count]) -> str:
    import torch
    import transformers

    shown = [p for p in PARTS if any(c.parts.get(p) for c in counts)]
    lines = [
        "# Issue 22's model types: parameters of each type's default config",
        "",
        f"Generated by `benchmarks/family_defaults.py` (transformers {transformers.__version__},"
        f" torch {torch.__version__}). Each type's default config (`AutoConfig.for_model(type)`,"
        " no settings) instantiated on the meta device with the class a fine-tuner loads"
        " (`AutoModelForImageTextToText` where the type has one, else `AutoModelForCausalLM`);"
        " `total` is `sum(p.numel() for p in model.parameters())` (shared tensors once, no"
        " buffers). The configs are `tests/data/families/<type>.json`.",
        "",
        "Parts: `embedding` the input embedding; `head` an untied LM head; per decoder layer"
        " `attention` (softmax attention incl. q/k norms, sinks), `cross_attn`, `linear_attn`"
        " (Gated DeltaNet), `ssm` (Mamba mixers), `conv` (short convolutions), `mlp` (dense),"
        " `experts` (routed banks), `router`, `shared` (shared experts), `norms` (layer norms and"
        " gates); `vision` the vision tower, `projector` the merger/projector/connector;"
        " `other` final norms and the like.",
        "",
        "| type | class | total | " + " | ".join(shown) + " | layers |",
        "|---|---|---:|" + "---:|" * len(shown) + "---|",
    ]
    for c in counts:
        cells = [f"{c.parts[p]:,}" if c.parts.get(p) else "" for p in shown]
        lines.append(f"| {c.model_type} | {c.cls} | {c.total:,} | " + " | ".join(cells)
                     + f" | {_kinds(c)} |")
    return "\n".join(lines) + "\n" + NOTES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("types", nargs="*", default=list(TYPES))
    parser.add_argument("--check", action="store_true",
                        help="rebuild from the committed fixtures; fail if a count moved")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    counts: list[Count] = []
    failed: list[str] = []
    for model_type in args.types:
        try:
            if args.check:
                config = build_config(model_type, read_fixture(model_type))
            else:
                config = build_config(model_type)
            result = count(model_type, config)
        except Exception as exc:  # report every type, then fail
            failed.append(f"{model_type}: {type(exc).__name__}: {str(exc)[:200]}")
            print(failed[-1], file=sys.stderr)
            continue
        counts.append(result)
        print(f"{model_type:<18} {result.cls:<40} {result.total:>16,}", file=sys.stderr)
        if not args.check:
            write_fixture(model_type, config)
    if args.check:
        with (FIXTURES / "counts.csv").open() as handle:
            want = {row["model_type"]: int(row["params"]) for row in csv.DictReader(handle)}
        for c in counts:
            if want.get(c.model_type) != c.total:
                failed.append(f"{c.model_type}: {c.total:,} != committed {want.get(c.model_type)}")
    elif args.types == list(TYPES):
        with (FIXTURES / "counts.csv").open("w", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["model_type", "class", "params"])
            writer.writerows((c.model_type, c.cls, c.total) for c in counts)
        TABLE.write_text(markdown(counts))
    if failed:
        raise SystemExit("\n".join(failed))


if __name__ == "__main__":
    main()
