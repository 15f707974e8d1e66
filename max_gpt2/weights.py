"""The weights adapter: a Hugging Face GPT-2 safetensors checkpoint to MAX parameters.

`Checkpoint.model_weights()` gives every parameter of `max_gpt2.model.GPT2LMHeadModel`
and `Checkpoint.attention_weights(layer)` one layer's attention, both as float32
NumPy arrays in the layout MAX modules use.

Hugging Face GPT-2 keeps its projections in Conv1D modules, whose weights are
`[in_features, out_features]`; MAX `Linear` wants `[out_features, in_features]`,
so those weights are transposed here. Checkpoints come in two key layouts: the Hub's
files say `h.0.attn.c_attn.weight`, while recent `save_pretrained` writes
`transformer.h.0.attn.c_attn.weight`. Both are read. `h.N.attn.bias` and
`h.N.attn.masked_bias` are causal-mask buffers, not parameters, and are never read.
The LM head is `lm_head.weight` where the files store one; where they do not (the
Hub's GPT-2 files, and what `save_pretrained` writes for tied weights), it is `wte`
itself, unless `config.json` says `tie_word_embeddings: false`, which then needs the
stored head. That is how Hugging Face 5.x loads them.

Files are checked with the `safetensors` library when opened (it verifies that
the header is sane and that the tensors lie inside the file), then read through
MAX's reader (`max.graph.weights.SafetensorWeights`), which handles bfloat16 and
would otherwise trust a truncated file's header and read past its end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
from max.dtype import DType
from max.graph.weights import SafetensorWeights

from max_gpt2 import hub
from max_gpt2.config import GPT2Config
from max_gpt2.dtypes import bfloat16_bits_to_float32

PARAMETERS = ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
"""Parameters stored by Hugging Face as Conv1D `[in, out]`, transposed on reading."""
INDEX_FILE = "model.safetensors.index.json"
_LAYER_KEY = re.compile(r"(?:transformer\.)?h\.(\d+)\.")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit its config."""


def parameter_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Shapes of the attention parameters in MAX `Linear` layout, by parameter name."""
    d = config.n_embd
    return {
        "c_attn.weight": (3 * d, d),
        "c_attn.bias": (3 * d,),
        "c_proj.weight": (d, d),
        "c_proj.bias": (d,),
    }


def model_parameter_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every parameter of `GPT2LMHeadModel`, in MAX layout, by its module name."""
    d, inner, vocab = config.n_embd, config.mlp_width, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (vocab, d),
        "transformer.wpe.weight": (config.n_positions, d),
    }
    for layer in range(config.n_layer):
        h = f"transformer.h.{layer}."
        shapes |= {h + "ln_1.weight": (d,), h + "ln_1.bias": (d,)}
        shapes |= {h + "attn." + name: shape for name, shape in parameter_shapes(config).items()}
        shapes |= {
            h + "ln_2.weight": (d,),
            h + "ln_2.bias": (d,),
            h + "mlp.c_fc.weight": (inner, d),
            h + "mlp.c_fc.bias": (inner,),
            h + "mlp.c_proj.weight": (d, inner),
            h + "mlp.c_proj.bias": (d,),
        }
    return shapes | {
        "transformer.ln_f.weight": (d,),
        "transformer.ln_f.bias": (d,),
        "lm_head.weight": (vocab, d),
    }


def stored_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a checkpoint stores parameter `name` in: Conv1D weights are `[in, out]`."""
    return shape[::-1] if name.endswith(CONV1D_WEIGHTS) else shape


def _conversion_hint(pickle_file: Path) -> str:
    target = pickle_file.with_name("model.safetensors")
    return (
        f"{pickle_file} is a pickle, which can run arbitrary code when loaded, so it is "
        f"not read here; convert it to safetensors once, for example with PyTorch:\n"
        f'  python -c "import torch; from safetensors.torch import save_file; '
        f"save_file({{k: v.contiguous() for k, v in torch.load('{pickle_file}', "
        f"weights_only=True).items()}}, '{target}')\""
    )


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of the checkpoint at `path` (a file, a directory, or an index)."""
    if path.is_dir():
        for candidate in (path / "model.safetensors", path / INDEX_FILE):
            if candidate.is_file():
                return checkpoint_files(candidate)
        found = sorted(path.glob("*.safetensors"))
        if len(found) == 1:
            return found
        if found:
            names = ", ".join(file.name for file in found)
            raise CheckpointError(f"{path} holds several safetensors files ({names}) but no {INDEX_FILE}")
        pickles = sorted(file for file in path.iterdir() if file.suffix in _PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointError(f"{path} has no safetensors checkpoint. {_conversion_hint(pickles[0])}")
        raise FileNotFoundError(f"no model.safetensors or {INDEX_FILE} in {path}")
    if path.suffix in _PICKLE_SUFFIXES:
        raise CheckpointError(_conversion_hint(path))
    if path.name.endswith(".index.json"):
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
            shard_names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointError(
                f"{path} is not a safetensors index (no valid weight_map): {error!r}"
            ) from None
        shards = [path.parent / name for name in shard_names]
        missing = [str(shard) for shard in shards if not shard.is_file()]
        if missing:
            raise FileNotFoundError(f"{path} names shards that do not exist: {', '.join(missing)}")
        return shards
    return [path]


def _keys_of(file: Path) -> list[str]:
    """The tensor names in `file`, after the safetensors library has validated it."""
    try:
        with safetensors.safe_open(str(file), framework="numpy") as handle:
            return list(handle.keys())
    except (safetensors.SafetensorError, OSError) as error:
        size = file.stat().st_size
        raise CheckpointError(f"{file} ({size} bytes) is not a valid safetensors file: {error}") from None


class Checkpoint:
    """An opened GPT-2 safetensors checkpoint, ready to hand out each layer's attention weights.

    Opening checks every file and reads the config (from `config.json` unless
    `config` is given); tensors are read only when a layer is asked for.
    """

    def __init__(self, path: str | Path, config: GPT2Config | None = None) -> None:
        self.path = hub.resolve(path)
        self.files = checkpoint_files(self.path)
        self._file_of = {key: file for file in self.files for key in _keys_of(file)}
        self.config = config if config is not None else GPT2Config.from_pretrained(self.path)
        self.prefix = "transformer." if any(key.startswith("transformer.h.") for key in self._file_of) else ""
        self._reader = SafetensorWeights(self.files)

    @property
    def layers_found(self) -> int:
        """How many transformer layers hold any tensor in the files (not the config's claim)."""
        indices = {int(match.group(1)) for key in self._file_of if (match := _LAYER_KEY.match(key))}
        return max(indices, default=-1) + 1

    def key(self, layer: int, parameter: str) -> str:
        """The checkpoint's name for attention `parameter` of `layer`, e.g. `h.3.attn.c_proj.bias`."""
        return self.key_of(f"transformer.h.{layer}.attn.{parameter}")

    def key_of(self, name: str) -> str:
        """The checkpoint's name for module parameter `name` (`transformer.wte.weight` -> `wte.weight`)."""
        inner = name.removeprefix("transformer.")
        return name if inner == name else self.prefix + inner

    def model_weights(self) -> dict[str, np.ndarray]:
        """Every parameter of `GPT2LMHeadModel`, float32, MAX layout, keyed by module name.

        Where the head is tied (no `lm_head.weight` stored, GPT-2's usual case),
        `lm_head.weight` is the very array of `transformer.wte.weight`.
        """
        weights: dict[str, np.ndarray] = {}
        for name, shape in model_parameter_shapes(self.config).items():
            tied = self.config.tie_word_embeddings and name not in self._file_of
            if name == "lm_head.weight" and tied:
                weights[name] = weights["transformer.wte.weight"]
            else:
                weights[name] = self._parameter(name, shape)
        return weights

    def attention_weights(self, layer: int) -> dict[str, np.ndarray]:
        """`layer`'s attention parameters, float32, in MAX `Linear` layout, keyed by parameter name."""
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise TypeError(f"layer must be an integer, got {layer!r}")
        n_layer = self.config.n_layer
        if not 0 <= layer < n_layer:
            raise IndexError(
                f"layer {layer} is out of range: {self.path} has {n_layer} layers (0 to {n_layer - 1})"
            )
        return {
            parameter: self._parameter(f"transformer.h.{layer}.attn.{parameter}", shape)
            for parameter, shape in parameter_shapes(self.config).items()
        }

    def _parameter(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Module parameter `name`, read, checked against `shape` (MAX layout) and transposed if Conv1D."""
        key = self.key_of(name)
        tensor = self._read(key)
        expected = stored_shape(name, shape)
        if tensor.shape != expected:
            c = self.config
            raise CheckpointError(
                f"{key} in {self._file_of[key]} has shape {tensor.shape}, but the config "
                f"(n_embd={c.n_embd}, vocab_size={c.vocab_size}, n_positions={c.n_positions}) "
                f"needs {expected}"
            )
        # Conv1D stores [in, out]; Linear wants [out, in]. Square ones too, so go by name.
        return np.ascontiguousarray(tensor.T) if name.endswith(CONV1D_WEIGHTS) else tensor

    def _read(self, key: str) -> np.ndarray:
        """One tensor as float32 (exact for float16 and bfloat16 sources)."""
        if key not in self._file_of:
            files = ", ".join(str(file) for file in self.files)
            hint = (
                " and config.json unties it (tie_word_embeddings: false)" if key == "lm_head.weight" else ""
            )
            raise CheckpointError(
                f"tensor {key} is missing from {files}{hint} "
                f"(it holds tensors for {self.layers_found} layers)"
            )
        buffer = self._reader[key].data().to_buffer()
        if buffer.dtype == DType.bfloat16:
            return bfloat16_bits_to_float32(np.from_dlpack(buffer.view(DType.uint16)))
        if buffer.dtype in (DType.float32, DType.float16):
            return np.from_dlpack(buffer).astype(np.float32)
        raise CheckpointError(
            f"tensor {key} in {self._file_of[key]} has dtype {buffer.dtype.name}; "
            f"expected float32, float16 or bfloat16"
        )


def load_attention_weights(
    checkpoint: str | Path, layer: int, config: GPT2Config | None = None
) -> dict[str, np.ndarray]:
    """Reads `layer`'s attention weights from a GPT-2 safetensors checkpoint.

    `checkpoint` is a `.safetensors` file, a directory holding `model.safetensors`
    (or a sharded `model.safetensors.index.json`), the index itself, or a Hub id.
    The config comes from the `config.json` beside it unless `config` is given.
    Returns float32 arrays keyed `c_attn.weight` `[3D, D]`, `c_attn.bias` `[3D]`,
    `c_proj.weight` `[D, D]`, `c_proj.bias` `[D]`.
    """
    return Checkpoint(checkpoint, config).attention_weights(layer)


def check_weights(weights: Mapping[str, np.ndarray], config: GPT2Config) -> dict[str, np.ndarray]:
    """Checks that `weights` holds exactly the attention parameters with the config's shapes.

    Returns them as float32 NumPy arrays.
    """
    unknown = sorted(set(weights) - set(PARAMETERS))
    missing = [name for name in PARAMETERS if name not in weights]
    if unknown or missing:
        raise ValueError(
            f"weights must hold exactly {list(PARAMETERS)}; missing {missing}, unexpected {unknown}"
        )
    checked = {}
    for name, shape in parameter_shapes(config).items():
        array = np.asarray(weights[name])
        if array.shape != shape:
            raise ValueError(
                f"weight {name!r} has shape {array.shape}, but the config "
                f"(n_embd={config.n_embd}) needs {shape} (MAX Linear layout, [out, in])"
            )
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"weight {name!r} has dtype {array.dtype}; expected a float dtype")
        checked[name] = array.astype(np.float32, copy=False)
    return checked


def check_model_weights(weights: Mapping[str, Any], config: GPT2Config) -> dict[str, np.ndarray]:
    """Checks that `weights` holds exactly `GPT2LMHeadModel`'s parameters with the config's shapes.

    Shapes are in MAX layout (what `Checkpoint.model_weights` returns); the arrays are returned as given.
    """
    shapes = model_parameter_shapes(config)
    unknown, missing = sorted(set(weights) - set(shapes)), [name for name in shapes if name not in weights]
    if unknown or missing:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unknown[:5]}")
    checked = {}
    for name, shape in shapes.items():
        array = weights[name]
        if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"weight {name!r} must be a floating-point NumPy array")
        if array.shape != shape:
            raise ValueError(f"weight {name!r} has shape {array.shape}, but the config needs {shape}")
        checked[name] = array
    return checked
