"""``quantization:`` — replace a loaded model's linear layers by weight-only quantized ones, in place.

- ``int8``: every ``nn.Linear`` (the LM head included) as int8 per output channel.
- ``int4``: every ``nn.Linear`` as int4 in groups of 32 (asymmetric min/max, GGUF's Q4_1 rule) but the
  LM head, which takes int8 (a 4-bit SmolLM2 head kept 86% top-1 agreement with the float32 model on
  20 chat prompts and no greedy output); a layer whose shape the int4 kernels cannot hold takes int8
  too, and the report says how many did.
- ``gguf``: the file's own codes where a kernel layout holds them — Q4_0 / Q4_1 / Q4_K linear weights
  become int4 with a scale and an offset per 32 weights (exact; Q4_K's rounded to float16 in the
  kernels' tiles), Q5_0, Q6_K and Q8_0 int8 blocks, and Q5_1 and Q5_K int8 blocks with an offset per
  32, where int8_dot runs (exact; `gguf_weights.py` has the layouts) — and the rest dequantized (as
  transformers converts them).
  Torch has no kernel for Q8_0's one scale per 32 values (18 int8 calls of 32 columns each, summed,
  took 3.8 ms for SmolLM2's head against 4.75 dense), so without int8_dot SmolLM2's Q8_0 token
  embedding stays dense and the LM head tied to it is run
  - in float32 (and float64): dense, dequantized: `gguf` in float32 is the file's model exactly
    (`tests/model/test_gguf_quantization_smollm2.py`); requantized per row, top-1 agreement with the file
    fell to 97.9% and 1 of 6 greedy chat outputs stayed the same, so float32 keeps the file's values;
  - in bfloat16 and float16: int8 with one scale per output row, requantized from the file's values,
    so no longer the file's own. A dense bfloat16 head already rounds every weight to 8 significant
    bits (top-1 96.1% against the file on the same prompts); the per-row int8 head measured 95.4%, and
    reads half the bytes: 2.9 ms instead of 4.75 per batch-1 step, a tenth of the whole step.

  Where specexec's int8_dot kernel runs (``quantized_kernel`` auto or int8_dot, on a CPU where the C++
  kernels load, in float32, bfloat16 or float16), a Q8_0 layer instead keeps the file's codes and block
  scales exactly (`q8_block_linear.Int8BlockLinear`) in every dtype, and runs on it; the token
  embedding then looks its rows up in those codes (the tied head's, else its own where its type has an
  int8-block layout: `quantized_embedding.py`) instead of holding a dense table.

After quantization the dense weights' memory goes back to the system (`release_memory.py`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..cpu_kernels import fused_ops_take
from ..packed_linear import unpack_linears
from .auto_scheme import QUANTIZATION_SETTINGS, QUANTIZATIONS
from .gguf_sources import dense, source_of
from .gguf_weights import INT4_TYPES, INT8_BLOCK_TYPES, GGUFFile, match_rows
from .q8_block_linear import Int8BlockLinear
from .quantized_dot import BLOCK, TILE
from .quantized_embedding import QuantizedEmbedding
from .quantized_linear import (
    Int4WeightOnlyLinear,
    Int4Weights,
    Int8WeightOnlyLinear,
    QuantizationError,
    WeightOnlyLinear,
    check_kernel,
    fits_int4,
    kernel_scheme,
    linear_shape,
)
from .release_memory import own_mapped_tensors, trim_freed_heap

logger = logging.getLogger("specexec")


@dataclass(slots=True)
class QuantizationReport:
    scheme: str
    #: form -> number of the checkpoint's linear layers, e.g. "Q4_1 -> int4" (a fused QKV counts three)
    layers: Counter = field(default_factory=Counter)
    weight_bytes: int = 0  #: bytes of the model's parameters and buffers after quantization

    def summary(self) -> str:
        forms = ", ".join(f"{n} {form}" for form, n in sorted(self.layers.items()))
        return f"quantization {self.scheme}: {forms}; weights {self.weight_bytes / 2**20:.0f} MiB"


def check_quantization(value) -> None:
    if value is not None and value not in QUANTIZATION_SETTINGS:
        raise ValueError(
            f"config key 'quantization': got {value!r}; allowed: {', '.join(QUANTIZATION_SETTINGS)} (or null)"
        )


def quantize_model(
    model: nn.Module, scheme: str, gguf_path: str | Path | None = None, quantized_kernel: str = "torch"
) -> QuantizationReport:
    """Quantize ``model``'s linear layers in place (see the module docstring); ``gguf_path``: the file
    the model was converted from (``gguf`` only); ``quantized_kernel``: the config key (not ``torch``:
    a GGUF's Q8_0 layers keep their blocks where the int8_dot kernel runs)."""
    if scheme not in QUANTIZATIONS:
        raise ValueError(f"quantize_model: scheme {scheme!r}; allowed: {', '.join(QUANTIZATIONS)}")
    unpack_linears(model)  # a module an earlier executor packed for oneDNN (`packed_linear.py`)
    for device, dtype in {(m.weight.device, m.weight.dtype) for *_, m in _linears(model)}:
        check_kernel(kernel_scheme(scheme), device, dtype)
    report = QuantizationReport(scheme)
    if scheme == "gguf":
        if gguf_path is None:
            raise QuantizationError(
                "quantization 'gguf' keeps a GGUF file's own codes and needs a .gguf model; "
                "for a Hugging Face directory use int8 or int4"
            )
        _install_gguf(model, GGUFFile(gguf_path), report, quantized_kernel != "torch")
    else:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        for name, parent, child_name, linear in _linears(model):
            count = len(_checkpoint_names(name, parent, child_name))
            if scheme == "int4" and linear is head:
                _replace(parent, child_name, Int8WeightOnlyLinear(linear), report, "int8 (the LM head)")
            elif scheme == "int4" and fits_int4(linear):
                _replace(parent, child_name, Int4WeightOnlyLinear(linear), report, "int4", count)
            else:
                form = "int8" if scheme == "int8" else "int8 (shape not int4-able)"
                _replace(parent, child_name, Int8WeightOnlyLinear(linear), report, form, count)
    own_mapped_tensors(model)  # the dense weights' file mapping goes with them (`release_memory.py`)
    trim_freed_heap()
    report.weight_bytes = _weight_bytes(model)
    logger.info("%s", report.summary())
    return report


def dequantize_model(model: nn.Module) -> nn.Module:
    """Replace quantized layers by dense ``nn.Linear`` ones holding their dequantized weights, in place
    (to quantize a quantized model again under another scheme); packed layers are unpacked too."""
    unpack_linears(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, WeightOnlyLinear):
                dense = nn.Linear(child.in_features, child.out_features, bias=False, device="meta")
                dense.weight = nn.Parameter(child.dequantized(child.weight_dtype), requires_grad=False)
                dense.bias = child.bias
                setattr(parent, name, dense)
    return model


def _install_gguf(model: nn.Module, file: GGUFFile, report: QuantizationReport, int8_dot: bool) -> None:
    embedding = model.get_input_embeddings()
    for name, parent, child_name, linear in _linears(model):
        sources = _checkpoint_names(name, parent, child_name)
        tensors = [file.tensor_for(source) for source in sources]
        if tensors == [None] and linear.weight is getattr(embedding, "weight", None):
            tensors = [file.tensor_for(_module_name(model, embedding))]  # a head tied to the embedding
        types = {t.type_name if t is not None else "unmatched" for t in tensors}
        codes = (
            _stored_codes(tensors, linear.weight) if types <= set(INT4_TYPES) and fits_int4(linear) else None
        )
        if codes is not None and _float16_holds(codes):
            layer = Int4WeightOnlyLinear(linear, codes)
            form = "int4 (exact)" if "Q4_K" not in types else "int4 (Q4_K scales to float16 in the kernels)"
            _replace(parent, child_name, layer, report, f"{'/'.join(sorted(types))} -> {form}", len(sources))
        elif types <= set(INT8_BLOCK_TYPES) | set(INT4_TYPES) and int8_dot and _int8_dot_runs(linear):
            # (4-bit codes here: a fused layer mixing them with int8-block types, as a Q4_K_M file's q/k/v
            # where attn_v is Q6_K, or a layer the int4 tiles cannot hold; 8 bits a code, not dense)
            layer = Int8BlockLinear(linear, *_stored_int8_blocks(tensors, linear.weight))
            layer.tied_to_embedding = linear.weight is getattr(embedding, "weight", None)
            form = f"{'/'.join(sorted(types))} -> int8 blocks (exact)"
            _replace(parent, child_name, layer, report, form, len(sources))
        elif types == {"Q8_0"} and linear.weight.element_size() == 2:
            if source_of(linear.weight) is not None:  # requantized per row from the values
                linear.weight = nn.Parameter(dense(linear.weight), requires_grad=False)
            _replace(
                parent, child_name, Int8WeightOnlyLinear(linear), report, "Q8_0 -> int8 per row", len(sources)
            )
        else:
            for tensor in tensors:
                report.layers[f"{tensor.type_name if tensor else 'unmatched'} -> dense"] += 1
    if int8_dot and isinstance(embedding, nn.Embedding):
        _embedding_from_codes(model, embedding, file, report)


def _embedding_from_codes(model: nn.Module, embedding: nn.Embedding, file: GGUFFile, report) -> None:
    """The token embedding looked up from codes (`quantized_embedding.py`) instead of a dense table: the
    tied LM head's int8 blocks where it has them, else the embedding's own codes where they are an
    int8-block or 4-bit type the int8_dot tiles hold (each row dequantized exactly as the dense table
    held it). Anything else stays dense."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tensor = file.tensor_for(_module_name(model, embedding))
    if isinstance(head, Int8BlockLinear) and head.tied_to_embedding:
        model.set_input_embeddings(QuantizedEmbedding(embedding, head, shared=True))
        type_name = tensor.type_name if tensor is not None else "unmatched"
        report.layers[f"{type_name} token embedding -> the LM head's int8 blocks"] += 1
        return
    weight = embedding.weight  # [vocab, hidden]: the table as a layer's [out, in]
    as_linear = linear_shape(weight.shape[1], weight.shape[0], None, weight.device, weight.dtype)
    if (
        tensor is None
        or tensor.type_name not in {*INT8_BLOCK_TYPES, *INT4_TYPES}
        or not _int8_dot_runs(as_linear)
    ):
        return
    table = Int8BlockLinear(as_linear, *_stored_int8_blocks([tensor], weight))
    model.set_input_embeddings(QuantizedEmbedding(embedding, table, shared=False))
    report.layers[f"{tensor.type_name} token embedding -> int8 blocks (exact)"] += 1


def _stored_codes(tensors: list, weight) -> Int4Weights:
    """The file's 4-bit codes, scales and offsets of ``tensors`` (`_stacked`)."""

    def decode(tensor):
        codes = tensor.decode()
        return codes.dequantize, codes.q, codes.scale, codes.offset

    return Int4Weights(*_stacked(tensors, weight, decode), BLOCK)


def _float16_holds(codes: Int4Weights) -> bool:
    """Whether the kernels' float16 tiles hold these scales and offsets (a Q4_K file's d * scale can
    exceed float16's range in principle; such a layer stays dense)."""
    limit = torch.finfo(torch.float16).max
    return bool(codes.scale.abs().max() <= limit and codes.offset.abs().max() <= limit)


def _stored_int8_blocks(tensors: list, weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The file's int8-block codes [out, in], block scales [out, in / 32] and offsets [out, in / 32] of
    ``tensors`` (`_stacked`): scales [out, in / 16] when any is Q6_K (the others' each repeated for both
    halves), offsets None unless one has them (Q5_1, Q5_K and the 4-bit types; the others' then 0)."""
    per_half = any(tensor.type_name == "Q6_K" for tensor in tensors)
    with_offset = any(tensor.type_name in ("Q5_1", "Q5_K", *INT4_TYPES) for tensor in tensors)

    def decode(tensor):
        if tensor.type_name in INT4_TYPES:
            codes = tensor.decode()  # q in 0..15, q * scale + offset
            q, scale, offset = codes.q.to(torch.int8), codes.scale, codes.offset
        else:
            q, scale, offset = tensor.decode_int8_blocks()
        if per_half and scale.shape[1] * BLOCK == q.shape[1]:
            scale = scale.repeat_interleave(2, dim=1)

        def dequantize() -> torch.Tensor:  # [rows, in]
            dequantized = q.float() * scale.repeat_interleave(q.shape[1] // scale.shape[1], dim=1)
            if offset is not None:  # q * scale + offset: gguf-py's rounding, so the rows match exactly
                dequantized = dequantized + offset.repeat_interleave(BLOCK, dim=1)
            return dequantized

        if not with_offset:
            return dequantize, q, scale
        return (
            dequantize,
            q,
            scale,
            torch.zeros(q.shape[0], q.shape[1] // BLOCK) if offset is None else offset,
        )

    q, scale, *offset = _stacked(tensors, weight, decode)
    return q, scale, offset[0] if offset else None


def _stacked(tensors: list, weight, decode) -> tuple[torch.Tensor, ...]:
    """What ``decode(tensor)`` stores of each of ``tensors`` (after a function giving its dequantized
    weights [rows, in]; the first stored tensor has one row per weight row), stacked in row order, each
    tensor's rows reordered onto the converted ``weight``'s rows [out, in] (a fused layer holds several
    tensors one after another). A weight the conversion cache left in the file knows its orders, so its
    tensors are not dequantized to find them."""
    source = source_of(weight)
    parts, start = [], 0
    for tensor in tensors:
        dequantize, *stored = decode(tensor)
        rows = slice(start, start + stored[0].shape[0])
        order = (
            source.order_of(tensor.name) if source else match_rows(dequantize(), weight[rows], tensor.name)
        )
        parts.append([part[order] for part in stored])
        start = rows.stop
    return tuple(torch.cat(column) for column in zip(*parts))


def _int8_dot_runs(linear: nn.Linear) -> bool:
    """Whether the int8_dot kernels can run this layer: inputs in blocks of 32, outputs in tiles of 8, on
    the C++ ops' device and dtypes, once they have loaded."""
    return (
        linear.in_features % BLOCK == 0 and linear.out_features % TILE == 0 and fused_ops_take(linear.weight)
    )


def _checkpoint_names(name: str, parent: nn.Module, child_name: str) -> tuple[str, ...]:
    """The checkpoint's module names a linear layer holds: its own, or, for a fused layer of the own
    decoder (``parent.checkpoint_names``), those of the layers fused into it, in row order."""
    fused = getattr(parent, "checkpoint_names", {}).get(child_name)
    if fused is None:
        return (name,)
    prefix = name.rsplit(".", 1)[0]
    return tuple(f"{prefix}.{source}" for source in fused)


def _linears(model: nn.Module):
    """(module name, parent, attribute, layer) for every ``nn.Linear``, listed before any is replaced."""
    found = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            if type(child) is nn.Linear:
                found.append((f"{parent_name}.{child_name}".lstrip("."), parent, child_name, child))
    return found


def _replace(
    parent: nn.Module, name: str, layer: nn.Module, report: QuantizationReport, form: str, count: int = 1
) -> None:
    """``count``: the checkpoint's layers it holds (a fused one holds several), as the report counts."""
    setattr(parent, name, layer)
    report.layers[form] += count


def _module_name(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def _weight_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total
