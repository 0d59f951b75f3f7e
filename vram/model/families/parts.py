"""The parts issue 22's families assemble their layers from, and the stacks they group into.

A part is the `Linear` layers and the other parameters (norms, convolutions, gates) of one piece
of a decoder layer: an attention, a Gated DeltaNet, a Mamba mixer, an MLP, an MoE block. Each
builder names the transformers module it mirrors (transformers/models/<type>/modeling_<type>.py
@v5.24.0); the counts equal `model.num_parameters()` of the type's default config
(`tests/domain/test_family_defaults.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vram.errors import ConfigError
from vram.model.config_reader import ConfigReader
from vram.model.families.base import gated_mlp
from vram.model.families.fallback import (
    gated_delta_rule_torch,
    mamba2_chunk_scan_torch,
    plus,
    selective_scan_torch,
    short_conv_torch,
)
from vram.model.families.workspace import (
    SCAN_CHUNK,
    Workspace,
    gated_delta_rule,
    mamba2_split_conv1d_scan,
    selective_scan,
)
from vram.model.spec import LayerStack, Linear, Mixer, MixerSaved, MlpKind, NormKind, Role

QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True, slots=True)
class Part:
    """Linear layers and other parameters of one piece of a layer."""

    linears: tuple[Linear, ...]
    other_params: int = 0
    #: What a mixer keeps with its kernels (`LayerStack.mixer_saved`).
    saved: MixerSaved = field(default_factory=MixerSaved)
    #: What the mixer's kernel allocates while it runs (`LayerStack.mixer_workspace`).
    workspace: Workspace = (0, 0, 0, 0)
    #: What transformers' PyTorch fallback of the mixer keeps (`LayerStack.mixer_fallback`).
    fallback: MixerSaved = field(default_factory=MixerSaved)

    def __add__(self, other: Part) -> Part:
        return Part(self.linears + other.linears, self.other_params + other.other_params,
                    plus(self.saved, other.saved),
                    _sum4(self.workspace, other.workspace), plus(self.fallback, other.fallback))


def _sum4(a: Workspace, b: Workspace) -> Workspace:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]


@dataclass(frozen=True, slots=True)
class Heads:
    """An attention's shape, for the stack's attention fields."""

    n_heads: int
    n_kv_heads: int
    head_dim: int


@dataclass(frozen=True, slots=True)
class Shape:
    """What a stack of one kind of layer is, beyond its parts (LayerStack's physics fields)."""

    heads: Heads = field(default_factory=lambda: Heads(1, 1, 1))
    mixer: Mixer = Mixer.ATTENTION
    mlp_kind: MlpKind = MlpKind.GATED
    intermediate_size: int = 1
    n_experts: int = 0
    experts_per_token: int = 0
    shared_expert_width: int = 0
    qk_norm: bool = False
    n_norms: int = 2
    norm_kind: NormKind = NormKind.RMS
    parallel_ssm: bool = False
    attention_window: int | None = None
    attention_sinks: bool = False
    #: I-wide tensors the MLP's activation keeps (`LayerStack.act_saved`).
    act_saved: int = 1
    #: Eager attention takes its softmax in fp32 (`LayerStack.softmax_upcast`).
    softmax_upcast: bool = True
    #: The RMSNorms scale in fp32 and cast after (`LayerStack.norm_scales_in_fp32`).
    norm_scales_in_fp32: bool = False
    #: Norms after each sublayer's output, none before it (`LayerStack.post_norm`).
    post_norm: bool = False
    #: The MLP's activation is transformers' Python xIELU (`LayerStack.act_xielu`).
    act_xielu: bool = False
    #: Dropout in training on the attention probabilities and on the residual branches.
    attn_dropout: float = 0.0
    hidden_dropout: float = 0.0


def linear(name: str, role: Role, d_in: int, d_out: int, bias: bool = False, *,
           copies: int = 1, token_fraction: float = 1.0, parts: tuple[int, ...] = ()) -> Linear:
    return Linear(name=name, role=role, d_in=d_in, d_out=d_out, bias=bias, copies=copies,
                  token_fraction=token_fraction, parts=parts)


def attention(r: ConfigReader, h: int, *, qkv_bias: bool = False, o_bias: bool = False,
              q_gate: bool = False, qk_norm: str = "none", sinks: bool = False,
              names: tuple[str, str, str, str] = QKVO) -> tuple[Part, Heads]:
    """q, k, v, o projections; `q_gate` doubles q for an output gate (Qwen3-Next's
    `attn_output_gate`); `qk_norm` "head" (a head_dim-wide weight each for q and k: Qwen3,
    EXAONE 4, Apertus, LFM2) or "full" (over all heads: OLMo 3, MiniMax-M2); `sinks` one learned
    logit per head (gpt-oss `GptOssAttention.sinks`)."""
    n_heads = r.int("num_attention_heads")
    n_kv = r.int("num_key_value_heads", default=n_heads)
    if n_heads % n_kv:
        raise ConfigError("num_key_value_heads", f"must divide num_attention_heads ({n_heads})")
    hd = r.int("head_dim", default=h // n_heads)
    q, k, v, o = names
    linears = (
        linear(q, Role.Q, h, n_heads * hd * (2 if q_gate else 1), qkv_bias),
        linear(k, Role.K, h, n_kv * hd, qkv_bias),
        linear(v, Role.V, h, n_kv * hd, qkv_bias),
        linear(o, Role.O, n_heads * hd, h, o_bias),
    )
    norms = {"none": 0, "head": 2 * hd, "full": (n_heads + n_kv) * hd}[qk_norm]
    return Part(linears, norms + (n_heads if sinks else 0)), Heads(n_heads, n_kv, hd)


def mlp(h: int, inter: int, *, bias: bool = False, prefix: str = "mlp.",
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> Part:
    """A gated MLP: down(act(gate(x)) * up(x))."""
    gate, up, down = (prefix + n for n in names)
    return Part(gated_mlp(h, inter, bias, names=(gate, up, down)))


def fused_mlp(h: int, inter: int, prefix: str = "mlp.") -> Part:
    """A gated MLP with gate and up in one projection (GLM-4's `gate_up_proj`)."""
    return Part((linear(prefix + "gate_up_proj", Role.GATE_UP, h, 2 * inter,
                        parts=(inter, inter)),
                 linear(prefix + "down_proj", Role.DOWN, inter, h)))


def plain_mlp(h: int, inter: int, *, bias: bool = False, prefix: str = "mlp.",
              names: tuple[str, str] = ("up_proj", "down_proj")) -> Part:
    """up -> activation -> down, no gate (Apertus' xIELU, Nemotron-H's ReLU²)."""
    return Part((linear(prefix + names[0], Role.UP, h, inter, bias),
                 linear(prefix + names[1], Role.DOWN, inter, h, bias)))


def experts(h: int, width: int, n: int, top_k: int, *, prefix: str = "mlp.",
            router: str = "gate", router_bias: bool = False, bank_bias: bool = False,
            gated: bool = True) -> Part:
    """A router `h -> E` and the expert banks, each one 3-D parameter in transformers 5
    (`gate_up_proj` [E, 2I, h] and `down_proj` [E, h, I]; `up_proj` alone when not gated)."""
    if top_k > n:
        raise ConfigError("num_experts_per_tok", f"must be at most {n}")
    frac = top_k / n
    up = (linear(prefix + "experts.gate_up_proj", Role.GATE_UP, h, 2 * width, bank_bias,
                 copies=n, token_fraction=frac, parts=(width, width)) if gated else
          linear(prefix + "experts.up_proj", Role.UP, h, width, bank_bias, copies=n,
                 token_fraction=frac))
    return Part((linear(prefix + router, Role.ROUTER, h, n, router_bias), up,
                 linear(prefix + "experts.down_proj", Role.DOWN, width, h, bank_bias, copies=n,
                        token_fraction=frac)))


def gated_deltanet(r: ConfigReader, h: int, *, split: bool) -> Part:
    """Qwen3NextGatedDeltaNet (`in_proj_qkvz`, `in_proj_ba`) / Qwen3.5's (`in_proj_qkv`, `_z`,
    `_b`, `_a`): a depthwise conv (no bias) over q, k, v, `dt_bias` and `A_log` per value
    head, a gated RMSNorm of one value head's width, `out_proj`."""
    nk, nv = r.int("linear_num_key_heads"), r.int("linear_num_value_heads")
    dk, dv = r.int("linear_key_head_dim"), r.int("linear_value_head_dim")
    conv_dim = 2 * nk * dk + nv * dv
    p = "linear_attn."
    if split:
        projections: tuple[Linear, ...] = (
            linear(p + "in_proj_qkv", Role.MIXER_IN, h, conv_dim),
            linear(p + "in_proj_z", Role.MIXER_IN, h, nv * dv),
            linear(p + "in_proj_b", Role.AUX, h, nv),
            linear(p + "in_proj_a", Role.AUX, h, nv))
    else:
        projections = (linear(p + "in_proj_qkvz", Role.MIXER_IN, h, conv_dim + nv * dv),
                       linear(p + "in_proj_ba", Role.AUX, h, 2 * nv))
    kernel = r.int("linear_conv_kernel_dim")
    other = conv_dim * kernel + 2 * nv + dv
    # causal_conv1d saves its input (conv_dim); fla's ChunkGatedDeltaRuleFunction saves q, k, v
    # (conv_dim), beta (nv), A (64 per value head: chunk_fwd.py L385) in the compute dtype and
    # g (nv), q/k rstd (2·nk) in fp32. The gated norm runs in PyTorch with the kernels too
    # (Qwen3NextRMSNormGated, modeling_qwen3_next.py@v5.24.0 L66-75; Qwen3_5RMSNormGated the
    # same): it keeps z (nv·dv), its fp32 input, z and SiLU(z) (3·nv·dv) and rstd (nv), and in a
    # full fine-tune its normalized input and g's softplus for A_log, as the fallback does;
    # out_proj keeps its input when it trains
    saved = MixerSaved(token=2 * conv_dim + 65 * nv + nv * dv,
                       token_fp32=2 * nv + 2 * nk + 3 * nv * dv + nv,
                       trained=nv * dv, trained_fp32=nv, linear_inputs=nv * dv)
    return Part((*projections, linear(p + "out_proj", Role.MIXER_OUT, nv * dv, h)), other,
                saved, gated_delta_rule(nv, dk, dv), gated_delta_rule_torch(nk, nv, dk, dv, kernel))


def mamba2(h: int, *, d_inner: int, heads: int, groups: int, state: int, kernel: int,
           conv_bias: bool, proj_bias: bool, norm: bool, chunk: int,
           prefix: str = "mamba.", scaled_input: bool = False) -> Part:
    """A Mamba-2 mixer (GraniteMoeHybridMambaLayer, NemotronHMamba2Mixer, FalconH1Mixer):
    `in_proj` h -> 2d + 2GN + H, a depthwise conv over d + 2GN, `dt_bias`, `A_log`, `D` per
    head, an optional gated RMSNorm of width d, `out_proj`; `scaled_input`: in_proj reads
    a scaled copy of the layer's input (Falcon-H1's `ssm_in_multiplier`)."""
    conv_dim = d_inner + 2 * groups * state
    other = conv_dim * kernel + (conv_dim if conv_bias else 0) + 3 * heads
    d_in_proj = 2 * d_inner + 2 * groups * state + heads
    # MambaSplitConv1dScanCombinedFn (mamba_ssm ssd_combined.py L888) saves the in_proj output
    # zxbcdt and the scan's output out_x, and the norm's rstd (fp32, one per group); the conv
    # output, dt, the chunk states and out_proj's input are recomputed in the backward
    saved = MixerSaved(token=d_in_proj + d_inner, token_fp32=groups if norm else 0)
    return Part((linear(prefix + "in_proj", Role.MIXER_IN, h, d_in_proj, proj_bias),
                 linear(prefix + "out_proj", Role.MIXER_OUT, d_inner, h, proj_bias)),
                other + (d_inner if norm else 0), saved,
                mamba2_split_conv1d_scan(d_inner, heads, groups, state, chunk),
                mamba2_chunk_scan_torch(d_inner, heads, groups, state, chunk, kernel, norm=norm,
                                        in_scaled=h if scaled_input else 0))


def mamba1(r: ConfigReader, h: int) -> Part:
    """JambaMambaMixer: `in_proj` h -> 2d, conv over d, `x_proj` d -> rank + 2N, `dt_proj`
    rank -> d (with bias), `A_log` [d, N], `D`, the dt/B/C RMSNorms, `out_proj`
    (transformers/models/jamba/modeling_jamba.py@v5.24.0 `forward`)."""
    d = r.int("mamba_expand") * h
    n, rank = r.int("mamba_d_state"), r.int("mamba_dt_rank")
    bias = r.bool("mamba_proj_bias", False)
    kernel = r.int("mamba_d_conv")
    other = d * kernel + (d if r.bool("mamba_conv_bias", True) else 0)
    # transformers' JambaMambaMixer.forward calls causal_conv1d_fn and
    # selective_scan_fn, not mamba_inner_fn: the conv saves its input, a view that keeps in_proj's
    # whole output (2d); SelectiveScanFn (selective_scan_interface.py L63-66) saves u (the conv
    # output, also x_proj's input: d), delta (d), contiguous copies of z (d), B and C (2N), its
    # output (d) and fp32 chunk states [d, ceil(T/2048), 2N] (selective_scan.cpp L313); the
    # dt/B/C RMSNorms keep their fp32 inputs and rstd (rank + 2N + 3), and in a full fine-tune
    # their normalized inputs, as the fallback does; when x_proj, dt_proj and out_proj train
    # they keep their inputs: x_proj's matmul a contiguous copy of the transposed conv output
    # (d, apart from u), dt_proj the normed dt (rank), out_proj the gated output (d)
    saved = MixerSaved(token=6 * d + 2 * n, token_fp32=rank + 2 * n + 3, chunk=SCAN_CHUNK,
                       chunk_fp32=2 * n * d, trained=rank + 2 * n, linear_inputs=2 * d + rank)
    return Part((linear("mamba.in_proj", Role.MIXER_IN, h, 2 * d, bias),
                 linear("mamba.x_proj", Role.AUX, d, rank + 2 * n),
                 linear("mamba.dt_proj", Role.AUX, rank, d, True),
                 linear("mamba.out_proj", Role.MIXER_OUT, d, h, bias)),
                other + d * n + d + rank + 2 * n, saved, selective_scan(d, n),
                selective_scan_torch(d, n, rank, kernel))


def short_conv(h: int, kernel: int, bias: bool) -> Part:
    """Lfm2ShortConv: `in_proj` h -> 3h (B, C, x), a depthwise conv of length `conv_L_cache`,
    `out_proj`."""
    # kept: B·C·x (3h, B·x's and C·y's operands), the conv's input B·x and output (h each);
    # out_proj's input C·y (h) when out_proj trains, as in the fallback
    saved = MixerSaved(token=5 * h, linear_inputs=h)
    return Part((linear("conv.in_proj", Role.MIXER_IN, h, 3 * h, bias),
                 linear("conv.out_proj", Role.MIXER_OUT, h, h, bias)),
                h * kernel + (h if bias else 0), saved, fallback=short_conv_torch(h, kernel))


def stack(name: str, count: int, part: Part, shape: Shape, norm_params: int) -> LayerStack:
    """`count` layers of one kind: the part's parameters plus the layer's norms."""
    return LayerStack(
        name=name, count=count, linears=part.linears,
        other_params=part.other_params + norm_params, n_norms=shape.n_norms,
        norm_kind=shape.norm_kind, n_heads=shape.heads.n_heads,
        n_kv_heads=shape.heads.n_kv_heads, head_dim=shape.heads.head_dim,
        mlp_kind=shape.mlp_kind, intermediate_size=shape.intermediate_size,
        n_experts=shape.n_experts, experts_per_token=shape.experts_per_token,
        shared_expert_width=shape.shared_expert_width, qk_norm=shape.qk_norm,
        mixer=shape.mixer, parallel_ssm=shape.parallel_ssm,
        attention_window=shape.attention_window, mixer_saved=part.saved,
        mixer_workspace=part.workspace, mixer_fallback=part.fallback,
        attention_sinks=shape.attention_sinks, act_xielu=shape.act_xielu,
        attn_dropout=shape.attn_dropout, hidden_dropout=shape.hidden_dropout,
        norm_scales_in_fp32=shape.norm_scales_in_fp32, softmax_upcast=shape.softmax_upcast,
        act_saved=shape.act_saved, post_norm=shape.post_norm,
    )


def by_kind(kinds: list[str], build: Callable[[str, int], LayerStack]) -> tuple[LayerStack, ...]:
    """One stack per kind of layer, in order of first appearance with the last layer's kind
    last (the stack that produces the output); the first layer's stack says so when it is not
    the first (`LayerStack.holds_first_layer`), and each stack lists its layers' indices
    (`LayerStack.positions`)."""
    order = list(dict.fromkeys(kinds))
    order.remove(kinds[-1])
    stacks = [build(kind, kinds.count(kind)).model_copy(update={"positions": tuple(
        index for index, each in enumerate(kinds) if each == kind)})
        for kind in (*order, kinds[-1])]
    first = (*order, kinds[-1]).index(kinds[0])
    if first:
        stacks[first] = stacks[first].model_copy(update={"holds_first_layer": True})
    return tuple(stacks)


def layer_types(r: ConfigReader, n_layers: int, default: Callable[[int], str]) -> list[str]:
    """The config's `layer_types`, or the type's own rule for layer `i` when it has none."""
    given = r.config.get("layer_types")
    if isinstance(given, list) and given:
        if len(given) != n_layers or not all(isinstance(t, str) for t in given):
            raise ConfigError("layer_types", f"must list {n_layers} layer kinds")
        return [str(t) for t in given]
    return [default(i) for i in range(n_layers)]
