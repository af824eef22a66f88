"""The GGUF tensor directory read from the header (`gguf_index.py`) equals gguf-py's ``GGUFReader``: names,
types, dimensions and data, on files of every value kind; malformed files are refused by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_files import FAMILIES, write_gguf
from specexec.executor.layers.quantized.gguf_index import GGUFFormatError, read_gguf_index
from specexec.executor.layers.quantized.gguf_weights import GGUFFile
from specexec.executor.layers.quantized.quantized_linear import QuantizationError
from specexec.executor.model.model_loader import default_model_path


def _assert_same_as_gguf_py(path) -> None:
    index = read_gguf_index(path)
    reader = gguf.GGUFReader(str(path))
    assert index.architecture == bytes(reader.fields["general.architecture"].parts[-1]).decode()
    assert list(index.tensors) == [t.name for t in reader.tensors]
    for tensor in reader.tensors:
        entry = index.tensors[tensor.name]
        assert entry.type_name == tensor.tensor_type.name
        assert entry.dims == tuple(int(n) for n in tensor.shape)
        assert entry.data.dtype == tensor.data.dtype and entry.data.shape == tensor.data.shape
        assert np.array_equal(entry.data, tensor.data), tensor.name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_index_equals_gguf_py_on_every_family_file(tmp_path, family):
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, family)
    _assert_same_as_gguf_py(path)


@pytest.mark.parametrize("padding", [0, 16, 32, 48])
def test_index_equals_gguf_py_on_every_value_kind_and_quantized_tensors(tmp_path, padding):
    """Arrays of strings and of numbers, every scalar width, F16/Q8_0/Q5_0/BF16/Q4_K data, and an alignment
    of 64 with the header's end moved by ``padding`` bytes (where 32 would have started the data early)."""
    path = tmp_path / "kinds.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("k.padding", "p" * padding)
    writer.add_uint8("k.u8", 7)
    writer.add_int16("k.i16", -3)
    writer.add_uint64("k.u64", 2**40)
    writer.add_float64("k.f64", 0.25)
    writer.add_bool("k.bool", True)
    writer.add_array("k.strings", ["a", "", "ünïcode", "x" * 300])
    writer.add_array("k.floats", [0.5, 1.5, 2.5])
    writer.add_array("k.nested", [[1, 2], [3]])
    writer.add_custom_alignment(64)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((8, 256)).astype(np.float32)
    writer.add_tensor("plain.weight", weights)
    writer.add_tensor("half.weight", weights.astype(np.float16))
    for kind in (
        gguf.GGMLQuantizationType.Q8_0,
        gguf.GGMLQuantizationType.Q5_0,
        gguf.GGMLQuantizationType.BF16,
    ):
        codes = gguf.quantize(weights, kind)
        writer.add_tensor(f"{kind.name.lower()}.weight", codes, raw_shape=codes.shape, raw_dtype=kind)
    q4_k = rng.integers(0, 256, (8, 144), dtype=np.uint8)  # one super-block a row: the bytes are not read
    writer.add_tensor("q4_k.weight", q4_k, raw_shape=q4_k.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _assert_same_as_gguf_py(path)


def test_index_equals_gguf_py_on_the_shipped_model():
    _assert_same_as_gguf_py(default_model_path())


def test_malformed_files_are_refused_with_the_reason(tmp_path):
    good = tmp_path / "good.gguf"
    write_gguf(good, sorted(FAMILIES)[0])
    data = good.read_bytes()
    cases = {
        "not a GGUF file": b"GGML" + data[4:],
        "version 1": data[:4] + (1).to_bytes(4, "little") + data[8:],
        "truncated: its header": data[:200],
        "truncated: tensor": data[: len(data) - 16],
    }
    for reason, content in cases.items():
        path = tmp_path / "bad.gguf"
        path.write_bytes(content)
        with pytest.raises(GGUFFormatError, match=reason):
            read_gguf_index(path)
    path.write_bytes(cases["not a GGUF file"])
    with pytest.raises(QuantizationError, match="not a GGUF file"):
        GGUFFile(path)


def test_gguf_file_decodes_through_the_index(tmp_path):
    """GGUFFile's tensors come from the index: a Q8_0 tensor's codes are its blocks' int8 bytes."""
    path = tmp_path / "q8.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    weights = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    blocks = gguf.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor(
        "blk.0.attn_q.weight", blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = GGUFFile(path).tensors["blk.0.attn_q.weight"]
    assert tensor.type_name == "Q8_0" and tensor.shape == (8, 64)
    q, scale, _ = tensor.decode_int8_blocks()
    dequantized = gguf.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(q.float() * scale.repeat_interleave(32, dim=1), torch.from_numpy(dequantized))
