"""The RL stacks' published defaults, in one table, each with the file and version it is read from.

Tests pin every row (tests/domain/test_rl.py; the TRL rows also against the installed TRL's
own config classes in tests/trace/test_rl_step.py). Sources are `file@version`, with `#Lline`
where the row was read at a line.
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
VLLM_WORKER_NEW = ("vllm-project/vllm vllm/v1/worker/gpu_worker.py@35d5cda1 "
                   "(compile_or_warm_up_model)")
VLLM_ARGS = "vllm-project/vllm vllm/engine/arg_utils.py@99d7eb5d (_set_default_args)"
TRL_COLOCATE_LLM = "huggingface/trl trl/generation/vllm_generation.py@v1.9.0#L351-L363"
VERL = "volcengine/verl {}@b178a3cd5#{}"  # v0.7.0-125
UNSLOTH = "unslothai/unsloth {}@015bdef0#{}"  # v0.1.801-beta-29
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
    RLDefault(stack="vllm", setting="CUDA graphs", value="outside the budget",
              meaning="captured after the KV cache is allocated; 'memory_profiling does not "
                      "consider CUDAGraph memory size': the engine holds budget + graphs",
              source=VLLM_WORKER_NEW),
    RLDefault(stack="vllm", setting="max_num_batched_tokens (LLM class)", value="16384",
              meaning="the profiled forward's tokens on GPUs of 70 GiB+ (not A100); 8192 on "
                      "smaller ones; max_num_seqs 1024 / 256", source=VLLM_ARGS),
    RLDefault(stack="trl-grpo", setting="colocate max_num_batched_tokens", value="4096",
              meaning="TRL's colocated LLM(...): the profiled forward's tokens; max_num_seqs = "
                      "the per-device batch", source=TRL_COLOCATE_LLM),
    RLDefault(stack="verl", setting="ref_in_actor", value="lora_rank > 0",
              meaning="with LoRA the reference is the actor with its adapters disabled "
                      "(compute_ref_log_prob -> compute_log_prob under disable_adapter); no "
                      "reference worker", source=VERL.format(
                          "verl/trainer/ppo/ray_trainer.py", "L298-L302") + "; " + VERL.format(
                          "verl/workers/fsdp_workers.py", "L1000,L1041-L1045")),
    RLDefault(stack="verl", setting="rollout.gpu_memory_utilization", value="0.5",
              meaning="the colocated engine's share (vLLM: of total memory)",
              source=VERL.format("verl/trainer/config/rollout/rollout.yaml", "L32")),
    RLDefault(stack="verl", setting="rollout.free_cache_engine", value="True",
              meaning="the engine's KV cache is freed after generation (sleep); CUDA graphs "
                      "'can not be offloaded during update policy' (L40-L43)",
              source=VERL.format("verl/trainer/config/rollout/rollout.yaml", "L47")),
    RLDefault(stack="verl", setting="fsdp param_offload", value="false",
              meaning="actor parameters stay on the GPU",
              source=VERL.format("verl/trainer/config/engine/fsdp.yaml", "L12")),
    RLDefault(stack="verl", setting="fsdp optimizer_offload", value="false",
              meaning="actor optimizer states stay on the GPU",
              source=VERL.format("verl/trainer/config/engine/fsdp.yaml", "L16")),
    RLDefault(stack="unsloth", setting="fast_inference", value="False",
              meaning="vLLM only when asked; with it, vLLM loads first and the HF model is "
                      "built from vLLM's state dict (llm.shared_weights = True, L2810-L2822): "
                      "one copy of the base weights",
              source=UNSLOTH.format("unsloth/models/loader.py", "L429")),
    RLDefault(stack="unsloth", setting="gpu_memory_utilization", value="0.5",
              meaning="vLLM's share with fast_inference",
              source=UNSLOTH.format("unsloth/models/loader.py", "L430")),
    RLDefault(stack="unsloth", setting="unsloth_vllm_standby", value="False",
              meaning="standby needs UNSLOTH_VLLM_STANDBY=1 in the environment (else an error, "
                      "L2372-L2374); its memory behaviour lives in unsloth_zoo, not read here",
              source=UNSLOTH.format("unsloth/models/llama.py", "L2343")),
)


def rl_default(stack: str, setting: str) -> RLDefault:
    """The row for one stack's setting; KeyError names what was asked."""
    for row in RL_STACKS:
        if row.stack == stack and row.setting == setting:
            return row
    raise KeyError(f"{stack}.{setting}")
