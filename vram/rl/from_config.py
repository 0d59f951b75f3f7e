"""An `RLSetup` from a TRL GRPO/DPO config the readers loaded (`vram.load_training_config`).

The TRL reader records the RL settings it does not map to a `TrainingSetup` (num_generations,
use_vllm, vllm_mode, vllm_gpu_memory_utilization, beta, precompute_ref_log_probs); this module
turns them, with TRL's defaults where the file is silent, into the RL estimate's setup.
TRL's `per_device_train_batch_size` counts completions, so prompts per GPU =
per_device_train_batch_size // num_generations (trl/trainer/grpo_config.py@v1.9.0).
"""

from __future__ import annotations

from vram.errors import VramError
from vram.io.readers import LoadedTrainingConfig
from vram.rl.setup import Algo, Reference, RLSetup, Rollout
from vram.rl.stacks import rl_default

#: The server's own default when `vllm_mode` is server (`trl vllm-serve`): vLLM's 0.9
#: (trl/generation/vllm_generation.py@v1.9.0 `gpu_memory_utilization` default).
SERVER_UTILIZATION = 0.9
#: A prompt length assumed when the file gives only a total length.
DEFAULT_PROMPT_LEN = 512


def _recorded(loaded: LoadedTrainingConfig) -> dict[str, str]:
    return {row.key: row.value for row in loaded.report.mapped}


def _truthy(text: str | None) -> bool:
    return (text or "").strip().lower() in ("true", "1", "yes")


def rl_setup_from_config(loaded: LoadedTrainingConfig) -> RLSetup:
    """The RL setup of a TRL GRPO or DPO config; VramError names what is missing."""
    rec = _recorded(loaded)
    trainer = rec.get("(trainer)")
    if trainer not in ("grpo", "dpo"):
        raise VramError("config: not a TRL GRPO or DPO config (no GRPO/DPO keys found)")
    policy = loaded.setup
    total = policy.seq_len
    lengths = rec.get("max_prompt_length + max_completion_length", "")
    if "+" in lengths:
        prompt, completion = (int(x) for x in lengths.split("+", 1))
    else:
        prompt = min(DEFAULT_PROMPT_LEN, max(total // 2, 1))
        completion = max(total - prompt, 1)
    try:
        if trainer == "dpo":
            beta = float(rec.get("beta", rl_default("trl-dpo", "beta").value))
            reference = (Reference.PRECOMPUTED if _truthy(rec.get("precompute_ref_log_probs"))
                         else Reference.AUTO)
            return RLSetup(algo=Algo.DPO, policy=policy, prompt_len=prompt,
                           completion_len=completion, batch=policy.micro_batch, beta=beta,
                           reference=reference, rollout=Rollout.NONE)
        gens = int(rec.get("num_generations", rl_default("trl-grpo", "num_generations").value))
        beta = float(rec.get("beta", rl_default("trl-grpo", "beta").value))
        if _truthy(rec.get("use_vllm")):
            mode = rec.get("vllm_mode", rl_default("trl-grpo", "vllm_mode").value)
            rollout = Rollout.SERVER if mode.strip().lower() == "server" else Rollout.COLOCATE
            default_util = (SERVER_UTILIZATION if rollout is Rollout.SERVER else
                            float(rl_default("trl-grpo", "vllm_gpu_memory_utilization").value))
            util = float(rec.get("vllm_gpu_memory_utilization", default_util))
        else:
            rollout, util = Rollout.HF_GENERATE, 0.3
        return RLSetup(algo=Algo.GRPO, policy=policy, num_generations=gens, prompt_len=prompt,
                       completion_len=completion, batch=max(policy.micro_batch // gens, 1),
                       beta=beta, rollout=rollout, gpu_memory_utilization=util)
    except ValueError as exc:
        raise VramError(f"config: {str(exc).splitlines()[0]}") from None
