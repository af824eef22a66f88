"""Turn a transformers Llama-family model into specexec's own decoder, in place.

Each decoder layer is replaced by a `PreNormLayer` or `SandwichNormLayer` holding the same weights:
q/k/v concatenated into one ``qkv_proj`` and gate/up into one ``gate_up_proj`` (plain ``nn.Linear``
layers, so quantization and oneDNN/MKL packing take the fused weights like any other linear layer), the
output and down projections as they were, the norms as `RMSNorm`. The final norm becomes an `RMSNorm`;
the embedding, the LM head and the config stay transformers' own, so ``model.config``,
``model.model.norm`` or ``model.lm_head`` read as before. The rotary tables are built from the model's
own rotary module and kept on the model (``model.model.rotary_tables``), so they move with it.

transformers' own forward no longer runs on a converted model; `forward.OwnDecoder` does. Converting
twice is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...layers.norm import RMSNorm
from ...layers.quantized.gguf_sources import dense, stacked_placeholder
from ...layers.rotary import RotaryTable
from .layers import AttentionSpec, DecoderLayer, PreNormLayer, SandwichNormLayer

MODEL_IMPLS = ("auto", "specexec", "transformers")
#: rope types whose frequencies do not depend on the sequence length (a fixed table holds them)
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class ModelImplChoice:
    """Which forward runs a model (``specexec`` or ``transformers``) and why."""

    impl: str
    reason: str


@dataclass(frozen=True, slots=True)
class Family:
    layer: type[DecoderLayer]
    has_qk_norm: bool = False
    passes_softcap: bool = False  #: Gemma2 passes its attention soft cap; Gemma3's module never does
    rotary_per_layer_type: bool = False  #: Gemma3: a rotary table per layer type (local and global)


FAMILIES = {
    "LlamaForCausalLM": Family(PreNormLayer),
    "MistralForCausalLM": Family(PreNormLayer),
    "Qwen2ForCausalLM": Family(PreNormLayer),
    "Qwen3ForCausalLM": Family(PreNormLayer, has_qk_norm=True),
    "Gemma2ForCausalLM": Family(SandwichNormLayer, passes_softcap=True),
    "Gemma3ForCausalLM": Family(SandwichNormLayer, has_qk_norm=True, rotary_per_layer_type=True),
}
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def check_model_impl(value) -> None:
    if value not in MODEL_IMPLS:
        raise ValueError(f"config key 'model_impl': got {value!r}; allowed: {', '.join(MODEL_IMPLS)}")


def is_own_decoder(model: nn.Module) -> bool:
    layers = getattr(getattr(model, "model", None), "layers", None)
    return bool(layers) and isinstance(layers[0], DecoderLayer)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the own decoder cannot run this model (None: it can)."""
    name = type(model).__name__
    if name not in FAMILIES:
        return f"{name} is not one of the own decoder's families ({', '.join(sorted(FAMILIES))})"
    decoder = model.model
    for i, layer in enumerate(decoder.layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            return f"layer {i} has no self_attn / mlp"
        for parent, names in ((attn, _PROJECTIONS), (mlp, _MLP)):
            for n in names:
                if type(getattr(parent, n, None)) is not nn.Linear:
                    kind = type(getattr(parent, n, None)).__name__
                    return f"layer {i}'s {n} is a {kind}, not a dense nn.Linear (quantized or packed before)"
    rope = getattr(decoder.rotary_emb, "rope_type", "default")
    rope_types = set(rope.values()) if isinstance(rope, dict) else {rope}
    if not rope_types <= set(STATIC_ROPE_TYPES):
        return f"rope type {sorted(rope_types - set(STATIC_ROPE_TYPES))} depends on the sequence length"
    return None


def resolve_model_impl(model: nn.Module, setting: str) -> ModelImplChoice:
    """The implementation that will run and why, converting the model in place when it is ours:
    ``auto`` takes the own decoder where the architecture is supported and transformers' modules
    otherwise; ``specexec`` refuses (ValueError) a model it cannot run."""
    check_model_impl(setting)
    if is_own_decoder(model):
        if setting == "transformers":
            raise ValueError(
                "config key 'model_impl': 'transformers', but this module was converted to specexec's "
                "decoder by an earlier executor; pass a freshly loaded module"
            )
        return ModelImplChoice("specexec", "converted by an earlier executor")
    if setting == "transformers":
        return ModelImplChoice("transformers", "configured")
    reason = unsupported_reason(model)
    if reason is not None:
        if setting == "specexec":
            raise ValueError(f"config key 'model_impl': 'specexec' cannot run this model: {reason}")
        return ModelImplChoice("transformers", reason)
    convert_to_own_decoder(model)
    return ModelImplChoice("specexec", f"own decoder for {type(model).__name__}")


@torch.no_grad()
def convert_to_own_decoder(model: nn.Module) -> None:
    """Replace the layers (and the final norm) of a supported model by the own decoder's, in place."""
    if is_own_decoder(model):
        return
    family = FAMILIES[type(model).__name__]
    decoder = model.model
    config = model.config.get_text_config()
    dtype = decoder.embed_tokens.weight.dtype
    decoder.rotary_tables = rotary_tables(decoder.rotary_emb, config, family, dtype)
    for i, layer in enumerate(decoder.layers):
        decoder.layers[i] = convert_layer(layer, config, family)
    decoder.norm = RMSNorm.from_module(decoder.norm)


def convert_layer(layer: nn.Module, config, family: Family) -> DecoderLayer:
    attn, mlp = layer.self_attn, layer.mlp
    spec = AttentionSpec(
        layer_idx=attn.layer_idx,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=attn.head_dim,
        scaling=float(attn.scaling),
        # Qwen and Gemma modules say per layer; Mistral's reads its config; Llama has none
        sliding_window=getattr(attn, "sliding_window", getattr(config, "sliding_window", None)),
        softcap=getattr(attn, "attn_logit_softcapping", None) if family.passes_softcap else None,
        rotary=getattr(attn, "layer_type", None) if family.rotary_per_layer_type else "default",
    )
    norm_names = ["input_layernorm", "post_attention_layernorm"]
    if family.layer is SandwichNormLayer:
        norm_names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    norms = {name: RMSNorm.from_module(getattr(layer, name)) for name in norm_names}
    if family.has_qk_norm:
        norms["q_norm"], norms["k_norm"] = RMSNorm.from_module(attn.q_norm), RMSNorm.from_module(attn.k_norm)
    qkv = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up = fuse_linears([mlp.gate_proj, mlp.up_proj])
    return family.layer(spec, qkv, attn.o_proj, gate_up, mlp.down_proj, mlp.act_fn, norms)


def fuse_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One ``nn.Linear`` whose output rows are the given layers' rows in order (biases likewise)."""
    first = linears[0]
    has_bias = [lin.bias is not None for lin in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("cannot fuse linear layers where only some have a bias")
    out_features = sum(lin.out_features for lin in linears)
    fused = nn.Linear(first.in_features, out_features, bias=all(has_bias), device="meta")
    weights = [lin.weight for lin in linears]  # placeholders of a GGUF's weights stay placeholders
    stacked = stacked_placeholder(weights)
    if stacked is None:
        stacked = nn.Parameter(torch.cat([dense(w) for w in weights]), requires_grad=False)
    fused.weight = stacked
    if all(has_bias):
        fused.bias = nn.Parameter(torch.cat([lin.bias for lin in linears]), requires_grad=False)
    return fused


def rotary_tables(rotary: nn.Module, config, family: Family, dtype: torch.dtype) -> nn.ModuleDict:
    positions = config.max_position_embeddings
    if family.rotary_per_layer_type:
        kinds = sorted(set(config.layer_types))
        return nn.ModuleDict({k: RotaryTable.from_module(rotary, positions, dtype, k) for k in kinds})
    return nn.ModuleDict({"default": RotaryTable.from_module(rotary, positions, dtype)})
