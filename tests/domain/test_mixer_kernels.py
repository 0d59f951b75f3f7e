"""The hybrid layers' fused kernels: what they allocate while they run (issue 22;
`vram.model.families.workspace`, `docs/hybrid-layers.md`), keyed to `mixer_kernels`.

Hand-computed from real configs, one layer at b = 1, s = 4096, bf16:
- Qwen3-Next-80B-A3B (`data/models/qwen3-next-80b-a3b.json`): HV 32 value heads, K = V = 128,
  fla's C = 64, so one chunk state per token is 32·128·128/64 = 8,192 elements.
- Nemotron-H 8B (transformers 5.24's default `NemotronHConfig`): d = 128·64 = 8,192, H 128,
  G 8, N 128, C 128: chunk states d·N/C = 8,192 per token, conv output d + 2GN = 10,240.
"""

from __future__ import annotations

import json
from pathlib import Path

from vram import TrainingSetup, load_model
from vram.memory.activations.context import layer_context
from vram.memory.activations.layer import layer_activations
from vram.memory.activations.transients import mixer_workspace_per_token
from vram.model.spec import LayerStack, Mixer, MixerSaved, ModelSpec
from vram.stacks.profile import profile_for

ROOT = Path(__file__).resolve().parents[2]
S = 4096


def _stack(spec: ModelSpec, mixer: Mixer) -> LayerStack:
    return next(s for s in spec.stacks if s.mixer is mixer)


def _setup(kernels: bool | None) -> TrainingSetup:
    return TrainingSetup(method="lora", precision="bf16-mixed", micro_batch=1, seq_len=S,
                         grad_ckpt=False, lora_targets="all-linear", mixer_kernels=kernels)


def _transients(spec: ModelSpec, stack: LayerStack, kernels: bool | None) -> tuple[int, int]:
    """The layer's forward working set and its mixer kernel's backward workspace, at s."""
    setup = _setup(kernels)
    layer = layer_activations(spec, stack, setup, profile_for(setup))
    c = layer_context(spec, stack, setup, profile_for(setup))
    return layer.forward_transient_per_token * S, mixer_workspace_per_token(c, backward=True) * S


def _backward_moment(spec: ModelSpec, stack: LayerStack, kernels: bool) -> int:
    """The layer's backward moment after its MLP (where the mixer's backward runs)."""
    setup = _setup(kernels)
    return layer_activations(spec, stack, setup, profile_for(setup)).backward_attention_per_token


def _qwen3_next() -> ModelSpec:
    return load_model(ROOT / "data" / "models" / "qwen3-next-80b-a3b.json")


def _nemotron_h() -> ModelSpec:
    config = json.loads((ROOT / "tests" / "data" / "families" / "nemotron_h.json").read_text())
    return load_model(config)


def test_fla_gated_delta_rule_workspace_qwen3_next() -> None:
    deltanet = _stack(_qwen3_next(), Mixer.GATED_DELTANET)
    # forward: w (32·128) + u, v_new (2·32·128) + h (8,192) = 20,480 elements
    # backward: w, u (8,192) + h, dh (16,384) + v_new, dv (8,192) + dq, dk, dw (12,288)
    # + dk, dv, db (32·257 = 8,224) = 53,280 elements; fp32 dg (NK = 1) and dg2: 64
    assert deltanet.mixer_workspace == (20_480, 0, 53_280, 64)
    forward, backward = _transients(_qwen3_next(), deltanet, True)
    assert forward == 2 * 20_480 * S == 167_772_160  # 160 MiB per layer at s = 4096
    assert backward == (2 * 53_280 + 4 * 64) * S == 437_518_336


def test_mamba2_split_conv1d_scan_workspace_nemotron_h_8b() -> None:
    spec = _nemotron_h()
    mamba = _stack(spec, Mixer.MAMBA2)
    # forward: xBC (10,240) + the norm's output (8,192) + passed states (8,192) = 26,624;
    # fp32: dt, dA_cumsum (256) + the raw fp32 states (8,192 > CB's 8·128) = 8,448
    # backward, at _state_passing_bwd: xBC, dxBC 2·10,240 + dzxbcdt 18,560 + 3·8,192 + dt's
    # clone 128 + states, dstates 16,384 = 80,128; fp32: dt, dA_cumsum 256 + CB 8·128
    # + states, dstates 16,384 = 17,664
    assert mamba.mixer_workspace == (26_624, 8_448, 80_128, 17_664)
    forward, backward = _transients(spec, mamba, True)
    assert forward == (2 * 26_624 + 4 * 8_448) * S == 356_515_840
    assert backward == (2 * 80_128 + 4 * 17_664) * S == 945_815_552


def test_the_fallback_counts_its_own_transients_not_the_kernels() -> None:
    """`mixer_kernels` False (what a CPU trace runs): no fused kernel's workspace, but the
    PyTorch fallback's own (`vram.model.families.fallback`): `segment_sum`'s masked copy and
    cumsum in the forward, M's gradient and G's and L's in the backward, 2·C·H fp32 each
    (C 128, H 128); the default (the stack's: the kernels) counts the kernel's."""
    spec = _nemotron_h()
    mamba = _stack(spec, Mixer.MAMBA2)
    fallback_forward, fallback_backward = _transients(spec, mamba, False)
    assert fallback_forward == fallback_backward == 4 * 2 * 128 * 128 * S == 536_870_912
    # the backward moment holds the kernel's workspace instead of the fallback's gradients
    grown = _backward_moment(spec, mamba, True) - _backward_moment(spec, mamba, False)
    assert grown == 2 * 80_128 + 4 * 17_664 - 4 * 2 * 128 * 128
    assert _transients(spec, mamba, None) == _transients(spec, mamba, True)


def test_attention_layers_have_no_mixer_workspace() -> None:
    attention = _stack(_qwen3_next(), Mixer.ATTENTION)
    assert attention.mixer_workspace == (0, 0, 0, 0)
    assert _transients(_qwen3_next(), attention, True) == _transients(
        _qwen3_next(), attention, False)


def test_jamba_keeps_what_selective_scan_fn_saves() -> None:
    """transformers' Jamba runs causal_conv1d_fn and selective_scan_fn (not mamba_inner_fn).
    Jamba-v0.1 (the default `JambaConfig`): d = 2·4,096 = 8,192, N 16, dt rank 256."""
    config = json.loads((ROOT / "tests" / "data" / "families" / "jamba.json").read_text())
    spec = load_model(config)
    mamba = _stack(spec, Mixer.MAMBA1)
    # in_proj's output 2d (the conv's saved view), the conv output, delta, z's and the output's
    # copies: 6d = 49,152; B and C 32. fp32: the dt/B/C norms' inputs (288) and rstd (3); the
    # scan's chunk states d·2N = 262,144 per started 2,048-token chunk. Trained: the norms'
    # normalized inputs (288); x_proj's, dt_proj's and out_proj's inputs (2d + rank = 16,640)
    assert mamba.mixer_saved == MixerSaved(
        token=49_184, token_fp32=291, chunk=2048, chunk_fp32=262_144, trained=288,
        linear_inputs=16_640)
    # backward: du, ddelta, dz (3d = 24,576), dB and dC in fp32 (32)
    assert mamba.mixer_workspace == (0, 0, 24_576, 32)
    setup = _setup(True)
    kept = next(t for t in layer_activations(spec, mamba, setup, profile_for(setup)).terms
                if t.key == "mixer")
    # LoRA: Jamba's Linears keep no inputs of their own; s = 4096 starts two chunks
    assert kept.bytes_per_token * S == (2 * 49_184 + 4 * 291) * S + 2 * 4 * 262_144 \
        == 409_780_224
    assert _transients(spec, mamba, True)[1] == (2 * 24_576 + 4 * 32) * S == 201_850_880
