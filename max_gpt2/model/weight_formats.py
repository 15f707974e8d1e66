"""Weight formats: how the language model stores its projections and LM head, one object each.

A decoding step reads every weight once, so its speed is bytes of weights over memory bandwidth.
Besides float32, the projections and the LM head may be stored in fewer bytes (the sums stay
float32; as in llama.cpp the kernels round each product's input to bfloat16 against bfloat16
weights, to int8 blocks against q8_0 and q4_0):

    float32   4 bytes a weight; the embeddings, biases and layer norms always stay so
    bfloat16  the top half of each float32 (round to nearest even), 2 bytes a weight
    q8_0      llama.cpp's blocks of 32 int8 values and a float16 scale, 1.0625 bytes a weight
    q4_0      llama.cpp's blocks of 32 4-bit values and a float16 scale, 0.5625 bytes a weight

(`block_quants` has q8_0's and q4_0's arithmetic.) `FORMATS` is the registry, by name;
`format_named(name)` looks one up, refusing a name it lacks with the list. Checkpoints may also
store formats that load as the float32 values they stand for: `FLOAT16` (GGUF's F16) and
`GGML_BLOCKS`, llama.cpp's other block types (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: `gguf_blocks`
decodes them, `gguf_quantizers` writes them for llama-quantize's mixes, `gguf_mixes`);
`BY_GGML_TYPE` has every format a GGUF file is read in. A format knows:

- its name, bytes a weight, llama.cpp's ggml type and `general.file_type`;
- `rows` / `values`: a weight [N, K] to and from the rows GGUF stores (float32, float16, bfloat16
  bits, or blocks of bytes);
- `stored` / `pack` / `unpack`: what a linear layer binds (a "weight", and "scales" for blocks), in
  the kernels' layout (`kernel_layout`), from those rows and back to float32;
- `matmul_op` / `dequantize_op`: the Mojo ops that multiply by it, or unpack it in a graph;
- whether it runs only through the kernels (`kernels_only`: every format but float32, on the CPU
  in float32 compute; `check_runs`), is quantized (then it loads only as itself or as float32),
  and the KV cache's dtype beside it (`cache_dtype`: float16 by default beside a packed format).

No other module compares a format's name; each asks its format.
"""

from __future__ import annotations

from collections.abc import Callable
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
    interleave_bfloat16,
    interleave_blocks,
)
from max_gpt2.model.weight_adapters import CONV1D_WEIGHTS


class Stored(NamedTuple):
    """One array a linear layer binds in a format: its shape, NumPy dtype and the dtype MAX reads it as."""

    shape: tuple[int, ...]
    dtype: str
    max_dtype: DType


@dataclass(frozen=True, eq=False, repr=False)
class WeightFormat:
    """A way to store the projections and the LM head; float32 itself (see the module docstring)."""

    name: str
    bytes_per_weight: float
    ggml_type: str  # llama.cpp's name of its tensor type
    file_type: int  # llama.cpp's `general.file_type` of a file whose projections are in it
    kernels_only: bool = False  # stored in the kernels' layout, which MAX's own ops do not read
    quantized: bool = False  # rounded to blocks: reloading it into another quantized format is refused
    matmul_op: str = "skinny_matmul"
    dequantize_op: str | None = None  # the op that unpacks it to float32 in a graph, if not a cast

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<weight format {self.name}>"

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


@dataclass(frozen=True, eq=False, repr=False)
class Float16Format(WeightFormat):
    """GGUF's F16, read and widened to float32 (exactly): not a format to store in."""

    def rows(self, weight: np.ndarray) -> np.ndarray:
        return weight.astype(np.float16)

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return rows.astype(np.float32)

    @property
    def loads_as(self) -> WeightFormat:
        return FLOAT32


@dataclass(frozen=True, eq=False, repr=False)
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


@dataclass(frozen=True, eq=False, repr=False)
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
        dtype = np.dtype(self.code.dtype).name
        return {
            "weight": Stored((groups, blocks * values), dtype, DType[dtype]),
            "scales": Stored((groups, blocks * GROUP), "float16", DType.float16),
        }

    def pack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        weight, scales = interleave_blocks(rows, self.code)
        return {"weight": weight, "scales": scales}

    def unpack(self, arrays: dict[str, np.ndarray], out_dim: int, in_dim: int) -> np.ndarray:
        values, scales = deinterleave_blocks(arrays["weight"], arrays["scales"], self.code, out_dim)
        return self.code.dequantize(values, scales, in_dim)


@dataclass(frozen=True, eq=False, repr=False)
class GGMLBlockFormat(WeightFormat):
    """One of llama.cpp's other block types: GGUF files hold it (a `gguf_mixes` preset writes it), and it
    loads as the float32 values it stands for; no kernel reads it."""

    decode: Callable[[np.ndarray], np.ndarray] = gguf_blocks.q4_1
    encode: Callable[[np.ndarray], np.ndarray] = gguf_quantizers.q4_1
    block: tuple[int, int] = (32, 20)  # weights, bytes

    @property
    def loads_as(self) -> WeightFormat:
        return FLOAT32

    @property
    def gguf_block(self) -> tuple[int, int]:
        return self.block

    def rows(self, weight: np.ndarray) -> np.ndarray:
        return self.encode(weight)

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return self.decode(rows.reshape(-1, self.block[1])).reshape(shape)


def _ggml_blocks(
    name: str,
    file_type: int,
    decode: Callable[[np.ndarray], np.ndarray],
    encode: Callable[[np.ndarray], np.ndarray],
    block: tuple[int, int],
) -> GGMLBlockFormat:
    return GGMLBlockFormat(
        name,
        block[1] / block[0],
        name.upper(),
        file_type,
        quantized=True,
        decode=decode,
        encode=encode,
        block=block,
    )


FLOAT32 = WeightFormat("float32", 4.0, "F32", 0)
FLOAT16 = Float16Format("float16", 2.0, "F16", 1)
BFLOAT16 = BFloat16Format("bfloat16", 2.0, "BF16", 32, kernels_only=True, matmul_op="packed_matmul_bf16")
Q8_0 = BlockFormat(
    "q8_0", 34 / 32, "Q8_0", 7, True, True, "packed_matmul_q8_0", "dequantize_q8_0", code=Q8_0_CODE
)
Q4_0 = BlockFormat(
    "q4_0", 18 / 32, "Q4_0", 2, True, True, "packed_matmul_q4_0", "dequantize_q4_0", code=Q4_0_CODE
)

FORMATS = {f.name: f for f in (FLOAT32, BFLOAT16, Q8_0, Q4_0)}
"""The formats the projections and the head may be stored in, by name."""
# llama.cpp's other types, and its `general.file_type` of a file mostly in each (Q4_K_M's, Q5_K_M's).
GGML_BLOCKS = (
    _ggml_blocks("q4_1", 3, gguf_blocks.q4_1, gguf_quantizers.q4_1, (32, 20)),
    _ggml_blocks("q5_0", 8, gguf_blocks.q5_0, gguf_quantizers.q5_0, (32, 22)),
    _ggml_blocks("q5_1", 9, gguf_blocks.q5_1, gguf_quantizers.q5_1, (32, 24)),
    _ggml_blocks("q4_k", 15, gguf_blocks.q4_k, gguf_quantizers.q4_k, (256, 144)),
    _ggml_blocks("q5_k", 17, gguf_blocks.q5_k, gguf_quantizers.q5_k, (256, 176)),
    _ggml_blocks("q6_k", 18, gguf_blocks.q6_k, gguf_quantizers.q6_k, (256, 210)),
)
BY_GGML_TYPE = {f.ggml_type: f for f in (FLOAT32, FLOAT16, BFLOAT16, Q8_0, Q4_0, *GGML_BLOCKS)}
"""The formats a GGUF file's tensors are read in, by llama.cpp's type name."""
NAMED = {f.name: f for f in BY_GGML_TYPE.values()}
"""Every format by name, float16 included: also how a compute dtype stores weights (its bytes)."""


def format_named(value: str | WeightFormat, source: str = "weight_format") -> WeightFormat:
    """The format `value` names (or `value` itself), else a ValueError listing `FORMATS`, naming `source`."""
    if isinstance(value, WeightFormat) and FORMATS.get(value.name) is value:
        return value
    found = FORMATS.get(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"{source} must be one of {', '.join(FORMATS)}; got {value!r}")
    return found


def is_packed(name: str) -> bool:
    """Whether parameter `name` is stored in the chosen format: the projections and the LM head."""
    return name.endswith(CONV1D_WEIGHTS) or name == "lm_head.weight"


def is_stored_packed(name: str, weight_format: WeightFormat) -> bool:
    """Whether the array bound as `name` is in `weight_format`'s own dtypes (a packed weight or its
    scales) rather than float32."""
    return weight_format.kernels_only and (is_packed(name) or name.endswith(".scales"))


def stored_name(name: str, part: str) -> str:
    """Where part `part` ("weight", "scales") of packed parameter `name` (`...c_attn.weight`) is bound."""
    return name.removesuffix("weight") + part
