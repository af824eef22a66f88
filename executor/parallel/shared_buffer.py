"""Tensors in shared memory that cost only the pages written: a file in ``/dev/shm`` mapped by every
process that uses it (``torch.from_file``), handed to the workers by name, not by copy.

``Tensor.share_memory_()`` copies a tensor into shared memory and so touches every page; the logit
and collective buffers are sized for the largest step (a prefill chunk's logits: max_num_tokens x
vocabulary) but a decode step writes a few rows, so they are mapped sparse instead.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import uuid

import torch

SHM_DIR = "/dev/shm"


class SharedBuffer:
    """A named shared tensor; pickles as its name, shape and dtype, mapped again in each process."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        folder = SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()
        self.path = os.path.join(folder, f"specexec-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        self.shape = tuple(shape)
        self.dtype = dtype
        self._tensor: torch.Tensor | None = None
        self.tensor()  # creates the file (sparse: no page is written)

    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            size = math.prod(self.shape)
            self._tensor = torch.from_file(self.path, shared=True, size=size, dtype=self.dtype).view(
                self.shape
            )
        return self._tensor

    def unlink(self) -> None:
        """Remove the file (the mappings stay valid until each process drops them)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __getstate__(self) -> dict:
        return {"path": self.path, "shape": self.shape, "dtype": self.dtype}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._tensor = None
