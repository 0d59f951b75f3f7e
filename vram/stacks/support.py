"""Whether the stack runs the setup's parallel layout and float8 recipe (issue 23).

Each stack's row says which of tensor, pipeline, context (ring, Ulysses) and expert parallel
it runs and which float8 recipes it trains with, each with its source (`data/stacks.toml`).
A setup that asks a stack for one it does not run is answered with a message that names the
knob, the stack and the source, instead of a number for a run that cannot happen.

    >>> from vram.setup import TrainingSetup
    >>> unsupported(TrainingSetup(framework="torchtune", n_gpus=2, pp=2))
    'pp: torchtune runs no pipeline parallel (recipes/full_finetune_distributed.py@torch...'
"""

from __future__ import annotations

from vram.setup import ExpertBanks, Fp8Recipe, TrainingSetup
from vram.stacks.table import StackRow


def unsupported(run: TrainingSetup, row: StackRow | None = None) -> str | None:
    """The first knob of `run` (a resolved setup: `cp_kind` filled in) its stack cannot run,
    as a one-line message; None when it runs all of them."""
    from vram.stacks.table import stack_row

    row = row or stack_row(run.framework)
    stack = run.framework.value
    src = row.sources
    if run.tp > 1 and not row.runs_tensor_parallel:
        return f"tp: {stack} runs no tensor parallel ({src['runs_tensor_parallel']})"
    if run.pp > 1 and not row.runs_pipeline_parallel:
        return f"pp: {stack} runs no pipeline parallel ({src['runs_pipeline_parallel']})"
    if run.cp > 1 and not row.context_parallel_kinds:
        return f"cp: {stack} runs no context parallel ({src['context_parallel_kinds']})"
    if run.cp > 1 and run.cp_kind is not None and run.cp_kind not in row.context_parallel_kinds:
        kinds = ", ".join(k.value for k in row.context_parallel_kinds)
        return (f"cp_kind: {stack} runs {kinds} context parallel, not {run.cp_kind.value} "
                f"({src['context_parallel_kinds']})")
    if run.ep > 1 and not row.runs_expert_parallel:
        return f"ep: {stack} runs no expert parallel ({src['runs_expert_parallel']})"
    if (run.lora_experts is not ExpertBanks.NONE and run.trains_adapters
            and not row.lora_target_parameters):
        where = src["lora_target_parameters"].split(" (")[0]
        return (f"lora_experts: {stack} has no PEFT target_parameters option, so no LoRA on "
                f"expert banks ({where[:100]}); use none")
    if run.fp8 is not Fp8Recipe.NONE and run.fp8 not in row.fp8_recipes:
        recipes = ", ".join(r.value for r in row.fp8_recipes) or "none"
        return (f"fp8: {stack} trains float8 with {recipes}, not {run.fp8.value} "
                f"({src['fp8_recipes']})")
    return None
