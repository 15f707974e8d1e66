"""What a weight format is: `WeightFormat`, how a model's packed parameters are stored (one
`TensorFormat` for all of them, or a file's mix, `mixed.MixedFormat`), and `TensorFormat`, how one
tensor is: float32 itself, GGUF's F16 (read as float32) and bfloat16 here, the blocks in `blocks`.

A `TensorFormat` turns a float32 weight [N, K] into the rows GGUF stores (`rows`, back with
`values`) and those rows into what a linear layer binds in the kernels' layout (`stored`, `pack`,
`unpack`; `kernel_layout`); `kernel_format` is its code in the Mojo kernels
(`max_gpt2/kernels/packed_layout.mojo`), 0 for rows of floats.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from max.dtype import DType

from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.formats.kernel_layout import CHUNK, GROUP, deinterleave_bfloat16, interleave_bfloat16
from max_gpt2.model.parameters import is_packed


class Stored(NamedTuple):
    """One array a linear layer binds in a format: its shape, NumPy dtype and the dtype MAX reads it as."""

    shape: tuple[int, ...]
    dtype: str
    max_dtype: DType


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class WeightFormat(ABC):
    """How a model's projections, LM head and token embedding are stored: one `TensorFormat` for all, or
    a file's `MixedFormat`, each tensor in its own (`format_for`)."""

    name: str
    bytes_per_weight: float  # a mix's: its widest format's
    ggml_type: str  # llama.cpp's name of its tensor type (a mix's: its commonest)
    file_type: int  # llama.cpp's `general.file_type` of a file whose projections are in it
    kernels_only: bool = False  # stored in the kernels' layout, which MAX's own ops do not read
    quantized: bool = False  # rounded to blocks: reloading it into another quantized format is refused

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<weight format {self.name}>"

    @abstractmethod
    def format_for(self, name: str) -> TensorFormat:
        """The format parameter `name` is stored in."""

    @property
    @abstractmethod
    def built_as(self) -> TensorFormat:
        """The format a model's packed modules are built in before each takes its own (`format_for`)."""

    def binds_own_dtype(self, name: str) -> bool:
        """Whether the array bound as `name` is in this format's own dtypes (a packed weight or its
        scales) rather than float32."""
        return self.kernels_only and (is_packed(name) or name.endswith(".scales"))

    @property
    def half_cache(self) -> bool:
        """Whether the KV cache defaults to float16 beside it, as llama.cpp keeps its own (packed formats)."""
        return self.kernels_only

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


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class TensorFormat(WeightFormat):
    """One format for every packed tensor; float32 itself (rows of float32, bound as they are)."""

    kernel_format: int = 0  # the kernels' code for it (packed_layout.mojo); 0: rows of floats

    def format_for(self, name: str) -> TensorFormat:
        return self

    @property
    def built_as(self) -> TensorFormat:
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
    def loads_as(self) -> TensorFormat:
        """The format its tensors load as when none is asked for."""
        return self

    @property
    def gguf_block(self) -> tuple[int, int]:
        """A block of its GGUF rows: (weights, bytes)."""
        return 1, int(self.bytes_per_weight)

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
class Float16Format(TensorFormat):
    """GGUF's F16, read and widened to float32 (exactly): not a format to store in."""

    float32: TensorFormat  # what it loads as

    def rows(self, weight: np.ndarray) -> np.ndarray:
        return weight.astype(np.float16)

    def values(self, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return rows.astype(np.float32)

    @property
    def loads_as(self) -> TensorFormat:
        return self.float32


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class BFloat16Format(TensorFormat):
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
