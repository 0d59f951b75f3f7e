"""Parameter groups: which parameters exist in a run, how they are stored, which ones train.

The estimate splits a model into groups that share a storage format: the token embedding,
the output head, the Linear weights of the layers (what QLoRA quantizes), norms and biases,
and the LoRA adapters. Every byte of the weights, gradients and optimizer buckets is a sum over
these groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from vram.architecture import FUSED_PARTS, TARGET_ROLES, Linear, ModelSpec, Role
from vram.setup import ALL_LINEAR, Method, Precision, Quant, Sharding, TrainingSetup
from vram.stack import StackProfile

#: NF4 and int8 blocks as bitsandbytes stores them (bitsandbytes/functional.py quantize_4bit:
#: blocksize 64, fp32 absmax per block; compress_statistics quantizes absmax to 8 bits in
#: blocks of 256 with an fp32 scale per block).
NF4_BLOCK = 64
NF4_DQ_BLOCK = 256
#: bitsandbytes' 8-bit optimizers keep 32-bit state for tensors under this many values
#: (Optimizer8bit min_8bit_size=4096).
SMALL_TENSOR = 4096


class Storage(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    NF4 = "nf4"
    NF4_DQ = "nf4-dq"
    INT8 = "int8"


STORAGE_BYTES: dict[Storage, float] = {
    Storage.FP32: 4.0,
    Storage.BF16: 2.0,
    Storage.NF4: 0.5 + 4 / NF4_BLOCK,
    Storage.NF4_DQ: 0.5 + 1 / NF4_BLOCK + 4 / (NF4_BLOCK * NF4_DQ_BLOCK),
    Storage.INT8: 1.0,
}


def quantized_bytes(numel: int, d_out: int, storage: Storage) -> int:
    """Bytes of one quantized weight matrix, with its quantization constants.

    NF4: 4-bit codes (numel/2 bytes) + one fp32 absmax per 64 values (QLoRA paper, §2).
    NF4 with double quantization: absmax as 8-bit per 64 values + an fp32 scale per 256 absmax.
    int8 (LLM.int8): one byte per value + an fp32 scale per output row (bitsandbytes SCB).
    """
    if storage is Storage.INT8:
        return numel + 4 * d_out
    blocks = -(-numel // NF4_BLOCK)
    codes = -(-numel // 2)
    if storage is Storage.NF4:
        return codes + 4 * blocks
    if storage is Storage.NF4_DQ:
        return codes + blocks + 4 * -(-blocks // NF4_DQ_BLOCK)
    raise ValueError(f"storage: {storage} is not a quantized format")


@dataclass(frozen=True, slots=True)
class ParamGroup:
    key: str
    label: str
    n_params: int
    storage: Storage
    trainable: bool
    bytes: int
    #: Number of separate tensors (matters for 8-bit optimizers and Adafactor).
    n_matrices: int = 0
    #: Bytes of Adafactor's factored second moment: an fp32 row and column vector per matrix,
    #: each allocated on its own (rounded to the CUDA allocator's 512-byte blocks).
    factored_bytes: int = 0
    #: Parameters in tensors under 4096 values (8-bit optimizers keep 32-bit state for them).
    small_numel: int = 0
    #: The group's tensors as (values, how many): per-tensor state is allocated per tensor,
    #: in the CUDA allocator's 512-byte blocks (8-bit optimizers).
    tensors: tuple[tuple[int, int], ...] = ()


#: The CUDA caching allocator hands out multiples of 512 bytes (kMinBlockSize);
#: torch.cuda.memory_allocated() counts the rounded sizes.
ALLOCATOR_BLOCK_BYTES = 512


def allocated_bytes(nbytes: int) -> int:
    """What the CUDA caching allocator charges for one tensor of `nbytes`."""
    return -(-nbytes // ALLOCATOR_BLOCK_BYTES) * ALLOCATOR_BLOCK_BYTES


def fp32_vectors_bytes(*lengths: int) -> int:
    """Allocated bytes of one fp32 vector per length (Adafactor's row/column statistics)."""
    return sum(allocated_bytes(4 * n) for n in lengths)


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


def targeted_roles(setup: TrainingSetup) -> frozenset[Role] | None:
    """The roles LoRA adapts; None means every Linear ('all-linear')."""
    if setup.lora_targets == ALL_LINEAR:
        return None
    roles: set[Role] = set()
    for name in setup.lora_targets:
        roles |= TARGET_ROLES.get(name, frozenset())
    return frozenset(roles)


def is_targeted(linear: Linear, roles: frozenset[Role] | None) -> bool:
    if linear.role is Role.ROUTER:
        return False
    if roles is None:
        return True
    if linear.role in FUSED_PARTS:
        return bool(FUSED_PARTS[linear.role] & roles)
    return linear.role in roles


def head_targeted(setup: TrainingSetup) -> bool:
    return setup.lora_targets != ALL_LINEAR and "lm_head" in setup.lora_targets


def _dense_storage(setup: TrainingSetup, profile: StackProfile, *, frozen: bool) -> Storage:
    """How a non-quantized parameter is stored.

    fp32 and autocast recipes keep fp32 weights; bf16-true keeps bf16. Under DeepSpeed-style
    ZeRO with a mixed recipe the model is cast to 16 bits and the fp32 master copy lives with
    the optimizer (counted there). QLoRA's frozen 16-bit parameters follow the stack
    (prepare_model_for_kbit_training upcasts them to fp32).
    """
    if setup.precision is Precision.FP32:
        return Storage.FP32
    if setup.method is Method.QLORA and frozen:
        return Storage.FP32 if profile.upcasts_frozen_to_fp32 else Storage.BF16
    if setup.precision is Precision.BF16_TRUE:
        return Storage.BF16
    if setup.sharding is not Sharding.NONE and setup.sharding is not Sharding.DDP:
        return Storage.BF16
    return Storage.FP32


def param_groups(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> list[ParamGroup]:
    """Every parameter of the run, grouped by storage and trainability."""
    full = setup.method is Method.FULL
    quant = setup.effective_quant
    q_storage = Storage(quant.value) if quant is not Quant.NONE else None
    dense = _dense_storage(setup, profile, frozen=not full)
    groups: list[ParamGroup] = []

    def add(key: str, label: str, n: int, storage: Storage, trainable: bool, *,
            n_bytes: int | None = None, matrices: int = 0, factored: int = 0,
            small: int = 0, tensors: tuple[tuple[int, int], ...] = ()) -> None:
        if n <= 0:
            return
        size = n_bytes if n_bytes is not None else int(n * STORAGE_BYTES[storage])
        groups.append(ParamGroup(key, label, n, storage, trainable, size, matrices, factored,
                                 small, tensors))

    h, vocab = model.hidden_size, model.vocab_size
    add("embedding", "token embedding (vocab × hidden)", model.embedding_params, dense, full,
        matrices=1, factored=fp32_vectors_bytes(vocab, h))
    add("embedding_extra", "position/type embeddings and embedding norm",
        model.embedding_extra_params, dense, full, matrices=2)

    head_weight = model.head_params
    if profile.unties_head and model.tied_embeddings and model.head_kind.value == "lm":
        head_weight = vocab * h
    if head_weight:
        if q_storage is not None and profile.quantizes_head:
            add("head", f"output head, {q_storage.value}", head_weight, q_storage, False,
                n_bytes=quantized_bytes(head_weight, vocab, q_storage), matrices=1)
        else:
            head_bias = max(0, head_weight - vocab * h)  # a 1-D bias keeps a full statistic
            add("head", "output head (vocab × hidden)", head_weight, dense, full, matrices=1,
                factored=fp32_vectors_bytes(vocab, h) + fp32_vectors_bytes(head_bias))

    weight_params = 0
    bias_params = 0
    q_bytes = 0
    matrices = 0
    factored = 0
    for stack in model.stacks:
        for linear in stack.linears:
            weight_params += stack.count * linear.weight_params
            bias_params += stack.count * (linear.params - linear.weight_params)
            matrices += stack.count * linear.copies
            factored += stack.count * linear.copies * fp32_vectors_bytes(linear.d_in,
                                                                         linear.d_out)
            if q_storage is not None:
                one = quantized_bytes(linear.d_in * linear.d_out, linear.d_out, q_storage)
                q_bytes += stack.count * linear.copies * one
    if q_storage is not None:
        add("linears", f"layer Linear weights, {q_storage.value}", weight_params, q_storage,
            False, n_bytes=q_bytes, matrices=matrices)
    else:
        add("linears", "layer Linear weights", weight_params, dense, full, matrices=matrices,
            factored=factored)
    norm_params = sum(stack.count * stack.other_params for stack in model.stacks)
    norm_params += model.extra_params + bias_params
    n_norm_tensors = sum(stack.count * (stack.n_norms + 2) for stack in model.stacks)
    # Norm weights (and LayerNorm biases) are h-wide vectors; Linear biases are d_out-wide.
    vectors: dict[int, int] = {}
    for stack in model.stacks:
        vectors[h] = vectors.get(h, 0) + stack.count * (stack.other_params // max(1, h))
        for linear in stack.linears:
            if linear.params > linear.weight_params:
                width = linear.d_out
                vectors[width] = vectors.get(width, 0) + stack.count * linear.copies
    vectors[h] = vectors.get(h, 0) + model.extra_params // max(1, h)
    add("norms", "norms and biases", norm_params, dense, full, matrices=n_norm_tensors,
        factored=4 * norm_params, small=norm_params if h < SMALL_TENSOR else 0,
        tensors=tuple(sorted(vectors.items())))

    if setup.trains_adapters:
        roles = targeted_roles(setup)
        lora = 0
        lora_matrices = 0
        lora_factored = 0
        lora_small = 0
        lora_tensors: list[tuple[int, int]] = []
        r = setup.lora_rank
        for stack in model.stacks:
            for linear in stack.linears:
                if is_targeted(linear, roles):
                    n_lora = adapter_params(linear, r, _fused_roles(linear, roles, profile))
                    lora += stack.count * n_lora
                    lora_matrices += 2 * stack.count * linear.copies
                    # A is r × d_in, B is (adapted width) × r.
                    a_numel = r * linear.d_in
                    b_numel = n_lora // linear.copies - a_numel
                    lora_factored += stack.count * linear.copies * fp32_vectors_bytes(
                        r, linear.d_in, b_numel // r, r)
                    lora_small += stack.count * linear.copies * sum(
                        x for x in (a_numel, b_numel) if x < SMALL_TENSOR)
                    lora_tensors += [(a_numel, stack.count * linear.copies),
                                     (b_numel, stack.count * linear.copies)]
        if head_targeted(setup) and model.head_kind.value == "lm":
            lora += r * (h + vocab)
            lora_matrices += 2
            lora_factored += fp32_vectors_bytes(r, h, vocab, r)
            lora_tensors += [(r * h, 1), (r * vocab, 1)]
        adapter_storage = Storage.FP32 if profile.adapter_bytes == 4 else Storage.BF16
        if dense is Storage.BF16 and setup.precision in (Precision.BF16_MIXED,
                                                          Precision.FP16_MIXED):
            adapter_storage = Storage.BF16  # ZeRO casts the model; fp32 master with optimizer
        add("lora", f"LoRA adapters (rank {setup.lora_rank})", lora, adapter_storage, True,
            matrices=lora_matrices, factored=lora_factored, small=lora_small,
            tensors=tuple(lora_tensors))
    return groups


def _fused_roles(
    linear: Linear, roles: frozenset[Role] | None, profile: StackProfile
) -> frozenset[Role] | None:
    """Slices of a fused projection (LitGPT) or the whole fused module (PEFT)."""
    if linear.role not in FUSED_PARTS or roles is None:
        return None
    return roles if profile.adapts_fused_slices else None


def trainable_params(groups: list[ParamGroup]) -> int:
    return sum(g.n_params for g in groups if g.trainable)
