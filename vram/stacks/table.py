"""What each training stack really does, where stacks differ in ways that change memory.

The same setup costs different memory in Hugging Face Trainer + PEFT, LitGPT and torchtune,
because each makes its own choices about dtypes, tied heads, quantized layers and the loss.
`data/stacks.toml` holds one table per stack: every behaviour and every knob default, each
value beside the `file@version` it was read from. This module loads it once and validates it
row by row (an error names the stack and the entry); `docs/stacks.md` is generated from it.
A framework without a row is an error: a new stack never silently behaves like another.

    >>> stack_row(Framework.LITGPT).unties_head
    True
    >>> stack_row(Framework.HF_TRAINER).defaults["ckpt_reentrant"]
    False
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from vram.errors import CatalogError
from vram.paths import data_dir
from vram.setup import TrainingSetup
from vram.setup.enums import ContextParallel, Fp8Recipe, Framework

#: The overlays of `defaults`, in the order they apply (`vram.stacks.resolve`).
OVERLAYS: tuple[str, ...] = ("when_adapters", "when_sharded_qlora")


class StackRow(BaseModel):
    """One stack's behaviours and knob defaults, as read from its source (`sources`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    #: Builds a separate lm_head, copying a tied embedding into it.
    unties_head: bool
    #: QLoRA quantizes the output head too (every nn.Linear becomes Linear4bit).
    quantizes_head: bool
    #: QLoRA on one device: `prepare_model_for_kbit_training` casts every non-quantized
    #: parameter to fp32.
    kbit_upcast: bool
    #: ... and also when the QLoRA base is sharded (TRL skips the upcast there).
    kbit_upcast_sharded: bool
    #: ... then casts the norms, the embedding and the head back to the model's 16 bits
    #: (axolotl, for flash attention), so the upcast leaves only biases in fp32.
    kbit_recasts_16bit: bool
    #: LoRA adapters are upcast to fp32 (PEFT's `autocast_adapter_dtype=True`).
    fp32_adapters: bool
    #: The loss runs on `logits.float()`.
    upcasts_logits: bool
    #: AdamW/Lion step with fused kernels (no full-size temporaries); False: foreach.
    fused_optimizer: bool
    #: The key/value heads are expanded to all query heads before attention (a copy).
    expands_kv: bool
    #: Norms upcast their input to fp32 and keep that copy for backward.
    norm_keeps_fp32_input: bool
    #: LoRA on a fused qkv adapts the selected slices (not the whole fused module).
    adapts_fused_slices: bool
    #: QLoRA's 4-bit Linear keeps its input for backward (bitsandbytes MatMul4Bit), rather than
    #: the weight only (torchao's NF4 linear).
    quantized_linear_keeps_input: bool
    #: A trained RMSNorm keeps its normalized input in fp32 (multiplies by `weight.float()`).
    norm_keeps_fp32_normalized: bool
    #: Sharded LoRA keeps frozen parameters unsharded through backward (FSDP1, PyTorch <= 2.1).
    fsdp_keeps_frozen_unsharded: bool
    #: The MLP activation is a fused kernel (F.silu / F.gelu) whatever the config says.
    fused_activations: bool
    #: With compile on, the recipes compile the loss and drop the result: a chunked loss is
    #: compiled in place, an unchunked one stays eager (torchtune; its single-device LoRA
    #: recipe keeps the result): `vram.stacks.resolve`.
    drops_compiled_unchunked_loss: bool
    #: The training loop keeps the logits referenced through backward.
    keeps_logits: bool
    #: The loop keeps the previous step's `logits` and `loss` into the next forward.
    keeps_previous_graph: bool
    #: QLoRA quantizes from an fp16 copy, so each dequantization is fp16 then a cast.
    quantizes_from_fp16: bool
    #: The module's floating outputs are cast to fp32 (Lightning Fabric `convert_output`).
    casts_output_to_fp32: bool
    #: The stack's chunked loss is a fused linear + cross-entropy (Liger): no whole logits.
    chunked_loss_fuses_head: bool
    #: The stack's fused linear loss is Apple's Cut Cross-Entropy (saves the hidden states and
    #: a logsumexp; the gradients are built in backward); False: Liger's (built in forward).
    fused_loss_is_cce: bool
    #: QLoRA quantizes MoE expert banks (experts as nn.Linear); False: the model code holds a
    #: bank as one 3-D parameter, which bitsandbytes' Linear replacement passes by.
    quantizes_expert_banks: bool
    #: A vision-language model's images are scaled into the `min_pixels`/`max_pixels` bounds by
    #: the stack before the model's processor, which then applies its own (LLaMA-Factory).
    resizes_images_before_processor: bool
    #: A run can name PEFT `target_parameters`: LoRA on the MoE expert banks (`lora_experts`).
    lora_target_parameters: bool
    #: 'all-linear' reaches PEFT as the names of the model's nn.Linear modules (the stack lists
    #: them), not as PEFT's own 'all-linear', which on transformers 5 also names the experts.
    all_linear_by_module_name: bool
    #: The stack turns the KV cache off on the model's top-level config only, so a
    #: vision-language model's language model, which reads its own `text_config.use_cache`,
    #: still fills a cache in each training forward (`vram.memory.text_cache`).
    leaves_text_cache_on: bool
    #: Under LoRA/QLoRA (a frozen embedding) the embedding's output requires grad only when
    #: the run checkpoints (`enable_input_require_grads`), so without checkpointing what runs
    #: before the first trainable tensor keeps nothing (`vram.memory.activations.lead`).
    #: False: counted as requiring grad in every run (every layer keeps).
    input_grad_only_with_ckpt: bool
    #: Runs tensor parallel (`tp`).
    runs_tensor_parallel: bool
    #: Runs pipeline parallel (`pp`).
    runs_pipeline_parallel: bool
    #: The context-parallel kinds it runs (`cp_kind`); empty: no context parallel.
    context_parallel_kinds: tuple[ContextParallel, ...]
    #: Under tensor parallel the logits stay split by vocabulary into the loss (torch's
    #: `loss_parallel`); False: they are gathered whole on every rank first.
    loss_parallel: bool
    #: Runs expert parallel (`ep`).
    runs_expert_parallel: bool
    #: The float8 recipes it trains with (`fp8`).
    fp8_recipes: tuple[Fp8Recipe, ...]
    #: The stack's default of each knob that defers to it, keyed by the `TrainingSetup` field
    #: (None: the stack leaves it to the library's default).
    defaults: Mapping[str, Any]
    #: `defaults` as the stack's LoRA/QLoRA recipes set them.
    when_adapters: Mapping[str, Any] = Field(default_factory=dict)
    #: `defaults` in the stack's sharded-QLoRA recipe (a ZeRO-3/FSDP-sharded 4-bit base).
    when_sharded_qlora: Mapping[str, Any] = Field(default_factory=dict)
    #: `file@version` of every entry, keyed `name` or `defaults.name` / `when_*.name`.
    sources: Mapping[str, str]


    @field_validator("context_parallel_kinds", mode="before")
    @classmethod
    def _cp_kinds(cls, value: object) -> object:
        # a TOML list of the knob's text values
        return tuple(ContextParallel(v) for v in value) if isinstance(value, list) else value

    @field_validator("fp8_recipes", mode="before")
    @classmethod
    def _fp8_recipes(cls, value: object) -> object:
        return tuple(Fp8Recipe(v) for v in value) if isinstance(value, list) else value


#: The behaviours of a row (every one needs a source).
BEHAVIOURS: tuple[str, ...] = tuple(
    name for name in StackRow.model_fields
    if name not in ("defaults", "sources", *OVERLAYS))


@cache
def _knob_adapter(field: str) -> TypeAdapter[Any]:
    """A validator of one `TrainingSetup` field's values, with its constraints."""
    info = TrainingSetup.model_fields[field]
    constrained: Any = Annotated[info.annotation, *info.metadata]
    return TypeAdapter(constrained)


def _entries(table: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """{name: value} and {name: source} of a table of `name = {value, source}` entries."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, entry in table.items():
        if not isinstance(entry, dict) or set(entry) - {"value", "source"} or "source" not in entry:
            raise CatalogError(f"stacks.toml [{where}] {name}: give {{ value = ..., "
                               "source = \"file@version ...\" }")
        values[name] = entry.get("value")
        sources[name] = entry["source"]
    return values, sources


def _merged(tables: Mapping[str, Any], name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The stack's table with `like` resolved: the base's entries, then this stack's."""
    table = dict(tables[name])
    base_name = table.pop("like", None)
    if base_name is None:
        return table
    if base_name not in tables or base_name in seen:
        raise CatalogError(f"stacks.toml [{name}] like: {base_name!r} is not a stack above it")
    base = _merged(tables, base_name, (*seen, name))
    for key, value in table.items():
        base[key] = {**base[key], **value} if key in ("defaults", *OVERLAYS) else value
    return base


def _knob_values(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Each default validated as the `TrainingSetup` field it defaults."""
    fields = TrainingSetup.model_fields
    checked: dict[str, Any] = {}
    for field, value in values.items():
        if field not in fields or fields[field].default is not None:
            raise CatalogError(f"stacks.toml [{where}] {field}: not a knob that defers to the "
                               "stack (a TrainingSetup field whose default is None)")
        try:
            checked[field] = _knob_adapter(field).validate_python(value)
        except ValidationError as exc:
            raise CatalogError(f"stacks.toml [{where}] {field}: "
                               f"{exc.errors()[0]['msg']}") from None
    return checked


def _row(tables: Mapping[str, Any], name: str) -> StackRow:
    table = _merged(tables, name)
    fields: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for part in ("defaults", *OVERLAYS):
        values, cited = _entries(table.pop(part, {}), f"{name}.{part}")
        fields[part] = MappingProxyType(_knob_values(values, f"{name}.{part}"))
        sources.update({f"{part}.{key}": source for key, source in cited.items()})
    values, cited = _entries(table, name)
    sources.update(cited)
    try:
        return StackRow(**values, **fields, sources=MappingProxyType(sources))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise CatalogError(f"stacks.toml [{name}] {where}: {error['msg']}") from None


@cache
def stacks() -> MappingProxyType[Framework, StackRow]:
    """Every stack `vram` knows, one validated row each (`data/stacks.toml`)."""
    with (data_dir() / "stacks.toml").open("rb") as file:
        tables = tomllib.load(file)
    unknown = sorted(set(tables) - {f.value for f in Framework})
    if unknown:
        raise CatalogError(f"stacks.toml [{unknown[0]}]: not a vram.Framework value")
    rows = {Framework(name): _row(tables, name) for name in tables}
    for part in ("defaults", *OVERLAYS):
        stated = [frozenset(getattr(row, part)) for row in rows.values()]
        differ = frozenset.union(*stated) - frozenset.intersection(*stated)
        if differ:
            raise CatalogError(f"stacks.toml: every stack states the same {part}; "
                               f"{sorted(differ)[0]} is missing from some")
    return MappingProxyType(rows)


def stack_row(framework: Framework) -> StackRow:
    """The row of `framework`; a framework without one is an error, not a guess."""
    row = stacks().get(framework)
    if row is None:
        known = ", ".join(sorted(f.value for f in stacks()))
        raise CatalogError(f"framework: no stack profile for {framework.value!r}; "
                           f"known: {known}")
    return row
