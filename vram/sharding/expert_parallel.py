"""The slice of an MoE model one expert-parallel rank holds, and where its expert state is
sharded (issue 22, item 3).

Expert parallel splits each routed bank along its expert dimension: torchtitan's
`ExpertParallel._partition_fn` distributes every expert parameter with `Shard(0)` over the EP
mesh (torchtitan/distributed/expert_parallel.py@03a1384), as DeepSpeed-MoE's expert groups
hold `E / ep` experts per rank (deepspeed/moe/layer.py@v0.18.4 `num_local_experts`). So a rank
holds `E / ep` experts of every routed bank; the router, the shared experts, attention and the
rest are replicated. Each token still visits `top_k` experts: with balanced routing a rank's
experts compute `tokens · top_k` rows, the same as without EP (`capacity_factor` scales that).

ZeRO/FSDP of the expert banks runs over the ranks that hold the same experts, `group / ep` of
them (torchtitan's `dp_shard_mod_ep` mesh, parallelize.py@v0.2.2 `apply_fsdp`: experts are
`fully_shard`-ed on it; DeepSpeed's expert-data-parallel group): where a state is sharded the
rank's share of the banks is `bank / ep / (group / ep) = bank / group`, as without EP; where it
is not, `bank / ep`. `state_model` gives the model whose parameter groups size each state.

    >>> from vram import load_model
    >>> ep_local(load_model("mixtral-8x7b-v0.1"), 4).stacks[0].linears[-1].copies
    2
"""

from __future__ import annotations

from vram.errors import VramError
from vram.memo import memoized
from vram.model.spec import LayerStack, Linear, ModelSpec

SOURCE = "torchtitan/distributed/expert_parallel.py@03a1384 ExpertParallel"


def _routed(linear: Linear, stack: LayerStack) -> bool:
    """A whole routed expert bank: one copy per expert (shared experts are one MLP)."""
    return stack.n_experts > 1 and linear.copies == stack.n_experts and linear.ep_split == 1


def _stack(stack: LayerStack, ep: int) -> LayerStack:
    if not any(_routed(linear, stack) for linear in stack.linears):
        return stack
    if stack.n_experts % ep:
        raise VramError(f"ep: {ep} must divide the {stack.n_experts} experts of each MoE layer "
                        "(each rank holds whole experts)")
    # E/ep copies, each seeing ep × top-k/E of the rank's tokens: top-k rows per token in all
    linears = tuple(
        linear.model_copy(update={"copies": linear.copies // ep, "ep_split": ep,
                                  "token_fraction": linear.token_fraction * ep})
        if _routed(linear, stack) else linear for linear in stack.linears)
    return stack.model_copy(update={"linears": linears})


def ep_local(model: ModelSpec, ep: int) -> ModelSpec:
    """`model` as one of `ep` expert-parallel ranks holds it (see the module docstring)."""
    if ep == 1:
        return model
    return memoized(model, ("ep_local", ep), lambda: _ep_local(model, ep))


def _ep_local(model: ModelSpec, ep: int) -> ModelSpec:
    if not model.is_moe:
        raise VramError(f"ep: {model.name} has no routed experts to split; use ep 1")
    return model.model_copy(update={
        "name": f"{model.name} (experts: 1 of {ep} expert-parallel ranks)",
        "stacks": tuple(_stack(stack, ep) for stack in model.stacks),
    })


def _whole(linear: Linear) -> Linear:
    if linear.ep_split == 1:
        return linear
    return linear.model_copy(update={
        "copies": linear.copies * linear.ep_split, "ep_split": 1,
        "token_fraction": linear.token_fraction / linear.ep_split})


def state_model(model: ModelSpec, sharded: bool) -> ModelSpec:
    """The model whose parameters size one state of an expert-parallel rank `model`: its own
    (`bank / ep`) where the state is not sharded, the whole banks where ZeRO/FSDP shards it
    (over `group / ep` ranks of the same experts: `bank / group`, `shards_of` divides)."""
    if not sharded or not any(ln.ep_split > 1 for st in model.stacks for ln in st.linears):
        return model
    return memoized(model, ("ep_whole",), lambda: model.model_copy(update={"stacks": tuple(
        stack.model_copy(update={"linears": tuple(_whole(ln) for ln in stack.linears)})
        for stack in model.stacks)}))
