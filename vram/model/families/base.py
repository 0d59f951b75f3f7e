"""What every family provides, and the Linear layouts families share.

A family turns a config (read through `ConfigReader`) into a `ModelSpec`. Each family states
how its code behaves as flags on the spec (`LayerStack` fields), never as a model-type test in the
estimator.
"""

from __future__ import annotations

from typing import Protocol

from vram.model.config_reader import ConfigReader
from vram.model.spec import Linear, ModelSpec, Role


class ArchitectureFamily(Protocol):
    """One architecture family (fitcheck's `ArchitectureFamily`, for training memory)."""

    def build(self, name: str, model_type: str, r: ConfigReader) -> ModelSpec:
        """The spec of the model the config describes; a bad key raises ConfigError."""
        ...


#: transformers.activations: which activations are Python formulas and what they keep.
_ACT_SAVED: dict[str, int] = {"gelu_new": 4, "gelu_fast": 4, "quick_gelu": 2}


def act_saved(r: ConfigReader, key: str = "hidden_act", default: str = "silu") -> int:
    """I-wide tensors the MLP activation keeps for backward (see `LayerStack.act_saved`)."""
    return _ACT_SAVED.get(r.str(key, default), 1)


def act_pow_fp32(r: ConfigReader, key: str = "hidden_act", default: str = "silu") -> bool:
    """Whether the activation is `gelu_new`, whose `torch.pow` autocast runs in fp32
    (transformers/activations.py NewGELUActivation; `gelu_fast` multiplies, no pow)."""
    return r.str(key, default) == "gelu_new"


def attention_linears(
    h: int, n_heads: int, n_kv: int, head_dim: int, *, names: tuple[str, str, str, str],
    qkv_bias: bool, o_bias: bool, prefix: str = "",
) -> tuple[Linear, ...]:
    """Separate q, k, v and output projections (Llama's q_proj, k_proj, v_proj, o_proj)."""
    q_name, k_name, v_name, o_name = names
    q_out, kv_out = n_heads * head_dim, n_kv * head_dim
    cross = prefix == "cross_"
    return (
        Linear(name=q_name, role=Role.CROSS_Q if cross else Role.Q, d_in=h, d_out=q_out,
               bias=qkv_bias),
        Linear(name=k_name, role=Role.CROSS_K if cross else Role.K, d_in=h, d_out=kv_out,
               bias=qkv_bias),
        Linear(name=v_name, role=Role.CROSS_V if cross else Role.V, d_in=h, d_out=kv_out,
               bias=qkv_bias),
        Linear(name=o_name, role=Role.CROSS_O if cross else Role.O, d_in=q_out, d_out=h,
               bias=o_bias),
    )


def fused_qkv(h: int, n_heads: int, n_kv: int, head_dim: int, name: str, bias: bool) -> Linear:
    """One projection that computes q, k and v together (Falcon's query_key_value)."""
    q_out, kv_out = n_heads * head_dim, n_kv * head_dim
    return Linear(name=name, role=Role.QKV, d_in=h, d_out=q_out + 2 * kv_out, bias=bias,
                  parts=(q_out, kv_out, kv_out))


def gated_mlp(h: int, inter: int, bias: bool = False, *, names: tuple[str, str, str] = (
    "gate_proj", "up_proj", "down_proj"), copies: int = 1, token_fraction: float = 1.0,
) -> tuple[Linear, ...]:
    """SwiGLU / GeGLU: down(act(gate(x)) · up(x))."""
    gate, up, down = names
    return (
        Linear(name=gate, role=Role.GATE, d_in=h, d_out=inter, bias=bias, copies=copies,
               token_fraction=token_fraction),
        Linear(name=up, role=Role.UP, d_in=h, d_out=inter, bias=bias, copies=copies,
               token_fraction=token_fraction),
        Linear(name=down, role=Role.DOWN, d_in=inter, d_out=h, bias=bias, copies=copies,
               token_fraction=token_fraction),
    )


def plain_mlp(h: int, inter: int, bias: bool, names: tuple[str, str]) -> tuple[Linear, ...]:
    """fc1 -> activation -> fc2."""
    return (
        Linear(name=names[0], role=Role.UP, d_in=h, d_out=inter, bias=bias),
        Linear(name=names[1], role=Role.DOWN, d_in=inter, d_out=h, bias=bias),
    )
