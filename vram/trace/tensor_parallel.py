"""Tensor parallel (and sequence parallel) on a Hugging Face decoder, as torchtitan lays it out.

The plan is torchtitan's `apply_tp` (torchtitan/models/llama3/infra/parallelize.py@v0.2.2),
in Hugging Face's module names:

* each block: q/k/v and gate/up `ColwiseParallel` (the output features split), o and down
  `RowwiseParallel` (the input features split; their outputs all-reduced, or reduce-scattered
  along the sequence under sequence parallel);
* sequence parallel (`SequenceParallel` on both norms, `PrepareModuleInput` all-gathering the
  sequence before attention and the MLP): the norms, the residual stream and the dropouts hold
  `s / tp` tokens; what the attention and the MLP compute on is whole along the sequence;
* the embedding `RowwiseParallel` (split by vocabulary; its output reduce-scattered along the
  sequence under SP, all-reduced without); the head `ColwiseParallel` (split by vocabulary),
  its logits left sharded for `loss_parallel` (torchtitan's default: `disable_loss_parallel`
  False) or all-gathered (Transformers' `colwise_gather_output` for `lm_head`,
  transformers/models/llama/modeling_llama.py@v5.24.0 `_tp_plan`).

One difference from torchtitan, none in memory: Transformers' decoder derives positions and
the mask from the embedding output's shape, so the embedding and the row-parallel layers
return DTensors (`use_local_output=False`: the residual stream is a DTensor sharded on the
sequence) where torchtitan returns their local tensors. A DTensor's local tensor is the same
storage either way.

Only blocks named like Llama's (q_proj ... down_proj, input_layernorm,
post_attention_layernorm; Mistral, Qwen2 and Llama 3 are) are planned; LoRA adapters under
TP are not (Megatron's and NeMo's adapters split with the base layer; no stack runs PEFT's
`LoraLayer` under DTensor TP).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vram.trace.build import Built, TraceUnsupported

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
           "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")
SOURCE = "torchtitan/models/llama3/infra/parallelize.py@v0.2.2 apply_tp"


def _check_names(block: nn.Module) -> None:
    names = {name for name, _ in block.named_modules()}
    missing = [name for name in (*COLWISE, *ROWWISE, *NORMS) if name not in names]
    if missing:
        raise TraceUnsupported(
            f"tp: the trace plans blocks named like Llama's; this one has no {missing[0]}")


def block_plan(sequence_parallel: bool) -> dict[str, Any]:
    """One block's plan: Megatron's column/row split, with or without sequence parallel.
    Without it the residual stream stays a plain (whole, replicated) tensor, as in Megatron
    without `--sequence-parallel`: the norms are not parallelized and the row-parallel outputs
    are all-reduced into local tensors."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: dict[str, Any] = {name: ColwiseParallel() for name in COLWISE}
    if not sequence_parallel:
        plan.update({name: RowwiseParallel() for name in ROWWISE})
        return plan
    plan.update({name: RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
                 for name in ROWWISE})
    plan.update({name: SequenceParallel() for name in NORMS})
    plan["self_attn"] = PrepareModuleInput(
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()})
    plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                     desired_input_layouts=(Replicate(),))
    return plan


def root_plan(sequence_parallel: bool, loss_parallel: bool, has_head: bool) -> dict[str, Any]:
    """The embedding (split by vocabulary), the final norm and the head (split by vocabulary)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq,
                                 use_local_output=not sequence_parallel),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    if has_head:
        plan["head"] = ColwiseParallel(
            input_layouts=seq, output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel)
    return plan


def _path(root: nn.Module, target: nn.Module) -> str:
    for name, module in root.named_modules():
        if module is target:
            return name
    raise TraceUnsupported("tp: the embedding or head is not a submodule of the model")


def apply_tp(built: Built, mesh: Any, *, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Parallelize `built.model` in place over the 1-D `mesh` (see the module docstring)."""
    from torch.distributed.tensor.parallel import parallelize_module

    hf: Any = built.hf
    if built.model is not built.hf:
        raise TraceUnsupported("method: LoRA under tensor parallel is not traced")
    config = hf.config
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    tp = int(mesh.size())
    if heads % tp or kv % tp:
        raise TraceUnsupported(f"tp: {tp} must divide the {heads} query and {kv} key/value heads "
                               "(the column split gives each rank whole heads)")
    for _, blocks in built.layer_lists:
        for block in blocks:
            _check_names(block)
            parallelize_module(block, mesh, block_plan(sequence_parallel))
    embedding, head = hf.get_input_embeddings(), hf.get_output_embeddings()
    norm = getattr(getattr(hf, "model", None), "norm", None)
    if embedding is None or norm is None:
        raise TraceUnsupported("tp: no embedding or final norm found (model.norm)")
    weight = getattr(head, "weight", None)
    if weight is not None and weight is getattr(embedding, "weight", None):
        raise TraceUnsupported("tp: a tied head is not split (torchtitan unties it)")
    named = root_plan(sequence_parallel, loss_parallel, head is not None)
    modules = {"embed": embedding, "norm": norm, "head": head}
    # a pipeline stage holds neither the embedding nor the head of another stage (nn.Identity)
    plan = {_path(hf, modules[key]): style for key, style in named.items()
            if not isinstance(modules[key], nn.Identity)}
    parallelize_module(hf, mesh, plan)
