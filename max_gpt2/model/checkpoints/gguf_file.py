"""Reading a GGUF file: its metadata, and its tensors memory-mapped, every length checked first.

GGUF (llama.cpp's format, version 2 or 3, little-endian) is a header, then the tensors'
data, each at an offset aligned to `general.alignment` (32 unless the file says):

    "GGUF", version u32, tensor count u64, metadata count u64
    metadata   key (string), value type u32, value      (a string is u64 length + UTF-8 bytes;
                                                         an array is element type u32, count u64,
                                                         then the elements)
    tensors    name (string), dims u32, extents u64 [dims] (innermost first), ggml type u32,
               offset u64 (from the start of the data)

`GGUFFile(path)` parses the header once and refuses, naming the file and what is wrong,
anything that does not add up: another magic or version, a length or count past the end,
text that is not UTF-8, a tensor whose bytes lie outside the file or off the alignment.
Nothing in the file is executed or unpickled. `GGUFFile.data(name)` is a tensor's bytes as
NumPy over a copy-on-write map of the file (nothing is read until used, and MAX can bind
it without a copy): float32, float16 and bfloat16 (as uint16) with its row-major shape
(GGUF's extents reversed), or a quantized tensor's blocks as uint8 `[rows, row bytes]`.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from max_gpt2.model.checkpoints.weight_adapters import CheckpointError
from max_gpt2.model.formats import BY_GGML_TYPE

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip
"""ggml's tensor types by number, to name them in messages."""
TYPE_NUMBERS = {name: number for number, name in GGML_TYPES.items()}
BLOCKS = {kind: weight_format.gguf_block for kind, weight_format in BY_GGML_TYPE.items()}
"""The types read here: (weights a block, bytes a block)."""
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

# Metadata value types: number -> (struct code, size) for scalars; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")
_ESCAPED = re.compile("[\udc80-\udcfe]")  # a byte UTF-8 does not decode, but 0xFF


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its row-major shape, ggml type name, and bytes in the file."""

    name: str
    shape: tuple[int, ...]
    type: str
    start: int  # from the start of the file
    size: int


class _Cursor:
    """Reads little-endian values from `data`, refusing to read past its end."""

    def __init__(self, data: memoryview, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path} is not a valid GGUF file: {what} (at byte {self.at})")

    def take(self, size: int, what: str) -> memoryview:
        if size < 0 or self.at + size > len(self.data):
            raise self.fail(f"{what} needs {size} bytes, past the end of the file ({len(self.data)} bytes)")
        part = self.data[self.at : self.at + size]
        self.at += size
        return part

    def scalar(self, code: str, what: str) -> Any:
        return struct.unpack("<" + code, self.take(struct.calcsize(code), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.scalar("Q", f"the length of {what}"), what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text") from None

    def strings(self, count: int, key: str) -> list[str]:
        """`count` strings, each its u64 length then its bytes. A tokenizer's 100,000 of them: the loop
        only finds where each starts, and the bytes are decoded in one call, each length's 8 bytes
        made one 0xFF, a byte UTF-8 never holds (half the time of a decode each, docs/performance.md)."""
        if count > len(self.data) // 8:  # each string takes at least its 8-byte length
            raise self.fail(f"{key} claims {count} strings, more than the file can hold")
        data, at, end, length_of = self.data, self.at, len(self.data), _LENGTH.unpack_from
        starts = []
        try:
            for _ in range(count):
                (length,) = length_of(data, at)
                if at + 8 + length > end:
                    raise struct.error
                starts.append(at)
                at += 8 + length
        except struct.error:
            self.at = at
            raise self.fail(f"element {len(starts)} of {key} runs past the end of the file") from None
        first, self.at = self.at, at
        region = np.frombuffer(data[first:at], np.uint8).copy()
        heads = np.asarray(starts, dtype=np.int64) - first
        keep = np.ones(len(region), dtype=bool)
        keep[(heads[:, None] + np.arange(1, 8)).ravel()] = False
        region[heads] = 0xFF
        text = region[keep].tobytes().decode("utf-8", "surrogateescape")  # 0xFF: "\udcff"
        if text.count("\udcff") == count and not _ESCAPED.search(text):
            return text.split("\udcff")[1:]
        for index, (start, stop) in enumerate(zip(starts, [*starts[1:], at], strict=True)):
            try:  # a byte that is not UTF-8: which string holds it
                str(data[start + 8 : stop], "utf-8")
            except UnicodeDecodeError:
                self.at = start
                raise self.fail(f"element {index} of {key} is not UTF-8 text") from None
        raise AssertionError("unreachable: every string decoded")

    def value(self, kind: int, key: str) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], f"the value of {key}")
        if kind == STRING:
            return self.string(f"the value of {key}")
        if kind != ARRAY:
            raise self.fail(f"{key} has value type {kind}, which GGUF does not define")
        element, count = self.scalar("I", f"{key}'s element type"), self.scalar("Q", f"{key}'s length")
        if element in _SCALARS:
            code = _SCALARS[element]
            raw = self.take(count * struct.calcsize(code), f"the {count} elements of {key}")
            return np.frombuffer(raw, np.dtype(code).newbyteorder("<")).copy()
        if element == STRING:
            return self.strings(count, key)
        raise self.fail(f"{key} is an array of value type {element}, which is not supported")


class GGUFFile:
    """A GGUF file's metadata (key -> int, float, bool, str, list of str or NumPy array) and tensors."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size
        if size < 24:
            raise CheckpointError(
                f"{self.path} is not a valid GGUF file: {size} bytes, shorter than a header"
            )
        self._map = np.memmap(self.path, np.uint8, mode="c")  # copy-on-write: the file is never written
        cursor = _Cursor(memoryview(self._map), self.path)
        if bytes(cursor.take(4, "the magic")) != MAGIC:
            raise cursor.fail("it does not start with b'GGUF'")
        version = cursor.scalar("I", "the version")
        if version not in VERSIONS:
            raise cursor.fail(f"version {version}; versions {' and '.join(map(str, VERSIONS))} are read")
        tensor_count = cursor.scalar("Q", "the tensor count")
        metadata_count = cursor.scalar("Q", "the metadata count")
        if max(tensor_count, metadata_count) > size // 8:
            raise cursor.fail(f"it claims {tensor_count} tensors and {metadata_count} metadata entries")
        self.metadata: dict[str, Any] = {}
        for _ in range(metadata_count):
            key = cursor.string("a metadata key")
            if key in self.metadata:
                raise cursor.fail(f"metadata key {key} appears twice")
            self.metadata[key] = cursor.value(cursor.scalar("I", f"the value type of {key}"), key)
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        whole = isinstance(alignment, int) and not isinstance(alignment, bool)
        if not whole or alignment < 1 or alignment & (alignment - 1):
            raise cursor.fail(f"general.alignment is {alignment!r}: it must be an integer power of two")
        infos = [self._tensor_info(cursor) for _ in range(tensor_count)]
        data_start = -(-cursor.at // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, type_name, offset in infos:
            if name in self.tensors:
                raise cursor.fail(f"tensor {name} appears twice")
            self.tensors[name] = self._placed(name, shape, type_name, offset, data_start, alignment, size)

    @staticmethod
    def _tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], str, int]:
        name = cursor.string("a tensor name")
        dims = cursor.scalar("I", f"the dimensions of {name}")
        if not 1 <= dims <= 4:
            raise cursor.fail(f"tensor {name} has {dims} dimensions (ggml has 1 to 4)")
        extents = [cursor.scalar("Q", f"an extent of {name}") for _ in range(dims)]
        number = cursor.scalar("I", f"the type of {name}")
        offset = cursor.scalar("Q", f"the offset of {name}")
        return name, tuple(reversed(extents)), GGML_TYPES.get(number, f"type {number}"), offset

    def _placed(
        self,
        name: str,
        shape: tuple[int, ...],
        type_name: str,
        offset: int,
        data: int,
        alignment: int,
        size: int,
    ) -> TensorInfo:
        """The tensor's place in the file, checked; its size is known only for the types read here."""
        where = f"{self.path} is not a valid GGUF file: tensor {name}"
        if offset % alignment:
            raise CheckpointError(f"{where} starts at offset {offset}, off the {alignment}-byte alignment")
        if type_name not in BLOCKS:
            return TensorInfo(name, shape, type_name, data + offset, 0)
        per_block, block_bytes = BLOCKS[type_name]
        if min(shape) < 1 or shape[-1] % per_block:
            raise CheckpointError(f"{where} has shape {shape}, not rows of whole {type_name} blocks")
        nbytes = int(np.prod(shape, dtype=object)) // per_block * block_bytes
        if data + offset + nbytes > size:
            raise CheckpointError(
                f"{where} ({type_name} {list(shape)}, {nbytes} bytes at byte {data + offset}) runs past the "
                f"end of the file ({size} bytes): the file is truncated"
            )
        return TensorInfo(name, shape, type_name, data + offset, nbytes)

    def data(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes, not copied: float32, float16 or bfloat16 bits (uint16) in its row-major
        shape; a quantized tensor's blocks as uint8 `[rows, row bytes]`."""
        info = self.tensors[name]
        if info.type not in BLOCKS:
            raise CheckpointError(f"tensor {name} in {self.path} is {info.type}, which is not read here")
        raw = self._map[info.start : info.start + info.size]
        if info.type in _DTYPES:
            return raw.view(_DTYPES[info.type]).reshape(info.shape)
        return raw.reshape(-1, info.size // int(np.prod(info.shape[:-1], dtype=object)))
