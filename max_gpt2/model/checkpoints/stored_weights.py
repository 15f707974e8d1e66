"""Parameters as a compiled model binds them: each taken as a checkpoint stores it and put into a weight
format on its own, so a load holds one tensor in transit at a time.

A `SourceTensor` is one parameter as stored, in MAX layout `[out, in]`: the rows its format stores
(`TensorFormat.rows`: float32, float16 or bfloat16 bits, or GGUF's blocks of bytes). `store` gives
what is bound for it in a weight format (`TensorFormat.pack`): the projections, the LM head
and the token embedding packed, the rest float32. Packed blocks go to the kernel's layout as a
shuffle of their bytes, never through float32; float values are quantized or rounded. A
quantized tensor loads only in its own format or as the float32 values it stands for
(`requantizing`): quantizing it again would add a second error.

`StoredWeights` marks arrays already stored so (`store`, `pack`): `devices.weight_buffers` binds
them as they are. Where the head is tied it is the embedding's very arrays (`aliases`), packed or
float32, bound once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from max_gpt2.model.checkpoints.weight_adapters import CheckpointError, check_model_weights
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FLOAT32, TensorFormat, WeightFormat
from max_gpt2.model.parameters import is_packed, model_parameter_shapes, stored_name

TIED_HEAD = {"lm_head.weight": "transformer.wte.weight"}


@dataclass(frozen=True)
class SourceTensor:
    """One parameter as a checkpoint stores it: its `format`, its `data` (rows as the format stores them,
    `TensorFormat.rows`), its MAX-layout `shape`, and where it lies, for messages."""

    format: TensorFormat
    data: np.ndarray
    shape: tuple[int, ...]
    where: str = "a tensor"


class WeightSource(Protocol):
    """A checkpoint `stored_tensors` reads: its config, whether its head is `wte`, its parameters."""

    config: GPT2Config
    tied: bool

    def tensor(self, name: str) -> SourceTensor:
        """Parameter `name` (our module name) as stored; a tied head is `wte`."""


class Stored(Protocol):
    """A checkpoint's config and formats: what it loads as when none is asked for, and the formats its
    projections and head are stored in (a GGUF file may mix several)."""

    path: Path
    config: GPT2Config
    weight_format: WeightFormat
    source_formats: frozenset[TensorFormat]


class StoredWeights(dict):
    """Arrays in a weight format's bound layout (`store`), by the name each binds to."""


def to_float32(tensor: SourceTensor) -> np.ndarray:
    """The float32 values a stored tensor stands for (exact for each source format); float32 data as it is.
    Quantized blocks whose scales are not finite numbers are refused, naming the tensor (`where`)."""
    with np.errstate(invalid="ignore", over="ignore"):  # a corrupt scale is refused just below
        values = tensor.format.values(tensor.data, tensor.shape)
    if tensor.format.quantized and not np.isfinite(values).all():
        raise CheckpointError(f"{tensor.where}: a block's scale is not a finite number (a corrupt file?)")
    return values


def choose_format(checkpoint: Stored, requested: WeightFormat | None) -> WeightFormat:
    """The format `checkpoint` loads in: `requested`, else its own, unless `requantizing` refuses it."""
    chosen = checkpoint.weight_format if requested is None else requested
    if refused := requantizing(checkpoint, chosen):
        raise ValueError(refused)
    return chosen


def requantizing(checkpoint: Stored, target: object) -> str | None:
    """Why `checkpoint` may not be stored as `target` (a format, or a `gguf_mixes.Mix` to write), else None.
    Weights already quantized load only as the format they are in (where it is one of ours) or as the
    float32 values they stand for: quantizing them again would add a second error."""
    sources = checkpoint.source_formats
    if not any(source.quantized for source in sources):
        return None
    allowed = dict.fromkeys([checkpoint.weight_format, FLOAT32])  # its own (one type, or a mix), float32
    if target in allowed:
        return None
    stored = ", ".join(sorted(source.name for source in sources))
    return (
        f"{checkpoint.path} is {stored}; it loads as {' or as '.join(map(str, allowed))} (the "
        f"values it stands for), not as {target}: quantizing it again would add a second error"
    )


def in_format(tensor: SourceTensor, weight_format: TensorFormat) -> np.ndarray:
    """A projection's weight in `weight_format`, row by row as GGUF stores it (`TensorFormat.rows`); as
    stored where it is in that format already."""
    if tensor.format is weight_format:
        return tensor.data
    return weight_format.rows(to_float32(tensor))


def store(name: str, tensor: SourceTensor, weight_format: WeightFormat) -> dict[str, np.ndarray]:
    """Parameter `name` as bound in `weight_format`: packed (with its scales) if it is a projection, the
    head or the token embedding and the format packs, else float32. Float32 data is not copied where
    it stays float32."""
    if not weight_format.kernels_only or not is_packed(name):
        return {name: to_float32(tensor)}
    own = weight_format.format_for(name)
    packed = own.pack(in_format(tensor, own))
    return {stored_name(name, part): array for part, array in packed.items()}


def aliases(tied: bool, weight_format: WeightFormat) -> dict[str, str]:
    """Bound names that are another's array: a tied head is `wte`'s, packed (its weight and scales,
    in the head's format, which a tied file gives `wte` too) or float32."""
    if not tied:
        return {}
    if not weight_format.kernels_only:
        return dict(TIED_HEAD)
    ((head, wte),) = TIED_HEAD.items()
    table, embedding = weight_format.format_for(head), weight_format.format_for(wte)
    if embedding is not table:
        raise ValueError(
            f"a tied head is the token embedding's table: {weight_format} stores {head} as {table} "
            f"but {wte} as {embedding}"
        )
    return {stored_name(head, part): stored_name(wte, part) for part in table.arrays}


def stored_layout(
    config: GPT2Config, weight_format: WeightFormat, tied: bool
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every array `stored_tensors` yields, in order: its shape and NumPy dtype name (aliases left out)."""
    layout: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, shape in model_parameter_shapes(config).items():
        if name in aliases(tied, weight_format):
            continue
        if not weight_format.kernels_only or not is_packed(name):
            layout[name] = (shape, "float32")
            continue
        for part, stored in weight_format.format_for(name).stored(*shape).items():
            layout[stored_name(name, part)] = (stored.shape, stored.dtype)
    return layout


def stored_tensors(source: WeightSource, weight_format: WeightFormat) -> Iterator[tuple[str, np.ndarray]]:
    """`source`'s parameters as bound in `weight_format`, one at a time, in `stored_layout`'s order."""
    for name in model_parameter_shapes(source.config):
        if name not in aliases(source.tied, weight_format):
            yield from store(name, source.tensor(name), weight_format).items()


def with_aliases(arrays: Mapping[str, np.ndarray], tied: bool, weight_format: WeightFormat) -> StoredWeights:
    """`arrays` (`stored_tensors`' names) with each alias bound to its target's array."""
    stored = StoredWeights(arrays)
    for alias, target in aliases(tied, weight_format).items():
        stored[alias] = stored[target]
    return stored


def pack(weights: Mapping[str, np.ndarray], weight_format: WeightFormat) -> StoredWeights:
    """float32 parameters (MAX layout) -> the same with the projections, the LM head and the token
    embedding in `weight_format` (`store`). A tied head (`wte`'s very array under its name, as
    `Checkpoint.model_weights` hands it out) is converted once and bound as `wte`'s (`aliases`)."""
    ((head, wte),) = TIED_HEAD.items()
    tied = head in weights and weights[head] is weights.get(wte)
    left_out = aliases(tied, weight_format)
    packed = StoredWeights()
    for name, array in weights.items():
        if name not in left_out:
            packed |= store(name, SourceTensor(FLOAT32, array, array.shape), weight_format)
    return with_aliases(packed, tied, weight_format)


def unpack(
    packed: Mapping[str, np.ndarray], weight_format: WeightFormat, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """The float32 weights the packed ones stand for (what the model computes with), by parameter name."""
    weights = {}
    for name, shape in shapes.items():
        if not weight_format.kernels_only or not is_packed(name):
            weights[name] = packed[name]
            continue
        own = weight_format.format_for(name)
        parts = {part: packed[stored_name(name, part)] for part in own.stored(*shape)}
        weights[name] = own.unpack(parts, *shape)
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


def check_lm_weights(
    weights: Mapping[str, Any], config: GPT2Config, weight_format: WeightFormat
) -> Mapping[str, np.ndarray]:
    """float32 parameters checked against `config` (`check_model_weights`), or `StoredWeights` checked
    against `weight_format`'s stored layout (`check_stored`)."""
    if isinstance(weights, StoredWeights):
        check_stored(weights, stored_layout(config, weight_format, tied=False), "the stored weights")
        return weights
    return check_model_weights(weights, config)
