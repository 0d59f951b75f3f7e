"""bitsandbytes storage, emulated on fake tensors.

bitsandbytes kernels do not run on CPU fake tensors, so QLoRA's frozen base is emulated by
`QuantLinear`, an `nn.Linear` subclass (so PEFT wraps it like any linear layer) that stores
exactly the buffers bitsandbytes keeps on the GPU:

* nf4 (`Linear4bit`, blocksize 64): the packed weight, `ceil(n/2)` uint8 bytes (a frozen
  `Params4bit`-like parameter of shape `(ceil(n/2), 1)`), an fp32 absmax per 64-value block and
  the 16-entry fp32 NF4 code table.
* nf4-dq (`compress_statistics=True`): the absmax itself quantized to uint8 (one byte per
  64-block), plus an fp32 absmax per 256 of those blocks, the fp32 offset (a scalar) and the
  256-entry fp32 dynamic code of the nested quantization.
* int8 (`Linear8bitLt`, LLM.int8()): the int8 weight `(out, in)` and an fp32 scale per row (SCB).

Forward, as `bnb.matmul_4bit` / `MatMul4Bit`: the input is cast to the compute dtype, the weight
is dequantized into a temporary `(out, in)` tensor of the compute dtype (for nf4-dq the absmax
is dequantized first into a temporary fp32 vector), used by one matmul and freed. MatMul4Bit
keeps its input for backward (`ctx.tensors = (A, B)` in bitsandbytes/autograd/_functions.py)
although only the weight is needed there; the backward pass dequantizes again to compute the
input gradient. The output is cast back to the
input dtype, as `Linear4bit.forward` does. For int8, the forward quantizes the input row-wise to
int8 (+ fp32 row scales), multiplies into an int32 result and dequantizes it to fp16, as
`MatMul8bitLt` does (the outlier decomposition, threshold 6.0, is not modelled: it depends on
the values).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NF4_BLOCK = 64
NESTED_BLOCK = 256


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def storage_bytes(numel: int, quant: str) -> int:
    """Bytes bitsandbytes stores for one `numel`-value weight (before the 512-byte rounding)."""
    if quant == "int8":
        raise ValueError("int8 storage depends on the row count; use QuantLinear")
    blocks = ceil_div(numel, NF4_BLOCK)
    packed = ceil_div(numel, 2)
    code = 16 * 4
    if quant == "nf4":
        return packed + 4 * blocks + code
    if quant == "nf4-dq":
        return packed + blocks + 4 * ceil_div(blocks, NESTED_BLOCK) + 4 + 256 * 4 + code
    raise ValueError(f"quant: unknown {quant!r}")


class _Dequant4bitMatmul(torch.autograd.Function):
    """`MatMul4Bit`: a temporary dequantized weight per matmul; the input is kept by
    bitsandbytes <= 0.43.0 only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: QuantLinear) -> torch.Tensor:  # type: ignore[override]
        ctx.module = module
        # bitsandbytes <= 0.43.0: `ctx.tensors = (A, B)` keeps the input alive; >= 0.43.3 keeps
        # only the packed weight (`(None, B)`): `vram.stacks.resolve`.
        ctx.tensors = (x,) if module.keeps_input else ()
        weight = module.dequantize(x.dtype)
        out = nn.functional.linear(x, weight, None)
        del weight
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        weight = ctx.module.dequantize(grad.dtype)
        grad_in = torch.matmul(grad, weight)
        del weight
        return grad_in, None


class _Int8Matmul(torch.autograd.Function):
    """`MatMul8bitLt`: int8 input quantization, int32 product, fp16 dequantized output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: QuantLinear) -> torch.Tensor:  # type: ignore[override]
        ctx.module = module
        ctx.dtype = x.dtype
        flat = x.reshape(-1, x.shape[-1])
        half = flat.to(torch.float16)
        q_in = torch.empty(half.shape, dtype=torch.int8)
        row_scale = torch.empty(half.shape[0], dtype=torch.float32)
        del half
        acc = torch.empty((flat.shape[0], module.out_features), dtype=torch.int32)
        del q_in, row_scale
        out = acc.to(torch.float16)
        del acc
        return out.reshape(*x.shape[:-1], module.out_features).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        weight = ctx.module.dequantize(ctx.dtype)
        grad_in = torch.matmul(grad.to(ctx.dtype), weight)
        del weight
        return grad_in, None


class QuantLinear(nn.Linear):
    """A frozen linear layer holding bitsandbytes' quantized storage (see the module docstring)."""

    def __init__(self, linear: nn.Linear, quant: str, compute_dtype: torch.dtype,
                 keeps_input: bool = True) -> None:
        nn.Module.__init__(self)
        #: MatMul4Bit keeps its input for backward (bitsandbytes <= 0.43.0).
        self.keeps_input = keeps_input
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.quant = quant
        self.compute_dtype = compute_dtype
        numel = self.in_features * self.out_features
        frozen = {"requires_grad": False}
        if quant == "int8":
            self.weight = nn.Parameter(
                torch.empty(self.out_features, self.in_features, dtype=torch.int8), **frozen)
            self.register_buffer("SCB", torch.empty(self.out_features, dtype=torch.float32))
        elif quant in ("nf4", "nf4-dq"):
            blocks = ceil_div(numel, NF4_BLOCK)
            self.weight = nn.Parameter(
                torch.empty(ceil_div(numel, 2), 1, dtype=torch.uint8), **frozen)
            self.register_buffer("code", torch.empty(16, dtype=torch.float32))
            if quant == "nf4":
                self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32))
            else:
                self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8))
                self.register_buffer(
                    "nested_absmax",
                    torch.empty(ceil_div(blocks, NESTED_BLOCK), dtype=torch.float32))
                self.register_buffer("offset", torch.empty((), dtype=torch.float32))
                self.register_buffer("nested_code", torch.empty(256, dtype=torch.float32))
        else:
            raise ValueError(f"quant: unknown {quant!r}")
        if linear.bias is not None:
            self.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The temporary full weight bitsandbytes materialises for one matmul."""
        if self.quant == "nf4-dq":
            stored: torch.Tensor = self.get_buffer("absmax")
            absmax = torch.empty_like(stored, dtype=torch.float32)  # dequantized absmax
            weight = torch.empty(self.out_features, self.in_features, dtype=dtype)
            del absmax
            return weight
        return torch.empty(self.out_features, self.in_features, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant == "int8":
            out = _Int8Matmul.apply(x, self)
        else:
            inp_dtype = x.dtype
            x = x.to(self.compute_dtype)
            out = _Dequant4bitMatmul.apply(x, self).to(inp_dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def quantized_bytes(self) -> int:
        """Bytes of this layer's quantized storage (before the 512-byte rounding)."""
        return sum(t.numel() * t.element_size()
                   for t in (self.weight, *self.buffers()))


def lora_forward_bnb(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """PEFT's `lora.bnb.Linear4bit.forward` (bitsandbytes variant of the LoRA wrapper).

    It differs from the plain `lora.Linear` in two ways that matter for memory: the base result
    is defensively cloned ("for 4bit, we need to defensively clone here", PEFT), and outside
    autocast the LoRA input is cast to the adapter dtype and the LoRA output back.
    """
    result = self.base_layer(x, *args, **kwargs)
    if getattr(self.base_layer, "quant", "") != "int8":
        result = result.clone()
    for active_adapter in self.active_adapters:
        if active_adapter not in self.lora_A:
            continue
        lora_a = self.lora_A[active_adapter]
        lora_b = self.lora_B[active_adapter]
        dropout = self.lora_dropout[active_adapter]
        scaling = self.scaling[active_adapter]
        requires_conversion = not torch.is_autocast_enabled(x.device.type)
        expected = result.dtype
        if requires_conversion:
            x = self._cast_input_dtype(x, lora_a.weight.dtype)
        output = lora_b(lora_a(dropout(x))) * scaling
        if requires_conversion:
            output = output.to(expected)
        result = result + output
    return result
