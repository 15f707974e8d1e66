"""LoRA adapters merged into a checkpoint's weights as it loads: PEFT's saved adapters, as vLLM's
`--lora-modules` serves them, and llama.cpp's GGUF adapters, as llama-server's `--lora` does, for
GPT-2's four projections.

    checkpoint = with_adapters(open_checkpoint("gpt2"), [LoRA("my-adapter"), LoRA("other", 0.5)])
    lm = load_lm(checkpoint, weight_format="q8_0")     # merged, then stored in the format asked for

An adapter is a directory PEFT's `save_pretrained` writes: `adapter_config.json` and
`adapter_model.safetensors` holding, for each adapted projection, `...<module>.lora_A.weight`
`[r, in]` and `...<module>.lora_B.weight` `[out, r]`. A projection's weight (MAX layout `[out, in]`,
Conv1D's transposed) becomes `W + scale * alpha / r * (B @ A)`: PEFT's `merge_and_unload` (Conv1D's
`fan_in_fan_out` delta is the transposed product; `use_rslora`: alpha / sqrt(r)), times llama-server's
per-adapter scale. r is each pair's own (PEFT's `rank_pattern`), alpha `alpha_pattern`'s where one
names the module. A GGUF adapter (`convert_lora_to_gguf.py`'s: `general.type` "adapter",
`adapter.lora.alpha`, `blk.0.attn_qkv.weight.lora_a` `[r, in]` and `.lora_b` `[out, r]`, in any type
read here) adds `scale * alpha / r * (B @ A)`, or `scale * (B @ A)` where alpha is 0, as llama.cpp
does. Merged once, into the weights cache, keyed by the adapters' bytes and scales.

Refused, naming the file and field or key: another PEFT type, DoRA, trained biases, whole modules
saved beside the adapter, an adapted embedding or head, a pair whose shapes do not fit the
projection, and a checkpoint stored quantized (the merged weights would be quantized a second time).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint, StoredTensors
from max_gpt2.model.checkpoints.gguf_checkpoint import ARCHITECTURE, gguf_name
from max_gpt2.model.checkpoints.gguf_file import GGUFFile
from max_gpt2.model.checkpoints.stored_weights import SourceTensor, to_float32
from max_gpt2.model.checkpoints.weight_adapters import CheckpointError
from max_gpt2.model.formats import BY_GGML_TYPE, FLOAT32
from max_gpt2.model.parameters import model_parameter_shapes

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PROJECTIONS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # what an adapter may adapt
_KEY = re.compile(r"(?:base_model\.model\.)?(?:transformer\.)?(h\.\d+\.\w+\.\w+)\.lora_([AB])\.weight")


@dataclass(frozen=True)
class LoRA:
    """One adapter to merge: its path (a PEFT directory or a GGUF file) and llama-server's scale
    (`--lora-scaled`; 1 for `--lora`)."""

    path: Path
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if not math.isfinite(self.scale):
            raise ValueError(f"LoRA {self.path}: the scale must be a finite number; got {self.scale}")

    @property
    def files(self) -> list[Path]:
        """What the adapter is read from: a GGUF file, or a PEFT directory's two files."""
        return (
            [self.path]
            if self.path.suffix == ".gguf"
            else [self.path / CONFIG_FILE, self.path / WEIGHTS_FILE]
        )


@dataclass(frozen=True)
class Matrix:
    """One of a pair as the adapter stores it: its shape, checked on opening, and its float32 values,
    read when a merge first needs them (a load whose merged weights are cached reads none)."""

    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]


@dataclass(frozen=True)
class Delta:
    """One projection's low-rank update: `A` `[r, in]`, `B` `[out, r]`, and the factor on `B @ A`."""

    a: Matrix
    b: Matrix
    factor: float

    def dense(self) -> np.ndarray:
        """The update `[out, in]` in float32 (the product in float64)."""
        product = self.b.read().astype(np.float64) @ self.a.read().astype(np.float64)
        return (self.factor * product).astype(np.float32)


Pairs = dict[str, dict[str, Matrix]]  # our parameter name -> {"A": [r, in], "B": [out, r]}
Factor = Callable[[str, int], float]  # a projection's factor on B @ A, from its name and rank


def read_adapter(lora: LoRA, shapes: dict[str, tuple[int, ...]]) -> dict[str, Delta]:
    """`lora`'s updates by our parameter names (`transformer.h.0.attn.c_attn.weight`), each checked
    against `shapes` (MAX layout): a PEFT directory's, or a GGUF file's as llama.cpp's
    `convert_lora_to_gguf.py` writes it; a `CheckpointError` naming the file and field or key otherwise."""
    pairs, factor = gguf_pairs(lora, shapes) if lora.path.suffix == ".gguf" else peft_pairs(lora)
    deltas = {}
    for name, pair in pairs.items():
        if name not in shapes:
            raise CheckpointError(f"{lora.path}: {name} is past the model's layers")
        if set(pair) != {"A", "B"}:
            raise CheckpointError(f"{lora.path}: {name} has lora_{''.join(pair)} but not its partner")
        a, b, (out, width) = pair["A"], pair["B"], shapes[name]
        if len(a.shape) != 2 or len(b.shape) != 2 or b.shape != (out, a.shape[0]) or a.shape[1] != width:
            raise CheckpointError(
                f"{lora.path}: {name}'s lora_A is {list(a.shape)} and lora_B {list(b.shape)}; the "
                f"projection is {out} x {width}, so they must be [r, {width}] and [{out}, r]"
            )
        deltas[name] = Delta(a, b, lora.scale * factor(name, a.shape[0]))
    return deltas


def peft_pairs(lora: LoRA) -> tuple[Pairs, Factor]:
    """A PEFT directory's pairs and factors: alpha (`alpha_pattern`'s where one names the module) over
    the rank, or over its square root (`use_rslora`)."""
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
    tensors = StoredTensors([weights_file])  # checked now, read as a merge needs them
    pairs: Pairs = {}
    for key, shape in tensors.shape_of.items():
        if not (match := _KEY.fullmatch(key)) or not match[1].endswith(PROJECTIONS):
            raise CheckpointError(
                f"{weights_file}: {key} is no LoRA pair of a projection ({', '.join(PROJECTIONS)}) of GPT-2"
            )
        matrix = Matrix(shape, lambda key=key: tensors[key])
        pairs.setdefault(f"transformer.{match[1]}.weight", {})[match[2]] = matrix

    def factor(name: str, rank: int) -> float:
        module = name.removesuffix(".weight")
        own = next((v for k, v in patterns.items() if re.match(rf"(.*\.)?({k})$", module)), alpha)
        return float(own) / (math.sqrt(rank) if rslora else rank)

    return pairs, factor


def gguf_pairs(lora: LoRA, shapes: dict[str, tuple[int, ...]]) -> tuple[Pairs, Factor]:
    """A GGUF adapter's pairs (`blk.0.attn_qkv.weight.lora_a` `[r, in]`, `.lora_b` `[out, r]`) and
    factors: `adapter.lora.alpha` over the rank, or 1 where alpha is 0 (llama.cpp's `get_scale`)."""
    file = GGUFFile(lora.path)
    for key, wanted in (
        ("general.type", "adapter"),
        ("adapter.type", "lora"),
        ("general.architecture", ARCHITECTURE),
    ):
        if file.metadata.get(key) != wanted:
            raise CheckpointError(
                f"{lora.path}: {key} is {file.metadata.get(key)!r}; a GPT-2 LoRA has {wanted!r}"
            )
    alpha = float(file.metadata.get("adapter.lora.alpha", 0.0))
    layers = {int(name.split(".")[2]) for name in shapes if name.startswith("transformer.h.")}
    ours = {
        gguf_name(f"transformer.h.{n}.{p}.weight"): f"transformer.h.{n}.{p}.weight"
        for n in layers
        for p in PROJECTIONS
    }
    pairs: Pairs = {}
    for stored, info in file.tensors.items():
        base, _, side = stored.rpartition(".lora_")
        if side not in ("a", "b") or base not in ours or info.type not in BY_GGML_TYPE:
            raise CheckpointError(
                f"{lora.path}: tensor {stored} ({info.type}) is no LoRA pair of a projection of GPT-2 "
                f"({', '.join(sorted(ours)[:4])}, ...)"
            )
        tensor = SourceTensor(
            BY_GGML_TYPE[info.type], file.data(stored), info.shape, f"{lora.path}: {stored}"
        )
        pairs.setdefault(ours[base], {})[side.upper()] = Matrix(info.shape, lambda t=tensor: to_float32(t))
    return pairs, lambda name, rank: alpha / rank if alpha else 1.0


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
                "quantized a second time); give the float checkpoint, and the format to store it in"
            )
        self.base, self.adapters = base, adapters
        self.path, self.config, self.tied = base.path, base.config, base.tied
        self.weight_format, self.source_formats = base.weight_format, base.source_formats | {FLOAT32}
        self.one_file, self.tokenizer_metadata = base.one_file, base.tokenizer_metadata
        self.files = [*base.files, *(file for lora in adapters for file in lora.files)]
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
