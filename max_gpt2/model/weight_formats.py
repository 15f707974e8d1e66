"""Weight formats: how the language model stores its projections, LM head and token embedding, one
object each.

A decoding step reads every weight once, so its speed is bytes of weights over memory bandwidth.
Besides float32, the projections, the LM head and the token embedding may be stored in fewer
bytes (a lookup unpacks the rows it takes; the sums stay float32; as in llama.cpp the kernels
round each product's input to bfloat16 against bfloat16 weights, to int8 blocks of 32 against
llama.cpp's blocks of 32, of 256 against the K-quants):

    float32   4 bytes a weight; the position embedding, biases and layer norms always stay so
    bfloat16  the top half of each float32 (round to nearest even), 2 bytes a weight
    q8_0      llama.cpp's blocks of 32 int8 values and a float16 scale, 1.0625 bytes a weight
    q4_0      llama.cpp's blocks of 32 4-bit values and a float16 scale, 0.5625 bytes a weight
    q4_1      its Q4_1: q4_0's with a float16 min a block, 0.625
    q5_0      its Q5_0: blocks of 32 5-bit values and a float16 scale, 0.6875
    q5_1      its Q5_1: q5_0's with a float16 min a block, 0.75
    q4_k      its Q4_K: super-blocks of 256, 4-bit values, 6-bit scales and mins, 0.578
    q5_k      its Q5_K: the same with 5-bit values, 0.703
    q6_k      its Q6_K: super-blocks of 256, 6-bit values, int8 scales per 16, 0.820

(`block_quants` has q8_0's and q4_0's arithmetic, `gguf_blocks` and `gguf_quantizers` the
others'.) `FORMATS` is the registry, by name; `format_named(name)` looks one up, refusing a name
it lacks with the list. A GGUF file mixing them (llama-quantize's presets, `gguf_mixes`) loads as
a `MixedFormat` (`mixed`), each tensor in its own. Checkpoints may also store GGUF's F16
(`FLOAT16`), which loads as the float32 values it stands for; `BY_GGML_TYPE` has every format a
GGUF file is read in. A
format knows:

- its name, bytes a weight, llama.cpp's ggml type and `general.file_type`;
- `rows` / `values`: a weight [N, K] to and from the rows GGUF stores (float32, float16, bfloat16
  bits, or blocks of bytes);
- `stored` / `pack` / `unpack`: what a linear layer binds (a "weight", and "scales" for blocks), in
  the kernels' layout (`kernel_layout`), from those rows and back to float32;
- `kernel_format`: its code in the kernels (`max_gpt2/kernels/packed_layout.mojo`), the
  compile-time parameter of the Mojo ops that multiply by it or unpack it (`gpt2_matmul`,
  `gpt2_dequantize`); 0 for rows of floats;
- whether it runs only through the kernels (`kernels_only`: every format but float32, on the CPU
  in float32 compute; `check_runs`), is quantized (then it loads only as itself or as float32),
  and the KV cache's dtype beside it (`cache_dtype`: float16 by default beside a packed format).

No other module compares a format's name; each asks its format.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from max.dtype import DType

from max_gpt2.model import gguf_blocks, gguf_quantizers
from max_gpt2.model.block_quants import BLOCK, Q4_0_CODE, Q8_0_CODE, BlockCode
from max_gpt2.model.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.kernel_layout import (
    CHUNK,
    GROUP,
    deinterleave_bfloat16,
    deinterleave_blocks,
    group_field,
    interleave_bfloat16,
    interleave_blocks,
    ungroup_field,
)
from max_gpt2.model.weight_adapters import CONV1D_WEIGHTS


class Stored(NamedTuple):
    """One array a linear layer binds in a format: its shape, NumPy dtype and the dtype MAX reads it as."""

    shape: tuple[int, ...]
    dtype: str
    max_dtype: DType


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class WeightFormat:
    """A way to store the projections and the LM head; float32 itself (see the module docstring)."""

    name: str
    bytes_per_weight: float
    ggml_type: str  # llama.cpp's name of its tensor type
    file_type: int  # llama.cpp's `general.file_type` of a file whose projections are in it
    kernels_only: bool = False  # stored in the kernels' layout, which MAX's own ops do not read
    quantized: bool = False  # rounded to blocks: reloading it into another quantized format is refused
    kernel_format: int = 0  # the kernels' code for it (packed_layout.mojo); 0: rows of floats

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<weight format {self.name}>"

    def format_for(self, name: str) -> WeightFormat:
        """The format parameter `name` is stored in: this one (a `MixedFormat` answers tensor by tensor)."""
        return self

    @property
    def built_as(self) -> WeightFormat:
        """The format a model's packed modules are built in before each takes its own (`format_for`)."""
        return self

    @property
    def arrays(self) -> tuple[str, ...]:
        """The arrays a linear layer binds in it, by parameter name ("weight", and "scales" for blocks)."""
        return tuple(self.stored(GROUP, 256))

    @property
    def weight_dtype(self) -> DType:
        """The dtype its weight is bound as: a layer's four products share one."""
        return self.stored(GROUP, 256)["weight"].max_dtype

    @property
    def half_cache(self) -> bool:
        """Whether the KV cache defaults to float16 beside it, as llama.cpp keeps its own (packed formats)."""
        return self.kernels_only

    @property
    def loads_as(self) -> WeightFormat:
        """The format its tensors load as when none is asked for."""
        return self

    @property
    def gguf_block(self) -> tuple[int, int]:
        """A block of its GGUF rows: (weights, bytes)."""
        return 1, int(self.bytes_per_weight)

    def check_runs(self, kernels_run: bool, where: str) -> WeightFormat:
        """Itself, where it runs: a format only the kernels read needs them (`kernels_run`: whether they
        run on the device and dtype `where` names); else a ValueError naming both."""
        if self.kernels_only and not kernels_run:
            raise ValueError(
                f"weight_format={self.name!r} is for decoding on the CPU in float32, not on {where}"
            )
        return self

    def cache_dtype(self, kv_cache: DType | None, compute: DType) -> DType:
        """The KV cache's dtype beside this format: `kv_cache` if asked (the compute dtype, or float16 for
        float32 compute), else float16 beside a packed format in float32 compute, as llama.cpp keeps
        its cache, and the compute dtype otherwise.

        Beside a packed format's own rounding a float16 cache's does not show in perplexity, and a
        batch's steps read half the cache's bytes (docs/performance.md). Float32 weights keep the cache
        in their dtype, Hugging Face's numbers.
        """
        if kv_cache is None:
            return DType.float16 if self.half_cache and compute == DType.float32 else compute
        if kv_cache != compute and not (kv_cache == DType.float16 and compute == DType.float32):
            raise ValueError(
                f"kv_cache={kv_cache.name!r} with {compute.name} compute: the cache is kept in the "
                "compute dtype, or in float16 for float32 compute"
            )
        return kv_cache

    def rows(self, weight: np.ndarray) -> np.ndarray:
        """A float32 weight [N, K] in this format, row by row as GGUF stores it."""
        return weight

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The float32 values GGUF rows in this format stand for, in `shape` (exact)."""
        return rows

    def stored(self, out_dim: int, in_dim: int) -> dict[str, Stored]:
        """What a linear layer of `out_dim` x `in_dim` binds, by parameter ("weight", "scales")."""
        return {"weight": Stored((out_dim, in_dim), "float32", DType.float32)}

    def pack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """GGUF rows in this format -> the arrays `stored` names, as the kernels read them."""
        return {"weight": rows}

    def unpack(self, arrays: dict[str, np.ndarray], out_dim: int, in_dim: int) -> np.ndarray:
        """The inverse of `pack`, to the float32 weight [out_dim, in_dim] the arrays stand for."""
        return arrays["weight"]


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Float16Format(WeightFormat):
    """GGUF's F16, read and widened to float32 (exactly): not a format to store in."""

    def rows(self, weight: np.ndarray) -> np.ndarray:
        return weight.astype(np.float16)

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return rows.astype(np.float32)

    @property
    def loads_as(self) -> WeightFormat:
        return FLOAT32


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class BFloat16Format(WeightFormat):
    """bfloat16 bit patterns (uint16), rows of 8 interleaved in chunks of 32 (`kernel_layout`)."""

    def rows(self, weight: np.ndarray) -> np.ndarray:
        return float32_to_bfloat16_bits(weight)

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return bfloat16_bits_to_float32(rows)

    def stored(self, out_dim: int, in_dim: int) -> dict[str, Stored]:
        groups, chunks = -(-out_dim // GROUP), -(-in_dim // CHUNK)
        return {"weight": Stored((groups, chunks * CHUNK * GROUP), "uint16", DType.bfloat16)}

    def pack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {"weight": interleave_bfloat16(rows)}

    def unpack(self, arrays: dict[str, np.ndarray], out_dim: int, in_dim: int) -> np.ndarray:
        return bfloat16_bits_to_float32(deinterleave_bfloat16(arrays["weight"], out_dim, in_dim))


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class BlockFormat(WeightFormat):
    """Blocks of 32 weights and a float16 scale (`block_quants.BlockCode`), 8 rows interleaved."""

    code: BlockCode = Q8_0_CODE

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
class FieldBlockFormat(WeightFormat, ABC):
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


# q5_k: the 5th bit of element 4c + e in bit c of its byte, of element 16 + 4c + e in bit 4 + c: [half, c, 1]
FIFTH_BITS = (np.arange(4, dtype=np.uint8) + np.array([[0], [4]], np.uint8))[..., None]

# q6_k: where a value's high 2 bits sit in its byte, by [half, c // 2] (the kernel takes them to bits
# 4-5 with one shift and a mask): chunks 0 and 1 in bits 4-7, chunks 2 and 3 in bits 0-3.
HIGH_BITS = np.array([[4, 0], [6, 2]], np.uint8).reshape(2, 2, 1, 1)


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


# The registry, one named field a column. `quantized` formats round to blocks; `kernels_only` ones
# are stored in the kernels' layout; `kernel_format` is the kernels' code (packed_layout.mojo).
FLOAT32 = WeightFormat(name="float32", bytes_per_weight=4.0, ggml_type="F32", file_type=0)
FLOAT16 = Float16Format(name="float16", bytes_per_weight=2.0, ggml_type="F16", file_type=1)
BFLOAT16 = BFloat16Format(
    name="bfloat16", bytes_per_weight=2.0, ggml_type="BF16", file_type=32, kernels_only=True
)
PACKED = {"kernels_only": True, "quantized": True}
Q8_0 = BlockFormat(
    name="q8_0",
    bytes_per_weight=34 / 32,
    ggml_type="Q8_0",
    file_type=7,
    kernel_format=1,
    code=Q8_0_CODE,
    **PACKED,
)
Q4_0 = BlockFormat(
    name="q4_0",
    bytes_per_weight=18 / 32,
    ggml_type="Q4_0",
    file_type=2,
    kernel_format=2,
    code=Q4_0_CODE,
    **PACKED,
)
# llama.cpp's other blocks of 32: the 4-bit values (q4_0's layout), then the 5th bits [1, 4] for the
# 5-bit ones; d, and a min for the _1 types.
FOUR_BITS, FIFTH_BIT = ((1, 4, 4), 1), ((1, 4), 1)
Q4_1 = SmallBlockFormat(
    name="q4_1",
    bytes_per_weight=20 / 32,
    ggml_type="Q4_1",
    file_type=3,
    kernel_format=6,
    **PACKED,
    block=(32, 20),
    halves=2,
    parts=(FOUR_BITS,),
    quantize=gguf_quantizers.q4_1,
    take_apart=gguf_blocks.q4_1_fields,
)
Q5_0 = SmallBlockFormat(
    name="q5_0",
    bytes_per_weight=22 / 32,
    ggml_type="Q5_0",
    file_type=8,
    kernel_format=7,
    **PACKED,
    block=(32, 22),
    halves=1,
    parts=(FOUR_BITS, FIFTH_BIT),
    quantize=gguf_quantizers.q5_0,
    take_apart=gguf_blocks.q5_0_fields,
)
Q5_1 = SmallBlockFormat(
    name="q5_1",
    bytes_per_weight=24 / 32,
    ggml_type="Q5_1",
    file_type=9,
    kernel_format=9,
    **PACKED,
    block=(32, 24),
    halves=2,
    parts=(FOUR_BITS, FIFTH_BIT),
    quantize=gguf_quantizers.q5_1,
    take_apart=gguf_blocks.q5_1_fields,
)
# The K-quants' super-blocks: the nibbles of 8 sub-blocks, then each format's fields (its class).
NIBBLES, SUB_BLOCKS = ((8, 4, 4), 1), ((8,), 0)
Q4_K = Q4KFormat(
    name="q4_k",
    bytes_per_weight=148 / 256,
    ggml_type="Q4_K",
    file_type=15,
    kernel_format=3,
    **PACKED,
    block=(256, 144),
    halves=2,
    parts=(NIBBLES, SUB_BLOCKS, SUB_BLOCKS),
    quantize=gguf_quantizers.q4_k,
    take_apart=gguf_blocks.q4_k_fields,
)
Q5_K = Q5KFormat(
    name="q5_k",
    bytes_per_weight=180 / 256,
    ggml_type="Q5_K",
    file_type=17,
    kernel_format=5,
    **PACKED,
    block=(256, 176),
    halves=2,
    parts=(NIBBLES, ((8, 4), 1), SUB_BLOCKS, SUB_BLOCKS),
    quantize=gguf_quantizers.q5_k,
    take_apart=gguf_blocks.q5_k_fields,
)
Q6_K = Q6KFormat(
    name="q6_k", bytes_per_weight=210 / 256, ggml_type="Q6_K", file_type=18, kernel_format=4, **PACKED,
    block=(256, 210), halves=1, parts=(NIBBLES, ((8, 2, 4), 1), ((16,), 0)), quantize=gguf_quantizers.q6_k,
    take_apart=gguf_blocks.q6_k_fields,
)  # fmt: skip

FORMATS = {f.name: f for f in (FLOAT32, BFLOAT16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)}
"""The formats the projections and the head may be stored in, by name."""
BY_GGML_TYPE = {f.ggml_type: f for f in (FLOAT32, FLOAT16, *FORMATS.values())}
"""The formats a GGUF file's tensors are read in, by llama.cpp's type name."""
NAMED = {f.name: f for f in BY_GGML_TYPE.values()}
"""Every format by name, float16 included: also how a compute dtype stores weights (its bytes)."""


LAYER_PRODUCT = re.compile(r"(transformer\.h\.\d+)\.((?:attn|mlp)\.c_(?:attn|proj|fc))\.weight")
"""A block's projection's parameter name: its block and its product (`attn.c_attn`, ...)."""


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class MixedFormat(WeightFormat):
    """A file's own mix of the kernels' formats (llama-quantize's presets: q4_k with q6_k, q4_0 beside a
    q6_k head): each projection and the head in its own (`format_for`), the modules built in `default`
    and then given theirs. It is not a format to pack a tensor in: ask `format_for`."""

    formats: tuple[tuple[str, WeightFormat], ...] = ()  # by parameter name
    default: WeightFormat = FLOAT32

    def format_for(self, name: str) -> WeightFormat:
        return dict(self.formats).get(name, self.default)

    def __eq__(self, other: object) -> bool:  # the same tensors in the same formats, opened twice
        return isinstance(other, MixedFormat) and other.formats == self.formats

    def __hash__(self) -> int:
        return hash(self.formats)

    @property
    def built_as(self) -> WeightFormat:
        return self.default

    def stored(self, out_dim: int, in_dim: int) -> dict[str, Stored]:
        raise TypeError(f"{self.name} stores each tensor in its own format: ask format_for(name)")


def mixed(formats: Mapping[str, WeightFormat]) -> WeightFormat | None:
    """The kernels' formats `formats` (the projections' and the head's, by parameter name) as one
    `MixedFormat`, or None where the decode-layer ops cannot take them: a float format (F32, F16), or
    a layer whose products are bound in different dtypes (bfloat16 beside blocks)."""
    if not all(format.name in FORMATS and format.kernels_only for format in formats.values()):
        return None
    layers: dict[str, dict[str, WeightFormat]] = {}  # a block's products' formats, by product
    for name, format in formats.items():
        if found := LAYER_PRODUCT.fullmatch(name):
            layers.setdefault(found[1], {})[found[2]] = format
    for products in layers.values():
        if len({format.weight_dtype for format in products.values()}) > 1:
            return None
    counts = Counter(formats.values())
    default = counts.most_common(1)[0][0]
    name = "+".join(format.name for format, _ in counts.most_common())
    bytes_per_weight = max(format.bytes_per_weight for format in counts)  # at most that
    return MixedFormat(
        name=name,
        bytes_per_weight=bytes_per_weight,
        ggml_type=default.ggml_type,
        file_type=default.file_type,
        kernels_only=True,
        quantized=True,
        formats=tuple(sorted(formats.items())),
        default=default,
    )


def format_named(value: str | WeightFormat, source: str = "weight_format") -> WeightFormat:
    """The format `value` names (or `value` itself: one of `FORMATS`, or a file's `MixedFormat`), else a
    ValueError listing `FORMATS`, naming `source`."""
    if isinstance(value, MixedFormat) or (
        isinstance(value, WeightFormat) and FORMATS.get(value.name) is value
    ):
        return value  # one of ours, or a file's own mix of them
    found = FORMATS.get(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"{source} must be one of {', '.join(FORMATS)}; got {value!r}")
    return found


def is_packed(name: str) -> bool:
    """Whether parameter `name` is stored in the chosen format: the projections, the LM head and the
    token embedding (its lookup unpacks the rows it takes, `packed_linear.PackedEmbedding`)."""
    return name.endswith(CONV1D_WEIGHTS) or name in ("lm_head.weight", "transformer.wte.weight")


def is_stored_packed(name: str, weight_format: WeightFormat) -> bool:
    """Whether the array bound as `name` is in `weight_format`'s own dtypes (a packed weight or its
    scales) rather than float32."""
    return weight_format.kernels_only and (is_packed(name) or name.endswith(".scales"))


def stored_name(name: str, part: str) -> str:
    """Where part `part` ("weight", "scales") of packed parameter `name` (`...c_attn.weight`) is bound."""
    return name.removesuffix("weight") + part
