"""What transformers' PyTorch fallback of each hybrid mixer keeps for its backward (issue 22;
`docs/hybrid-layers.md`): what a user without fla / mamba_ssm / causal-conv1d trains with, and
what the exact trace (CPU) runs (`LayerStack.mixer_fallback`, counted when `mixer_kernels` is
false).

Read from transformers/models/<type>/modeling_<type>.py@v5.24.0 and held, tensor by tensor, to
the storages autograd saves (saved-tensor hooks on each mixer, bf16) and to the exact trace
(`benchmarks/trace_grid_hybrid.py`). Every causal conv runs `F.conv1d(x, padding=K-1)` and
SiLU on the `[..., :T]` view of its output (`causal_conv1d_fn`), so it keeps its input and the
whole padded output: `conv·T + conv·(K-1)` elements per sequence. The mixer's input (the norm's
output, `in_proj`'s input) is counted with the layer's Linear inputs, not here.
"""

from __future__ import annotations

from vram.model.spec import MixerSaved


def gated_delta_rule_torch(nk: int, nv: int, dk: int, dv: int, kernel: int) -> MixerSaved:
    """Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet without fla (modeling_qwen3_next.py
    `forward` L660-780, `torch_chunk_gated_delta_rule` L371-509; Qwen3.5's is the same code).

    Compute dtype, per token: the conv's input and padded output (conv = 2·H·K + HV·V), beta's
    sigmoid (HV) and z (HV·V). fp32 per token: the repeated, L2-normed q and k (2·HV·K, L413-420)
    with their reciprocal norms (2·HV), the gated norm's fp32 input, gate and SiLU (3·HV·V,
    L66-75) with its rstd, and g (HV). fp32 per token of the sequence padded to C = 64: the
    pairwise decay, the UT system, the intra-chunk attention and the triangular solves' copies
    (5·HV·C: L454-471), q, k, k_beta and their decayed and batched copies (6·HV·K), v_beta,
    the new values and every chunk's v_new (3·HV·V), the cumulative decays (4·HV), and every
    chunk's recurrent state `[HV, K, V]` but the last (L493-500: HV·K·V / C per token).
    Trained: the gated norm's normalized input (HV·V) and g's softplus (fp32 HV, for A_log);
    out_proj's input (HV·V)."""
    conv = 2 * nk * dk + nv * dv
    c = 64  # chunk_size, L377
    return MixerSaved(
        token=2 * conv + nv + nv * dv,
        token_fp32=2 * nv * dk + 3 * nv * dv + 4 * nv,
        chunk=c,
        padded_fp32=5 * nv * c + 6 * nv * dk + 3 * nv * dv + nv * dk * dv // c + 4 * nv,
        sequence=conv * (kernel - 1),
        trained=nv * dv, trained_fp32=nv, linear_inputs=nv * dv)


def mamba2_chunk_scan_torch(d: int, heads: int, groups: int, state: int, chunk: int,
                            kernel: int, *, norm: bool, in_scaled: int = 0) -> MixerSaved:
    """A Mamba-2 mixer without mamba_ssm (NemotronHMamba2Mixer.forward, modeling_nemotron_h.py
    L468-615, `mamba2_chunk_scan` L274-387, `NemotronHRMSNormGated` L56-75; Granite 4's and
    Falcon-H1's (L669-835) are the same scan).

    Compute dtype, per token: `in_proj`'s output (2d + 2GN + H, the conv's input is a view of
    it), the conv's padded output (d + 2GN), dt + dt_bias and its softplus (2H); without the
    gated norm (Falcon-H1's `mamba_rms_norm` false) SiLU(gate) (d). fp32 per token: x.float()
    kept by x·dt (d), dt (H), and the gated norm's input, gate, SiLU and product (4d) with its
    rstd (G), or, without the norm, the scan output kept by `· silu(gate)` (d). fp32 per token
    of the sequence padded to C: L = exp(segment_sum(A)), G and M (3·C·H: `[b, c, l, s, h]`),
    B and C repeated to every head and the einsums' copies of them (5·H·N), the einsums' copies
    of x·dt and C·states (3d), the chunk states and the inter-chunk einsum's copy (2·d·N / C,
    one chunk more per sequence), the decays (2H). Trained: the norm's normalized input, D's
    padded x (fp32 d each) and dt for A (fp32 H); out_proj's input (d) and, for Falcon-H1,
    in_proj's scaled input (`in_scaled`: h, `hidden_states * self.ssm_in_multiplier`). The
    forward's fullest moment is in `segment_sum` (L111-128): the masked `[.., C, C]` copy of A
    and its cumsum, 2·C·H (the mixer alone, Granite 4's default at s512: 139.6 MB above what it
    keeps, 2.08 x C·H·T·4). The backward's fullest moment, at `M = G · L`: M's gradient and
    the gradients it sends to G and L (3·C·H), while the Y_diag einsum's copy of M is already
    freed: 2·C·H (the mixer alone, Nemotron-H's default at s512: 65.7 MB forward, 1.96 x
    C·H·T·4, and 88.1 MB backward, 2.6 x, of which this counts 2)."""
    conv = d + 2 * groups * state
    gate = 0 if norm else d
    return MixerSaved(
        token=(2 * d + 2 * groups * state + heads) + conv + 2 * heads + gate,
        token_fp32=d + heads + (4 * d + groups if norm else d),
        chunk=chunk,
        padded_fp32=3 * chunk * heads + 5 * heads * state + 3 * d + 2 * d * state // chunk
        + 2 * heads,
        sequence=conv * (kernel - 1), sequence_fp32=d * state,
        trained_fp32=(2 * d if norm else d) + heads, linear_inputs=d + in_scaled,
        forward_fp32=2 * chunk * heads, backward_fp32=2 * chunk * heads)


def selective_scan_torch(d: int, state: int, rank: int, kernel: int) -> MixerSaved:
    """JambaMambaMixer without mamba_ssm (modeling_jamba.py `forward` L508-625,
    `mamba_selective_scan` L336-430): the scan is a Python loop over every token.

    Compute dtype, per token: `in_proj`'s output (2d, the conv's input is a view of it), the
    conv's padded output (d), the scan output with D·u, SiLU(gate) and its product (3d), each
    step's state cast for `state @ C` (d·N, and the initial zeros per sequence), C (N). fp32 per
    token: discrete_A = exp(A·dt) and discrete_B (2·d·N, `[b, d, T, N]`), each step's state
    kept by the next step's `discrete_A · state` (d·N, T − 1 of them), dt and u in fp32 (2d),
    the dt/B/C norms' fp32 inputs (rank + 2N) and rstds (3), B.float() (N). Trained: the
    norms' normalized inputs (rank + 2N); x_proj's, dt_proj's and out_proj's inputs
    (2d + rank). The loop's backward: each step's `discrete_A[:, :, i]` and `deltaB_u[:, :, i]`
    send a whole `[b, d, T, N]` fp32 `select_backward` gradient, summed into one gradient per
    tensor: two sums and one step's gradient in flight from the last step's backward on, while
    every earlier step's state is still kept (3·d·N; the trace: three `select_backward`
    tensors at the peak of Jamba's Mamba layer's backward)."""
    return MixerSaved(
        token=6 * d + d * state + state,
        token_fp32=3 * d * state + 2 * d + 3 * state + rank + 3,
        sequence=d * (kernel - 1) + d * state, sequence_fp32=d - d * state,
        trained=rank + 2 * state, linear_inputs=2 * d + rank, backward_fp32=3 * d * state)


def short_conv_torch(h: int, kernel: int) -> MixerSaved:
    """Lfm2ShortConv without causal-conv1d (`forward` L344-385, `causal_conv1d_fn` L294-312 of
    modeling_lfm2.py):
    B·C·x (3h), the conv's input B·x (h) and padded output (h); out_proj's input C·y (h)."""
    return MixerSaved(token=5 * h, sequence=h * (kernel - 1), linear_inputs=h)


def plus(a: MixerSaved, b: MixerSaved) -> MixerSaved:
    """Two parts' saved sets together (one part of a layer has a mixer)."""
    fields = {name: getattr(a, name) + getattr(b, name) for name in MixerSaved.model_fields
              if name != "chunk"}
    return MixerSaved(chunk=max(a.chunk, b.chunk), **fields)
