"""Medusa heads (arXiv 2401.10774): extra decoding heads on the target's last hidden state.

Head ``k`` (1-based) reads ``h_t``, the target's final normed hidden state at position ``t``, and
predicts ``x_{t+k+1}``: the target's own LM head gives ``x_{t+1}`` (the step's bonus token), head 1 the
token after it, and so on. Each head is a residual block, ``z_k = h + SiLU(W_k h + b_k)``, and every
head shares one projection onto a reduced draft vocabulary, so the ``K`` rows of a request go through
its weights in one matmul (on a CPU the projection's weights are the cost, read once a step for all
heads; Medusa's paper gives each head a full-vocabulary copy of the LM head).

A heads directory holds ``config.json`` (``architectures: ["MedusaHeads"]``, ``hidden_size``,
``vocab_size``, ``draft_vocab_size``, ``num_heads``) and ``model.safetensors`` with:

    blocks.{k}.weight   [hidden, hidden]   head k's residual block (k from 0)
    blocks.{k}.bias     [hidden]
    lm_head.weight      [draft_vocab, hidden]   shared by every head
    d2t                 [draft_vocab] int64: target id = draft id + d2t[draft id]
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..training.draft_vocab import check_d2t

ARCHITECTURE = "MedusaHeads"
WEIGHTS_FILE = "model.safetensors"
#: the heads trained for the embedded SmolLM2-135M-Instruct by `specexec train-medusa`
SHIPPED_HEADS = Path(__file__).resolve().parent / "heads" / "smollm2-135m-instruct-medusa"
MAX_HEADS = 8


@dataclass(frozen=True, slots=True)
class MedusaConfig:
    hidden_size: int  #: the target's hidden size (the heads read and write vectors of it)
    vocab_size: int  #: the target's vocabulary
    draft_vocab_size: int  #: tokens the heads can draft (the corpus's most frequent)
    num_heads: int  #: drafts per step at most: head k predicts the k-th token after the bonus token

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "draft_vocab_size", "num_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Medusa heads: {name} must be a positive integer, got {value!r}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError("Medusa heads: draft_vocab_size is larger than vocab_size")
        if self.num_heads > MAX_HEADS:
            raise ValueError(f"Medusa heads: num_heads must be at most {MAX_HEADS}, got {self.num_heads}")

    @classmethod
    def from_dict(cls, d: dict) -> MedusaConfig:
        if ARCHITECTURE not in d.get("architectures", [ARCHITECTURE]):
            raise ValueError(f"not Medusa heads: architectures {d.get('architectures')}")
        try:
            return cls(
                int(d["hidden_size"]), int(d["vocab_size"]), int(d["draft_vocab_size"]), int(d["num_heads"])
            )
        except KeyError as exc:
            raise ValueError(f"Medusa heads: config.json lacks {exc.args[0]}") from None

    def to_dict(self) -> dict:
        return {"architectures": [ARCHITECTURE], **asdict(self)}


class MedusaHeads(nn.Module):
    def __init__(self, cfg: MedusaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.blocks = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.hidden_size) for _ in range(cfg.num_heads))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))  # [draft_vocab]

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Draft logits [R, num_heads, draft_vocab] of the first ``num_heads`` heads (all by default) from
        the target's final hidden states ``hidden`` [R, hidden]."""
        blocks = self.blocks[: num_heads or len(self.blocks)]
        z = torch.stack([hidden + F.silu(block(hidden)) for block in blocks], dim=1)  # [R, K, hidden]
        return self.lm_head(z)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def new_heads(cfg: MedusaConfig, lm_head_rows: torch.Tensor, d2t: torch.Tensor) -> MedusaHeads:
    """Heads that start as the target's LM head over the draft vocabulary (``lm_head_rows``
    [draft_vocab, hidden]): the residual blocks add nothing until trained (Medusa's initialisation)."""
    heads = MedusaHeads(cfg)
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.zero_()
            block.bias.zero_()
        heads.lm_head.weight.copy_(lm_head_rows)
        heads.d2t.copy_(d2t)
    return heads


def load_heads(path: str | Path, dtype: torch.dtype, device) -> MedusaHeads:
    """Heads from a directory in the layout above; clear errors for what does not fit."""
    from safetensors.torch import load_file

    path = Path(path).expanduser()
    config_file, weights_file = path / "config.json", path / WEIGHTS_FILE
    if not config_file.is_file():
        raise ValueError(f"Medusa heads {path}: no config.json")
    if not weights_file.is_file():
        raise ValueError(f"Medusa heads {path}: no {WEIGHTS_FILE}")
    try:
        cfg = MedusaConfig.from_dict(json.loads(config_file.read_text()))
    except json.JSONDecodeError as exc:
        raise ValueError(f"Medusa heads {path}: config.json is not JSON ({exc})") from None
    state = load_file(str(weights_file))
    heads = MedusaHeads(cfg)
    want = heads.state_dict()
    missing, unexpected = set(want) - set(state), set(state) - set(want)
    if missing or unexpected:
        raise ValueError(
            f"Medusa heads {path}: missing tensors {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(want[name].shape):
            raise ValueError(
                f"Medusa heads {path}: {name} has shape {tuple(tensor.shape)}, its config.json says "
                f"{tuple(want[name].shape)}"
            )
    state["d2t"] = state["d2t"].long()
    check_d2t(state["d2t"], cfg.vocab_size, f"Medusa heads {path}")
    heads.load_state_dict(state)
    return heads.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save_heads(heads: MedusaHeads, path: str | Path, dtype: torch.dtype = torch.float16) -> None:
    """Write config.json and model.safetensors (weights in ``dtype``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {
        k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in heads.state_dict().items()
    }
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(heads.config.to_dict(), indent=2) + "\n")
