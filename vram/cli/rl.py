"""`python -m vram rl`: one RL step's memory, phase by phase (design.md).

    python -m vram rl --algo grpo --model qwen2.5-7b-instruct --method lora \\
        --num-generations 8 --prompt-len 512 --completion-len 1024 --batch 8 \\
        --rollout colocate --gpu-memory-utilization 0.3 --sleep 1 --beta 0.04 \\
        --gpu h100-sxm --gpu-count 1 --json
"""

from __future__ import annotations

import argparse
import json

from vram.errors import VramError
from vram.gpus import load_gpus
from vram.model.architecture import ModelSpec
from vram.model.catalog import load_model
from vram.rl import estimate
from vram.rl.result import RLEstimate
from vram.rl.setup import Algo, Engine, Reference, RLSetup, Rollout
from vram.setup import Method, Optimizer, Precision, Sharding, TrainingSetup
from vram.units import both, size_text


def add_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `rl` on the main parser's subcommands."""
    p = commands.add_parser("rl", help="memory of one RL post-training step (GRPO, DPO, PPO)")
    p.add_argument("--algo", choices=[a.value for a in Algo], default="grpo",
                   help="the RL algorithm (default: grpo)")
    p.add_argument("--model", help="catalog name, Hub id or config.json")
    # dest from_file, as `estimate --from` (the readers scan typed flags across subcommands)
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="a TRL GRPO/DPO config (YAML/JSON): its settings, then typed flags")
    p.add_argument("--method", choices=[m.value for m in Method], default="lora",
                   help="how the policy is trained (default: lora)")
    p.add_argument("--precision", choices=[x.value for x in Precision], default="bf16-true",
                   help="the policy's precision (default: bf16-true, as RL stacks load it)")
    p.add_argument("--optimizer", choices=[o.value for o in Optimizer], default="adamw",
                   help="the policy's optimizer (default: adamw)")
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True,
                   help="gradient checkpointing of the policy (default: on)")
    p.add_argument("--sharding", choices=[s.value for s in Sharding], default=None,
                   help="the training GPUs' sharding (default: none on 1 GPU, else zero2)")
    p.add_argument("--num-generations", type=int, default=8,
                   help="completions per prompt, G (default 8)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--completion-len", type=int, default=256,
                   help="completion tokens (default 256)")
    # dest micro_batch, as `estimate --batch`: flag scans over every subcommand (readers'
    # cli_hook.explicit_dests) then read one meaning for --batch and its abbreviations.
    p.add_argument("--batch", dest="micro_batch", type=int, default=1,
                   help="prompts (pairs) per GPU per step")
    p.add_argument("--beta", type=float, default=0.0,
                   help="KL weight; above 0 a reference model is kept (default 0)")
    p.add_argument("--reference", choices=[r.value for r in Reference], default="auto",
                   help="how the reference log-probs are had: a model, the base with the "
                        "adapter off, precomputed, or none (default: the algorithm's)")
    p.add_argument("--reward-model", action="store_true",
                   help="a reward model on the training GPUs")
    p.add_argument("--rollout", choices=[r.value for r in Rollout], default="colocate",
                   help="where generation runs: colocate, server, shared, hf-generate, or "
                        "none for offline pairs (default: colocate)")
    p.add_argument("--engine", choices=[e.value for e in Engine], default="vllm",
                   help="the generation engine (default: vllm)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3,
                   help="vLLM's share of GPU memory it reserves up front (default 0.3)")
    p.add_argument("--sleep", type=int, choices=[0, 1, 2], default=0,
                   help="vLLM's sleep level while the policy trains: 1 offloads the "
                        "weights to host memory and drops the KV cache, 2 drops both "
                        "(default 0: no sleep)")
    p.add_argument("--rollout-gpus", type=int, default=1,
                   help="GPUs of the generation server (default 1)")
    p.add_argument("--chunked-loss", action="store_true",
                   help="compute the loss a chunk of tokens at a time")
    p.add_argument("--gpu", default="h100-sxm", help="GPU id from `python -m vram gpus`")
    p.add_argument("--gpu-count", type=int, default=1, help="training GPUs")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        message = str(first["msg"]).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(exc)


def rl_setup_from_args(args: argparse.Namespace) -> RLSetup:
    """The RLSetup the flags describe; a bad one raises VramError naming the field."""
    gpus = args.gpu_count
    sharding = args.sharding or ("none" if gpus == 1 else "zero2")
    try:
        policy = TrainingSetup(method=args.method, precision=args.precision,
                               optimizer=args.optimizer, grad_ckpt=args.grad_ckpt,
                               n_gpus=gpus, sharding=sharding)
        rollout = "none" if args.algo in ("dpo", "kto", "orpo", "simpo") and \
            args.rollout == "colocate" else args.rollout
        return RLSetup(
            algo=args.algo, policy=policy, num_generations=args.num_generations,
            prompt_len=args.prompt_len, completion_len=args.completion_len,
            batch=args.micro_batch,
            beta=args.beta, reference=args.reference, reward_model=args.reward_model,
            rollout=rollout, engine=args.engine,
            gpu_memory_utilization=args.gpu_memory_utilization, sleep=args.sleep,
            rollout_gpus=args.rollout_gpus, chunked_loss=args.chunked_loss)
    except ValueError as exc:
        raise VramError(_first_error(exc)) from None


def gpu_memory(gpu_id: str) -> int:
    for gpu in load_gpus():
        if gpu.id == gpu_id:
            return gpu.memory_bytes
    raise VramError(f"--gpu: unknown {gpu_id[:40]!r}; see `python -m vram gpus`")


def table(result: RLEstimate) -> str:
    """The phases' buckets, GiB and GB side by side (as `estimate` prints them)."""
    lines = [f"{result.model_name}, {result.setup.algo.value}: peak "
             f"{both(result.device_peak_bytes, 2)} per GPU in the "
             f"{result.peak_phase.value} phase (GPU holds {both(result.gpu_memory_bytes, 2)})"]
    for phase in (result.generation, result.training):
        lines.append(f"\n{phase.name.value} ({phase.gpu_group} GPUs)")
        for name, value in phase.buckets.items():
            lines.append(f"  {name:<16} {size_text(value)}")
        lines.append(f"  {'total':<16} {size_text(phase.device_peak_bytes)}")
    lines.append(f"\nhost RAM {both(result.host_bytes, 2)}")
    if result.peak_by_sleep:
        lines.append("peak by sleep level: " + ", ".join(
            f"{level}: {both(peak, 2)}" for level, peak in result.peak_by_sleep.items()))
    lines += [f"warning: {w}" for w in result.warnings]
    lines += [f"advice: {a}" for a in result.advice]
    return "\n".join(lines)


#: The flags that override a loaded config's RL settings, by dest -> RLSetup field.
RL_FLAG_FIELDS: dict[str, str] = {
    "algo": "algo", "num_generations": "num_generations", "prompt_len": "prompt_len",
    "completion_len": "completion_len", "micro_batch": "batch", "beta": "beta",
    "reference": "reference", "reward_model": "reward_model", "rollout": "rollout",
    "engine": "engine", "gpu_memory_utilization": "gpu_memory_utilization", "sleep": "sleep",
    "rollout_gpus": "rollout_gpus", "chunked_loss": "chunked_loss",
}


def _from_file(args: argparse.Namespace,
               parser: argparse.ArgumentParser) -> tuple[ModelSpec, RLSetup]:
    from vram.io.readers import load_training_config
    from vram.io.readers.cli_hook import explicit_dests
    from vram.rl.from_config import rl_setup_from_config

    loaded = load_training_config(args.from_file)
    if args.model:
        model = load_model(args.model)
    elif loaded.model is not None:
        model = loaded.model
    else:
        raise VramError(f"--model: {loaded.model_problem or 'the file names no model'}")
    setup = rl_setup_from_config(loaded)
    typed = explicit_dests(parser, getattr(args, "argv", []))
    update = {field: getattr(args, dest) for dest, field in RL_FLAG_FIELDS.items()
              if dest in typed}
    if update:
        fields = setup.model_dump()
        fields.update(update)
        fields["policy"] = setup.policy
        try:
            setup = RLSetup.model_validate(fields)
        except ValueError as exc:
            raise VramError(_first_error(exc)) from None
    return model, setup


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    memory = gpu_memory(args.gpu)
    if args.from_file:
        model, setup = _from_file(args, parser)
    else:
        if not args.model:
            raise VramError("--model: required (or give a TRL GRPO/DPO config with --from)")
        setup = rl_setup_from_args(args)
        model = load_model(args.model)
    result = estimate(model, setup, memory)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(table(result))
    return 0
