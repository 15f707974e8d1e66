"""GPT-2 hyperparameters, and reading them from a Hugging Face `config.json`.

`GPT2Config()` is GPT-2 small. `GPT2Config.from_pretrained(path)` reads the
`config.json` that sits in a checkpoint directory or beside a `.safetensors` file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from max_gpt2 import hub

# Hugging Face's GPT2Config accepts these generic names as aliases.
_ALIASES = {
    "hidden_size": "n_embd",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
    "max_position_embeddings": "n_positions",
}

# Hugging Face options that change what attention computes. This component
# implements GPT-2's defaults; a checkpoint that needs another value is refused
# rather than silently computed differently.
_SUPPORTED_ATTENTION_OPTIONS = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
}


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Shapes of a GPT-2 model; the defaults are GPT-2 small (124M)."""

    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12
    n_positions: int = 1024
    vocab_size: int = 50257
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        for field in ("n_embd", "n_head", "n_layer", "n_positions", "vocab_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        epsilon = self.layer_norm_epsilon
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
            raise ValueError(f"layer_norm_epsilon must be a positive number, got {epsilon!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): "
                f"each head takes n_embd / n_head features"
            )

    @property
    def head_dim(self) -> int:
        """Features per head: `n_embd // n_head` (64 for every released GPT-2)."""
        return self.n_embd // self.n_head

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
        Face Hub id (see `max_gpt2.hub`).
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
