"""Writing a GGUF file tensor by tensor, under a temporary name renamed into place when whole.

The header names every tensor with its shape, type and offset, so the tensors' sizes are
declared first (`TensorSpec`) and their bytes streamed after: one tensor's data is in memory
at a time. Metadata values take GGUF's types from Python's: str a string, bool a bool, int
an unsigned 32-bit integer (what llama.cpp reads for counts, lengths and token ids), float a
32-bit float, a list of str an array of strings, a NumPy array an array of its dtype.
The layout is `max_gpt2.model.checkpoints.gguf_file`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from max_gpt2.model.checkpoints.gguf_file import ARRAY, BLOCKS, DEFAULT_ALIGNMENT, MAGIC, STRING, TYPE_NUMBERS
from max_gpt2.outputs import write_atomically

_ARRAY_TYPES = {np.dtype(np.uint8): 0, np.dtype(np.int8): 1, np.dtype(np.uint16): 2, np.dtype(np.int16): 3,
                np.dtype(np.uint32): 4, np.dtype(np.int32): 5, np.dtype(np.float32): 6,
                np.dtype(np.uint64): 10, np.dtype(np.int64): 11, np.dtype(np.float64): 12}  # fmt: skip


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: its name, row-major shape and ggml type name (`gguf_file.BLOCKS`' types)."""

    name: str
    shape: tuple[int, ...]
    type: str

    @property
    def size(self) -> int:
        """Its bytes in the file."""
        per_block, block_bytes = BLOCKS[self.type]
        return int(np.prod(self.shape, dtype=object)) // per_block * block_bytes


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _value(key: str, value: Any) -> bytes:
    """A metadata value's type and bytes."""
    if isinstance(value, str):
        return struct.pack("<I", STRING) + _string(value)
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<II", 4, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return struct.pack("<IIQ", ARRAY, STRING, len(value)) + b"".join(map(_string, value))
    if isinstance(value, np.ndarray) and value.dtype in _ARRAY_TYPES:
        header = struct.pack("<IIQ", ARRAY, _ARRAY_TYPES[value.dtype], value.size)
        return header + value.astype(value.dtype.newbyteorder("<")).tobytes()
    raise TypeError(f"metadata {key}: cannot write a {type(value).__name__} to GGUF")


def _pad(stream: BinaryIO, alignment: int) -> None:
    stream.write(b"\0" * (-stream.tell() % alignment))


def write_gguf(
    path: str | Path,
    metadata: dict[str, Any],
    specs: list[TensorSpec],
    tensors: Iterable[np.ndarray],
    written: Callable[[TensorSpec], None] | None = None,
) -> Path:
    """Writes a GGUF file: `metadata`, then each of `specs` with the bytes `tensors` yields for it, in
    order (each checked against its spec's size); `written(spec)` hears of each tensor as it lands.
    The file appears at `path` only when whole."""
    path = Path(path)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    offsets, end = [], 0
    for spec in specs:
        offsets.append(end)
        end = -(-(end + spec.size) // alignment) * alignment

    def write(partial: Path) -> None:
        with partial.open("wb") as stream:
            stream.write(MAGIC + struct.pack("<IQQ", 3, len(specs), len(metadata)))
            for key, value in metadata.items():
                stream.write(_string(key) + _value(key, value))
            for spec, offset in zip(specs, offsets, strict=True):
                extents = struct.pack(f"<{len(spec.shape)}Q", *reversed(spec.shape))
                stream.write(_string(spec.name) + struct.pack("<I", len(spec.shape)) + extents)
                stream.write(struct.pack("<IQ", TYPE_NUMBERS[spec.type], offset))
            _pad(stream, alignment)
            for spec, array in zip(specs, tensors, strict=True):
                data = np.ascontiguousarray(array)
                if data.nbytes != spec.size:
                    raise ValueError(
                        f"tensor {spec.name}: {data.nbytes} bytes given; {spec.type} {list(spec.shape)} "
                        f"takes {spec.size}"
                    )
                stream.write(memoryview(data).cast("B"))
                _pad(stream, alignment)
                if written is not None:
                    written(spec)

    write_atomically(path, write)
    return path
