"""GPT-2 in a GGUF file, as llama.cpp's `convert_hf_to_gguf.py` and `llama-quantize` write it.

llama.cpp's names, each our module's parameter in MAX layout (GGUF's row-major shapes are
`[out, in]`: its converter transposes Hugging Face's Conv1D weights, so nothing is transposed here):

    token_embd.weight       transformer.wte.weight     [V, D]
    position_embd.weight    transformer.wpe.weight     [P, D]
    blk.N.attn_norm.*       transformer.h.N.ln_1.*
    blk.N.attn_qkv.*        transformer.h.N.attn.c_attn.*      weight [3D, D]
    blk.N.attn_output.*     transformer.h.N.attn.c_proj.*      weight [D, D]
    blk.N.ffn_norm.*        transformer.h.N.ln_2.*
    blk.N.ffn_up.*          transformer.h.N.mlp.c_fc.*         weight [F, D]
    blk.N.ffn_down.*        transformer.h.N.mlp.c_proj.*       weight [D, F]
    output_norm.*           transformer.ln_f.*
    output.weight           lm_head.weight             absent: tied to token_embd

The shapes come from the `gpt2.*` metadata (`gpt2.embedding_length`, `gpt2.block_count`,
`gpt2.attention.head_count`, `gpt2.context_length`, `gpt2.feed_forward_length`,
`gpt2.attention.layer_norm_epsilon`), the vocabulary from `token_embd`'s rows. Tensors are read
in F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K
(`formats.BY_GGML_TYPE`); anything else is refused naming the tensor, its type and the
types read. Where the projections, the head and `token_embd` share one of our formats
(`llama-quantize --pure` writes them so), the file loads in it (F16 as float32); a mix of the
kernels' formats, as llama-quantize's presets write (Q4_K_M: Q4_K and Q6_K, Q5_0 and Q8_0 beside
them at GPT-2 xl's width), loads as itself, each tensor in its own (`formats.mixed`); any
other mix loads as the float32 values it stands for. A quantized `token_embd` stays packed in its
type (a float one is packed as the projections are); the position embedding, norms and biases become float32.

The other way, `gguf_tensors` and `gguf_metadata` give what `gguf_writer.write_gguf` writes for a
checkpoint with each tensor in a format: in one of ours (`pure_formats`), as llama.cpp's converter
and `llama-quantize --pure` would, or in a preset's mix (`gguf_mixes`), as `llama-quantize` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from max_gpt2.model.checkpoints.gguf_file import GGUFFile
from max_gpt2.model.checkpoints.gguf_writer import TensorSpec
from max_gpt2.model.checkpoints.stored_weights import SourceTensor, WeightSource, aliases, in_format
from max_gpt2.model.checkpoints.weight_adapters import CheckpointError
from max_gpt2.model.config import ACTIVATIONS, GPT2Config
from max_gpt2.model.formats import BY_GGML_TYPE, FLOAT32, TensorFormat, mixed
from max_gpt2.model.parameters import is_packed, model_parameter_shapes

ARCHITECTURE = "gpt2"
_LAYER_PARTS = {
    "ln_1": "attn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}
_TOP = {
    "transformer.wte": "token_embd",
    "transformer.wpe": "position_embd",
    "transformer.ln_f": "output_norm",
    "lm_head": "output",
}


def gguf_name(name: str) -> str:
    """llama.cpp's name for our parameter `name` (`transformer.h.3.mlp.c_fc.bias` -> `blk.3.ffn_up.bias`)."""
    module, _, kind = name.rpartition(".")
    if module in _TOP:
        return f"{_TOP[module]}.{kind}"
    layer, _, part = module.removeprefix("transformer.h.").partition(".")
    return f"blk.{layer}.{_LAYER_PARTS[part]}.{kind}"


KINDS = {int: "an integer", float: "a number"}  # a metadata value's kind, as an error names it


def config_from_gguf(file: GGUFFile) -> GPT2Config:
    """GPT-2's shapes from a GGUF file's `gpt2.*` metadata and `token_embd`; refuses other models."""
    meta, where = file.metadata, str(file.path)
    architecture = meta.get("general.architecture")
    if architecture != ARCHITECTURE:
        raise CheckpointError(
            f"{where} holds a {architecture!r} model (general.architecture), not GPT-2 ('gpt2')"
        )

    def value(key: str, kind: type, default: Any = None) -> Any:
        found = meta.get(f"gpt2.{key}", default)
        if found is None:
            raise CheckpointError(f"{where} has no gpt2.{key}, which GPT-2's shapes need")
        if kind is float and isinstance(found, (int, float)) and not isinstance(found, bool):
            return float(str(np.float32(found)))  # a float32's shortest decimal: 1e-05, as config.json has it
        if not isinstance(found, kind) or isinstance(found, bool):
            raise CheckpointError(f"{where}: gpt2.{key} is {found!r}; it must be {KINDS[kind]}")
        return found

    if "token_embd.weight" not in file.tensors:
        raise CheckpointError(f"{where} has no token_embd.weight, GPT-2's token embeddings")
    n_embd, n_head = value("embedding_length", int), value("attention.head_count", int)
    n_inner = value("feed_forward_length", int, 4 * n_embd)
    if value("attention.head_count_kv", int, n_head) != n_head:
        raise CheckpointError(
            f"{where}: gpt2.attention.head_count_kv differs from head_count; GPT-2 has none"
        )
    eos = meta.get("tokenizer.ggml.eos_token_id")
    n_layer, n_positions = value("block_count", int), value("context_length", int)
    epsilon = value("attention.layer_norm_epsilon", float)
    try:  # GPT2Config's own checks of the values read (its message is given the file's name)
        return GPT2Config(
            n_embd=n_embd,
            n_head=n_head,
            n_layer=n_layer,
            n_positions=n_positions,
            vocab_size=file.tensors["token_embd.weight"].shape[0],
            layer_norm_epsilon=epsilon,
            n_inner=None if n_inner == 4 * n_embd else n_inner,  # as config.json leaves GPT-2's own
            tie_word_embeddings="output.weight" not in file.tensors,
            eos_token_id=eos if isinstance(eos, int) and not isinstance(eos, bool) else None,
        )
    except ValueError as error:
        raise CheckpointError(f"{where}: {error}") from None


class GGUFCheckpoint:
    """An opened GGUF file of GPT-2: its config, weight format and tensors, every one checked on opening.

    `source_formats` are the types its projections and head are stored in (llama-quantize's presets
    mix them; a tied head is `token_embd`, counted where it is quantized), `weight_format` what it
    loads as when no other is asked for: the one type's own where it is one of ours
    (`TensorFormat.loads_as`: F16 as float32), a mix of the
    kernels' formats as itself, each tensor in its own (`formats.mixed`), any other mix as
    float32 (`stored_weights.choose_format`). `tensor(name)` hands out a parameter as stored in the
    file, not copied (`SourceTensor`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.files = [self.path]
        self.gguf = GGUFFile(self.path)
        self.config = config_from_gguf(self.gguf)
        self.tied = self.config.tie_word_embeddings
        shapes = model_parameter_shapes(self.config)
        if self.tied:
            del shapes["lm_head.weight"]
        self._names = {gguf_name(name): name for name in shapes}
        if unexpected := sorted(set(self.gguf.tensors) - set(self._names)):
            raise CheckpointError(
                f"{self.path} holds tensors GPT-2 does not have: {', '.join(unexpected[:5])}"
            )
        packed: dict[str, TensorFormat] = {}  # the projections', the head's, a quantized token_embd's
        for stored, name in self._names.items():
            info = self.gguf.tensors.get(stored)
            if info is None:
                raise CheckpointError(f"{self.path} has no tensor {stored} (our {name})")
            if info.type not in BY_GGML_TYPE:
                raise CheckpointError(
                    f"{self.path}: tensor {stored} is {info.type}; GGUF types read are "
                    f"{', '.join(BY_GGML_TYPE)}"
                )
            if info.shape != shapes[name]:
                raise CheckpointError(
                    f"{self.path}: tensor {stored} has shape {list(info.shape)}, but the file's gpt2.* "
                    f"metadata needs {list(shapes[name])}"
                )
            kind = BY_GGML_TYPE[info.type]
            if name == "transformer.wte.weight":
                # `token_embd` (and a tied head, which is it) keeps a quantized type of its own, as
                # llama-quantize's presets give it; a float one is packed as the projections are.
                if kind.quantized:
                    packed[name] = kind
                    if self.tied:
                        packed["lm_head.weight"] = kind
            elif is_packed(name):
                packed[name] = kind
        self.source_formats = frozenset(packed.values())
        if len(self.source_formats) == 1:
            self.weight_format = next(iter(self.source_formats)).loads_as
        else:
            self.weight_format = mixed(packed) or FLOAT32

    one_file = True  # its config, tokenizer and weights
    merges = ()  # the weights are the file's alone

    @property
    def tokenizer_metadata(self) -> dict[str, Any]:
        """The file's metadata, where its own tokenizer is (`tokenizer.ggml.*`)."""
        return self.gguf.metadata

    @property
    def maps_as_bound(self) -> bool:
        """Whether every tensor is float32: loaded as float32, bound as it lies in the file."""
        return all(info.type == "F32" for info in self.gguf.tensors.values())

    def tensor(self, name: str) -> SourceTensor:
        """Our parameter `name` as the file stores it, not copied; the tied head is `token_embd`."""
        stored = "token_embd.weight" if name == "lm_head.weight" and self.tied else gguf_name(name)
        info = self.gguf.tensors[stored]
        where = f"{self.path}: tensor {stored} ({info.type})"
        return SourceTensor(BY_GGML_TYPE[info.type], self.gguf.data(stored), info.shape, where)


def pure_formats(config: GPT2Config, tied: bool, weight_format: TensorFormat) -> dict[str, TensorFormat]:
    """The format of each parameter a file in one of our formats stores (`llama-quantize --pure`'s choice),
    by our names: the projections, the head and the token embedding in `weight_format`, the rest F32.
    A tied head is left out: it is `token_embd` (llama.cpp ties a GPT-2 without `output.weight`)."""
    left_out = aliases(tied, weight_format)
    return {
        name: weight_format if is_packed(name) else FLOAT32
        for name in model_parameter_shapes(config)
        if name not in left_out
    }


def gguf_tensors(
    source: WeightSource, formats: dict[str, TensorFormat]
) -> tuple[list[TensorSpec], Iterator[np.ndarray]]:
    """`source`'s parameters as a GGUF file holds them in `formats` (`pure_formats`, or a
    `gguf_mixes.Mix`'s), under llama.cpp's names. The data comes one tensor at a time, as the writer asks."""
    if ACTIVATIONS[source.config.activation_function] != "gelu_tanh":
        raise ValueError(
            f"GGUF's GPT-2 computes GELU's tanh form (llama.cpp); this checkpoint's activation_function "
            f"is {source.config.activation_function!r}"
        )
    shapes = model_parameter_shapes(source.config)
    for kind in dict.fromkeys(formats.values()):
        block = kind.gguf_block[0]
        widths = sorted({shapes[name][-1] for name, chosen in formats.items() if chosen is kind})
        if any(width % block for width in widths):
            raise ValueError(
                f"GGUF stores {kind.ggml_type} rows as whole blocks of {block} weights; this model's "
                f"projections take {', '.join(map(str, widths))} inputs"
            )
    specs = [TensorSpec(gguf_name(name), shapes[name], kind.ggml_type) for name, kind in formats.items()]

    def data() -> Iterator[np.ndarray]:
        for name, kind in formats.items():
            yield in_format(source.tensor(name), kind)

    return specs, data()


def gguf_metadata(config: GPT2Config, file_type: int, quantized: bool, name: str) -> dict[str, Any]:
    """The metadata llama.cpp reads for GPT-2 (`general.*`, `gpt2.*`, the end-of-text token), for a
    file of `general.file_type` `file_type`, with quantized tensors or not."""
    metadata: dict[str, Any] = {
        "general.architecture": ARCHITECTURE,
        "general.name": name,
        "general.file_type": file_type,
        "gpt2.block_count": config.n_layer,
        "gpt2.context_length": config.n_positions,
        "gpt2.embedding_length": config.n_embd,
        "gpt2.feed_forward_length": config.mlp_width,
        "gpt2.attention.head_count": config.n_head,
        "gpt2.attention.layer_norm_epsilon": float(config.layer_norm_epsilon),
    }
    if quantized:
        metadata["general.quantization_version"] = 2  # ggml's block layouts
    if config.stop_token_ids:  # GPT-2's end of text is also where a text begins
        metadata["tokenizer.ggml.bos_token_id"] = metadata["tokenizer.ggml.eos_token_id"] = (
            config.stop_token_ids[0]
        )
    return metadata
