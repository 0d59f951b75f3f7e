"""Autocast as CUDA runs it, for a trace that autocasts fake CPU tensors.

The trace runs the mixed recipes under `torch.autocast("cpu")`, but the estimate models a GPU,
and the two autocasts cast different ops. On CUDA, `layer_norm`, `group_norm`, `rms_norm`,
`pow`, `exp`, `rsqrt`, ... run in fp32 and `softmax`, `log_softmax`, `sum`, `cumsum`, `prod`, ...
return fp32 unless the caller passes a dtype; on CPU they keep a bf16 input bf16. Falcon's eager
attention (`F.softmax(..., dtype=hidden_states.dtype)` after a LayerNorm) keeps its s×s
probabilities in fp32 on a GPU and in bf16 on the CPU: 2x on the largest activation.

Inside `cuda_autocast()` every AutocastCPU kernel follows CUDA's policy: the ops of CUDA's lists
get CUDA's policy, CPU-only entries fall through (no cast). Autograd runs below autocast, so it
saves what it saves on a GPU. The lists are CUDA's at the installed torch:
torch/include/ATen/autocast_mode.h@v2.13.0 (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE, AT_FORALL_PROMOTE),
registered for the Autocast key in aten/src/ATen/autocast_mode.cpp@v2.13.0 together with
`cudnn_convolution[_transpose]` (lower precision) and the `binary_cross_entropy` ban. The
policies' semantics (what is cast, when the optional dtype is set) follow the wrappers in
autocast_mode.h (`WrapFunction_`, `cached_cast`, `set_opt_dtype`, `promote_type`). The weight
cast cache (`cached_cast`) is not reproduced for the few lower-precision ops added here (einsum,
mv, addmv, ...): the ops CPU already casts keep torch's own kernels, cache included.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.library import Library, fallthrough_kernel

LOWER_PRECISION_FP = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
#: fp32_append_dtype: the overload without a dtype redispatches to the one with dtype=fp32.
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype",
                     "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add")

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _overload(name: str) -> torch._ops.OpOverload | None:
    """`aten::name.overload`, or None where this build has no such op."""
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    op: torch._ops.OpOverload | None = getattr(packet, overload or "default", None)
    return op


def _eligible(value: object) -> bool:
    """`is_eligible` in autocast_mode.h: a defined floating CPU tensor that is not fp64."""
    return (isinstance(value, torch.Tensor) and value.is_floating_point()
            and value.dtype != torch.float64 and value.device.type == "cpu")


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """`cached_cast`: eligible tensors (and tensors in lists) to `dtype`, the rest unchanged."""
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, dtype) for item in value)
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    return value


def _flat_tensors(values: tuple[Any, ...]) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _flat_tensors(tuple(value))
        elif isinstance(value, torch.Tensor):
            yield value


def _promote_dtype(args: tuple[Any, ...]) -> torch.dtype:
    """`promote_type`: fp32 if an eligible argument is fp32 (fp64 ignored), else 16 bits."""
    dtype = torch.get_autocast_dtype("cpu")
    for tensor in _flat_tensors(args):
        if _eligible(tensor) and tensor.dtype == torch.float32:
            dtype = torch.float32
    return dtype


Kernel = Callable[..., Any]


def _below_autocast(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
        return op(*args, **kwargs)


def _cast_kernel(op: torch._ops.OpOverload, dtype_of: Callable[[tuple[Any, ...]], torch.dtype]
                 ) -> Kernel:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = dtype_of(args + tuple(kwargs.values()))
        return _below_autocast(op, *_cast(args, dtype),
                               **{k: _cast(v, dtype) for k, v in kwargs.items()})
    return kernel


def _set_opt_dtype_kernel(op: torch._ops.OpOverload) -> Kernel:
    """fp32_set_opt_dtype: an eligible first argument gets dtype=fp32 unless one was passed."""
    names = [a.name for a in op._schema.arguments if not a.kwarg_only]
    position = names.index("dtype") if "dtype" in names else None

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if args and _eligible(args[0]):
            if position is not None and len(args) > position:
                if args[position] is None:
                    args = (*args[:position], torch.float32, *args[position + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return _below_autocast(op, *args, **kwargs)
    return kernel


def _append_dtype_kernel(op: torch._ops.OpOverload, with_dtype: torch._ops.OpOverload) -> Kernel:
    """fp32_append_dtype: an eligible first argument redispatches with dtype=fp32 appended."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        if args and _eligible(args[0]):
            return _below_autocast(with_dtype, *args, **kwargs, dtype=torch.float32)
        return _below_autocast(op, *args, **kwargs)
    return kernel


def _banned(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("binary_cross_entropy is unsafe to autocast (CUDA autocast bans it); "
                       "use binary_cross_entropy_with_logits")


def cuda_policy_kernels() -> dict[str, Kernel]:
    """Per `aten::` op (qualified overload name): the kernel CUDA's autocast policy gives it."""
    def lower(_args: tuple[Any, ...]) -> torch.dtype:
        return torch.get_autocast_dtype("cpu")

    def fp32(_args: tuple[Any, ...]) -> torch.dtype:
        return torch.float32

    kernels: dict[str, Kernel] = {}
    on_cpu = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"))
    for name in LOWER_PRECISION_FP:
        op = _overload(name)
        if op is not None and op.name() not in on_cpu:  # the CPU's own kernel is the same policy
            kernels[op.name()] = _cast_kernel(op, lower)
    for names, dtype_of in ((FP32, fp32), (PROMOTE, _promote_dtype)):
        for name in names:
            op = _overload(name)
            if op is not None:
                kernels[op.name()] = _cast_kernel(op, dtype_of)
    for name in FP32_SET_OPT_DTYPE:
        op = _overload(name)
        if op is not None:
            kernels[op.name()] = _set_opt_dtype_kernel(op)
    for name, with_dtype_name in FP32_APPEND_DTYPE.items():
        op, with_dtype = _overload(name), _overload(with_dtype_name)
        if op is not None and with_dtype is not None:
            kernels[op.name()] = _append_dtype_kernel(op, with_dtype)
    kernels["aten::binary_cross_entropy"] = _banned
    return kernels


def _same_on_cpu() -> set[str]:
    """CPU entries whose policy CUDA shares (its lower-precision list), kept as they are."""
    names = set()
    for name in LOWER_PRECISION_FP:
        op = _overload(name)
        if op is not None:
            names.add(op.name())
    return names


@contextlib.contextmanager
def cuda_autocast() -> Iterator[None]:
    """Inside: `torch.autocast("cpu")` casts what `torch.autocast("cuda")` casts, no more."""
    library = Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # overriding the CPU's kernels is the point
            warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered")
            _register(library)
        yield
    finally:
        library._destroy()


def _register(library: Library) -> None:
    """Every AutocastCPU entry: CUDA's policy for CUDA's lists, a fallthrough for the rest."""
    kernels = cuda_policy_kernels()
    for name, kernel in kernels.items():
        library.impl(name.removeprefix("aten::"), kernel, "AutocastCPU")
    kept = _same_on_cpu()
    for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"):
        if name.startswith("aten::") and name not in kernels and name not in kept:
            library.impl(name.removeprefix("aten::"), fallthrough_kernel, "AutocastCPU")
