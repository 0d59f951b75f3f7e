"""Parameter groups: which parameters exist in a run, how they are stored, which ones train.

The estimate splits a model into groups that share a storage format: the token embedding,
the output head, the Linear weights of the layers (what QLoRA quantizes), norms and biases,
and the LoRA adapters. Every byte of the weights, gradients and optimizer buckets is a sum over
these groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from vram.model.lora_reach import (
    EVERY_LINEAR,
    LoraReach,
    Roles,
    adapter_params_of,
    bank_rank_factor,
    is_bank_parameter,
    lora_reach,
    module_adapted,
)
from vram.model.spec import FUSED_PARTS, HeadKind, Linear, ModelSpec, Role
from vram.setup import ALL_LINEAR, Method, Quant, TrainingSetup
from vram.stacks.profile import StackProfile
from vram.stacks.resolve import resolve
from vram.units import BF16_BYTES, FP32_BYTES, INT8_BYTES, ceil_div

#: NF4 and int8 blocks as bitsandbytes stores them (bitsandbytes/functional.py quantize_4bit:
#: blocksize 64, fp32 absmax per block; compress_statistics quantizes absmax to 8 bits in
#: blocks of 256 with an fp32 scale per block).
NF4_BLOCK = 64
NF4_DQ_BLOCK = 256


class Storage(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    NF4 = "nf4"
    NF4_DQ = "nf4-dq"
    INT8 = "int8"


STORAGE_BYTES: dict[Storage, float] = {
    Storage.FP32: float(FP32_BYTES),
    Storage.BF16: float(BF16_BYTES),
    Storage.NF4: 0.5 + FP32_BYTES / NF4_BLOCK,
    Storage.NF4_DQ: 0.5 + 1 / NF4_BLOCK + FP32_BYTES / (NF4_BLOCK * NF4_DQ_BLOCK),
    Storage.INT8: float(INT8_BYTES),
}

#: A dense parameter's storage by its bytes per value.
DENSE_STORAGE: dict[int, Storage] = {FP32_BYTES: Storage.FP32, BF16_BYTES: Storage.BF16}


def quantized_bytes(numel: int, d_out: int, storage: Storage) -> int:
    """Bytes of one quantized weight matrix, with its quantization constants.

    NF4: 4-bit codes (numel/2 bytes) + one fp32 absmax per 64 values (QLoRA paper, §2).
    NF4 with double quantization: absmax as 8-bit per 64 values + an fp32 scale per 256 absmax.
    int8 (LLM.int8): one byte per value + an fp32 scale per output row (bitsandbytes SCB).
    """
    if storage is Storage.INT8:
        return INT8_BYTES * numel + FP32_BYTES * d_out
    blocks = ceil_div(numel, NF4_BLOCK)
    codes = ceil_div(numel, 2)
    if storage is Storage.NF4:
        return codes + FP32_BYTES * blocks
    if storage is Storage.NF4_DQ:
        return codes + blocks + FP32_BYTES * ceil_div(blocks, NF4_DQ_BLOCK)
    raise ValueError(f"storage: {storage} is not a quantized format")


@dataclass(frozen=True, slots=True)
class Matrices:
    """`count` 2-D weights of `rows` × `cols` values."""

    rows: int
    cols: int
    count: int = 1

    @property
    def numel(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True, slots=True)
class ParamGroup:
    key: str
    label: str
    n_params: int
    storage: Storage
    trainable: bool
    bytes: int
    #: The group's 2-D weights by shape (Adafactor factors their second moment); values not
    #: in a listed matrix are vectors.
    matrices: tuple[Matrices, ...] = ()
    #: The group's tensors as (values, how many) where optimizer state is sized tensor by
    #: tensor (adapters, norm and bias vectors: allocator blocks and 8-bit's 32-bit fallback
    #: matter there). Empty for the large matrices, whose state is sized over the group's
    #: values pooled.
    tensors: tuple[tuple[int, int], ...] = ()


#: The CUDA caching allocator hands out multiples of 512 bytes (kMinBlockSize);
#: torch.cuda.memory_allocated() counts the rounded sizes.
ALLOCATOR_BLOCK_BYTES = 512


def allocated_bytes(nbytes: int) -> int:
    """What the CUDA caching allocator charges for one tensor of `nbytes`."""
    return ceil_div(nbytes, ALLOCATOR_BLOCK_BYTES) * ALLOCATOR_BLOCK_BYTES


def adapter_params(linear: Linear, rank: int, roles: frozenset[Role] | None) -> int:
    """LoRA parameters on one Linear: r·(d_in + d_out) (Hu et al. 2021, §4.1).

    On a fused projection (q,k,v in one matrix) the adapter covers the selected parts only, as
    LitGPT's LoRAQKVLinear does; `roles=None` adapts the whole output.
    """
    if roles is None:
        return rank * (linear.d_in + linear.d_out) * linear.copies
    parts = dict(zip(_part_roles(linear), linear.parts, strict=True))
    width = sum(w for role, w in parts.items() if role in roles)
    n_parts = sum(1 for role in parts if role in roles)
    return (rank * linear.d_in * n_parts + rank * width) * linear.copies


def _part_roles(linear: Linear) -> tuple[Role, ...]:
    if linear.role is Role.QKV:
        return (Role.Q, Role.K, Role.V)
    if linear.role is Role.GATE_UP:
        return (Role.GATE, Role.UP)
    return (linear.role,)


def head_targeted(setup: TrainingSetup) -> bool:
    return setup.lora_targets != ALL_LINEAR and "lm_head" in setup.lora_targets


def _dense_storage(setup: TrainingSetup, profile: StackProfile) -> Storage:
    """How the run's non-quantized parameters are stored (see `vram.stacks.precision`): trained ones
    for full fine-tuning, a frozen base's for LoRA and QLoRA."""
    policy = profile.precision
    return DENSE_STORAGE[policy.frozen_weights if setup.trains_adapters else policy.weights]


def _group(key: str, label: str, n: int, storage: Storage, trainable: bool, *,
           n_bytes: int | None = None, matrices: tuple[Matrices, ...] = (),
           tensors: tuple[tuple[int, int], ...] = ()) -> list[ParamGroup]:
    """One group, or none when it holds no parameters."""
    if n <= 0:
        return []
    size = n_bytes if n_bytes is not None else int(n * STORAGE_BYTES[storage])
    return [ParamGroup(key, label, n, storage, trainable, size, matrices, tensors)]


def param_groups(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> list[ParamGroup]:
    """Every parameter of the run, grouped by storage and trainability."""
    full = setup.method is Method.FULL
    quant = setup.effective_quant
    q_storage = Storage(quant.value) if quant is not Quant.NONE else None
    dense = _dense_storage(setup, profile)
    h, vocab = model.hidden_size, model.vocab_size
    groups = [
        *_group("embedding", "token embedding (vocab × hidden)", model.embedding_params, dense,
                full, matrices=(Matrices(vocab, h),)),
        *_group("embedding_extra", "position/type embeddings and embedding norm",
                model.embedding_extra_params, dense, full),
        *_head_group(model, profile, q_storage, dense, full),
        *_linear_groups(model, profile, q_storage, dense, full),
        *_vector_group(model, dense, full),
        *_vision_groups(model, setup, q_storage, dense),
    ]
    if setup.trains_adapters:
        groups += _adapter_group(model, setup, profile)
    return groups


def vision_frozen(setup: TrainingSetup) -> bool:
    """The vision tower and projector get no gradients and no adapters (`freeze_vision`, else
    the stack's default; unstated: trained like the rest)."""
    return bool(resolve(setup).run.freeze_vision)


def vision_linears(model: ModelSpec) -> list[tuple[Linear, int]]:
    """The vision side's nn.Linear layers with their counts (tower blocks, projector)."""
    spec = model.vision
    if spec is None:
        return []
    out = [(linear, stack.count) for stack in spec.blocks for linear in stack.linears]
    return out + [(linear, spec.projector.count) for linear in spec.projector.linears
                  if linear.name not in spec.projector_not_linear]


def vision_targeted(linear: Linear, setup: TrainingSetup) -> bool:
    """Whether PEFT puts a LoRA adapter on this vision Linear: 'all-linear' takes every
    nn.Linear but the output head (peft/tuners/tuners_utils.py@v0.21.2
    `_maybe_include_all_linear_layers`); a list of names matches a module whose name ends in
    one (`check_target_module_exists`), so the tower's own `q_proj` is adapted with the
    language model's. A frozen vision side gets none (`vision_frozen`)."""
    if not setup.trains_adapters or vision_frozen(setup):
        return False
    if setup.lora_targets == ALL_LINEAR:
        return True
    return linear.name.rsplit(".", 1)[-1] in setup.lora_targets


def _vision_groups(model: ModelSpec, setup: TrainingSetup, q_storage: Storage | None,
                   dense: Storage) -> list[ParamGroup]:
    """A VLM's vision tower and projector: trained under full fine-tuning unless frozen; their
    nn.Linear weights quantized under QLoRA like the language model's (transformers 5.24.0
    `quantizers/base.py` get_keys_to_not_convert spares only the output head and tied weights)."""
    total = model.vision_params + model.projector_params
    trains = setup.method is Method.FULL and not vision_frozen(setup)
    if q_storage is None or not total:
        return _group("vision", "vision tower and projector", total, dense, trains)
    linears = vision_linears(model)
    weight = sum(count * linear.weight_params for linear, count in linears)
    q_bytes = sum(count * quantized_bytes(linear.d_in * linear.d_out, linear.d_out, q_storage)
                  for linear, count in linears)
    return [*_group("vision_linears", f"vision Linear weights, {q_storage.value}", weight,
                    q_storage, False, n_bytes=q_bytes),
            *_group("vision", "vision tower and projector (norms, embeddings, biases)",
                    total - weight, dense, False)]


def _head_group(model: ModelSpec, profile: StackProfile, q_storage: Storage | None,
                dense: Storage, full: bool) -> list[ParamGroup]:
    """The output head: its own matrix (or the one a stack unties), quantized where the stack
    quantizes it."""
    h, vocab = model.hidden_size, model.vocab_size
    head_weight = model.head_params
    if profile.unties_head and model.lm_head_tied:
        head_weight = vocab * h
    if not head_weight:
        return []
    if q_storage is not None and profile.quantizes_head:
        return _group("head", f"output head, {q_storage.value}", head_weight, q_storage, False,
                      n_bytes=quantized_bytes(head_weight, vocab, q_storage))
    return _group("head", "output head (vocab × hidden)", head_weight, dense, full,
                  matrices=(Matrices(vocab, h),))


def _linear_groups(model: ModelSpec, profile: StackProfile, q_storage: Storage | None,
                   dense: Storage, full: bool) -> list[ParamGroup]:
    """The layers' Linear weights (quantized under QLoRA), and the MoE expert banks that
    bitsandbytes leaves dense (`is_bank_parameter`)."""
    weight_params = 0
    q_bytes = 0
    weights: list[Matrices] = []
    bank_params = 0
    banks: list[Matrices] = []
    for stack in model.stacks:
        for linear in stack.linears:
            shape = Matrices(linear.d_in, linear.d_out, stack.count * linear.copies)
            if q_storage is not None and is_bank_parameter(linear, profile):
                bank_params += stack.count * linear.weight_params
                banks.append(shape)
                continue
            weight_params += stack.count * linear.weight_params
            weights.append(shape)
            if q_storage is not None:
                one = quantized_bytes(linear.d_in * linear.d_out, linear.d_out, q_storage)
                q_bytes += stack.count * linear.copies * one
    banks_group = _group("expert_banks", "MoE expert banks (3-D parameters: not quantized)",
                         bank_params, dense, False, matrices=tuple(banks))
    if q_storage is not None:
        return [*banks_group,
                *_group("linears", f"layer Linear weights, {q_storage.value}", weight_params,
                        q_storage, False, n_bytes=q_bytes, matrices=tuple(weights))]
    return _group("linears", "layer Linear weights", weight_params, dense, full,
                  matrices=tuple(weights))


def _vector_group(model: ModelSpec, dense: Storage, full: bool) -> list[ParamGroup]:
    """Norm weights (and LayerNorm biases), h-wide, and Linear biases, d_out-wide."""
    h = model.hidden_size
    bias_params = sum(stack.count * (linear.params - linear.weight_params)
                      for stack in model.stacks for linear in stack.linears)
    norm_params = sum(stack.count * stack.other_params for stack in model.stacks)
    norm_params += model.extra_params + bias_params
    vectors: dict[int, int] = {}
    for stack in model.stacks:
        vectors[h] = vectors.get(h, 0) + stack.count * (stack.other_params // max(1, h))
        for linear in stack.linears:
            if linear.params > linear.weight_params:
                width = linear.d_out
                vectors[width] = vectors.get(width, 0) + stack.count * linear.copies
    vectors[h] = vectors.get(h, 0) + model.extra_params // max(1, h)
    return _group("norms", "norms and biases", norm_params, dense, full,
                  tensors=tuple(sorted(vectors.items())))


def _adapter_group(model: ModelSpec, setup: TrainingSetup,
                   profile: StackProfile) -> list[ParamGroup]:
    """The LoRA adapters: A (r × d_in) and B ((adapted width) × r) on every adapted Linear, a
    rank-r adapter per expert on every adapted expert bank and on the router
    (`vram.model.lora_reach`), and on the head when targeted."""
    h, vocab = model.hidden_size, model.vocab_size
    reach = lora_reach(model, setup, profile)
    lora = 0
    lora_matrices: list[Matrices] = []
    lora_tensors: list[tuple[int, int]] = []
    r = setup.lora_rank
    for stack in model.stacks:
        for linear in stack.linears:
            n_lora, rank = _linear_adapter(linear, reach, profile, r)
            if not n_lora:
                continue
            lora += stack.count * n_lora
            a_numel = rank * linear.d_in
            b_numel = n_lora // linear.copies - a_numel
            count = stack.count * linear.copies
            lora_matrices += [Matrices(rank, linear.d_in, count),
                              Matrices(b_numel // rank, rank, count)]
            lora_tensors += [(a_numel, count), (b_numel, count)]
    if head_targeted(setup) and model.head_kind is HeadKind.LM:
        lora += r * (h + vocab)
        lora_matrices += [Matrices(r, h), Matrices(vocab, r)]
        lora_tensors += [(r * h, 1), (r * vocab, 1)]
    return [*_group("lora", f"LoRA adapters (rank {setup.lora_rank})", lora,
                    DENSE_STORAGE[profile.precision.adapters], True,
                    matrices=tuple(lora_matrices), tensors=tuple(lora_tensors)),
            *_vision_adapter_group(model, setup, profile)]


def _vision_adapter_group(model: ModelSpec, setup: TrainingSetup,
                          profile: StackProfile) -> list[ParamGroup]:
    """LoRA adapters PEFT puts on the vision tower's and projector's Linears
    (`vision_targeted`), whole modules: r·(d_in + d_out) each."""
    r = setup.lora_rank
    n = 0
    matrices: list[Matrices] = []
    tensors: list[tuple[int, int]] = []
    for linear, count in vision_linears(model):
        if vision_targeted(linear, setup):
            n += count * adapter_params(linear, r, None)
            matrices += [Matrices(r, linear.d_in, count), Matrices(linear.d_out, r, count)]
            tensors += [(r * linear.d_in, count), (r * linear.d_out, count)]
    return _group("vision_lora", f"LoRA adapters on the vision tower (rank {r})", n,
                  DENSE_STORAGE[profile.precision.adapters], True, matrices=tuple(matrices),
                  tensors=tuple(tensors))


def _linear_adapter(linear: Linear, reach: LoraReach, profile: StackProfile,
                    r: int) -> tuple[int, int]:
    """(adapter parameters, rank) on one Linear (or bank, or router); (0, r) when not adapted.
    A bank's adapter is one pair of matrices per expert (`ParamWrapper`), stored as r·E rows."""
    factor = bank_rank_factor(linear, reach, profile)
    if factor:
        return adapter_params_of(linear, r, factor), r * factor
    if linear.role is Role.ROUTER and reach.router:
        return r * (linear.d_in + linear.d_out), r
    if module_adapted(linear, reach, profile):
        return adapter_params(linear, r, _fused_roles(linear, reach.roles, profile)), r
    return 0, r


def _fused_roles(
    linear: Linear, roles: Roles, profile: StackProfile
) -> frozenset[Role] | None:
    """Slices of a fused projection (LitGPT), or None: the whole fused module (PEFT)."""
    if linear.role not in FUSED_PARTS or roles is EVERY_LINEAR:
        return None
    return roles if profile.adapts_fused_slices else None


def trainable_params(groups: list[ParamGroup]) -> int:
    return sum(g.n_params for g in groups if g.trainable)
