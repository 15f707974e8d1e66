"""LoRA adapters merged into a checkpoint's weights as it loads: PEFT's saved adapters, as llama-server's
`--lora` and vLLM's `--lora-modules` serve them, for GPT-2's four projections.

    checkpoint = with_adapters(open_checkpoint("gpt2"), [LoRA("my-adapter"), LoRA("other", 0.5)])
    lm = load_lm(checkpoint, weight_format="q8_0")     # merged, then stored in the format asked for

An adapter is a directory PEFT's `save_pretrained` writes: `adapter_config.json` and
`adapter_model.safetensors` holding, for each adapted projection, `...<module>.lora_A.weight`
`[r, in]` and `...<module>.lora_B.weight` `[out, r]`. A projection's weight (MAX layout `[out, in]`,
Conv1D's transposed) becomes `W + scale * alpha / r * (B @ A)`: PEFT's `merge_and_unload` (Conv1D's
`fan_in_fan_out` delta is the transposed product; `use_rslora`: alpha / sqrt(r)), times llama-server's
per-adapter scale. r is each pair's own (PEFT's `rank_pattern`), alpha `alpha_pattern`'s where one
names the module. Merged once, into the weights cache, keyed by the adapters' bytes and scales.

Refused, naming the file and field or key: another PEFT type, DoRA, trained biases, whole modules
saved beside the adapter, an adapted embedding or head, a pair whose shapes do not fit the
projection, and a checkpoint stored quantized (the merged weights would be quantized a second time).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint, StoredTensors
from max_gpt2.model.checkpoints.stored_weights import SourceTensor, to_float32
from max_gpt2.model.checkpoints.weight_adapters import CheckpointError
from max_gpt2.model.formats import FLOAT32
from max_gpt2.model.parameters import model_parameter_shapes

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PROJECTIONS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # what an adapter may adapt
_KEY = re.compile(r"(?:base_model\.model\.)?(?:transformer\.)?(h\.\d+\.\w+\.\w+)\.lora_([AB])\.weight")


@dataclass(frozen=True)
class LoRA:
    """One adapter to merge: its directory and llama-server's scale (`--lora-scaled`; 1 for `--lora`)."""

    path: Path
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if not math.isfinite(self.scale):
            raise ValueError(f"LoRA {self.path}: the scale must be a finite number; got {self.scale}")


@dataclass(frozen=True)
class Delta:
    """One projection's low-rank update: `A` `[r, in]`, `B` `[out, r]`, and the factor on `B @ A`."""

    a: np.ndarray
    b: np.ndarray
    factor: float

    def dense(self) -> np.ndarray:
        """The update `[out, in]` in float32 (the product in float64)."""
        return (self.factor * (self.b.astype(np.float64) @ self.a.astype(np.float64))).astype(np.float32)


def read_adapter(lora: LoRA, shapes: dict[str, tuple[int, ...]]) -> dict[str, Delta]:
    """`lora`'s updates by our parameter names (`transformer.h.0.attn.c_attn.weight`), each checked
    against `shapes` (MAX layout); a `CheckpointError` naming the file and field or key otherwise."""
    config_file, weights_file = lora.path / CONFIG_FILE, lora.path / WEIGHTS_FILE
    for file in (config_file, weights_file):
        if not file.is_file():
            raise FileNotFoundError(f"LoRA {lora.path}: no {file.name} (a PEFT adapter's save_pretrained)")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    except (ValueError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{config_file}: not a PEFT LoRA config ({error})") from None
    for field, allowed in (("peft_type", ("LORA",)), ("use_dora", (False, None)), ("bias", ("none", None))):
        if config.get(field) not in allowed:
            raise CheckpointError(
                f"{config_file}: {field} is {config.get(field)!r}; only {allowed[0]!r} merges here"
            )
    if config.get("modules_to_save"):
        raise CheckpointError(f"{config_file}: modules_to_save {config['modules_to_save']} (whole modules)")
    patterns = config.get("alpha_pattern") or {}
    tensors = StoredTensors([weights_file])
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key in tensors:
        if not (match := _KEY.fullmatch(key)) or not match[1].endswith(PROJECTIONS):
            raise CheckpointError(
                f"{weights_file}: {key} is no LoRA pair of a projection ({', '.join(PROJECTIONS)}) of GPT-2"
            )
        pairs.setdefault(f"transformer.{match[1]}.weight", {})[match[2]] = tensors[key]
    deltas = {}
    for name, pair in pairs.items():
        if name not in shapes:
            raise CheckpointError(f"{weights_file}: {name} is past the model's layers")
        if set(pair) != {"A", "B"}:
            raise CheckpointError(f"{weights_file}: {name} has lora_{''.join(pair)} but not its partner")
        a, b, (out, width) = pair["A"], pair["B"], shapes[name]
        if a.ndim != 2 or b.ndim != 2 or b.shape != (out, a.shape[0]) or a.shape[1] != width:
            raise CheckpointError(
                f"{weights_file}: {name}'s lora_A is {list(a.shape)} and lora_B {list(b.shape)}; the "
                f"projection is {out} x {width}, so they must be [r, {width}] and [{out}, r]"
            )
        module = name.removesuffix(".weight")
        own = next((v for k, v in patterns.items() if re.match(rf"(.*\.)?({k})$", module)), alpha)
        rank = a.shape[0]
        deltas[name] = Delta(a, b, lora.scale * float(own) / (math.sqrt(rank) if rslora else rank))
    return deltas


class MergedCheckpoint:
    """A checkpoint with LoRA adapters merged into its projections as they are read: the base's config,
    tokenizer and formats; its `tensor(name)` the base's plus each adapter's update (float32).
    `merges` says what was merged, for the weights cache's key beside the files' bytes."""

    maps_as_bound = False  # merged values are made as they load

    def __init__(self, base: OpenedCheckpoint, adapters: list[LoRA]) -> None:
        if any(kind.quantized for kind in base.source_formats):
            stored = ", ".join(sorted(kind.name for kind in base.source_formats))
            raise CheckpointError(
                f"{base.path} is {stored}: a LoRA merges into float weights (quantized ones would be "
                "quantized a second time); give the float checkpoint and --weight-format"
            )
        self.base, self.adapters = base, adapters
        self.path, self.config, self.tied = base.path, base.config, base.tied
        self.weight_format, self.source_formats = base.weight_format, base.source_formats | {FLOAT32}
        self.one_file, self.tokenizer_metadata = base.one_file, base.tokenizer_metadata
        own = [lora.path / name for lora in adapters for name in (CONFIG_FILE, WEIGHTS_FILE)]
        self.files = [*base.files, *own]
        self.merges = tuple(f"lora scale {lora.scale!r}" for lora in adapters)
        shapes = model_parameter_shapes(base.config)
        self.deltas: list[dict[str, Delta]] = [read_adapter(lora, shapes) for lora in adapters]

    def tensor(self, name: str) -> SourceTensor:
        stored = self.base.tensor(name)
        updates = [deltas[name] for deltas in self.deltas if name in deltas]
        if not updates:
            return stored
        merged = to_float32(stored) + sum(update.dense() for update in updates)
        return SourceTensor(FLOAT32, merged, stored.shape, f"{stored.where} with LoRA")


def with_adapters(base: OpenedCheckpoint, adapters: list[LoRA]) -> OpenedCheckpoint | MergedCheckpoint:
    """`base` with `adapters` merged as it loads; `base` itself where there are none."""
    return MergedCheckpoint(base, adapters) if adapters else base
