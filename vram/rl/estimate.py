"""`vram.rl.estimate`: an RL step's generation and training phases, per GPU of each group.

Whatever trains (policy, critic) is the SFT estimate (`vram.estimate`) with the rollout's token
counts; frozen models (reference, reward) hold their weights and one forward's working memory,
without gradients. The policy step has its own moments (`policy_step.py`): the SFT step's, with
TRL's log-prob and loss code in place of the HF head, and the no-grad log-prob forwards (old
and reference) before it. Held to the trace of TRL's code in benchmarks/rl_trace_grid.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vram.model.architecture import ModelSpec
from vram.result import BucketName, Estimate, LineItem
from vram.rl import engine as eng
from vram.rl import kv_cache
from vram.rl.policy_step import StepMoment, no_grad_logits_bytes, policy_moments
from vram.rl.result import KvReport, ModelRole, PhaseEstimate, PhaseName, RLBucket, RLEstimate
from vram.rl.setup import OFFLINE, Algo, Engine, Reference, RLSetup, Rollout
from vram.setup import TrainingSetup
from vram.step.estimate import estimate as sft_estimate
from vram.units import BF16_BYTES, FP32_BYTES, both, ceil_div

Items = list[tuple[RLBucket, LineItem]]


def _item(key: str, label: str, formula: str, n_bytes: int, source: str = "") -> LineItem:
    return LineItem(key=key, label=label, formula=formula, bytes=max(int(n_bytes), 0),
                    source=source)


def policy_setup(setup: RLSetup) -> TrainingSetup:
    """The policy's SFT setup with the rollout's sequences and length."""
    fields = setup.policy.model_dump()
    fields.update(micro_batch=setup.sequences_per_gpu, seq_len=setup.seq_len)
    return TrainingSetup.model_validate(fields)


def frozen_weight_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """A frozen copy in 16-bit (sharded under ZeRO-3 like the policy)."""
    shards = setup.policy.n_gpus if setup.sharded_weights else 1
    return ceil_div(model.n_params * BF16_BYTES, shards)


def forward_working_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """A no-grad forward keeps one layer's working set: 3 × 2 B × tokens × widest."""
    stack = model.decoder
    widest = max(stack.intermediate_size * max(1, stack.experts_per_token),
                 stack.n_heads * stack.head_dim)
    return 3 * BF16_BYTES * setup.sequences_per_gpu * setup.seq_len * widest


_LOGITS_FORMULA = ("GRPO: forward N·(C+1)·V·e + saved log-softmax + entropy copy; backward "
                   "2·N·(C+1)·V·e + 2·N·C·V·e (in-place temperature division); DPO: policy + "
                   "reference logits over the whole sequence")


def no_grad_forward_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """The largest no-grad forward before the policy step: the old log-probs (TRL computes
    them whenever vLLM generates, `vllm_importance_sampling_correction`), the reference's
    (beta > 0; DPO runs its reference inside the loss), the reward model's (no logits)."""
    working = forward_working_bytes(model, setup)
    peak = 0
    online = setup.algo not in OFFLINE
    has_reference = setup.effective_reference in (Reference.MODEL, Reference.ADAPTER_OFF)
    if online and (setup.uses_engine or has_reference):
        peak = working + no_grad_logits_bytes(model, setup)
    if _has_reward_model(setup):
        peak = max(peak, working)
    return peak


def _bucket(est: Estimate, name: BucketName) -> int:
    return est.bucket(name).bytes


def _loss_item_bytes(est: Estimate) -> int:
    return sum(i.bytes for i in est.bucket(BucketName.ACTIVATIONS).items
               if i.key == "activations.loss")


def _has_reward_model(setup: RLSetup) -> bool:
    return setup.algo is Algo.PPO or setup.reward_model


@dataclass
class _Trained:
    """What the training GPUs hold for every model: the policy's SFT estimate and its largest
    moment, the frozen copies, the critic's state and activations, and each model's role."""

    pol: Estimate
    step: StepMoment
    weights: int
    gradients: int
    optimizer: int
    frozen_weights: int
    critic_state: int
    critic_acts: int
    models: list[ModelRole] = field(default_factory=list)


def _trained(model: ModelSpec, setup: RLSetup) -> _Trained:
    """The policy (an SFT estimate at the rollout's shape), the reference and reward models
    (frozen 16-bit copies, or none), and PPO's critic (trained like the policy, with a scalar
    head: no vocabulary logits)."""
    pol = sft_estimate(model, policy_setup(setup))
    step = max(policy_moments(model, setup, policy_setup(setup), pol),
               key=lambda m: m.total_bytes)
    t = _Trained(pol=pol, step=step, weights=_bucket(pol, BucketName.WEIGHTS),
                 gradients=pol.gradient_bytes_total, optimizer=_bucket(pol, BucketName.OPTIMIZER),
                 frozen_weights=0, critic_state=0, critic_acts=0)
    t.models.append(ModelRole(role="policy", method=setup.policy.method.value,
                              bytes=t.weights + t.gradients + t.optimizer,
                              note="SFT estimate: weights + gradients + optimizer"))
    reference = setup.effective_reference
    if reference is Reference.MODEL:
        w = frozen_weight_bytes(model, setup)
        t.frozen_weights += w
        t.models.append(ModelRole(role="reference", method="frozen", bytes=w,
                                  note="a frozen 16-bit copy"))
    elif reference is Reference.ADAPTER_OFF:
        t.models.append(ModelRole(role="reference", method="adapter-off", bytes=0,
                                  note="the policy's base with adapters disabled: no weights"))
    elif reference is Reference.PRECOMPUTED:
        t.models.append(ModelRole(role="reference", method="precomputed", bytes=0,
                                  note="log-probs computed before training"))
    if _has_reward_model(setup):
        w = frozen_weight_bytes(model, setup)
        t.frozen_weights += w
        t.models.append(ModelRole(role="reward", method="frozen", bytes=w,
                                  note="a frozen 16-bit sequence classifier of the policy's "
                                       "size"))
    if setup.algo is Algo.PPO:
        critic = sft_estimate(model, policy_setup(setup))
        t.critic_state = (_bucket(critic, BucketName.WEIGHTS) + critic.gradient_bytes_total
                          + _bucket(critic, BucketName.OPTIMIZER))
        t.critic_acts = _bucket(critic, BucketName.ACTIVATIONS) - _loss_item_bytes(critic)
        t.models.append(ModelRole(role="critic", method=setup.policy.method.value,
                                  bytes=t.critic_state, note="value model, trained"))
    return t


@dataclass
class _Rollout:
    """The rollout engine's share of a GPU: its items, KV report and warnings."""

    items: Items = field(default_factory=list)
    kv: KvReport | None = None
    weights: int = 0
    graphs: int = 0
    warnings: list[str] = field(default_factory=list)
    role: ModelRole | None = None


def _kv_warnings(setup: RLSetup, report: KvReport) -> list[str]:
    """The engine refuses to start, or queues sequences, when its KV pool is short."""
    if report.sequences_at_once == 0:
        return [f"gpu_memory_utilization: the KV pool ({both(report.pool_bytes, 2)}) "
                f"cannot hold one sequence of prompt_len + completion_len = {setup.seq_len} "
                "tokens; the engine refuses to start"]
    if report.sequences_at_once < report.sequences:
        return [f"num_generations: batch × num_generations = {report.sequences} sequences "
                f"need {report.blocks_needed} KV blocks ({both(report.needed_bytes, 2)}) "
                f"but the pool holds {report.pool_blocks} ({both(report.pool_bytes, 2)}): "
                f"only {report.sequences_at_once} run at once, the rest wait (slower, no "
                "OOM)"]
    return []


def _rollout(model: ModelSpec, setup: RLSetup, gpu_memory_bytes: int, resident_at_start: int,
             context_bytes: int) -> _Rollout:
    """vLLM (or SGLang) beside the trainer or on its own GPUs: its weights, its KV pool out of
    `gpu_memory_utilization`, its profiled forward and its CUDA graphs."""
    if not setup.uses_engine:
        return _Rollout()
    server = setup.rollout is Rollout.SERVER
    shared = setup.rollout is Rollout.SHARED
    r = _Rollout(weights=0 if shared else eng.engine_weight_bytes(model),
                 graphs=eng.CUDA_GRAPH_BYTES)
    counted_weights = eng.engine_weight_bytes(model)
    profile_tokens, profile_seqs = eng.profile_shape(
        setup.rollout is Rollout.COLOCATE, setup.sequences_per_gpu, gpu_memory_bytes)
    engine_working = eng.engine_working_bytes(model, profile_tokens, profile_seqs)
    free_at_start = gpu_memory_bytes - (context_bytes if server else resident_at_start)
    requested = eng.requested_bytes(setup.engine, setup.gpu_memory_utilization,
                                    gpu_memory_bytes, free_at_start)
    if setup.engine is Engine.VLLM and requested > free_at_start:
        r.warnings.append(
            f"gpu_memory_utilization: {setup.gpu_memory_utilization} asks vLLM for "
            f"{both(requested)} but only {both(free_at_start)} is free "
            "when it starts (vLLM >= 0.7 counts a share of TOTAL memory): it refuses to "
            "start")
    pool = eng.kv_pool_bytes(requested, counted_weights, engine_working)
    prompts_per_engine = setup.batch * (
        ceil_div(setup.policy.n_gpus, setup.rollout_gpus) if server else 1)
    sequences = prompts_per_engine * setup.effective_generations
    r.kv = KvReport(sequences=sequences, tokens_per_sequence=setup.seq_len,
                    blocks_needed=kv_cache.blocks_needed(sequences, setup.seq_len),
                    needed_bytes=kv_cache.kv_cache_bytes(model, sequences, setup.seq_len),
                    pool_bytes=pool, pool_blocks=kv_cache.pool_blocks(model, pool),
                    sequences_at_once=kv_cache.sequences_in_pool(model, pool, setup.seq_len))
    r.warnings += _kv_warnings(setup, r.kv)
    r.items = [
        (RLBucket.ROLLOUT_WEIGHTS, _item(
            "rollout.weights", "engine weights (16-bit)", "params × 2 B",
            r.weights, "vLLM loads the merged bf16 model")),
        (RLBucket.KV_CACHE, _item(
            "rollout.kv_pool", "engine KV pool",
            "budget − weights − profiled forward (all of it is reserved)",
            pool, "vllm/v1/worker/gpu_worker.py@35d5cda1 determine_available_memory")),
        (RLBucket.ACTIVATIONS, _item(
            "rollout.working", "engine's profiled forward",
            f"3 · 2 B · {profile_tokens} tokens · widest + sampler logits of "
            f"{profile_seqs} sequences", engine_working,
            "TRL colocate: max_num_batched_tokens=4096; else vLLM's LLM defaults")),
        (RLBucket.OVERHEAD, _item(
            "rollout.cuda_graphs", "CUDA graphs (outside the utilization budget)",
            "1 GiB, an assumption (vLLM measures it at capture)", r.graphs,
            "vllm/v1/worker/gpu_worker.py@35d5cda1 compile_or_warm_up_model")),
    ]
    r.role = (ModelRole(role="rollout", method="shared weights", bytes=pool,
                        note="Unsloth: vLLM reads the policy's weights") if shared
              else ModelRole(role="rollout", method=setup.engine.value, bytes=r.weights + pool))
    return r


def _sync_bytes(model: ModelSpec, setup: RLSetup) -> int:
    """The weight sync: the trainer hands the engine its weights once per step."""
    if not setup.uses_engine or setup.rollout is Rollout.SHARED:
        return 0
    if setup.sharded_weights and setup.policy.trains_adapters:
        return model.n_params * BF16_BYTES  # TRL gathers every ZeRO-3 shard to merge
    return model.vocab_size * model.hidden_size * BF16_BYTES  # one tensor at a time


def _state_items(t: _Trained, optimizer_label: str, overhead: LineItem) -> Items:
    """What the training GPUs keep in both phases: weights, optimizer and critic state."""
    return [
        (RLBucket.WEIGHTS, _item("policy.weights", "policy weights", "SFT estimate",
                                 t.weights)),
        (RLBucket.WEIGHTS, _item("frozen.weights", "reference + reward weights",
                                 "params × 2 B each", t.frozen_weights)),
        (RLBucket.OPTIMIZER, _item("policy.optimizer", optimizer_label, "SFT estimate",
                                   t.optimizer)),
        (RLBucket.OPTIMIZER, _item("critic.state", "critic weights + optimizer",
                                   "SFT estimate", t.critic_state)),
        (RLBucket.OVERHEAD, overhead),
    ]


def _generation_items(model: ModelSpec, setup: RLSetup, t: _Trained, r: _Rollout,
                      context_bytes: int, sync: int) -> Items:
    """The generation phase on the GPUs that generate (the trainer's, or a rollout server's)."""
    if setup.rollout is Rollout.SERVER:
        return [*r.items,
                (RLBucket.ROLLOUT_WEIGHTS, _item(
                    "rollout.sync", "weight-sync receive buffer", "largest tensor, 16-bit",
                    sync)),
                (RLBucket.OVERHEAD, _item("overhead.context", "CUDA context", "per process",
                                          context_bytes))]
    gen = _state_items(t, "optimizer states (kept)", _item(
        "overhead.context", "CUDA context", "per process", context_bytes))
    if setup.uses_engine:
        gen += r.items
        gen.append((RLBucket.ROLLOUT_WEIGHTS, _item(
            "rollout.sync", "weight-sync copy", "one tensor (ZeRO-3 + PEFT: whole model)",
            sync)))
    elif setup.generates:  # transformers' generate on the policy itself
        kv = setup.sequences_per_gpu * setup.seq_len * kv_cache.kv_bytes_per_token(model)
        gen.append((RLBucket.KV_CACHE, _item(
            "generate.kv", "generate()'s KV cache", "sequences · tokens · 2·L·kv·d·2 B",
            kv, "Pope et al. 2022, §2")))
        gen.append((RLBucket.ACTIVATIONS, _item(
            "generate.logits", "last-token logits", "4 B · sequences · vocab",
            FP32_BYTES * setup.sequences_per_gpu * model.vocab_size)))
    return gen


def _training_items(model: ModelSpec, setup: RLSetup, t: _Trained, r: _Rollout,
                    context_bytes: int, allocator_bytes: int) -> Items:
    """The training phase: the policy step's largest moment (or the no-grad log-prob forward
    before it, when larger), and what the engine keeps while the trainer steps."""
    frozen_forward = no_grad_forward_bytes(model, setup)
    step = t.step
    train = _state_items(t, "optimizer states", _item(
        "overhead.training", "CUDA context + allocator slack", "SFT estimate",
        context_bytes + allocator_bytes))
    if step.total_bytes + t.critic_acts >= frozen_forward:
        train += [
            (RLBucket.GRADIENTS, _item("policy.gradients", f"policy gradients ({step.label})",
                                       "SFT estimate at this moment", step.gradient_bytes)),
            (RLBucket.ACTIVATIONS, _item(
                "policy.activations", f"policy activations ({step.label}), less the logits",
                "SFT estimate at this moment less its head", step.activation_bytes
                - step.logits_bytes)),
            (RLBucket.ACTIVATIONS, _item("policy.logits", "RL log-prob and loss logits",
                                         _LOGITS_FORMULA, step.logits_bytes,
                                         "TRL 1.9.0 traced: vram/trace/rl_step.py")),
            (RLBucket.ACTIVATIONS, _item("critic.activations", "critic activations",
                                         "SFT estimate less its loss term", t.critic_acts)),
        ]
    else:
        train.append((RLBucket.ACTIVATIONS, _item(
            "frozen.forward", "old / reference / reward log-prob forward (no grad)",
            "one layer's working set + logits + one row's log-softmax", frozen_forward,
            "TRL 1.9.0 traced: vram/trace/rl_step.py")))
    if setup.uses_engine and setup.rollout is not Rollout.SERVER:
        if setup.sleep == 0:
            train += [(b, i) for b, i in r.items if i.key != "rollout.working"]
        else:
            train.append((RLBucket.OVERHEAD, _item(
                "rollout.cuda_graphs", "CUDA graphs (sleep keeps them)",
                "1 GiB, an assumption (vLLM measures it at capture)", r.graphs)))
    return train


def estimate(model: ModelSpec, setup: RLSetup, gpu_memory_bytes: int) -> RLEstimate:
    """Per-GPU memory of one RL step of `model` under `setup` on GPUs of `gpu_memory_bytes`."""
    t = _trained(model, setup)
    overhead = t.pol.bucket(BucketName.OVERHEAD).items
    context_bytes = sum(i.bytes for i in overhead if i.key == "overhead.context")
    allocator_bytes = sum(i.bytes for i in overhead if i.key != "overhead.context")
    r = _rollout(model, setup, gpu_memory_bytes,
                 t.weights + t.frozen_weights + context_bytes, context_bytes)
    models = [*t.models, *([r.role] if r.role else [])]
    host = t.pol.host_bytes
    if setup.uses_engine and setup.rollout is not Rollout.SERVER and setup.sleep == 1:
        host += r.weights  # sleep level 1 keeps the engine's weights in host memory
    gen_group = "rollout" if setup.rollout is Rollout.SERVER else "training"
    return RLEstimate(
        model_name=model.name, setup=setup, gpu_memory_bytes=gpu_memory_bytes,
        generation=PhaseEstimate(name=PhaseName.GENERATION, gpu_group=gen_group, items=tuple(
            _generation_items(model, setup, t, r, context_bytes, _sync_bytes(model, setup)))),
        training=PhaseEstimate(name=PhaseName.TRAINING, gpu_group="training", items=tuple(
            _training_items(model, setup, t, r, context_bytes, allocator_bytes))),
        host_bytes=host, models=tuple(models), kv=r.kv, warnings=tuple(r.warnings))


__all__ = ["estimate", "no_grad_forward_bytes", "policy_setup"]
