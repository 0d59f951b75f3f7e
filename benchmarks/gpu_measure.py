"""Measure real training steps on one CUDA GPU and write what the allocator and the driver saw.

Run from a checkout (a CUDA machine with torch, transformers, peft and bitsandbytes):

    python benchmarks/gpu_measure.py --out DIR [--workers 3] [--budget-s 330] [--only ID,ID]

Writes DIR/context.json (the CUDA context's size), DIR/rows.jsonl (one JSON object per setup)
and DIR/env.json (versions, device). Each setup is built from a catalog config with random
weights directly on the GPU (no download) and runs three full steps, as vram's exact trace
(`vram/trace/build.py`, `vram/trace/step.py`) builds them for the HF Trainer:

* precision: `bf16-true` bf16 weights; `bf16-mixed` fp32 weights and `torch.autocast(bf16)`
  around the forward and the loss; `fp32` plain fp32.
* loss: the model's own (`model(input_ids=ids, labels=ids)`), logits upcast to fp32.
* `lora`: PEFT `LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
  lora_dropout=0.05)`, `get_peft_model` with PEFT's default `autocast_adapter_dtype=True`.
* `qlora`: every `nn.Linear` of the repeated blocks becomes a bitsandbytes `Linear4bit`
  (nf4, blocksize 64, `compress_statistics` for nf4-dq, compute dtype = the autocast dtype or
  the weight dtype), then `peft.prepare_model_for_kbit_training(use_gradient_checkpointing=
  False)` (upcasts the other 16-bit parameters to fp32), then LoRA as above.
* checkpointing: `gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant":
  ...})`; with a frozen embedding (LoRA, QLoRA) `enable_input_require_grads()` as PEFT does, so
  reentrant checkpointing still produces adapter gradients.
* optimizer: `adamw` with framework `hf-trainer` is `torch.optim.AdamW(fused=True)`, with
  `peft-accelerate` `AdamW(foreach=True)`; `adamw-8bit`, `paged-adamw`, `paged-adamw-8bit` are
  bitsandbytes' `AdamW8bit`, `PagedAdamW`, `PagedAdamW8bit`. Steps end with
  `zero_grad(set_to_none=True)`.

Per setup: `max_memory_allocated`, `max_memory_reserved`, `active_bytes.all.peak` over the
three steps (and over step 1 alone and steps 2-3 alone), and the driver's used memory (NVML,
for the process and for the whole device) sampled after each forward, backward and optimizer
step. Setups run in worker processes (several at once: the allocator's counters are per
process); setups with a paged optimizer run alone, each in a fresh process, so that the
device-wide figure is theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "data" / "models"
MIB = 2**20
#: "cuda"; `--cpu-check` builds and steps tiny versions on the CPU to test the script itself.
DEV = "cuda"


def _s(model: str, method: str, precision: str, seq: int, batch: int, *, opt: str = "adamw",
       ckpt: str = "off", quant: str = "none", framework: str = "hf-trainer",
       layers: int | None = None, targets: str = "all-linear", attn: str = "sdpa",
       alloc_conf: str = "") -> dict[str, Any]:
    sid = f"{model}{'-' + str(layers) + 'L' if layers else ''}|{method}|{quant}|{precision}|" \
          f"{opt}|{framework}|ckpt-{ckpt}|s{seq}|b{batch}"
    sid += ("|" + attn if attn != "sdpa" else "") + ("|" + alloc_conf if alloc_conf else "")
    return {"id": sid, "model": model, "layers": layers, "method": method, "quant": quant,
            "precision": precision, "optimizer": opt, "ckpt": ckpt, "seq": seq, "batch": batch,
            "framework": framework, "targets": targets, "attn": attn, "alloc_conf": alloc_conf}


#: PEFT's "all-linear" also reaches MoE expert banks and the router (and then refuses dropout).
ATTN = "q_proj,k_proj,v_proj,o_proj"
L1, Q05, G2, MX = "llama-3.2-1b", "qwen2.5-0.5b-instruct", "gemma-2-2b", "mixtral-8x7b-v0.1"

#: Three lanes that run side by side (memory of each lane stays well under a third of 141 GB).
LANES: list[list[dict[str, Any]]] = [
    [  # llama-3.2-1b
        _s(L1, "full", "bf16-true", 2048, 1),
        _s(L1, "full", "bf16-true", 2048, 4),
        _s(L1, "full", "bf16-true", 2048, 4, ckpt="nonreentrant"),
        _s(L1, "full", "bf16-true", 2048, 4, ckpt="reentrant"),
        _s(L1, "full", "bf16-mixed", 2048, 1),
        _s(L1, "full", "bf16-mixed", 2048, 1, framework="peft-accelerate"),
        _s(L1, "full", "bf16-mixed", 512, 4, ckpt="nonreentrant"),
        _s(L1, "full", "fp32", 512, 1),
        _s(L1, "full", "bf16-true", 2048, 1, opt="adamw-8bit"),
        _s(L1, "lora", "bf16-true", 2048, 4),
        _s(L1, "lora", "bf16-true", 2048, 4, ckpt="nonreentrant"),
        _s(L1, "lora", "bf16-true", 2048, 4, ckpt="reentrant"),
        _s(L1, "lora", "bf16-mixed", 2048, 1),
        _s(L1, "qlora", "bf16-mixed", 2048, 4, quant="nf4"),
        _s(L1, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="nonreentrant"),
        _s(L1, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="reentrant"),
        _s(L1, "qlora", "bf16-true", 2048, 4, quant="nf4", ckpt="nonreentrant"),
        _s(L1, "qlora", "bf16-true", 2048, 4, quant="nf4", ckpt="reentrant"),
        _s(L1, "qlora", "bf16-mixed", 2048, 1, quant="nf4-dq"),
    ],
    [  # qwen2.5-0.5b, gemma-2-2b
        _s(Q05, "full", "fp32", 512, 4),
        _s(Q05, "full", "fp32", 512, 1, framework="peft-accelerate"),
        _s(Q05, "full", "bf16-mixed", 2048, 4),
        _s(Q05, "full", "bf16-true", 2048, 4, ckpt="nonreentrant"),
        _s(Q05, "full", "bf16-true", 2048, 4, ckpt="reentrant"),
        _s(Q05, "lora", "bf16-true", 2048, 4),
        _s(Q05, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="nonreentrant"),
        _s(Q05, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="reentrant"),
        _s(G2, "lora", "bf16-true", 2048, 1),
        _s(G2, "lora", "bf16-true", 2048, 4, ckpt="nonreentrant"),
        _s(G2, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="nonreentrant"),
        _s(G2, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="reentrant"),
        _s(G2, "full", "bf16-true", 512, 1),
    ],
    [  # a 2-block Mixtral-8x7B (expert banks as 3D parameters)
        _s(MX, "full", "bf16-true", 2048, 1, layers=2),
        _s(MX, "full", "bf16-true", 512, 4, layers=2, ckpt="nonreentrant"),
        _s(MX, "full", "bf16-mixed", 512, 1, layers=2),
        _s(MX, "lora", "bf16-true", 2048, 4, layers=2, targets=ATTN),
        _s(MX, "qlora", "bf16-mixed", 2048, 1, layers=2, quant="nf4", targets=ATTN),
    ],
]

L3, QMOE, Q3MOE = "llama-3.2-3b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b"

#: The second grid (`--grid 2`): longer sequences, a 3B model, eager attention for Gemma 2,
#: more MoE banks, and the allocator's expandable segments.
LANES2: list[list[dict[str, Any]]] = [
    [
        _s(L3, "qlora", "bf16-mixed", 2048, 8, quant="nf4", ckpt="nonreentrant"),
        _s(L3, "qlora", "bf16-mixed", 2048, 8, quant="nf4", ckpt="reentrant"),
        _s(L3, "lora", "bf16-true", 4096, 2, ckpt="nonreentrant"),
        _s(L3, "full", "bf16-true", 4096, 1, ckpt="nonreentrant"),
        _s(L3, "full", "bf16-true", 1024, 2),
        _s(L3, "lora", "bf16-mixed", 2048, 2, ckpt="nonreentrant"),
    ],
    [
        _s(L1, "full", "bf16-true", 8192, 1, ckpt="nonreentrant"),
        _s(L1, "lora", "bf16-true", 8192, 1, ckpt="reentrant"),
        _s(L1, "full", "bf16-true", 512, 16),
        _s(G2, "lora", "bf16-true", 2048, 1, attn="eager"),
        _s(G2, "full", "bf16-true", 512, 1, attn="eager"),
        _s(G2, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="nonreentrant", attn="eager"),
    ],
    [
        _s(QMOE, "full", "bf16-true", 2048, 1, layers=2),
        _s(QMOE, "full", "bf16-mixed", 512, 1, layers=2),
        _s(Q3MOE, "full", "bf16-true", 2048, 1, layers=2),
        _s(MX, "full", "bf16-true", 2048, 4, layers=2),
        _s(MX, "full", "bf16-mixed", 1024, 1, layers=2),
    ],
]
ALONE2: list[dict[str, Any]] = [
    _s(L1, "full", "bf16-true", 2048, 4, alloc_conf="expandable_segments:True"),
    _s(L1, "lora", "bf16-true", 2048, 4, alloc_conf="expandable_segments:True"),
    _s(L3, "qlora", "bf16-mixed", 2048, 8, quant="nf4", ckpt="nonreentrant", opt="paged-adamw"),
]

#: Run alone, each in a fresh process: the device-wide driver figure is theirs.
ALONE: list[dict[str, Any]] = [
    _s(L1, "full", "bf16-true", 2048, 1, opt="paged-adamw"),
    _s(L1, "full", "bf16-true", 2048, 1, opt="paged-adamw-8bit"),
    _s(L1, "qlora", "bf16-mixed", 2048, 4, quant="nf4", ckpt="nonreentrant",
       opt="paged-adamw-8bit"),
    _s(L1, "full", "bf16-true", 2048, 1),  # the same step with plain AdamW, alone
]


# ---------------------------------------------------------------- NVML (the driver's view)

def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def device_used_bytes(nv: Any) -> int | None:
    if nv is None:
        return None
    h = nv.nvmlDeviceGetHandleByIndex(0)
    return int(nv.nvmlDeviceGetMemoryInfo(h).used)


def process_used_bytes(nv: Any, pid: int) -> int | None:
    if nv is None:
        return None
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
            if int(p.pid) == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
    except Exception:
        return None
    return None


# ---------------------------------------------------------------- building one setup

def load_config(spec: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((MODELS / f"{spec['model']}.json").read_text())
    if DEV == "cpu":  # a tiny model of the same family: tests the code paths, not the sizes
        cfg.pop("layer_types", None)
        cfg.update(num_hidden_layers=2, vocab_size=512, hidden_size=64, intermediate_size=128,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    elif spec.get("layers"):
        cfg["num_hidden_layers"] = spec["layers"]
        if isinstance(cfg.get("layer_types"), list):
            cfg["layer_types"] = cfg["layer_types"][: spec["layers"]]
    return cfg


def build(spec: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = load_config(spec)
    info: dict[str, Any] = {}
    fields = {k: v for k, v in cfg.items() if k not in ("architectures", "_name_or_path",
                                                         "quantization_config", "model_type")}
    fields["use_cache"] = False
    hf_cfg = AutoConfig.for_model(cfg["model_type"], **fields)
    wdtype = torch.bfloat16 if spec["precision"] == "bf16-true" else torch.float32
    autocast = torch.bfloat16 if spec["precision"] == "bf16-mixed" else None
    cdtype = autocast or wdtype
    with torch.device(DEV):
        try:
            model = AutoModelForCausalLM.from_config(
                hf_cfg, dtype=wdtype, attn_implementation=spec.get("attn", "sdpa"))
        except ValueError:
            model = AutoModelForCausalLM.from_config(hf_cfg, dtype=wdtype,
                                                     attn_implementation="eager")
    info["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    moe = cfg["model_type"] in ("mixtral", "qwen2_moe", "qwen3_moe")
    if moe and (wdtype is not torch.bfloat16 or autocast is not None):
        # grouped_mm needs bf16 operands: the other recipes run the eager expert loop
        for m in model.modules():
            c = getattr(m, "config", None)
            if c is not None and hasattr(c, "_experts_implementation"):
                c._experts_implementation = "eager"
    info["experts_implementation"] = getattr(model.config, "_experts_implementation", None)
    layers = model.model.layers
    if spec["method"] == "qlora":
        import bitsandbytes as bnb

        dq = spec["quant"] == "nf4-dq"
        keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
        for block in layers:
            for parent in list(block.modules()):
                for name, child in list(parent.named_children()):
                    if type(child) is nn.Linear and name not in keep:
                        q = bnb.nn.Linear4bit(child.in_features, child.out_features,
                                              bias=child.bias is not None, compute_dtype=cdtype,
                                              compress_statistics=dq, quant_type="nf4",
                                              device="meta")
                        w = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                              compress_statistics=dq, quant_type="nf4",
                                              module=q)
                        q.weight = w.to(DEV)
                        if child.bias is not None:
                            q.bias = nn.Parameter(child.bias.data, requires_grad=False)
                        setattr(parent, name, q)
                        del child, w
        gc.collect()
        from peft import prepare_model_for_kbit_training

        prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if spec["ckpt"] != "off":
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": spec["ckpt"] == "reentrant"})
    if spec["ckpt"] != "off":
        func = getattr(layers[0], "_gradient_checkpointing_func", None)
        info["ckpt_func"] = repr(func)[:200]
        seen: list[bool] = []

        def first_forward(_m: Any, _a: Any) -> None:
            if not seen:
                seen.append(torch.is_grad_enabled())
                info["block_forward_grad_enabled"] = seen[0]  # False: reentrant's no_grad

        layers[0].register_forward_pre_hook(first_forward)
    if spec["method"] == "full":
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        from peft import LoraConfig, TaskType, get_peft_model

        if spec["ckpt"] != "off":
            model.enable_input_require_grads()
        targets = spec.get("targets", "all-linear")
        lcfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
                          target_modules=targets if targets == "all-linear" else targets.split(","),
                          task_type=TaskType.CAUSAL_LM)
        model = get_peft_model(model, lcfg)
    model.train()
    info["params_total"] = sum(p.numel() for p in model.parameters())
    info["params_trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    return model, autocast, hf_cfg, info


def make_optimizer(spec: dict[str, Any], params: list[Any]) -> Any:
    import torch

    opt = spec["optimizer"]
    if opt == "adamw":
        fused = spec["framework"] == "hf-trainer"
        return torch.optim.AdamW(params, lr=1e-5, fused=fused, foreach=None if fused else True)
    import bitsandbytes as bnb

    cls = {"adamw-8bit": bnb.optim.AdamW8bit, "paged-adamw": bnb.optim.PagedAdamW,
           "paged-adamw-8bit": bnb.optim.PagedAdamW8bit}[opt]
    return cls(params, lr=1e-5)


def clear_cuda() -> None:
    import torch

    gc.collect()
    if DEV == "cpu":
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


class _CpuCounters:
    """Zero counters for `--cpu-check` (the script's own test on a machine without a GPU)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: {} if name == "memory_stats" else 0


def measure(spec: dict[str, Any], nv: Any, steps: int = 3) -> dict[str, Any]:
    import torch

    cu: Any = torch.cuda if DEV == "cuda" else _CpuCounters()
    row: dict[str, Any] = dict(spec)
    clear_cuda()
    row["baseline_allocated"] = cu.memory_allocated()
    row["baseline_reserved"] = cu.memory_reserved()
    t0 = time.perf_counter()
    model, autocast, hf_cfg, info = build(spec)
    row.update(info)
    row["build_s"] = round(time.perf_counter() - t0, 2)
    train = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(spec, train)
    cu.synchronize()
    row["after_build_allocated"] = cu.memory_allocated()
    pid = os.getpid()
    vocab = int(hf_cfg.vocab_size)
    gen = torch.Generator(device=DEV).manual_seed(0)
    samples: list[dict[str, Any]] = []
    cu.reset_peak_memory_stats()
    times = []
    for step in range(steps):
        ts = time.perf_counter()
        ids = torch.randint(0, vocab, (spec["batch"], spec["seq"]), device=DEV, generator=gen)
        labels = ids.clone()
        if autocast is not None:
            with torch.autocast(DEV, dtype=autocast):
                loss = model(input_ids=ids, labels=labels).loss
        else:
            loss = model(input_ids=ids, labels=labels).loss
        cu.synchronize()
        samples.append({"step": step, "at": "forward", "proc": process_used_bytes(nv, pid),
                        "device": device_used_bytes(nv),
                        "reserved": cu.memory_reserved()})
        loss.backward()
        cu.synchronize()
        row["loss"] = float(loss.detach())
        del loss
        if step == 0:
            row["grads_present"] = sum(p.grad is not None for p in train)
            row["grads_expected"] = len(train)
        samples.append({"step": step, "at": "backward", "proc": process_used_bytes(nv, pid),
                        "device": device_used_bytes(nv),
                        "reserved": cu.memory_reserved()})
        optimizer.step()
        cu.synchronize()
        samples.append({"step": step, "at": "optimizer", "proc": process_used_bytes(nv, pid),
                        "device": device_used_bytes(nv),
                        "reserved": cu.memory_reserved()})
        optimizer.zero_grad(set_to_none=True)
        del ids, labels
        times.append(round(time.perf_counter() - ts, 3))
        if step == 0:
            st = cu.memory_stats()
            row["step1_allocated_peak"] = cu.max_memory_allocated()
            row["step1_reserved_peak"] = cu.max_memory_reserved()
            row["step1_active_peak"] = int(st.get("active_bytes.all.peak", 0))
            row["after_step1_allocated"] = cu.memory_allocated()
            cu.reset_peak_memory_stats()
    st = cu.memory_stats()
    row["steps23_allocated_peak"] = cu.max_memory_allocated()
    row["steps23_reserved_peak"] = cu.max_memory_reserved()
    row["steps23_active_peak"] = int(st.get("active_bytes.all.peak", 0))
    row["allocated_peak"] = max(row["step1_allocated_peak"], row["steps23_allocated_peak"])
    row["reserved_peak"] = max(row["step1_reserved_peak"], row["steps23_reserved_peak"])
    row["active_peak"] = max(row["step1_active_peak"], row["steps23_active_peak"])
    row["end_allocated"] = cu.memory_allocated()
    row["num_alloc_retries"] = int(st.get("num_alloc_retries", 0))
    row["step_s"] = times
    row["nvml_samples"] = samples
    procs = [s["proc"] for s in samples if s["proc"] is not None]
    devs = [s["device"] for s in samples if s["device"] is not None]
    row["nvml_proc_max"] = max(procs) if procs else None
    row["nvml_device_max"] = max(devs) if devs else None
    row["loss_finite"] = math.isfinite(row["loss"])
    del model, optimizer, train
    clear_cuda()
    row["residual_allocated"] = cu.memory_allocated()
    return row


# ---------------------------------------------------------------- processes

def worker(ids: list[str], out: Path, deadline: float) -> None:
    import torch

    torch.cuda.init()
    torch.ones(1, device="cuda")
    nv = _nvml()
    specs = {s["id"]: s for lane in LANES + LANES2 for s in lane}
    specs |= {s["id"]: s for s in ALONE + ALONE2}
    with out.open("a") as fh:
        for sid in ids:
            spec = specs[sid]
            if time.time() > deadline:
                fh.write(json.dumps({**spec, "status": "skipped (time budget)"}) + "\n")
                fh.flush()
                continue
            try:
                row = measure(spec, nv)
                row["status"] = "ok"
            except Exception as exc:
                row = {**spec, "status": f"error: {type(exc).__name__}: {str(exc)[:300]}"}
                with contextlib.suppress(Exception):
                    clear_cuda()
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(f"[{os.getpid()}] {row['status'][:60]:<12} {sid} "
                  f"alloc={row.get('allocated_peak', 0) / MIB:.0f} MiB", flush=True)


def context_probe(out: Path) -> None:
    """The CUDA context: what the driver counts for a process holding one small tensor."""
    import torch

    nv = _nvml()
    before = device_used_bytes(nv)
    torch.cuda.init()
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    time.sleep(0.5)
    res: dict[str, Any] = {"device_used_before": before,
                           "device_used_after_init": device_used_bytes(nv),
                           "proc_used_after_init": process_used_bytes(nv, os.getpid()),
                           "reserved_after_init": torch.cuda.memory_reserved()}
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    time.sleep(0.5)
    res |= {"device_used_after_matmul": device_used_bytes(nv),
            "proc_used_after_matmul": process_used_bytes(nv, os.getpid()),
            "reserved_after_matmul": torch.cuda.memory_reserved(),
            "allocated_after_matmul": torch.cuda.memory_allocated()}
    if before is not None:
        res["context_bytes_init"] = res["device_used_after_init"] - before - \
            res["reserved_after_init"]
        res["context_bytes_after_matmul"] = res["device_used_after_matmul"] - before - \
            res["reserved_after_matmul"]
    del x, a
    (out / "context.json").write_text(json.dumps(res, indent=1))
    print("context:", json.dumps(res), flush=True)


def environment(out: Path) -> None:
    import importlib.metadata as md

    import torch

    env: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                           "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
                           "capability": list(torch.cuda.get_device_capability(0)),
                           "total_memory": torch.cuda.get_device_properties(0).total_memory}
    for pkg in ("transformers", "peft", "accelerate", "bitsandbytes", "nvidia-ml-py"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    try:
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["nvidia_smi"] = None
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print("env:", json.dumps(env), flush=True)


def _spawn(args: list[str], alloc_conf: str = "") -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workers", type=int, default=3, help="lanes run side by side")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting setups after")
    ap.add_argument("--grid", type=int, default=1, choices=(1, 2), help="which grid to run")
    ap.add_argument("--only", default="", help="comma-separated substrings of setup ids")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default="rows.jsonl", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--context", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cpu-check", action="store_true",
                    help="build and step a 2-block version of each setup on the CPU")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cpu_check:
        global DEV
        DEV = "cpu"
        specs = [s for lane in LANES + LANES2 for s in lane] + ALONE + ALONE2
        wanted = [w for w in args.only.split(",") if w]
        for spec in specs:
            if wanted and not any(w in spec["id"] for w in wanted):
                continue
            spec = {**spec, "seq": 32, "batch": 2}
            row = measure(spec, None, steps=2)
            print("cpu-check ok", spec["id"], row["params_trainable"], row["grads_present"],
                  row["grads_expected"], f"{row['loss']:.2f}", flush=True)
        return
    if args.context:
        context_probe(args.out)
        environment(args.out)
        return
    if args.worker:
        worker(args.worker.split(";"), args.out / args.rows, args.deadline)
        return
    start = time.time()
    deadline = start + args.budget_s
    wanted = [w for w in args.only.split(",") if w]

    def keep(lane: list[dict[str, Any]]) -> list[str]:
        return [s["id"] for s in lane if not wanted or any(w in s["id"] for w in wanted)]

    alone, all_lanes = (ALONE, LANES) if args.grid == 1 else (ALONE2, LANES2)
    conf = {s["id"]: s["alloc_conf"] for s in alone}
    _spawn(["--out", str(args.out), "--context"]).wait()
    # The paged setups leave no process behind to share the device with: run them first, alone.
    for sid in keep(alone):
        _spawn(["--out", str(args.out), "--worker", sid, "--rows", "rows_alone.jsonl",
                "--deadline", str(deadline)], conf[sid]).wait()
    lanes = [(i, keep(lane)) for i, lane in enumerate(all_lanes)]
    lanes = [(i, lane) for i, lane in lanes if lane]

    def lane_proc(i: int, lane: list[str]) -> subprocess.Popen[bytes]:
        return _spawn(["--out", str(args.out), "--worker", ";".join(lane),
                       "--rows", f"rows_lane{i}.jsonl", "--deadline", str(deadline)])

    procs = [lane_proc(i, lane) for i, lane in lanes[: args.workers]]
    for i, extra in lanes[args.workers:]:
        procs[0].wait()
        procs[0] = lane_proc(i, extra)
    for p in procs:
        p.wait()
    rows = [json.loads(line) for path in sorted(args.out.glob("rows*.jsonl"))
            for line in path.read_text().splitlines()]
    print(f"\n{len(rows)} rows in {time.time() - start:.0f} s")
    for r in rows:
        if r.get("status") == "ok":
            print(f"{r['allocated_peak'] / MIB:9.0f} {r['reserved_peak'] / MIB:9.0f} "
                  f"{(r['nvml_proc_max'] or 0) / MIB:9.0f} {r['id']}")
        else:
            print(f"{'':>29} {r['id']} {r.get('status')}")


if __name__ == "__main__":
    main()
