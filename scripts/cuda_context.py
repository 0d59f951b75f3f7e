"""Measure the CUDA context as nvidia-smi counts it, the figure `data/gpus.csv` keeps per GPU.

    python scripts/cuda_context.py            # prints one JSON line

The context is what a process holds on the device beyond PyTorch's own memory: nvidia-smi's
"used" after the first tiny tensor, minus what was used before, minus what PyTorch reserved.
A bf16 matmul is run too, so cuBLAS's handle is part of it (its workspace is PyTorch's, in
reserved). Run once with the default lazy module loading (CUDA >= 11.7) and once eager.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

MIB = 2**20


def used_mib(index: int) -> int:
    out = subprocess.check_output(["nvidia-smi", "-i", str(index), "--query-gpu=memory.used",
                                   "--format=csv,noheader,nounits"], text=True)
    return int(out.split()[0])


def probe() -> dict[str, object]:
    import torch

    before = used_mib(0)
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    after_tensor = used_mib(0) - before - torch.cuda.memory_reserved() // MIB
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    after_matmul = used_mib(0) - before - torch.cuda.memory_reserved() // MIB
    return {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "cuda": torch.version.cuda, "module_loading": os.environ.get("CUDA_MODULE_LOADING", ""),
        "context_mib_after_tensor": after_tensor, "context_mib_after_matmul": after_matmul,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(probe()))
        return
    for loading in ("LAZY", "EAGER"):
        env = {**os.environ, "CUDA_MODULE_LOADING": loading}
        subprocess.run([sys.executable, __file__, "--child"], env=env, check=True)


if __name__ == "__main__":
    main()
