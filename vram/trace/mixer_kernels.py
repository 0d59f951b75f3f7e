"""The hybrid layers' fused kernels on fake tensors: what they keep and allocate (issue 22).

fla, mamba_ssm and causal-conv1d need a GPU, so the CPU trace can only run transformers'
PyTorch fallback of the hybrid mixers. With `mixer_kernels` true, `emulated_mixer_kernels`
swaps the module-level functions the modeling files call for autograd Functions with the
kernels' memory, read from their source (`docs/hybrid-layers.md`): the forward allocates the
output (values do not matter on fake tensors), allocates and frees the kernel's forward
workspace, and saves for backward exactly what the kernel's Function saves; the backward
allocates and frees its workspace and returns gradients of the inputs' shapes. This is the
same reading of the kernel source as the closed form's (`vram.model.families.parts`,
`workspace`), done independently: it is not a GPU measurement.

Sources: flash-linear-attention v0.5.2 (fla-org/flash-linear-attention@bc3b101d), mamba_ssm
v2.3.2.post1 (state-spaces/mamba@e9594ce1), causal-conv1d v1.6.1.post4
(Dao-AILab/causal-conv1d@0d2252d1); transformers 5.24.0 `modeling_<type>.py` for where each
is called.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch

from vram.model.families.workspace import FLA_CHUNK, FLA_NK, SCAN_CHUNK

NOTE = ("mixer kernels emulated: saved set and workspace from fla v0.5.2 "
        "(chunk_gated_delta_rule), mamba_ssm v2.3.2.post1 (mamba_split_conv1d_scan_combined, "
        "selective_scan_fn), "
        "causal-conv1d v1.6.1.post4 (causal_conv1d_fn); not a GPU measurement")

#: model type -> the module-level functions of its modeling file that are swapped.
PATCHED: dict[str, tuple[str, ...]] = {
    "qwen3_next": ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"),
    "qwen3_5": ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"),
    "nemotron_h": ("mamba2_split_conv1d_scan_combined",),
    "granitemoehybrid": ("mamba2_split_conv1d_scan_combined",),
    "falcon_h1": ("mamba2_split_conv1d_scan_combined",),
    "qwen3_5_moe": ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"),
    "lfm2": ("causal_conv1d_fn",),
    "lfm2_moe": ("causal_conv1d_fn",),
    "jamba": ("causal_conv1d_fn", "mamba_selective_scan"),
}


def _grad(ctx: Any, i: int, like: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient of `like`'s shape and dtype where input `i` needs one."""
    return torch.empty_like(like) if like is not None and ctx.needs_input_grad[i] else None


class CausalConv1d(torch.autograd.Function):
    """causal-conv1d's `CausalConv1dFn` (causal_conv1d_interface.py@0d2252d1 L20-60): `x`
    [B, D, T] is made contiguous only when neither its last nor its channel dim has stride 1;
    the output is `empty_like(x)` (SiLU fused); saves x, weight, bias (L59). The backward
    allocates dx and the weight's and bias's gradients (L66-90): nothing beyond them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None) -> torch.Tensor:
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        ctx.save_for_backward(x, weight, bias)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, bias = ctx.saved_tensors
        return _grad(ctx, 0, x), _grad(ctx, 1, weight), _grad(ctx, 2, bias)


def causal_conv1d_fn(hidden_states: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, activation: str | None = None,
                     **kwargs: Any) -> torch.Tensor:
    """transformers' `causal_conv1d_fn` as the kernel runs it."""
    out: torch.Tensor = CausalConv1d.apply(hidden_states, weight, bias)
    return out


class ChunkGatedDeltaRule(torch.autograd.Function):
    """fla's `ChunkGatedDeltaRuleFunction` (fla/ops/gated_delta_rule/chunk.py@bc3b101d), with
    `use_qk_l2norm_in_kernel=True` as transformers calls it: `input_guard` makes every input
    contiguous (fla/utils.py); q and k are L2-normed into new tensors with fp32 reciprocal
    norms [B, T, H]; g becomes its chunk-local cumsum in fp32; A, the inverted WY system, is
    [B, T, HV, 64] in k's dtype (chunk_fwd.py L385). Saved: q, q_rstd, k, k_rstd, v, g, beta,
    A. Workspace: `vram.model.families.workspace.gated_delta_rule`'s tensors."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor,  # type: ignore[override]
                v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        v, beta = v.contiguous(), beta.contiguous()
        b, t, hk, dk = q.shape
        hv, dv = v.shape[2], v.shape[3]
        q_n, k_n = q.new_empty(q.shape), k.new_empty(k.shape)
        q_rstd = q.new_empty((b, t, hk), dtype=torch.float32)
        k_rstd = k.new_empty((b, t, hk), dtype=torch.float32)
        g_cum = g.new_empty(g.shape, dtype=torch.float32)
        a = k.new_empty((b, t, hv, FLA_CHUNK))
        chunks = -(-t // FLA_CHUNK)
        # w, u (wy_fast.py L273-274), h, v_new (common/chunk_delta_h.py L715-721)
        work = [k.new_empty((b, t, hv, dk)), k.new_empty((b, t, hv, dv)),
                k.new_empty((b, chunks, hv, dk, dv)), k.new_empty((b, t, hv, dv))]
        o = v.new_empty((b, t, hv, dv))
        del work
        ctx.save_for_backward(q_n, q_rstd, k_n, k_rstd, v, g_cum, beta, a)
        ctx.shapes = (q.shape, k.shape, g.shape)
        return o

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, _, k, _, v, g, beta, _ = ctx.saved_tensors
        b, t, hv, dv = v.shape
        dk_ = k.shape[3]
        chunks = -(-t // FLA_CHUNK)

        def e(*shape: int) -> torch.Tensor:
            return k.new_empty(shape)

        # at prepare_wy_repr_bwd: w, u, h, v_new recomputed; dh, dv (chunk_delta_h.py
        # L776-780); dq, dk, dw (common/chunk_o.py L739-742); dk, dv, db (wy_fast.py L318-321);
        # fp32 dg (NK copies) and the second dg
        work = [e(b, t, hv, dk_), e(b, t, hv, dv), e(b, chunks, hv, dk_, dv), e(b, t, hv, dv),
                e(b, chunks, hv, dk_, dv), e(b, t, hv, dv),
                e(b, t, hv, dk_), e(b, t, hv, dk_), e(b, t, hv, dk_),
                e(b, t, hv, dk_), e(b, t, hv, dv), e(b, t, hv),
                *(k.new_empty((b, t, hv), dtype=torch.float32) for _ in range(FLA_NK + 1))]
        del work
        q_shape, k_shape, g_shape = ctx.shapes
        return (q.new_empty(q_shape) if ctx.needs_input_grad[0] else None,
                k.new_empty(k_shape) if ctx.needs_input_grad[1] else None,
                _grad(ctx, 2, v), g.new_empty(g_shape) if ctx.needs_input_grad[3] else None,
                _grad(ctx, 4, beta))


def chunk_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           g: torch.Tensor, beta: torch.Tensor, chunk_size: int = 64,
                           initial_state: torch.Tensor | None = None,
                           output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' `torch_chunk_gated_delta_rule` as fla's kernel runs it (training: no
    initial or final state)."""
    out: torch.Tensor = ChunkGatedDeltaRule.apply(query, key, value, g, beta)
    return out, None


class Mamba2SplitConv1dScan(torch.autograd.Function):
    """mamba_ssm's `MambaSplitConv1dScanCombinedFn` (ops/triton/ssd_combined.py@e9594ce1
    L824-900), with the gated norm and `out_proj` folded in as transformers calls it in
    training. Saved (L888): zxbcdt, the conv, norm and out_proj weights, A, D, dt_bias, the
    scan's output out_x [B, T, d] and the norm's fp32 rstd [G·B·T]. Forward workspace: the conv
    output [B, T, d + 2GN], the norm's output, the passed chunk states [B, T/C, H, P, N]; in
    fp32 dt and dA_cumsum [B, H, T] and the larger of the raw chunk states and CB
    [B, T/C, G, C, C], held together (as `workspace.mamba2_split_conv1d_scan` counts them: an
    upper bound of the two fullest moments). Backward, at `_state_passing_bwd`
    (ssd_state_passing.py L241-243): xBC recomputed and dxBC, dzxbcdt (returned), out_proj's
    input recomputed, its gradient and the norm's, dt's clone, the states and their gradient;
    in fp32 dt, dA_cumsum, CB and the states with their gradient."""

    @staticmethod
    def forward(ctx: Any, zxbcdt: torch.Tensor, conv_w: torch.Tensor,  # type: ignore[override]
                conv_b: torch.Tensor | None, dt_bias: torch.Tensor, a: torch.Tensor,
                d_skip: torch.Tensor, norm_w: torch.Tensor | None, out_w: torch.Tensor,
                out_b: torch.Tensor | None, chunk: int, groups: int) -> torch.Tensor:
        b, t, _ = zxbcdt.shape
        heads, d, conv = dt_bias.shape[0], out_w.shape[1], conv_w.shape[0]
        n = (conv - d) // (2 * groups)
        chunks = -(-t // chunk)
        f32 = torch.float32
        states = (b, chunks, heads, d // heads, n)
        raw = (zxbcdt.new_empty(states, dtype=f32) if d * n // chunk >= groups * chunk
               else zxbcdt.new_empty((b, chunks, groups, chunk, chunk), dtype=f32))
        work = [zxbcdt.new_empty((b, t, conv)), zxbcdt.new_empty((b, t, d)),
                zxbcdt.new_empty(states), raw,
                zxbcdt.new_empty((b, heads, t), dtype=f32),
                zxbcdt.new_empty((b, heads, t), dtype=f32)]
        out_x = zxbcdt.new_empty((b, t, d))
        rstd = zxbcdt.new_empty((groups * b * t,), dtype=f32) if norm_w is not None else None
        out = zxbcdt.new_empty((b, t, out_w.shape[0]))
        del work, raw
        ctx.save_for_backward(zxbcdt, conv_w, conv_b, out_x, a, d_skip, dt_bias, norm_w, rstd,
                              out_w, out_b)
        ctx.sizes = (chunk, groups, n)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        zxbcdt, conv_w, conv_b, _, a, d_skip, dt_bias, norm_w, _, out_w, out_b = (
            ctx.saved_tensors)
        chunk, groups, n = ctx.sizes
        b, t, _ = zxbcdt.shape
        heads, d, conv = dt_bias.shape[0], out_w.shape[1], conv_w.shape[0]
        chunks = -(-t // chunk)
        f32 = torch.float32
        states = (b, chunks, heads, d // heads, n)

        def e(*shape: int) -> torch.Tensor:
            return zxbcdt.new_empty(shape)

        dzxbcdt = torch.empty_like(zxbcdt)
        work = [e(b, t, conv), e(b, t, conv), e(b, t, d), e(b, t, d), e(b, t, d),
                e(b, heads, t), e(*states), e(*states),
                zxbcdt.new_empty((b, heads, t), dtype=f32),
                zxbcdt.new_empty((b, heads, t), dtype=f32),
                zxbcdt.new_empty((b, chunks, groups, chunk, chunk), dtype=f32),
                zxbcdt.new_empty(states, dtype=f32), zxbcdt.new_empty(states, dtype=f32)]
        del work
        return (dzxbcdt if ctx.needs_input_grad[0] else None, _grad(ctx, 1, conv_w),
                _grad(ctx, 2, conv_b), _grad(ctx, 3, dt_bias), _grad(ctx, 4, a),
                _grad(ctx, 5, d_skip), _grad(ctx, 6, norm_w), _grad(ctx, 7, out_w),
                _grad(ctx, 8, out_b), None, None)


def mamba2_split_conv1d_scan_combined(
        zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor, conv1d_bias: torch.Tensor | None,
        dt_bias: torch.Tensor, A: torch.Tensor, D: torch.Tensor, chunk_size: int,
        initial_states: torch.Tensor | None = None, dt_limit: Any = None,
        return_final_states: bool = False, activation: str = "silu",
        rmsnorm_weight: torch.Tensor | None = None, rmsnorm_eps: float = 1e-6,
        outproj_weight: torch.Tensor | None = None, outproj_bias: torch.Tensor | None = None,
        headdim: int | None = None, ngroups: int = 1, norm_before_gate: bool = True,
        **kwargs: Any) -> torch.Tensor:
    """transformers' `mamba2_split_conv1d_scan_combined` as mamba_ssm's kernel runs it."""
    assert outproj_weight is not None, "transformers passes out_proj's weight in training"
    out: torch.Tensor = Mamba2SplitConv1dScan.apply(
        zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rmsnorm_weight, outproj_weight,
        outproj_bias, chunk_size, ngroups)
    return out


class SelectiveScan(torch.autograd.Function):
    """mamba_ssm's `SelectiveScanFn` (ops/selective_scan_interface.py@e9594ce1 L20-66), Mamba-1
    with z as Jamba calls it: u, delta, B, C and z are made contiguous where their last dim's
    stride is not 1; the CUDA forward returns out and out_z [B, d, T] in u's dtype and the chunk
    states x [B, d, ceil(T/2048), 2N] in fp32 (csrc/selective_scan/selective_scan.cpp L304-313);
    saved (L63-66): u, delta, A, B, C, D, z, delta_bias, x, out. The backward (L440-463)
    allocates du, ddelta, dz in the inputs' dtype and, B and C varying, dB and dC in fp32."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, delta: torch.Tensor,  # type: ignore[override]
                a: torch.Tensor, b_in: torch.Tensor, c_in: torch.Tensor, d_skip: torch.Tensor,
                z: torch.Tensor, delta_bias: torch.Tensor | None) -> torch.Tensor:
        u, delta, b_in, c_in, z = (t if t.stride(-1) == 1 else t.contiguous()
                                   for t in (u, delta, b_in, c_in, z))
        batch, d, t = u.shape
        chunks = -(-t // SCAN_CHUNK)
        out = u.new_empty((batch, d, t))
        states = u.new_empty((batch, d, chunks, 2 * a.shape[1]), dtype=torch.float32)
        out_z = u.new_empty((batch, d, t))
        ctx.save_for_backward(u, delta, a, b_in, c_in, d_skip, z, delta_bias, states, out)
        return out_z

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        u, delta, a, b_in, c_in, d_skip, z, delta_bias, _, _ = ctx.saved_tensors
        du, ddelta, dz = torch.empty_like(u), torch.empty_like(delta), torch.empty_like(z)
        d_b = b_in.new_empty(b_in.shape, dtype=torch.float32)
        d_c = c_in.new_empty(c_in.shape, dtype=torch.float32)
        grads = (du, ddelta, _grad(ctx, 2, a), d_b.to(b_in.dtype), d_c.to(c_in.dtype),
                 _grad(ctx, 5, d_skip), dz, _grad(ctx, 7, delta_bias))
        del d_b, d_c
        return tuple(g if ctx.needs_input_grad[i] else None for i, g in enumerate(grads))


def selective_scan_fn(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      C: torch.Tensor, D: torch.Tensor, z: torch.Tensor,
                      delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                      return_last_state: bool = False, **kwargs: Any) -> torch.Tensor:
    """transformers' `mamba_selective_scan` (Jamba) as mamba_ssm's kernel runs it (training:
    no last state)."""
    out: torch.Tensor = SelectiveScan.apply(u, delta, A, B, C, D, z, delta_bias)
    return out


REPLACEMENTS: dict[str, Any] = {
    "causal_conv1d_fn": causal_conv1d_fn,
    "torch_chunk_gated_delta_rule": chunk_gated_delta_rule,
    "mamba2_split_conv1d_scan_combined": mamba2_split_conv1d_scan_combined,
    "mamba_selective_scan": selective_scan_fn,
}


def _modeling(model_type: str) -> str:
    """The transformers package of a model type ("qwen3_5_text" -> "qwen3_5"), or ""."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return ""
    parts = CONFIG_MAPPING[model_type].__module__.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["transformers", "models"] else ""


def trace_note(model_type: str, on: bool) -> str | None:
    """The trace's note when it emulates this model type's mixer kernels, else None."""
    return NOTE if on and _modeling(model_type) in PATCHED else None


@contextlib.contextmanager
def emulated_mixer_kernels(model_type: str, on: bool) -> Iterator[None]:
    """Inside, with `on`: the model type's modeling file calls the emulating Functions."""
    name = _modeling(model_type)
    names = PATCHED.get(name, ()) if on else ()
    module = (importlib.import_module(f"transformers.models.{name}.modeling_{name}")
              if names else None)
    originals = {fn: getattr(module, fn) for fn in names}
    try:
        for fn in names:
            setattr(module, fn, REPLACEMENTS[fn])
        yield
    finally:
        for fn, original in originals.items():
            setattr(module, fn, original)
