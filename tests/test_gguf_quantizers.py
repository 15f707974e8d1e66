"""llama.cpp's quantizers for Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, and llama-quantize's presets.

Bit for bit against blocks `llama-quantize` made (`tests/data/llama_quantize_blocks.npz`, written by
`python -m tests.llama_cpp`), and against `llama-quantize` itself on fresh weights and whole preset
files where llama.cpp is installed (`$LLAMA_CPP` or PATH; skipped elsewhere). The presets' choice of
type per tensor is checked against llama-quantize's counts for GPT-2's shapes, and a file written in
a preset loads as the values `gguf` reads from it.
"""

from __future__ import annotations

import collections
import subprocess

import numpy as np
import pytest

from max_gpt2 import GPT2Config, load_lm, reference
from max_gpt2.kernels.ops import LAYER_PRODUCTS
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.model.checkpoints.gguf_checkpoint import GGUFCheckpoint, gguf_metadata, gguf_name, gguf_tensors
from max_gpt2.model.checkpoints.gguf_writer import write_gguf
from max_gpt2.model.checkpoints.weights_cache import bound_weights
from max_gpt2.model.formats import BY_GGML_TYPE, FLOAT32
from max_gpt2.model.formats.gguf_mixes import MIXES
from max_gpt2.testing import write_checkpoint
from tests.gguf_files import gguf
from tests.llama_cpp import FIXTURE, TYPES, crafted_rows, llama_tool, quantized_by_llama
from tests.support import prompt_and_steps, run_python

TWELVE = GPT2Config(n_embd=256, n_head=4, n_layer=12, n_positions=8, vocab_size=16, n_inner=1024)
XL_LIKE = GPT2Config(n_embd=320, n_head=4, n_layer=8, n_positions=8, vocab_size=16, n_inner=1280)


@pytest.mark.parametrize("kind", TYPES)
def test_each_quantizer_writes_llama_quantizes_blocks(kind):
    fixture = np.load(FIXTURE)
    assert np.array_equal(fixture["weights"], crafted_rows())  # the rows the fixture was made of
    ours = BY_GGML_TYPE[kind].rows(fixture["weights"])
    np.testing.assert_array_equal(ours, fixture[kind])


@pytest.mark.parametrize("kind", TYPES)
def test_quantized_blocks_decode_near_the_weights(kind):
    """Our blocks read back by `gguf` (llama.cpp's reader) are the weights within half a step of each
    group's grid: the largest error stays under the group's range over its levels."""
    weights = np.random.default_rng(1).standard_normal((8, 512)).astype(np.float32)
    blocks = BY_GGML_TYPE[kind].rows(weights)
    back = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind]).reshape(weights.shape)
    levels = {"Q4_1": 15, "Q5_0": 31, "Q5_1": 31, "Q4_K": 15, "Q5_K": 31, "Q6_K": 63}[kind]
    group = 16 if kind == "Q6_K" else 32
    grouped = weights.reshape(-1, group)
    span = grouped.max(axis=1) - np.minimum(grouped.min(axis=1), 0)
    if kind in ("Q5_0", "Q6_K"):  # symmetric around zero
        span = 2 * np.abs(grouped).max(axis=1)
    error = np.abs(back.reshape(-1, group) - grouped).max(axis=1)
    assert (error <= 1.5 * span / levels).all()


LLAMA_QUANTIZE = llama_tool("llama-quantize")
needs_llama = pytest.mark.skipif(
    LLAMA_QUANTIZE is None, reason="needs llama.cpp's llama-quantize (set LLAMA_CPP to its build/bin)"
)


@needs_llama
@pytest.mark.parametrize("kind", TYPES)
def test_each_quantizer_equals_llama_quantize_on_fresh_weights(kind):
    rng = np.random.default_rng(7)
    rows = (rng.standard_t(4, (64, 512)) * rng.uniform(1e-3, 1, (64, 1))).astype(np.float32)
    np.testing.assert_array_equal(
        BY_GGML_TYPE[kind].rows(rows), quantized_by_llama(LLAMA_QUANTIZE, rows, kind)
    )


def types_by_part(formats: dict) -> collections.Counter:
    """(llama.cpp's tensor kind, ggml type) counted over a preset's formats."""
    return collections.Counter(
        (gguf_name(name).split(".")[-2], kind.ggml_type) for name, kind in formats.items()
    )


def test_presets_choose_llama_quantizes_types_for_gpt2():
    """GPT-2 small's layer count: Q4_K_M is 36 Q4_K and 13 Q6_K (attn_qkv and ffn_down in layers 0, 3, 6,
    9, 10, 11, and the tied embedding), Q5_K_M likewise with Q5_K, Q6_K all Q6_K; position_embd,
    norms and biases F32."""
    q4 = MIXES["q4_k_m"].formats(TWELVE, tied=True)
    counted = types_by_part(q4)
    assert counted[("attn_qkv", "Q6_K")] == counted[("ffn_down", "Q6_K")] == 6
    assert counted[("attn_qkv", "Q4_K")] == counted[("ffn_down", "Q4_K")] == 6
    assert counted[("attn_output", "Q4_K")] == counted[("ffn_up", "Q4_K")] == 12
    assert counted[("token_embd", "Q6_K")] == 1 and counted[("position_embd", "F32")] == 1
    wide = [name for name, kind in q4.items() if kind.ggml_type == "Q6_K" and ".h." in name]
    assert sorted({int(name.split(".")[2]) for name in wide}) == [0, 3, 6, 9, 10, 11]
    assert "lm_head.weight" not in q4  # tied: llama.cpp reads token_embd
    quantized = collections.Counter(kind.ggml_type for kind in q4.values() if kind.quantized)
    assert quantized == {"Q4_K": 36, "Q6_K": 13}
    q5 = collections.Counter(kind.ggml_type for kind in MIXES["q5_k_m"].formats(TWELVE, True).values())
    assert q5["Q5_K"] == 36 and q5["Q6_K"] == 13
    q6 = collections.Counter(kind.ggml_type for kind in MIXES["q6_k"].formats(TWELVE, True).values())
    assert q6["Q6_K"] == 49


def test_presets_fall_back_where_rows_are_not_super_blocks():
    """GPT-2 xl's rows (1600 weights) are not whole 256-weight super-blocks: Q4_K falls back to Q5_0,
    Q5_K to Q5_1, Q6_K to Q8_0, and the tied embedding to Q8_0; ffn_down's 4x-wide rows keep theirs."""
    for name, base, fallback in (("q4_k_m", "Q4_K", "Q5_0"), ("q5_k_m", "Q5_K", "Q5_1")):
        counted = types_by_part(MIXES[name].formats(XL_LIKE, tied=True))
        assert counted[("attn_output", fallback)] == counted[("ffn_up", fallback)] == 8, name
        assert counted[("attn_qkv", "Q8_0")] + counted[("attn_qkv", fallback)] == 8, name
        assert counted[("ffn_down", "Q6_K")] + counted[("ffn_down", base)] == 8, name
        assert counted[("token_embd", "Q8_0")] == 1, name
    six = types_by_part(MIXES["q6_k"].formats(XL_LIKE, tied=True))
    assert six[("ffn_down", "Q6_K")] == 8 and six[("attn_output", "Q8_0")] == 8


def preset_file(tmp_path, config, preset, seed=3):
    """`config`'s seeded checkpoint written in `preset` by the library, as `convert` writes it."""
    checkpoint = Checkpoint(write_checkpoint(tmp_path / f"{preset}-model", config, seed=seed))
    formats = MIXES[preset].formats(checkpoint.config, checkpoint.tied)
    specs, tensors = gguf_tensors(checkpoint, formats)
    out = tmp_path / f"{preset}.gguf"
    write_gguf(out, gguf_metadata(checkpoint.config, MIXES[preset].file_type, True, out.stem), specs, tensors)
    return checkpoint, out


@pytest.mark.parametrize("preset", list(MIXES))
@pytest.mark.parametrize("config", [TWELVE, XL_LIKE], ids=["256-wide", "320-wide"])
def test_a_preset_file_loads_as_the_values_gguf_reads_from_it(tmp_path, preset, config):
    """Every tensor, its fallbacks' types included (Q5_0, Q5_1, Q8_0 at 320-wide rows)."""
    out = preset_file(tmp_path, config, preset)[1]
    reader = {tensor.name: tensor for tensor in gguf.GGUFReader(out).tensors}
    loaded = GGUFCheckpoint(out)
    assert loaded.weight_format.kernels_only  # as it is, each tensor in its type, fallbacks included
    bound = bound_weights(loaded, FLOAT32, tmp_path / "cache")
    for name, array in bound.items():
        tensor = reader[gguf_name("transformer.wte.weight" if name == "lm_head.weight" else name)]
        expected = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        np.testing.assert_array_equal(np.asarray(array).reshape(-1), expected.reshape(-1), err_msg=name)


def error_on_the_files_values(lm, out, tmp_path) -> float:
    """A prompt's and two steps' logits of `lm` (loaded from the GGUF file `out`) against the float64
    reference on the values the file stands for: the largest |error| over the largest |logit|."""
    values = bound_weights(GGUFCheckpoint(out), FLOAT32, tmp_path / "float32")
    config = lm.config
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, config.n_positions))
    got = prompt_and_steps(lm, ids, config.n_positions - 2)
    expected = reference.lm_logits_and_largest_score(ids, dict(values), config)[0]
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def test_a_q4_k_m_file_runs_each_tensor_in_its_own_format_and_tracks_the_reference(tmp_path):
    """llama-quantize's Q4_K_M mix (q6_k c_attn and mlp c_proj in 6 of 12 layers and the tied head, q4_k
    the rest) loads as it is, each projection in its tensor's format through the kernels, two blocks
    stored differently in one graph; a prompt's and two steps' logits against the float64 reference on
    the values the file stands for, within what rounding x to q8_K's blocks of 256 costs (as
    q6_k's whole model, tests/test_weight_formats.py)."""
    out = preset_file(tmp_path, TWELVE, "q4_k_m")[1]
    lm = load_lm(out, "cpu", cache_dir=tmp_path / "cache")
    mix = lm.weight_format
    assert mix.name == "q4_k+q6_k" and mix.kernels_only
    assert [mix.format_for(f"transformer.h.{i}.attn.c_attn.weight").name for i in range(4)] == [
        "q6_k",
        "q4_k",
        "q4_k",
        "q6_k",
    ]
    assert mix.format_for("lm_head.weight").name == "q6_k"
    assert error_on_the_files_values(lm, out, tmp_path) <= 5e-2


def test_an_xl_shaped_q4_k_m_file_runs_its_fallbacks_natively_and_tracks_the_reference(tmp_path):
    """Q4_K_M where rows are not whole super-blocks (GPT-2 xl's 1600, here 320): c_attn in q8_0 (Q6_K's
    fallback) in the more-bits layers and q5_0 (Q4_K's) elsewhere, attn c_proj and c_fc in q5_0, mlp
    c_proj's 1280-wide rows in q6_k and q4_k, the tied head in q8_0; every layer one decode-layer op.
    A prompt's and two steps' logits against the float64 reference on the file's values, within what
    rounding x to int8 blocks costs (as the 256-wide file above)."""
    out = preset_file(tmp_path, XL_LIKE, "q4_k_m")[1]
    lm = load_lm(out, "cpu", cache_dir=tmp_path / "cache")
    mix = lm.weight_format
    assert mix.kernels_only
    layers = [
        [mix.format_for(f"transformer.h.{i}.{part}.weight").name for i in (0, 1)] for part in LAYER_PRODUCTS
    ]
    assert layers == [["q8_0", "q5_0"], ["q5_0", "q5_0"], ["q5_0", "q5_0"], ["q6_k", "q4_k"]]
    assert mix.format_for("lm_head.weight").name == "q8_0"
    assert error_on_the_files_values(lm, out, tmp_path) <= 5e-2  # measured 0.015


@needs_llama
@pytest.mark.parametrize("preset", list(MIXES))
@pytest.mark.parametrize("config", [TWELVE, XL_LIKE], ids=["256-wide", "320-wide"])
def test_a_preset_file_equals_llama_quantizes_byte_for_byte(tmp_path, preset, config):
    """llama-quantize's preset of llama.cpp's F32 file of the same checkpoint: the same tensors, types,
    bytes and `general.file_type`."""
    checkpoint, ours = preset_file(tmp_path, config, preset)
    f32 = tmp_path / "f32.gguf"
    done = run_python("-m", "max_gpt2", "convert", "--checkpoint", str(checkpoint.path), "--out", str(f32))
    assert done.returncode == 0, done.stderr
    theirs = tmp_path / "llama.gguf"
    made = subprocess.run([LLAMA_QUANTIZE, f32, theirs, preset.upper()], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-2000:]
    read_ours, read_theirs = gguf.GGUFReader(ours), gguf.GGUFReader(theirs)
    assert (
        read_ours.fields["general.file_type"].contents() == read_theirs.fields["general.file_type"].contents()
    )
    a = {tensor.name: tensor for tensor in read_ours.tensors}
    b = {tensor.name: tensor for tensor in read_theirs.tensors}
    assert set(a) == set(b)
    for name in a:
        assert a[name].tensor_type == b[name].tensor_type, name
        np.testing.assert_array_equal(np.asarray(a[name].data), np.asarray(b[name].data), err_msg=name)
