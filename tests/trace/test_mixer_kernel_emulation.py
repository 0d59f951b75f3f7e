"""The trace's emulated mixer kernels (`vram.trace.mixer_kernels`) against the closed form's
kernel terms (issue 22): the same reading of fla / mamba_ssm / causal-conv1d, done twice.

`_emulated_saved` counts every storage a `saved_tensors_hooks` pack hook sees during one
mixer's forward (b = 1, s = 512, bf16, the mixer's weights frozen as under LoRA), less the
mixer's input and its parameters, with the kernels emulated; `_closed` is the estimate's
`mixer_term` with `mixer_kernels` true (`tests/domain/test_mixer_fallback.py` does the same for
the fallback).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.trace_grid import TOLERANCE  # noqa: E402
from benchmarks.trace_grid_kernels import compare  # noqa: E402
from vram import TrainingSetup, load_model  # noqa: E402
from vram.memory.activations.context import layer_context  # noqa: E402
from vram.memory.activations.terms import mixer_term  # noqa: E402
from vram.model.spec import Mixer  # noqa: E402
from vram.stacks.profile import profile_for  # noqa: E402
from vram.trace.mixer_kernels import emulated_mixer_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
S = 512


def _config(model_type: str, changes: dict[str, Any]) -> dict[str, Any]:
    config = json.loads((ROOT / "tests" / "data" / "families" / f"{model_type}.json").read_text())
    return {**config, **changes}


def _closed(model_type: str, changes: dict[str, Any], mixer: Mixer, s: int = S,
            method: str = "lora") -> int:
    spec = load_model(_config(model_type, changes))
    stack = next(s for s in spec.stacks if s.mixer is mixer)
    setup = TrainingSetup(method=method, precision="bf16-true", micro_batch=1, seq_len=s,
                          lora_targets="q_proj,v_proj", mixer_kernels=True)
    term = mixer_term(layer_context(spec, stack, setup, profile_for(setup)))
    assert term is not None
    return term.bytes_per_token * s


def _emulated_saved(model_type: str, changes: dict[str, Any], cls_name: str,
                    layer_idx: int, s: int = S, trained: bool = False) -> int:
    from transformers import AutoConfig

    config = _config(model_type, changes)
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    cfg = AutoConfig.for_model(model_type, **fields)
    modeling = importlib.import_module(
        type(cfg).__module__.replace("configuration_", "modeling_"))
    with torch.device("meta"):
        mixer = getattr(modeling, cls_name)(cfg, layer_idx=layer_idx)
    mixer = mixer.to_empty(device="cpu").to(torch.bfloat16).train().requires_grad_(trained)
    x = torch.zeros(1, s, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in mixer.parameters()}
    skip.add(x.untyped_storage().data_ptr())
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with (emulated_mixer_kernels(model_type, True),
          torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)):
        mixer(x)
    return sum(n for key, n in seen.items() if key not in skip)


def test_mamba2_kernel_saved_set_matches() -> None:
    """Nemotron-H's Mamba-2: `MambaSplitConv1dScanCombinedFn` saves zxbcdt, out_x and the
    norm's rstd, 27,410,432 bytes at s512, as the closed form counts; the one difference is
    A = -exp(A_log) (fp32, one per head: 128 x 4 bytes), which does not grow with tokens."""
    closed = _closed("nemotron_h", {}, Mixer.MAMBA2)
    assert closed == 27_410_432
    assert _emulated_saved("nemotron_h", {}, "NemotronHMamba2Mixer", 0) - closed == 128 * 4


def test_gated_deltanet_kernel_saved_set_and_the_norm_gap() -> None:
    """Qwen3.5's Gated DeltaNet (HV 32, V 128): the conv's input and fla's saves (q, k, v,
    beta, A, g, the q/k rstd) agree to the byte, and so does the gated norm
    (`Qwen3_5RMSNormGated`, torch with the kernels too: z in bf16, its input, z and z's SiLU in
    fp32 and its rstd, 8·HV·V + 4·HV bytes a token more than the closed form counted before it
    read the norm from source; out_proj, frozen here, keeps no input); the one difference is
    -exp(A_log), fp32 per value head, which does not grow with tokens."""
    closed = _closed("qwen3_5_text", {}, Mixer.GATED_DELTANET)
    assert closed == 31_686_656 + S * (8 * 32 * 128 + 4 * 32) == 48_529_408
    emulated = _emulated_saved("qwen3_5_text", {}, "Qwen3_5GatedDeltaNet", 0)
    assert emulated - closed == 32 * 4


def test_short_conv_kernel_saved_set_matches() -> None:
    """LFM2's short conv with causal-conv1d: 5h a token, as the emulation keeps; out_proj,
    frozen here, keeps no input (the closed form counted it, 6h, before)."""
    changes: dict[str, Any] = {"layer_types": ["conv"] * 32}
    closed = _closed("lfm2", changes, Mixer.SHORT_CONV)
    assert closed == S * 5 * 2560 * 2
    assert _emulated_saved("lfm2", changes, "Lfm2ShortConv", 0) == closed


def test_selective_scan_saved_set() -> None:
    """Jamba's Mamba-1 (d 8,192, N 16, rank 256): causal-conv1d's and `SelectiveScanFn`'s saves,
    the dt/B/C norms' fp32 inputs and rstd, and the chunk states `x` (one whole 2,048-token
    chunk at s128) agree with the closed form; out_proj and dt_proj, frozen here, keep no
    input. The one difference is A, D, delta_bias in fp32, which do not grow with tokens.
    (s128: CPU bf16 matmuls of this width are slow.)"""
    d, n, rank, s = 8192, 16, 256, 128
    closed = _closed("jamba", {}, Mixer.MAMBA1, s)
    assert closed == s * (2 * (6 * d + 2 * n) + 4 * (rank + 2 * n + 3)) + 4 * d * 2 * n
    emulated = _emulated_saved("jamba", {}, "JambaMambaMixer", 0, s)
    assert emulated - closed == 4 * (d * n + d + d)


@pytest.mark.parametrize(("model_type", "changes", "mixer", "cls_name", "s", "constants"), [
    ("qwen3_5_text", {}, Mixer.GATED_DELTANET, "Qwen3_5GatedDeltaNet", S, 2 * 32 * 4),
    ("lfm2", {"layer_types": ["conv"] * 32}, Mixer.SHORT_CONV, "Lfm2ShortConv", S, 0),
    ("jamba", {}, Mixer.MAMBA1, "JambaMambaMixer", 128, 4 * (2 * 8192 * 16 + 2 * 8192)),
])
def test_full_fine_tune_saved_sets_match(model_type: str, changes: dict[str, Any],
                                         mixer: Mixer, cls_name: str, s: int,
                                         constants: int) -> None:
    """The mixer's weights trained (a full fine-tune): the inner Linears keep their inputs
    (Jamba's x_proj a contiguous copy of the transposed conv output), the norms their
    normalized inputs, g's softplus its fp32 input; the emulation keeps what the closed form
    counts, but for per-layer constants that do not grow with tokens (-exp(A_log) and its
    copies; A, D, delta_bias in fp32)."""
    closed = _closed(model_type, changes, mixer, s, method="full")
    emulated = _emulated_saved(model_type, changes, cls_name, 0, s, trained=True)
    assert emulated - closed == constants


def test_kernel_grid_row_within_tolerance() -> None:
    """One row of `benchmarks/trace_grid_kernels.py`: Nemotron-H LoRA s512, the closed form
    with the kernels against the emulating trace."""
    row = compare("nemotron-h", {"method": "lora", "optimizer": "adamw",
                                 "precision": "bf16-true", "micro_batch": 1, "seq_len": 512,
                                 "grad_ckpt": False, "attention": "sdpa"})
    for key, tolerance in TOLERANCE.items():
        assert abs(row.errors[key]) <= tolerance, (key, row.errors)


class _Peak:
    """The most bytes held at once by tensors created inside (weakref-tracked)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def __enter__(self) -> _Peak:
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if isinstance(out, torch.Tensor) and func._overloadpacket in (
                        torch.ops.aten.new_empty, torch.ops.aten.empty_like,
                        torch.ops.aten.empty, torch.ops.aten.new_empty_strided):
                    n = out.untyped_storage().nbytes()
                    outer.live += n
                    outer.peak = max(outer.peak, outer.live)
                    weakref.finalize(out.untyped_storage(), outer.free, n)
                return out

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def free(self, n: int) -> None:
        self.live -= n

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)


def test_gated_delta_rule_workspace_matches() -> None:
    """fla's forward and backward workspace in the emulation, at its fullest moment, equals
    `workspace.gated_delta_rule` (HV 4, H 2, K = V = 32, T 256, bf16)."""
    from vram.model.families.workspace import gated_delta_rule
    from vram.trace.mixer_kernels import ChunkGatedDeltaRule

    t, hk, hv, k, v = 256, 2, 4, 32, 32
    bf = torch.bfloat16
    q = torch.zeros(1, t, hk, k, dtype=bf, requires_grad=True)
    key = torch.zeros(1, t, hk, k, dtype=bf, requires_grad=True)
    val = torch.zeros(1, t, hv, v, dtype=bf, requires_grad=True)
    g = torch.zeros(1, t, hv, requires_grad=True)
    beta = torch.zeros(1, t, hv, dtype=bf, requires_grad=True)
    fwd_e, fwd_f, bwd_e, bwd_f = gated_delta_rule(hv, k, v)
    kept = t * (2 * 2 * hk * k + 2 * 4 * hk + 4 * hv + 2 * 64 * hv) + t * 2 * hv * v  # + o
    with _Peak() as forward:
        o = ChunkGatedDeltaRule.apply(q, key, val, g, beta)
    assert forward.peak - kept == t * 2 * fwd_e + t * 4 * fwd_f
    with _Peak() as backward:
        o.backward(torch.zeros_like(o))
    assert backward.peak == t * 2 * bwd_e + t * 4 * bwd_f


def test_mamba2_workspace_matches() -> None:
    """mamba_ssm's forward and backward workspace in the emulation, at its fullest moment,
    equals `workspace.mamba2_split_conv1d_scan` (d 64, H 4, G 2, N 16, C 64, T 256, bf16)."""
    from vram.model.families.workspace import mamba2_split_conv1d_scan
    from vram.trace.mixer_kernels import Mamba2SplitConv1dScan

    t, d, heads, groups, n, c, h = 256, 64, 4, 2, 16, 64, 32
    bf = torch.bfloat16
    conv = d + 2 * groups * n
    zxbcdt = torch.zeros(1, t, 2 * d + 2 * groups * n + heads, dtype=bf, requires_grad=True)
    weights = [torch.zeros(conv, 4, dtype=bf), None, torch.zeros(heads), torch.zeros(heads),
               torch.zeros(heads), torch.zeros(d, dtype=bf), torch.zeros(h, d, dtype=bf), None]
    fwd_e, fwd_f, bwd_e, bwd_f = mamba2_split_conv1d_scan(d, heads, groups, n, c)
    kept = t * (2 * d + 4 * groups + 2 * h)  # out_x, rstd, the output
    with _Peak() as forward:
        out = Mamba2SplitConv1dScan.apply(zxbcdt, *weights, c, groups)
    assert forward.peak - kept == t * 2 * fwd_e + t * 4 * fwd_f
    with _Peak() as backward:
        out.backward(torch.zeros_like(out))
    assert backward.peak == t * 2 * bwd_e + t * 4 * bwd_f
