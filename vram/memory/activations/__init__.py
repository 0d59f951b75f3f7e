"""Activation memory: the tensors autograd keeps from the forward pass for the backward pass.

The count follows what PyTorch really saves, op by op, not a rule of thumb:
- `nn.Linear` saves its input only when its weight trains (grad_W = xᵀ·grad_y); a frozen
  Linear saves nothing but the weight it already has (grad_x = grad_y·W).
- RMSNorm (HF `LlamaRMSNorm`, LitGPT `RMSNorm`) upcasts to fp32 and keeps that copy; it also keeps
  the normalized input when its weight trains. `nn.LayerNorm` keeps its input.
- SDPA's flash and memory-efficient kernels keep q, k, v, the output and a logsumexp; eager
  attention keeps the s×s probabilities (in fp32 in HF's softmax) and their 16-bit cast.
- SiLU/GELU keep their input; the gate product keeps both factors.
- Cross-entropy keeps log-softmax of the logits (fp32 when the stack upcasts them):
  `vram.memory.head`.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4)
give `s·b·h·(34 + 5·a·s/h)` bytes per GPT layer for one implementation; the terms below are the
same bookkeeping for the implementations people actually run. One layer's count is one function
per part (norms, Linear inputs, attention, MLP, dropout, LoRA branches), each returning its
`Term`, plus its forward and backward working sets; all read one frozen `LayerContext`.
"""

from vram.memory.activations.context import LayerContext, MoeBackward, Term, layer_context
from vram.memory.activations.kernel import Kernel, attention_kernel
from vram.memory.activations.layer import LayerActivations, layer_activations
from vram.memory.activations.plan import ActivationPlan, plan
from vram.memory.head import HeadActivations, head_activations

__all__ = [
    "ActivationPlan", "HeadActivations", "Kernel", "LayerActivations", "LayerContext",
    "MoeBackward", "Term", "attention_kernel", "head_activations",
    "layer_activations", "layer_context", "plan",
]
