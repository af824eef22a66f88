"""A GGUF file's tensor directory, read from its header without decoding the metadata values.

gguf-py's ``GGUFReader`` builds numpy views of every metadata value, the tokenizer's tens of thousands
of strings included: on a 0.5B Q4_K_M file that took 5.5 s of the 8 s its layers took to quantize at
every start. The layers need only the architecture's name, the data alignment and the tensor infos;
this reads those and steps over every other value by its length.

The layout (ggml's ``docs/gguf.md``, versions 2 and 3, little-endian): magic ``GGUF``, u32 version, u64
tensor count, u64 key-value count; each key-value a string key, a u32 value type and the value (a
string: u64 length and bytes; an array: u32 element type, u64 count, the elements); each tensor info
a string name, u32 dimension count, u64 dimensions (innermost first), u32 ggml type, u64 offset into
the data section, which starts at the next multiple of ``general.alignment`` (default 32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: bytes of the fixed-size value types (ggml's gguf_type: uint8 .. float64, bool); 8 string, 9 array
_VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_DEFAULT_ALIGNMENT = 32
#: numpy element types of the unquantized tensor types (ggml type id -> dtype), as gguf-py maps them
_PLAIN_TYPES = {
    0: np.float32,
    1: np.float16,
    24: np.int8,
    25: np.int16,
    26: np.int32,
    27: np.int64,
    28: np.float64,
}


class GGUFFormatError(ValueError):
    """The file is not a GGUF this reader understands; the message says where and why."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    type_name: str  #: ggml's name for its type: Q4_K, F32, ...
    dims: tuple[int, ...]  #: as the file lists them, innermost (columns) first
    data: np.ndarray  #: a view into the mapped file: typed for plain types, else uint8 [rows, row bytes]


@dataclass(frozen=True, slots=True)
class GGUFIndex:
    architecture: str  #: ``general.architecture``
    tensors: dict[str, TensorEntry]


def read_gguf_index(path: str | Path) -> GGUFIndex:
    """The architecture and the tensors of the GGUF file at ``path`` (``GGUFFormatError`` if malformed)."""
    path = Path(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    reader = _Reader(memoryview(mapped), path)
    if bytes(reader.take(4)) != b"GGUF":
        raise GGUFFormatError(f"{path} is not a GGUF file")
    version = reader.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: GGUF version {version} (read little-endian) is not supported")
    tensor_count, value_count = reader.unpack("<Q"), reader.unpack("<Q")
    architecture, alignment = "", _DEFAULT_ALIGNMENT
    for _ in range(value_count):
        key, kind = reader.string(), reader.unpack("<I")
        if key == "general.architecture" and kind == _STRING:
            architecture = reader.string()
        elif key == "general.alignment" and kind == _UINT32:
            alignment = reader.unpack("<I")
        else:
            reader.skip_value(kind)
    infos = []
    for _ in range(tensor_count):
        name = reader.string()
        dims = tuple(reader.unpack("<Q") for _ in range(reader.unpack("<I")))
        infos.append((name, dims, reader.unpack("<I"), reader.unpack("<Q")))
    data_start = -(-reader.position // alignment) * alignment
    tensors = {
        name: _entry(mapped, data_start + offset, name, dims, kind, path)
        for name, dims, kind, offset in infos
    }
    return GGUFIndex(architecture, tensors)


def _entry(
    mapped: np.ndarray, start: int, name: str, dims: tuple[int, ...], kind: int, path: Path
) -> TensorEntry:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        ggml_type = GGMLQuantizationType(kind)
    except ValueError:
        raise GGUFFormatError(f"{path}: tensor {name} has an unknown ggml type {kind}") from None
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    elements = int(np.prod(dims, dtype=np.int64))
    shape = tuple(reversed(dims))  # outermost first, as numpy and torch order them
    if kind in _PLAIN_TYPES:
        dtype = np.dtype(_PLAIN_TYPES[kind])
        count, view_shape = elements * dtype.itemsize, shape
    else:
        dtype = np.dtype(np.uint8)
        count = elements // block_size * type_size
        view_shape = (*shape[:-1], shape[-1] // block_size * type_size)
    if start + count > mapped.shape[0]:
        raise GGUFFormatError(f"{path} is truncated: tensor {name} ends past the file's end")
    data = mapped[start : start + count].view(dtype).reshape(view_shape)
    return TensorEntry(name, ggml_type.name, dims, data)


class _Reader:
    """Little-endian fields from a buffer, front to back."""

    def __init__(self, buffer: memoryview, path: Path) -> None:
        self.buffer, self.position, self.path = buffer, 0, path

    def take(self, count: int) -> memoryview:
        end = self.position + count
        if end > len(self.buffer):
            raise GGUFFormatError(f"{self.path} is truncated: its header ends past the file's end")
        chunk, self.position = self.buffer[self.position : end], end
        return chunk

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return value

    def string(self) -> str:
        return bytes(self.take(self.unpack("<Q"))).decode("utf-8", "replace")

    def skip_value(self, kind: int) -> None:
        if kind == _STRING:
            self.take(self.unpack("<Q"))
        elif kind == _ARRAY:
            element, count = self.unpack("<I"), self.unpack("<Q")
            if element in _VALUE_BYTES:
                self.take(count * _VALUE_BYTES[element])
            else:
                for _ in range(count):
                    self.skip_value(element)
        elif kind in _VALUE_BYTES:
            self.take(_VALUE_BYTES[kind])
        else:
            raise GGUFFormatError(f"{self.path}: unknown metadata value type {kind} at byte {self.position}")
