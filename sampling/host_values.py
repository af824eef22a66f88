"""Host values onto the device without making the host wait.

``torch.tensor(values, device="cuda")`` copies synchronously: the host waits until everything already
queued on the stream has run (a CUDA graph replay, say) before it can go on. A non-blocking copy of a
host tensor is queued behind that work instead and returns at once, which is what the stages between a
forward and its one read-back need.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def device_tensor(values: Sequence, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``values`` as a 1-D tensor on ``device``, copied without waiting for the device."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)
