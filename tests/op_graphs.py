"""The Mojo ops each in a small graph of their own, as tests/test_kernels.py and
tests/test_decode_layer.py run them, compiled as one module (`compile_ops`).

Every size is symbolic, so one compile serves every case. As one module the
graphs share MAX's fixed cost of a compile and the kernels they have in common.
"""

from __future__ import annotations

from max.driver import CPU
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

from max_gpt2.bench.bandwidth import skinny_matmul_graph
from max_gpt2.inference.compiled import compile_together
from max_gpt2.kernels import kernel_library, layer_operands

CPU_REF = DeviceRef.CPU()
# The decode-layer graphs run their op once per format, each on a cache of its own.
FORMATS = ("float32", "bfloat16", "q8_0", "q4_0")
WEIGHT_DTYPES = {
    "float32": DType.float32,
    "bfloat16": DType.bfloat16,
    "q8_0": DType.int8,
    "q4_0": DType.uint8,
}
# MAX's paged cache as the paged ops take it: its blocks, then for R requests (of the T tokens)
# cache_lengths [R], lookup_table [R, P], input_row_offsets [R + 1], the page stride and the layer.
MAX_BLOCKS = BufferType(DType.float32, ["pages", 2, "L", "page_size", "H", "d"], CPU_REF)
MAX_CACHE_INPUTS = [
    TensorType(DType.uint32, ["R"], CPU_REF),
    TensorType(DType.uint32, ["R", "P"], CPU_REF),
    TensorType(DType.uint32, ["R1"], CPU_REF),
    TensorType(DType.int64, [1], CPU_REF),
    TensorType(DType.uint32, [1], CPU_REF),
]


def cached_attention_graph(cache_dtype: DType) -> Graph:
    """`gpt2_cached_attention` on a cache [2, B, H, M, d] in `cache_dtype`, qkv [B, S, 3 * H * d] and
    key_bias [B, T]; out [B, S, H * d]."""
    types = [
        BufferType(cache_dtype, [2, "B", "H", "M", "d"], CPU_REF),
        TensorType(DType.float32, ["B", "S", "E"], CPU_REF),
        TensorType(DType.float32, ["B", "T"], CPU_REF),
    ]
    name = f"cached_attention_alone_{cache_dtype.name}"
    with Graph(name, input_types=types, custom_extensions=[kernel_library()]) as graph:
        cache, qkv, key_bias = graph.inputs
        batch, seq_len, _ = qkv.tensor.shape
        out = TensorType(DType.float32, [batch, seq_len, cache.shape[2] * cache.shape[4]], CPU_REF)
        graph.output(*ops.inplace_custom("gpt2_cached_attention", CPU_REF, [cache, qkv, key_bias], [out]))
    return graph


def paged_attention_graph() -> Graph:
    """`gpt2_paged_attention` on MAX's blocks [pages, 2, L, page_size, H, d], qkv [T, 3 * H * d] and
    MAX's cache inputs; out [T, H * d]."""
    types = [MAX_BLOCKS, TensorType(DType.float32, ["T", "E"], CPU_REF), *MAX_CACHE_INPUTS]
    with Graph("paged_attention_alone", input_types=types, custom_extensions=[kernel_library()]) as graph:
        blocks, qkv, *rest = graph.inputs
        out = TensorType(DType.float32, [qkv.tensor.shape[0], blocks.shape[4] * blocks.shape[5]], CPU_REF)
        graph.output(*ops.inplace_custom("gpt2_paged_attention", CPU_REF, [blocks, qkv, *rest], [out]))
    return graph


def packed_matmuls_graph() -> Graph:
    """The three packed matmuls and the two dequantize ops: x [M, K], W in each format, a vector of
    length N (only its length is read) and a bias [N] or [0]; y [M, N] per format, then W [N, K]."""
    x = TensorType(DType.float32, ["M", "K"], CPU_REF)
    bf16 = TensorType(DType.bfloat16, ["GB", "KC"], CPU_REF)
    q8 = TensorType(DType.int8, ["G", "K8"], CPU_REF)
    q4 = TensorType(DType.uint8, ["G", "K4"], CPU_REF)
    scales = TensorType(DType.float16, ["G", "Kb8"], CPU_REF)
    rows = TensorType(DType.float32, ["N"], CPU_REF)
    bias = TensorType(DType.float32, ["NB"], CPU_REF)
    types = [x, bf16, q8, scales, q4, scales, rows, bias]
    with Graph("packed_matmuls_alone", input_types=types, custom_extensions=[kernel_library()]) as graph:
        x, bf16, q8, q8_scales, q4, q4_scales, rows, bias = (value.tensor for value in graph.inputs)
        product = TensorType(DType.float32, [x.shape[0], rows.shape[0]], CPU_REF)
        weight = TensorType(DType.float32, [rows.shape[0], x.shape[1]], CPU_REF)
        graph.output(
            *ops.custom("packed_matmul_bf16", CPU_REF, [x, bf16, bias], [product]),
            *ops.custom("packed_matmul_q8_0", CPU_REF, [x, q8, q8_scales, bias], [product]),
            *ops.custom("packed_matmul_q4_0", CPU_REF, [x, q4, q4_scales, bias], [product]),
            *ops.custom("dequantize_q8_0", CPU_REF, [q8, q8_scales], [weight]),
            *ops.custom("dequantize_q4_0", CPU_REF, [q4, q4_scales], [weight]),
        )
    return graph


def layer_graph(op: str, cache: BufferType, lead: list[TensorType]) -> Graph:
    """`op` once per format, each on a cache of its own (`cache`), after the `lead` inputs (x first)
    that the two decode-layer ops differ in; the graph's inputs then are the norms, epsilon, the biases,
    the float formats' (empty) scales, and each format's four weights (each with its scales where the
    format has them), handed to the op in its order (`max_gpt2.kernels.layer_operands`)."""
    parameters = [
        *[TensorType(DType.float32, [f"norm{i}"], CPU_REF) for i in range(4)],
        TensorType(DType.float32, [1], CPU_REF),  # epsilon
        *[TensorType(DType.float32, [f"bias{i}"], CPU_REF) for i in range(4)],
        TensorType(DType.float16, ["none0", "none1"], CPU_REF),
    ]
    weights = [
        TensorType(dtype, [f"{format}_{i}_{part}_rows", f"{format}_{i}_{part}_columns"], CPU_REF)
        for format, weight_dtype in WEIGHT_DTYPES.items()
        for i in range(4)
        for part, dtype in (("weight", weight_dtype), ("scales", DType.float16))
        if part == "weight" or format.startswith("q")
    ]
    types = [*[cache] * len(FORMATS), *lead, *parameters, *weights]
    with Graph(f"{op}_alone", input_types=types, custom_extensions=[kernel_library()]) as graph:
        inputs = list(graph.inputs)
        caches, rest = inputs[: len(FORMATS)], [value.tensor for value in inputs[len(FORMATS) :]]
        leading, rest = rest[: len(lead)], rest[len(lead) :]
        norms, epsilon, biases, no_scales = rest[:4], rest[4], rest[5:9], rest[9]
        stored = iter(rest[10:])
        outputs = []
        for format, cache_value in zip(FORMATS, caches, strict=True):
            products = []
            for bias in biases:
                weight = next(stored)
                products.append((weight, next(stored) if format.startswith("q") else no_scales, bias))
            out = TensorType(DType.float32, leading[0].shape, CPU_REF)
            values = [cache_value, *leading, *layer_operands(norms, epsilon, products)]
            outputs += ops.inplace_custom(op, CPU_REF, values, [out])
        graph.output(*outputs)
    return graph


def decode_layer_graph() -> Graph:
    """`gpt2_decode_layer`: x [B, S, D] and key_bias [B, T] over our cache [2, B, H, M, d]."""
    cache = BufferType(DType.float32, [2, "B", "H", "M", "d"], CPU_REF)
    lead = [
        TensorType(DType.float32, ["B", "S", "E"], CPU_REF),
        TensorType(DType.float32, ["B", "T"], CPU_REF),
    ]
    return layer_graph("gpt2_decode_layer", cache, lead)


def paged_decode_layer_graph() -> Graph:
    """`gpt2_paged_decode_layer`: x [R, D] and MAX's cache inputs over its blocks."""
    lead = [TensorType(DType.float32, ["R", "E"], CPU_REF), *MAX_CACHE_INPUTS]  # x, then MAX's inputs
    return layer_graph("gpt2_paged_decode_layer", MAX_BLOCKS, lead)


def compile_ops() -> dict[str, Model]:
    """Every graph above compiled as one module, keyed by graph name (`skinny_matmul_alone`,
    `cached_attention_alone_float32` and `_float16`, `paged_attention_alone`, `packed_matmuls_alone`,
    `gpt2_decode_layer_alone`, `gpt2_paged_decode_layer_alone`)."""
    graphs = [
        skinny_matmul_graph(),
        cached_attention_graph(DType.float32),
        cached_attention_graph(DType.float16),
        paged_attention_graph(),
        packed_matmuls_graph(),
        decode_layer_graph(),
        paged_decode_layer_graph(),
    ]
    session = InferenceSession(devices=[CPU()])
    return session.init_all(compile_together(session, graphs))
