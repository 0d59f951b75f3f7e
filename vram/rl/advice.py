"""Advice from the estimate itself: the largest shapes that fit, the utilization to set, what to
move, and the host RAM sleep mode needs. Each search runs `vram.rl.estimate` (monotone in the
searched knob), never a separate rule of thumb."""

from __future__ import annotations

from collections.abc import Callable

from vram.model.architecture import ModelSpec
from vram.rl import engine as eng
from vram.rl.estimate import estimate as rl_estimate
from vram.rl.result import RLEstimate
from vram.rl.setup import OFFLINE, Reference, RLSetup, Rollout
from vram.units import both


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n in [low, high] with fits(n), assuming fits is monotone; 0 if none."""
    if not fits(low):
        return 0
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _fits(model: ModelSpec, setup: RLSetup, memory: int, **update: object) -> bool:
    fields = setup.model_dump()
    fields.update(update)
    fields["policy"] = setup.policy
    try:
        candidate = RLSetup.model_validate(fields)
        result = rl_estimate(model, candidate, memory)
    except ValueError:
        return False
    return result.fits and not any(w.startswith("gpu_memory_utilization") for w in
                                   result.warnings)


def advise(model: ModelSpec, result: RLEstimate) -> RLEstimate:
    """`result` with its `advice` filled in."""
    setup, memory = result.setup, result.gpu_memory_bytes
    advice: list[str] = []
    if setup.algo not in OFFLINE:
        g = _largest(lambda n: _fits(model, setup, memory, num_generations=n), 1, 1024)
        advice.append(f"num_generations: at most {g} fit at batch {setup.batch}" if g else
                      "num_generations: even 1 does not fit; see the other advice")
    c = _largest(lambda n: _fits(model, setup, memory, completion_len=n), 1, 131072)
    advice.append(f"completion_len: at most {c} tokens fit" if c else
                  "completion_len: even 1 token does not fit")
    b = _largest(lambda n: _fits(model, setup, memory, batch=n), 1, 1024)
    advice.append(f"batch: at most {b} prompts per GPU fit" if b else
                  "batch: even 1 does not fit")
    if result.kv is not None:
        kv = result.kv
        # CUDA graphs are outside the budget: the share covers weights, forward and KV
        working = sum(i.bytes for _, i in result.generation.items if i.key == "rollout.working")
        overhead = eng.engine_weight_bytes(model) + working
        needed = (overhead + kv.needed_bytes) / memory
        suggested = min(round(needed + 0.005, 2), 0.95)
        current = setup.gpu_memory_utilization
        if current + 1e-9 < needed:
            advice.append(f"gpu_memory_utilization: {current} leaves too small a KV pool for "
                          f"{kv.sequences} sequences; set {suggested:.2f}")
        elif current > needed + 0.05:
            waste = (current - needed) * memory
            advice.append(f"gpu_memory_utilization: {current} reserves "
                          f"{both(round(waste))} of KV cache the rollout never uses; "
                          f"{suggested:.2f} is enough")
    if not result.fits:
        if setup.effective_reference is Reference.MODEL and setup.policy.trains_adapters:
            advice.append("reference: use the adapter-disabled base (no second copy)")
        if setup.effective_reference is Reference.MODEL and setup.algo in OFFLINE:
            advice.append("reference: precompute the reference log-probs "
                          "(TRL precompute_ref_log_probs=True) to drop the reference model")
        if setup.rollout in (Rollout.COLOCATE, Rollout.SHARED) and setup.sleep == 0 \
                and setup.uses_engine:
            freed = result.training.buckets["rollout_weights"] + \
                result.training.buckets["kv_cache"]
            advice.append(f"sleep: sleep mode frees {both(freed)} in training")
        if setup.rollout is Rollout.COLOCATE:
            advice.append("rollout: a vLLM server on its own GPUs takes the engine off the "
                          "training GPUs")
    if setup.sleep == 1 and setup.uses_engine:
        advice.append(f"host RAM: sleep level 1 parks "
                      f"{both(eng.engine_weight_bytes(model))} of weights in host RAM "
                      "(level 2 needs none)")
    return result.model_copy(update={"advice": tuple(advice)})
