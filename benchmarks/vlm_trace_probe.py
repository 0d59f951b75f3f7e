"""Do transformers' vision-language models run a training step on fake tensors, with images?

    PYTHONPATH=. .venv/bin/python benchmarks/vlm_trace_probe.py [TYPE ...]

The exact trace (`vram.trace`) builds causal LMs from flat configs; a VLM's config nests its
layer counts in `text_config` / `vision_config` and its forward needs pixel inputs. This probe
checks, per VLM type of issue 22, that the class a fine-tuner loads (`AutoModelForImageTextToText`)
builds under `FakeTensorMode` from the type's default config (`tests/data/families/<type>.json`)
with 2 text layers, and that one forward with one image per sample plus the backward of the loss
runs in bf16 with SDPA: the groundwork for tracing VLM setups. It prints the image tokens it fed
and the vision tower's patch count, or why the step could not run.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from typing import Any

from benchmarks.family_defaults import FIXTURES
from vram.trace.vision import constant, prepare

VLM_TYPES = ("gemma3", "qwen3_5", "llama4", "mistral3", "qwen2_5_vl", "qwen3_vl", "mllama", "llava",
             "internvl", "idefics3", "paligemma")
TEXT_TOKENS = 32


#: Types whose default config cannot run a step (found by this probe), and the catalog config
#: used instead: Gemma3Config's default vision tower (SigLIP 224 px / patch 16: 14x14 patches)
#: cannot average-pool to its own `mm_tokens_per_image` (16x16: "stride should not be zero");
#: Llama4Config's default `vision_output_dim` (7,680) is not its projector's input (4,096).
#: Qwen2_5_VLConfig's, Qwen3VLConfig's and Qwen3_5Config's default vision `out_hidden_size` is
#: not their default text width (the image features do not fit the embeddings).
INSTEAD = {"gemma3": "gemma-3-4b", "llama4": "llama-4-scout", "qwen2_5_vl": "qwen2.5-vl-7b",
           "qwen3_vl": "qwen3-vl-4b", "qwen3_5": "qwen3.5-27b"}
MODELS = FIXTURES.parents[2] / "data" / "models"


def shrunk(model_type: str) -> dict[str, Any]:
    """The default config with 2 text layers (mllama: 5, one of them cross-attention)."""
    path = (MODELS / f"{INSTEAD[model_type]}.json" if model_type in INSTEAD
            else FIXTURES / f"{model_type}.json")
    config: dict[str, Any] = json.loads(path.read_text())
    text = config.get("text_config", config)  # Qwen2.5-VL's config.json is flat
    layers = 5 if model_type == "mllama" else 2
    text["num_hidden_layers"] = layers
    if model_type == "mllama":
        text["cross_attention_layers"] = [3]
    for key in ("layer_types", "no_rope_layers", "moe_layers"):
        if isinstance(text.get(key), list):
            text[key] = (text[key] * layers)[:layers]
    if model_type in ("qwen3_5",):
        text["layer_types"] = ["linear_attention", "full_attention"]
    if model_type == "idefics3":
        # Idefics3Config's default vision tower (224 px / patch 32: 7x7 patches) cannot be
        # pixel-shuffled by its default scale_factor 2; 448 px gives 14x14 patches
        config["vision_config"]["image_size"] = 448
    return config


def image_inputs(model_type: str, config: dict[str, Any], torch: Any, hf: Any,
                 ) -> tuple[dict[str, Any], int, int, int]:
    """(inputs for one image, the image token id, image tokens, vision tokens per image)."""
    vision = config["vision_config"]
    token = getattr(hf, "image_token_id", None)
    token = getattr(hf, "image_token_index", None) if token is None else token
    bf16 = torch.bfloat16
    if model_type in ("qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        p, m, t = vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"]
        gh = gw = 16
        pixels = torch.zeros(gh * gw, 3 * t * p * p, dtype=bf16)
        grid = torch.tensor([[1, gh, gw]])  # a constant: see CONSTANT_NUMEL_LIMIT
        return ({"pixel_values": pixels, "image_grid_thw": grid}, token,
                gh * gw // (m * m), gh * gw)
    if model_type == "gemma3":
        size = vision["image_size"]
        return ({"pixel_values": torch.zeros(1, 3, size, size, dtype=bf16)},
                token, config["mm_tokens_per_image"],
                (size // vision["patch_size"]) ** 2)
    if model_type in ("llava", "paligemma"):
        size, patch = vision["image_size"], vision["patch_size"]
        n = (size // patch) ** 2
        return ({"pixel_values": torch.zeros(1, 3, size, size, dtype=bf16)},
                token, n, n + (1 if model_type == "llava" else 0))
    if model_type == "internvl":
        size, patch = vision["image_size"][0], vision["patch_size"][0]
        n = int((size // patch) ** 2 * config["downsample_ratio"] ** 2)
        return ({"pixel_values": torch.zeros(1, 3, size, size, dtype=bf16)},
                token, n, (size // patch) ** 2 + 1)
    if model_type == "idefics3":
        size, patch = vision["image_size"], vision["patch_size"]
        n = (size // patch) ** 2 // config["scale_factor"] ** 2
        # Idefics3 drops all-zero padding images by value: the pixels must be readable
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            ones = torch.ones(1, 1, 3, size, size, dtype=bf16)
        pixels = constant(ones)
        return ({"pixel_values": pixels},
                token, n, (size // patch) ** 2)
    if model_type == "llama4":
        size, patch = vision["image_size"], vision["patch_size"]
        n = int((size // patch) ** 2 * vision["pixel_shuffle_ratio"] ** 2)
        return ({"pixel_values": torch.zeros(1, 3, size, size, dtype=bf16)},
                token, n, (size // patch) ** 2 + 1)
    if model_type == "mistral3":
        size, patch, merge = 448, vision["patch_size"], config["spatial_merge_size"]
        n = (size // patch // merge) ** 2
        return ({"pixel_values": torch.zeros(1, 3, size, size, dtype=bf16),
                 "image_sizes": torch.tensor([[size, size]])},
                token, n, (size // patch) ** 2)
    if model_type == "mllama":
        size, tiles = vision["image_size"], vision["max_num_tiles"]
        inputs = {
            "pixel_values": torch.zeros(1, 1, tiles, 3, size, size, dtype=bf16),
            "aspect_ratio_ids": torch.tensor([[1]]),
            "aspect_ratio_mask": torch.tensor([[[1] * tiles]]),
            "cross_attention_mask": torch.tensor([[[[1] * tiles]] * (TEXT_TOKENS + 1)]),
        }
        return inputs, token, 1, tiles * ((size // vision["patch_size"]) ** 2 + 1)
    raise ValueError(model_type)


def probe(model_type: str) -> str:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.initialization import no_init_weights

    # A fake tensor made from Python data keeps its values ("constant") and ops on constants run
    # for real, but only up to CONSTANT_NUMEL_LIMIT elements (1 by default). The VLMs' metadata
    # (grid sizes, image-token masks, window lengths) is read back with .tolist()/.item(): the
    # trace's `prepare` keeps it as constants and runs transformers' metadata helpers on their
    # values. Weights and activations are never made from Python data: they stay fake.
    prepare()

    config = shrunk(model_type)
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    hf_config = AutoConfig.for_model(model_type, **fields)
    start = time.perf_counter()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            with no_init_weights():  # SigLIP's trunc_normal_ reads values back
                model = AutoModelForImageTextToText.from_config(
                    hf_config, dtype=torch.bfloat16, attn_implementation="sdpa")
            model.train()
            inputs, token_id, n_image, n_vision = image_inputs(model_type, config, torch,
                                                               hf_config)
            ids = torch.tensor([[token_id] * n_image + [1] * TEXT_TOKENS])
            extra: dict[str, Any] = {}
            if model_type in ("gemma3", "paligemma"):
                extra["token_type_ids"] = torch.tensor([[1] * n_image + [0] * TEXT_TOKENS])
            if model_type in ("qwen3_vl", "qwen3_5"):
                extra["mm_token_type_ids"] = torch.tensor([[1] * n_image + [0] * TEXT_TOKENS])
            if model_type == "llama4":
                # transformers 5.24.0 Llama4ForConditionalGeneration.forward reads
                # `outputs.image_outputs` off the language model's MoeCausalLMOutputWithPast
                # (modeling_llama4.py line 1318), which has none: only the tuple path returns
                extra["return_dict"] = False
            out = model(input_ids=ids, labels=ids, **inputs, **extra)
            loss = out[0] if isinstance(out, tuple) else out.loss
            loss.backward()
    except Exception as exc:  # every failure is a finding
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"FAIL {type(exc).__name__}: {text[:160]}"
    return (f"ok {type(model).__name__}: image tokens {n_image}, vision tokens {n_vision}, "
            f"{time.perf_counter() - start:.1f} s")


def main() -> None:
    warnings.filterwarnings("ignore")
    import torch  # its logging setup runs on import: quiet fake_tensor's tracebacks after it

    del torch
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    for model_type in sys.argv[1:] or VLM_TYPES:
        print(f"{model_type:<11} {probe(model_type)}", flush=True)


if __name__ == "__main__":
    main()
