"""The functions that stage our Mojo ops in a graph: each takes tensors of the graph and returns its result.

    skinny_matmul(x [M, K], W [N, K], bias [N])                            -> [M, N]
    packed_matmul(x [M, K], W as stored, scales, format, N, bias)          -> [M, N]
    dequantize(W as stored, scales, format, N, K)                          -> float32 [N, K]
    cached_attention(cache [2, B, H, M, d], qkv [B, S, 3D], key_bias [B, T]) -> [B, S, D]
    decode_layer(x [B, S, D], cache, key_bias, LayerParameters)            -> [B, S, D]
    paged_attention(MAX's paged cache, qkv [T, 3D], row offsets, layer)    -> [T, D]
    paged_decode_layer(x [R, D], MAX's paged cache, row offsets, layer, LayerParameters) -> [R, D]
    reorder_rows(cache [2, B, H, M, d], rows [B], kept [B], written [B, T]) -> None: rows copied in place

A GPT-2 block goes to the two decode-layer ops as `LayerParameters`: its layer norms in the order
`LAYER_NORMS`, their epsilon, and its products in the order `LAYER_PRODUCTS`, each a `StoredProduct`.
`layer_operands` flattens them into the ops' operands; it is the one place that order is written in
Python (the Mojo ops read it in `decode_layer.mojo:checked_layer`). Every product kind is one op whose
format is a compile-time parameter: `gpt2_matmul` (and `gpt2_dequantize`) take a format's kernel code
(`TensorFormat.kernel_format`: 0 for rows of float32 or bfloat16), as the decode-layer ops take one
for each of a block's products.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import numpy as np
from max.driver import CPU, Device
from max.dtype import DType
from max.experimental import functional as F
from max.experimental.tensor import Tensor, TensorType
from max.graph import BufferValue, DeviceRef, TensorValue, ops

from max_gpt2.kernels.package import compiled_package

if TYPE_CHECKING:
    from max.nn.kv_cache import PagedCacheValues

MOJO_PACKAGE = Path(__file__).parent

LAYER_NORMS = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")
"""A block's layer-norm parameters (`Block`'s names), in the order the decode-layer ops take them."""

LAYER_PRODUCTS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
"""A block's products (`Block`'s names), in the order the decode-layer ops take them; GELU, in its
tanh form, between the MLP's two."""

PRODUCT_FORMATS = ("qkv_format", "out_format", "fc_format", "down_format")
"""The decode-layer ops' parameters that name each product's format, in `LAYER_PRODUCTS`' order."""

Value = TypeVar("Value")


class StoredProduct(NamedTuple):
    """A product as the kernels take it: its weight as stored, its block scales (or None), its bias
    (or None), and the kernels' code for its format (`TensorFormat.kernel_format`; 0: rows of floats)."""

    weight: Tensor
    scales: Tensor | None
    bias: Tensor | None
    format: int = 0


class LayerParameters(NamedTuple):
    """A block as the decode-layer ops take it, each product in its format."""

    norms: tuple[Tensor, ...]  # [D] each, in the order of LAYER_NORMS
    epsilon: float  # the layer norms'
    products: tuple[StoredProduct, ...]  # in the order of LAYER_PRODUCTS


def layer_operands(
    norms: Sequence[Value], epsilon: Value, products: Sequence[Sequence[Value]]
) -> list[Value]:
    """A block's operands in the order both decode-layer ops take them after their cache and
    activations: the norms, epsilon, then each product's weight, scales and bias."""
    return [*norms, epsilon, *(value for product in products for value in product)]


def layer_formats(parameters: LayerParameters) -> dict[str, int]:
    """The decode-layer ops' format parameters for a block's products (`PRODUCT_FORMATS`)."""
    return {name: product.format for name, product in zip(PRODUCT_FORMATS, parameters.products, strict=True)}


def kernel_library() -> Path:
    """This directory's kernels compiled (`compiled_package`): what graphs pass as `custom_extensions`."""
    return compiled_package(MOJO_PACKAGE)


def skinny_matmul(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x` [M, K] @ `weight` [N, K]^T + `bias` [N] -> [M, N], each row of `weight` read once."""
    return packed_matmul(x, weight, None, 0, int(weight.shape[0]), bias)


def packed_matmul(
    x: Tensor, weight: Tensor, scales: Tensor | None, format: int, out_dim: int, bias: Tensor | None = None
) -> Tensor:
    """`x` [M, K] @ W^T + `bias` -> [M, out_dim] through `gpt2_matmul`, W in the format whose kernel code is
    `format` (`TensorFormat.kernel_format`; 0: rows of floats).

    `weight` holds W as the format stores it (`max_gpt2.model.formats`) and `scales` its
    block scales (None where it has none). The kernel adds the float32 `bias` [out_dim] as it writes
    y, which saves an op a product (docs/performance.md).
    """
    out_type = TensorType(x.dtype, [x.shape[0], out_dim], device=x.device)
    # The op reads an empty bias as none, and takes empty scales beside rows of floats.
    bias = _empty(DType.float32, 1, x.device) if bias is None else bias
    scales = _empty(DType.float16, 2, x.device) if scales is None else scales
    (y,) = F.custom(
        "gpt2_matmul",
        x.device,
        [x, weight, scales, bias],
        [out_type],
        parameters={"format": format},
        custom_extensions=kernel_library(),
    )
    return y


def dequantize(weight: Tensor, scales: Tensor, format: int, rows: int, columns: int) -> Tensor:
    """A block format's `weight` and `scales` as stored -> the float32 W [rows, columns] they stand for,
    through `gpt2_dequantize` (`format`: the format's kernel code)."""
    out_type = TensorType(DType.float32, [rows, columns], device=weight.device)
    (w,) = F.custom(
        "gpt2_dequantize",
        weight.device,
        [weight, scales],
        [out_type],
        parameters={"format": format},
        custom_extensions=kernel_library(),
    )
    return w


def _empty(dtype: DType, rank: int, device: Device | DeviceRef) -> Tensor:
    """An empty tensor of `rank`, an operand the op reads as none."""
    return F.constant(np.zeros((0,) * rank, dtype.to_numpy()), dtype, device=device)


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
        parameters=layer_formats(parameters),
        custom_extensions=kernel_library(),
    )
    return y


def reorder_rows(cache: BufferValue, rows: TensorValue, kept: TensorValue, written: TensorValue) -> None:
    """Row b of `cache` [2, B, H, M, d] takes row `rows[b]`'s (int64 [B]) positions kept[b]..T-1, in
    place; `written` [B, T] gives T. Rows that keep their index are not touched (beam search's reorder)."""
    ops.inplace_custom("gpt2_reorder_rows", cache.device, [cache, rows, kept, written])


def paged_decode_layer(
    x: Tensor,
    kv_collection: PagedCacheValues,
    input_row_offsets: Tensor,
    layer: int,
    parameters: LayerParameters,
) -> Tensor:
    """`decode_layer` for `x` [R * S, D], S new tokens of each of R requests (one, but where a step checks
    drafted tokens), over MAX's paged cache at `layer`.

    Request r's keys and values are where `kv_collection`'s lookup table puts them, after
    its `cache_lengths[r]` cached ones; `input_row_offsets` [R + 1] must be 0, S, ..., R * S.
    The blocks are written in place.
    """
    where = _paged_inputs(kv_collection, input_row_offsets, layer)
    (y,) = F.inplace_custom(
        "gpt2_paged_decode_layer",
        x.device,
        [kv_collection.kv_blocks, x, *where, *_layer_inputs(x.device, parameters)],
        [TensorType(x.dtype, x.shape, device=x.device)],
        parameters=layer_formats(parameters),
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
    """`layer_operands` of `parameters`, with epsilon as a tensor and empty tensors where a product has
    no scales or no bias (the kernels read empty ones as none)."""
    no_scales, no_bias = _empty(DType.float16, 2, device), _empty(DType.float32, 1, device)
    products = [
        (weight, no_scales if scales is None else scales, no_bias if bias is None else bias)
        for weight, scales, bias, _ in parameters.products
    ]
    epsilon = F.constant(np.array([parameters.epsilon], np.float32), DType.float32, device=device)
    return layer_operands(parameters.norms, epsilon, products)
