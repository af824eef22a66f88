"""The machine `specexec train-eagle3` and `specexec train-medusa` run on: the flags that choose it
(cheap to import, so `specexec --help` stays fast) and the device ``--device`` names."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def add_machine_arguments(parser) -> None:
    """The flags every training command shares: precision, device and seed."""
    parser.add_argument(
        "--train-dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="training steps' matmul precision (auto: bfloat16 autocast where the first steps time it "
        "faster, float32 on CPUs without native bfloat16)",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="where the target answers and training runs: auto (cuda when available, else cpu), cpu, "
        "cuda, cuda:N",
    )
    parser.add_argument("--seed", type=int, default=0)


def training_device(name: str) -> torch.device:
    """``--device``: ``auto`` is the GPU when there is one, else the CPU; a device this machine does not
    have is refused (`check_device`, as the executor refuses it) before any work starts."""
    import torch

    from ...executor.model.model_loader import ModelLoadError, check_device

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        check_device(name)
    except ModelLoadError as exc:
        raise ValueError(f"--device {name}: {exc}") from exc
    return torch.device(name)
