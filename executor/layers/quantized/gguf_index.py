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

A file is refused with `GGUFFormatError` wherever ggml's own reader (``gguf.cpp``) refuses it, and
before any count it holds is believed: an alignment that is not a power of two, arrays nested deeper
than `MAX_NESTING`, more than 4 dimensions, tensors that need more bytes than the file has (their
dimensions' product is taken as a Python integer, so it cannot wrap), rows that are not whole blocks
of their type, offsets off the alignment, a name given twice, and counts of values, tensors or array
elements that could not fit in the bytes left. ``header_digest`` is the sha256 of every byte up to the
data (the metadata and the tensor directory): what the conversion caches check a file against.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: bytes of the fixed-size value types (ggml's gguf_type: uint8 .. float64, bool); 8 string, 9 array
_VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_DEFAULT_ALIGNMENT = 32
MAX_NESTING = 16  #: arrays of arrays this deep at most (ggml's reader takes none; gguf-py writes them)
MAX_DIMS = 4  #: ggml's GGML_MAX_DIMS
#: the fewest bytes one metadata key-value and one tensor info take (a key or name may be empty)
_MIN_VALUE_BYTES, _MIN_TENSOR_INFO_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8
#: the fewest bytes one array element takes, by element type (a string: its length; an array: its header)
_MIN_ELEMENT_BYTES = {**_VALUE_BYTES, _STRING: 8, _ARRAY: 4 + 8}
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
    header_digest: str  #: sha256 (hex) of the header: magic, version, metadata and tensor directory


def read_gguf_index(path: str | Path) -> GGUFIndex:
    """The architecture and the tensors of the GGUF file at ``path`` (``GGUFFormatError`` if malformed)."""
    path = Path(path)
    if path.stat().st_size == 0:  # (numpy cannot map an empty file)
        raise GGUFFormatError(f"{path} is empty, not a GGUF file")
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    reader = _Reader(memoryview(mapped), path)
    if bytes(reader.take(4)) != b"GGUF":
        raise GGUFFormatError(f"{path} is not a GGUF file")
    version = reader.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: GGUF version {version} (read little-endian) is not supported")
    tensor_count = reader.count("<Q", _MIN_TENSOR_INFO_BYTES, "tensors")
    value_count = reader.count("<Q", _MIN_VALUE_BYTES, "metadata values")
    architecture, alignment = "", _DEFAULT_ALIGNMENT
    for _ in range(value_count):
        key, kind = reader.string(), reader.unpack("<I")
        if key == "general.architecture" and kind == _STRING:
            architecture = reader.string()
        elif key == "general.alignment" and kind == _UINT32:
            alignment = reader.unpack("<I")
            if alignment == 0 or alignment & (alignment - 1):
                raise GGUFFormatError(f"{path}: general.alignment {alignment} is not a power of two")
        else:
            reader.skip_value(kind)
    infos = [_tensor_info(reader) for _ in range(tensor_count)]
    header_digest = hashlib.sha256(reader.buffer[: reader.position]).hexdigest()
    data_start = -(-reader.position // alignment) * alignment
    tensors: dict[str, TensorEntry] = {}
    for name, dims, kind, offset in infos:
        if name in tensors:
            raise GGUFFormatError(f"{path}: tensor {name} is listed twice")
        if offset % alignment:
            raise GGUFFormatError(f"{path}: tensor {name}'s offset {offset} is not a multiple of {alignment}")
        tensors[name] = _entry(mapped, data_start + offset, name, dims, kind, path)
    return GGUFIndex(architecture, tensors, header_digest)


def _tensor_info(reader: _Reader) -> tuple[str, tuple[int, ...], int, int]:
    """(name, dimensions innermost first, ggml type, offset) of the next tensor info."""
    name, num_dims = reader.string(), reader.unpack("<I")
    if num_dims > MAX_DIMS:
        raise GGUFFormatError(
            f"{reader.path}: tensor {name} has {num_dims} dimensions (ggml holds {MAX_DIMS})"
        )
    dims = tuple(reader.unpack("<Q") for _ in range(num_dims))
    return name, dims, reader.unpack("<I"), reader.unpack("<Q")


def _entry(
    mapped: np.ndarray, start: int, name: str, dims: tuple[int, ...], kind: int, path: Path
) -> TensorEntry:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        ggml_type = GGMLQuantizationType(kind)
    except ValueError:
        raise GGUFFormatError(f"{path}: tensor {name} has an unknown ggml type {kind}") from None
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    row = dims[0] if dims else 1  # (ggml's dimensions default to 1)
    if row % block_size:
        raise GGUFFormatError(
            f"{path}: tensor {name}'s rows of {row} values are not whole {ggml_type.name} blocks "
            f"of {block_size}"
        )
    elements = 1
    for dim in dims:  # Python integers: a product that would wrap in int64 stays too large instead
        elements *= dim
    count = elements // block_size * type_size
    if start + count > mapped.shape[0]:
        raise GGUFFormatError(
            f"{path} is truncated: tensor {name} ({ggml_type.name}, dimensions {list(dims)}: {count} bytes "
            f"from byte {start}) ends past the file's end ({mapped.shape[0]} bytes)"
        )
    shape = tuple(reversed(dims))  # outermost first, as numpy and torch order them
    if kind in _PLAIN_TYPES:
        dtype, view_shape = np.dtype(_PLAIN_TYPES[kind]), shape
    else:
        dtype = np.dtype(np.uint8)
        view_shape = (*shape[:-1], shape[-1] // block_size * type_size) if shape else (type_size,)
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

    def count(self, fmt: str, min_bytes: int, what: str) -> int:
        """A count of items that take at least ``min_bytes`` each, refused where they cannot fit in what
        is left of the file (a count read from a hostile header is never looped over on trust)."""
        value = self.unpack(fmt)
        if value * min_bytes > len(self.buffer) - self.position:
            raise GGUFFormatError(
                f"{self.path} is truncated: its header cannot hold the {value} {what} it counts at byte "
                f"{self.position} (the file has {len(self.buffer)} bytes)"
            )
        return value

    def string(self) -> str:
        return bytes(self.take(self.unpack("<Q"))).decode("utf-8", "replace")

    def skip_value(self, kind: int) -> None:
        """Step over one value of type ``kind``: iteratively, arrays of arrays to `MAX_NESTING` deep."""
        pending = [(kind, 1)]  # (value type, how many values of it are left) per open array
        while pending:
            kind, left = pending.pop()
            if left == 0:
                continue
            if kind == _ARRAY:
                pending.append((kind, left - 1))
                element = self.unpack("<I")
                count = self.count("<Q", _MIN_ELEMENT_BYTES.get(element, 1), "array elements")
                if len(pending) > MAX_NESTING:
                    raise GGUFFormatError(
                        f"{self.path}: metadata arrays nested more than {MAX_NESTING} deep at byte {self.position}"
                    )
                pending.append((element, count))
            elif kind == _STRING:
                for _ in range(left):
                    self.take(self.unpack("<Q"))
            elif kind in _VALUE_BYTES:
                self.take(left * _VALUE_BYTES[kind])
            else:
                raise GGUFFormatError(
                    f"{self.path}: unknown metadata value type {kind} at byte {self.position}"
                )
