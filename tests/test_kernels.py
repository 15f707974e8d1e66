"""The Mojo decoding kernels alone, against NumPy in float64 (each op in a small graph of its own,
`tests/op_graphs.py`)."""

from __future__ import annotations

import numpy as np
import pytest
from max.driver import Buffer
from max.dtype import DType
from max.engine import Model

from max_gpt2.inference.devices import host_buffer
from max_gpt2.kernels.package import compiled_package
from max_gpt2.model.formats import BFLOAT16, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from tests.support import (
    LOWEST,
    attention_reference,
    bfloat16_activations,
    paged_attention_reference,
    quantized_activations,
    scattered_pages,
    super_block_activations,
)


@pytest.fixture(scope="module")
def matmul(compiled_ops) -> Model:
    return compiled_ops["skinny_matmul_alone"]


@pytest.fixture(scope="module")
def attention(compiled_ops) -> Model:
    return compiled_ops["cached_attention_alone_float32"]


@pytest.fixture(scope="module")
def attention_float16(compiled_ops) -> Model:
    return compiled_ops["cached_attention_alone_float16"]


@pytest.fixture(scope="module")
def paged_attention(compiled_ops) -> Model:
    return compiled_ops["paged_attention_alone"]


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 11, 16])
@pytest.mark.parametrize(("k", "n"), [(60, 180), (17, 5), (768, 2304), (3072, 97), (100, 1001)])
def test_skinny_matmul_matches_numpy(matmul, rows, k, n):
    """Every block size (1 to X_ROWS rows of x, more in passes), K with and without a lane tail (8 or
    16); a bias added as y is written, or none (an empty one) on every other case."""
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n if (rows + k + n) % 2 else 0, dtype=np.float32)
    (y,) = matmul.execute(*map(Buffer.from_numpy, (x, w, bias)))
    expected = x.astype(np.float64) @ w.astype(np.float64).T + (bias if bias.size else 0)
    np.testing.assert_allclose(
        y.to_numpy(), expected, rtol=0, atol=2e-6 * np.sqrt(k) * np.abs(expected).max()
    )


@pytest.fixture(scope="module")
def packed(compiled_ops) -> Model:
    """The three packed matmuls and the two dequantize ops in one graph (`op_graphs.packed_matmuls_graph`)."""
    return compiled_ops["packed_matmuls_alone"]


def packed_inputs(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, formats=(BFLOAT16, Q8_0, Q4_0)
) -> list[Buffer]:
    """A packed-matmuls graph's inputs: x, W in each of `formats`, N, the bias."""
    return [
        Buffer.from_numpy(x),
        *(
            host_buffer(array, info.max_dtype)
            for format in formats
            for array, info in zip(
                format.pack(format.rows(w)).values(), format.stored(*w.shape).values(), strict=True
            )
        ),
        Buffer.from_numpy(np.zeros(w.shape[0], np.float32)),
        Buffer.from_numpy(bias),
        Buffer.from_numpy(np.zeros((0, 0), np.float16)),  # rows of floats' scales: none
    ]


@pytest.mark.parametrize("rows", [1, 7, 8, 11, 37])
@pytest.mark.parametrize(
    ("k", "n"), [(32, 8), (17, 5), (33, 9), (60, 180), (100, 1001), (768, 2304), (3072, 97), (64, 50257)]
)
def test_packed_matmuls_match_numpy_on_the_weights_they_store(packed, rows, k, n):
    """Each format against float64 on the weights it stores and x as it rounds it (bfloat16, or int8
    blocks): K with a block tail or none, N with every remainder of a group of 8 rows, x's rows in
    blocks of every height (7 = 4 + 2 + 1, 11 = 8 + 2 + 1), and enough rows (37) for bfloat16 W to be
    widened a pass at a time where the CPU has no bfloat16 multiply-adds; with a bias added as y is
    written, or none (an empty one) on every other case."""
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n if (rows + k + n) % 2 else 0, dtype=np.float32)
    bits = float32_to_bfloat16_bits(w)
    y_bf16, y_q8, y_q4, w_q8, w_q4 = (out.to_numpy() for out in packed.execute(*packed_inputs(x, w, bias)))
    stored = {format.name: format.values(format.rows(w), w.shape) for format in (Q8_0, Q4_0)}
    np.testing.assert_array_equal(w_q8, stored["q8_0"])
    np.testing.assert_array_equal(w_q4, stored["q4_0"])
    x_steps = quantized_activations(x)
    cases = [
        (y_bf16, bfloat16_activations(x), bfloat16_bits_to_float32(bits)),
        (y_q8, x_steps, stored["q8_0"]),
        (y_q4, x_steps, stored["q4_0"]),
    ]
    for got, activations, weight in cases:
        expected = activations @ weight.astype(np.float64).T + (bias if bias.size else 0)
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6 * np.sqrt(k) * np.abs(expected).max())


@pytest.mark.parametrize(("k", "n"), [(100, 1001), (768, 2304)])
def test_a_bfloat16_row_gets_the_same_sums_however_many_rows_share_the_product(packed, k, n):
    """Each of 40 rows' bfloat16 product, to the bit, as that row's alone: a drafted token checked
    beside others (or a prompt's last token) gets the logits of a step of its own, whichever way the
    CPU multiplies bfloat16 and whether W is widened a pass at a time (`kernels/dense_rows.mojo`)."""
    rng = np.random.default_rng(k + n)
    x = rng.standard_normal((40, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    together = packed.execute(*packed_inputs(x, w, bias))[0].to_numpy()
    for row in (0, 17, 39):
        alone = packed.execute(*packed_inputs(x[row : row + 1], w, bias))[0].to_numpy()
        np.testing.assert_array_equal(together[row], alone[0], err_msg=f"row {row}")


def check_block_matmuls(outputs, formats, x, w, bias, x_steps) -> None:
    """A block-matmuls graph's products against float64 on the weights each format stores and x as its
    products round it (`x_steps`), and its dequantize ops' weights against the format's values, to the bit."""
    count = len(formats)
    for format, got, unpacked in zip(formats, outputs[:count], outputs[count:], strict=True):
        weight = format.values(format.rows(w), w.shape)
        np.testing.assert_array_equal(unpacked, weight, err_msg=format.name)
        expected = x_steps @ weight.astype(np.float64).T + (bias if bias.size else 0)
        np.testing.assert_allclose(
            got,
            expected,
            rtol=0,
            atol=2e-6 * np.sqrt(w.shape[1]) * np.abs(expected).max(),
            err_msg=format.name,
        )


@pytest.mark.parametrize("rows", [1, 7, 11, 39])
@pytest.mark.parametrize(("k", "n"), [(256, 8), (512, 13), (768, 2304), (3072, 97), (768, 1001)])
def test_super_block_matmuls_match_numpy_on_the_weights_they_store(compiled_ops, rows, k, n):
    """q4_k, q5_k and q6_k against float64 on the weights they store and x as they round it (q8_K's blocks
    of 256): one and several super-blocks a row, N with every remainder of a group of 8 rows, x's rows
    in blocks of every height, and from `UNPACK_FROM` (32) rows each group's integers taken out once
    (39); the dequantize ops give the stored weights to the bit."""
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n if (rows + n) % 2 else 0, dtype=np.float32)
    formats = (Q4_K, Q5_K, Q6_K)
    outputs = compiled_ops["super_matmuls_alone"].execute(*packed_inputs(x, w, bias, formats))
    check_block_matmuls([out.to_numpy() for out in outputs], formats, x, w, bias, super_block_activations(x))


@pytest.mark.parametrize("rows", [1, 4, 7, 11])
@pytest.mark.parametrize(("k", "n"), [(32, 8), (64, 13), (1600, 4800), (3072, 97), (768, 1001)])
def test_the_other_blocks_of_32_match_numpy_on_the_weights_they_store(compiled_ops, rows, k, n):
    """q4_1, q5_0 and q5_1 (GPT-2 xl's fallbacks among them: 1600-wide rows) against float64 on the
    weights they store and x as q8_0 rounds it: the offsets through x's block sums, the mins added
    times them; N with every remainder of a group of 8 rows, x's rows one and in blocks of every
    height (two groups side by side from 4 rows, with VNNI); the dequantize ops give the stored
    weights to the bit."""
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32) + 0.5  # an offset that the mins' term carries
    w = rng.standard_normal((n, k), dtype=np.float32) + 0.25  # blocks not centred on zero: mins not 0
    bias = rng.standard_normal(n if (rows + n) % 2 else 0, dtype=np.float32)
    formats = (Q4_1, Q5_0, Q5_1)
    outputs = compiled_ops["small_block_matmuls_alone"].execute(*packed_inputs(x, w, bias, formats))
    check_block_matmuls([out.to_numpy() for out in outputs], formats, x, w, bias, quantized_activations(x))


def test_matmuls_refuse_a_bias_of_the_wrong_length(matmul, packed):
    x, w, bias = np.ones((1, 64), np.float32), np.ones((10, 64), np.float32), np.ones(9, np.float32)
    message = r"the bias has 9 values .*the product has 10 outputs"
    with pytest.raises(Exception, match="gpt2_matmul: " + message):
        matmul.execute(*map(Buffer.from_numpy, (x, w, bias)))
    with pytest.raises(Exception, match=message):
        packed.execute(*packed_inputs(x, w, bias))


def test_packed_bfloat16_refuses_a_row_major_weight(packed):
    """bfloat16 W must be in its groups of 8 rows; a plain [N, K] matrix is refused with both shapes."""
    x, w = np.ones((1, 64), np.float32), np.ones((10, 64), np.float32)
    inputs = packed_inputs(x, w, np.zeros(0, np.float32))
    inputs[1] = Buffer.from_numpy(float32_to_bfloat16_bits(w)).view(DType.bfloat16)
    message = r"gpt2_matmul: for K = 64 and N = 10 the bfloat16 weight needs \[2, 512\]; got \[10, 64\]"
    with pytest.raises(Exception, match=message):
        packed.execute(*inputs)


@pytest.mark.parametrize(
    ("batch", "new", "total", "cache_len", "heads", "head_dim"),
    [
        (1, 1, 1, 4, 2, 16),  # the first token
        (1, 1, 160, 200, 12, 64),  # a GPT-2 small decoding step
        (3, 1, 9, 12, 5, 12),  # a batch of steps, head_dim below one register
        (2, 4, 7, 7, 3, 20),  # several new tokens after a past, cache exactly full
        (2, 6, 6, 10, 4, 64),  # a whole prompt
        (16, 1, 300, 300, 12, 64),  # enough work for both threads
    ],
)
def test_cached_attention_matches_numpy(attention, batch, new, total, cache_len, heads, head_dim):
    """Writes exactly the new positions, and attends causally, skipping padding (key bias)."""
    rng = np.random.default_rng(total * batch + new)
    cache = rng.standard_normal((2, batch, heads, cache_len, head_dim), dtype=np.float32)
    qkv = rng.standard_normal((batch, new, 3 * heads * head_dim), dtype=np.float32)
    key_bias = np.where(rng.random((batch, total)) < 0.3, LOWEST, 0).astype(np.float32)
    key_bias[:, total - new :] = 0  # the new tokens are real
    expected, expected_cache = attention_reference(cache, qkv, key_bias, heads)
    written = Buffer.from_numpy(cache.copy())
    (out,) = attention.execute(written, Buffer.from_numpy(qkv), Buffer.from_numpy(key_bias))
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(written.to_numpy()[..., :total, :], expected_cache[..., :total, :])
    np.testing.assert_array_equal(written.to_numpy()[..., total:, :], cache[..., total:, :])


@pytest.mark.parametrize(
    ("batch", "new", "total", "cache_len", "heads", "head_dim"),
    [
        (1, 1, 160, 200, 12, 64),  # a GPT-2 small decoding step
        (3, 1, 9, 12, 5, 12),  # head_dim below one register
        (2, 6, 6, 10, 4, 64),  # a whole prompt
        (16, 1, 300, 300, 12, 64),  # enough work for both threads
    ],
)
def test_cached_attention_on_a_float16_cache_matches_numpy(
    attention_float16, batch, new, total, cache_len, heads, head_dim
):
    """New keys and values are stored rounded to float16; the attention is float32 arithmetic on
    the float16 values (queries unrounded)."""
    rng = np.random.default_rng(total * batch + new)
    cache = rng.standard_normal((2, batch, heads, cache_len, head_dim)).astype(np.float16)
    qkv = rng.standard_normal((batch, new, 3 * heads * head_dim), dtype=np.float32)
    key_bias = np.where(rng.random((batch, total)) < 0.3, LOWEST, 0).astype(np.float32)
    key_bias[:, total - new :] = 0  # the new tokens are real
    expected, expected_cache = attention_reference(cache, qkv, key_bias, heads, stored=np.float16)
    written = Buffer.from_numpy(cache.copy())
    (out,) = attention_float16.execute(written, Buffer.from_numpy(qkv), Buffer.from_numpy(key_bias))
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(written.to_numpy()[..., :total, :], expected_cache[..., :total, :])
    np.testing.assert_array_equal(written.to_numpy()[..., total:, :], cache[..., total:, :])


def test_cached_attention_refuses_inconsistent_shapes(attention):
    cache = Buffer.from_numpy(np.zeros((2, 1, 2, 4, 8), np.float32))
    qkv = Buffer.from_numpy(np.zeros((1, 1, 48), np.float32))
    too_long = Buffer.from_numpy(np.zeros((1, 5), np.float32))  # 5 positions, a cache of 4
    with pytest.raises(Exception, match="total <= cache length"):
        attention.execute(cache, qkv, too_long)


@pytest.mark.parametrize(
    ("cached", "new", "page_size", "heads", "head_dim", "stride"),
    [
        ([0], [1], 4, 2, 16, -1),  # the first token
        ([0, 5], [7, 1], 4, 3, 20, -1),  # a prompt and a step, pages crossed, head_dim off a register
        ([3, 0, 9], [1, 1, 1], 4, 2, 8, "packed"),  # decoding steps; an explicit page stride
        ([150, 40, 0, 201], [1, 1, 30, 1], 128, 12, 64, -1),  # GPT-2 small's heads, MAX's pages, both threads
    ],
)
def test_paged_attention_matches_numpy(paged_attention, cached, new, page_size, heads, head_dim, stride):
    """Writes exactly the new tokens' slots of one layer on each request's own pages, attends causally."""
    rng = np.random.default_rng(sum(cached) + len(new))
    layer = 1
    blocks, lookup = scattered_pages(rng, cached, new, page_size, heads, head_dim)
    offsets = np.cumsum([0, *new]).astype(np.uint32)
    qkv = rng.standard_normal((offsets[-1], 3 * heads * head_dim), dtype=np.float32)
    cached = np.array(cached, np.uint32)
    page_stride = blocks[0].size if stride == "packed" else stride
    expected, expected_blocks = paged_attention_reference(blocks, qkv, cached, lookup, offsets, layer, heads)
    written = Buffer.from_numpy(blocks.copy())
    inputs = [qkv, cached, lookup, offsets, np.array([page_stride], np.int64), np.array([layer], np.uint32)]
    (out,) = paged_attention.execute(written, *(Buffer.from_numpy(a) for a in inputs))
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(written.to_numpy(), expected_blocks.astype(np.float32))


@pytest.mark.parametrize(
    ("cached", "lookup", "layer", "message"),
    [
        (0, [[0]], 2, "layer 2 of a cache of 2"),
        (4, [[0]], 0, "request 0 needs 2 pages, its lookup table has 1"),  # 5 tokens, pages of 4
        (4, [[0, 3]], 0, "request 0 names page 3 of 2"),
    ],
)
def test_paged_attention_refuses_what_lies_outside_the_cache(paged_attention, cached, lookup, layer, message):
    """Nothing is written through a layer, lookup table or page that the blocks do not have."""
    blocks = np.zeros((2, 2, 2, 4, 2, 8), np.float32)  # 2 pages of 4 slots, 2 layers
    written = Buffer.from_numpy(blocks.copy())
    inputs = [np.ones((1, 48), np.float32), np.array([cached], np.uint32), np.array(lookup, np.uint32)]
    inputs += [np.array([0, 1], np.uint32), np.array([-1], np.int64), np.array([layer], np.uint32)]
    with pytest.raises(Exception, match=message):
        paged_attention.execute(written, *(Buffer.from_numpy(a) for a in inputs))
    np.testing.assert_array_equal(written.to_numpy(), blocks)


def write_package(directory, body: str):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "__init__.mojo").write_text(body)
    return directory


def test_the_kernels_compile_once_and_again_after_an_edit(tmp_path):
    """A graph stages some 60 of our ops: each must load the package compiled once, not compile it again,
    and an edited source must not be served by the old build."""
    sources, cache = (
        write_package(tmp_path / "kernels", "def answer() -> Int:\n    return 42\n"),
        tmp_path / "cache",
    )
    package = compiled_package(sources, cache)
    assert package.suffix == ".mojoc" and package.parent == cache and package.stat().st_size > 0
    built = package.stat().st_mtime_ns
    assert compiled_package(sources, cache) == package and package.stat().st_mtime_ns == built
    (sources / "__init__.mojo").write_text("def answer() -> Int:\n    return 43\n")
    edited = compiled_package(sources, cache)
    assert edited != package and edited.is_file()
    assert sorted(p.name for p in cache.iterdir()) == sorted([package.name, edited.name])  # no staging left


def test_an_unwritable_cache_leaves_the_sources_to_max_with_a_warning(tmp_path):
    sources = write_package(tmp_path / "kernels", "def answer() -> Int:\n    return 42\n")
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.warns(UserWarning, match=r"cannot keep the compiled kernels in .*a-file/cache \(\[Errno"):
        assert compiled_package(sources, tmp_path / "a-file" / "cache") == sources


def test_a_kernel_that_does_not_compile_gives_the_compilers_message(tmp_path):
    sources = write_package(tmp_path / "broken", "def answer() -> Int:\n    return undefined_name\n")
    with pytest.raises(RuntimeError, match=r"(?s)mojo precompile .*broken failed:.*undefined_name"):
        compiled_package(sources, tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())
    with pytest.raises(FileNotFoundError, match=r"no __init__\.mojo"):
        compiled_package(tmp_path, tmp_path / "cache")
