"""The slice of the model one tensor-parallel rank holds (Megatron's split, issue 23).

Megatron-LM's layout (Shoeybi et al. 2019, SS3; Korthikanti et al. 2022, SS4), as torchtitan
applies it with DTensor (torchtitan/models/llama3/infra/parallelize.py@v0.2.2 `apply_tp`):

* q, k, v and the MLP's gate and up projections are column-parallel: each rank holds
  `1 / tp` of their output features, so `heads / tp` query and key/value heads and
  `intermediate / tp` MLP units;
* the attention output and the MLP's down projection are row-parallel: `1 / tp` of their
  input features;
* the token embedding (row-parallel over the vocabulary) and the output head (column-parallel
  over the vocabulary) hold `ceil(V / tp)` rows each (DTensor's `Shard` chunks as
  `torch.chunk` does: the first ranks hold the larger chunks); the logits are split by
  vocabulary too (loss parallel, torchtitan's default);
* norms and biases of row-parallel layers are replicated.

So one rank's weights, gradients and optimizer state are those of a model with `heads / tp`,
`kv heads / tp`, `intermediate / tp` and `V / tp`, and so are the activations that live inside
attention and the MLP; the hidden-wide ones (norms, residual, the Linears' inputs) are whole
unless sequence parallel splits them (`vram.memory.activations`, `seq_split`).

    >>> from vram import load_model
    >>> tp_local(load_model("llama-3.1-8b"), 8).decoder.n_heads
    4
"""

from __future__ import annotations

from vram.errors import VramError
from vram.memo import memoized
from vram.model.spec import LayerStack, Linear, ModelSpec, Role

#: Column-parallel projections: their output features are split.
COLUMN = frozenset({Role.Q, Role.K, Role.V, Role.QKV, Role.GATE, Role.UP, Role.GATE_UP})
#: Row-parallel projections: their input features are split.
ROW = frozenset({Role.O, Role.DOWN})
SOURCE = "torchtitan/models/llama3/infra/parallelize.py@v0.2.2 apply_tp"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _linear(linear: Linear, tp: int) -> Linear:
    if linear.role in COLUMN:
        return linear.model_copy(update={
            "d_out": linear.d_out // tp, "parts": tuple(p // tp for p in linear.parts)})
    if linear.role in ROW:
        return linear.model_copy(update={"d_in": linear.d_in // tp})
    return linear


def _stack(stack: LayerStack, tp: int) -> LayerStack:
    if stack.n_experts or stack.kv_lora_rank or stack.cross_attention:
        raise VramError("tp: tensor parallel of expert, latent-attention and cross-attention "
                        "layers is not modelled")
    if stack.n_heads % tp or stack.n_kv_heads % tp or stack.intermediate_size % tp:
        raise VramError(f"tp: {tp} must divide the {stack.n_heads} query and "
                        f"{stack.n_kv_heads} key/value heads and the {stack.intermediate_size} "
                        "MLP units (each rank holds whole heads)")
    return stack.model_copy(update={
        "linears": tuple(_linear(linear, tp) for linear in stack.linears),
        "n_heads": stack.n_heads // tp, "n_kv_heads": stack.n_kv_heads // tp,
        "intermediate_size": stack.intermediate_size // tp,
        "shared_expert_width": stack.shared_expert_width // tp,
    })


def tp_local(model: ModelSpec, tp: int) -> ModelSpec:
    """`model` as one of `tp` tensor-parallel ranks holds it (see the module docstring)."""
    if tp == 1:
        return model
    return memoized(model, ("tp_local", tp), lambda: _tp_local(model, tp))


def _tp_local(model: ModelSpec, tp: int) -> ModelSpec:
    vocab = _ceil(model.vocab_size, tp)
    embedding = vocab * model.hidden_size if model.embedding_params else 0
    return model.model_copy(update={
        "name": f"{model.name} (1 of {tp} tensor-parallel ranks)",
        "vocab_size": vocab, "embedding_params": embedding,
        "stacks": tuple(_stack(stack, tp) for stack in model.stacks),
    })
