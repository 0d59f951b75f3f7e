"""The RL stacks' published defaults, in one table, each with the file and version it is read from.

Tests pin every row (tests/domain/test_rl.py). Where a row could not be read at a line in this
session, its `source` says so rather than guessing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RLDefault(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    stack: str
    setting: str
    value: str
    meaning: str
    source: str


TRL_GRPO = "huggingface/trl trl/trainer/grpo_config.py@v1.9.0"
TRL_DPO = "huggingface/trl trl/trainer/dpo_config.py@v1.9.0"
TRL_RLOO = "huggingface/trl trl/trainer/rloo_config.py@v1.9.0"
TRL_PPO = "huggingface/trl trl/experimental/ppo/ppo_config.py@v1.9.0"
TRL_VLLM = "huggingface/trl trl/generation/vllm_generation.py@v1.9.0"
OPENRLHF = "OpenRLHF/OpenRLHF openrlhf/cli/train_ppo_ray.py@021d1b09"
VLLM_WORKER = ("vllm-project/vllm vllm/v1/worker/gpu_worker.py@0012cf69 "
               "(determine_available_memory, sleep)")
SGLANG = ("sgl-project/sglang python/sglang/srt/model_executor/"
          "model_runner_kv_cache_mixin.py@226149ac (profile_max_num_token)")

RL_STACKS: tuple[RLDefault, ...] = (
    RLDefault(stack="trl-grpo", setting="beta", value="0.0",
              meaning="no reference model is loaded unless beta > 0", source=TRL_GRPO),
    RLDefault(stack="trl-grpo", setting="num_generations", value="8",
              meaning="completions per prompt", source=TRL_GRPO),
    RLDefault(stack="trl-grpo", setting="max_completion_length", value="256",
              meaning="completion tokens", source=TRL_GRPO),
    RLDefault(stack="trl-grpo", setting="use_vllm", value="False",
              meaning="generation with transformers' generate unless set", source=TRL_GRPO),
    RLDefault(stack="trl-grpo", setting="vllm_mode", value="colocate",
              meaning="vLLM in the training processes", source=TRL_GRPO),
    RLDefault(stack="trl-grpo", setting="vllm_gpu_memory_utilization", value="0.3",
              meaning="vLLM's share of total GPU memory in colocate mode", source=TRL_GRPO),
    RLDefault(stack="trl-grpo", setting="vllm_enable_sleep_mode", value="False",
              meaning="engine memory kept during training", source=TRL_GRPO),
    RLDefault(stack="trl-grpo", setting="sleep level", value="2",
              meaning="with sleep mode on, TRL calls llm.sleep(level=2): weights and KV "
                      "dropped, weights reloaded from the trainer", source=TRL_VLLM),
    RLDefault(stack="trl-grpo", setting="loss_type", value="dapo",
              meaning="token-level normalisation", source=TRL_GRPO),
    RLDefault(stack="trl-rloo", setting="beta", value="0.05",
              meaning="RLOO keeps a reference by default", source=TRL_RLOO),
    RLDefault(stack="trl-rloo", setting="num_generations", value="2",
              meaning="completions per prompt", source=TRL_RLOO),
    RLDefault(stack="trl-dpo", setting="beta", value="0.1",
              meaning="reference always used (frozen copy, or adapters off under PEFT)",
              source=TRL_DPO),
    RLDefault(stack="trl-dpo", setting="max_length", value="1024",
              meaning="prompt + completion tokens per sequence", source=TRL_DPO),
    RLDefault(stack="trl-dpo", setting="precompute_ref_log_probs", value="False",
              meaning="reference forwarded every step unless precomputed", source=TRL_DPO),
    RLDefault(stack="trl-ppo", setting="kl_coef", value="0.05",
              meaning="PPO keeps policy, reference, reward and value models", source=TRL_PPO),
    RLDefault(stack="trl-ppo", setting="response_length", value="53",
              meaning="completion tokens", source=TRL_PPO),
    RLDefault(stack="openrlhf", setting="vllm_gpu_memory_utilization", value="0.95",
              meaning="vLLM's share when the engines have their own GPUs", source=OPENRLHF),
    RLDefault(stack="openrlhf", setting="colocate_all_models", value="False",
              meaning="engines on their own GPUs unless colocated", source=OPENRLHF),
    RLDefault(stack="openrlhf", setting="vllm_enable_sleep", value="False",
              meaning="forced off without --colocate_all_models", source=OPENRLHF),
    RLDefault(stack="openrlhf", setting="n_samples_per_prompt", value="1",
              meaning="completions per prompt", source=OPENRLHF),
    RLDefault(stack="openrlhf", setting="zero_stage", value="2",
              meaning="DeepSpeed ZeRO stage of the trained models", source=OPENRLHF),
    RLDefault(stack="vllm", setting="gpu_memory_utilization", value="share of total",
              meaning="KV memory = total_memory × gpu_memory_utilization − profiled peak "
                      "(weights + forward + non-torch); newer init_device also refuses to start "
                      "when free memory is less than total × utilization", source=VLLM_WORKER),
    RLDefault(stack="vllm", setting="sleep level 1", value="weights to host, KV dropped",
              meaning="CuMemAllocator.sleep(1, offload_tags=('weights',)); CUDA graphs stay",
              source=VLLM_WORKER),
    RLDefault(stack="vllm", setting="sleep level 2", value="weights and KV dropped",
              meaning="CuMemAllocator.sleep(2, offload_tags=()); buffers saved to CPU",
              source=VLLM_WORKER),
    RLDefault(stack="sglang", setting="mem_fraction_static", value="share of free at start",
              meaning="KV pool = free after load − free-before-load × (1 − fraction)",
              source=SGLANG),
    RLDefault(stack="verl", setting="ActorRolloutRef (LoRA)", value="reference = base",
              meaning="the fused worker's reference is the adapter-disabled actor; not read at "
                      "a line in this session", source="volcengine/verl docs@b178a3cd5 "
                                                       "(per validation/rl-measured.md)"),
    RLDefault(stack="unsloth", setting="fast_inference", value="shared weights",
              meaning="vLLM reads the LoRA policy's base weights (no second copy); "
                      "UNSLOTH_VLLM_STANDBY frees the KV cache in training; not read at a line "
                      "in this session", source="unsloth.ai/blog/grpo (Feb 2025)"),
)


def rl_default(stack: str, setting: str) -> RLDefault:
    """The row for one stack's setting; KeyError names what was asked."""
    for row in RL_STACKS:
        if row.stack == stack and row.setting == setting:
            return row
    raise KeyError(f"{stack}.{setting}")
