"""The shape of a model that decides its training memory: Linear layers, stacks and the spec.

A `ModelSpec` lists, per stack of identical layers, every Linear layer with its Hugging Face
module name, its input and output widths and whether it has a bias. Everything else the
estimator needs (norm widths, attention shape, MLP type, MoE routing) is a field too. Parameter
counts follow from the spec and equal `model.num_parameters()` of the Transformers model.
Families (`vram.model.families`) build specs from config files; the estimator only reads them.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from vram.memo import memoized
from vram.model.processor import Processor


class Role(StrEnum):
    """What a Linear layer does, independent of how a family names it."""

    Q = "q"
    K = "k"
    V = "v"
    QKV = "qkv"
    O = "o"  # noqa: E741 - the attention output projection
    GATE = "gate"
    UP = "up"
    GATE_UP = "gate_up"
    DOWN = "down"
    ROUTER = "router"
    CROSS_Q = "cross_q"
    CROSS_K = "cross_k"
    CROSS_V = "cross_v"
    CROSS_O = "cross_o"
    #: MLA's up-projection of the compressed k/v latent to per-head k and v (DeepSeek-V2's
    #: kv_b_proj); it reads the latent, not the layer's norm output.
    KV_UP = "kv_up"
    #: A linear-attention / state-space / convolution mixer's projections (issue 22): the
    #: input projections read the layer's norm output, the output projection writes the
    #: residual. No LoRA target name selects them; 'all-linear' does.
    MIXER_IN = "mixer_in"
    MIXER_OUT = "mixer_out"
    #: A small nn.Linear beside the main projections that no LoRA target name selects but
    #: 'all-linear' adapts (PEFT adapts every nn.Linear but the output layer): Gated DeltaNet's
    #: `in_proj_ba`, Mamba-1's `x_proj` and `dt_proj`, a shared expert's sigmoid gate.
    AUX = "aux"


#: The attention's projections (self-attention; cross-attention has its own roles).
ATTENTION_ROLES = (Role.Q, Role.K, Role.V, Role.QKV, Role.O)

#: Which LoRA target names (PEFT naming) select which roles.
TARGET_ROLES: dict[str, frozenset[Role]] = {
    "q_proj": frozenset({Role.Q, Role.CROSS_Q}),
    "k_proj": frozenset({Role.K, Role.CROSS_K}),
    "v_proj": frozenset({Role.V, Role.CROSS_V}),
    "o_proj": frozenset({Role.O, Role.CROSS_O}),
    "gate_proj": frozenset({Role.GATE}),
    "up_proj": frozenset({Role.UP}),
    "down_proj": frozenset({Role.DOWN}),
}

#: For a fused projection, the roles it holds.
FUSED_PARTS: dict[Role, frozenset[Role]] = {
    Role.QKV: frozenset({Role.Q, Role.K, Role.V}),
    Role.GATE_UP: frozenset({Role.GATE, Role.UP}),
}


class Linear(BaseModel):
    """One `nn.Linear` of a layer (or `copies` of it, for MoE experts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    role: Role
    d_in: int
    d_out: int
    bias: bool = False
    copies: int = 1
    #: Output widths of the parts of a fused projection (q, k, v) or (gate, up), in order.
    parts: tuple[int, ...] = ()
    #: Tokens that pass through each copy, as a fraction of all tokens (top-k / experts).
    token_fraction: float = 1.0
    #: Expert-parallel ranks the bank's experts are split over (`copies` are one rank's:
    #: `vram.sharding.expert_parallel`); 1 for every Linear of a whole model.
    ep_split: int = 1

    @property
    def is_bank(self) -> bool:
        """A routed expert bank: one copy per expert (or this rank's share of them)."""
        return self.copies > 1 or self.ep_split > 1

    @property
    def weight_params(self) -> int:
        return self.d_in * self.d_out * self.copies

    @property
    def params(self) -> int:
        return (self.d_in * self.d_out + (self.d_out if self.bias else 0)) * self.copies


class MlpKind(StrEnum):
    GATED = "gated"  # SwiGLU / GeGLU: act(gate(x)) * up(x), then down
    PLAIN = "plain"  # fc1 -> act -> fc2


class NormKind(StrEnum):
    RMS = "rms"
    LAYER = "layer"


class Mixer(StrEnum):
    """What mixes tokens in a layer (issue 22's hybrids; `docs/hybrid-layers.md`)."""

    ATTENTION = "attention"  # softmax attention (every family before issue 22)
    GATED_DELTANET = "gated deltanet"  # Qwen3-Next / Qwen3.5 linear attention
    MAMBA2 = "mamba2"  # Granite 4, Nemotron-H, Falcon-H1 (beside attention: see `parallel_ssm`)
    MAMBA1 = "mamba1"  # Jamba's selective scan
    SHORT_CONV = "short conv"  # LFM2's gated depthwise convolution
    NONE = "none"  # an MLP or MoE block alone (Nemotron-H's `mlp` / `moe` layers)


class MixerSaved(BaseModel):
    """Elements a hybrid mixer keeps for its backward, beyond its input projection's input,
    with its fused kernels (`LayerStack.mixer_saved`) or in transformers' PyTorch fallback
    (`LayerStack.mixer_fallback`, `vram.model.families.fallback`): per token, per token of the
    sequence padded to a multiple of `chunk`, per started chunk, per sequence, and the terms
    that need the mixer's weights trained or its Linears keeping their inputs. Each in the
    compute dtype and in fp32."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token: int = 0
    token_fp32: int = 0
    chunk: int = 1
    padded_fp32: int = 0
    #: fp32 elements per chunk the sequence starts (ceil(T / chunk) of them).
    chunk_fp32: int = 0
    sequence: int = 0
    sequence_fp32: int = 0
    #: When the mixer's own weights (norm, `D`, `A_log`) train: a full fine-tune.
    trained: int = 0
    trained_fp32: int = 0
    #: The inputs of the Linears inside the mixer (out_proj's, x_proj's, ...), when they keep
    #: their inputs.
    linear_inputs: int = 0
    #: fp32 elements per token the fallback's forward and backward allocate beyond what it
    #: keeps, at their fullest moments.
    forward_fp32: int = 0
    backward_fp32: int = 0


class LayerStack(BaseModel):
    """`count` identical layers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    count: int
    linears: tuple[Linear, ...]
    #: Parameters per layer that are not in a Linear (norm weights and biases).
    other_params: int
    n_norms: int
    norm_kind: NormKind
    n_heads: int
    n_kv_heads: int
    head_dim: int
    mlp_kind: MlpKind
    intermediate_size: int
    causal: bool = True
    cross_attention: bool = False
    parallel_residual: bool = False
    n_experts: int = 0
    experts_per_token: int = 0
    #: Gemma 2 style soft-capping of attention logits (forces explicit scores in some stacks).
    attn_softcap: bool = False
    #: Gemma's RMSNorm scales in fp32 (`normed * (1.0 + weight.float())`) and casts after, so a
    #: trained weight keeps the fp32 normalized input (Llama's casts first, then scales).
    norm_scales_in_fp32: bool = False
    #: Query/key norms inside attention (Qwen3, OLMo 2).
    qk_norm: bool = False
    #: Transformers' eager attention takes the softmax in fp32 and casts the probabilities
    #: back (Llama family, Phi, Gemma 2, GPT-NeoX, BLOOM); Falcon, BERT and T5 take it in the
    #: scores' own dtype.
    softmax_upcast: bool = True
    #: The layer returns its eager attention probabilities with its output, and the model's
    #: loop holds that output until the next layer returns (Transformers' Falcon).
    returns_attention_probs: bool = False
    #: The eager q·kᵀ stays referenced while the softmax of the masked scores runs (Falcon's
    #: `attention_scores = F.softmax(attention_scores + attention_mask, ...)`: the name is
    #: rebound only when the softmax returns). Llama's eager attention has rebound it already.
    scores_live_through_softmax: bool = False
    #: Transformers' eager attention multiplies by k and v broadcast over the query heads
    #: (Falcon's `query_layer @ key_layer.transpose(-1, -2)`) instead of materializing
    #: `repeat_kv` copies, which the matmuls then keep (Llama family).
    eager_broadcasts_kv: bool = False
    #: Transformers' code always passes SDPA a 4-D mask and k/v with fewer heads and no
    #: `enable_gqa` (Falcon), so CUDA's flash and efficient kernels refuse it: SDPA runs math.
    hf_sdpa_runs_math: bool = False
    #: The layer is torch's `nn.MultiheadAttention` called with `need_weights=True` (its
    #: default): an explicit softmax(q·kᵀ) whatever kernel the setup asks for, the packed
    #: q, k, v buffer and the scaled q kept, no mask (torch/nn/functional.py@v2.13.0
    #: multi_head_attention_forward, `if need_weights:` branch). DeepSpeed's examples use it.
    torch_multihead_attention: bool = False
    #: Per-head width of v and of the attention output, where it differs from q's and k's
    #: (`head_dim`): DeepSeek-V2's MLA has q/k heads of 192 and v heads of 128.
    v_head_dim: int | None = None
    #: MLA's compressed k/v latent width (DeepSeek-V2 `kv_lora_rank`; 0 without MLA).
    kv_lora_rank: int = 0
    #: MLA's compressed query latent width (DeepSeek-V3 `q_lora_rank`; 0: q_proj directly).
    q_lora_rank: int = 0
    #: Shared experts every token runs beside the routed ones, as one gated MLP of this
    #: width (DeepSeek-V2: moe_intermediate_size × n_shared_experts; 0: none counted).
    shared_expert_width: int = 0
    #: Post-LayerNorm blocks (a norm after each residual add, the original Transformer's
    #: order): a layer's backward runs both norms' backward before its attention's.
    post_norm: bool = False
    #: The layer normalizes its input before anything else (pre-norm). False: BERT's
    #: post-LayerNorm order (`LayerNorm(x + attention(x))`), which `post_norm` stacks share.
    input_norm: bool = True
    #: Dropout in training: on attention probabilities and on the residual branches.
    attn_dropout: float = 0.0
    hidden_dropout: float = 0.0
    #: `hidden_dropout` also drops inside the MLP, between the activation and the down
    #: projection (T5's DenseReluDense; counted for BERT too). GPT-2 drops only the residuals.
    mlp_inner_dropout: bool = False
    #: I-wide tensors the MLP activation keeps for backward in Transformers' implementation:
    #: 1 for fused kernels (SiLU, F.gelu), 4 for the Python tanh formula of `gelu_new` /
    #: `gelu_fast` (its input, tanh output, 0.5·x and 1 + tanh), 2 for `quick_gelu`.
    act_saved: int = 1
    #: The activation calls `torch.pow` on its input (`gelu_new`): on CUDA's autocast fp32
    #: list (torch/include/ATen/autocast_mode.h@v2.13.0 AT_FORALL_FP32), so under autocast
    #: the cubic, the tanh and 1 + tanh run, and are kept, in fp32.
    act_pow_fp32: bool = False
    #: The activation is transformers' Python xIELU (`XIELUActivation._xielu_python`, what runs
    #: without the experimental `xielu` CUDA extension): `where(x > 0, α_p·x·x + β·x,
    #: (expm1(min(x, ε)) − x)·α_n + β·x)` keeps x, the mask `x > 0`, α_p·x and expm1's output,
    #: and (α_n trained) expm1 − x; α_p, α_n are (1,)-shaped, so under autocast (softplus and
    #: expm1 on CUDA's fp32 list) the products are fp32 (transformers/activations.py@v5.24.0).
    act_xielu: bool = False
    #: The activation keeps its output, not its input (ReLU: `threshold_backward(grad,
    #: result)`), and that output is the down projection's input: one tensor for both when
    #: the down projection keeps its input (OPT's fc1 -> ReLU -> fc2).
    act_output_is_down_input: bool = False
    #: What mixes tokens in these layers; not `ATTENTION` only in issue 22's hybrid families.
    mixer: Mixer = Mixer.ATTENTION
    #: A Mamba-2 mixer runs beside the attention in every layer and the two outputs are
    #: summed (Falcon-H1).
    parallel_ssm: bool = False
    #: One learned logit per head joins every softmax (gpt-oss `sinks`): Transformers' code has
    #: no SDPA path for it (`GptOssPreTrainedModel._supports_sdpa = False`), so `sdpa` runs
    #: its eager attention (flash-attn kernels take the sinks as `s_aux`).
    attention_sinks: bool = False
    #: What the mixer's fused kernels, and the PyTorch code around them, keep for the backward
    #: beyond its input projection's input (`mixer_kernels` true): `docs/hybrid-layers.md`,
    #: set by the family.
    mixer_saved: MixerSaved = MixerSaved()
    #: Elements per token the mixer's fused kernel allocates while it runs, beyond what it
    #: saves: (forward, forward fp32, backward, backward fp32) (`vram.model.families.workspace`).
    mixer_workspace: tuple[int, int, int, int] = (0, 0, 0, 0)
    #: What transformers' PyTorch fallback of the mixer keeps instead of the kernel's saved set
    #: (`mixer_kernels` false: `vram.model.families.fallback`).
    mixer_fallback: MixerSaved = MixerSaved()
    #: q, k and v are views of one fused projection's output, and v (kept by the attention
    #: kernel, or the eager matmul) keeps that whole output alive beside the rotated copies of
    #: q and k (Qwen2.5-VL / Qwen3-VL vision blocks: `qkv(x).reshape(...).unbind(0)`).
    qkv_view_kept: bool = False
    #: The attention runs once per image or window and concatenates the outputs (Qwen vision
    #: blocks' `torch.cat(attn_outputs)`): o_proj reads a copy of what the kernel kept.
    attention_output_copied: bool = False
    #: Attention sees only the last `attention_window` positions (a sliding-window or chunked
    #: layer of a local/global pattern: Gemma 3, gpt-oss, OLMo 3, Llama 4); None: all.
    attention_window: int | None = None
    #: This stack holds the model's first layer where that is not the first stack (a family
    #: that groups its layers by kind: `vram.model.families.parts.by_kind`).
    holds_first_layer: bool = False
    #: The model's layer indices of this stack's layers, where a family interleaves its kinds
    #: (`vram.model.families.parts.by_kind`); empty: the stacks run one after another.
    positions: tuple[int, ...] = ()

    @property
    def params_per_layer(self) -> int:
        return sum(linear.params for linear in self.linears) + self.other_params

    @property
    def params(self) -> int:
        return self.count * self.params_per_layer


class VisionSpec(BaseModel):
    """A vision-language model's vision side, for its activations (issue 22): what the
    processor makes of an image, the tower's blocks, and the projector that writes image tokens
    in the language model's width. Parameters are counted apart (`ModelSpec.vision_params`,
    `projector_params`); these stacks and Linears say what the step keeps and what LoRA and
    QLoRA reach (`vram.memory.vision`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    processor: Processor
    #: The tower's blocks (bidirectional attention within one image, tile or window), by kind.
    blocks: tuple[LayerStack, ...]
    #: Tokens each of `blocks` attends over at once (Qwen2.5-VL's 8x8-patch windows); 0: the
    #: whole image or tile.
    windows: tuple[int, ...]
    #: The tower's residual stream stays in the compute dtype under autocast: it starts from
    #: a convolution's output and adds only matmul outputs (Qwen2.5-VL: rotary positions, no
    #: learned ones in fp32 to promote it).
    residual_in_compute_dtype: bool = False
    #: The tower's width, and its norms outside the blocks (pre/post LayerNorms).
    width: int
    outer_norms: int = 0
    #: Values per tower token in `pixel_values` as the processor hands them (C x T x P x P).
    pixel_values_per_token: int
    #: The projector (merger, connector) as one layer without attention: its norm, Linears and
    #: activation, over the language model's image tokens (after a merge or pixel shuffle), or
    #: (`projector_on_tower_tokens`) over every tower token (mllama's cross-attention states).
    projector: LayerStack
    projector_on_tower_tokens: bool = False
    #: Projector "Linears" that are plain Parameters in a matmul (Gemma 3's
    #: `mm_input_projection_weight`): LoRA's all-linear and bitsandbytes pass them by.
    projector_not_linear: tuple[str, ...] = ()
    #: The image states reach the language model through cross-attention (mllama), not as
    #: tokens of its sequence.
    cross_attention: bool = False
    #: With images, the language model attends bidirectionally within each image's tokens,
    #: so every layer gets an explicit mask, the global ones too (Gemma 3's
    #: `create_masks_for_vision_model` from `token_type_ids`).
    lm_mask_with_images: bool = False
    #: The language model reads `use_cache` from its own text config and leaves it on, so a
    #: stack that turns off the top-level one only gets a KV cache in each training forward
    #: (`vram.memory.text_cache`).
    text_cache: bool = False
    #: The tower is a `PreTrainedModel` whose `get_input_embeddings` is its patch embedding, so
    #: transformers' checkpointing (`enable_input_require_grads` on every such submodule,
    #: modeling_utils.py@v5.24.0 L2147-2177, L3190-3198) makes its output require grad: a
    #: frozen tower without adapters still builds its graph and runs a backward.
    input_hooked: bool = False

    @property
    def depth(self) -> int:
        return sum(stack.count for stack in self.blocks)
class V4ExpertNames(StrEnum):
    """How transformers 4 named a model type's experts, which transformers 5 fused into 3-D
    banks (transformers/conversion_mapping.py@v5.24.0 `_MODEL_TO_CONVERSION_PATTERN`: the
    `qwen2_moe` and `mixtral` patterns). PEFT rewrites LoRA targets that name them into
    `target_parameters` on the banks (peft/utils/transformers_weight_conversion.py@v0.21.2
    `_MOE_TARGET_MODULE_MAPPING`)."""

    NONE = ""
    GATE_UP_DOWN = "gate_proj/up_proj/down_proj"  # the qwen2_moe pattern
    W1_W3_W2 = "w1/w3/w2"  # the mixtral pattern


class HeadKind(StrEnum):
    LM = "lm"  # next-token logits over the vocabulary
    CLASSIFIER = "classifier"  # a small sequence-classification head


class ModelSpec(BaseModel):
    """Everything about a model that decides its training memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: str
    hidden_size: int
    vocab_size: int
    stacks: tuple[LayerStack, ...]
    #: Token embedding parameters (vocab x hidden), shared between encoder and decoder.
    embedding_params: int
    #: Learned position / token-type embeddings and embedding norms.
    embedding_extra_params: int = 0
    #: Final norms and other parameters outside the layers and the head.
    extra_params: int = 0
    tied_embeddings: bool = True
    head_kind: HeadKind = HeadKind.LM
    head_bias: bool = False
    n_labels: int = 2
    max_position_embeddings: int = 0
    sliding_window: int | None = None
    #: Gemma 2 soft-caps the final logits (tanh), which keeps one more vocabulary-wide tensor.
    final_softcap: bool = False
    #: Buffers the model registers on the GPU beside its parameters, in bytes (GPT-BigCode's
    #: `bias`: an n_positions² causal mask of bools, 64 MiB at 8192 positions). Neither
    #: sharded nor offloaded: every GPU holds them whole.
    buffer_bytes: int = 0
    approximate: bool = False
    #: Why the figures are approximate, for the estimate's note (empty: derived from a bare
    #: parameter count, the original reason).
    approximate_why: str = ""
    #: A vision-language model's vision tower and its projector (merger, connector) into the
    #: language model's width (issue 22; `vram.model.families.vision`).
    vision_params: int = 0
    projector_params: int = 0
    #: Its structure, for image inputs (None: a text model, or a tower not described yet).
    vision: VisionSpec | None = None
    #: The transformers-4 names of the experts that PEFT rewrites into the expert banks.
    v4_expert_names: V4ExpertNames = V4ExpertNames.NONE

    @property
    def lm_head_tied(self) -> bool:
        """The LM head multiplies by the embedding's matrix (a classifier's embedding is used
        once, tied or not)."""
        return self.tied_embeddings and self.head_kind is HeadKind.LM

    @property
    def head_params(self) -> int:
        """The output layer's own parameters (zero when it is tied to the embedding)."""
        if self.head_kind is HeadKind.CLASSIFIER:
            return 0  # not part of the published backbone count; a few thousand parameters
        weight = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return weight + (self.vocab_size if self.head_bias else 0)

    @property
    def layer_params(self) -> int:
        return memoized(self, "layer_params",
                        lambda: sum(stack.params for stack in self.stacks))

    @property
    def n_params(self) -> int:
        """Total parameters, as `model.num_parameters()` counts them."""
        return memoized(self, "n_params", lambda: (
            self.embedding_params
            + self.embedding_extra_params
            + self.layer_params
            + self.extra_params
            + self.head_params
            + self.vision_params
            + self.projector_params
        ))

    @property
    def n_layers(self) -> int:
        return sum(stack.count for stack in self.stacks)

    @property
    def decoder(self) -> LayerStack:
        """The stack that produces the output (the last one)."""
        return self.stacks[-1]

    @property
    def first_stack(self) -> LayerStack:
        """The stack of the first layer (the last one whose backward runs)."""
        return next((stack for stack in self.stacks if stack.holds_first_layer), self.stacks[0])

    @property
    def is_moe(self) -> bool:
        return any(stack.n_experts > 0 for stack in self.stacks)

    @property
    def is_encoder_decoder(self) -> bool:
        """A decoder that cross-attends to an encoder's stack (T5); a decoder whose layers come
        in several shapes (Gemma 3's local and global layers) is not one."""
        return any(stack.cross_attention for stack in self.stacks)

