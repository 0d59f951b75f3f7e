"""The knobs of torch.compile, declared once as field types: what a run compiles.

`TrainingSetup.compile` and `TrainingSetup.compile_loss` name them (`vram.setup.training`).
Stacks compile the model and the loss apart, and not always both: torchtitan@9dec370 compiled
the blocks while its loss was left eager (`train.py`: `# loss_fn = torch.compile(loss_fn)`,
"TODO: compiling loss function causes CUDA errors"); from bbb1b616e (2025-04) it compiles the
loss with the model (torchtitan/components/loss.py@6404b93 `build_cross_entropy_loss`), and
from 08b8b244f each is a component (`compile.components`, default ["model", "loss"]:
torchtitan/config/job_config.py@v0.2.2). torchtune's `compile: True` compiles the layers and
the loss (recipes/full_finetune_distributed.py@v0.3.0 `training.compile_loss`); Transformers'
`torch_compile` compiles the model, whose forward computes the loss when labels are passed
(`vram.stacks.table`, `compile_loss`). The layers' saved set follows `compile`
(`vram.memory.activations`); the logits and cross-entropy follow `compile_loss`
(`vram.memory.head`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from vram.setup.knob import Knob

#: torch.compile of the model (its layers); None = the stack's published default.
Compile = Annotated[bool | None, Field(strict=True), Knob(
    "torch.compile", key="compile", flag="--compile", column="compile",
    labels=(("auto", "stack default"), ("true", "compiled"),
            ("false", "eager (not compiled)")),
    help="torch.compile of the model's layers (default: the stack's); the loss follows "
         "--compile-loss",
)]

#: torch.compile of the loss (the logits' cross-entropy); None = the stack's: compiled with a
#: compiled model where the stack does so, else eager.
CompileLoss = Annotated[bool | None, Field(strict=True), Knob(
    "torch.compile of the loss", key="closs", flag="--compile-loss", column="compile_loss",
    labels=(("auto", "stack default with the model's compile"), ("true", "compiled loss"),
            ("false", "eager loss (fp32 logits)")),
    help="torch.compile of the cross-entropy (default: with a compiled model, the stack's: "
         "torchtitan before 2025-04 left it eager)",
)]
