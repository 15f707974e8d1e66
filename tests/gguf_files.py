"""GGUF files of our test checkpoints written by the `gguf` package (llama.cpp's own Python writer), as
llama.cpp's `convert_hf_to_gguf.py` writes GPT-2: its tensor names from `gguf`'s name map, Conv1D
weights transposed to `[out, in]`, 1-D tensors F32, quantized blocks from `gguf.quants`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from max_gpt2 import GPT2Config
from max_gpt2.inference.tokenizer import load_tokenizer

gguf = pytest.importorskip("gguf")

CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")


def write_gguf_file(
    checkpoint: Path,
    config: GPT2Config,
    path: Path,
    projections: str,
    embeddings: str = "F32",
    head: bool = False,
) -> Path:
    """`checkpoint` (a save_pretrained directory) as GGUF: projections in ggml type `projections`,
    the embeddings in `embeddings`, `output.weight` (in `projections`) only with `head`; the tokenizer
    beside the checkpoint, if any, in the metadata."""
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(config.mlp_width)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    tokenizer = load_tokenizer(checkpoint)
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        by_id = {id_: token for token, id_ in vocab.items()}
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list([by_id.get(i, f"[PAD{i}]") for i in range(config.vocab_size)])
        special = {id_ for id_, token in tokenizer.get_added_tokens_decoder().items() if token.special}
        kinds = [
            gguf.TokenType.CONTROL
            if i in special
            else gguf.TokenType.NORMAL
            if i in by_id
            else gguf.TokenType.UNUSED
            for i in range(config.vocab_size)
        ]
        writer.add_token_types(kinds)
        writer.add_token_merges((checkpoint / "merges.txt").read_text().splitlines()[1:])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, config.n_layer)
    tensors = load_file(checkpoint / "model.safetensors")
    if head:
        tensors["lm_head.weight"] = tensors["transformer.wte.weight"]
    for key, value in tensors.items():
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        value = value.T if key.endswith(CONV1D) else value
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        kind = (
            "F32"
            if value.ndim == 1
            else embeddings
            if key.endswith(("wte.weight", "wpe.weight"))
            else projections
        )
        writer.add_tensor(name, *encoded(np.ascontiguousarray(value, np.float32), kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def encoded(value: np.ndarray, kind: str) -> tuple[np.ndarray, ...]:
    """`value` as `gguf.GGUFWriter.add_tensor` takes it in ggml type `kind`."""
    if kind == "F32":
        return (value,)
    if kind == "F16":
        return (value.astype(np.float16),)
    quantized = gguf.quants.quantize(value, gguf.GGMLQuantizationType[kind])
    return quantized, None, gguf.GGMLQuantizationType[kind]
