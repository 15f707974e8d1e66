"""llama.cpp's other block types (Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) and llama-quantize's mixes of types,
read from GGUF files: each tensor in its own type through the kernels, or as the float32 values they
stand for.

Each type's decoding is checked against the `gguf` package's (llama.cpp's own Python reader) bit for
bit; a file in each of llama-quantize's presets (their types, on a 256-wide model: K-quants'
super-blocks hold 256 weights) binds exactly the values `gguf` reads from it; a file mixing types
gives the logits of the float64 reference on those values, and the very logits of a float32 file
of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2 import CheckpointError, GPT2Config, load_lm, reference
from max_gpt2.model.checkpoints.gguf_checkpoint import GGUFCheckpoint
from max_gpt2.model.checkpoints.weights_cache import bound_weights
from max_gpt2.model.formats import BY_GGML_TYPE, FLOAT32, Q4_0
from max_gpt2.verify import compare
from tests.gguf_files import gguf, random_blocks, write_typed_file
from tests.llama_cpp import TYPES
from tests.support import LM_ONE_LAYER, LM_ONE_LAYER_GGUF, prompt_and_steps, prompts

WIDE = GPT2Config(n_embd=256, n_head=4, n_layer=2, n_positions=8, vocab_size=16, n_inner=512)


def preset(projections: str, down: str | None = None, embedding: str = "Q6_K") -> dict[str, str]:
    """ggml types by llama.cpp's tensor names, as llama-quantize's preset writes them for WIDE: the
    projections in one type (`down`: ffn_down's, where the preset keeps it apart), the tied
    embedding and head in `embedding`."""
    types = {"token_embd.weight": embedding}
    for layer in range(WIDE.n_layer):
        for part in ("attn_qkv", "attn_output", "ffn_up"):
            types[f"blk.{layer}.{part}.weight"] = projections
        types[f"blk.{layer}.ffn_down.weight"] = down or projections
    return types


PRESETS = {
    "Q4_0": preset("Q4_0"),
    "Q4_1": preset("Q4_1"),
    "Q5_0": preset("Q5_0"),
    "Q5_1": preset("Q5_1"),
    "Q4_K_M": preset("Q4_K", down="Q6_K"),
    "Q5_K_M": preset("Q5_K", down="Q6_K"),
    "Q6_K": preset("Q6_K"),
}


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_each_type_decodes_as_gguf_reads_it_bit_for_bit(kind, rows):
    """From GGUF's blocks, and from the kernels' layout they are shuffled into (`pack`, then `unpack`)."""
    rng = np.random.default_rng(rows)
    blocks = random_blocks(kind, rows, 512, rng)
    format = BY_GGML_TYPE[kind]
    expected = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind]).reshape(rows, 512)
    for ours in (format.values(blocks, (rows, 512)), format.unpack(format.pack(blocks), rows, 512)):
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours.view(np.uint32), expected.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("name", PRESETS)
def test_a_file_in_each_preset_binds_the_values_it_stands_for(tmp_path, name):
    path = tmp_path / f"wide-{name}.gguf"
    values = write_typed_file(path, WIDE, PRESETS[name], np.random.default_rng(1))
    checkpoint = GGUFCheckpoint(path)
    assert checkpoint.weight_format.kernels_only  # as itself: a mix of the kernels' formats tensor by tensor
    assert {source.ggml_type for source in checkpoint.source_formats} == set(PRESETS[name].values())
    bound = bound_weights(checkpoint, FLOAT32, tmp_path / "cache")
    assert set(bound) == set(values)
    for parameter, value in values.items():
        np.testing.assert_array_equal(bound[parameter], value, err_msg=parameter)
    assert bound["lm_head.weight"] is bound["transformer.wte.weight"]  # tied, bound once


def test_a_mix_of_types_runs_each_in_its_own_and_gives_the_reference_logits(tmp_path):
    """LM_ONE_LAYER (32 wide: the 32-weight types) with each projection in a type of its own, all four in
    one decode-layer op (q8_0's int8 bound as bytes beside the others, c_attn's x rounded as q8_0's
    products read it, c_fc's as q5_0's), and the embedding in another: it loads as that mix, and a
    prompt's and its steps' logits follow the float64 reference on the values the file stands for
    within what rounding x to int8 blocks of 32 costs (as q8_0's and q4_0's whole models,
    tests/test_weight_formats.py); asked for as float32, the very logits of an F32 file of them."""
    types = {
        "token_embd.weight": "Q5_1",
        "blk.0.attn_qkv.weight": "Q8_0",
        "blk.0.attn_output.weight": "Q4_1",
        "blk.0.ffn_up.weight": "Q5_0",
        "blk.0.ffn_down.weight": "Q5_1",
    }
    mixed = tmp_path / "mixed.gguf"
    values = write_typed_file(mixed, LM_ONE_LAYER, types, np.random.default_rng(2))
    lm = load_lm(mixed, "cpu", cache_dir=tmp_path / "cache")
    assert lm.config == LM_ONE_LAYER_GGUF and lm.weight_format.kernels_only
    assert lm.weight_format.format_for("transformer.h.0.mlp.c_fc.weight").name == "q5_0"
    ids = prompts(LM_ONE_LAYER, 2, 9)
    expected, largest_score = reference.lm_logits_and_largest_score(ids, values, LM_ONE_LAYER_GGUF)
    got = prompt_and_steps(lm, ids, 5)
    assert np.abs(got - expected).max() <= 5e-2 * np.abs(expected).max()  # measured 0.018
    as_float32 = load_lm(mixed, "cpu", weight_format=FLOAT32, cache_dir=tmp_path / "cache").logits(ids)
    comparison = compare(as_float32, expected, "float32", largest_score)
    assert comparison.passed, comparison
    plain = tmp_path / "float32.gguf"
    write_typed_file(plain, LM_ONE_LAYER, {}, np.random.default_rng(0), values)
    np.testing.assert_array_equal(load_lm(plain, "cpu", cache_dir=tmp_path / "cache").logits(ids), as_float32)


def test_a_mix_loads_as_itself_or_float32_only(tmp_path):
    path = tmp_path / "q4_k_m.gguf"
    write_typed_file(path, WIDE, PRESETS["Q4_K_M"], np.random.default_rng(3))
    message = r"q4_k_m\.gguf is q4_k, q6_k; it loads as q4_k\+q6_k or as float32 .* not as q4_0"
    with pytest.raises(ValueError, match=message):
        load_lm(path, "cpu", weight_format=Q4_0, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(
    ("name", "types"),
    [
        ("F16 beside q4_0", {**PRESETS["Q4_0"], "blk.0.ffn_up.weight": "F16"}),  # a type no kernel reads
        ("BF16 beside q4_0", {**PRESETS["Q4_0"], "blk.1.attn_output.weight": "BF16"}),  # a layer's dtypes
    ],
)
def test_a_mix_the_kernels_cannot_take_loads_as_float32(tmp_path, name, types):
    write_typed_file(tmp_path / "mix.gguf", WIDE, types, np.random.default_rng(5))
    assert GGUFCheckpoint(tmp_path / "mix.gguf").weight_format is FLOAT32, name


def test_a_type_not_read_is_refused_with_the_list(tmp_path):
    path = tmp_path / "q2_k.gguf"
    write_typed_file(path, WIDE, {**PRESETS["Q6_K"], "blk.1.ffn_up.weight": "Q2_K"}, np.random.default_rng(4))
    read = ", ".join(BY_GGML_TYPE)
    with pytest.raises(
        CheckpointError, match=rf"{path}: tensor blk\.1\.ffn_up\.weight is Q2_K; GGUF types read are {read}"
    ):
        GGUFCheckpoint(path)


def test_a_block_whose_scale_is_not_finite_is_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "corrupt.gguf"
    write_typed_file(path, WIDE, PRESETS["Q4_K_M"], np.random.default_rng(5))
    checkpoint = GGUFCheckpoint(path)
    info = checkpoint.gguf.tensors["blk.1.ffn_up.weight"]
    data = bytearray(path.read_bytes())
    data[info.start : info.start + 2] = np.array([np.inf], np.float16).tobytes()  # the first block's d
    path.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError,
        match=rf"{path}: tensor blk\.1\.ffn_up\.weight \(Q4_K\): a block's scale is not a finite",
    ):
        bound_weights(GGUFCheckpoint(path), FLOAT32, tmp_path / "cache")
