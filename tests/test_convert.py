"""`max-gpt2 convert`: a checkpoint to GGUF, read back by the `gguf` package (llama.cpp's own reader) and
by `generate`."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from max_gpt2 import GPT2Config
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.model.formats import BY_GGML_TYPE, FORMATS
from max_gpt2.outputs import write_atomically
from max_gpt2.testing import write_checkpoint
from tests.gguf_files import gguf
from tests.support import LM, LM_ONE_LAYER, run_python

# GGUF-shaped: every projection's input a whole number of q4_0 and q8_0 blocks, GELU's tanh form.
SMALL = GPT2Config(n_embd=64, n_head=2, n_layer=2, n_positions=16, vocab_size=300, eos_token_id=0)


def run_cli(*args: str):
    return run_python("-m", "max_gpt2", *args)


def _read(path):
    reader = gguf.GGUFReader(path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    return reader, tensors


def _field(reader, key):
    return reader.fields[key].contents()


@pytest.mark.parametrize("weight_format", ["float32", "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_convert_writes_what_llama_cpps_tools_would(tmp_path, weight_format):
    """Read by `gguf`'s reader: llama.cpp's names (its name map) and `gpt2.*` metadata, the projections
    and token_embd (the tied head) in the format's type with the bytes `gguf.quants` makes of the
    checkpoint's weights (`[out, in]`), the rest F32, the tokenizer's tokens by id, its merges,
    `<|endoftext|>` special."""
    checkpoint = write_checkpoint(tmp_path / "small", SMALL, seed=2, layout="save_pretrained", tokenizer=True)
    out = tmp_path / "small.gguf"
    done = run_cli(
        "convert", "--checkpoint", str(checkpoint), "--weight-format", weight_format, "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert f"writing {4 + 12 * SMALL.n_layer} tensors" in done.stderr  # the tied head is token_embd
    reader, tensors = _read(out)
    assert _field(reader, "general.architecture") == "gpt2"
    shapes = {"block_count": 2, "context_length": 16, "embedding_length": 64, "feed_forward_length": 256}
    for key, value in {**shapes, "attention.head_count": 2}.items():
        assert _field(reader, f"gpt2.{key}") == value, key
    assert _field(reader, "tokenizer.ggml.eos_token_id") == 0
    tokenizer = load_tokenizer(checkpoint)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert [tokenizer.token_to_id(token) for token in tokens[: tokenizer.get_vocab_size()]] == list(
        range(tokenizer.get_vocab_size())
    )
    assert _field(reader, "tokenizer.ggml.token_type")[0] == gguf.TokenType.CONTROL  # <|endoftext|>
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, SMALL.n_layer)
    weights = Checkpoint(checkpoint).model_weights()  # MAX layout: [out, in]
    kind = FORMATS[weight_format].ggml_type
    expected_names = set()
    for name, value in weights.items():
        if name == "lm_head.weight":
            continue  # tied: llama.cpp reads token_embd for it, in the format as llama-quantize writes it
        stored = names.get_name(name, try_suffixes=(".weight", ".bias"))
        expected_names.add(stored)
        tensor = tensors[stored]
        projection = (
            name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
            or name == "transformer.wte.weight"
        )
        want = gguf.GGMLQuantizationType[kind if projection else "F32"]
        assert tensor.tensor_type == want, stored
        expected = gguf.quants.quantize(value, want) if want != gguf.GGMLQuantizationType.F32 else value
        np.testing.assert_array_equal(
            np.asarray(tensor.data).reshape(expected.shape), expected, err_msg=stored
        )
    assert set(tensors) == expected_names


def test_convert_refuses_what_gguf_cannot_hold_before_writing(lm_checkpoint, tmp_path):
    out = tmp_path / "x.gguf"
    odd = run_cli(
        "convert", "--checkpoint", str(lm_checkpoint(LM)), "--weight-format", "q4_0", "--out", str(out)
    )
    assert odd.returncode == 2 and "GGUF stores Q4_0 rows as whole blocks of 32 weights" in odd.stderr
    exact_gelu = write_checkpoint(tmp_path / "gelu", LM_ONE_LAYER)
    gelu = run_cli("convert", "--checkpoint", str(exact_gelu), "--weight-format", "q8_0", "--out", str(out))
    assert (
        gelu.returncode == 2
        and "GELU's tanh form (llama.cpp); this checkpoint's activation_function is 'gelu'" in gelu.stderr
    )
    name = run_cli("convert", "--checkpoint", str(exact_gelu), "--out", str(tmp_path / "x.bin"))
    assert name.returncode == 2 and "name it NAME.gguf" in name.stderr
    (tmp_path / "dir.gguf").mkdir()
    folder = run_cli("convert", "--checkpoint", str(exact_gelu), "--out", str(tmp_path / "dir.gguf"))
    assert folder.returncode == 2 and "dir.gguf: a directory; name the file to write in it" in folder.stderr
    assert not out.exists()


def test_a_partial_file_of_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    """A SIGKILL leaves the writer's partial file (no handler runs); the next write of the same file
    removes it once it has lain untouched a while, and leaves a live writer's and a fresh one alone."""
    out = tmp_path / "x.gguf"
    dead = tmp_path / f"x.gguf.{2**22 + 1}.1.partial"  # no process has it: Linux's pids stay under 2**22
    live = tmp_path / f"x.gguf.{os.getpid()}.2.partial"
    fresh = tmp_path / f"x.gguf.{2**22 + 2}.3.partial"  # written just now: another container's, maybe
    for each in (dead, live, fresh):
        each.write_text("half")
    hour_ago = time.time() - 3600
    os.utime(dead, (hour_ago, hour_ago))
    os.utime(live, (hour_ago, hour_ago))
    write_atomically(out, lambda partial: partial.write_text("whole"))
    assert out.read_text() == "whole" and not dead.exists() and live.exists() and fresh.exists()


def test_generate_reads_a_converted_file_as_the_checkpoint(compiled_lm, lm_checkpoint, tmp_path):
    """`generate --checkpoint FILE.gguf`: the text the checkpoint generates, with the tokenizer the file
    carries (no tokenizer file beside it)."""
    lm, path = compiled_lm(LM), lm_checkpoint(LM)
    out = tmp_path / "lm.gguf"
    assert run_cli("convert", "--checkpoint", str(path), "--out", str(out)).returncode == 0
    done = run_cli("generate", "--checkpoint", str(out), "--prompt", "The cat", "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr
    tokenizer = load_tokenizer(path)
    expected = lm.generate(np.array([tokenizer.encode("The cat").ids]), 8)[0]
    assert done.stdout == tokenizer.decode(expected.tolist()) + "\n"


def test_convert_writes_a_llama_quantize_preset(tmp_path):
    """`--weight-format q4_k_m` on 64-wide rows (not whole 256-weight super-blocks): llama-quantize's
    fallbacks (Q4_K -> Q5_0, Q6_K -> Q8_0, the tied embedding Q8_0), each tensor's bytes our quantizer's
    of the checkpoint's weights, `general.file_type` Q4_K_M's; a quantized file is not quantized again."""
    checkpoint = write_checkpoint(tmp_path / "small", SMALL, seed=2, layout="save_pretrained", tokenizer=True)
    out = tmp_path / "small-q4_k_m.gguf"
    done = run_cli("convert", "--checkpoint", str(checkpoint), "--weight-format", "q4_k_m", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "in q4_k_m" in done.stderr
    reader, tensors = _read(out)
    assert _field(reader, "general.file_type") == 15
    weights = Checkpoint(checkpoint).model_weights()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, SMALL.n_layer)
    seen = set()
    for name, value in weights.items():
        if name == "lm_head.weight" or value.ndim == 1:
            continue  # tied; F32
        stored = names.get_name(name, try_suffixes=(".weight", ".bias"))
        kind = tensors[stored].tensor_type.name
        seen.add((stored.split(".")[-2], kind))
        if kind != "F32":
            expected = BY_GGML_TYPE[kind].rows(value)
            np.testing.assert_array_equal(np.asarray(tensors[stored].data).reshape(expected.shape), expected)
    assert {kind for part, kind in seen if part in ("attn_output", "ffn_up")} == {"Q5_0"}
    # of two layers, the last (its last eighth) takes more bits: Q6_K, which falls back to Q8_0
    assert tensors["blk.0.attn_qkv.weight"].tensor_type.name == "Q5_0"
    assert tensors["blk.1.attn_qkv.weight"].tensor_type.name == "Q8_0"
    assert ("token_embd", "Q8_0") in seen and ("position_embd", "F32") in seen
    again = run_cli(
        "convert", "--checkpoint", str(out), "--weight-format", "q6_k", "--out", str(tmp_path / "x.gguf")
    )
    refused = (
        f"{out} is q4_k, q5_0, q6_k, q8_0; it loads as q5_0+q8_0+q4_k+q6_k or as float32 (the values it "
        "stands for), not as q6_k: quantizing it again would add a second error"
    )
    assert again.returncode == 2 and refused in again.stderr
