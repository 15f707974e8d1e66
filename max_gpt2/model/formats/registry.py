"""The formats, one object each, by name: `FORMATS` (what a model may be stored in), `BY_GGML_TYPE`
(what a GGUF file's tensors are read in, F16 too), `NAMED` (both, by name), `format_named`.

Each is built with named fields, or from a row of a table with named columns (`ROWS`): `quantized`
formats round to blocks; `kernels_only` ones are stored in the kernels' layout; `kernel_format` is the
kernels' code (packed_layout.mojo).
"""

from __future__ import annotations

from max_gpt2.model.formats import gguf_blocks, gguf_quantizers
from max_gpt2.model.formats.block_quants import Q4_0_CODE, Q8_0_CODE
from max_gpt2.model.formats.blocks import (
    BlockFormat,
    FieldBlockFormat,
    Q4KFormat,
    Q5KFormat,
    Q6KFormat,
    SmallBlockFormat,
)
from max_gpt2.model.formats.format import BFloat16Format, Float16Format, TensorFormat, WeightFormat
from max_gpt2.model.formats.mixed import MixedFormat

FLOAT32 = TensorFormat(name="float32", bytes_per_weight=4.0, ggml_type="F32", file_type=0)
FLOAT16 = Float16Format(name="float16", bytes_per_weight=2.0, ggml_type="F16", file_type=1, float32=FLOAT32)
BFLOAT16 = BFloat16Format(
    name="bfloat16", bytes_per_weight=2.0, ggml_type="BF16", file_type=32, kernels_only=True
)
# The block formats are quantized and kept in the kernels' layout (their classes' defaults).
Q8_0 = BlockFormat(
    name="q8_0", bytes_per_weight=34 / 32, ggml_type="Q8_0", file_type=7, kernel_format=1, code=Q8_0_CODE
)
Q4_0 = BlockFormat(
    name="q4_0", bytes_per_weight=18 / 32, ggml_type="Q4_0", file_type=2, kernel_format=2, code=Q4_0_CODE
)
# The formats whose blocks are read field by field: a table, one row each (llama.cpp's types).
# `block`: weights and GGUF bytes; `halves`: float16 a row a block in "scales"; `parts`: each weight
# field's shape a block and its axes. The blocks of 32 hold 4-bit values (q4_0's layout), then the 5th
# bits [1, 4] for the 5-bit ones; d, and a min for the _1 types. The K-quants' super-blocks hold the
# nibbles of 8 sub-blocks, then each format's fields (its class).
FOUR_BITS, FIFTH_BIT = ((1, 4, 4), 1), ((1, 4), 1)
NIBBLES, SUB_BLOCKS = ((8, 4, 4), 1), ((8,), 0)
COLUMNS = ("kind", "name", "bytes_per_weight", "file_type", "kernel_format", "block", "halves", "parts")
ROWS = (
    (SmallBlockFormat, "q4_1", 20 / 32, 3, 6, (32, 20), 2, (FOUR_BITS,)),
    (SmallBlockFormat, "q5_0", 22 / 32, 8, 7, (32, 22), 1, (FOUR_BITS, FIFTH_BIT)),
    (SmallBlockFormat, "q5_1", 24 / 32, 9, 9, (32, 24), 2, (FOUR_BITS, FIFTH_BIT)),
    (Q4KFormat, "q4_k", 148 / 256, 15, 3, (256, 144), 2, (NIBBLES, SUB_BLOCKS, SUB_BLOCKS)),
    (Q5KFormat, "q5_k", 180 / 256, 17, 5, (256, 176), 2, (NIBBLES, ((8, 4), 1), SUB_BLOCKS, SUB_BLOCKS)),
    (Q6KFormat, "q6_k", 210 / 256, 18, 4, (256, 210), 1, (NIBBLES, ((8, 2, 4), 1), ((16,), 0))),
)


def field_block_format(row: tuple) -> FieldBlockFormat:
    """One row of `ROWS`: its llama.cpp type is its name in capitals, its quantizer and block reader
    are named after it in `gguf_quantizers` and `gguf_blocks`."""
    kind, name, *values = row
    columns = dict(zip(COLUMNS[1:], (name, *values), strict=True))
    quantize, take_apart = getattr(gguf_quantizers, name), getattr(gguf_blocks, f"{name}_fields")
    return kind(**columns, ggml_type=name.upper(), quantize=quantize, take_apart=take_apart)


Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K = (field_block_format(row) for row in ROWS)
FORMATS = {f.name: f for f in (FLOAT32, BFLOAT16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)}
"""The formats the projections and the head may be stored in, by name."""
BY_GGML_TYPE = {f.ggml_type: f for f in (FLOAT32, FLOAT16, *FORMATS.values())}
"""The formats a GGUF file's tensors are read in, by llama.cpp's type name."""
NAMED = {f.name: f for f in BY_GGML_TYPE.values()}
"""Every format by name, float16 included: also how a compute dtype stores weights (its bytes)."""


def format_named(value: str | WeightFormat, source: str = "weight_format") -> WeightFormat:
    """The format `value` names (or `value` itself: one of `FORMATS`, or a file's `MixedFormat`), else a
    ValueError listing `FORMATS`, naming `source`."""
    if isinstance(value, MixedFormat) or (
        isinstance(value, TensorFormat) and FORMATS.get(value.name) is value
    ):
        return value  # one of ours, or a file's own mix of them
    found = FORMATS.get(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"{source} must be one of {', '.join(FORMATS)}; got {value!r}")
    return found
