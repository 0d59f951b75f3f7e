"""The published RL figures (../shared/validation/rl-measured.md) beside `vram.rl`'s estimate.

Approximate by nature: the sources are header comments of example scripts, their metric is not
stated, and `max_length` is a cap rather than the data's length. Writes benchmarks/rl_measured.txt.
    PYTHONPATH=. python benchmarks/rl_measured.py > benchmarks/rl_measured.txt
"""

from __future__ import annotations

import vram
import vram.rl as rl
from vram.rl.policy_step import loss_forward_logits_bytes

GIB = 2**30
H100 = 80 * GIB

ROWS = [
    ("#2 ms-swift dpo/lora.sh Qwen2.5-7B-Instruct LoRA r8, max_length 2048, bs 1, 1 GPU",
     24.0, "comparable: header comment, metric unstated (probably reserved)",
     rl.RLSetup(algo="dpo", policy=vram.TrainingSetup(method="lora", lora_rank=8,
                                                      precision="bf16-true", grad_ckpt=True),
                prompt_len=1024, completion_len=1024, batch=1, rollout="none", beta=0.1)),
    ("#6 ms-swift grpo transformers.sh Qwen2.5-7B LoRA r8, G 4, 1024+1024, 1 GPU",
     80.0, "upper bound only ('GPU memory: 80GiB' = the card)",
     rl.RLSetup(algo="grpo", policy=vram.TrainingSetup(method="lora", lora_rank=8,
                                                       precision="bf16-true", grad_ckpt=True),
                prompt_len=1024, completion_len=1024, batch=1, num_generations=4,
                rollout="hf-generate")),
    ("#1 ms-swift dpo/full.sh Qwen2.5-7B-Instruct full, ZeRO-3 x4, max_length 8192, bs 4",
     57.0, "NOT comparable: max_length 8192 is a cap; the emoji pairs are far shorter",
     rl.RLSetup(algo="dpo", policy=vram.TrainingSetup(method="full", grad_ckpt=True, n_gpus=4,
                                                      sharding="zero3"),
                prompt_len=4096, completion_len=4096, batch=4, rollout="none", beta=0.1)),
]


#: PPO (rl-measured.md #3, #4): Llama-3.1-8B-Instruct policy, Skywork-Reward-Llama-3.1-8B
#: reward (the policy's architecture), TRL's PPOTrainer through ms-swift, HF generate,
#: max_length 2048 with response_length 512 (prompt 1536 at most).
PPO_ROWS = [
    ("#3 ms-swift ppo/full.sh Llama-3.1-8B-Instruct full, ZeRO-3 x8, 1536+512, bs 1",
     65.0, "approximate: header comment, metric unstated; TRL's PPO path is not traced",
     rl.RLSetup(algo="ppo", policy=vram.TrainingSetup(method="full", grad_ckpt=True, n_gpus=8,
                                                      sharding="zero3"),
                prompt_len=1536, completion_len=512, batch=1, num_generations=1, beta=0.05,
                rollout="hf-generate")),
    ("#4 ms-swift ppo/lora.sh Llama-3.1-8B-Instruct LoRA r8, ZeRO-2 x4, 1536+512, bs 1",
     50.0, "approximate: header comment, metric unstated; TRL's PPO path is not traced",
     rl.RLSetup(algo="ppo", policy=vram.TrainingSetup(method="lora", lora_rank=8, grad_ckpt=True,
                                                      n_gpus=4, sharding="zero2"),
                prompt_len=1536, completion_len=512, batch=1, num_generations=1, beta=0.05,
                rollout="hf-generate")),
]


def main() -> None:
    model = vram.load_model("qwen2.5-7b-instruct")
    print("case | measured GiB | estimate GiB | ratio | status")
    llama = vram.load_model("llama-3.1-8b")
    for rows, on in ((ROWS, model), (PPO_ROWS, llama)):
        for name, measured, status, setup in rows:
            est = rl.estimate(on, setup, H100, with_advice=False).device_peak_bytes / GIB
            print(f"{name} | {measured:.1f} | {est:.2f} | {est / measured:.2f} | {status}")
    # #7: TRL issue #3678, the log-prob forward alone (tiny Qwen2, vocab 151665, B=2, 256 kept).
    tiny = model.model_copy(update={"vocab_size": 151_665})
    setup = rl.RLSetup(algo="grpo", batch=2, num_generations=1, prompt_len=1,
                       completion_len=256,
                       policy=vram.TrainingSetup(method="lora", precision="fp32"))
    logits = loss_forward_logits_bytes(tiny, setup)
    measured = (902 - 44) * 10**6
    print(f"#7 TRL #3678 log-prob forward, B=2 x 256 x 151665 | {measured / GIB:.3f} | "
          f"{logits / GIB:.3f} | {logits / measured:.2f} | component: the log-prob forward's "
          "logits term only, read as _compute_loss calls it (with entropies; an assumption)")


if __name__ == "__main__":
    main()
