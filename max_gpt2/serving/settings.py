"""What `max-gpt2 serve` decides for MAX's processes beyond MAX's own options: one object, made once.

MAX's command line has no option an architecture may add, so `max-gpt2 serve` makes one
`ServingSettings` from its own options and hands it to MAX's processes as JSON in one
environment variable (`VARIABLE`). Each process reads it once, with `from_environment`:
the HTTP process for its front end (the names it answers to, the origins it lets call it,
the explorer, where MAX's metrics process serves its metrics), the model worker for its
pipeline (the weight format, the decoding steps, prompt lookup, how embeddings pool). The API
key travels apart, in `API_KEY_VARIABLE` (the variable users set themselves), and never on a
command line, where other users of the machine could read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from max_gpt2.inference.embeddings import Pooling
from max_gpt2.model.checkpoints.lora import LoRA

VARIABLE = "MAX_GPT2_SERVING"
API_KEY_VARIABLE = "MAX_GPT2_API_KEY"
# Greedy tokens a request may get per scheduler step on a CPU (docs/performance.md).
DECODE_STEPS = 16
EMBEDDINGS_BATCH = 16  # texts a server of embeddings runs together, left-padded into one prompt


@dataclass(frozen=True)
class ServingSettings:
    """One served model's settings beyond MAX's options (module docstring).

    `served_names`: every name a request's `model` may give (the first is MAX's);
    `weight_format`: a `max_gpt2.model.formats` name, or a GGUF file's own mix's;
    `decode_steps`: greedy tokens a scheduler step may decode on a CPU; `prompt_lookup`:
    tokens a request may draft (0: none); `allowed_origins`: origins a browser page may
    call the API from (CORS; `*` any, none: CORS off); `explorer`: the head explorer's
    settings as its JSON (`max_gpt2.explorer.loading.ExplorerSettings`), or None;
    `metrics_socket`: the Unix socket MAX's metrics process serves Prometheus text on, or None;
    `pooling`: how a server of embeddings pools each text (`max_gpt2.inference.embeddings.Pooling`),
    None for one that generates; `lora`: the LoRA adapters merged into the weights, each its path
    and scale (`max_gpt2.model.checkpoints.lora`).
    """

    served_names: tuple[str, ...] = ("gpt2",)
    weight_format: str = "float32"
    decode_steps: int = DECODE_STEPS
    prompt_lookup: int = 0
    allowed_origins: tuple[str, ...] = ()
    explorer: str | None = None
    metrics_socket: str | None = None
    pooling: Pooling | None = None
    lora: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.served_names or not all(isinstance(name, str) and name for name in self.served_names):
            raise ValueError(f"served_names: one or more non-empty names; got {list(self.served_names)}")
        if not (isinstance(self.decode_steps, int) and self.decode_steps >= 1):
            raise ValueError(
                f"decode_steps: steps a scheduler step may decode, 1 or more; got {self.decode_steps!r}"
            )
        if not (isinstance(self.prompt_lookup, int) and self.prompt_lookup >= 0):
            raise ValueError(
                f"prompt_lookup: tokens a request may draft, 0 (none) or more; got {self.prompt_lookup!r}"
            )
        if not (self.pooling is None or isinstance(self.pooling, Pooling)):
            raise ValueError(f"pooling: one of {[p.value for p in Pooling]} or None; got {self.pooling!r}")

    @property
    def embeds(self) -> bool:
        """Whether this server serves embeddings (and generates nothing)."""
        return self.pooling is not None

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "pooling": self.pooling and self.pooling.value})

    @classmethod
    def from_json(cls, text: str) -> ServingSettings:
        """The settings `to_json` wrote; a ValueError names `VARIABLE` and what is wrong."""
        try:
            values: dict[str, Any] = json.loads(text)
            known = {field.name for field in fields(cls)}
            if unknown := sorted(set(values) - known):
                raise ValueError(f"unknown settings {unknown}")
            for name in ("served_names", "allowed_origins"):
                if name in values:
                    values[name] = tuple(values[name])
            values["lora"] = tuple((str(path), float(scale)) for path, scale in values.get("lora", ()))
            if values.get("pooling") is not None:
                values["pooling"] = Pooling(values["pooling"])
            return cls(**values)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{VARIABLE}: {error} (max-gpt2 serve writes this variable)") from None

    @classmethod
    def from_environment(cls) -> ServingSettings:
        """The settings `max-gpt2 serve` handed this process, or the defaults where it handed none
        (plain `max serve --custom-architectures max_gpt2.serving`)."""
        text = os.environ.get(VARIABLE)
        return cls.from_json(text) if text else cls()

    def adapters(self) -> list[LoRA]:
        """The LoRA adapters merged into the served weights."""
        return [LoRA(Path(path), scale) for path, scale in self.lora]

    def environment(self) -> dict[str, str]:
        """The variable that hands these settings to MAX's processes."""
        return {VARIABLE: self.to_json()}


def check_request(dtype: str, explorer: bool, api_key: bool) -> None:
    """Refuses what no server runs, whatever the checkpoint: a compute dtype other than float32 and
    bfloat16, the head explorer beside an API key (its page cannot send one)."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype {dtype}: the server runs float32 or bfloat16")
    if explorer and api_key:
        raise ValueError(
            "--explorer: the explorer's page cannot send an API key, so it is not served beside one "
            f"(--api-key or {API_KEY_VARIABLE}); run max-gpt2 explore on its own port instead"
        )


def check_device(settings: ServingSettings, dtype: str, on_cpu: bool, where: str) -> None:
    """Refuses what the device (`where`, `on_cpu`) cannot serve: MAX serves float32 on a CPU, and drafts
    are checked by the decoding kernels, which run on the CPU in float32."""
    if on_cpu and dtype != "float32":
        raise ValueError(f"--dtype {dtype}: MAX serves float32 on CPU; bfloat16 needs a GPU")
    if settings.prompt_lookup and not (on_cpu and dtype == "float32"):
        raise ValueError(
            f"--prompt-lookup {settings.prompt_lookup}: drafts are checked by the decoding kernels, "
            f"which run on the CPU in float32, not on {where} in {dtype}"
        )


def check_tokenizer(source: object, vocab_size: int, tokens: int | None) -> None:
    """Refuses a checkpoint (`source`) without a tokenizer (`tokens`: its size, None where there is none)
    or with one smaller than the model's vocabulary: a server takes and returns text, and MAX's stops
    when a request generates an id it cannot decode."""
    if tokens is None:
        raise ValueError(
            f"{source} has no tokenizer (tokenizer.json, or vocab.json and merges.txt, or a GGUF file's "
            "own); a server takes and returns text"
        )
    if vocab_size > tokens:
        raise ValueError(
            f"{source}: the model's vocab_size={vocab_size} is more than its tokenizer's {tokens} tokens; "
            f"MAX's server stops when a request generates an id it cannot decode "
            f"({tokens} to {vocab_size - 1})"
        )
