"""The block formats: llama.cpp's blocks of 32 weights and super-blocks of 256, as the kernels read them.

`BlockFormat` is q8_0 and q4_0 (`block_quants` has their arithmetic); `FieldBlockFormat` the
others, whose GGUF blocks come apart into fields (`gguf_blocks`, written by `gguf_quantizers`) that
are laid out group by group for the kernels (`kernel_layout.group_field`; the byte map in
`max_gpt2/kernels/packed_layout.mojo`): `SmallBlockFormat` (q4_1, q5_0, q5_1) and the K-quants
(`Q4KFormat`, `Q5KFormat`, `Q6KFormat`). The instances are in `registry`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from max.dtype import DType

from max_gpt2.model.formats import gguf_blocks
from max_gpt2.model.formats.block_quants import BLOCK, Q8_0_CODE, BlockCode
from max_gpt2.model.formats.format import Stored, TensorFormat
from max_gpt2.model.formats.kernel_layout import (
    GROUP,
    deinterleave_blocks,
    group_field,
    interleave_blocks,
    ungroup_field,
)

# q5_k: the 5th bit of element 4c + e in bit c of its byte, of element 16 + 4c + e in bit 4 + c: [half, c, 1]
FIFTH_BITS = (np.arange(4, dtype=np.uint8) + np.array([[0], [4]], np.uint8))[..., None]

# q6_k: where a value's high 2 bits sit in its byte, by [half, c // 2] (the kernel takes them to bits
# 4-5 with one shift and a mask): chunks 0 and 1 in bits 4-7, chunks 2 and 3 in bits 0-3.
HIGH_BITS = np.array([[4, 0], [6, 2]], np.uint8).reshape(2, 2, 1, 1)


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class BlockFormat(TensorFormat):
    """Blocks of 32 weights and a float16 scale (`block_quants.BlockCode`), 8 rows interleaved."""

    code: BlockCode = Q8_0_CODE
    kernels_only: bool = True  # every block format: packed for the kernels, rounded to blocks
    quantized: bool = True

    @property
    def gguf_block(self) -> tuple[int, int]:
        return BLOCK, self.code.block_bytes

    def rows(self, weight: np.ndarray) -> np.ndarray:
        return self.code.to_blocks(*self.code.quantize(weight))

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return self.code.dequantize(*self.code.from_blocks(rows), shape[-1]).reshape(shape)

    def stored(self, out_dim: int, in_dim: int) -> dict[str, Stored]:
        groups, blocks = -(-out_dim // GROUP), -(-in_dim // BLOCK)
        values = GROUP * (self.code.block_bytes - 2)  # a block's value bytes, for 8 rows
        return {  # bytes, q8_0's int8 too: a layer's products bind one dtype, whatever their blocks
            "weight": Stored((groups, blocks * values), "uint8", DType.uint8),
            "scales": Stored((groups, blocks * GROUP), "float16", DType.float16),
        }

    def pack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        weight, scales = interleave_blocks(rows, self.code)
        return {"weight": weight.view(np.uint8), "scales": scales}

    def unpack(self, arrays: dict[str, np.ndarray], out_dim: int, in_dim: int) -> np.ndarray:
        weight = arrays["weight"].view(self.code.dtype)
        values, scales = deinterleave_blocks(weight, arrays["scales"], self.code, out_dim)
        return self.code.dequantize(values, scales, in_dim)


Fields = gguf_blocks.BlockFields | gguf_blocks.Q4KFields | gguf_blocks.Q6KFields


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class FieldBlockFormat(TensorFormat):
    """One of llama.cpp's block types whose blocks the kernels read by their fields: a group of 8 rows'
    block one run of bytes in "weight" (the 4-bit values as q4_0 keeps them, then the fields after
    them one after another, `kernel_layout.group_field`; the byte map in
    `max_gpt2/kernels/packed_layout.mojo`), its float16 d (and min) in "scales". GGUF's blocks come
    apart into fields (`gguf_blocks`). Rows are whole blocks, as GGUF stores them."""

    block: tuple[int, int]  # weights, GGUF bytes
    halves: int  # float16 a row a block in "scales"
    parts: tuple[tuple[tuple[int, ...], int], ...]  # each weight field's shape a block and its axes
    # after the rows' (`group_field`), in order
    quantize: Callable[[np.ndarray], np.ndarray]  # llama.cpp's quantizer (`gguf_quantizers`)
    take_apart: Callable[[np.ndarray], Fields]  # GGUF's blocks -> fields (`gguf_blocks`)
    kernels_only: bool = True  # as `BlockFormat`'s
    quantized: bool = True

    @property
    def gguf_block(self) -> tuple[int, int]:
        return self.block

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return self.fields(rows.reshape(-1, self.block[1])).values().reshape(shape)

    def stored(self, out_dim: int, in_dim: int) -> dict[str, Stored]:
        if in_dim % self.block[0]:
            raise ValueError(
                f"{self.name} stores rows of whole blocks of {self.block[0]} weights; "
                f"these rows have {in_dim}"
            )
        groups, blocks = -(-out_dim // GROUP), in_dim // self.block[0]
        row_bytes = sum(int(np.prod(inner)) for inner, _ in self.parts)  # a row's block, bar d
        return {
            "weight": Stored((groups, blocks * GROUP * row_bytes), "uint8", DType.uint8),
            "scales": Stored((groups, blocks * GROUP * self.halves), "float16", DType.float16),
        }

    def pack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        count, blocks = rows.shape[0], rows.shape[1] // self.block[1]
        fields = self.fields(rows.reshape(-1, self.block[1]))
        q = fields.q.reshape(count, blocks, -1, 2, 4, 4)  # [N, Kb, j (32 weights), half, c, e]
        parts, halves = self.split(fields, q, count, blocks)
        nibbles = (q[:, :, :, 0] & 0xF) | (q[:, :, :, 1] << 4)  # [N, Kb, j, c, e]: the low 4 bits
        tails = [tail for _, tail in self.parts]
        grouped = [group_field(part, tail) for part, tail in zip([nibbles, *parts], tails, strict=True)]
        weight, scales = np.concatenate(grouped, axis=-1), group_field(halves, 0)
        return {"weight": weight.reshape(len(weight), -1), "scales": scales.reshape(len(scales), -1)}

    def unpack(self, arrays: dict[str, np.ndarray], out_dim: int, in_dim: int) -> np.ndarray:
        blocks, weight = in_dim // self.block[0], arrays["weight"]
        weight = weight.reshape(len(weight), blocks, -1)
        parts, at = [], 0
        for inner, tail in self.parts:
            size = GROUP * int(np.prod(inner))
            parts.append(ungroup_field(weight[..., at : at + size], inner, tail, out_dim))
            at += size
        scales = arrays["scales"].reshape(len(arrays["scales"]), blocks, -1)
        n = out_dim * blocks
        halves = ungroup_field(scales, (self.halves,), 0, out_dim).reshape(n, self.halves)
        nibbles = parts[0].reshape(n, -1, 1, 4, 4)
        q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=2)  # [n, j, half, c, e]
        return (
            self.join([part.reshape(n, -1) for part in parts[1:]], halves, q)
            .values()
            .reshape(out_dim, in_dim)
        )

    def rows(self, weight: np.ndarray) -> np.ndarray:
        return self.quantize(weight)

    def fields(self, blocks: np.ndarray) -> Fields:
        """GGUF's blocks [n, bytes] taken apart (`gguf_blocks`)."""
        return self.take_apart(blocks)

    @abstractmethod
    def split(
        self, fields: Fields, q: np.ndarray, count: int, blocks: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """The weight fields after the nibbles, [N, Kb, *inner] each, and the float16 [N, Kb, halves]."""

    @abstractmethod
    def join(self, parts: list[np.ndarray], halves: np.ndarray, q: np.ndarray) -> Fields:
        """The inverse of `split`, from its parts [n, ...], halves [n, halves] and q [n, j, half, c, e]."""


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class SmallBlockFormat(FieldBlockFormat):
    """llama.cpp's Q4_1, Q5_0 and Q5_1: blocks of 32 4-bit values (after them, for the 5-bit ones, their
    5th bits [1, 4], as q5_k keeps a sub-block's: `FIFTH_BITS`), d and for Q4_1 and Q5_1 a min m. Their
    products read x rounded as q4_0's do, with its block sums (`packed_layout.mojo:activation_of`)."""

    def split(
        self, fields: gguf_blocks.BlockFields, q: np.ndarray, count: int, blocks: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        steps = [fields.d] if fields.m is None else [fields.d, fields.m]
        halves = np.stack(steps, axis=-1).reshape(count, blocks, self.halves)
        if len(self.parts) == 1:
            return [], halves
        return [((q >> 4) << FIFTH_BITS).sum(axis=(3, 4), dtype=np.uint8)], halves  # [N, Kb, 1, e]

    def join(self, parts: list[np.ndarray], halves: np.ndarray, q: np.ndarray) -> gguf_blocks.BlockFields:
        if parts:
            q = q | (((parts[0].reshape(len(q), 1, 1, 1, 4) >> FIFTH_BITS) & 1) << 4)
        m = halves[:, 1] if self.halves == 2 else None
        return gguf_blocks.BlockFields(halves[:, 0], m, q.reshape(len(q), 32))


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Q4KFormat(FieldBlockFormat):
    """q4_k: after the nibbles, each sub-block's 6-bit scale and min, [8] each; d and dmin. llama.cpp's
    K-quants (this, `Q5KFormat`, `Q6KFormat`) hold super-blocks of 256 weights, 8 sub-blocks of 32,
    their products reading x rounded to llama.cpp's q8_K (`packed_layout.mojo:activation_of`)."""

    def split(
        self, fields: gguf_blocks.Q4KFields, q: np.ndarray, count: int, supers: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        halves = np.stack([fields.d, fields.dmin], axis=-1).reshape(count, supers, 2)
        return [fields.scales.reshape(count, supers, 8), fields.mins.reshape(count, supers, 8)], halves

    def join(self, parts: list[np.ndarray], halves: np.ndarray, q: np.ndarray) -> gguf_blocks.Q4KFields:
        return gguf_blocks.Q4KFields(halves[:, 0], halves[:, 1], parts[0], parts[1], q.reshape(len(q), 8, 32))


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Q5KFormat(Q4KFormat):
    """q5_k: q4_k's fields with, after the nibbles, the 5th bits of each sub-block's values [8, 4]: bit c
    for element 4c + e, bit 4 + c for element 16 + 4c + e."""

    def split(
        self, fields: gguf_blocks.Q4KFields, q: np.ndarray, count: int, supers: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        scales_and_mins, halves = super().split(fields, q, count, supers)
        fifth = ((q >> 4) << FIFTH_BITS).sum(axis=(3, 4), dtype=np.uint8)  # [N, Ks, j, e]
        return [fifth, *scales_and_mins], halves

    def join(self, parts: list[np.ndarray], halves: np.ndarray, q: np.ndarray) -> gguf_blocks.Q4KFields:
        fifth = (parts[0].reshape(len(q), 8, 1, 1, 4) >> FIFTH_BITS) & 1  # [n, j, half, c, e]
        return super().join(parts[1:], halves, q | (fifth << 4))


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Q6KFormat(FieldBlockFormat):
    """q6_k: after the nibbles, the high 2 bits of the values, chunks c and c + 2 of both halves in a
    byte [8, 2, 4] (`HIGH_BITS`), and the int8 scales of the 16 runs of 16 weights [16]; d."""

    def split(
        self, fields: gguf_blocks.Q6KFields, q: np.ndarray, count: int, supers: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        high = (q >> 4).reshape(count, supers, 8, 2, 2, 2, 4)  # [N, Ks, j, half, c // 2, c % 2, e]
        packed = (high << HIGH_BITS).sum(axis=(3, 4), dtype=np.uint8)  # [N, Ks, j, c % 2, e]
        scales = fields.scales.reshape(count, supers, 16).view(np.uint8)
        return [packed, scales], fields.d.reshape(count, supers, 1)

    def join(self, parts: list[np.ndarray], halves: np.ndarray, q: np.ndarray) -> gguf_blocks.Q6KFields:
        packed = parts[0].reshape(len(q), 8, 1, 1, 2, 4)  # [n, j, -, -, c % 2, e]
        high = ((packed >> HIGH_BITS) & 3).reshape(len(q), 8, 2, 4, 4)  # [n, j, half, c, e]
        return gguf_blocks.Q6KFields(
            halves[:, 0], parts[1].view(np.int8), (q | (high << 4)).reshape(len(q), 256)
        )
