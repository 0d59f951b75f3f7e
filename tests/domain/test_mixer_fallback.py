"""transformers' PyTorch fallback of the hybrid mixers (`mixer_kernels` false): what it keeps
for its backward (issue 22; `vram.model.families.fallback`, `docs/hybrid-layers.md`).

The figures are the bytes autograd saved inside one mixer of each type's default config
(`tests/data/families/`), b = 1, s = 512, bf16, with transformers 5.24.0 and torch on CPU:
every storage a `torch.autograd.graph.saved_tensors_hooks` pack hook saw during the mixer's
forward, less the mixer's input and its parameters; "frozen" with the mixer's weights frozen
(LoRA), "trained" with them training (a full fine-tune). The kernels' saved set (what the
estimate counted for the fallback before) is 4-17x smaller for the Mamba-2 and Gated DeltaNet
layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vram import TrainingSetup, load_model
from vram.memory.activations.context import layer_context
from vram.memory.activations.terms import mixer_term
from vram.memory.activations.transients import mixer_workspace_per_token
from vram.model.spec import Mixer
from vram.stacks.profile import profile_for

ROOT = Path(__file__).resolve().parents[2]
S = 512

#: (model type, config changes, the mixer, method) -> bytes saved per layer (measured).
MEASURED = [
    ("nemotron_h", {}, Mixer.MAMBA2, "lora", 471_065_650),
    ("nemotron_h", {}, Mixer.MAMBA2, "full", 513_271_346),
    ("falcon_h1", {}, Mixer.MAMBA2, "lora", 559_172_882),
    ("falcon_h1", {}, Mixer.MAMBA2, "full", 566_775_570),
    ("qwen3_5_text", {}, Mixer.GATED_DELTANET, "lora", 176_772_224),
    ("qwen3_5_text", {}, Mixer.GATED_DELTANET, "full", 185_226_496),
    ("lfm2", {"layer_types": ["conv"] * 32}, Mixer.SHORT_CONV, "lora", 13_117_440),
]


def _mixer_bytes(model_type: str, changes: dict[str, object], mixer: Mixer, method: str,
                 kernels: bool) -> int:
    config = json.loads((ROOT / "tests" / "data" / "families" / f"{model_type}.json").read_text())
    spec = load_model({**config, **changes})
    stack = next(s for s in spec.stacks if s.mixer is mixer)
    setup = TrainingSetup(method=method, precision="bf16-true", micro_batch=1, seq_len=S,
                          lora_targets="q_proj,v_proj", mixer_kernels=kernels)
    term = mixer_term(layer_context(spec, stack, setup, profile_for(setup)))
    assert term is not None
    return term.bytes_per_token * S


@pytest.mark.parametrize(("model_type", "changes", "mixer", "method", "measured"), MEASURED)
def test_fallback_saved_set_matches_autograd(model_type: str, changes: dict[str, object],
                                             mixer: Mixer, method: str, measured: int) -> None:
    ours = _mixer_bytes(model_type, changes, mixer, method, kernels=False)
    # the rest is the masks and the [c, c] inter-chunk decays, under 0.05 %
    assert abs(ours - measured) / measured < 5e-4, (ours, measured)


def test_fallback_is_not_the_kernels_saved_set() -> None:
    """With the kernels the same Mamba-2 layer keeps the in_proj output and the scan output
    (mamba_ssm ssd_combined.py L888) and the norm's rstd: 26,752 elements and 8 fp32 a token,
    27,410,432 bytes at s = 512; the fallback keeps 17 times that."""
    assert _mixer_bytes("nemotron_h", {}, Mixer.MAMBA2, "lora", kernels=True) == 27_410_432
    assert _mixer_bytes("nemotron_h", {}, Mixer.MAMBA2, "lora", kernels=False) > 17 * 27_410_432


def test_jamba_loop_backward_gradients() -> None:
    """Jamba's fallback loops over every token; each step's backward sends a whole [b, d, T, N]
    fp32 gradient to discrete_A and to deltaB_u: two sums and one in flight, 3·d·N fp32 a
    token (d 8,192, N 16: 1,572,864 bytes), at the Mamba layer's backward (the trace's Jamba
    LoRA row: -32.7 % activations without it, +0.7 % with it)."""
    config = json.loads((ROOT / "tests" / "data" / "families" / "jamba.json").read_text())
    spec = load_model(config)
    stack = next(s for s in spec.stacks if s.mixer is Mixer.MAMBA1)
    setup = TrainingSetup(method="lora", precision="bf16-true", micro_batch=1, seq_len=S,
                          lora_targets="q_proj,v_proj", mixer_kernels=False)
    c = layer_context(spec, stack, setup, profile_for(setup))
    assert mixer_workspace_per_token(c, backward=True) == 3 * 8192 * 16 * 4 == 1_572_864
    assert mixer_workspace_per_token(c, backward=False) == 0
