"""Weight-only quantized linear layers: int8 per output channel, int4 in groups of 32.

Both keep the quantized weights and their scales; the activations stay in the model's dtype and the
matmul is one of torch's own kernels, which read a quarter (int8) or an eighth (int4) of the float32
weight bytes:

- int8: ``torch._weight_int8pack_mm(x, weight_int8 [out, in], scale [out])`` = x @ (q * scale)^T.
- int4: ``_weight_int4pack_mm_for_cpu`` (CPU) / ``_weight_int4pack_mm`` (CUDA, tinygemm) compute each
  weight as (q - 8) * scale + zero per group of ``group_size`` input features, q in 0..15. A weight
  stored as q * d + m (GGUF's Q4_1, and `Int4Weights.quantize`'s asymmetric min/max) therefore maps
  exactly onto scale = d, zero = m + 8d.

The kernels take float32, bfloat16 and float16 activations on CPU (bfloat16 is their fast path on the
CPUs measured here; float32 is exact against the stored weights), bfloat16 for int4 on CUDA. float64
(the tests) multiplies by the dequantized weights, built once: the same values, no kernel. On a device
whose kernel fails its start-up self-test, `check_kernel` refuses with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .int4_layout import GROUP_SIZE, cpu_layout_is_known, pack_int4, unpack_cpu_layout, unpack_int4
from .quantized_dot import (
    BLOCK,
    MAX_ROWS,
    TILE,
    pack_q4,
    pack_q8,
    q4_linear,
    q8_linear,
    unpack_q4_codes,
    unpack_q4_scales,
)

INT4_ROWS_MULTIPLE = 16  #: the CPU int4 packing needs the output features in multiples of this
CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CUDA_KERNEL_DTYPES = {"int8": (torch.float32, torch.bfloat16, torch.float16), "int4": (torch.bfloat16,)}
#: rows (tokens) from which a layer dequantizes its weights for one dense matmul instead of calling the
#: weight-only kernel: the kernels are built for few rows. One 1536x576 layer in bfloat16 on a 2-core
#: AVX512-BF16 EPYC, at 64 / 128 / 256 / 1300 rows: int4 kernel 0.69 / 1.37 / 3.07 / 14.0 ms, dequantize
#: (0.5 ms) + dense 0.90 / 1.33 / 1.64 / 6.5 ms (int8 crosses over earlier). Decode and verify rows of
#: small batches stay below it.
DENSE_FROM_ROWS = 128


#: what `WeightOnlyLinear.forward` computes for a call (`WeightOnlyLinear._route`)
DENSE_CACHED, INT8_DOT, DEQUANTIZED, TORCH_KERNEL = "dense", "int8_dot", "dequantized", "kernel"
#: the kinds of linear call `prenorm_layer_cpu.cpp` makes (see `WeightOnlyLinear.fused_call`; ONEDNN:
#: `packed_linear.PackedLinear`'s, built in `decoder/fused_layer.py`)
DENSE, Q4_INT8_DOT, Q8_INT8_DOT, TORCH_INT4, TORCH_INT8, ONEDNN, Q8_OFFSET_INT8_DOT = range(7)


class QuantizationError(ValueError):
    """No kernel for this scheme on this device and dtype, or a tensor that cannot be quantized."""


@dataclass(slots=True)
class Int4Weights:
    """4-bit codes with a scale and an offset per group: weight = q * scale + offset."""

    q: torch.Tensor  # [out, in] uint8 in 0..15
    scale: torch.Tensor  # [out, in / group] float32
    offset: torch.Tensor  # [out, in / group] float32
    group_size: int = GROUP_SIZE

    @classmethod
    def quantize(cls, weight: torch.Tensor, group_size: int = GROUP_SIZE) -> Int4Weights:
        """Asymmetric min/max per group (GGUF's Q4_1 rule): scale = (max - min) / 15, offset = min."""
        out_features, in_features = weight.shape
        groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, groups]
        scale = ((high - low) / 15).clamp(min=1e-12)
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
        return cls(q.reshape(out_features, in_features), scale, low, group_size)

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        out_features, in_features = self.q.shape
        groups = self.q.reshape(out_features, -1, self.group_size).float()
        return (groups * self.scale[..., None] + self.offset[..., None]).reshape(out_features, in_features)


def linear_shape(
    in_features: int, out_features: int, bias: torch.Tensor | None, device: torch.device, dtype: torch.dtype
) -> nn.Linear:
    """A dense layer's shape, bias, device and dtype without its weights (one zero, viewed at every
    position): what a quantized layer's constructor reads of the layer it replaces, for building one from
    codes it is given (a tensor-parallel shard's slices)."""
    linear = nn.Linear(in_features, out_features, bias=False, device="meta")
    nothing = torch.zeros((), dtype=dtype, device=device).expand(out_features, in_features)
    linear.weight = nn.Parameter(nothing, requires_grad=False)
    linear.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
    return linear


def fits_int4(linear: nn.Linear, group_size: int = GROUP_SIZE) -> bool:
    """Whether the int4 kernels can hold this layer's shape."""
    return linear.in_features % group_size == 0 and linear.out_features % INT4_ROWS_MULTIPLE == 0


class WeightOnlyLinear(nn.Module):
    """Shared by both schemes: bias, shapes, and the refusal to run on a device it was not packed for."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.packed_for = linear.weight.device.type  #: kernel layouts differ between CPU and CUDA
        self.weight_dtype = linear.weight.dtype  #: the dense layer's dtype (for `dequantize_model`)
        #: whether `dequantized` is cheap enough for prefill chunks (see DENSE_FROM_ROWS)
        self.can_dequantize_fast = True
        #: calls of up to this many rows run on the int8_dot kernels (`quantized_dot.py`; 0: none)
        self.int8_dot_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.device.type != self.packed_for:
            raise QuantizationError(
                f"quantized weights were packed for {self.packed_for} and cannot run on {x.device.type}; "
                "quantize after moving the model"
            )
        flat = x.reshape(-1, self.in_features)
        route = self._route(flat.shape[0], x.device.type, x.dtype)
        if route == DENSE_CACHED:
            out = F.linear(flat, self._dense(x.dtype))
        elif route == INT8_DOT:
            out = self._int8_dot(flat)
        elif route == DEQUANTIZED:
            out = F.linear(flat, self.dequantized(x.dtype))  # a prefill chunk: see DENSE_FROM_ROWS
        else:
            out = self._matmul(flat)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def without_int8_dot(self, flat: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out], no bias
        """What `forward` computes for ``flat`` on torch's side: its kernel, or from `DENSE_FROM_ROWS`
        rows the matmul on the dequantized weights (what ``quantized_kernel: auto`` times int8_dot
        against)."""
        if flat.shape[0] >= DENSE_FROM_ROWS and self.can_dequantize_fast:
            return F.linear(flat, self.dequantized(flat.dtype))
        return self._matmul(flat)

    def _dense(self, dtype: torch.dtype) -> torch.Tensor:  # [out, in], for dtypes without a kernel
        cache = self.__dict__.setdefault("_dense_weights", {})
        if dtype not in cache:
            cache[dtype] = self.dequantized(dtype)
        return cache[dtype]

    def _route(self, rows: int, device_type: str, dtype: torch.dtype) -> str:
        """What `forward` computes for ``rows`` rows on ``device_type`` in ``dtype``: the cached dense
        weights (no kernel for the dtype), int8_dot, the dequantized weights (a prefill chunk), or
        torch's kernel."""
        kernel_dtypes = CPU_KERNEL_DTYPES if device_type == "cpu" else CUDA_KERNEL_DTYPES[self.scheme]
        if dtype not in kernel_dtypes:
            return DENSE_CACHED
        if rows <= self.int8_dot_rows:
            return INT8_DOT
        if rows >= DENSE_FROM_ROWS and self.can_dequantize_fast:
            return DEQUANTIZED
        return TORCH_KERNEL

    def fused_call(self, rows: int, dtype: torch.dtype) -> tuple[int, list[torch.Tensor]] | None:
        """The kernel call `forward` makes for ``rows`` rows in ``dtype``, as a kind and its tensors (the
        bias last) for the C++ layer op (`decoder/fused_layer.py`); None where it is not one such call
        (another device, dense weights)."""
        if self.packed_for != "cpu":
            return None
        route = self._route(rows, "cpu", dtype)
        if route == INT8_DOT:
            call = self._int8_dot_call()
        elif route == TORCH_KERNEL:
            call = self._torch_call(dtype)
        else:
            return None
        if call is None:
            return None
        kind, tensors = call
        return kind, tensors if self.bias is None else [*tensors, self.bias]

    def takes_int8_dot(self) -> bool:
        """Whether the int8_dot kernels can run this layer: on the CPU, inputs in blocks of 32, outputs in
        tiles of 8."""
        return self.packed_for == "cpu" and self.in_features % BLOCK == 0 and self.out_features % TILE == 0

    def set_int8_dot_rows(self, rows: int) -> None:
        """Calls of up to ``rows`` rows take the int8_dot kernel (0: none; the kernel's copies dropped)."""
        self.int8_dot_rows = rows if self.takes_int8_dot() else 0

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}"


class Int8WeightOnlyLinear(WeightOnlyLinear):
    """Symmetric int8 per output channel: weight = q * scale, q in -127..127."""

    scheme = "int8"

    def __init__(self, linear: nn.Linear, codes: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``codes``: the int8 weights [out, in] and their scales [out] as given (else ``linear``'s
        weights quantized)."""
        super().__init__(linear)
        if codes is None:
            weight = linear.weight.detach().float()  # [out, in]
            scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
            codes = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8), scale
        self.register_buffer("weight_int8", codes[0])  # [out, in] int8
        self.register_buffer("scale", codes[1])  # [out] float32
        self._scales: dict[torch.dtype, torch.Tensor] = {}
        self._q8_tiles: torch.Tensor | None = (
            None  #: [out / 8, in / 32 * 256] `pack_q8`'s tiles, for int8_dot
        )

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:
        scale = self._scales.get(flat.dtype)
        if scale is None:
            scale = self._scales[flat.dtype] = self.scale.to(flat.dtype)
        return torch._weight_int8pack_mm(flat, self.weight_int8, scale)

    def set_int8_dot_rows(self, rows: int) -> None:
        super().set_int8_dot_rows(rows)
        if self.int8_dot_rows == 0:
            self._q8_tiles = None
        elif self._q8_tiles is None:
            self._q8_tiles = pack_q8(self.weight_int8)

    def _int8_dot(self, flat: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out]: the codes as stored
        return q8_linear(flat, self._q8_tiles, self.scale)

    def _int8_dot_call(self):
        return Q8_INT8_DOT, [self._q8_tiles, self.scale]

    def _torch_call(self, dtype: torch.dtype):
        if dtype not in self._scales:
            self._scales[dtype] = self.scale.to(dtype)
        return TORCH_INT8, [self.weight_int8, self._scales[dtype]]

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:  # [out, in]
        return self.weight_int8.to(dtype) * self.scale.to(dtype)[:, None]

    def codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What the constructor's ``codes`` takes: the int8 weights [out, in] and scales [out]."""
        return self.weight_int8, self.scale


class Int4WeightOnlyLinear(WeightOnlyLinear):
    """4-bit codes in groups along the input features, packed in the device kernel's layout."""

    scheme = "int4"

    def __init__(self, linear: nn.Linear, weights: Int4Weights | None = None) -> None:
        super().__init__(linear)
        weights = weights or Int4Weights.quantize(linear.weight)
        if weights.q.shape != (self.out_features, self.in_features) or not fits_int4(
            linear, weights.group_size
        ):
            raise QuantizationError(
                f"int4 needs in_features divisible by {weights.group_size} and out_features by "
                f"{INT4_ROWS_MULTIPLE}; got a {self.out_features}x{self.in_features} layer"
            )
        device = linear.weight.device
        self.group_size = weights.group_size
        self.register_buffer("packed", pack_int4(weights.q.to(device)))
        self.can_dequantize_fast = device.type == "cpu" and cpu_layout_is_known(self.out_features)
        self.register_buffer("scale", weights.scale.to(device))  # [out, groups] float32
        self.register_buffer("offset", weights.offset.to(device))  # [out, groups] float32
        self._scales_and_zeros: dict[torch.dtype, torch.Tensor] = {}
        self._q4_codes: torch.Tensor | None = (
            None  #: [out / 8, in / 32 * 160] `pack_q4`'s tiles, for int8_dot
        )

    def takes_int8_dot(self) -> bool:
        return super().takes_int8_dot() and self.group_size == BLOCK

    def set_int8_dot_rows(self, rows: int) -> None:
        """As the base class; where int8_dot then takes every call (``rows`` `MAX_ROWS`) on the CPU,
        torch's packed codes and kernel tables are dropped (the codes twice over otherwise: 4 bits a
        weight beside the tiles' 5), and so are the float32 scales and offsets where the tiles' float16
        hold them exactly (GGUF's Q4_0 and Q4_1: 2 bits a weight); all are made again from the tiles
        when torch's kernel or the dequantized weights are asked for."""
        super().set_int8_dot_rows(rows)
        if self.int8_dot_rows < MAX_ROWS:
            self._packed_codes()  # torch's kernel takes some calls: its codes are there before they come
        if self.int8_dot_rows == 0:
            self.scale, self.offset = self._scale_and_offset()  # before the tiles that may hold them go
            self._q4_codes = None
        elif self._q4_codes is None:
            self._q4_codes = pack_q4(self._unpacked_codes(), *self._scale_and_offset())
        if self.int8_dot_rows >= MAX_ROWS and self.packed_for == "cpu":
            self.packed = None
            self._scales_and_zeros.clear()
            scale, offset = self._scale_and_offset()
            if all(torch.equal(t.half().float(), t) for t in (scale, offset)):
                self.scale = self.offset = None  # the tiles' float16 are the same values

    def _scale_and_offset(self) -> tuple[torch.Tensor, torch.Tensor]:  # [out, groups] float32 each
        """The groups' scales and offsets (read from the int8_dot tiles' float16 where they were dropped)."""
        if self.scale is not None:
            return self.scale, self.offset
        return unpack_q4_scales(self._q4_codes)

    def _packed_codes(self) -> torch.Tensor:
        """torch's packed codes (packed again from the int8_dot tiles where they were dropped)."""
        if self.packed is None:
            self.packed = pack_int4(self._unpacked_codes())
        return self.packed

    def _int8_dot(self, flat: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out]
        return q4_linear(flat, self._q4_codes)

    def codes(self) -> Int4Weights:
        """The 4-bit codes, scales and offsets as held (what the constructor's ``weights`` takes)."""
        return Int4Weights(self._unpacked_codes(), *self._scale_and_offset(), self.group_size)

    def _unpacked_codes(self) -> torch.Tensor:  # [out, in] uint8
        if self.packed is None:  # dropped: int8_dot takes every call (`set_int8_dot_rows`)
            return unpack_q4_codes(self._q4_codes)
        if self.can_dequantize_fast:
            return unpack_cpu_layout(self.packed, self.out_features, self.in_features)
        return unpack_int4(self.packed, self.out_features, self.in_features)

    def _int8_dot_call(self):
        return Q4_INT8_DOT, [self._q4_codes]

    def _torch_call(self, dtype: torch.dtype):
        if self.group_size != GROUP_SIZE:  # the C++ layer op calls the kernel with groups of 32
            return None
        table = self._scales_and_zeros.get(dtype)
        if table is None:
            table = self._scales_and_zeros[dtype] = self.scales_and_zeros(dtype)
        return TORCH_INT4, [self._packed_codes(), table]

    def _matmul(self, flat: torch.Tensor) -> torch.Tensor:
        table = self._scales_and_zeros.get(flat.dtype)
        if table is None:
            table = self._scales_and_zeros[flat.dtype] = self.scales_and_zeros(flat.dtype)
        if flat.device.type == "cpu":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat, self._packed_codes(), self.group_size, table
            )
        return torch.ops.aten._weight_int4pack_mm(flat, self._packed_codes(), self.group_size, table)

    def scales_and_zeros(self, dtype: torch.dtype) -> torch.Tensor:  # [groups, out, 2]
        """The kernels' table: (q - 8) * scale + zero == q * scale + offset with zero = offset + 8 * scale."""
        scale, offset = self._scale_and_offset()
        zero = offset + 8 * scale
        return torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:  # [out, in]
        """q * scale + offset computed in ``dtype`` (float32: exactly the stored values, as the q * scale
        product is exact; bfloat16: scale and offset rounded first, as the kernel rounds them)."""
        q = self._unpacked_codes()
        scale, offset = (  # [out, in] each
            t.to(dtype).repeat_interleave(self.group_size, dim=1) for t in self._scale_and_offset()
        )
        return torch.addcmul(offset, q.to(dtype), scale)


def kernel_scheme(quantization: str | None) -> str | None:
    """The kernel a quantization's layers run on: a GGUF's Q4_1 codes run on int4's."""
    return "int4" if quantization == "gguf" else quantization


def check_kernel(scheme: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse (QuantizationError) where ``scheme`` has no working kernel for ``dtype`` on ``device``:
    a small layer is quantized there and its kernel output compared with the dequantized matmul."""
    if device.type == "cpu":
        return  # torch's CPU kernels exist for every build; other dtypes dequantize (see the docstring)
    if dtype not in CUDA_KERNEL_DTYPES[scheme]:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in CUDA_KERNEL_DTYPES[scheme])
        raise QuantizationError(
            f"quantization {scheme!r} on {device.type} runs in {allowed}; the model is "
            f"{str(dtype).removeprefix('torch.')} (set dtype accordingly)"
        )
    layer = nn.Linear(256, 64, bias=False, device=device, dtype=dtype)
    nn.init.normal_(layer.weight, std=0.02)
    try:
        quantized = QUANTIZED_LINEARS[scheme](layer)
        x = torch.randn(4, 256, device=device, dtype=dtype)
        got = quantized._matmul(x).float()
        want = F.linear(x, quantized.dequantized(dtype)).float()
        error = (got - want).abs().max().item()
    except (RuntimeError, NotImplementedError) as exc:
        raise QuantizationError(
            f"no {scheme} kernel on {device} in torch {torch.__version__}: {type(exc).__name__}: {exc}"
        ) from exc
    if not error <= 0.05 * want.abs().max().item() + 1e-3:
        raise QuantizationError(
            f"the {scheme} kernel on {device} disagrees with its dequantized weights (max error {error:.3g})"
        )


QUANTIZED_LINEARS: dict[str, type[WeightOnlyLinear]] = {
    "int8": Int8WeightOnlyLinear,
    "int4": Int4WeightOnlyLinear,
}
