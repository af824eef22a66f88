"""Resident memory after a GGUF load at the file's own codes (``quantization: gguf``), against the file:
the process's resident set after the executor's start-up (its warm-up included) and one short request,
the model's weights by layer kind (the int4 layers' kernel tiles and per-dtype tables counted, which
are not buffers), the KV pool's size, and the issue's bound (1.2x the file + the KV pool + 300 MB).

    python bench/reports/2026-11-29-gguf-memory/memory.py FILE.gguf
"""

from __future__ import annotations

import collections
import os
import sys

import torch
from specexec import Executor, ExecutorConfig, Request, SamplingParams

MIB = 2**20


def resident_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def weights_by_kind(model: torch.nn.Module) -> collections.Counter:
    found, seen = collections.Counter(), set()

    def add(kind: str, tensor) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            found[kind] += tensor.numel() * tensor.element_size()

    for module in model.modules():
        kind = type(module).__name__
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            add(kind, tensor)
        add(f"{kind} int8_dot tiles", getattr(module, "_q4_codes", None))
        for table in (module.__dict__.get("_scales_and_zeros") or {}).values():
            add(f"{kind} torch kernel tables", table)
    return found


def main() -> None:
    path = sys.argv[1]
    executor = Executor(model=path, config=ExecutorConfig(quantization="gguf"))
    list(executor.run([Request("Explain KV caching.", SamplingParams(max_tokens=16))]))
    pool = executor.core.runner.kv_cache.kv
    kv_bytes = pool.numel() * pool.element_size()
    file_bytes = os.path.getsize(path)
    weights = weights_by_kind(executor.model)
    resident = resident_mib()
    bound = (1.2 * file_bytes + kv_bytes + 300e6) / MIB
    print(f"file: {path} ({file_bytes / MIB:.0f} MiB); dtype {executor.setup.dtype_choice.dtype}")
    for kind, size in weights.most_common():
        print(f"  {kind}: {size / MIB:.1f} MiB")
    total = sum(weights.values())
    print(f"weights {total / MIB:.0f} MiB = {total / file_bytes:.2f}x the file")
    print(f"resident {resident:.0f} MiB; KV pool {kv_bytes / MIB:.0f} MiB; bound {bound:.0f} MiB")
    executor.close()


if __name__ == "__main__":
    main()
