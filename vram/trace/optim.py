"""The optimizers of `TrainingSetup.optimizer`, as they allocate on a GPU.

* `adamw`: `torch.optim.AdamW(fused=True)` where the stack uses it (HF Trainer's default
  `adamw_torch_fused`, torchtune): no temporaries. Otherwise `torch.optim.AdamW(foreach=True)`:
  on CUDA `foreach` is the default; on CPU tensors it is not, so it is forced: the traced step
  is the multi-tensor path with its temporaries (one `_foreach_sqrt` copy of the second
  moments per dtype group).
* `sgd` / `sgd-momentum`: `torch.optim.SGD(foreach=True)` with momentum 0 / 0.9.
* `adafactor`: `transformers.optimization.Adafactor` as the HF Trainer builds it
  (`scale_parameter=False, relative_step=False`).
* `lion`: `Lion` below, the reference update (one state, as lion-pytorch).
* `adamw-8bit`, `paged-adamw`, `paged-adamw-8bit`: `Bnb8bitAdamW` below emulates the storage of
  bitsandbytes' `AdamW8bit` / `PagedAdamW` / `PagedAdamW8bit`: for tensors with at least 4096
  values, 8-bit states are uint8 plus an fp32 absmax per 256-value block (and the two shared
  256-entry quantization maps); smaller tensors get fp32 states. Paged variants allocate states
  of tensors with at least 1e5 values in CUDA unified memory, which torch's counters do not
  see: those bytes are reported separately (`paged_bytes`). The update is one fused kernel with
  no temporaries, so the emulated step allocates nothing.
* `adamw-in-backward`: torchtune's `optimizer_in_bwd`: one `AdamW(foreach=True)` per parameter,
  stepped and zeroed in the parameter's post-accumulate-grad hook, so gradients never pile up.

Optimizer step counters: torch keeps `state["step"]` on the CPU unless `capturable`/`fused`, so
0-dim tensors created during the optimizer step are not counted (see `StepDriver`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from vram.memory.optimizer import BNB_BLOCK, BNB_MIN_8BIT_SIZE
from vram.setup import Optimizer, TrainingSetup
from vram.stacks.profile import profile_for

LR = 1e-5
BNB_MIN_PAGED_SIZE = 100_000


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023), one momentum state per parameter, per-tensor update."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                del update
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)


class _FusedUpdate(torch.optim.Optimizer):
    """An optimizer whose update is one fused kernel: it allocates its state on the first step
    (`_init_state`) and nothing else, so only the state's storage is modelled."""

    def __init__(self, params: Iterable[nn.Parameter]) -> None:
        super().__init__(params, {"lr": LR})

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.state[p] = self._init_state(p)
                self.state[p]["step"] += 1  # the fused kernel updates in place: no temporaries


class Bnb8bitAdamW(_FusedUpdate):
    """Storage of bitsandbytes' AdamW8bit / PagedAdamW / PagedAdamW8bit (see module docstring).

    `on_paged` is called with every state tensor that lives in paged (unified) memory.
    """

    def __init__(self, params: Iterable[nn.Parameter], *, bits: int, paged: bool,
                 on_paged: Callable[[torch.Tensor], None] | None = None) -> None:
        super().__init__(params)
        self.bits = bits
        self.paged = paged
        self.on_paged = on_paged
        self.qmaps: list[torch.Tensor] = []

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        buf = torch.zeros(p.shape, dtype=dtype)
        if self.paged and p.numel() >= BNB_MIN_PAGED_SIZE and self.on_paged is not None:
            self.on_paged(buf)
        return buf

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        state: dict[str, Any] = {"step": 0}
        if self.bits == 8 and p.numel() >= BNB_MIN_8BIT_SIZE:
            if not self.qmaps:
                self.qmaps = [torch.zeros(256, dtype=torch.float32) for _ in range(2)]
            state["qmap1"], state["qmap2"] = self.qmaps
            state["state1"] = self._buffer(p, torch.uint8)
            state["state2"] = self._buffer(p, torch.uint8)
            blocks = -(-p.numel() // BNB_BLOCK)
            state["absmax1"] = torch.zeros(blocks, dtype=torch.float32)
            state["absmax2"] = torch.zeros(blocks, dtype=torch.float32)
        else:
            state["state1"] = self._buffer(p, torch.float32)
            state["state2"] = self._buffer(p, torch.float32)
        return state


class FusedAdamW(_FusedUpdate):
    """Storage of `torch.optim.AdamW(fused=True)` (HF Trainer's default `adamw_torch_fused`,
    torchtune's recipes): two states like each parameter, no full-size temporaries."""

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        return {"step": 0, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}


#: Builds one optimizer over the trainable parameters; the callback sees each paged state.
OptimizerFactory = Callable[[list[nn.Parameter], Callable[[torch.Tensor], None]],
                            torch.optim.Optimizer]


def _adafactor(params: list[nn.Parameter],
               on_paged: Callable[[torch.Tensor], None]) -> torch.optim.Optimizer:
    """transformers' Adafactor as the HF Trainer builds it (imported only when traced)."""
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=LR, scale_parameter=False, relative_step=False,
                     warmup_init=False)


#: The traced optimizer of each `vram.memory.optimizer.OPTIMIZERS` row the trace can run; None: one
#: AdamW per parameter stepped inside backward (`in_backward`). AdamW is fused instead where
#: the stack fuses it (`StackProfile.fused_optimizer`). A row missing here is not traced.
TRACE_OPTIMIZERS: dict[Optimizer, OptimizerFactory | None] = {
    Optimizer.ADAMW: lambda params, _: torch.optim.AdamW(params, lr=LR, foreach=True),
    Optimizer.SGD: lambda params, _: torch.optim.SGD(params, lr=LR, momentum=0.0, foreach=True),
    Optimizer.SGD_MOMENTUM: lambda params, _: torch.optim.SGD(params, lr=LR, momentum=0.9,
                                                              foreach=True),
    Optimizer.ADAFACTOR: _adafactor,
    Optimizer.LION: lambda params, _: Lion(params, lr=LR),
    Optimizer.ADAMW_8BIT: lambda params, _: Bnb8bitAdamW(params, bits=8, paged=False),
    Optimizer.PAGED_ADAMW: lambda params, on_paged: Bnb8bitAdamW(
        params, bits=32, paged=True, on_paged=on_paged),
    Optimizer.PAGED_ADAMW_8BIT: lambda params, on_paged: Bnb8bitAdamW(
        params, bits=8, paged=True, on_paged=on_paged),
    Optimizer.ADAMW_IN_BACKWARD: None,
}


def make_optimizer(setup: TrainingSetup, params: list[nn.Parameter],
                   on_paged: Callable[[torch.Tensor], None]) -> torch.optim.Optimizer | None:
    """The optimizer of `setup` over `params`; None for adamw-in-backward (see `in_backward`)."""
    opt = setup.optimizer
    if opt not in TRACE_OPTIMIZERS:
        raise ValueError(f"optimizer: unknown {opt!r}")
    if opt is Optimizer.ADAMW and profile_for(setup).fused_optimizer:
        return FusedAdamW(params)
    factory = TRACE_OPTIMIZERS[opt]
    return None if factory is None else factory(params, on_paged)


def in_backward(params: list[nn.Parameter]) -> list[torch.optim.Optimizer]:
    """torchtune's optimizer-in-backward: step and free each gradient as soon as it is ready."""
    optimizers: list[torch.optim.Optimizer] = []
    for p in params:
        optim = torch.optim.AdamW([p], lr=LR, foreach=True)

        def hook(param: torch.Tensor, optim: torch.optim.Optimizer = optim) -> None:
            optim.step()
            optim.zero_grad(set_to_none=True)

        p.register_post_accumulate_grad_hook(hook)
        optimizers.append(optim)
    return optimizers


def state_tensors(optimizers: Iterable[torch.optim.Optimizer]) -> Iterable[torch.Tensor]:
    """Every tensor held in the optimizers' state."""
    for optim in optimizers:
        for state in optim.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield value
