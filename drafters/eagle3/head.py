"""The EAGLE-3 draft head (arXiv 2503.01840) in the published checkpoint layout.

A head directory holds ``config.json`` (``architectures: ["LlamaForCausalLMEagle3"]``, ``hidden_size``,
``vocab_size``, ``draft_vocab_size``, optional ``target_hidden_size`` and auxiliary layer ids) and
``model.safetensors`` with:

    fc.weight                        [hidden, 3 * target_hidden]  fuses the target's low/mid/high features
    midlayer.hidden_norm / input_layernorm / post_attention_layernorm.weight          [hidden]
    midlayer.self_attn.{q,k,v}_proj.weight   [heads * head_dim, 2 * hidden]  (embedding ++ feature)
    midlayer.self_attn.o_proj.weight         [hidden, heads * head_dim]
    midlayer.mlp.{gate,up,down}_proj.weight  the Llama MLP
    norm.weight                      [hidden]
    lm_head.weight                   [draft_vocab, hidden]
    d2t                              [draft_vocab] int64: target id = draft id + d2t[draft id]
    t2d                              [vocab] bool: target token is in the draft vocabulary
    embed_tokens.weight              optional [vocab, hidden]; else the target's embeddings are used

One step of the head at position ``t``: ``out_t = midlayer(emb(x_{t+1}), h_t)``, where ``h_t`` is
``fc(cat(f_low, f_mid, f_high))`` of the target's features at ``t`` (or, while drafting, the head's own
``out_{t-1}``, its pre-norm output); ``lm_head(norm(out_t))`` is the distribution of ``x_{t+2}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from ..training.draft_vocab import check_d2t

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS_FILE = "model.safetensors"
#: the head trained for the embedded SmolLM2-135M-Instruct by `specexec train-eagle3`
SHIPPED_HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-instruct-eagle3"

#: attention over the head's keys: (query [T, heads, d], key [T, kv_heads, d], value) -> [T, heads, d]
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def default_aux_layers(num_target_layers: int) -> tuple[int, int, int]:
    """The target layers EAGLE-3 reads by default, as ``hidden_states`` indices: low, middle, high."""
    return (2, num_target_layers // 2, num_target_layers - 3)


@dataclass(slots=True)
class Eagle3Config:
    """The fields of a head's config.json this implementation uses."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  #: the target's vocabulary
    draft_vocab_size: int  #: rows of lm_head
    target_hidden_size: int  #: width of each captured target feature
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    aux_layer_ids: tuple[int, ...] | None = None  #: target hidden_states indices; None = the default three
    #: the head attends only keys with ``query_pos - key_pos < sliding_window`` (None: every earlier
    #: position). A head trained on sequences cut to their last positions drafts worse over a longer
    #: context: the shipped head, trained on 640 positions a sequence, reached acceptance length 2.59 over
    #: whole 1.1k-3.2k-token extraction prompts, 2.81 with a window of 512 (held out, teacher-forced)
    sliding_window: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> Eagle3Config:
        archs = d.get("architectures") or [ARCHITECTURE]
        if not any("eagle3" in a.lower() for a in archs):
            raise ValueError(f"not an EAGLE-3 head: architectures {archs!r} (expected {ARCHITECTURE!r})")
        missing = [k for k in ("hidden_size", "vocab_size", "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"EAGLE-3 head config lacks {', '.join(missing)}")
        heads = d["num_attention_heads"]
        aux = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or d.get(
            "eagle_aux_hidden_state_layer_ids"
        )
        return cls(
            hidden_size=d["hidden_size"],
            intermediate_size=d.get("intermediate_size", 4 * d["hidden_size"]),
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            vocab_size=d["vocab_size"],
            draft_vocab_size=d.get("draft_vocab_size") or d["vocab_size"],
            target_hidden_size=d.get("target_hidden_size") or d["hidden_size"],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=d.get("rope_theta", 10000.0),
            rope_scaling=d.get("rope_scaling"),
            max_position_embeddings=d.get("max_position_embeddings", 8192),
            aux_layer_ids=tuple(aux) if aux else None,
            sliding_window=_window(d.get("sliding_window")),
        )

    def to_dict(self) -> dict:
        d = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_act": "silu",
            "num_hidden_layers": 1,
            "tie_word_embeddings": False,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
        }
        if self.sliding_window is not None:
            d["sliding_window"] = self.sliding_window
        if self.aux_layer_ids is not None:
            d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)}
        return d

    def llama_config(self) -> LlamaConfig:
        """A LlamaConfig with the head's sizes (for transformers' RoPE, norm and MLP modules)."""
        extra = {"rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta}}
        if self.rope_scaling:
            extra["rope_parameters"] = {**self.rope_scaling, "rope_theta": self.rope_theta}
            extra["rope_parameters"].setdefault("rope_type", self.rope_scaling.get("type", "default"))
        return LlamaConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            num_hidden_layers=1,
            **extra,
        )


def _window(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"EAGLE-3 head config: sliding_window must be a positive integer or null, got {value!r}"
        )
    return value


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [T, 2 * hidden]
        cos: torch.Tensor,  # [T, head_dim]
        sin: torch.Tensor,  # [T, head_dim]
        attend: AttentionFn,
    ) -> torch.Tensor:  # [T, hidden]
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)  # cos/sin [T, 1, d] on [T, heads, d]
        o = attend(q, k, v)  # [T, heads, head_dim]
        return self.o_proj(o.reshape(n, -1))


class Eagle3Midlayer(nn.Module):
    """The head's single decoder layer: attention over ``norm(emb) ++ norm(h)``, then the MLP."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        lc = cfg.llama_config()
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(lc)

    def forward(self, emb, hidden, cos, sin, attend: AttentionFn) -> torch.Tensor:
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(hidden)), dim=-1)  # [T, 2 * hidden]
        hidden = hidden + self.self_attn(x, cos, sin, attend)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))  # [T, hidden], pre-norm


class Eagle3Head(nn.Module):
    """``target_embeddings`` (the target's token embeddings) are shared, not owned: never moved, cast
    or saved with the head. A checkpoint with its own ``embed_tokens`` uses those instead."""

    def __init__(self, cfg: Eagle3Config, target_embeddings: nn.Embedding | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Midlayer(cfg)
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(cfg.llama_config())
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))  # [draft_vocab]
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))  # [vocab]
        self.embed_tokens: nn.Embedding | None = None  #: the head's own, when its checkpoint has them
        self._target_embeddings = (target_embeddings,)  # a tuple: not registered as a submodule

    @property
    def dtype(self) -> torch.dtype:
        """The head's compute dtype (read off a norm: its linear layers may be packed or quantized)."""
        return self.norm.weight.dtype

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        table = self.embed_tokens if self.embed_tokens is not None else self._target_embeddings[0]
        if table is None:
            raise ValueError("this EAGLE-3 head has no embeddings: pass the target's to Eagle3Head")
        return table(token_ids)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[T, 3 * target_hidden] captured target features -> [T, hidden]."""
        return self.fc(features.to(self.dtype))

    def step(
        self,
        token_ids: torch.Tensor,  # [T] the tokens x_{t+1}
        hidden: torch.Tensor,  # [T, hidden] fused target features, or the head's previous outputs
        positions: torch.Tensor,  # [T]
        attend: AttentionFn,
    ) -> torch.Tensor:  # [T, hidden] pre-norm outputs (next step's `hidden`)
        emb = self.embed(token_ids).to(hidden.dtype)
        cos, sin = self.rotary_emb(hidden, positions[None])  # [1, T, head_dim] each
        return self.midlayer(emb, hidden, cos[0], sin[0], attend)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """[T, hidden] pre-norm outputs -> [T, draft_vocab] draft logits."""
        return self.lm_head(self.norm(out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def load_head(
    path: str | Path, target_embeddings: nn.Embedding | None, dtype: torch.dtype, device
) -> Eagle3Head:
    """A head from a directory in the published layout; clear errors for what does not fit."""
    from safetensors.torch import load_file

    path = Path(path).expanduser()
    config_file, weights_file = path / "config.json", path / WEIGHTS_FILE
    if not config_file.is_file():
        raise ValueError(f"EAGLE-3 head {path}: no config.json")
    if not weights_file.is_file():
        found = sorted(p.name for p in path.glob("*.safetensors")) or sorted(
            p.name for p in path.glob("*.bin")
        )
        if len(found) == 1 and found[0].endswith(".safetensors"):
            weights_file = path / found[0]
        else:
            raise ValueError(f"EAGLE-3 head {path}: expected {WEIGHTS_FILE}, found {found or 'no weights'}")
    cfg = Eagle3Config.from_dict(json.loads(config_file.read_text()))
    state = load_file(str(weights_file))
    own_embeddings = state.pop("embed_tokens.weight", None)
    head = Eagle3Head(cfg, target_embeddings)
    if own_embeddings is not None:
        head.embed_tokens = nn.Embedding.from_pretrained(own_embeddings, freeze=True)
    elif target_embeddings is None:
        raise ValueError(f"EAGLE-3 head {path} has no embed_tokens and no target embeddings were given")
    want = head.state_dict()
    for name, tensor in state.items():
        if name in want and tuple(tensor.shape) != tuple(want[name].shape):
            raise ValueError(
                f"EAGLE-3 head {path}: {name} has shape {tuple(tensor.shape)}, its config.json says "
                f"{tuple(want[name].shape)}"
            )
    if "d2t" not in state:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise ValueError(f"EAGLE-3 head {path}: a reduced draft vocabulary needs d2t")
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    check_d2t(state["d2t"].long(), cfg.vocab_size, "EAGLE-3 head")
    if "t2d" not in state:
        state["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        state["t2d"][torch.arange(len(state["d2t"])) + state["d2t"].long()] = True
    expected = {k for k in head.state_dict() if not k.startswith(("embed_tokens.", "rotary_emb."))}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(
            f"EAGLE-3 head {path}: missing tensors {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    head.load_state_dict(state, strict=False)
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save_head(head: Eagle3Head, path: str | Path, dtype: torch.dtype = torch.float16) -> None:
    """Write config.json and model.safetensors in the published layout (weights in ``dtype``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {
        k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
        for k, v in head.state_dict().items()
        if not k.startswith("rotary_emb.")
    }
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
