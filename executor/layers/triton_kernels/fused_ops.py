"""The own decoder's small fused ops on CUDA as Triton kernels, each one launch where torch takes two to
six, with the numbers of the torch ops they replace (float32 inside, rounded where torch rounds):

- `add_rms_norm`: ``total = x + residual`` (rounded to the dtype), then RMSNorm of ``total`` times the
  weight (Gemma's ``1 + weight`` with ``unit_offset``), one program a row;
- `rotary_kv_write`: RoPE on a fused QKV output's q and k heads (``x * cos`` rounded, plus the halves
  swapped times the signed sin), the rotated keys and the values written into the paged pool at their
  slots; returns the rotated queries. One program a (token, head);
- `act_mul`: ``act(gate) * up`` over a fused gate/up output (SiLU or tanh-GELU, rounded, then the
  product), one program a (token, block of columns).

`../fused_ops.py` takes them for CUDA tensors (`triton_ops_take`, `__init__.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SILU, GELU_TANH = 0, 1  #: the activation codes (`activation.FUSED_ACTIVATIONS`)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, total_ptr, dim, eps, offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * dim + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(total_ptr + row * dim + cols, x, mask=mask)
    t = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(t * t, axis=0) / dim + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + offset
    tl.store(out_ptr + row * dim + cols, (t * rstd * w).to(x.dtype), mask=mask)


def add_rms_norm(
    x: torch.Tensor,  # [T, dim]
    residual: torch.Tensor | None,  # [T, dim] (None: no add)
    weight: torch.Tensor,  # [dim]
    eps: float,
    unit_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # (norm(residual + x), residual + x), [T, dim] each
    x = x.contiguous()
    rows, dim = x.shape
    out = torch.empty_like(x)
    total = x if residual is None else torch.empty_like(x)
    res = x if residual is None else residual.contiguous()
    if rows == 0:
        return out, total
    _add_rms_norm_kernel[(rows,)](
        x, res, weight, out, total, dim, eps, 1.0 if unit_offset else 0.0,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(dim), num_warps=4,
    )  # fmt: skip
    return out, total


@triton.jit
def _rotary_kv_write_kernel(
    qkv_ptr, rows_ptr, kv_ptr, slots_ptr, q_ptr,
    qkv_stride, kv_stride_side, kv_stride_slot,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    half: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, BLOCK)
    mask = d < HEAD_DIM
    swapped = tl.where(d < half, d + half, d - half)
    base = qkv_ptr + token * qkv_stride + head * HEAD_DIM
    x = tl.load(base + d, mask=mask, other=0.0)
    xs = tl.load(base + swapped, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(rows_ptr + token * 2 * HEAD_DIM + d, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(rows_ptr + token * 2 * HEAD_DIM + HEAD_DIM + d, mask=mask, other=0.0).to(tl.float32)
    first = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)  # torch rounds x * cos first
    rotated = (first + xs * sin).to(x.dtype)
    if head < NUM_HEADS:
        tl.store(q_ptr + (token * NUM_HEADS + head) * HEAD_DIM + d, rotated, mask=mask)
    else:
        kv_head = head - NUM_HEADS
        slot = tl.load(slots_ptr + token).to(tl.int64)
        at = kv_ptr + slot * kv_stride_slot + kv_head * HEAD_DIM + d
        tl.store(at, rotated, mask=mask)
        value = tl.load(base + NUM_KV_HEADS * HEAD_DIM + d, mask=mask, other=0.0)
        tl.store(at + kv_stride_side, value, mask=mask)


def rotary_kv_write(
    qkv: torch.Tensor,  # [T, (heads + 2 * kv_heads) * head_dim]
    rows: torch.Tensor,  # [T, 2, 1, head_dim] `RotaryTable.rows`
    kv: torch.Tensor,  # [2, slots, kv_heads, head_dim] one layer's pool
    slots: torch.Tensor,  # [T]
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:  # [T, heads, head_dim] the rotated queries
    if qkv.stride(-1) != 1 or kv.stride(-1) != 1 or kv.stride(-2) != head_dim:
        raise ValueError("rotary_kv_write: qkv rows and the pool's heads must be contiguous")
    num_tokens = qkv.shape[0]
    rows = rows.contiguous()
    q = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q
    _rotary_kv_write_kernel[(num_tokens, num_heads + num_kv_heads)](
        qkv, rows, kv, slots, q, qkv.stride(0), kv.stride(0), kv.stride(1),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK=triton.next_power_of_2(head_dim), num_warps=1,
    )  # fmt: skip
    return q


@triton.jit
def _act_mul_kernel(gate_up_ptr, out_ptr, width, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_up_ptr + row * 2 * width + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * 2 * width + width + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if ACT == 0:  # SiLU
        a = g / (1.0 + tl.exp(-g))
    else:  # GELU, tanh approximation: 0.5 g (1 + tanh(u)) = g * sigmoid(2u)
        u = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = g / (1.0 + tl.exp(-2.0 * u))
    a = a.to(gate.dtype).to(tl.float32)  # torch rounds the activation before the product
    tl.store(out_ptr + row * width + cols, (a * up.to(tl.float32)).to(gate.dtype), mask=mask)


def act_mul(gate_up: torch.Tensor, code: int) -> torch.Tensor:  # [T, 2 * width] -> [T, width]
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, width, dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(width))
    _act_mul_kernel[(rows, triton.cdiv(width, block))](
        gate_up, out, width, ACT=code, BLOCK=block, num_warps=4
    )
    return out
