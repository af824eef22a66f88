"""A GGUF's token embedding looked up from its codes instead of a dense table (`quantized_embedding.py`),
and the memory a quantized load gives back (`release_memory.py`).

Each lookup must give the rows the dense table held, bit for bit (float32, and rounded once to the
model's dtype), for every type the int8-block tiles hold; a tied head's codes serve both; Gemma's
embedding scale is kept; ids out of range are refused as ``nn.Embedding`` refuses them."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch
from gguf_blocks import FakeFile, gguf_dequantized, random_tensor
from specexec.executor.layers.quantized import quantization
from specexec.executor.layers.quantized.q8_block_linear import Int8BlockLinear
from specexec.executor.layers.quantized.quantization import QuantizationReport
from specexec.executor.layers.quantized.quantized_embedding import QuantizedEmbedding
from specexec.executor.layers.quantized.release_memory import own_mapped_tensors, trim_freed_heap
from torch import nn
from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

VOCAB, HIDDEN = 64, 512


class EmbeddingAndHead(nn.Module):
    """An embedding and an LM head, tied (one weight) or not, as a GGUF install walks them."""

    def __init__(self, embedding: nn.Embedding, tied: bool):
        super().__init__()
        self.embed = embedding
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed = value

    def get_output_embeddings(self) -> nn.Module:
        return self.head


def installed_embedding(type_name: str, tied: bool, dtype=torch.float32, embedding=None):
    """(the model installed at the file's codes, the dense table as transformers converts it [float32])."""
    tensor = random_tensor(type_name, VOCAB, HIDDEN, seed=11)
    dense = gguf_dequantized(tensor)
    embedding = embedding or nn.Embedding(VOCAB, HIDDEN)
    with torch.no_grad():
        embedding.weight.copy_(dense)
    model = EmbeddingAndHead(embedding, tied)
    tensors = {"embed": tensor}
    if not tied:
        tensors["head"] = random_tensor("Q8_0", VOCAB, HIDDEN, seed=12)
        with torch.no_grad():
            model.head.weight.copy_(gguf_dequantized(tensors["head"]))
    model = model.to(dtype)
    report = QuantizationReport("gguf")
    quantization._install_gguf(model, FakeFile(tensors), report, int8_dot=True)
    return model, dense, report


@pytest.mark.parametrize("type_name", ["Q8_0", "Q6_K", "Q5_0", "Q5_1", "Q5_K", "Q4_K", "Q4_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_untied_embeddings_rows_are_the_dense_tables(cpu_ops_built, type_name, dtype):
    model, dense, report = installed_embedding(type_name, tied=False, dtype=dtype)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and embedding.codes is not model.head
    assert report.layers[f"{type_name} token embedding -> int8 blocks (exact)"] == 1
    ids = torch.tensor([[0, 5, 63], [7, 7, 1]])
    assert torch.equal(embedding(ids), dense.to(dtype)[ids])  # [2, 3, hidden]
    every_id = torch.arange(VOCAB)
    assert torch.equal(embedding(every_id), dense.to(dtype))
    assert torch.equal(embedding.weight, dense.to(dtype))  # the whole table, for callers that copy it
    codes_bytes = sum(t.numel() * t.element_size() for t in embedding.buffers())
    assert codes_bytes < VOCAB * HIDDEN * 1.3  # int8 codes and scales, not a float table


def test_a_tied_heads_codes_serve_the_embedding_without_a_second_copy(cpu_ops_built):
    model, dense, report = installed_embedding("Q8_0", tied=True, dtype=torch.bfloat16)
    embedding = model.get_input_embeddings()
    assert isinstance(model.head, Int8BlockLinear) and embedding.codes is model.head
    assert report.layers["Q8_0 token embedding -> the LM head's int8 blocks"] == 1
    assert list(embedding.buffers()) == [] and list(embedding.parameters()) == []
    assert torch.equal(embedding(torch.arange(VOCAB)), dense.bfloat16())
    held = {t.data_ptr() for t in model.buffers()}
    assert len(held) == len(list(model.head.buffers()))  # only the head's tiles and scales


def test_gemmas_embedding_scale_is_applied_as_its_module_applies_it(cpu_ops_built):
    scaled = Gemma3TextScaledWordEmbedding(VOCAB, HIDDEN, padding_idx=0, embed_scale=HIDDEN**0.5)
    model, dense, _ = installed_embedding("Q6_K", tied=True, dtype=torch.bfloat16, embedding=scaled)
    reference = Gemma3TextScaledWordEmbedding(VOCAB, HIDDEN, padding_idx=0, embed_scale=HIDDEN**0.5)
    with torch.no_grad():
        reference.weight.copy_(dense)
    reference = reference.bfloat16()
    ids = torch.tensor([3, 0, 62])
    assert torch.equal(model.get_input_embeddings()(ids), reference(ids))


def test_ids_out_of_range_are_refused_not_wrapped(cpu_ops_built):
    model, _, _ = installed_embedding("Q8_0", tied=False)
    embedding = model.get_input_embeddings()
    for bad in ([VOCAB], [-1], [0, VOCAB + 8]):
        with pytest.raises(IndexError, match="token ids"):
            embedding(torch.tensor(bad))
    assert embedding(torch.tensor([], dtype=torch.long)).shape == (0, HIDDEN)


def test_a_type_the_tiles_do_not_hold_keeps_the_dense_table(cpu_ops_built):
    model = EmbeddingAndHead(nn.Embedding(VOCAB, HIDDEN), tied=False)
    tensor = random_tensor("Q8_0", VOCAB, HIDDEN)
    tensor.type_name = "IQ4_XS"  # a type without a layout here
    quantization._install_gguf(model, FakeFile({"embed": tensor}), QuantizationReport("gguf"), int8_dot=True)
    assert type(model.get_input_embeddings()) is nn.Embedding


def test_mapped_tensors_are_copied_into_owned_memory_and_ties_kept(tmp_path):
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file({"embed": torch.randn(16, 8), "norm": torch.ones(8)}, str(path))
    mapped = safetensors.torch.load_file(str(path))  # views of the file's mapping
    model = EmbeddingAndHead(nn.Embedding(16, 8), tied=False)
    model.embed.weight = nn.Parameter(mapped["embed"], requires_grad=False)
    model.head.weight = model.embed.weight  # tied after the fact
    model.register_buffer("norm", mapped["norm"])
    assert not model.embed.weight.untyped_storage().resizable()
    before = model.embed.weight.clone()
    copied = own_mapped_tensors(model)
    assert copied == (16 * 8 + 8) * 4
    assert all(t.untyped_storage().resizable() for t in [*model.parameters(), *model.buffers()])
    assert model.head.weight is model.embed.weight and isinstance(model.embed.weight, nn.Parameter)
    assert torch.equal(model.embed.weight, before) and torch.equal(model.norm, torch.ones(8))
    assert own_mapped_tensors(model) == 0  # nothing mapped is left
    assert isinstance(trim_freed_heap(), bool)
