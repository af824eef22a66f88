"""The GGUF tensor directory read from the header (`gguf_index.py`) equals gguf-py's ``GGUFReader``: names,
types, dimensions and data, on files of every value kind; malformed and hostile files are refused with
`GGUFFormatError` saying why, never another exception."""

from __future__ import annotations

import contextlib
import struct

import gguf
import numpy as np
import pytest
import torch
from gguf_files import FAMILIES, make_source_model, write_gguf
from specexec.executor.layers.quantized.gguf_index import GGUFFormatError, read_gguf_index
from specexec.executor.layers.quantized.gguf_weights import GGUFFile
from specexec.executor.layers.quantized.quantized_linear import QuantizationError
from specexec.executor.model.model_loader import ModelLoadError, default_model_path, load_model
from specexec.executor.model.model_peek import peek_text_config


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


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _tensor_info(name: str, dims: tuple[int, ...], kind: int, offset: int = 0) -> bytes:
    packed_dims = b"".join(struct.pack("<Q", d) for d in dims)
    return _string(name) + struct.pack("<I", len(dims)) + packed_dims + struct.pack("<IQ", kind, offset)


def _hand_written_gguf(
    values: list[bytes] = (), infos: list[bytes] = (), data: bytes = bytes(64), counts=None
) -> bytes:
    """A GGUF v3 file written byte by byte: ``values`` (key-value records), ``infos`` (tensor infos),
    the data section after padding to 32; ``counts``: (tensors, values) to claim instead of the real ones."""
    num_tensors, num_values = counts or (len(infos), len(values))
    head = b"GGUF" + struct.pack("<IQQ", 3, num_tensors, num_values) + b"".join(values) + b"".join(infos)
    return head + bytes(-len(head) % 32) + data


F32, Q8_0 = 0, 8
UINT32, ARRAY = 4, 9
#: (what the message must say, the file): each a header that ggml's reader refuses, built by hand
HOSTILE_HEADERS = {
    "alignment 0 is not a power of two": _hand_written_gguf(
        [_string("general.alignment") + struct.pack("<II", UINT32, 0)], [_tensor_info("w", (4,), F32)]
    ),
    "alignment 48 is not a power of two": _hand_written_gguf(
        [_string("general.alignment") + struct.pack("<II", UINT32, 48)]
    ),
    # an array of one array of one array ... 5,000 deep, the innermost an empty array of u32
    "nested more than 16 deep": _hand_written_gguf(
        [
            _string("k.deep")
            + struct.pack("<I", ARRAY)
            + struct.pack("<IQ", ARRAY, 1) * 5000
            + struct.pack("<IQ", UINT32, 0)
        ]
    ),
    # 2**33 * 2**31 wraps to 0 in int64: an empty view of an absurd shape
    "tensor w .* ends past the file's end": _hand_written_gguf([], [_tensor_info("w", (2**33, 2**31), F32)]),
    "tensor big .* ends past the file's end": _hand_written_gguf(
        [], [_tensor_info("big", (2**20, 2**20), F32)]
    ),
    "rows of 16 values are not whole Q8_0 blocks of 32": _hand_written_gguf(
        [], [_tensor_info("q", (16, 2), Q8_0)]
    ),
    "rows of 40 values are not whole Q8_0 blocks": _hand_written_gguf([], [_tensor_info("q", (40, 2), Q8_0)]),
    "has 5 dimensions": _hand_written_gguf([], [_tensor_info("w", (1, 1, 1, 1, 1), F32)]),
    "2147483648 dimensions": _hand_written_gguf([], [_string("w") + struct.pack("<I", 2**31)]),
    "offset 4 is not a multiple of 32": _hand_written_gguf([], [_tensor_info("w", (1,), F32, offset=4)]),
    "tensor w is listed twice": _hand_written_gguf([], [_tensor_info("w", (1,), F32)] * 2),
    "unknown ggml type 4": _hand_written_gguf([], [_tensor_info("w", (32,), 4)]),
    "unknown metadata value type 13": _hand_written_gguf([_string("k") + struct.pack("<I", 13)]),
    f"hold the {2**62} tensors it counts": _hand_written_gguf([], [], counts=(2**62, 0)),
    f"hold the {2**63} metadata values it counts": _hand_written_gguf([], [], counts=(0, 2**63)),
    f"hold the {2**60} array elements it counts": _hand_written_gguf(
        [_string("k.strings") + struct.pack("<IIQ", ARRAY, 8, 2**60)]
    ),
    "truncated: its header": _hand_written_gguf([_string("k") + struct.pack("<IIQ", ARRAY, UINT32, 1000)]),
    "empty": b"",
}


@pytest.mark.parametrize("reason", sorted(HOSTILE_HEADERS))
def test_hostile_headers_are_format_errors_that_say_why(tmp_path, reason):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE_HEADERS[reason])
    with pytest.raises(GGUFFormatError, match=reason):
        read_gguf_index(path)
    with pytest.raises(QuantizationError, match=reason):
        GGUFFile(path)


def test_every_truncation_and_byte_flip_of_a_file_is_read_or_a_format_error(tmp_path):
    """Cut anywhere or with a header byte changed, a file is read or refused with GGUFFormatError: never
    another exception (an IndexError, a numpy reshape error, a RecursionError, a ZeroDivisionError)."""
    good = tmp_path / "good.gguf"
    write_gguf(good, sorted(FAMILIES)[0])
    data = good.read_bytes()
    header_end = len(data) - sum(entry.data.nbytes for entry in read_gguf_index(good).tensors.values())
    path = tmp_path / "bad.gguf"
    for cut in range(0, len(data), 97):
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFFormatError):
            read_gguf_index(path)
    rng = np.random.default_rng(0)
    for _ in range(300):
        changed = bytearray(data)
        for at in rng.integers(4, header_end, 3):
            changed[at] = rng.integers(0, 256)
        path.write_bytes(bytes(changed))
        with contextlib.suppress(GGUFFormatError):  # (read, or refused: nothing else)
            read_gguf_index(path)


def test_the_header_digest_names_the_header_not_the_values(tmp_path):
    """Two files of one shape and other values share a digest (the caches also check the file's identity);
    a changed metadata value or tensor shape changes it."""
    paths = [tmp_path / f"{seed}.gguf" for seed in range(2)]
    for seed, path in enumerate(paths):
        write_gguf(path, "llama3", make_source_model(FAMILIES["llama3"], seed=seed))
    first, second = (read_gguf_index(path) for path in paths)
    assert first.header_digest == second.header_digest
    assert not np.array_equal(
        first.tensors["blk.0.attn_q.weight"].data, second.tensors["blk.0.attn_q.weight"].data
    )
    other = tmp_path / "other.gguf"
    write_gguf(other, "qwen2")
    assert read_gguf_index(other).header_digest != first.header_digest


@pytest.mark.parametrize("reason", sorted(HOSTILE_HEADERS))
def test_hostile_headers_are_a_load_error_and_unknown_to_the_peek(tmp_path, reason):
    """Loading one says the file is bad (ModelLoadError, the format error as its cause) before gguf-py or
    transformers read it; the shape peek made before loading (`model_peek`) cannot tell, and says so."""
    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE_HEADERS[reason])
    with pytest.raises(ModelLoadError, match="GGUF") as error:
        load_model(path, cache_dir=tmp_path / "cache", quantization="gguf", progress=False)
    assert reason == "empty" or isinstance(error.value.__cause__, GGUFFormatError)
    assert peek_text_config(path) == {}
