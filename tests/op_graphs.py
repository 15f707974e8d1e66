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
from max_gpt2.kernels.ops import PRODUCT_FORMATS
from max_gpt2.model.formats import NAMED

GROUP_ROWS, SUPER_WEIGHTS = 8, 256  # a shape every format stores, to read its dtypes from

CPU_REF = DeviceRef.CPU()
# The decode-layer graphs run their op once per layout (the formats of c_attn, attn c_proj, c_fc and
# mlp c_proj), each on a cache of its own: the formats of rows and blocks of 32, which take any
# width, and those of super-blocks of 256 (q4_k_m's mix among them), which take multiples of 256.
LAYOUTS = {name: (name,) * 4 for name in ("float32", "bfloat16", "q8_0", "q4_0")}
SUPER_LAYOUTS = {
    "q4_k": ("q4_k",) * 4,
    "q5_k": ("q5_k",) * 4,
    "q6_k": ("q6_k",) * 4,
    "q4_k_m": ("q6_k", "q4_k", "q4_k", "q6_k"),
    # GPT-2 xl's fallbacks in its presets: blocks of 32 beside super-blocks, c_attn's and c_fc's x
    # rounded two ways (q8_0's and q5_0's)
    "q8_0_q5_0_q6_k": ("q8_0", "q5_0", "q5_0", "q6_k"),
    "q5_1_q4_1_q4_k": ("q5_1", "q4_1", "q5_1", "q4_k"),
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


def packed_matmuls_graph(name: str, formats: tuple[str, ...]) -> Graph:
    """The packed matmuls of `formats` and the block formats' dequantize ops: x [M, K], W in each format
    (with its scales for block formats), a vector of length N (only its length is read) and a bias [N]
    or [0]; y [M, N] per format, then W [N, K] per block format."""
    stored = {
        name: NAMED[name].stored(GROUP_ROWS, SUPER_WEIGHTS) for name in formats
    }  # only the dtypes are read
    types = [TensorType(DType.float32, ["M", "K"], CPU_REF)]
    for format, parts in stored.items():
        types += [
            TensorType(part.max_dtype, [f"{format}_{key}0", f"{format}_{key}1"], CPU_REF)
            for key, part in parts.items()
        ]
    types += [TensorType(DType.float32, ["N"], CPU_REF), TensorType(DType.float32, ["NB"], CPU_REF)]
    types += [TensorType(DType.float16, ["none0", "none1"], CPU_REF)]  # rows of floats' (empty) scales
    with Graph(name, input_types=types, custom_extensions=[kernel_library()]) as graph:
        x, *weights, rows, bias, no_scales = (value.tensor for value in graph.inputs)
        product = TensorType(DType.float32, [x.shape[0], rows.shape[0]], CPU_REF)
        weight = TensorType(DType.float32, [rows.shape[0], x.shape[1]], CPU_REF)
        parts = iter(weights)
        products, unpacked = [], []
        for format, kinds in stored.items():
            arrays = [next(parts) for _ in kinds]
            code = {"format": NAMED[format].kernel_format}
            scaled = arrays if len(arrays) == 2 else [*arrays, no_scales]
            products += ops.custom("gpt2_matmul", CPU_REF, [x, *scaled, bias], [product], code)
            if code["format"]:  # a block format
                unpacked += ops.custom("gpt2_dequantize", CPU_REF, arrays, [weight], code)
        graph.output(*products, *unpacked)
    return graph


def layer_graph(name: str, op: str, cache: BufferType, lead: list[TensorType], layouts: dict) -> Graph:
    """`op` once per layout of `layouts` (its four products' formats), each on a cache of its own
    (`cache`), after the `lead` inputs (x first) that the two decode-layer ops differ in; the graph's
    inputs then are the norms, epsilon, the biases, the float formats' (empty) scales, and each
    layout's four weights (each with its scales where its format has them), handed to the op in its
    order (`max_gpt2.kernels.layer_operands`), its formats as the op's parameters."""
    parameters = [
        *[TensorType(DType.float32, [f"norm{i}"], CPU_REF) for i in range(4)],
        TensorType(DType.float32, [1], CPU_REF),  # epsilon
        *[TensorType(DType.float32, [f"bias{i}"], CPU_REF) for i in range(4)],
        TensorType(DType.float16, ["none0", "none1"], CPU_REF),
    ]
    weights = [
        TensorType(stored.max_dtype, [f"{layout}_{i}_{part}_rows", f"{layout}_{i}_{part}_columns"], CPU_REF)
        for layout, formats in layouts.items()
        for i, format in enumerate(formats)
        for part, stored in NAMED[format].stored(GROUP_ROWS, SUPER_WEIGHTS).items()
    ]
    types = [*[cache] * len(layouts), *lead, *parameters, *weights]
    with Graph(name, input_types=types, custom_extensions=[kernel_library()]) as graph:
        inputs = list(graph.inputs)
        caches, rest = inputs[: len(layouts)], [value.tensor for value in inputs[len(layouts) :]]
        leading, rest = rest[: len(lead)], rest[len(lead) :]
        norms, epsilon, biases, no_scales = rest[:4], rest[4], rest[5:9], rest[9]
        stored = iter(rest[10:])
        outputs = []
        for formats, cache_value in zip(layouts.values(), caches, strict=True):
            products = []
            for bias, format in zip(biases, formats, strict=True):
                weight = next(stored)
                scales = next(stored) if NAMED[format].kernel_format else no_scales
                products.append((weight, scales, bias))
            out = TensorType(DType.float32, leading[0].shape, CPU_REF)
            values = [cache_value, *leading, *layer_operands(norms, epsilon, products)]
            codes = {
                key: NAMED[format].kernel_format for key, format in zip(PRODUCT_FORMATS, formats, strict=True)
            }
            outputs += ops.inplace_custom(op, CPU_REF, values, [out], parameters=codes)
        graph.output(*outputs)
    return graph


def decode_layer_graph(name: str, layouts: dict) -> Graph:
    """`gpt2_decode_layer`: x [B, S, D] and key_bias [B, T] over our cache [2, B, H, M, d]."""
    cache = BufferType(DType.float32, [2, "B", "H", "M", "d"], CPU_REF)
    lead = [
        TensorType(DType.float32, ["B", "S", "E"], CPU_REF),
        TensorType(DType.float32, ["B", "T"], CPU_REF),
    ]
    return layer_graph(name, "gpt2_decode_layer", cache, lead, layouts)


def paged_decode_layer_graph(name: str, layouts: dict) -> Graph:
    """`gpt2_paged_decode_layer`: x [T, D] (S tokens each of R requests) and MAX's cache inputs over its
    blocks."""
    lead = [TensorType(DType.float32, ["T", "E"], CPU_REF), *MAX_CACHE_INPUTS]  # x, then MAX's inputs
    return layer_graph(name, "gpt2_paged_decode_layer", MAX_BLOCKS, lead, layouts)


def compile_ops() -> dict[str, Model]:
    """Every graph above compiled as one module, keyed by graph name (`skinny_matmul_alone`,
    `cached_attention_alone_float32` and `_float16`, `paged_attention_alone`, `packed_matmuls_alone`,
    `super_matmuls_alone` and `small_block_matmuls_alone`, `gpt2_decode_layer_alone` and `_super`,
    `gpt2_paged_decode_layer_alone` and `_super`: the `SUPER_LAYOUTS` ones)."""
    graphs = [
        skinny_matmul_graph(),
        cached_attention_graph(DType.float32),
        cached_attention_graph(DType.float16),
        paged_attention_graph(),
        packed_matmuls_graph("packed_matmuls_alone", ("bfloat16", "q8_0", "q4_0")),
        packed_matmuls_graph("super_matmuls_alone", ("q4_k", "q5_k", "q6_k")),
        packed_matmuls_graph("small_block_matmuls_alone", ("q4_1", "q5_0", "q5_1")),
        decode_layer_graph("gpt2_decode_layer_alone", LAYOUTS),
        decode_layer_graph("gpt2_decode_layer_super", SUPER_LAYOUTS),
        paged_decode_layer_graph("gpt2_paged_decode_layer_alone", LAYOUTS),
        paged_decode_layer_graph("gpt2_paged_decode_layer_super", SUPER_LAYOUTS),
    ]
    session = InferenceSession(devices=[CPU()])
    return session.init_all(compile_together(session, graphs))
