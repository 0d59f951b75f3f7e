"""The knob of the hybrid layers' kernels (issue 22), declared once as a field type.

`TrainingSetup.mixer_kernels` names it (`vram.setup.training`). transformers runs a Gated
DeltaNet, Mamba or short-convolution layer through fla's, mamba_ssm's and causal-conv1d's fused
kernels when they are installed, else through its own PyTorch code
(transformers/integrations/hub_kernels.py@v5.24.0 `use_kernel_func_from_hub_with_fallback` on
`chunk_gated_delta_rule`, `mamba_split_conv1d_scan_combined`, `selective_scan_fn`,
`causal_conv1d_fn`; the configs' `use_mamba_kernels` "is deprecated and has no effect",
nemotron_h/modeling_nemotron_h.py@v5.24.0 L451-456): what each keeps and
allocates is in `docs/hybrid-layers.md`. A fact of the run's environment, so each stack states
its default (`data/stacks.toml`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from vram.setup.knob import Knob

MixerKernels = Annotated[bool | None, Field(strict=True), Knob(
    "Hybrid layers' fused kernels", key="mixk", flag="--mixer-kernels", column="mixer_kernels",
    labels=(("auto", "stack default"), ("true", "fla / mamba_ssm / causal-conv1d kernels"),
            ("false", "transformers' PyTorch fallback")),
    help="linear-attention, Mamba and short-conv layers run the fused kernels (fla, mamba_ssm, "
         "causal-conv1d installed: their chunk states counted as workspace) or transformers' "
         "PyTorch fallback (its own saved set and transients); the CPU trace runs the fallback, "
         "or with the kernels stand-ins that keep and allocate what the kernels do",
)]
