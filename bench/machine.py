"""What a benchmark ran on: torch's threads and the machine, for the table's header and the JSON."""

from __future__ import annotations

import platform
import time


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def describe_machine() -> dict:
    import torch

    from ..executor.layers.cpu_info import describe_cpu

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": describe_cpu(),
        "time": time.time(),
    }
