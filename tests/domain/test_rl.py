"""vram.rl: vLLM block arithmetic, cited stack defaults, models per algorithm, phases, advice."""

from __future__ import annotations

import pytest

import vram
import vram.rl as rl
from vram.rl import kv_cache
from vram.rl.policy_step import (
    chunked_loss_bytes,
    loss_backward_logits_bytes,
    loss_forward_logits_bytes,
    no_grad_logits_bytes,
)
from vram.rl.setup import Reference

GIB = 2**30
H100 = 80 * GIB


@pytest.fixture(scope="module")
def llama8b() -> vram.ModelSpec:
    return vram.load_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def qwen7b() -> vram.ModelSpec:
    return vram.load_model("qwen2.5-7b-instruct")


def lora(**kw: object) -> vram.TrainingSetup:
    return vram.TrainingSetup(method="lora", precision="bf16-true", grad_ckpt=True, **kw)


# ---- (a) the KV cache against vLLM's block arithmetic, by hand for Llama-3.1-8B ----

def test_kv_page_is_vllm_real_page_size(llama8b: vram.ModelSpec) -> None:
    # 32 layers, 8 KV heads, head_dim 128, bf16: 2 · 16 · 8 · 128 · 2 = 65,536 B per layer.
    assert kv_cache.page_bytes_per_layer(llama8b) == 65_536
    assert kv_cache.kv_bytes_per_token(llama8b) == 131_072  # 2 · 32 · 8 · 128 · 2


def test_kv_blocks_round_up_per_sequence(llama8b: vram.ModelSpec) -> None:
    assert kv_cache.blocks_per_sequence(1000) == 63  # ⌈1000/16⌉: 1008 token slots
    assert kv_cache.blocks_needed(64, 1536) == 6144  # 8 prompts × 8 generations × 96 blocks
    assert kv_cache.kv_cache_bytes(llama8b, 64, 1536) == 12 * GIB  # 6144 · 32 · 65,536
    assert kv_cache.kv_cache_bytes(llama8b, 1, 1000) == 63 * 32 * 65_536


def test_pool_blocks_is_get_num_blocks(llama8b: vram.ModelSpec) -> None:
    # available // page_size // num_layers
    assert kv_cache.pool_blocks(llama8b, 10 * GIB) == 5120
    assert kv_cache.pool_blocks(llama8b, 10 * GIB + 65_535) == 5120
    assert kv_cache.sequences_in_pool(llama8b, 10 * GIB, 1536) == 53  # 5120 // 96
    assert kv_cache.pool_blocks(llama8b, -5) == 0


# ---- stack defaults, pinned ----

@pytest.mark.parametrize(("stack", "setting", "value"), [
    ("trl-grpo", "beta", "0.0"), ("trl-grpo", "num_generations", "8"),
    ("trl-grpo", "max_completion_length", "256"), ("trl-grpo", "vllm_mode", "colocate"),
    ("trl-grpo", "vllm_gpu_memory_utilization", "0.3"), ("trl-grpo", "sleep level", "2"),
    ("trl-rloo", "beta", "0.05"), ("trl-dpo", "beta", "0.1"), ("trl-dpo", "max_length", "1024"),
    ("trl-dpo", "precompute_ref_log_probs", "False"), ("trl-ppo", "kl_coef", "0.05"),
    ("openrlhf", "vllm_gpu_memory_utilization", "0.95"),
    ("openrlhf", "colocate_all_models", "False"),
    ("vllm", "CUDA graphs", "outside the budget"),
    ("vllm", "max_num_batched_tokens (LLM class)", "16384"),
    ("trl-grpo", "colocate max_num_batched_tokens", "4096"),
    ("verl", "ref_in_actor", "lora_rank > 0"), ("verl", "rollout.gpu_memory_utilization", "0.5"),
    ("verl", "rollout.free_cache_engine", "True"), ("verl", "fsdp param_offload", "false"),
    ("verl", "fsdp optimizer_offload", "false"), ("unsloth", "fast_inference", "False"),
    ("unsloth", "gpu_memory_utilization", "0.5"), ("unsloth", "unsloth_vllm_standby", "False"),
])
def test_stack_defaults_pinned(stack: str, setting: str, value: str) -> None:
    row = rl.rl_default(stack, setting)
    assert row.value == value
    assert "@" in row.source


def test_every_default_has_a_versioned_source() -> None:
    assert all("@" in row.source for row in rl.RL_STACKS)
    # verl's and Unsloth's rows were read at a line
    assert all("#L" in row.source for row in rl.RL_STACKS if row.stack in ("verl", "unsloth"))


def test_colocated_trl_engine_profiles_4096_tokens_and_the_batch(qwen7b: vram.ModelSpec) -> None:
    from vram.rl import engine as eng

    assert eng.profile_shape(True, 64, H100) == (4096, 64)
    assert eng.profile_shape(False, 64, H100) == (16384, 1024)  # vLLM LLM class, 80 GiB
    assert eng.profile_shape(False, 64, 40 * GIB) == (8192, 256)
    setup = rl.RLSetup(policy=lora(), num_generations=8, batch=2)
    gen = {i.key: i.bytes for _, i in rl.estimate(qwen7b, setup, H100,
                                                   with_advice=False).generation.items}
    assert gen["rollout.working"] == eng.engine_working_bytes(qwen7b, 4096, 16)


# ---- models per algorithm ----

def roles(result: rl.RLEstimate) -> dict[str, rl.ModelRole]:
    return {m.role: m for m in result.models}


def test_grpo_beta_zero_has_no_reference(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(policy=lora(), beta=0.0)
    assert setup.effective_reference is Reference.NONE
    assert "reference" not in roles(rl.estimate(qwen7b, setup, H100, with_advice=False))


def test_full_grpo_with_beta_loads_a_16bit_reference(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(policy=vram.TrainingSetup(method="full", precision="bf16-true"),
                       beta=0.04, completion_len=128)
    ref = roles(rl.estimate(qwen7b, setup, H100, with_advice=False))["reference"]
    assert ref.bytes == qwen7b.n_params * 2 == 15_231_233_024


def test_lora_reference_is_the_adapter_disabled_base(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(policy=lora(), beta=0.04)
    ref = roles(rl.estimate(qwen7b, setup, H100, with_advice=False))["reference"]
    assert (ref.method, ref.bytes) == ("adapter-off", 0)


def test_dpo_trains_two_sequences_per_pair() -> None:
    dpo = rl.RLSetup(algo="dpo", policy=lora(), batch=3, rollout="none")
    grpo = rl.RLSetup(algo="grpo", policy=lora(), batch=3, num_generations=5)
    assert (dpo.sequences_per_gpu, grpo.sequences_per_gpu) == (6, 15)


def test_precomputed_reference_costs_no_device_memory(qwen7b: vram.ModelSpec) -> None:
    full = vram.TrainingSetup(method="full", precision="bf16-true", grad_ckpt=True)
    base = dict(algo="dpo", policy=full, rollout="none", beta=0.1)
    copy = rl.estimate(qwen7b, rl.RLSetup(**base), H100, with_advice=False)  # type: ignore[arg-type]
    pre = rl.estimate(qwen7b, rl.RLSetup(**base, reference="precomputed"),  # type: ignore[arg-type]
                      H100, with_advice=False)
    assert copy.training.buckets["weights"] - pre.training.buckets["weights"] == \
        qwen7b.n_params * 2


def test_ppo_has_policy_reference_reward_and_critic(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(algo="ppo", policy=lora(), num_generations=1, beta=0.05,
                       rollout="hf-generate")
    assert set(roles(rl.estimate(qwen7b, setup, H100, with_advice=False))) == {
        "policy", "reference", "reward", "critic"}


# ---- the engine and the phases ----

def test_vllm_budget_is_a_share_of_total(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(policy=lora(), gpu_memory_utilization=0.3)
    result = rl.estimate(qwen7b, setup, H100, with_advice=False)
    gen = {i.key: i.bytes for _, i in result.generation.items}
    budget = gen["rollout.weights"] + gen["rollout.kv_pool"] + gen["rollout.working"]
    assert budget == int(0.3 * H100)
    # vllm/v1/worker/gpu_worker.py@35d5cda1: graphs are captured after the KV cache, outside
    # the budget ("`memory_profiling` does not consider CUDAGraph memory size")
    assert gen["rollout.cuda_graphs"] == GIB


def test_sleep_frees_the_engine_in_training(qwen7b: vram.ModelSpec) -> None:
    awake = rl.estimate(qwen7b, rl.RLSetup(policy=lora()), H100, with_advice=False)
    slept = rl.estimate(qwen7b, rl.RLSetup(policy=lora(), sleep=1), H100, with_advice=False)
    freed = awake.training.device_peak_bytes - slept.training.device_peak_bytes
    assert freed == awake.training.buckets["rollout_weights"] + \
        awake.training.buckets["kv_cache"]
    assert slept.host_bytes - awake.host_bytes == qwen7b.n_params * 2  # level 1 parks weights
    level2 = rl.estimate(qwen7b, rl.RLSetup(policy=lora(), sleep=2), H100, with_advice=False)
    assert level2.host_bytes == awake.host_bytes
    assert awake.generation.device_peak_bytes == slept.generation.device_peak_bytes


def test_server_mode_keeps_engine_off_training_gpus(qwen7b: vram.ModelSpec) -> None:
    result = rl.estimate(qwen7b, rl.RLSetup(policy=lora(), rollout="server",
                                            gpu_memory_utilization=0.9), H100,
                         with_advice=False)
    assert result.training.buckets["rollout_weights"] == 0
    assert result.generation.gpu_group == "rollout"
    assert result.generation.buckets["weights"] == 0


def test_shared_weights_have_no_rollout_copy(qwen7b: vram.ModelSpec) -> None:
    result = rl.estimate(qwen7b, rl.RLSetup(policy=lora(), rollout="shared"), H100,
                         with_advice=False)
    assert result.generation.buckets["rollout_weights"] == 0


def test_grpo_logits_terms_follow_trls_code(qwen7b: vram.ModelSpec) -> None:
    # TRL 1.9.0 as traced (vram/trace/rl_step.py): 4 sequences, 513 rows kept, 512 log-probs.
    v = 152_064
    four = rl.RLSetup(num_generations=4, completion_len=512)
    # backward: CopySlices of the in-place temperature division, 2 × kept + 2 × rows, bf16
    assert loss_backward_logits_bytes(qwen7b, four) == (2 * 4 * 513 + 2 * 4 * 512) * v * 2
    # forward: logits + saved log-softmax + entropy's flattening copy + 3 chunks of 128 rows
    assert loss_forward_logits_bytes(qwen7b, four) == (4 * 513 + 2 * 4 * 512 + 3 * 128) * v * 2
    assert no_grad_logits_bytes(qwen7b, four) == (4 * 513 + 512) * v * 2
    eight = rl.RLSetup(num_generations=8, completion_len=512)
    assert loss_backward_logits_bytes(qwen7b, eight) == 2 * loss_backward_logits_bytes(
        qwen7b, four)
    chunked = rl.RLSetup(num_generations=8, completion_len=512, chunked_loss=True)
    assert chunked_loss_bytes(qwen7b, chunked) == 6 * 512 * v
    assert loss_backward_logits_bytes(qwen7b, chunked) == 6 * 512 * v


def test_dpo_forward_holds_policy_and_reference_logits(qwen7b: vram.ModelSpec) -> None:
    v = 152_064
    dpo = rl.RLSetup(algo="dpo", policy=lora(), prompt_len=256, completion_len=256, batch=1,
                     rollout="none", beta=0.1)  # 2 sequences of 512
    both = 2 * 2 * 512 + 2 * 511 + 2 * 511 + 3 * 128
    assert loss_forward_logits_bytes(qwen7b, dpo) == both * v * 2
    precomputed = dpo.model_copy(update={"reference": "precomputed"})
    assert loss_forward_logits_bytes(qwen7b, precomputed) == (both - 2 * 512) * v * 2


# ---- bad combinations name the field ----

@pytest.mark.parametrize(("fields", "field"), [
    ({"rollout": "server", "sleep": 1}, "sleep"),
    ({"beta": 0.0, "reference": "model"}, "reference"),
    ({"algo": "orpo", "reference": "model", "rollout": "none"}, "reference"),
    ({"policy": vram.TrainingSetup(method="full"), "rollout": "shared"}, "rollout"),
    ({"num_generations": 0}, "num_generations"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
])
def test_bad_combinations_name_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        rl.RLSetup(**fields)  # type: ignore[arg-type]


def test_more_generations_than_the_pool_holds_is_reported(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(policy=lora(), num_generations=64, batch=8, completion_len=4096,
                       gpu_memory_utilization=0.3)
    result = rl.estimate(qwen7b, setup, H100, with_advice=False)
    assert result.kv is not None and result.kv.sequences_at_once < 512
    assert any(w.startswith("num_generations:") for w in result.warnings)


def test_utilization_above_free_memory_is_reported(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(policy=vram.TrainingSetup(method="full", precision="bf16-true"),
                       gpu_memory_utilization=0.9)
    result = rl.estimate(qwen7b, setup, H100, with_advice=False)
    assert any("refuses to start" in w for w in result.warnings)


# ---- advice searches the estimate itself ----

def test_advised_generations_fit_and_one_more_does_not(qwen7b: vram.ModelSpec) -> None:
    setup = rl.RLSetup(policy=lora(), num_generations=8, batch=1, completion_len=1024,
                       sleep=2)
    result = rl.estimate(qwen7b, setup, H100)
    line = next(a for a in result.advice if a.startswith("num_generations"))
    g = int(line.split("at most ")[1].split()[0])
    fits = rl.estimate(qwen7b, setup.model_copy(update={"num_generations": g}), H100,
                       with_advice=False)
    over = rl.estimate(qwen7b, setup.model_copy(update={"num_generations": g + 1}), H100,
                       with_advice=False)
    assert fits.fits and not over.fits


# ---- (b) the published figures, approximately (benchmarks/rl_measured.txt) ----

def test_ms_swift_dpo_lora_within_15_percent(qwen7b: vram.ModelSpec) -> None:
    # rl-measured.md #2: "24GiB" in the script's header; metric unstated, lengths are a cap.
    setup = rl.RLSetup(algo="dpo", policy=lora(lora_rank=8), prompt_len=1024,
                       completion_len=1024, batch=1, rollout="none", beta=0.1)
    est = rl.estimate(qwen7b, setup, H100, with_advice=False).device_peak_bytes
    assert abs(est / (24 * GIB) - 1) < 0.15


def test_trl_logprob_forward_within_15_percent(qwen7b: vram.ModelSpec) -> None:
    # rl-measured.md #7 (TRL #3678): peak 902 MB with 44 MB before, B=2, 256 kept, V=151665,
    # in `_get_per_token_logps_and_entropies`; read as `_compute_loss` calls it (with
    # entropies): fp32 logits + the entropy's flattening copy + 3 chunks of 128 rows.
    tiny = qwen7b.model_copy(update={"vocab_size": 151_665})
    fp32 = vram.TrainingSetup(method="lora", precision="fp32")  # the tiny test model is fp32
    est = loss_forward_logits_bytes(tiny, rl.RLSetup(policy=fp32, batch=2, num_generations=1,
                                                     prompt_len=1, completion_len=256))
    assert abs(est / ((902 - 44) * 10**6) - 1) < 0.15


def test_peak_with_and_without_sleep(qwen7b: vram.ModelSpec) -> None:
    result = rl.estimate(qwen7b, rl.RLSetup(policy=lora(), completion_len=512), H100,
                         with_advice=False)
    peaks = result.peak_by_sleep
    assert peaks[0] == result.device_peak_bytes
    assert peaks[0] - peaks[2] == result.training.buckets["rollout_weights"] + \
        result.training.buckets["kv_cache"] or peaks[2] == result.generation.device_peak_bytes
    assert peaks[1] == peaks[2]  # on the GPU, levels 1 and 2 free the same; host RAM differs


def test_open_r1_grpo_config_becomes_an_rl_setup() -> None:
    from vram.rl.from_config import rl_setup_from_config

    loaded = vram.load_training_config("tests/data/configs/trl/open-r1-qwen2.5-1.5b-grpo.yaml")
    setup = rl_setup_from_config(loaded)
    # per_device_train_batch_size 16 completions / num_generations 16 = 1 prompt per GPU
    assert (setup.algo.value, setup.num_generations, setup.batch) == ("grpo", 16, 1)
    assert (setup.prompt_len, setup.completion_len) == (512, 1024)
    assert setup.rollout.value == "colocate" and setup.gpu_memory_utilization == 0.3
    assert setup.effective_reference is Reference.NONE  # beta unset: TRL's 0.0
    assert setup.sequences_per_gpu == loaded.setup.micro_batch


# ---- the policy step's bound is the RL setup's (issue 25) ----

@pytest.mark.parametrize(("algo", "gens", "largest"), [
    ("grpo", 8, 512), ("grpo", 1, 4096), ("grpo", 1024, 4), ("ppo", 3, 1365),
    ("dpo", 8, 2048), ("orpo", 1, 2048), ("kto", 8, 4096),
])
def test_the_largest_batch_is_accepted_and_one_more_is_named(algo: str, gens: int,
                                                             largest: int) -> None:
    assert rl.max_batch(algo, gens) == largest
    rollout = "none" if algo in ("dpo", "orpo", "kto") else "colocate"
    setup = rl.RLSetup(algo=algo, num_generations=gens, batch=largest, rollout=rollout)
    assert setup.sequences_per_gpu <= rl.MAX_SEQUENCES
    assert rl_estimate_setup_is_valid(setup)
    if largest < 4096:
        with pytest.raises(ValueError, match=r"batch x num_generations: .*at most 4,096"):
            rl.RLSetup(algo=algo, num_generations=gens, batch=largest + 1, rollout=rollout)


def rl_estimate_setup_is_valid(setup: rl.RLSetup) -> bool:
    from vram.rl.estimate import policy_setup

    return policy_setup(setup).micro_batch == setup.sequences_per_gpu


@pytest.mark.parametrize("memory", [0, -1, 2**50, 1.5, float("nan"), True, "80e9", None])
def test_gpu_memory_bytes_is_checked_by_name(memory: object) -> None:
    model = vram.load_model("llama-3.2-1b")
    with pytest.raises(vram.VramError, match=r"^gpu_memory_bytes: "):
        rl.estimate(model, rl.RLSetup(), memory)  # type: ignore[arg-type]
