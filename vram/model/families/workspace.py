"""What the hybrid layers' fused kernels allocate while they run, beyond what they save
(issue 22; `docs/hybrid-layers.md`): per token, as (elements in the compute dtype, elements in
fp32), for the forward and for the backward (`LayerStack.mixer_workspace`).

The chunk states are per chunk of `C` tokens, so per token they weigh `state / C`. Each sum
counts the tensors alive together at the kernel's fullest moment, read from the allocations
(`new_empty`, `torch.empty`) of fla v0.5.2 (fla-org/flash-linear-attention@bc3b101d) and
mamba_ssm v2.3.2.post1 (state-spaces/mamba@e9594ce1). causal-conv1d's `CausalConv1dFn`
(Dao-AILab/causal-conv1d@0d2252d1 causal_conv1d_interface.py) allocates only its output and,
in the backward, its input's gradient: nothing beyond a layer's own tensors.
"""

from __future__ import annotations

#: fla's chunk length for the gated delta rule (fla/ops/gated_delta_rule/chunk.py@bc3b101d
#: `chunk_size: int = 64`).
FLA_CHUNK = 64
#: K-blocks of fla's dq/dk kernel on Hopper (fla/ops/common/chunk_o.py@bc3b101d
#: `chunk_bwd_dqkwg`: BK = min(K, 128), NK = K / BK): the fp32 `dg` is NK copies.
FLA_NK = 1

#: Tokens per chunk state of mamba_ssm's selective scan (csrc/selective_scan/selective_scan.cpp
#: @e9594ce1 `n_chunks = (seqlen + 2048 - 1) / 2048`).
SCAN_CHUNK = 2048

#: (forward elements, forward fp32 elements, backward elements, backward fp32 elements).
Workspace = tuple[int, int, int, int]


def gated_delta_rule(hv: int, k: int, v: int) -> Workspace:
    """fla's `chunk_gated_delta_rule` (HV value heads of width V, key width K, C = 64).

    Forward (`chunk_gated_delta_rule_fwd`): the WY factors w [T,HV,K] and u [T,HV,V]
    (wy_fast.py L273-274), the chunk states h [T/C,HV,K,V] and v_new [T,HV,V]
    (common/chunk_delta_h.py L715-721), all in k's dtype, alive until `chunk_fwd_o` returns.
    Backward (`chunk_gated_delta_rule_bwd`), at `prepare_wy_repr_bwd`: w, u, h and v_new
    recomputed, dh [T/C,HV,K,V] and dv (chunk_delta_h.py L776-780), dq, dk, dw
    (common/chunk_o.py L739-742) and dk, dv, db (wy_fast.py L318-321), with dg in fp32 (NK
    copies) and the second dg.
    """
    c = FLA_CHUNK
    h = hv * k * v // c  # one chunk state per C tokens
    forward = hv * k + 2 * hv * v + h  # w, u + v_new, h
    backward = hv * (k + v) + 2 * h + 2 * hv * v + 3 * hv * k + hv * (k + v + 1)
    return forward, 0, backward, hv * (FLA_NK + 1)


def mamba2_split_conv1d_scan(d: int, heads: int, groups: int, state: int,
                             chunk: int) -> Workspace:
    """mamba_ssm's `mamba_split_conv1d_scan_combined` (d = H·P, G groups, N state, C chunk).

    Forward (ssd_combined.py `MambaSplitConv1dScanCombinedFn.forward`,
    `_mamba_chunk_scan_combined_fwd` L343-390): the conv output xBC [T, d + 2GN], the gated
    norm's output (out_proj's input) [T, d], the passed chunk states [T/C,H,P,N] in the compute
    dtype; in fp32 dt and dA_cumsum [H,T], and the larger of the raw chunk states
    (`states_in_fp32=True`) and CB [T/C,G,C,C] (the first is freed before the second).
    Counted as alive together: an upper bound of the two fullest moments (at
    `_state_passing_fwd` and after the norm). Backward (`.backward`,
    `_mamba_chunk_scan_combined_bwd`), at `_state_passing_bwd` (ssd_state_passing.py L241-243):
    xBC recomputed, dxBC, dzxbcdt, out_proj's input recomputed, its gradient and the norm's,
    dt's clone, the passed states and their gradient in x's dtype; in fp32 dt, dA_cumsum, CB and
    the chunk states with their gradient (`_chunk_scan_bwd_dstates`). dCB and the dA gradients
    come after the fp32 states are freed.
    """
    conv = d + 2 * groups * state
    states = d * state // chunk  # [H, P, N] per chunk of C tokens
    forward = conv + d + states
    forward_fp32 = 2 * heads + max(states, groups * chunk)
    backward = 2 * conv + (2 * d + 2 * groups * state + heads) + 3 * d + heads + 2 * states
    backward_fp32 = 2 * heads + groups * chunk + 2 * states
    return forward, forward_fp32, backward, backward_fp32


def selective_scan(d: int, state: int) -> Workspace:
    """mamba_ssm's `selective_scan_fn` (`SelectiveScanFn`, Mamba-1, d channels, N state).

    Forward: nothing beyond what it saves and returns (out, out_z, the states `x`:
    selective_scan.cpp L304-313). Backward (L440-463): du, ddelta and dz in the inputs' dtype,
    dB and dC in fp32 (variable B and C).
    """
    return 0, 0, 3 * d, 2 * state
