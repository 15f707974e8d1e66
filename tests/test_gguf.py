"""GGUF files in: a GGUF of a checkpoint, written by the `gguf` package (llama.cpp's writer) or by
llama.cpp's converter, loads as the checkpoint does, with the tokenizer it carries; bad files are
refused naming the file and what is wrong."""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max_gpt2 import CheckpointError, GPT2Config, load_lm
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import open_checkpoint
from max_gpt2.model.checkpoints.gguf_checkpoint import GGUFCheckpoint, gguf_name
from max_gpt2.model.checkpoints.gguf_file import GGUFFile
from max_gpt2.model.checkpoints.gguf_writer import write_gguf
from max_gpt2.model.checkpoints.weights_cache import bound_weights
from max_gpt2.model.formats import FLOAT32
from max_gpt2.model.parameters import model_parameter_shapes
from max_gpt2.testing import write_checkpoint
from tests.gguf_files import encoded, gguf, write_gguf_file
from tests.support import LM, LM_ONE_LAYER, prompts

TEXT = "The cat sat on the mat. Héllo wörld, 1234 <|endoftext|> tabs\tand  spaces\n"


@pytest.fixture(scope="module")
def save_pretrained(tmp_path_factory):
    """`save_pretrained`-layout checkpoints of LM (with its tokenizer) and LM_ONE_LAYER, seed 0: the
    weights `compiled_lm`'s checkpoints hold."""
    root = tmp_path_factory.mktemp("save-pretrained")
    return {
        config: write_checkpoint(root / name, config, 0, "save_pretrained", tokenizer=config is LM)
        for name, config in (("lm", LM), ("one-layer", LM_ONE_LAYER))
    }


@pytest.mark.parametrize("kind", ["F32", "F16"])
def test_a_float_gguf_gives_the_checkpoints_logits_and_tokens(
    compiled_lm, lm_weights, save_pretrained, tmp_path, kind
):
    """F32: the very logits of the checkpoint; F16 (projections and embeddings, as llama.cpp's converter
    writes `--outtype f16`): those of its weights rounded to float16, which GGUF widens exactly. The
    tokenizer comes from the file's metadata (no tokenizer file beside it) and encodes as the
    checkpoint's."""
    path = write_gguf_file(save_pretrained[LM], LM, tmp_path / f"lm-{kind}.gguf", kind, embeddings=kind)
    lm = load_lm(path, "cpu", cache_dir=tmp_path / "cache")
    assert lm.weight_format.name == "float32" and lm.config == LM
    weights = lm_weights(LM)
    if kind == "F16":
        weights = {
            name: w.astype(np.float16).astype(np.float32) if w.ndim == 2 else w for name, w in weights.items()
        }
        weights["lm_head.weight"] = weights["transformer.wte.weight"]
    ids = prompts(LM, 2, 11)
    expected = compiled_lm(LM).with_weights(weights).logits(ids)
    np.testing.assert_array_equal(lm.logits(ids), expected)
    if kind == "F16":  # and float16's rounding moves them little
        unrounded = compiled_lm(LM).logits(ids)
        assert 0 < np.abs(expected - unrounded).max() <= 1e-2 * np.abs(unrounded).max()
    checkpoint_tokenizer = load_tokenizer(save_pretrained[LM])
    assert lm.tokenizer.encode(TEXT).ids == checkpoint_tokenizer.encode(TEXT).ids
    assert lm.tokenizer.decode(checkpoint_tokenizer.encode(TEXT).ids, skip_special_tokens=False) == TEXT


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("embeddings", ["F32", "quantized"])
def test_a_quantized_gguf_binds_as_our_own_quantization(
    compiled_lm, lm_weights, save_pretrained, tmp_path, kind, embeddings
):
    """Blocks quantized by `gguf.quants` (llama.cpp's rules) bind, shuffled into the kernels' layout, as
    our own quantization of the same weights binds: the same logits, bit for bit. With the embeddings
    quantized too (and the head stored apart, as `llama-quantize --pure` leaves an untied file), the
    embeddings are the values their blocks stand for. (LM_ONE_LAYER's exact GELU is not GGUF's, so its
    file's weights are bound to its compiled graph.)"""
    weight_format, quantized = kind.lower(), embeddings == "quantized"
    path = write_gguf_file(
        save_pretrained[LM_ONE_LAYER], LM_ONE_LAYER, tmp_path / "one.gguf", kind,
        embeddings=kind if quantized else "F32", head=quantized,
    )  # fmt: skip
    checkpoint = GGUFCheckpoint(path)
    assert checkpoint.weight_format.name == weight_format
    stored = bound_weights(checkpoint, checkpoint.weight_format, tmp_path / "cache")
    weights = dict(lm_weights(LM_ONE_LAYER))
    if quantized:
        for name in ("transformer.wte.weight", "transformer.wpe.weight"):
            kind_enum = gguf.GGMLQuantizationType[kind]
            weights[name] = gguf.quants.dequantize(gguf.quants.quantize(weights[name], kind_enum), kind_enum)
    lm = compiled_lm(LM_ONE_LAYER, weights=weight_format, kv_cache="float32")
    ids = prompts(LM_ONE_LAYER, 2, 9)
    np.testing.assert_array_equal(lm.with_weights(stored).logits(ids), lm.with_weights(weights).logits(ids))


def test_a_float_gguf_loads_in_a_packed_format_as_its_checkpoint_does(compiled_lm, save_pretrained, tmp_path):
    """`load_lm(FILE, weight_format="q4_0")` on an F32 file: quantized once into the weights cache, the
    logits of the checkpoint in q4_0."""
    path = write_gguf_file(save_pretrained[LM], LM, tmp_path / "lm.gguf", "F32")
    lm = load_lm(path, "cpu", weight_format="q4_0", cache_dir=tmp_path / "cache")
    ids = prompts(LM, 2, 7)
    np.testing.assert_array_equal(lm.logits(ids), compiled_lm(LM, weights="q4_0").logits(ids))


def test_a_quantized_gguf_loads_as_float32_but_not_requantized(save_pretrained, tmp_path):
    path = write_gguf_file(save_pretrained[LM_ONE_LAYER], LM_ONE_LAYER, tmp_path / "q4.gguf", "Q4_0")
    with pytest.raises(ValueError, match=r"q4\.gguf is q4_0; it loads as q4_0 or as float32 .* not as q8_0"):
        load_lm(path, "cpu", weight_format="q8_0")


@pytest.mark.skipif(
    not os.environ.get("MAX_GPT2_LLAMA_CPP") or not os.environ.get("MAX_GPT2_GPT2_VOCAB"),
    reason="set MAX_GPT2_LLAMA_CPP (llama.cpp's source, with convert_hf_to_gguf.py) and MAX_GPT2_GPT2_VOCAB "
    "(GPT-2's vocab.json and merges.txt, which its converter recognises)",
)
def test_a_gguf_of_llama_cpps_converter_loads_as_its_checkpoint(tmp_path):
    """llama.cpp's own `convert_hf_to_gguf.py` on a checkpoint with GPT-2's tokenizer: the same config,
    bound weights equal to the checkpoint's, and the tokenizer GPT-2's."""
    from max_gpt2.model.checkpoints.stored_weights import pack

    config = GPT2Config(n_embd=64, n_head=2, n_layer=2, n_positions=64, eos_token_id=50256)
    checkpoint = write_checkpoint(tmp_path / "hf", config, 0, "save_pretrained", mask_buffers=False)
    vocab = Path(os.environ["MAX_GPT2_GPT2_VOCAB"])
    for target, names in {
        "vocab.json": ("vocab.json", "encoder.json"),
        "merges.txt": ("merges.txt", "vocab.bpe"),
    }.items():
        (checkpoint / target).write_bytes(
            next((vocab / n).read_bytes() for n in names if (vocab / n).is_file())
        )
    config_file = checkpoint / "config.json"
    config_file.write_text(config_file.read_text().replace('"n_positions"', '"n_ctx": 64, "n_positions"'))
    converter = Path(os.environ["MAX_GPT2_LLAMA_CPP"]) / "convert_hf_to_gguf.py"
    path = tmp_path / "converted.gguf"
    done = subprocess.run(
        [sys.executable, str(converter), str(checkpoint), "--outtype", "f32", "--outfile", str(path)],
        capture_output=True, text=True, env=dict(os.environ), timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    opened = open_checkpoint(path)
    assert opened.config == config
    expected = pack(open_checkpoint(checkpoint).model_weights(), FLOAT32)
    bound = bound_weights(opened, FLOAT32)
    assert all(np.array_equal(bound[name], array) for name, array in expected.items())
    assert load_tokenizer(path).encode(TEXT).ids == load_tokenizer(checkpoint).encode(TEXT).ids


# Bad files: refused on opening, naming the file and what is wrong.


@pytest.fixture(scope="module")
def good_file(save_pretrained, tmp_path_factory):
    return write_gguf_file(
        save_pretrained[LM_ONE_LAYER], LM_ONE_LAYER, tmp_path_factory.mktemp("good") / "good.gguf", "Q8_0"
    )


def _edited(good_file: Path, path: Path, edit) -> Path:
    path.write_bytes(edit(bytearray(good_file.read_bytes())))
    return path


def test_the_good_file_opens(good_file):
    checkpoint = GGUFCheckpoint(good_file)
    assert checkpoint.config == dataclasses.replace(LM_ONE_LAYER, activation_function="gelu_new")
    assert checkpoint.weight_format.name == "q8_0"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda data: b"GGML" + data[4:], "not a valid GGUF file: it does not start with b'GGUF'"),
        (lambda data: data[:4] + struct.pack("<I", 7) + data[8:], "version 7; versions 2 and 3 are read"),
        (
            lambda data: data[:16] + struct.pack("<Q", 1 << 40) + data[24:],
            "claims 0 tensors|claims .* metadata",
        ),
        (lambda data: data[:200], "past the end of the file"),
        (
            lambda data: data[:-100],
            r"tensor token_embd\.weight \(F32 \[101, 32\], .*\) runs past the end of the file .*: the file "
            r"is truncated",
        ),
        (lambda data: data[:12], "shorter than a header"),
    ],
    ids=["magic", "version", "count", "cut-in-header", "cut-in-data", "tiny"],
)
def test_a_damaged_file_is_refused_naming_it(good_file, tmp_path, edit, message):
    path = _edited(good_file, tmp_path / "damaged.gguf", edit)
    with pytest.raises(CheckpointError, match=f"{path}.*(?:{message})"):
        GGUFCheckpoint(path)


def test_a_key_that_is_not_text_is_refused(good_file, tmp_path):
    key = b"general.architecture"
    path = _edited(good_file, tmp_path / "bad.gguf", lambda data: data.replace(key, b"\xff" * len(key), 1))
    with pytest.raises(
        CheckpointError, match=f"{path} is not a valid GGUF file: a metadata key is not UTF-8"
    ):
        GGUFFile(path)


TINY = GPT2Config(n_embd=256, n_head=4, n_layer=1, n_positions=8, vocab_size=16, n_inner=256)


def _tiny(
    path: Path, architecture: str = "gpt2", context: Any = 8, types=None, drop=(), add=(), alignment=None
) -> Path:
    """A GGUF of TINY's shapes (random values) by `gguf`'s writer: `types` {GGUF name: ggml type} (else
    F32), tensors in `drop` left out, (name, shape) in `add` added, `context` as gpt2.context_length (a
    string written as one), `alignment` as general.alignment where given (a bool written as one)."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(TINY.n_layer)
    if isinstance(context, str):
        writer.add_string("gpt2.context_length", context)
    else:
        writer.add_context_length(context)
    if isinstance(alignment, bool):
        writer.add_bool("general.alignment", alignment)
    elif alignment is not None:
        writer.add_float32("general.alignment", alignment)
    writer.add_embedding_length(TINY.n_embd)
    writer.add_feed_forward_length(TINY.mlp_width)
    writer.add_head_count(TINY.n_head)
    writer.add_layer_norm_eps(TINY.layer_norm_epsilon)
    for name, shape in model_parameter_shapes(TINY).items():
        stored = gguf_name(name)
        if name == "lm_head.weight" or stored in drop:
            continue
        kind = (types or {}).get(stored, "F32")
        if kind == "Q2_K":  # 256 weights a block, 84 bytes: gguf cannot quantize to it, but can store it
            writer.add_tensor(
                stored, np.zeros((shape[0], 84), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K
            )
        else:
            writer.add_tensor(stored, *encoded(rng.standard_normal(shape).astype(np.float32), kind))
    for stored, shape in add:
        writer.add_tensor(stored, np.zeros(shape, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_tiny_file_opens(tmp_path):
    assert GGUFCheckpoint(_tiny(tmp_path / "tiny.gguf")).config == TINY


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"architecture": "llama"}, r"holds a 'llama' model \(general.architecture\), not GPT-2 \('gpt2'\)"),
        (
            {"drop": ["blk.0.ffn_up.bias"]},
            r"has no tensor blk\.0\.ffn_up\.bias \(our transformer\.h\.0\.mlp\.c_fc\.bias\)",
        ),
        (
            {"types": {"blk.0.ffn_down.weight": "Q2_K"}},
            r": tensor blk\.0\.ffn_down\.weight is Q2_K; GGUF types read are F32, F16, BF16, Q8_0, Q4_0, "
            r"Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K",
        ),
        (
            {"add": [("blk.0.attn_q.weight", (256, 256))]},
            "holds tensors GPT-2 does not have: blk.0.attn_q.weight",
        ),
        (
            {"context": 16},
            r": tensor position_embd\.weight has shape \[8, 256\], but the file's gpt2\.\* metadata "
            r"needs \[16, 256\]",
        ),
        ({"context": "8"}, r": gpt2\.context_length is '8'; it must be an integer$"),
        ({"alignment": True}, "general.alignment is True: it must be an integer power of two"),
        ({"alignment": 32.0}, "general.alignment is 32.0: it must be an integer power of two"),
    ],
    ids=[
        "architecture",
        "missing",
        "type",
        "extra",
        "shape",
        "context-text",
        "alignment-bool",
        "alignment-float",
    ],
)
def test_a_file_that_is_not_gpt2_as_read_here_is_refused_naming_it(tmp_path, options, message):
    path = _tiny(tmp_path / "wrong.gguf", **options)
    with pytest.raises(CheckpointError, match=f"{path}.*{message}"):
        GGUFCheckpoint(path)


def _strings_file(path: Path, strings: list[str]) -> Path:
    """A GGUF file of no tensors whose metadata holds `strings` as the array test.strings."""
    return write_gguf(path, {"general.architecture": "gpt2", "test.strings": strings}, [], [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=40))
def test_an_array_of_strings_reads_back_as_written(strings):
    """Any text, empty strings and characters of every width among them, reads back element by element:
    the reader decodes the whole array in one call, each length made a separator byte."""
    with tempfile.TemporaryDirectory() as folder:
        path = _strings_file(Path(folder) / "strings.gguf", strings)
        assert GGUFFile(path).metadata["test.strings"] == strings


@pytest.mark.parametrize("bad", [b"\xffYZ", b"\xc3(Z", b"\xed\xb3\xbf"], ids=["ff", "cut", "surrogate"])
def test_a_string_of_an_array_that_is_not_utf8_is_refused_naming_its_element(tmp_path, bad):
    """Three bytes of the fourth string (index 3) replaced: 0xFF (the separator the reader decodes with),
    a cut two-byte character, an encoded surrogate."""
    path = _strings_file(tmp_path / "bad.gguf", ["a", "", "bc", "XYZ", "d"])
    path.write_bytes(path.read_bytes().replace(b"XYZ", bad))
    with pytest.raises(CheckpointError, match=f"{path}.*element 3 of test.strings is not UTF-8 text"):
        GGUFFile(path)
