"""One decoder layer of the Llama family, as a fixed sequence of ops over a flat batch of tokens.

Every layer takes and returns ``(hidden, residual)``: the layer's output is ``residual + hidden``, and
the next layer does that add first, in one op with its first norm (`RMSNorm.add_forward`; the first
layer gets ``residual=None``: its input is ``hidden``).
Two orders of norms:
- `PreNormLayer` (Llama, Mistral, Qwen2/3): norm, attention, add; norm, MLP (the add comes next);
- `SandwichNormLayer` (Gemma2/3): norm, attention, norm, add; norm, MLP, norm.
Attention: one QKV projection, optional per-head q/k norms (Qwen3, Gemma3), RoPE from the table rows of
the step's positions, K/V written into the paged cache (without q/k norms, RoPE and the write are one
pass: a C++ op on the CPU, a Triton kernel on CUDA) and attended there (`paged_attention`), one output
projection. MLP: one gate/up projection, act(gate) * up (one fused op), one down projection. On CUDA
a norm and the projection after it may be one kernel (`skinny_linear.project_normed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...layers.activation import act_mul, fused_activation_code
from ...layers.fused_ops import fused_ops_for
from ...layers.norm import RMSNorm
from ...layers.rotary import apply_rotary
from ...layers.skinny_linear import project_normed
from ..attention_metadata import AttentionMetadata
from ..paged_attention import paged_attention


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """What one layer's attention is, beside its weights."""

    layer_idx: int  #: its KV-cache layer
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float  #: the query scale (head_dim ** -0.5, or Gemma's query_pre_attn_scalar ** -0.5)
    sliding_window: int | None = None  #: attend only this many positions back (None: all)
    softcap: float | None = None  #: Gemma2's attention-logit soft cap
    rotary: str = "default"  #: which rotary table (Gemma3: one per layer type)


class DecoderLayer(nn.Module):
    """The projections, norms and attention shared by both norm orders; `forward` is the order."""

    def __init__(
        self,
        spec: AttentionSpec,
        qkv_proj: nn.Module,
        o_proj: nn.Module,
        gate_up_proj: nn.Module,
        down_proj: nn.Module,
        act: nn.Module,
        norms: dict[str, RMSNorm],
    ) -> None:
        super().__init__()
        self.spec = spec
        self.qkv_proj = qkv_proj  # [hidden] -> [(heads + 2 * kv_heads) * head_dim]
        self.o_proj = o_proj  # [heads * head_dim] -> [hidden]
        self.gate_up_proj = gate_up_proj  # [hidden] -> [2 * intermediate]
        self.down_proj = down_proj  # [intermediate] -> [hidden]
        self.act = act
        self._act_code = fused_activation_code(act)  #: the fused act(gate) * up op's code, if it has one
        self.q_norm = norms.pop("q_norm", None)
        self.k_norm = norms.pop("k_norm", None)
        for name, norm in norms.items():
            setattr(self, name, norm)
        self._split = (spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim)

    #: the checkpoint's linear layers each fused one holds, in row order (GGUF codes, quantization reports)
    checkpoint_names = {
        "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "o_proj": ("self_attn.o_proj",),
        "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
        "down_proj": ("mlp.down_proj",),
    }

    def attention(self, x: torch.Tensor, rows: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; rows: the rotary table's rows of the T positions."""
        return self.attend(self.qkv_proj(x), rows, meta)

    def attend(self, qkv: torch.Tensor, rows: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The attention after the QKV projection: qkv [T, q_size + 2 * kv_size] -> [T, hidden]."""
        spec, (q_size, kv_size) = self.spec, self._split
        num_tokens = qkv.shape[0]
        ops = fused_ops_for(qkv) if self.q_norm is None else None
        if ops is not None:  # RoPE and the cache write in one pass
            kv = meta.kv_cache.kv[spec.layer_idx]
            q = ops.rotary_kv_write(
                qkv, rows, kv, meta.slots, spec.num_heads, spec.num_kv_heads, spec.head_dim
            )
            out = paged_attention(
                spec.layer_idx, q, None, None, meta, spec.scaling, spec.sliding_window, spec.softcap
            )
            return self.o_proj(out.reshape(num_tokens, q_size))
        v = qkv[:, q_size + kv_size :].view(num_tokens, spec.num_kv_heads, spec.head_dim)
        if self.q_norm is None:  # rotate q and k together: one set of ops for both
            qk = qkv[:, : q_size + kv_size].view(
                num_tokens, spec.num_heads + spec.num_kv_heads, spec.head_dim
            )
            qk = apply_rotary(qk, rows)  # [T, heads + kv_heads, head_dim]
            q, k = qk[:, : spec.num_heads], qk[:, spec.num_heads :]
        else:
            q = self.q_norm(qkv[:, :q_size].view(num_tokens, spec.num_heads, spec.head_dim))
            k = self.k_norm(
                qkv[:, q_size : q_size + kv_size].view(num_tokens, spec.num_kv_heads, spec.head_dim)
            )
            q, k = apply_rotary(q, rows), apply_rotary(k, rows)
        out = paged_attention(
            spec.layer_idx, q, k, v, meta, spec.scaling, spec.sliding_window, spec.softcap
        )  # [T, heads, head_dim]
        return self.o_proj(out.reshape(num_tokens, q_size))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.mlp_after(self.gate_up_proj(x))

    def mlp_after(self, gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2 * intermediate] -> [T, hidden]
        """The MLP after its gate/up projection."""
        return self.down_proj(act_mul(gate_up, self.act, self._act_code))


class PreNormLayer(DecoderLayer):
    """Llama's order: ``x += attention(norm(x)); x += mlp(norm(x))``."""

    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm

    def forward(self, hidden, residual, rows, meta):
        # each norm and the projection after it: one kernel where `project_normed` can fuse them
        qkv, x = project_normed(self.input_layernorm, self.qkv_proj, hidden, residual)  # x: the layer's input
        gate_up, x = project_normed(
            self.post_attention_layernorm, self.gate_up_proj, self.attend(qkv, rows, meta), x
        )
        return self.mlp_after(gate_up), x


class SandwichNormLayer(DecoderLayer):
    """Gemma's order: ``x += norm(attention(norm(x))); x += norm(mlp(norm(x)))``."""

    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm
    pre_feedforward_layernorm: RMSNorm
    post_feedforward_layernorm: RMSNorm

    def forward(self, hidden, residual, rows, meta):
        qkv, x = project_normed(self.input_layernorm, self.qkv_proj, hidden, residual)  # x: the layer's input
        attended = self.post_attention_layernorm(self.attend(qkv, rows, meta))
        gate_up, x = project_normed(self.pre_feedforward_layernorm, self.gate_up_proj, attended, x)
        return self.post_feedforward_layernorm(self.mlp_after(gate_up)), x
