"""Weight formats for decoding: quantize and dequantize round trips and layouts (NumPy), and the
language model in each format against the float64 reference."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
from max.driver import CPU, Buffer
from max.dtype import DType
from max.experimental.nn import Module, ModuleList
from max.experimental.tensor import Tensor, TensorType

from max_gpt2 import GPT2Config, load_lm, reference
from max_gpt2.inference.devices import host_array, packed_buffer, weight_buffers
from max_gpt2.model.checkpoints.stored_weights import aliases, pack, unpack
from max_gpt2.model.formats import FORMATS, NAMED, MixedFormat, TensorFormat, format_named, mixed
from max_gpt2.model.formats.block_quants import BLOCK, Q4_0_CODE, Q8_0_CODE, quantize_q4_0, quantize_q8_0
from max_gpt2.model.formats.blocks import FieldBlockFormat
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from max_gpt2.model.formats.kernel_layout import (
    GROUP,
    deinterleave_bfloat16,
    deinterleave_blocks,
    interleave_bfloat16,
    interleave_blocks,
)
from max_gpt2.model.layers.packed_linear import PackedEmbedding
from max_gpt2.model.parameters import is_packed, model_parameter_shapes, stored_name
from tests.support import LM, LM_ONE_LAYER, LM_SUPER, prompt_and_steps


def fitting(format) -> GPT2Config:
    """A small model whose rows `format` stores: LM, or LM_SUPER (256 wide) for llama.cpp's types read by
    their fields, whose rows are whole blocks (of 32, or super-blocks of 256)."""
    return LM_SUPER if isinstance(format, FieldBlockFormat) else LM


# Largest |logit error| over largest |logit| against the float64 reference, for LM_ONE_LAYER's random
# weights: on the weights the format stores (each product's input rounded too: to bfloat16, or to
# int8 blocks for q8_0 and q4_0; bfloat16 measured 4.0e-3 with a float32 KV cache, 4.4e-3 with
# float16), and on the checkpoint's weights (benchmarks/weight_accuracy.py measures trained ones),
# where the token embedding is rounded too (q4_0 measured 0.35: 4-bit rounding of random weights).
ON_STORED_WEIGHTS = {"bfloat16": 1e-2, "q8_0": 5e-2, "q4_0": 5e-2, "q6_k": 5e-2}
ON_CHECKPOINT_WEIGHTS = {"bfloat16": 3e-2, "q8_0": 6e-2, "q4_0": 0.4, "q6_k": 0.1}

SHAPES = [(7, 32), (5, 60), (3, 100), (2, 768), (1, 1)]  # whole blocks, tails, a single value


def _steps(weight: np.ndarray, scales: np.ndarray, divisor: float) -> tuple[np.ndarray, np.ndarray]:
    """Per weight [N, K], float64: the block's exact step (its largest magnitude over `divisor`, what the
    values are rounded with) and how far the stored float16 scale is from it."""
    blocks = -(-weight.shape[1] // BLOCK)
    padded = np.zeros((weight.shape[0], blocks * BLOCK))
    padded[:, : weight.shape[1]] = weight
    exact = np.abs(padded.reshape(len(weight), blocks, BLOCK)).max(axis=-1) / divisor
    rounding = np.abs(np.abs(scales.astype(np.float64)) - exact)
    spread = [np.repeat(part, BLOCK, axis=1)[:, : weight.shape[1]] for part in (exact, rounding)]
    return spread[0], spread[1]


@pytest.mark.parametrize("shape", SHAPES)
def test_q8_0_keeps_each_weight_within_half_a_step_and_the_scales_rounding(shape):
    """llama.cpp rounds each value with the exact step (largest magnitude / 127) and stores the step
    rounded to float16: a weight comes back within half a step plus its value times that rounding."""
    weight = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    values, scales = quantize_q8_0(weight)
    blocks = -(-shape[1] // BLOCK)
    assert values.shape == (shape[0], blocks * BLOCK) and values.dtype == np.int8
    assert scales.shape == (shape[0], blocks) and scales.dtype == np.float16
    assert (values[:, shape[1] :] == 0).all() and np.abs(values).max() <= 127
    restored = Q8_0_CODE.dequantize(values, scales, shape[1])
    step, rounding = _steps(weight, scales, 127)
    bound = step / 2 + np.abs(values[:, : shape[1]]) * rounding + 1e-6 * np.abs(weight)
    assert (np.abs(restored - weight) <= bound).all()
    # A block's largest weight keeps its magnitude up to the scale's float16 rounding.
    assert np.allclose(np.abs(restored).max(axis=1), np.abs(weight).max(axis=1), rtol=2e-3)


@pytest.mark.parametrize("shape", SHAPES)
def test_q4_0_keeps_each_weight_within_half_a_step_but_the_clamped(shape):
    """The largest magnitude maps to -8 steps; the other side ends at +7, so values past +7.5 steps
    are clamped there, within a step (each plus its value times the float16 scale's rounding)."""
    weight = np.random.default_rng(sum(shape) + 1).standard_normal(shape).astype(np.float32)
    values, scales = quantize_q4_0(weight)
    blocks = -(-shape[1] // BLOCK)
    assert values.shape == (shape[0], blocks * BLOCK) and values.dtype == np.uint8
    assert values.max() <= 15
    restored = Q4_0_CODE.dequantize(values, scales, shape[1])
    step, rounding = _steps(weight, scales, 8)
    slack = np.abs(values[:, : shape[1]].astype(np.float64) - 8) * rounding + 1e-6 * np.abs(weight)
    error = np.abs(restored - weight)
    clamped = values[:, : shape[1]] == 15  # +7 steps: where values past +7.5 steps end
    assert (error[~clamped] <= step[~clamped] / 2 + slack[~clamped]).all()
    assert (error <= step + slack).all()


@pytest.mark.parametrize("format", ["q8_0", "q4_0"])
@pytest.mark.parametrize("shape", [(7, 32), (2, 768), (300, 96)])
def test_quantizing_gives_llama_cpps_blocks_bit_for_bit(format, shape):
    """Our quantizer, written as GGUF's blocks, against the `gguf` package's, which reproduces
    llama.cpp's `quantize_row_q8_0_ref` and `quantize_row_q4_0_ref` (their float32 arithmetic, the
    unrounded step, C's rounding): the same bytes, so a GGUF of ours and llama-quantize's agree."""
    gguf = pytest.importorskip("gguf")
    weight = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    weight[0, :32] = 0  # a block of zeros: scale 0
    weight[-1, -32:] = np.linspace(-1, 1, 32)  # values landing on halves of a step
    kind = gguf.GGMLQuantizationType[format_named(format).ggml_type]
    expected = gguf.quants.quantize(weight, kind)
    np.testing.assert_array_equal(format_named(format).rows(weight), expected)
    np.testing.assert_array_equal(
        format_named(format).values(expected, shape), gguf.quants.dequantize(expected, kind)
    )


def test_q4_0_maps_the_largest_magnitude_to_minus_8_steps():
    weight = np.concatenate([np.linspace(-8, 7, 16), np.linspace(7, -8, 16)])[None].astype(np.float32)
    values, scales = quantize_q4_0(weight)
    assert scales[0, 0] == 1.0  # d = -8 / -8
    np.testing.assert_array_equal(values[0], np.round(weight[0] + 8))
    np.testing.assert_array_equal(Q4_0_CODE.dequantize(values, scales, 32), np.round(weight))


@pytest.mark.parametrize("format", ["q8_0", "q4_0"])
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 17])
def test_interleaving_puts_each_value_where_the_kernel_reads_it(format, rows):
    """The layout in `kernel_layout`'s docstring, element by element, and back."""
    code = format_named(format).code
    rng = np.random.default_rng(rows)
    blocks = 3
    low, high, dtype = (-127, 128, np.int8) if format == "q8_0" else (0, 16, np.uint8)
    values = rng.integers(low, high, (rows, blocks * BLOCK)).astype(dtype)
    scales = rng.standard_normal((rows, blocks)).astype(np.float16)
    stored, stored_scales = interleave_blocks(code.to_blocks(values, scales), code)
    groups = -(-rows // GROUP)
    assert stored.shape == (groups, blocks * (256 if format == "q8_0" else 128))
    assert stored_scales.shape == (groups, blocks * 8)
    for row in range(groups * GROUP):
        g, r = divmod(row, GROUP)
        for b in range(blocks):
            assert stored_scales[g, b * 8 + r] == (scales[row, b] if row < rows else 0)
            for c in range(8 if format == "q8_0" else 4):
                for e in range(4):
                    if format == "q8_0":
                        got = [stored[g, (b * 8 + c) * 32 + r * 4 + e]]
                        want = [values[row, 32 * b + 4 * c + e] if row < rows else 0]
                    else:
                        byte = stored[g, (b * 4 + c) * 32 + r * 4 + e]
                        got = [byte & 0xF, byte >> 4]
                        columns = (32 * b + 4 * c + e, 32 * b + 16 + 4 * c + e)
                        want = [values[row, column] if row < rows else 0 for column in columns]
                    assert got == want, (row, b, c, e)
    back, back_scales = deinterleave_blocks(stored, stored_scales, code, rows)
    np.testing.assert_array_equal(back, values)
    np.testing.assert_array_equal(back_scales, scales)


@pytest.mark.parametrize(("rows", "columns"), [(1, 32), (7, 33), (8, 96), (9, 5), (17, 40)])
def test_bfloat16_interleaving_puts_each_value_where_the_kernel_reads_it(rows, columns):
    """bfloat16's layout in `kernel_layout`'s docstring, element by element (padding zero), and back."""
    bits = np.random.default_rng(rows).integers(1, 1 << 16, (rows, columns)).astype(np.uint16)
    stored = interleave_bfloat16(bits)
    groups, chunks = -(-rows // GROUP), -(-columns // 32)
    assert stored.shape == (groups, chunks * 256) and stored.dtype == np.uint16
    for row in range(groups * GROUP):
        g, r = divmod(row, GROUP)
        for column in range(chunks * 32):
            c, e = divmod(column, 32)
            want = bits[row, column] if row < rows and column < columns else 0
            assert stored[g, c * 256 + r * 32 + e] == want, (row, column)
    np.testing.assert_array_equal(deinterleave_bfloat16(stored, rows, columns), bits)


def test_a_block_of_zeros_stays_zero():
    for code in (Q8_0_CODE, Q4_0_CODE):
        values, scales = code.quantize(np.zeros((2, 40), np.float32))
        assert (scales == 0).all()
        np.testing.assert_array_equal(code.dequantize(values, scales, 40), np.zeros((2, 40)))


@pytest.mark.parametrize("format", FORMATS.values(), ids=FORMATS)
def test_packing_a_model_packs_the_projections_the_head_and_the_token_embedding_only(format):
    shapes = model_parameter_shapes(fitting(format))
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    packed = pack(weights, format)
    for name, array in weights.items():
        if not format.kernels_only or not is_packed(name):
            assert packed[name] is array  # embeddings, norms and biases stay float32, uncopied
    restored = unpack(packed, format, shapes)
    for name in (
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.1.mlp.c_proj.weight",
        "lm_head.weight",
        "transformer.wte.weight",
    ):
        error = np.abs(restored[name] - weights[name]).max() / np.abs(weights[name]).max()
        bound = {
            "float32": 0,
            "bfloat16": 2**-8,
            "q8_0": 1 / 127,
            "q4_0": 1 / 8,
            "q4_1": 1 / 8,
            "q5_0": 1 / 16,
            "q5_1": 1 / 16,
            "q4_k": 1 / 8,
            "q5_k": 1 / 16,
            "q6_k": 1 / 32,
        }
        assert error <= bound[format.name], name
    if format.name == "bfloat16":
        np.testing.assert_array_equal(
            restored["lm_head.weight"],
            bfloat16_bits_to_float32(float32_to_bfloat16_bits(weights["lm_head.weight"])),
        )
    extra = set(packed) - set(weights)
    assert extra == (
        {stored_name(name, "scales") for name in weights if is_packed(name)} if format.quantized else set()
    )


@pytest.mark.parametrize("format", FORMATS.values(), ids=FORMATS)
def test_weight_buffers_bind_the_packed_bytes_as_stored_and_a_tied_head_once(format):
    """`weight_buffers`, what `CompiledLM` (and the server) binds: every packed array as `pack` stores it,
    the rest in the compute dtype, and `wte`'s array handed out as the tied head converted once (packed,
    its scales too)."""
    rng = np.random.default_rng(1)
    weights = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in model_parameter_shapes(fitting(format)).items()
    }
    weights["lm_head.weight"] = weights["transformer.wte.weight"]  # tied, as `Checkpoint` hands it out
    buffers = weight_buffers(weights, format, DType.float32)
    packed = pack(weights, format)
    assert set(buffers) == set(packed)
    for name, array in packed.items():  # bfloat16 compared as its bits, as `pack` stores it
        np.testing.assert_array_equal(host_array(buffers[name]), array)
    if format.name == "bfloat16":
        assert buffers["lm_head.weight"].dtype == DType.bfloat16  # bound as bfloat16, not as its bits
    for part in format.arrays:
        assert buffers[f"lm_head.{part}"] is buffers[f"transformer.wte.{part}"]


def test_a_packed_embedding_looks_up_the_rows_its_table_stands_for():
    """`PackedEmbedding` in one graph: ids anywhere in the table (in its last, partial group of 8 rows
    too, and repeated) give exactly the rows its packed table unpacks to. Interleaved bfloat16, blocks
    of int8, super-blocks of uint8 (the dequantize ops of every format: tests/test_kernels.py)."""
    packed_formats = [FORMATS[name] for name in ("bfloat16", "q8_0", "q6_k")]
    vocab, width = 43, 256  # 5 whole groups of 8 rows and 3 rows; one super-block a row
    table = np.random.default_rng(3).standard_normal((vocab, width)).astype(np.float32)
    stored = [format.pack(format.rows(table)) for format in packed_formats]

    class Lookups(Module[[Tensor], tuple[Tensor, ...]]):
        def __init__(self) -> None:
            self.tables = ModuleList(PackedEmbedding(vocab, width, format=f) for f in packed_formats)

        def forward(self, ids: Tensor) -> tuple[Tensor, ...]:
            return tuple(table(ids) for table in self.tables)

    weights = {
        f"tables.{index}.{part}": packed_buffer(array)
        for index, arrays in enumerate(stored)
        for part, array in arrays.items()
    }
    run = Lookups().compile(TensorType(DType.int64, ["B", "S"], device=CPU()), weights=weights)
    ids = np.array([[0, 42, 7, 8, 40], [41, 42, 0, 15, 16]])
    for format, arrays, got in zip(packed_formats, stored, run(Buffer.from_numpy(ids)), strict=True):
        expected = format.unpack(arrays, vocab, width)[ids]  # [2, 5, width]
        np.testing.assert_array_equal(np.from_dlpack(got), expected, err_msg=format.name)


def test_a_tied_head_and_embedding_in_different_formats_are_refused_by_name():
    """Tied, the head and the embedding bind one table: a mix storing them apart cannot be bound so."""
    mix = mixed({"lm_head.weight": FORMATS["q6_k"], "transformer.wte.weight": FORMATS["q4_k"]})
    assert aliases(False, mix) == {}
    with pytest.raises(
        ValueError, match=r"stores lm_head\.weight as q6_k but transformer\.wte\.weight as q4_k"
    ):
        aliases(True, mix)


def test_a_mix_answers_all_its_base_promises_and_nothing_of_one_tensors_format():
    """`WeightFormat` promises what a model asks of its formats; a file's mix answers each of them as a
    single format does (per tensor through `format_for`) and offers nothing only one tensor's format
    can answer (`stored`, `pack`, `rows`: asked of `format_for(name)` instead)."""
    q4_k, q6_k = FORMATS["q4_k"], FORMATS["q6_k"]
    mix = mixed(
        {"lm_head.weight": q6_k, "transformer.h.0.attn.c_attn.weight": q4_k, "transformer.wte.weight": q4_k}
    )
    assert isinstance(mix, MixedFormat) and not isinstance(mix, TensorFormat)
    assert (mix.name, mix.ggml_type, mix.bytes_per_weight) == ("q4_k+q6_k", "Q4_K", q6_k.bytes_per_weight)
    for format in [*NAMED.values(), mix]:
        assert isinstance(format.built_as, TensorFormat), format
        for name in ("lm_head.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.0.ln_1.weight"):
            assert isinstance(format.format_for(name), TensorFormat), (format, name)
        assert format.check_runs(True, "the CPU") is format
        assert format.cache_dtype(None, DType.float32) in (DType.float32, DType.float16)
        assert format.half_cache == format.kernels_only
    assert mix.format_for("lm_head.weight") is q6_k and mix.built_as is q4_k
    assert mix.format_for("transformer.h.0.ln_1.weight") is q4_k  # what is not listed: the default
    assert not any(hasattr(mix, name) for name in ("stored", "pack", "unpack", "rows", "values", "arrays"))
    with pytest.raises(ValueError, match=r"weight_format='q4_k\+q6_k' is for decoding on the CPU in float32"):
        mix.check_runs(False, "GPU")


def test_unknown_formats_are_refused_with_the_list():
    with pytest.raises(
        ValueError,
        match="weight_format must be one of float32, bfloat16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, "
        "q6_k; got 'int4'",
    ):
        format_named("int4")


@pytest.mark.parametrize(
    ("config", "kv_cache", "format"),
    [
        *((LM_ONE_LAYER, "float32", format) for format in ("bfloat16", "q8_0", "q4_0")),
        *((LM, None, format) for format in ("bfloat16", "q8_0", "q4_0")),
        (LM_SUPER, None, "q6_k"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_the_model_in_each_format_tracks_the_reference(compiled_lm, lm_weights, config, kv_cache, format):
    """A prompt's logits and two decoding steps' against the float64 reference: op by op (exact GELU)
    with a float32 KV cache, and one op a block (`gpt2_decode_layer`, GELU's tanh form) with the
    packed formats' default cache, float16."""
    lm, weights = compiled_lm(config, weights=format, kv_cache=kv_cache), lm_weights(config)
    assert lm.kv_dtype.name == (kv_cache or "float16")
    assert f"kv_cache='{lm.kv_dtype.name}'" in repr(lm)  # named beside packed weights, default or not
    stored_format = format_named(format)
    stored = unpack(pack(weights, stored_format), stored_format, model_parameter_shapes(config))
    ids = np.random.default_rng(5).integers(0, config.vocab_size, (2, 9))
    got = prompt_and_steps(lm, ids, 7)  # [2, 9, vocab]: the prompt's 7 positions and the two steps'
    for parameters, tolerance in ((stored, ON_STORED_WEIGHTS), (weights, ON_CHECKPOINT_WEIGHTS)):
        expected = reference.lm_logits_and_largest_score(ids, parameters, config)[0]
        error = np.abs(got - expected).max() / np.abs(expected).max()
        assert error <= tolerance[format], error


def test_load_lm_refuses_an_unknown_format_before_reading(tmp_path):
    with pytest.raises(
        ValueError,
        match="weight_format must be one of float32, bfloat16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, "
        "q6_k; got 'q2_k'",
    ):
        load_lm(tmp_path / "missing", "cpu", weight_format="q2_k")


PACKAGE = Path(__file__).parents[1] / "max_gpt2"
DOCS = PACKAGE.parent / "docs"


def test_no_module_but_the_registry_compares_a_format_by_name():
    """Every other module asks a format object (`WeightFormat`): a quantized format's name written
    anywhere as a value, or a comparison of something named *format* with any format's name, is the
    string-compared variant the registry replaced (float32 and bfloat16 are dtypes' names too)."""
    names = set(FORMATS) | {"float16"}
    quantized = {name for name, format in FORMATS.items() if format.quantized}
    offenders = []
    for file in sorted(PACKAGE.rglob("*.py")):
        if file == PACKAGE / "model" / "formats" / "registry.py":
            continue
        for node in ast.walk(ast.parse(file.read_text())):
            where = f"{file.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Compare) and "format" in ast.unparse(node):
                literals = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
                if literals & names:
                    offenders.append(f"{where}: {ast.unparse(node)}")
            if isinstance(node, ast.Constant) and node.value in quantized:
                offenders.append(f"{where}: the value {node.value!r}")
    assert not offenders, "\n".join(offenders)


def test_the_name_check_sees_a_k_quant_compared_without_the_word_format():
    """The check above would catch `kind == "q4_k"`: the quantized names are all of `FORMATS`'s."""
    tree = ast.parse('if kind == "q4_k": pass')
    quantized = {name for name, format in FORMATS.items() if format.quantized}
    assert any(isinstance(node, ast.Constant) and node.value in quantized for node in ast.walk(tree))
    assert quantized == set(FORMATS) - {"float32", "bfloat16"}


FORMAT_RUN = re.compile(r"`?\b(?:NAMES)\b`?(?:(?:,? (?:or|and) |, )`?\b(?:NAMES)\b`?){3,}")


@pytest.mark.parametrize(
    "page", sorted([*DOCS.glob("*.md"), DOCS.parent / "README.md"]), ids=lambda p: p.name
)
def test_every_list_of_the_formats_in_the_docs_is_whole(page):
    """A list of four or more formats that starts from float32 means all of them: it names every one of
    `FORMATS`, in its order (subsets, such as the blocks of 32 or the K-quants, leave float32 out)."""
    run = re.compile(FORMAT_RUN.pattern.replace("NAMES", "|".join(FORMATS)))
    partial = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for found in run.finditer(line):
            named = re.findall("|".join(FORMATS), found.group())
            if "float32" in named and named != list(FORMATS):
                partial.append(f"{page.name}:{number}: {found.group()}")
    assert not partial, "lists of formats missing some of " + ", ".join(FORMATS) + ":\n" + "\n".join(partial)


def test_every_formats_kernel_code_and_block_agree_with_the_kernels():
    """Python's registry and `kernels/packed_layout.mojo` name the same codes (the compile-time parameter
    of `gpt2_matmul`, `gpt2_dequantize` and the decode-layer ops), each format's its own, and the same
    blocks: 32 weights, or the K-quants' super-blocks of 256. Each format's byte layout is held by the
    kernel tests (`tests/test_kernels.py`): the ops refuse arrays of any other shape (`check_blocks`) and
    unpack the packed bytes to the format's values, to the bit."""
    layout = (PACKAGE / "kernels" / "packed_layout.mojo").read_text()
    codes = {name: int(code) for name, code in re.findall(r"^comptime (Q\d_[0-9K]) = (\d+)", layout, re.M)}
    sizes = {name: int(size) for name, size in re.findall(r"^comptime (BLOCK|SUPER) = (\d+)", layout, re.M)}
    blocks = [format for format in FORMATS.values() if format.kernel_format]
    assert {format.ggml_type: format.kernel_format for format in blocks} == {
        name: code
        for name, code in codes.items()
        if name != "Q8_K"  # x's rounding for the K-quants
    }
    assert all(format.kernel_format == 0 for format in FORMATS.values() if format not in blocks)
    for format in blocks:
        super_block = format.ggml_type.endswith("_K")
        assert format.gguf_block[0] == sizes["SUPER" if super_block else "BLOCK"], format.name
