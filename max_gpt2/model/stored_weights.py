"""Parameters as a compiled model binds them: each taken as a checkpoint stores it and put into a weight
format on its own, so a load holds one tensor in transit at a time.

A `SourceTensor` is one parameter as stored, in MAX layout `[out, in]`: float32, float16 or
bfloat16 (its bits, uint16) values, or GGUF's q8_0 / q4_0 blocks, uint8 `[rows, row bytes]`
(`weight_formats.to_blocks`). `store` gives what is bound for it in a weight format
(`weight_formats`' layouts): the projections and the LM head packed, the rest float32. Packed
blocks go to the kernel's layout as a shuffle of their bytes, never through float32; float
values are quantized or rounded. A quantized tensor loads only in its own format or as the
float32 values it stands for (`check_conversion`): quantizing it again would add a second error.

`StoredWeights` marks arrays already stored so (`store`, `pack`): `devices.weight_buffers` binds
them as they are. Where the head is tied and the format float32, the head is the embedding's very
array (`aliases`), bound once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from max_gpt2.model.config import GPT2Config
from max_gpt2.model.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.weight_adapters import model_parameter_shapes
from max_gpt2.model.weight_formats import (
    BLOCK,
    CHUNK,
    GROUP,
    check_format,
    deinterleave,
    deinterleave_bfloat16,
    dequantize,
    from_blocks,
    interleave_bfloat16,
    interleave_blocks,
    is_packed,
    quantize,
    scales_name,
    to_blocks,
)

QUANTIZED = ("q8_0", "q4_0")
TIED_HEAD = {"lm_head.weight": "transformer.wte.weight"}


@dataclass(frozen=True)
class SourceTensor:
    """One parameter as a checkpoint stores it: `format` ("float32", "float16", "bfloat16", "q8_0" or
    "q4_0"), its `data` (module docstring) and its MAX-layout `shape`."""

    format: str
    data: np.ndarray
    shape: tuple[int, ...]


class WeightSource(Protocol):
    """A checkpoint `stored_tensors` reads: its config, whether its head is `wte`, its parameters."""

    config: GPT2Config
    tied: bool

    def tensor(self, name: str) -> SourceTensor:
        """Parameter `name` (our module name) as stored; a tied head is `wte`."""


class StoredWeights(dict):
    """Arrays in a weight format's bound layout (`store`), by the name each binds to."""


def to_float32(tensor: SourceTensor) -> np.ndarray:
    """The float32 values a stored tensor stands for (exact for each source format); float32 data as it is."""
    if tensor.format == "float32":
        return tensor.data
    if tensor.format == "float16":
        return tensor.data.astype(np.float32)
    if tensor.format == "bfloat16":
        return bfloat16_bits_to_float32(tensor.data)
    values, scales = from_blocks(tensor.data, tensor.format)
    return dequantize(values, scales, tensor.format, tensor.shape[-1]).reshape(tensor.shape)


def check_conversion(source_format: str, weight_format: str, source: str) -> None:
    """Refuses quantizing weights already quantized into another format, naming `source`."""
    if source_format in QUANTIZED and weight_format not in (source_format, "float32"):
        raise ValueError(
            f"{source} is {source_format}; it loads as {source_format} or as float32 (the values it "
            f"stands for), not as {weight_format}: quantizing it again would add a second error"
        )


def in_format(tensor: SourceTensor, weight_format: str) -> np.ndarray:
    """A projection's weight in `weight_format`, row by row as GGUF stores it: float32 [N, K], bfloat16
    bits [N, K], or q8_0 / q4_0 blocks [N, row bytes]; as stored where it is in that format already."""
    if tensor.format == weight_format:
        return tensor.data
    if weight_format == "float32":
        return to_float32(tensor)
    if weight_format == "bfloat16":
        return float32_to_bfloat16_bits(to_float32(tensor))
    return to_blocks(*quantize(to_float32(tensor), weight_format), weight_format)


def store(name: str, tensor: SourceTensor, weight_format: str) -> dict[str, np.ndarray]:
    """Parameter `name` as bound in `weight_format`: packed (with its scales) if it is a projection or
    the head, else float32. Float32 data is not copied where it stays float32."""
    if weight_format == "float32" or not is_packed(name):
        return {name: to_float32(tensor)}
    rows = in_format(tensor, weight_format)
    if weight_format == "bfloat16":
        return {name: interleave_bfloat16(rows)}
    stored, scales = interleave_blocks(rows, weight_format)
    return {name: stored, scales_name(name): scales}


def aliases(tied: bool, weight_format: str) -> dict[str, str]:
    """Bound names that are another's array: the tied head is `wte`'s in float32 (packed, it is its own)."""
    return dict(TIED_HEAD) if tied and weight_format == "float32" else {}


def stored_layout(
    config: GPT2Config, weight_format: str, tied: bool
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every array `stored_tensors` yields, in order: its shape and NumPy dtype name (aliases left out)."""
    layout: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, shape in model_parameter_shapes(config).items():
        if name in aliases(tied, weight_format):
            continue
        if weight_format == "float32" or not is_packed(name):
            layout[name] = (shape, "float32")
            continue
        groups, blocks = -(-shape[0] // GROUP), -(-shape[1] // BLOCK)
        if weight_format == "bfloat16":
            layout[name] = ((groups, -(-shape[1] // CHUNK) * CHUNK * GROUP), "uint16")
            continue
        per_block = GROUP * BLOCK if weight_format == "q8_0" else GROUP * BLOCK // 2
        layout[name] = ((groups, blocks * per_block), "int8" if weight_format == "q8_0" else "uint8")
        layout[scales_name(name)] = ((groups, blocks * GROUP), "float16")
    return layout


def stored_tensors(source: WeightSource, weight_format: str) -> Iterator[tuple[str, np.ndarray]]:
    """`source`'s parameters as bound in `weight_format`, one at a time, in `stored_layout`'s order."""
    for name in model_parameter_shapes(source.config):
        if name not in aliases(source.tied, weight_format):
            yield from store(name, source.tensor(name), weight_format).items()


def with_aliases(arrays: Mapping[str, np.ndarray], tied: bool, weight_format: str) -> StoredWeights:
    """`arrays` (`stored_tensors`' names) with each alias bound to its target's array."""
    stored = StoredWeights(arrays)
    for alias, target in aliases(tied, weight_format).items():
        stored[alias] = stored[target]
    return stored


def pack(weights: Mapping[str, np.ndarray], format: str) -> StoredWeights:
    """float32 parameters (MAX layout) -> the same with each projection and the LM head in `format`.

    bfloat16 weights come back as their interleaved uint16 bit patterns; q8_0 and q4_0 as
    their interleaved values under the weight's name and their scales under `scales_name`. Arrays
    shared under several names (a tied head) are converted once per name they are packed under.
    """
    check_format(format)
    packed = StoredWeights()
    for name, array in weights.items():
        packed |= store(name, SourceTensor("float32", array, array.shape), format)
    return packed


def unpack(
    packed: Mapping[str, np.ndarray], format: str, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """The float32 weights the packed ones stand for (what the model computes with), by parameter name."""
    weights = {}
    for name, shape in shapes.items():
        if format == "float32" or not is_packed(name):
            weights[name] = packed[name]
        elif format == "bfloat16":
            weights[name] = bfloat16_bits_to_float32(deinterleave_bfloat16(packed[name], *shape))
        else:
            values, scales = deinterleave(packed[name], packed[scales_name(name)], format, shape[0])
            weights[name] = dequantize(values, scales, format, shape[1])
    return weights


def check_stored(
    arrays: Mapping[str, np.ndarray], layout: Mapping[str, tuple[tuple[int, ...], str]], source: str
) -> None:
    """Refuses arrays that are not exactly `layout`'s names, shapes and dtypes, naming the first misfit."""
    missing, unexpected = sorted(set(layout) - set(arrays)), sorted(set(arrays) - set(layout))
    if missing or unexpected:
        raise ValueError(f"{source} do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, (shape, dtype) in layout.items():
        array = arrays[name]
        if array.shape != shape or array.dtype != np.dtype(dtype):
            raise ValueError(
                f"{source}: {name} is {array.dtype} {list(array.shape)}, expected {dtype} {list(shape)}"
            )
