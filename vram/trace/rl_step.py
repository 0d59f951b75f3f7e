"""The training phase of an RL step on fake tensors, every live byte counted, with TRL's own code.

What runs, per step (two steps, so the optimizer state made in the first is alive in the second),
is what TRL 1.9.0 runs on one GPU for one micro-batch of `RLSetup.sequences_per_gpu` sequences:

* GRPO / RLOO (`trl.GRPOTrainer`): under `no_grad`, the policy's log-probs of the completions
  ("old" log-probs; TRL always computes them when generating with vLLM, for its importance
  sampling correction) and, when `beta > 0`, the reference's (a frozen copy, or the policy with
  its adapters disabled under PEFT: TRL's `use_adapter(model, None)`), each through
  `GRPOTrainer._get_per_token_logps_and_entropies`; then the loss,
  `GRPOTrainer._compute_loss` itself (forward over prompt + completion with
  `logits_to_keep = C + 1`, `selective_log_softmax`, `entropy_from_logits`, the clipped-ratio
  loss with the k3 KL term), its backward, and the optimizer step.
* DPO (`trl.DPOTrainer`): `DPOTrainer._compute_loss` itself: the policy's forward over the
  chosen and rejected sequences, the reference's forward inside it under `no_grad`, the
  sigmoid loss and TRL's metrics (which copy the chosen logits); backward; the optimizer step.

The trainers' methods are called unbound on a stand-in object that carries the config's own
defaults (`GRPOConfig` / `DPOConfig` dataclass fields) and an accelerator that is one process.
TRL's metric logging calls `.item()` and indexes with boolean masks, which fake tensors cannot
answer: masks and token ids stay real tensors (`_RealMasks` runs ops on real inputs for real),
a boolean index becomes the integer positions it selects, and `.item()` of a fake tensor reads
0 (a logged number, never a size). The trace needs the `trace` extra, TRL included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vram.rl.setup import OFFLINE, Reference, RLSetup
from vram.setup import Method, Precision, TrainingSetup
from vram.trace.attention import cuda_attention
from vram.trace.build import build, with_depth
from vram.trace.cuda_autocast import cuda_autocast
from vram.trace.dropout import cuda_dropout
from vram.trace.engine import HostScalarTracker, optimizer_step, swappable
from vram.trace.moe import cuda_grouped_mm
from vram.trace.optim import make_optimizer, state_tensors

OLD_LOGPS = "old log-probs (no grad)"
REF_LOGPS = "reference log-probs (no grad)"
LOSS = "forward + loss"
BACKWARD = "backward"
OPTIMIZER = "optimizer step"


@dataclass(frozen=True)
class RLTrace:
    """The training phase's allocated peak and what was alive at it."""

    allocated_peak_bytes: int
    #: The phase of the step that holds the peak (one of the constants above).
    phase: str
    #: weights / gradients / optimizer / activations at the peak.
    buckets: dict[str, int]
    #: Each phase's own peak.
    phase_peaks: dict[str, int]
    params_total: int
    params_trainable: int
    #: The largest storages alive at the peak: (what, bytes, bucket).
    top: tuple[tuple[str, int, str], ...] = ()


# -- fake tensors meet TRL's metric code ---------------------------------------------------------

def _is_fake(t: object) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _bool_to_positions(index: Any) -> Any:
    """A boolean mask as the integer positions it selects (what `x[mask]` gathers): a real
    mask's own; a mask computed from fake values (TRL's metrics only: `nanmin` over one value
    per sequence) is taken to select everything, the most it can."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if not (isinstance(index, torch.Tensor) and index.dtype == torch.bool):
        return [index]
    with unset_fake_temporarily():
        real = torch.ones(index.shape, dtype=torch.bool) if _is_fake(index) else index
        return list(real.nonzero(as_tuple=True))


class _RealMasks(TorchDispatchMode):
    """Ops whose tensor inputs are all real run for real (masks, ids: small), so a boolean
    mask built from them has known values; a real boolean index is turned into positions
    before the fake mode sees it; `.item()` of a fake tensor reads 0."""

    _INDEX_OPS = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                  torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default)

    def __torch_dispatch__(self, func: Any, types_: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and _is_fake(args[0]):
            return False if args[0].dtype == torch.bool else 0
        if func in self._INDEX_OPS:
            source, indices, *rest = args
            positions: list[Any] = []
            for index in indices:
                positions.extend(_bool_to_positions(index))
            return func(source, positions, *rest, **kwargs)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if tensors and not any(_is_fake(t) for t in tensors):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


# -- TRL's trainers, unbound ----------------------------------------------------------------------

def _config_defaults(config_class: type) -> types.SimpleNamespace:
    """The config dataclass's own defaults, without building TrainingArguments."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    return types.SimpleNamespace(**values)


class _OneProcess:
    """`accelerate.Accelerator` for one process: gathers and reductions are the identity."""

    device = torch.device("cpu")
    num_processes = 1
    sync_gradients = True
    is_main_process = True

    @staticmethod
    def gather(t: Any) -> Any:
        return t

    gather_for_metrics = gather

    @staticmethod
    def reduce(t: Any, reduction: str = "sum") -> Any:
        return t

    @staticmethod
    def unwrap_model(model: Any) -> Any:
        return model


class _Trainer:
    """The attributes TRL's trainers read in their loss, from the config's defaults."""

    def __init__(self, args: types.SimpleNamespace, **own: Any) -> None:
        self.args = args
        self.accelerator = _OneProcess()
        self._metrics: defaultdict[str, defaultdict[str, list[Any]]] = defaultdict(
            lambda: defaultdict(list))
        self.current_gradient_accumulation_steps = 1
        self.aux_loss_enabled = False
        self.__dict__.update(own)

    def __getattr__(self, name: str) -> Any:  # TRL copies most config fields onto the trainer
        return getattr(self.__dict__["args"], name)


def _grpo_trainer(setup: RLSetup, model: nn.Module, ref_model: nn.Module | None) -> Any:
    import inspect

    from trl import GRPOConfig, GRPOTrainer

    args = _config_defaults(GRPOConfig)
    args.beta = setup.beta
    args.num_generations = setup.effective_generations
    args.per_device_train_batch_size = setup.sequences_per_gpu
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    trainer = _Trainer(
        args, model=model, ref_model=ref_model, beta=setup.beta, use_vllm=setup.uses_engine,
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy,
        model_kwarg_keys=inspect.signature(base.forward).parameters.keys())
    for name in ("_compute_loss", "_get_per_token_logps_and_entropies"):
        setattr(trainer, name, types.MethodType(getattr(GRPOTrainer, name), trainer))
    return trainer


def _dpo_trainer(setup: RLSetup, model: nn.Module, ref_model: nn.Module | None) -> Any:
    from trl import DPOConfig, DPOTrainer

    args = _config_defaults(DPOConfig)
    loss_types = args.loss_type if isinstance(args.loss_type, list) else [args.loss_type]
    trainer = _Trainer(
        args, model=model, ref_model=ref_model, beta=args.beta,
        precompute_ref_logps=setup.effective_reference is Reference.PRECOMPUTED,
        loss_types=loss_types, loss_weights=args.loss_weights or [1.0] * len(loss_types),
        _total_train_tokens=0)
    trainer._compute_loss = types.MethodType(  # type: ignore[attr-defined]
        DPOTrainer._compute_loss, trainer)
    return trainer


# -- the step -------------------------------------------------------------------------------------

def _reference_model(config: dict[str, Any], setup: RLSetup) -> nn.Module | None:
    """A frozen 16-bit copy when the reference is a model of its own."""
    if setup.effective_reference is not Reference.MODEL:
        return None
    frozen = TrainingSetup(method=Method.FULL, precision=Precision.BF16_TRUE,
                           attention=setup.policy.attention)
    ref = build(config, frozen).model
    ref.requires_grad_(False)
    ref.eval()
    return ref


def _grpo_inputs(setup: RLSetup, vocab: int) -> dict[str, torch.Tensor]:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _grpo_inputs_real(setup, vocab)


def _grpo_inputs_real(setup: RLSetup, vocab: int) -> dict[str, torch.Tensor]:
    n, p, c = setup.sequences_per_gpu, setup.prompt_len, setup.completion_len
    return {
        "prompt_ids": torch.randint(0, vocab, (n, p)),
        "prompt_mask": torch.ones(n, p, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (n, c)),
        "completion_mask": torch.ones(n, c, dtype=torch.long),
        "advantages": torch.zeros(n),
        "num_items_in_batch": torch.tensor(float(n * c)),
    }


def _dpo_inputs(setup: RLSetup, vocab: int) -> dict[str, torch.Tensor]:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _dpo_inputs_real(setup, vocab)


def _dpo_inputs_real(setup: RLSetup, vocab: int) -> dict[str, torch.Tensor]:
    n, p, c = setup.sequences_per_gpu, setup.prompt_len, setup.completion_len
    completion = torch.cat([torch.zeros(n, p, dtype=torch.long),
                            torch.ones(n, c, dtype=torch.long)], dim=1)
    return {
        "input_ids": torch.randint(0, vocab, (n, p + c)),
        "attention_mask": torch.ones(n, p + c, dtype=torch.long),
        "completion_mask": completion,
    }


@contextlib.contextmanager
def _maybe_autocast(dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None:
        yield
    else:
        with torch.autocast("cpu", dtype=dtype):
            yield


def _grpo_no_grad_forwards(trainer: Any, setup: RLSetup, model: nn.Module,
                           ref_model: nn.Module | None, inputs: dict[str, torch.Tensor],
                           tracker: HostScalarTracker) -> None:
    """`_generate_and_score_completions`' no-grad forwards: old and reference log-probs."""
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import use_adapter

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep, batch = setup.completion_len, setup.sequences_per_gpu
    logps = trainer._get_per_token_logps_and_entropies
    with torch.no_grad(), disable_gradient_checkpointing(
            model, trainer.args.gradient_checkpointing_kwargs):
        if trainer.use_vllm and trainer.args.vllm_importance_sampling_correction:
            tracker.set_phase(OLD_LOGPS)
            old, _, _ = logps(model, ids, mask, keep, batch)
            inputs["old_per_token_logps"] = old
            inputs["importance_sampling_ratio"] = torch.exp(old - old)
        if setup.beta > 0:
            tracker.set_phase(REF_LOGPS)
            if ref_model is not None:
                ref, _, _ = logps(ref_model, ids, mask, keep, batch)
            else:
                with use_adapter(model, adapter_name=None):
                    ref, _, _ = logps(model, ids, mask, keep, batch)
            inputs["ref_per_token_logps"] = ref


def trace_rl_training(config: dict[str, Any], setup: RLSetup, *,
                      n_layers: int | None = None) -> RLTrace:
    """Trace the training phase of `setup` on the model of `config` (at its own depth, or
    `n_layers` blocks): two steps, the peak over both."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vram.rl.estimate import policy_setup

    cfg = with_depth(config, n_layers) if n_layers is not None else config
    policy = policy_setup(setup)
    offline = setup.algo in OFFLINE
    tracker = HostScalarTracker()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, swappable(mode):
        built = build(cfg, policy)
        model = built.model
        ref_model = _reference_model(cfg, setup)
        params = list(model.parameters())
        train = [p for p in params if p.requires_grad]
        optimizer = make_optimizer(policy, train, tracker.exclude)
        weight_keys: dict[int, str] = {}
        frozen = list(ref_model.parameters()) if ref_model is not None else []
        for t in [*params, *model.buffers(), *frozen]:
            tracker.register(t, "param")
            weight_keys[tracker.storage_key(t)] = "weights"

        def classify() -> dict[int, str]:
            classes = dict(weight_keys)
            for t in state_tensors([optimizer] if optimizer is not None else []):
                classes[tracker.storage_key(t)] = "optimizer"
            for p in train:
                if p.grad is not None:
                    classes[tracker.storage_key(p.grad)] = "gradients"
            return classes

        tracker.classifier = classify
        vocab = max(built.vocab, 2)
        trainer = (_dpo_trainer if offline else _grpo_trainer)(setup, model, ref_model)
        make_inputs = _dpo_inputs if offline else _grpo_inputs
        model.train()
        steps = [make_inputs(setup, vocab) for _ in range(2)]  # real: ids and masks
        with (_RealMasks(), tracker, cuda_attention(policy.attention.value),
              cuda_dropout(), cuda_autocast(), cuda_grouped_mm()):
            tracker.recording = True
            for inputs in steps:
                with _maybe_autocast(built.autocast):
                    if offline:
                        tracker.set_phase(LOSS)
                        loss = trainer._compute_loss(model, inputs, False)
                    else:
                        _grpo_no_grad_forwards(trainer, setup, model, ref_model, inputs,
                                               tracker)
                        tracker.set_phase(LOSS)
                        loss = trainer._compute_loss(model, inputs)
                tracker.set_phase(BACKWARD)
                with tracker.watching_backward(loss):
                    loss.backward()
                del loss
                inputs.clear()
                optimizer_step(tracker, optimizer)
            tracker.recording = False
        params_total = sum(p.numel() for p in [*params, *frozen])
        params_trainable = sum(p.numel() for p in train)
    phase_peaks: dict[str, int] = {}
    for key, peak in tracker.peaks.items():
        phase_peaks[key[0]] = max(phase_peaks.get(key[0], 0), peak.live)
    best = max(tracker.peaks.values(), key=lambda p: p.live)
    return RLTrace(allocated_peak_bytes=best.live, phase=best.phase, buckets=dict(best.buckets),
                   phase_peaks=phase_peaks, params_total=params_total,
                   params_trainable=params_trainable, top=tuple(best.top))


__all__ = ["RLTrace", "trace_rl_training"]
