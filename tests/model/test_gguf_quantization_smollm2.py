"""``quantization: gguf`` on the embedded SmolLM2 GGUF: its Q4_1 codes run in torch's int4 kernel exactly.

In float32 every weight the kernel computes with equals the ``gguf`` reader's dequantization (as
transformers converts it, rows of attn_q / attn_k reordered), bit for bit; in bfloat16 the kernel's
scales are rounded and each weight stays within `BF16_TOLERANCE` of its group's largest magnitude.
"""

from __future__ import annotations

import functools

import gguf
import pytest
import torch
from specexec.executor.layers.quantized.gguf_weights import GGUFFile
from specexec.executor.layers.quantized.int4_layout import unpack_int4
from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear
from specexec.executor.layers.quantized.quantized_embedding import QuantizedEmbedding
from specexec.executor.layers.quantized.quantized_linear import Int4WeightOnlyLinear
from specexec.executor.model.model_loader import default_model_path, load_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("all_threads")]

#: a bf16 kernel weight differs from the file's by at most this fraction of its group's largest |weight|
#: (0.78% measured: the scale, the zero and the result are each rounded to 8 significant bits)
BF16_TOLERANCE = 0.01
PROMPTS = ["Why is the sky blue?", "Write a haiku about the sea.", "Name five countries in Africa."]


@functools.cache
def converted_and_gguf() -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the float32 copy transformers converts, the same with ``quantization: gguf``)."""
    dense = load_model(None, dtype="float32", progress=False).model
    quantized = load_model(None, dtype="float32", progress=False, quantization="gguf")
    assert quantized.quantization.layers == {"Q4_1 -> int4 (exact)": 210, "Q8_0 -> dense": 1}
    return dense, quantized.model


def test_decoded_q4_1_blocks_equal_the_gguf_readers_dequantization():
    reader = gguf.GGUFReader(str(default_model_path()))
    file = GGUFFile(default_model_path())
    q4_1 = [t for t in reader.tensors if t.tensor_type.name == "Q4_1"]
    assert len(q4_1) == 210
    for raw in q4_1:
        mine = file.tensors[raw.name].decode().dequantize()
        theirs = torch.from_numpy(gguf.dequantize(raw.data, raw.tensor_type))
        assert torch.equal(mine, theirs.reshape(mine.shape)), raw.name


def test_a_q8_0_head_keeps_the_files_blocks_where_int8_dot_runs():
    """With ``quantized_kernel`` not torch, the Q8_0 head tied to the embedding holds the file's codes
    and block scales (equal to the gguf reader's dequantization and to the converted float32 weights),
    even in bfloat16."""
    reader = gguf.GGUFReader(str(default_model_path()))
    raw = next(t for t in reader.tensors if t.tensor_type.name == "Q8_0")
    q, scale, offset = GGUFFile(default_model_path()).tensors[raw.name].decode_int8_blocks()
    assert offset is None, "Q8_0 has no offset"
    theirs = torch.from_numpy(gguf.dequantize(raw.data, raw.tensor_type)).reshape(q.shape)
    assert torch.equal(q.float() * scale.repeat_interleave(32, dim=1), theirs)
    dense, _ = converted_and_gguf()
    # bfloat16: the converted head is rounded there, yet the block layer holds the file's own values
    loaded = load_model(None, dtype="bfloat16", progress=False, quantization="gguf", quantized_kernel="auto")
    assert loaded.quantization.layers == {
        "Q4_1 -> int4 (exact)": 210,
        "Q8_0 -> int8 blocks (exact)": 1,
        "Q8_0 token embedding -> the LM head's int8 blocks": 1,
    }
    head = loaded.model.lm_head
    assert isinstance(head, Int8BlockLinear)
    assert torch.equal(head.dequantized(torch.float32), dense.lm_head.weight)
    # the embedding looks its rows up in the head's codes: what the dense bfloat16 table held, no table
    embedding = loaded.model.get_input_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and embedding.codes is head
    every_id = torch.arange(embedding.num_embeddings)
    want = dense.get_input_embeddings()(every_id).bfloat16()
    assert torch.equal(embedding(every_id), want)
    assert torch.equal(embedding(every_id[::7].reshape(1, -1)), want[::7].unsqueeze(0))
    assert all(t.numel() < embedding.num_embeddings * 576 // 2 for t in embedding.buffers())


def test_every_int4_layer_holds_exactly_the_converted_weights():
    dense, quantized = converted_and_gguf()
    dense_modules = dict(dense.named_modules())
    layers = [(n, m) for n, m in quantized.named_modules() if isinstance(m, Int4WeightOnlyLinear)]
    assert len(layers) == 210
    for name, layer in layers:
        want = dense_modules[name].weight  # [out, in]
        assert torch.equal(layer.dequantized(torch.float32), want), name
        # the kernel's own form, (q - 8) * scale + zero with zero = offset + 8 * scale, loses nothing
        codes = unpack_int4(layer.packed, layer.out_features, layer.in_features).float()
        table = layer.scales_and_zeros(torch.float32)  # [groups, out, 2]
        scale, zero = (table[..., i].t().repeat_interleave(32, dim=1) for i in (0, 1))  # [out, in] each
        assert torch.equal((codes - 8) * scale + zero, want), name


def test_the_cpu_kernel_multiplies_by_exactly_those_weights_in_float32():
    """The kernel run on the identity returns its weights: every layer of block 0, and attn_k of all."""
    dense, quantized = converted_and_gguf()
    dense_modules = dict(dense.named_modules())
    checked = 0
    for name, layer in quantized.named_modules():
        if isinstance(layer, Int4WeightOnlyLinear) and (".layers.0." in name or name.endswith("k_proj")):
            eye = torch.eye(layer.in_features)
            assert torch.equal(layer(eye).t(), dense_modules[name].weight), name
            groups = dense_modules[name].weight.abs().reshape(layer.out_features, -1, 32)
            bound = BF16_TOLERANCE * groups.amax(-1).repeat_interleave(32, 1)
            assert torch.all((layer(eye.bfloat16()).t().float() - dense_modules[name].weight).abs() <= bound)
            checked += 1
    assert checked == 7 + 29


def test_gguf_in_float32_predicts_what_the_float32_copy_predicts():
    dense, quantized = converted_and_gguf()
    tokenizer = load_model(None, dtype="float32", progress=False).tokenizer
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
        )
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        with torch.inference_mode():
            continuation = dense.generate(ids, max_new_tokens=24, do_sample=False)
            want = dense(continuation).logits
            got = quantized(continuation).logits
        assert torch.equal(got.argmax(-1), want.argmax(-1)), prompt
        assert (got - want).abs().max() < 1e-3
