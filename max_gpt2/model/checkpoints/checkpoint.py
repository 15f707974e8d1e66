"""Reading a Hugging Face GPT-2 safetensors checkpoint: its files, its config, its tensors.

`open_checkpoint(path)` opens whatever a user names: a GGUF file
(`max_gpt2.model.checkpoints.gguf_checkpoint.GGUFCheckpoint`) or a safetensors checkpoint, below.

`Checkpoint(path)` finds the files (one `model.safetensors`, shards named by a
`model.safetensors.index.json`, or a file given directly), refuses pickles
(`pytorch_model.bin` can run code when loaded), reads `config.json` and hands the
tensors to the weights adapter (`max_gpt2.model.checkpoints.weight_adapters`):
`model_weights()` gives every parameter of `GPT2LMHeadModel`,
`attention_weights(layer)` one layer's attention, both float32 in MAX layout.

Files are checked with the `safetensors` library when opened (it verifies that
the header is sane and that the tensors lie inside the file), then read through
MAX's reader (`max.graph.weights.SafetensorWeights`), which handles bfloat16 and
would otherwise trust a truncated file's header and read past its end. Tensors
are read only when asked for, one at a time, as float32.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import safetensors
from max.dtype import DType

from max_gpt2.model import hub
from max_gpt2.model.checkpoints.gguf_checkpoint import GGUFCheckpoint
from max_gpt2.model.checkpoints.stored_weights import TIED_HEAD, SourceTensor
from max_gpt2.model.checkpoints.weight_adapters import CheckpointError, WeightAdapter, layers_found
from max_gpt2.model.checkpoints.weights_cache import Source
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import FLOAT32, TensorFormat, WeightFormat
from max_gpt2.model.formats.dtypes import bfloat16_bits_to_float32
from max_gpt2.model.parameters import model_parameter_shapes

INDEX_FILE = "model.safetensors.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


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
        ggufs = sorted(path.glob("*.gguf"))
        hint = f" (to load the GGUF file there, give its path: {ggufs[0]})" if ggufs else ""
        raise FileNotFoundError(f"no model.safetensors or {INDEX_FILE} in {path}{hint}")
    if path.suffix in _PICKLE_SUFFIXES:
        raise CheckpointError(_conversion_hint(path))
    if path.name.endswith(".index.json"):
        try:
            entries = list(json.loads(path.read_text(encoding="utf-8"))["weight_map"].items())
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointError(
                f"{path} is not a safetensors index (no valid weight_map): {error!r}"
            ) from None
        for key, name in entries:  # each a shard's plain file name, beside the index
            if not isinstance(name, str) or Path(name).name != name:
                raise CheckpointError(f"{path}: weight_map[{key!r}] is {name!r}, not a file beside the index")
        shard_names = sorted({name for _, name in entries})
        shards = [path.parent / name for name in shard_names]
        missing = [str(shard) for shard in shards if not shard.is_file()]
        if missing:
            raise FileNotFoundError(f"{path} names shards that do not exist: {', '.join(missing)}")
        return shards
    return [path]


def _shapes_of(file: Path) -> dict[str, tuple[int, ...]]:
    """The tensors' names in `file` and their shapes, after the safetensors library has validated it."""
    try:
        with safetensors.safe_open(str(file), framework="numpy") as handle:
            names = handle.keys()  # a list: the handle itself is not iterable
            return {key: tuple(handle.get_slice(key).get_shape()) for key in names}
    except (safetensors.SafetensorError, OSError) as error:
        size = file.stat().st_size
        raise CheckpointError(f"{file} ({size} bytes) is not a valid safetensors file: {error}") from None


class StoredTensors(Mapping[str, np.ndarray]):
    """A checkpoint's tensors by their stored names, each read as float32 when looked up; their shapes
    (`shape_of`) from the files' headers."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.file_of: dict[str, Path] = {}
        self.shape_of: dict[str, tuple[int, ...]] = {}
        for file in files:
            for key, shape in _shapes_of(file).items():
                self.shape_of[key] = shape
                if (first := self.file_of.setdefault(key, file)) != file:
                    raise CheckpointError(f"tensor {key} is stored twice, in {first} and in {file}")
        self._reader: Any = None  # MAX's reader, made when a tensor is first read

    def _read(self, key: str) -> Any:
        """MAX's buffer of tensor `key`. MAX's graph package takes about half a second to import and is
        needed only to read tensors (a first conversion into the weights cache), so it is imported here."""
        if self._reader is None:
            from max.graph.weights import SafetensorWeights

            self._reader = SafetensorWeights(self.files)
        return self._reader[key].data().to_buffer()

    def __getitem__(self, key: str) -> np.ndarray:
        """One tensor as float32 (exact for float16 and bfloat16 sources)."""
        if key not in self.file_of:
            raise KeyError(key)
        buffer = self._read(key)
        if buffer.dtype == DType.bfloat16:
            return bfloat16_bits_to_float32(np.from_dlpack(buffer.view(DType.uint16)))
        if buffer.dtype in (DType.float32, DType.float16):
            return np.from_dlpack(buffer).astype(np.float32)
        raise CheckpointError(
            f"tensor {key} in {self.file_of[key]} has dtype {buffer.dtype.name}; "
            f"expected float32, float16 or bfloat16"
        )

    def __contains__(self, key: object) -> bool:
        return key in self.file_of

    def __iter__(self) -> Iterator[str]:
        return iter(self.file_of)

    def __len__(self) -> int:
        return len(self.file_of)


class Checkpoint:
    """An opened GPT-2 safetensors checkpoint, ready to hand out its weights in MAX layout.

    Opening checks every file and reads the config (from `config.json` unless
    `config` is given); tensors are read only when weights are asked for. It loads
    as float32 unless another `weight_format` is asked for.
    """

    weight_format = FLOAT32  # what it loads as
    source_formats = frozenset({FLOAT32})  # what `tensor` hands out
    maps_as_bound = False  # Conv1D weights are transposed: nothing binds as it lies in the files
    merges = ()  # the weights are the files' alone
    one_file = False  # config, tokenizer and weights are files of a directory
    tokenizer_metadata = None  # a tokenizer is only ever in files beside the weights

    def __init__(self, path: str | Path, config: GPT2Config | None = None) -> None:
        self.path = hub.resolve(path)
        if self.path.suffix == ".gguf" and self.path.is_file():
            raise ValueError(
                f"{self.path} is a GGUF file, and this reads safetensors checkpoints only (`load_lm` and "
                "max-gpt2 generate, score, perplexity and serve read GGUF files too)"
            )
        self.files = checkpoint_files(self.path)
        self.tensors = StoredTensors(self.files)
        self.config = config if config is not None else GPT2Config.from_pretrained(self.path)
        source = ", ".join(str(file) for file in self.files)
        self.adapter = WeightAdapter(self.tensors, self.config, source)
        if unused := self.adapter.unused():
            warnings.warn(
                f"{len(unused)} tensors in {source} are not GPT-2's parameters and are not used: "
                f"{', '.join(unused[:5])}{', ...' if len(unused) > 5 else ''}",
                stacklevel=2,
            )

    @property
    def layers_found(self) -> int:
        """How many transformer layers hold any tensor in the files (not the config's claim)."""
        return layers_found(self.tensors)

    @property
    def tied(self) -> bool:
        """Whether the LM head is `wte` itself (`WeightAdapter.tied`)."""
        return self.adapter.tied

    def tensor(self, name: str) -> SourceTensor:
        """Parameter `name` (our module name), float32 in MAX layout, read now (`WeightSource`); the
        tied head is `wte`."""
        name = TIED_HEAD.get(name, name) if self.tied else name
        shape = model_parameter_shapes(self.config)[name]
        return SourceTensor(FLOAT32, self.adapter.parameter(name, shape), shape)

    def model_weights(self) -> dict[str, np.ndarray]:
        """Every parameter of `GPT2LMHeadModel`, float32, MAX layout, keyed by module name.

        Where the head is tied (no `lm_head.weight` stored, GPT-2's usual case),
        `lm_head.weight` is the very array of `transformer.wte.weight`.
        """
        return self.adapter.model_weights()

    def attention_weights(self, layer: int) -> dict[str, np.ndarray]:
        """`layer`'s attention parameters, float32, in MAX `Linear` layout, keyed by parameter name."""
        return self.adapter.attention_weights(layer)


class OpenedCheckpoint(Source, Protocol):
    """What every kind of checkpoint gives a load (`open_checkpoint`: `Checkpoint`, `GGUFCheckpoint`): its
    path, files, config and tensors (`weights_cache.Source`), the format it loads as when none is asked
    for and the one its tensors are stored in, whether its config, tokenizer and weights are one file,
    and the metadata that may hold its tokenizer (None: only files beside it can)."""

    weight_format: WeightFormat
    source_formats: frozenset[TensorFormat]
    one_file: bool
    tokenizer_metadata: Mapping[str, Any] | None


def open_checkpoint(path: str | Path) -> Checkpoint | GGUFCheckpoint:
    """The checkpoint at `path`: a GGUF file (`GGUFCheckpoint`), or safetensors (`Checkpoint`: a file,
    a directory, an index or a Hub id)."""
    resolved = hub.resolve(path)
    if resolved.is_file() and resolved.suffix == ".gguf":
        return GGUFCheckpoint(resolved)
    return Checkpoint(resolved)


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
