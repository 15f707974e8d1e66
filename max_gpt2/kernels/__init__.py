"""Mojo kernels for decoding on the CPU, and the thin functions that call them from a graph.

A decoding step computes one new token per row, so it reads every weight and the whole KV cache
to do a few multiply-adds with each value: its speed is memory bandwidth. Custom ops, written in
Mojo beside this file, do the step's heavy parts in one pass over memory each (CPU, float32
activations): the products in every weight format, the cached attention, a whole block as one op,
the same over MAX's paged cache for the server, and beam search's cache reorder.

`ops` stages them in a graph and says what each takes and returns (`skinny_matmul`,
`packed_matmul`, `decode_layer`, ...: the names re-exported here); each kind of product is one op,
its weight format a compile-time parameter (`gpt2_matmul`, `gpt2_dequantize`, the decode-layer
ops). Graphs load this directory compiled once into a `.mojoc` (`max_gpt2.kernels.package`). The
modules that put these behind GPT-2's parameter names are in `max_gpt2.model.layers.kernel_layers`; where
the kernels run is `max_gpt2.inference.devices.kernels_run_on`. docs/architecture.md lists the Mojo
files.
"""

from max_gpt2.kernels.ops import (
    LAYER_NORMS,
    LAYER_PRODUCTS,
    MOJO_PACKAGE,
    LayerParameters,
    StoredProduct,
    cached_attention,
    decode_layer,
    dequantize,
    kernel_library,
    layer_operands,
    packed_matmul,
    paged_attention,
    paged_decode_layer,
    reorder_rows,
    skinny_matmul,
)

__all__ = [
    "LAYER_NORMS",
    "LAYER_PRODUCTS",
    "MOJO_PACKAGE",
    "LayerParameters",
    "StoredProduct",
    "cached_attention",
    "decode_layer",
    "dequantize",
    "kernel_library",
    "layer_operands",
    "packed_matmul",
    "paged_attention",
    "paged_decode_layer",
    "reorder_rows",
    "skinny_matmul",
]
