"""Mojo kernels for decoding on the CPU, and the thin functions that call them from a graph.

A decoding step computes one new token per row, so it reads every weight and
the whole KV cache to do a few multiply-adds with each value: its speed is
memory bandwidth. Custom ops, written in Mojo beside this file, do the step's
heavy parts in one pass over memory each (CPU, float32 activations):

    skinny_matmul          x [M, K] @ W[N, K]^T + bias [N] -> [M, N]; each row of W is read
                           once for all M rows of x (M is batch x new tokens, a few at most)
                           (skinny_matmul.mojo)
    packed_matmul_FORMAT   the same with W in fewer bytes (`max_gpt2.model.weight_formats`):
                           bf16 (skinny_matmul.mojo's kernel, W widened in registers), q8_0
                           (int8 blocks of 32, a scale each) and q4_0 (4-bit blocks) with x
                           rounded to int8 blocks as llama.cpp does
                           (quantized_matmul.mojo; their layout: packed_layout.mojo)
    dequantize_FORMAT      q8_0 or q4_0 W back to float32 [N, K] (dequantize.mojo)
    gpt2_cached_attention  qkv [B, S, 3D], cache [2, B, H, M, d], key_bias [B, T]
                           -> [B, S, D]: writes the S new keys and values at
                           T - S..T-1, then each query attends over the cache up
                           to its own position, heads merged (cached_attention.mojo)
    gpt2_decode_layer      a whole GPT-2 block for a few new tokens, x [B, S, D] -> [B, S, D]: the
                           layer norms, the four products (any format above, GELU and the residual
                           adds as they write) and the cached attention in one op whose threads
                           share each phase's chunks (decode_layer.mojo; epilogue.mojo)
    gpt2_paged_attention   the same for a server's ragged batch over MAX's paged cache:
                           qkv [T, 3D], kv_blocks [pages, 2, L, page_size, H, d] as
                           MAX lays them out, each request's pages from its lookup table
                           -> [T, D] (paged_attention.mojo); both attend one (request, head)
                           at a time through the same code (attend.mojo)
    gpt2_paged_decode_layer
                           gpt2_decode_layer for a server's decoding step, x [R, D] a token a
                           request, over MAX's paged cache as gpt2_paged_attention reads it
                           (paged_decode_layer.mojo; where each row's cache lies: layer_kv.mojo)
    gpt2_reorder_rows      cache [2, B, H, M, d], rows [B], kept [B]: each row that changes copies
                           row rows[b]'s written positions from kept[b] on, in place (beam
                           search; reorder_rows.mojo)

`ops` stages them in a graph (`skinny_matmul`, `packed_matmul`, `decode_layer`, ...: the names
re-exported here). Graphs load this directory compiled once into a `.mojoc`
(`max_gpt2.kernels.package`), and MAX caches the graphs compiled with it. The modules that put
these behind GPT-2's parameter names are in `max_gpt2.model.kernel_layers`; where the kernels run
is `max_gpt2.inference.devices.kernels_run_on`.
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
