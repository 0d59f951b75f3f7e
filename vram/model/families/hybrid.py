"""Hybrid decoders: linear attention, state-space and convolution layers beside attention
(issue 22; what each layer keeps in training: `docs/hybrid-layers.md`).

transformers/models/<type>/modeling_<type>.py@v5.24.0:
- `qwen3_next`: Gated DeltaNet (`linear_attention`) and gated attention (`full_attention`, q
  doubled for the output gate, per-head q/k norms), every layer routed experts plus a shared
  expert behind a sigmoid gate (dense `mlp_only_layers`).
- `qwen3_5_text`: the same mixers with a dense MLP, the DeltaNet projections split.
- `lfm2`: short gated convolutions (`conv`) and attention (`full_attention`), a SwiGLU
  (`w1`/`w3`/`w2`) whose width `block_auto_adjust_ff_dim` rescales.
- `granitemoehybrid`: Mamba-2 (`mamba`) and attention layers by `layer_types`, every layer an
  MoE (when `num_local_experts` > 0) beside a shared MLP.
- `falcon_h1`: attention and Mamba-2 side by side in every layer, then a SwiGLU.
- `jamba`: Mamba-1 and attention layers (`attn_layer_period`/`_offset`), experts every
  `expert_layer_period`-th layer.
- `nemotron_h`: one block per entry of `layers_block_type` (Mamba-2, attention, a ReLU² MLP or
  an MoE with a shared expert), each behind one norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.parts import (
    Heads,
    Part,
    Shape,
    attention,
    by_kind,
    experts,
    gated_deltanet,
    layer_types,
    linear,
    mamba1,
    mamba2,
    mlp,
    plain_mlp,
    short_conv,
    stack,
)
from vram.model.spec import LayerStack, Mixer, MlpKind, ModelSpec, Role

#: Why a hybrid's estimate is approximate: with the kernels (`mixer_kernels`, every stack's
#: default) its mixers keep what fla's, mamba_ssm's and causal-conv1d's kernels save and
#: allocate, read from their source (`docs/hybrid-layers.md`), and no GPU measurement holds that
#: to a number. Without them the estimate counts transformers' PyTorch fallback, held to the
#: exact trace (`benchmarks/trace_grid_hybrid.txt`); the note stays because the spec is built
#: before the setup says which runs.
MIXER_NOTE = ("{family}: its {mixer} layers keep what their GPU kernels save and allocate (from "
              "the kernels' source); no measurement checks them, so activations and the peak "
              "are approximate (parameters, weights, gradients and optimizer state are exact). "
              "Without the kernels (mixer_kernels false) transformers' PyTorch fallback runs, "
              "which keeps several times more; that is modelled and held to the exact trace.")


@dataclass(frozen=True, slots=True)
class Hybrid:
    """The family reading one of these model types."""

    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        stacks = _BUILDERS[model_type](r)
        h, vocab = r.int("hidden_size"), r.int("vocab_size")
        mixers = sorted({s.mixer.value for s in stacks if s.mixer not in (Mixer.ATTENTION,
                                                                             Mixer.NONE)})
        note = MIXER_NOTE.format(family=model_type, mixer=" / ".join(mixers)) if mixers else ""
        return ModelSpec(
            name=name, family=model_type, hidden_size=h, vocab_size=vocab, stacks=stacks,
            embedding_params=vocab * h, extra_params=h,
            tied_embeddings=r.bool("tie_word_embeddings", model_type == "lfm2"),
            max_position_embeddings=r.int("max_position_embeddings", default=4096),
            approximate=bool(mixers), approximate_why=note,
        )


def _shape(heads: Heads, mixer: Mixer, inter: int, **kwargs: object) -> Shape:
    return Shape(heads=heads, mixer=mixer, intermediate_size=inter, **kwargs)  # type: ignore[arg-type]


def qwen3_next(r: ConfigReader) -> tuple[LayerStack, ...]:
    return _qwen_hybrid(r, split=False)


def qwen3_5_text(r: ConfigReader) -> tuple[LayerStack, ...]:
    return _qwen_hybrid(r, split=True)


def _qwen_hybrid(r: ConfigReader, *, split: bool) -> tuple[LayerStack, ...]:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    att, heads = attention(r, h, q_gate=r.bool("attn_output_gate", True), qk_norm="head")
    deltanet = gated_deltanet(r, h, split=split)
    interval = r.int("full_attention_interval", default=4)
    kinds = layer_types(r, n_layers, lambda i: "full_attention" if (i + 1) % interval == 0
                        else "linear_attention")
    if split:
        inter = r.int("intermediate_size")
        ffn, moe = mlp(h, inter), {}
    else:
        n, k, inter = r.int("num_experts"), r.int("num_experts_per_tok"), r.int(
            "moe_intermediate_size")
        shared = r.int("shared_expert_intermediate_size")
        ffn = experts(h, inter, n, k) + mlp(h, shared, prefix="mlp.shared_expert.") + Part(
            (linear("mlp.shared_expert_gate", Role.AUX, h, 1),))
        moe = {"n_experts": n, "experts_per_token": k, "shared_expert_width": shared}

    def build(kind: str, count: int) -> LayerStack:
        full = kind == "full_attention"
        mixer = Mixer.ATTENTION if full else Mixer.GATED_DELTANET
        # Qwen3NextRMSNorm: `output * (1.0 + self.weight.float())`, scaled in fp32
        shape = _shape(heads, mixer, inter, qk_norm=full, norm_scales_in_fp32=True, **moe)
        return stack(kind, count, (att if full else deltanet) + ffn, shape, 2 * h)
    return by_kind(kinds, build)


def lfm2(r: ConfigReader) -> tuple[LayerStack, ...]:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    att, heads = attention(r, h, qk_norm="head", names=("q_proj", "k_proj", "v_proj", "out_proj"))
    inter = r.int("intermediate_size")
    if r.bool("block_auto_adjust_ff_dim", False):  # Lfm2MLP.__init__
        inter = int(r.float("block_ffn_dim_multiplier", 1.0) * int(2 * inter / 3))
        multiple = r.int("block_multiple_of", default=256)
        inter = multiple * ((inter + multiple - 1) // multiple)
    ffn = mlp(h, inter, prefix="feed_forward.", names=("w1", "w3", "w2"))
    conv = short_conv(h, r.int("conv_L_cache"), r.bool("conv_bias", False))
    given = r.config.get("full_attn_idxs")
    full = set(given) if isinstance(given, list) else set(range(n_layers))
    kinds = layer_types(r, n_layers, lambda i: "full_attention" if i in full else "conv")

    def build(kind: str, count: int) -> LayerStack:
        is_att = kind == "full_attention"
        shape = _shape(heads, Mixer.ATTENTION if is_att else Mixer.SHORT_CONV, inter,
                       qk_norm=is_att)
        return stack(kind, count, (att if is_att else conv) + ffn, shape, 2 * h)
    return by_kind(kinds, build)


def granitemoehybrid(r: ConfigReader) -> tuple[LayerStack, ...]:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    bias = r.bool("attention_bias", False)
    att, heads = attention(r, h, qkv_bias=bias, o_bias=bias)
    n_heads, d_head = r.int("mamba_n_heads"), r.int("mamba_d_head")
    ssm = mamba2(h, d_inner=n_heads * d_head, heads=n_heads, groups=r.int("mamba_n_groups"),
                 state=r.int("mamba_d_state"), kernel=r.int("mamba_d_conv"),
                 conv_bias=r.bool("mamba_conv_bias", True),
                 proj_bias=r.bool("mamba_proj_bias", False), norm=True,
                 chunk=r.int("mamba_chunk_size", default=256))
    shared = r.int("shared_intermediate_size")
    ffn = Part((linear("shared_mlp.input_linear", Role.GATE_UP, h, 2 * shared,
                       parts=(shared, shared)),
                linear("shared_mlp.output_linear", Role.DOWN, shared, h)))
    n = r.config.get("num_local_experts") or 0
    k = r.int("num_experts_per_tok") if n else 0
    if n:
        ffn = experts(h, r.int("intermediate_size"), n, k, prefix="block_sparse_moe.",
                      router="router") + ffn
    kinds = layer_types(r, n_layers, lambda i: "mamba")

    def build(kind: str, count: int) -> LayerStack:
        is_att = kind == "attention"
        shape = _shape(heads, Mixer.ATTENTION if is_att else Mixer.MAMBA2,
                       r.int("intermediate_size") if n else shared, n_experts=n,
                       experts_per_token=k, shared_expert_width=shared if n else 0)
        return stack(kind, count, (att if is_att else ssm) + ffn, shape, 2 * h)
    return by_kind(kinds, build)


def falcon_h1(r: ConfigReader) -> tuple[LayerStack, ...]:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    bias = r.bool("attention_bias", False)
    att, heads = attention(r, h, qkv_bias=bias, o_bias=bias)
    n_heads = r.int("mamba_n_heads")
    d_inner = r.int("mamba_d_ssm") if r.has("mamba_d_ssm") else r.int("mamba_expand") * h
    ssm = mamba2(h, d_inner=d_inner, heads=n_heads, groups=r.int("mamba_n_groups"),
                 state=r.int("mamba_d_state"), kernel=r.int("mamba_d_conv"),
                 conv_bias=r.bool("mamba_conv_bias", True),
                 proj_bias=r.bool("mamba_proj_bias", False), norm=r.bool("mamba_rms_norm", False),
                 chunk=r.int("mamba_chunk_size", default=256), scaled_input=True)
    inter = r.int("intermediate_size")
    ffn = mlp(h, inter, bias=r.bool("mlp_bias", False), prefix="feed_forward.")
    shape = _shape(heads, Mixer.MAMBA2, inter, parallel_ssm=True)
    return (stack("attention+mamba2", n_layers, att + ssm + ffn, shape, 2 * h),)


def jamba(r: ConfigReader) -> tuple[LayerStack, ...]:
    h, n_layers = r.int("hidden_size"), r.int("num_hidden_layers")
    att, heads = attention(r, h)
    ssm = mamba1(r, h)
    attn_period, attn_offset = r.int("attn_layer_period"), r.config.get("attn_layer_offset") or 0
    exp_period = r.int("expert_layer_period")
    exp_offset = r.config.get("expert_layer_offset") or 0
    n, k, inter = r.int("num_experts"), r.int("num_experts_per_tok"), r.int("intermediate_size")
    kinds = [("attention" if i % attn_period == attn_offset else "mamba")
             + ("+moe" if n > 1 and i % exp_period == exp_offset else "+mlp")
             for i in range(n_layers)]

    def build(kind: str, count: int) -> LayerStack:
        is_att, routed = kind.startswith("attention"), kind.endswith("moe")
        ffn = (experts(h, inter, n, k, prefix="feed_forward.", router="router") if routed
               else mlp(h, inter, prefix="feed_forward."))
        shape = _shape(heads, Mixer.ATTENTION if is_att else Mixer.MAMBA1, inter,
                       n_experts=n if routed else 0, experts_per_token=k if routed else 0)
        return stack(kind, count, (att if is_att else ssm) + ffn, shape, 2 * h)
    return by_kind(kinds, build)


def nemotron_h(r: ConfigReader) -> tuple[LayerStack, ...]:
    h = r.int("hidden_size")
    kinds = r.config.get("layers_block_type")
    if not isinstance(kinds, list) or not kinds:
        raise ConfigError("layers_block_type", "missing: Nemotron-H lists its blocks there")
    bias = r.bool("attention_bias", False)
    att, heads = attention(r, h, qkv_bias=bias, o_bias=bias,
                           names=("mixer.q_proj", "mixer.k_proj", "mixer.v_proj", "mixer.o_proj"))
    n_heads, d_head = r.int("mamba_num_heads"), r.int("mamba_head_dim")
    ssm = mamba2(h, d_inner=n_heads * d_head, heads=n_heads, groups=r.int("n_groups"),
                 state=r.int("ssm_state_size"), kernel=r.int("conv_kernel"),
                 conv_bias=r.bool("use_conv_bias", True), proj_bias=r.bool("use_bias", False),
                 norm=True, chunk=r.int("chunk_size", default=128), prefix="mixer.")
    return by_kind([str(k) for k in kinds], lambda kind, count: _nemotron_block(
        r, h, kind, count, att, heads, ssm))


def _nemotron_block(r: ConfigReader, h: int, kind: str, count: int, att: Part, heads: Heads,
                    ssm: Part) -> LayerStack:
    bias = r.bool("mlp_bias", False)

    def shape(mixer: Mixer, inter: int, **kwargs: object) -> Shape:
        # one norm per block, NemotronHRMSNorm: `(weight.to(fp32) * x).to(input_dtype)`
        return _shape(heads, mixer, inter, n_norms=1, norm_scales_in_fp32=True, **kwargs)

    if kind in ("mamba", "linear_attention"):
        return stack(kind, count, ssm, shape(Mixer.MAMBA2, 1), h)
    if kind in ("attention", "full_attention"):
        return stack(kind, count, att, shape(Mixer.ATTENTION, 1), h)
    if kind == "mlp":
        inter = r.int("intermediate_size")
        return stack(kind, count, plain_mlp(h, inter, bias=bias, prefix="mixer."),
                     shape(Mixer.NONE, inter, mlp_kind=MlpKind.PLAIN), h)
    if kind == "moe":
        n, k, w = r.int("n_routed_experts"), r.int("num_experts_per_tok"), r.int(
            "moe_intermediate_size")
        shared = r.int("moe_shared_expert_intermediate_size")
        part = experts(h, w, n, k, prefix="mixer.", gated=False) + plain_mlp(
            h, shared, bias=bias, prefix="mixer.shared_experts.")
        return stack(kind, count, part, shape(Mixer.NONE, w, mlp_kind=MlpKind.PLAIN,
                                              n_experts=n, experts_per_token=k,
                                              shared_expert_width=shared), h)
    raise ConfigError("layers_block_type", f"{kind!r:.30} is not a Nemotron-H block "
                      "(mamba, attention, mlp, moe)")


_BUILDERS: dict[str, Callable[[ConfigReader], tuple[LayerStack, ...]]] = {
    "qwen3_next": qwen3_next, "qwen3_5_text": qwen3_5_text, "lfm2": lfm2,
    "granitemoehybrid": granitemoehybrid, "falcon_h1": falcon_h1, "jamba": jamba,
    "nemotron_h": nemotron_h,
}
HYBRID_TYPES = tuple(_BUILDERS)
