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

Graphs load this directory compiled once into a `.mojoc` (`max_gpt2.kernels.package`),
and MAX caches the graphs compiled with it. The modules that put these behind
GPT-2's parameter names are in `max_gpt2.model.kernel_layers`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from max.driver import CPU, Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor, TensorType
from max.graph import BufferValue, DeviceRef, Graph, ops

from max_gpt2.kernels.package import compiled_package

if TYPE_CHECKING:
    from max.nn.kv_cache import PagedCacheValues

MOJO_PACKAGE = Path(__file__).parent


def kernel_library() -> Path:
    """This directory's kernels compiled (`compiled_package`): what graphs pass as `custom_extensions`."""
    return compiled_package(MOJO_PACKAGE)


def kernels_run_on(device: Device, dtype: DType) -> bool:
    """Whether the decoding kernels serve this device and dtype: the CPU, float32."""
    return device.is_host and dtype == DType.float32


def skinny_matmul(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x` [M, K] @ `weight` [N, K]^T + `bias` [N] -> [M, N], each row of `weight` read once."""
    return packed_matmul(x, weight, None, "float32", int(weight.shape[0]), bias)


def matmul_op_name(format: str) -> str:
    """The op that multiplies by weights stored in `format` (`max_gpt2.model.weight_formats`)."""
    return {"float32": "skinny_matmul", "bfloat16": "packed_matmul_bf16"}.get(
        format, f"packed_matmul_{format}"
    )


def packed_matmul(
    x: Tensor, weight: Tensor, scales: Tensor | None, format: str, out_dim: int, bias: Tensor | None = None
) -> Tensor:
    """`x` [M, K] @ W^T + `bias` -> [M, out_dim] with W stored in `format` (`weight_formats.FORMATS`).

    `weight` holds W as the format stores it (`max_gpt2.model.weight_formats`) and
    `scales` its block scales (None for float32 and bfloat16). The kernel adds the
    float32 `bias` [out_dim] as it writes y (a separate add is an op of its own each
    product: 7 % of a q4_0 decoding step of GPT-2 small).
    """
    out_type = TensorType(x.dtype, [x.shape[0], out_dim], device=x.device)
    name = matmul_op_name(format)
    if bias is None:  # the kernels read an empty bias as none
        bias = F.constant(np.zeros(0, np.float32), DType.float32, device=x.device)
    inputs = [x, weight, bias] if scales is None else [x, weight, scales, bias]
    (y,) = F.custom(name, x.device, inputs, [out_type], custom_extensions=kernel_library())
    return y


def dequantize(weight: Tensor, scales: Tensor, format: str, rows: int, columns: int) -> Tensor:
    """q8_0 or q4_0 `weight` and `scales` as stored -> the float32 W they stand for, [rows, columns]."""
    out_type = TensorType(DType.float32, [rows, columns], device=weight.device)
    (w,) = F.custom(
        f"dequantize_{format}",
        weight.device,
        [weight, scales],
        [out_type],
        custom_extensions=kernel_library(),
    )
    return w


def cached_attention(cache: Tensor, qkv: Tensor, key_bias: Tensor) -> Tensor:
    """`qkv` [B, S, 3D] stored into `cache` [2, B, H, M, d] and attended over it, with `key_bias` [B, T].

    Returns the attended values with the heads merged, [B, S, D]; the cache is written in place.
    """
    batch, seq_len, _ = qkv.shape
    out_type = TensorType(qkv.dtype, [batch, seq_len, cache.shape[2] * cache.shape[4]], device=qkv.device)
    (attended,) = F.inplace_custom(
        "gpt2_cached_attention",
        qkv.device,
        [BufferValue(cache), qkv, key_bias],
        [out_type],
        custom_extensions=kernel_library(),
    )
    return attended


StoredProduct = tuple[Tensor, Tensor | None, Tensor | None]
"""A product as the kernels take it: its weight as stored, its block scales (or None), its bias (or None)."""

LayerParameters = tuple[
    tuple[Tensor, Tensor, Tensor, Tensor],
    float,
    tuple[StoredProduct, StoredProduct, StoredProduct, StoredProduct],
]
"""A block as the decode-layer ops take it: ln_1's and ln_2's weight and bias [D], their epsilon, and
c_attn, attn c_proj, c_fc and mlp c_proj, all in one format (GELU between the MLP's two, in its tanh form)."""


def decode_layer(
    x: Tensor,
    cache: Tensor,
    key_bias: Tensor,
    parameters: LayerParameters,
) -> Tensor:
    """A GPT-2 block (`parameters`) for `x` [B, S, D]'s S new tokens over `cache` [2, B, H, M, d]
    -> [B, S, D], one op; `key_bias` [B, T]. The cache is written in place.
    """
    (y,) = F.inplace_custom(
        "gpt2_decode_layer",
        x.device,
        [BufferValue(cache), x, key_bias, *_layer_inputs(x.device, parameters)],
        [TensorType(x.dtype, x.shape, device=x.device)],
        custom_extensions=kernel_library(),
    )
    return y


def paged_decode_layer(
    x: Tensor,
    kv_collection: PagedCacheValues,
    input_row_offsets: Tensor,
    layer: int,
    parameters: LayerParameters,
) -> Tensor:
    """`decode_layer` for `x` [R, D], a new token of each of R requests, over MAX's paged cache at `layer`.

    Request r's keys and values are where `kv_collection`'s lookup table puts them, after
    its `cache_lengths[r]` cached ones; `input_row_offsets` [R + 1] must be 0..R. The
    blocks are written in place.
    """
    where = _paged_inputs(kv_collection, input_row_offsets, layer)
    (y,) = F.inplace_custom(
        "gpt2_paged_decode_layer",
        x.device,
        [kv_collection.kv_blocks, x, *where, *_layer_inputs(x.device, parameters)],
        [TensorType(x.dtype, x.shape, device=x.device)],
        custom_extensions=kernel_library(),
    )
    return y


def paged_attention(
    kv_collection: PagedCacheValues, qkv: Tensor, input_row_offsets: Tensor, layer: int
) -> Tensor:
    """`qkv` [T, 3D] stored into MAX's paged cache at `layer` and attended over it -> [T, D], heads merged.

    Request r owns rows `input_row_offsets[r]:input_row_offsets[r + 1]` of `qkv`,
    its tokens after the `kv_collection.cache_lengths[r]` it has cached; the
    cache's blocks are written in place.
    """
    blocks = kv_collection.kv_blocks
    out_type = TensorType(qkv.dtype, [qkv.shape[0], blocks.shape[4] * blocks.shape[5]], device=qkv.device)
    (attended,) = F.inplace_custom(
        "gpt2_paged_attention",
        qkv.device,
        [blocks, qkv, *_paged_inputs(kv_collection, input_row_offsets, layer)],
        [out_type],
        custom_extensions=kernel_library(),
    )
    return attended


def _paged_inputs(kv_collection: PagedCacheValues, input_row_offsets: Tensor, layer: int) -> list[Tensor]:
    """Where the step's requests lie in MAX's paged cache, in the order both paged ops take it after
    the blocks and their activations: cache lengths, lookup table, row offsets, page stride, layer."""
    layer_index = F.constant(np.array([layer], np.uint32), DType.uint32, device=CPU())
    cache = [
        kv_collection.cache_lengths,
        kv_collection.lookup_table,
        input_row_offsets,
        kv_collection.page_stride,
    ]
    return [*cache, layer_index]


def _layer_inputs(device: Device | DeviceRef, parameters: LayerParameters) -> list[Tensor]:
    """A block's parameters in the order both decode-layer ops take them: norms, epsilon, then each
    product's weight, scales and bias (empty tensors where a product has none)."""
    norms, epsilon, products = parameters
    no_scales = F.constant(np.zeros((0, 0), np.float16), DType.float16, device=device)
    no_bias = F.constant(np.zeros(0, np.float32), DType.float32, device=device)
    stored = [
        value if value is not None else empty
        for product in products
        for value, empty in zip(product, (None, no_scales, no_bias), strict=True)
    ]
    eps = F.constant(np.array([epsilon], np.float32), DType.float32, device=device)
    return [*norms, eps, *stored]


def skinny_matmul_graph() -> Graph:
    """`skinny_matmul` alone, for the CPU: x [M, K], W [N, K] and a bias [N] (or [0]: none) in, y [M, N]
    out (all symbolic)."""
    cpu = DeviceRef.CPU()
    types = [TensorType(DType.float32, shape, cpu) for shape in (["M", "K"], ["N", "K"], ["B"])]
    with Graph("skinny_matmul_alone", input_types=types, custom_extensions=[kernel_library()]) as graph:
        x, w, bias = (value.tensor for value in graph.inputs)
        out = TensorType(DType.float32, [x.shape[0], w.shape[0]], cpu)
        graph.output(*ops.custom("skinny_matmul", cpu, [x, w, bias], [out]))
    return graph
