"""GPT-2 hyperparameters, and reading them from a Hugging Face `config.json`.

`GPT2Config()` is GPT-2 small. `GPT2Config.from_pretrained(path)` reads the
`config.json` that sits in a checkpoint directory or beside a `.safetensors` file.
What Hugging Face loads and runs loads here too; options that would make it compute
something this package does not are refused when the config is read, with the
reason, never silently computed differently.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

from max_gpt2.model import hub

# Hugging Face's GPT2Config accepts these generic names as aliases.
_ALIASES = {
    "hidden_size": "n_embd",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
    "max_position_embeddings": "n_positions",
}

# Hugging Face options that change what attention computes. GPT-2's defaults are
# implemented; a checkpoint that needs another value is refused. (`reorder_and_upcast_attn`
# is not here: it changes only rounding, and only in Hugging Face's eager attention.)
_SUPPORTED_ATTENTION_OPTIONS = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}

ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "quick_gelu": "quick_gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "linear": "linear",
}
"""Hugging Face's names for the MLP activations supported, and the function each one is.
GPT-2's own is `gelu_new`, GELU's tanh approximation."""


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Shapes of a GPT-2 model; the defaults are GPT-2 small (124M)."""

    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12
    n_positions: int = 1024
    vocab_size: int = 50257
    layer_norm_epsilon: float = 1e-5
    n_inner: int | None = None  # the MLP's hidden width; None means 4 * n_embd
    activation_function: str = "gelu_new"
    tie_word_embeddings: bool = True  # the LM head reuses wte.weight
    eos_token_id: int | tuple[int, ...] | None = None  # where generation may stop (50256 in GPT-2)

    def __post_init__(self) -> None:
        for field in ("n_embd", "n_head", "n_layer", "n_positions", "vocab_size", "n_inner"):
            value = getattr(self, field)
            if field == "n_inner" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"activation_function {self.activation_function!r} is not supported "
                f"(supported: {', '.join(ACTIVATIONS)})"
            )
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")
        if isinstance(self.eos_token_id, list):  # config.json may hold several, as a list
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        ids = self._eos_ids()
        if not all(isinstance(id_, int) and not isinstance(id_, bool) and id_ >= 0 for id_ in ids):
            raise ValueError(
                f"eos_token_id must be a token id, a list of them, or null; got {self.eos_token_id!r}"
            )
        if outside := [id_ for id_ in ids if id_ >= self.vocab_size]:
            # Hugging Face loads such configs (its GPT2Config defaults to 50256 whatever the vocabulary)
            # and generates with them: an id the model cannot produce never stops generation.
            warnings.warn(
                f"eos_token_id {outside} is not below vocab_size ({self.vocab_size}): the model can "
                f"never produce it, so generation never stops at it",
                stacklevel=3,
            )
        epsilon = self.layer_norm_epsilon
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
            raise ValueError(f"layer_norm_epsilon must be a non-negative number, got {epsilon!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): "
                f"each head takes n_embd / n_head features"
            )

    @property
    def head_dim(self) -> int:
        """Features per head: `n_embd // n_head` (64 for every released GPT-2)."""
        return self.n_embd // self.n_head

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The `eos_token_id`s the model can produce (those below `vocab_size`): where generation stops."""
        return tuple(id_ for id_ in self._eos_ids() if id_ < self.vocab_size)

    def _eos_ids(self) -> tuple:
        """`eos_token_id` as a tuple, whether it holds one id, several or none."""
        eos = self.eos_token_id
        return eos if isinstance(eos, tuple) else () if eos is None else (eos,)

    @property
    def mlp_width(self) -> int:
        """The MLP's hidden width: `n_inner`, or 4 * `n_embd` when unset (every released GPT-2)."""
        return self.n_inner or 4 * self.n_embd

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> GPT2Config:
        """Builds a config from `config.json`-style values, ignoring unrelated keys.

        Missing fields take GPT-2 small's defaults, as in Hugging Face. `source`
        names where the values came from in error messages.
        """
        model_type = values.get("model_type", "gpt2")
        if model_type != "gpt2":
            raise ValueError(f"{source}: model_type is {model_type!r}, expected 'gpt2'")
        for option, supported in _SUPPORTED_ATTENTION_OPTIONS.items():
            if values.get(option, supported) != supported:
                raise ValueError(
                    f"{source}: {option}={values[option]!r} is not supported "
                    f"(this attention implements {option}={supported})"
                )
        names = {field.name for field in dataclasses.fields(cls)}
        known = {_ALIASES.get(key, key): value for key, value in values.items()}
        try:
            return cls(**{key: value for key, value in known.items() if key in names})
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None

    @classmethod
    def from_pretrained(cls, path: str | Path) -> GPT2Config:
        """Reads `config.json` from a checkpoint directory, or beside a checkpoint file.

        `path` may be the directory, a `.safetensors` file, a
        `model.safetensors.index.json`, the `config.json` itself, or a Hugging
        Face Hub id (see `max_gpt2.model.hub`).
        """
        path = hub.resolve(path)
        if path.is_dir():
            config_file = path / "config.json"
        elif path.name.endswith(".json") and not path.name.endswith(".index.json"):
            config_file = path
        else:
            config_file = path.parent / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(
                f"no config.json in {config_file.parent} (needed to read the model's shapes); "
                f"add the checkpoint's config.json there, or pass config=GPT2Config(...)"
            )
        try:
            values = json.loads(config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{config_file} is not valid JSON: {error}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{config_file} must hold a JSON object, not {type(values).__name__}")
        return cls.from_dict(values, source=str(config_file))

    def to_dict(self) -> dict[str, Any]:
        """The fields as `config.json` stores them (plus `model_type`)."""
        return {"model_type": "gpt2", **dataclasses.asdict(self)}
