"""A pre-norm layer's whole forward as one C++ op on the CPU (``prenorm_layer``, built from
`executor/layers/prenorm_layer_cpu.cpp`): the ops `PreNormLayer.forward` calls, in the same order on
the same tensors, with no Python between them. The output is the Python layer's, bit for bit
(`tests/layers/test_fused_layer.py`); what it saves is the Python (about 90 us a layer on the 2-core EPYC).

It runs where every piece of the layer is one of the C++ ops or one kernel call:
- the step (`FusedStep.of`): on the CPU, in float32, bfloat16 or float16, with the C++ ops loaded, one
  short-query attention group holding every request (decode and verify rows, any mix of query lengths),
  attended by the C++ paged kernel (the measured path for those rows);
- the layer (`PreNormLayer` without q/k norms, RMSNorm without Gemma's offset, an activation the C++
  op has): Llama, Mistral and Qwen2;
- each linear layer: dense ``nn.Linear``, a quantized layer whose call for this many rows is one kernel
  (`WeightOnlyLinear.fused_call`), or a layer packed for oneDNN (``cpu_linear``) unless this many rows
  run on MKL's packed GEMM.
Elsewhere the Python layer runs. A layer's arguments are built once per (rows, dtype) and kept while its
linear layers and their routing stay the same objects and settings.

Where every layer of the decoder runs so and they share their attention settings and rotary table, the
whole stack is one op (``prenorm_stack``, `fused_stack`): one call a forward instead of one a layer,
the layers' hidden states recorded inside it where a drafter asks for them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ...layers.cpu_kernels import FUSED_DTYPES, cpu_kernels
from ...layers.packed_linear import PackedLinear
from ...layers.quantized.quantized_linear import DENSE, ONEDNN
from ..attention_metadata import AttentionMetadata
from ..paged_attention import attends_in_place, group_path
from .layers import PreNormLayer

LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
#: each layer's arguments per (rows, dtype), and each layer list's stack: beside the modules, not on them,
#: so a copied or pickled model carries none (oneDNN's packed weights cannot be copied)
_LAYER_ARGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STACK_ARGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True)
class FusedStep:
    """What every layer's op shares in one forward: the group's pages and positions, and where its
    queries are not the batch's rows in order (requests with different query lengths), how to lay them
    out: the padded group's rows are ``query_index``'s rows of the batch, and the batch's rows are the
    group output's ``valid_rows``."""

    slots: torch.Tensor  # [T]
    block_tables: torch.Tensor  # [G, max_blocks]
    query_pos: torch.Tensor  # [G, Q]
    kv_lens: torch.Tensor  # [G]
    block_size: int
    query_index: torch.Tensor | None  # [G * Q] (padding: row 0); None: the batch's rows are the group's
    valid_rows: torch.Tensor | None  # [T]; None likewise
    tree_bits: torch.Tensor | None  # [G, Q] a step verifying token trees (`AttentionGroup.tree_bits`)

    @classmethod
    def of(cls, meta: AttentionMetadata, hidden: torch.Tensor) -> FusedStep | None:
        """The step's shared arguments, or None where the layers cannot run as one op: they can where
        one short-query group holds every request (`attention_metadata.group_sequences`)."""
        if hidden.device.type != "cpu" or hidden.dtype not in FUSED_DTYPES or cpu_kernels() is None:
            return None
        if len(meta.groups) != 1 or not meta.groups[0].is_short:
            return None
        group = meta.groups[0]
        if not attends_in_place(group_path(group, meta), group, hidden):
            return None
        in_order = meta.is_single_view  # else its rows are gathered and the output's picked
        return cls(
            meta.slots,
            group.block_tables,
            group.query_pos[..., 0],
            group.kv_lens,
            meta.kv_cache.block_size,
            None if in_order else group.query_index.view(-1),
            None if in_order else group.valid_rows,
            group.tree_bits,
        )


def linear_call(module: nn.Module, rows: int, dtype: torch.dtype) -> tuple[int, list[torch.Tensor]] | None:
    """One linear layer's call for the op: (kind, tensors, the bias last), or None."""
    if type(module) is nn.Linear:
        if module.weight.dtype != dtype:
            return None
        return DENSE, [module.weight] if module.bias is None else [module.weight, module.bias]
    if type(module) is PackedLinear:
        return _packed_call(module, rows, dtype)
    fused_call = getattr(module, "fused_call", None)
    return None if fused_call is None else fused_call(rows, dtype)


class FusedLayerArgs:
    """A layer's weights and settings as the op takes them, for one (rows, dtype); `still_valid` checks
    that the layer's linear layers are the same objects with the same int8_dot routing."""

    def __init__(self, layer: nn.Module, calls: list[tuple[int, list[torch.Tensor]]]) -> None:
        spec = layer.spec
        self.signature = _linears_and_routing([layer])  #: its linear layers and their routing, as built
        self.weights = (
            layer.input_layernorm.weight,
            layer.input_layernorm.eps,
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.eps,
            [kind for kind, _ in calls],
            *(tensors for _, tensors in calls),
        )
        self.attention = (spec.num_heads, spec.num_kv_heads, spec.head_dim)
        self.settings = (spec.scaling, spec.sliding_window or 0, spec.softcap or 0.0, layer._act_code)

    def still_valid(self, layer: nn.Module) -> bool:
        return _linears_and_routing([layer]) == self.signature


def _linears_and_routing(layers) -> tuple[list[nn.Module], list]:
    """The layers' linear modules (four a layer) and their int8_dot routing, the arguments' signature:
    checked every step, so two flat comprehensions and no nn.Module attribute lookups (17 us for
    SmolLM2's 30 layers, against 62 as a tuple per layer)."""
    linears = [layer._modules[name] for layer in layers for name in LINEARS]
    return linears, [m.__dict__.get("int8_dot_rows") for m in linears]


def fused_args(layer: nn.Module, rows: int, dtype: torch.dtype) -> FusedLayerArgs | None:
    """The layer's arguments for ``rows`` rows in ``dtype`` (kept for the layer), or None where it must
    run in Python (see the module docstring)."""
    cache = _LAYER_ARGS.setdefault(layer, {})
    args = cache.get((rows, dtype), False)
    if args is not False and (args is None or args.still_valid(layer)):
        return args
    args = None
    if _layer_fits(layer):
        calls = [linear_call(getattr(layer, name), rows, dtype) for name in LINEARS]
        if all(call is not None for call in calls):
            args = FusedLayerArgs(layer, calls)
    cache[(rows, dtype)] = args
    return args


def _layer_fits(layer: nn.Module) -> bool:
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    return (
        type(layer) is PreNormLayer
        and layer.q_norm is None
        and layer._act_code is not None
        and all(n is not None and not n.unit_offset for n in norms)
    )


def run_fused(
    layer: nn.Module,
    args: FusedLayerArgs,
    hidden: torch.Tensor,  # [T, hidden]
    residual: torch.Tensor | None,  # [T, hidden]
    rotary_rows: torch.Tensor,  # [T, 2, 1, head_dim]
    meta: AttentionMetadata,
    step: FusedStep,
) -> tuple[torch.Tensor, torch.Tensor]:  # (the layer's output, its input): as `PreNormLayer.forward`
    return cpu_kernels().prenorm_layer(
        hidden,
        residual,
        *args.weights,
        rotary_rows,
        meta.kv_cache.kv[layer.spec.layer_idx],
        *_step_args(args.attention, args.settings, step),
    )


class FusedStackArgs:
    """Every layer's `FusedLayerArgs` flattened as ``prenorm_stack`` takes them; `still_valid` checks all
    the layers' linear modules and routing in one pass (a step's only check while nothing changed)."""

    def __init__(self, layers: list[nn.Module], args: list[FusedLayerArgs]) -> None:
        self.args = args  #: each layer's, to see whether one was rebuilt
        self.signature = _linears_and_routing(layers)  #: every layer's, as `FusedLayerArgs` took them
        self.norms = [t for a in args for t in (a.weights[0], a.weights[2])]
        self.eps = [e for a in args for e in (a.weights[1], a.weights[3])]
        self.kinds = [k for a in args for k in a.weights[4]]
        calls = [tensors for a in args for tensors in a.weights[5:]]  # four a layer
        self.counts = [len(tensors) for tensors in calls]
        self.tensors = [t for tensors in calls for t in tensors]
        self.layer_idx = [layer.spec.layer_idx for layer in layers]
        self.attention, self.settings = args[0].attention, args[0].settings
        self.rotary = layers[0].spec.rotary  #: the rotary table every layer uses

    def still_valid(self, layers: nn.ModuleList) -> bool:
        return _linears_and_routing(layers._modules.values()) == self.signature


def fused_stack(layers: nn.ModuleList, rows: int, dtype: torch.dtype) -> FusedStackArgs | None:
    """The whole stack's arguments for ``rows`` rows in ``dtype`` (kept for the layer list), or None where
    a layer must run in Python or the layers differ in attention settings or rotary table."""
    cache = _STACK_ARGS.setdefault(layers, {})
    stack = cache.get((rows, dtype), False)
    if stack and len(stack.args) == len(layers) and stack.still_valid(layers):
        return stack  # (the usual step: one check over every layer, no per-layer lookups)
    args = [fused_args(layer, rows, dtype) for layer in layers]
    if any(a is None for a in args):
        return None
    if stack is False or (stack is not None and any(x is not y for x, y in zip(stack.args, args))):
        shared = {(a.attention, a.settings, layer.spec.rotary) for a, layer in zip(args, layers)}
        stack = FusedStackArgs(list(layers), args) if len(shared) == 1 else None
        cache[(rows, dtype)] = stack
    return stack


def run_stack(
    stack: FusedStackArgs,
    hidden: torch.Tensor,  # [T, hidden]: the embeddings
    rotary_rows: torch.Tensor,  # [T, 2, 1, head_dim]
    meta: AttentionMetadata,
    step: FusedStep,
    capture: list[int],  # hidden-state indices to record, 1 <= index < layers
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:  # (last output, its input, the recorded states)
    return cpu_kernels().prenorm_stack(
        hidden,
        stack.norms,
        stack.eps,
        stack.kinds,
        stack.counts,
        stack.tensors,
        meta.kv_cache.kv,
        stack.layer_idx,
        rotary_rows,
        *_step_args(stack.attention, stack.settings, step),
        capture,
    )


def _step_args(attention: tuple, settings: tuple, step: FusedStep) -> tuple:
    """The arguments both ops take after the rotary rows, in their order: the pages, the heads, the
    attention settings, the activation and the group's row layout."""
    heads, kv_heads, head_dim = attention
    scaling, window, softcap, act = settings
    return (
        step.slots,
        heads,
        kv_heads,
        head_dim,
        step.block_tables,
        step.query_pos,
        step.kv_lens,
        step.block_size,
        scaling,
        window,
        softcap,
        act,
        step.query_index,
        step.valid_rows,
        step.tree_bits,
    )


def _packed_call(
    module: PackedLinear, rows: int, dtype: torch.dtype
) -> tuple[int, list[torch.Tensor]] | None:
    """The call `PackedLinear.forward` makes for ``rows`` rows: oneDNN on the packed weight, or the BLAS on
    the dense one where its row bands say so; None for MKL's packed GEMM (not a call the op makes)."""
    if module.dtype != dtype or rows == module.mkl_rows:
        return None
    bias = [] if module.bias is None else [module.bias]
    if module.bands is not None and not module.bands.uses_onednn(rows):
        return DENSE, [module.dense_weight, *bias]
    return ONEDNN, [module.packed, *bias]
