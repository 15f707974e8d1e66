"""Deterministic GPT-2 checkpoints in Hugging Face's layout, for tests, the demo and benchmarks.

`write_checkpoint` writes the full GPT-2 key set (embeddings, every layer's
layer norms, attention and MLP, the final layer norm) with seeded random values,
in the Conv1D `[in, out]` layout Hugging Face uses, plus `config.json`. Nothing
here is committed to git; the same seed always gives the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import safetensors
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from max_gpt2.inference.devices import parse_dtype
from max_gpt2.inference.tokenizer import END_OF_TEXT
from max_gpt2.model.checkpoints.checkpoint import INDEX_FILE
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats.dtypes import float32_to_bfloat16_bits
from max_gpt2.model.parameters import model_parameter_shapes, parameter_shapes, stored_shape
from max_gpt2.outputs import write_atomically

LAYOUTS = {"hub": "", "save_pretrained": "transformer."}
"""Key prefix of each layout: `h.0.attn...` on the Hub, `transformer.h.0.attn...` from `save_pretrained`."""


def checkpoint_shapes(config: GPT2Config, mask_buffers: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Hugging Face GPT-2 checkpoint (Hub key names), with its stored shape.

    A tied LM head is not stored (`save_pretrained` leaves it out too); an untied one is.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in model_parameter_shapes(config).items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        key = name.removeprefix("transformer.")
        shapes[key] = stored_shape(name, shape)
        if mask_buffers and key.endswith(".mlp.c_proj.bias"):  # the layer's last parameter
            layer = key.removesuffix("mlp.c_proj.bias")
            positions = config.n_positions
            shapes |= {layer + "attn.bias": (1, 1, positions, positions), layer + "attn.masked_bias": ()}
    return shapes


def _value(key: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A plausible float32 value for `key`."""
    if key.endswith(".attn.bias"):  # the causal-mask buffer (not c_attn.bias): lower-triangular ones
        return np.tril(np.ones(shape, dtype=np.float32))
    if key.endswith(".attn.masked_bias"):
        return np.full(shape, -1e4, dtype=np.float32)
    if key.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        offset, scale = 1.0, 0.1
    elif len(shape) == 2 and key.startswith("h."):
        # Scaled by fan-in so attention scores have unit spread: softmax is neither
        # uniform nor one-hot, and mistakes in masking or head order show up.
        offset, scale = 0.0, 1 / np.sqrt(shape[0])
    else:
        offset, scale = 0.0, 0.02 if key in ("wte.weight", "wpe.weight", "lm_head.weight") else 0.1
    # Computed in float64 and rounded once, so every stored dtype is one rounding away.
    return (offset + scale * rng.standard_normal(shape)).astype(np.float32)


def random_attention_weights(config: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded attention weights in MAX `Linear` layout, drawn as `write_checkpoint` draws a layer's."""
    rng = np.random.default_rng(seed)
    return {
        name: np.ascontiguousarray(_value(f"h.0.attn.{name}", shape[::-1], rng).T)
        for name, shape in parameter_shapes(config).items()
    }


def _write_safetensors(tensors: dict[str, np.ndarray], dtype: str, file: Path) -> None:
    """Writes `tensors` (float32) as `dtype` to `file`, atomically."""
    stored = {
        key: float32_to_bfloat16_bits(value) if dtype == "bfloat16" else value.astype(dtype, copy=False)
        for key, value in tensors.items()
    }
    specs = {
        key: safetensors.TensorSpec(
            dtype=dtype, shape=list(value.shape), data_ptr=value.ctypes.data, data_len=value.nbytes
        )
        for key, value in stored.items()
    }
    write_atomically(
        file, lambda partial: safetensors.serialize_file(specs, str(partial), metadata={"format": "pt"})
    )


def _write_json(values: dict, file: Path) -> None:
    """Writes `values` as JSON to `file`, atomically."""
    write_atomically(file, lambda partial: partial.write_text(json.dumps(values, indent=2)))


def write_checkpoint(
    path: str | Path,
    config: GPT2Config,
    seed: int = 0,
    layout: str = "hub",
    dtype: str = "float32",
    mask_buffers: bool = True,
    shards: int = 1,
    tokenizer: bool = False,
) -> Path:
    """Writes a seeded GPT-2 checkpoint into directory `path`, returning it.

    `layout` is `"hub"` (`h.0.attn.c_attn.weight`) or `"save_pretrained"`
    (`transformer.h.0...`); `dtype` is `"float32"`, `"float16"` or `"bfloat16"`;
    `mask_buffers` adds the `attn.bias` / `attn.masked_bias` buffers that older
    files carry; `shards > 1` splits the tensors over several files with a
    `model.safetensors.index.json`, as large checkpoints are published;
    `tokenizer` adds a byte-level BPE tokenizer trained on the text we ship
    (`write_tokenizer`), so that text goes in and out offline.
    Each file is written under a temporary name and renamed into place, and
    `config.json` comes last, so a directory with a `config.json` is complete.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    parse_dtype(dtype)
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be a positive integer, got {shards!r}")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").unlink(missing_ok=True)  # incomplete until it is written again
    rng = np.random.default_rng(seed)
    tensors = {
        # The LM head sits beside `transformer`, not inside it, in both layouts.
        (key if key == "lm_head.weight" else LAYOUTS[layout] + key): _value(key, shape, rng)
        for key, shape in checkpoint_shapes(config, mask_buffers).items()
    }
    if shards == 1:
        _write_safetensors(tensors, dtype, directory / "model.safetensors")
    else:
        keys = list(tensors)
        weight_map = {}
        for index, part in enumerate(np.array_split(np.arange(len(keys)), shards), start=1):
            name = f"model-{index:05d}-of-{shards:05d}.safetensors"
            _write_safetensors({keys[i]: tensors[keys[i]] for i in part}, dtype, directory / name)
            weight_map |= {keys[i]: name for i in part}
        _write_json({"metadata": {}, "weight_map": weight_map}, directory / INDEX_FILE)
    if tokenizer:
        write_tokenizer(directory, config.vocab_size)
    # `architectures` is how serving engines (MAX, vLLM) pick the model class, as in save_pretrained.
    _write_json({"architectures": ["GPT2LMHeadModel"], **config.to_dict()}, directory / "config.json")
    return directory


CORPUS = Path(__file__).parent / "data" / "corpus.txt"
"""A few paragraphs of plain English, numbers and code, written for this project."""


def write_tokenizer(directory: str | Path, vocab_size: int, lines: Iterable[str] | None = None) -> Tokenizer:
    """Trains a byte-level BPE tokenizer of at most `vocab_size` tokens on `CORPUS`; writes and returns it.

    Writes `tokenizer.json` and GPT-2's original pair, `vocab.json` and
    `merges.txt`, into `directory`. Every byte is a token, so any text encodes;
    `<|endoftext|>` is token 0. `lines` trains it on other text instead. Training
    is deterministic: the same `vocab_size` and text give the same files.
    """
    if vocab_size < 257:
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= 257 (256 bytes + {END_OF_TEXT})")
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True) if lines is None else lines
    trained.train_from_iterator(lines, trainer)
    directory = Path(directory)
    write_atomically(directory / "tokenizer.json", lambda partial: trained.save(str(partial)))
    for written in trained.model.save(str(directory), "partial"):  # partial-vocab.json, partial-merges.txt
        os.replace(written, directory / Path(written).name.removeprefix("partial-"))
    return trained
