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
    writer = gpt2_writer(path, config)
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


# Where each of llama.cpp's other types keeps its float16 scales (d, and m or dmin), by byte in a block.
HALVES = {"Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(kind: str, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """`rows` rows of `columns` weights in ggml type `kind` as blocks of random bytes, uint8 [rows, row
    bytes], with small finite float16 scales where `HALVES` knows them: blocks `gguf.quants` cannot
    make (it reads K-quants)."""
    weights, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = rng.integers(0, 256, (rows * columns // weights, size), dtype=np.uint8)
    for at in HALVES.get(kind, ()):
        scales = (rng.standard_normal(len(blocks)) / 64).astype(np.float16)
        blocks[:, at : at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _plausible(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values of a GPT-2 parameter's usual size: layer norms' weights near 1, biases small, a
    matrix scaled by its inputs' count so activations keep their spread."""
    if len(shape) == 2:
        return (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    center = 1.0 if name.endswith("ln_1.weight") or name.endswith(("ln_2.weight", "ln_f.weight")) else 0.0
    return (center + 0.1 * rng.standard_normal(shape)).astype(np.float32)


def write_typed_file(
    path: Path,
    config: GPT2Config,
    types: dict[str, str],
    rng: np.random.Generator,
    values: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """A GGUF of `config`'s shapes, its head tied, each 2-D tensor in the ggml type `types` gives for its
    llama.cpp name (F32 where none), 1-D tensors F32; random values (types `gguf` quantizes to: random
    weights quantized; K-quants: `random_blocks`). Returns the float32 values each of our parameters
    stands for, read back by `gguf.quants.dequantize`. `values` (by our parameter names) are written
    as they are instead, F32."""
    given = values
    from max_gpt2.model.checkpoints.gguf_checkpoint import gguf_name
    from max_gpt2.model.parameters import model_parameter_shapes

    writer = gpt2_writer(path, config)
    shapes, values = model_parameter_shapes(config), {}
    for name, shape in shapes.items():
        if name == "lm_head.weight":
            continue
        stored = gguf_name(name)
        kind = types.get(stored, "F32")
        if given is not None:
            data = given[name]
            writer.add_tensor(stored, data)
        elif kind.endswith("_K"):  # gguf reads K-quants but cannot make them
            data = random_blocks(kind, *shape, rng)
            writer.add_tensor(stored, data, raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            data, *raw = encoded(_plausible(name, shape, rng), kind)
            writer.add_tensor(stored, data, *raw)
        read = (
            data
            if given is not None or kind == "F32"
            else gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind])
        )
        values[name] = np.asarray(read, np.float32).reshape(shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    values["lm_head.weight"] = values["transformer.wte.weight"]
    return values


def gpt2_writer(path: Path, config: GPT2Config) -> gguf.GGUFWriter:
    """A GGUF writer for a GPT-2 of `config`'s shapes, its hyperparameters written."""
    writer = gguf.GGUFWriter(path, "gpt2")
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(config.mlp_width)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    return writer
