"""The weights adapter: a Hugging Face GPT-2 state dict to the parameters of our MAX modules.

Pure: it takes tensors already read (a mapping from the checkpoint's own key
names to float32 NumPy arrays, as `max_gpt2.model.checkpoints.checkpoint` hands them out)
and the config, and returns float32 arrays named and laid out as the modules
in `max_gpt2.model` want them. No file is opened here.

- Key prefixes: the Hub's files say `h.0.attn.c_attn.weight`, recent
  `save_pretrained` writes `transformer.h.0.attn.c_attn.weight`; both are read.
  `h.N.attn.bias` and `h.N.attn.masked_bias` are causal-mask buffers, never read.
- Conv1D: Hugging Face GPT-2 keeps its projections in Conv1D modules, whose
  weights are `[in, out]`; MAX `Linear` wants `[out, in]`, so they are transposed.
- The LM head is `lm_head.weight` where one is stored; where none is (the Hub's
  files, and what `save_pretrained` writes for tied weights) it is `wte` itself,
  unless the config says `tie_word_embeddings: false`, which then needs the stored
  head. That is how Hugging Face 5.x loads them.
- Every shape is checked against the config, naming the key and both shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from max_gpt2.model.config import GPT2Config
from max_gpt2.model.parameters import (
    CONV1D_WEIGHTS,
    PARAMETERS,
    model_parameter_shapes,
    parameter_shapes,
    stored_shape,
)

_LAYER_KEY = re.compile(r"(?:transformer\.)?h\.(\d+)\.")
_MASK_BUFFER = re.compile(r"(?:transformer\.)?h\.\d+\.attn\.(?:bias|masked_bias)$")  # older files keep them


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit its config."""


def layers_found(keys: Any) -> int:
    """How many transformer layers hold any tensor among `keys` (not the config's claim)."""
    indices = {int(match.group(1)) for key in keys if (match := _LAYER_KEY.match(key))}
    return max(indices, default=-1) + 1


class WeightAdapter:
    """Turns one state dict (checkpoint key -> float32 array) into MAX-layout parameters.

    `source` names where the tensors came from in error messages (the files).
    Tensors are looked up only when a parameter is asked for, so a lazy mapping
    reads one layer's tensors for `attention_weights` and no more.
    """

    def __init__(self, tensors: Mapping[str, np.ndarray], config: GPT2Config, source: str) -> None:
        self.tensors, self.config, self.source = tensors, config, source
        self.prefix = "transformer." if any(key.startswith("transformer.h.") for key in tensors) else ""

    def key_of(self, name: str) -> str:
        """The checkpoint's name for module parameter `name` (`transformer.wte.weight` -> `wte.weight`)."""
        inner = name.removeprefix("transformer.")
        return name if inner == name else self.prefix + inner

    @property
    def tied(self) -> bool:
        """Whether the LM head is `wte` itself: the config ties them and no head is stored."""
        return self.config.tie_word_embeddings and "lm_head.weight" not in self.tensors

    def unused(self) -> list[str]:
        """The stored tensors no parameter is read from, causal-mask buffers aside: Hugging Face warns of
        them (a layer past the config's `n_layer`, another model's head)."""
        read = {self.key_of(name) for name in model_parameter_shapes(self.config)}
        return sorted(key for key in self.tensors if key not in read and not _MASK_BUFFER.match(key))

    def model_weights(self) -> dict[str, np.ndarray]:
        """Every parameter of `GPT2LMHeadModel`, keyed by module name.

        Where the head is tied, `lm_head.weight` is the very array of `transformer.wte.weight`.
        """
        weights: dict[str, np.ndarray] = {}
        for name, shape in model_parameter_shapes(self.config).items():
            if name == "lm_head.weight" and self.tied:
                weights[name] = weights["transformer.wte.weight"]
            else:
                weights[name] = self.parameter(name, shape)
        return weights

    def attention_weights(self, layer: int) -> dict[str, np.ndarray]:
        """`layer`'s attention parameters, keyed by parameter name (`c_attn.weight`, ...)."""
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise TypeError(f"layer must be an integer, got {layer!r}")
        n_layer = self.config.n_layer
        if not 0 <= layer < n_layer:
            raise IndexError(
                f"layer {layer} is out of range: {self.source} has {n_layer} layers (0 to {n_layer - 1})"
            )
        return {
            parameter: self.parameter(f"transformer.h.{layer}.attn.{parameter}", shape)
            for parameter, shape in parameter_shapes(self.config).items()
        }

    def parameter(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Module parameter `name`, checked against `shape` (MAX layout) and transposed if Conv1D."""
        key = self.key_of(name)
        if key not in self.tensors:
            hint = (
                " and config.json unties it (tie_word_embeddings: false)" if key == "lm_head.weight" else ""
            )
            raise CheckpointError(
                f"tensor {key} is missing from {self.source}{hint} "
                f"(it holds tensors for {layers_found(self.tensors)} layers)"
            )
        tensor = self.tensors[key]
        expected = stored_shape(name, shape)
        if tensor.shape != expected:
            c = self.config
            raise CheckpointError(
                f"{key} in {self.source} has shape {tensor.shape}, but the config "
                f"(n_embd={c.n_embd}, vocab_size={c.vocab_size}, n_positions={c.n_positions}) "
                f"needs {expected}"
            )
        # Conv1D stores [in, out]; Linear wants [out, in]. Square ones too, so go by name.
        return np.ascontiguousarray(tensor.T) if name.endswith(CONV1D_WEIGHTS) else tensor


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
