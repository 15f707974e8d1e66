"""The weights cache: a checkpoint's parameters stored as bound in a weight format, written once and
memory-mapped on every later load.

The first load in a format streams the checkpoint's tensors one at a time through
`stored_weights.store` (quantized, rounded, transposed or widened) into a file; every load
then maps that file and binds its arrays as they lie: nothing is read until a step touches
it, and the pages are the page cache's, so no second copy of a weight is ever held.

    CACHE/weights/DIGEST-FORMAT-vLAYOUT.safetensors    the arrays, in `stored_layout`'s order
    CACHE/digests/KEY.json                             a checkpoint's DIGEST, remembered

(CACHE: `outputs.default_cache_dir()`, `$MAX_GPT2_CACHE` where set.) `bound_weights` is the
whole policy: a GGUF file of float32 tensors loaded as float32 is bound from the file itself;
everything else through the cache; where the cache cannot be written, converted in memory.

DIGEST is the sha256 of the checkpoint's content (its files' bytes, in order), so a copy of
a checkpoint shares its entry and a changed one gets a new one. Hashing reads every byte
(seconds for GPT-2 small on a small CPU), so the digest is remembered against each file's
path, size, modification and change times and inode (KEY hashes the paths): an edited or
replaced file has another change time and is hashed again. LAYOUT changes with the stored
layouts. Every file is written under a temporary name and renamed into place whole; one that
does not hold exactly the arrays its name promises (names, dtypes, shapes, bytes inside the
file) is refused on reading and written again.
"""

from __future__ import annotations

import hashlib
import json
import struct
import warnings
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from max_gpt2.model.checkpoints.stored_weights import (
    StoredWeights,
    WeightSource,
    stored_layout,
    stored_tensors,
    with_aliases,
)
from max_gpt2.model.checkpoints.weight_adapters import CheckpointError
from max_gpt2.model.config import GPT2Config
from max_gpt2.model.formats import WeightFormat
from max_gpt2.outputs import default_cache_dir, write_atomically

LAYOUT = 3
_CODES = {"float32": "F32", "float16": "F16", "int8": "I8", "uint8": "U8", "uint16": "U16"}
_HASHED = 1 << 24  # bytes read at a time while hashing

Layout = dict[str, tuple[tuple[int, ...], str]]
Step = Callable[[str], AbstractContextManager[Any]]


def _stats(files: list[Path]) -> list[list[Any]]:
    """What changes when a file does: its path, size, modification and change times and inode."""
    stats = []
    for file in files:
        stat = file.resolve().stat()
        stats.append([str(file.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino])
    return stats


def content_digest(files: list[Path], cache: Path) -> str:
    """The sha256 of `files`' bytes, in order, remembered in `cache` until one of them changes."""
    stats = _stats(files)
    memo = (
        cache
        / "digests"
        / f"{hashlib.sha256(json.dumps([s[0] for s in stats]).encode()).hexdigest()[:32]}.json"
    )
    try:
        remembered = json.loads(memo.read_text())
        if remembered["files"] == stats:
            return str(remembered["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: hash again
    digest = hashlib.sha256()
    for file in files:
        with file.open("rb") as stream:
            while chunk := stream.read(_HASHED):
                digest.update(chunk)
    memo.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"files": stats, "digest": digest.hexdigest()})
    write_atomically(memo, lambda partial: partial.write_text(text))
    return digest.hexdigest()


def write_stored(
    file: Path, layout: Layout, arrays: Iterable[tuple[str, np.ndarray]], metadata: dict[str, str]
) -> None:
    """Writes `arrays` (exactly `layout`'s, in order) as a safetensors file, one array in memory at a time."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, (shape, dtype) in layout.items():
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": _CODES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    def write(partial: Path) -> None:
        with partial.open("wb") as stream:
            stream.write(struct.pack("<Q", len(text)) + text)
            for name, array in arrays:
                shape, dtype = layout[name]
                if array.shape != shape or array.dtype != np.dtype(dtype):
                    raise ValueError(f"{name}: {array.dtype} {array.shape} given, {dtype} {shape} declared")
                stream.write(memoryview(np.ascontiguousarray(array)).cast("B"))

    write_atomically(file, write)


def read_stored(file: Path, layout: Layout) -> dict[str, np.ndarray]:
    """`file`'s arrays, memory-mapped copy-on-write (bound without a copy; the file is never written);
    a `CheckpointError` if it does not hold exactly `layout`'s arrays, whole, in order. Mapped, not
    read: a faster start and less held, for a step a few % slower (docs/performance.md)."""
    size = file.stat().st_size
    with file.open("rb") as stream:
        head = stream.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if length > size - 8:
            raise CheckpointError(f"{file}: its header claims {length} bytes, past the end of the file")
        try:
            header = json.loads(stream.read(length))
            header.pop("__metadata__", None)
            found = [(name, entry["dtype"], tuple(entry["shape"])) for name, entry in header.items()]
            offsets = [tuple(entry["data_offsets"]) for entry in header.values()]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointError(f"{file}: its header is not a safetensors header: {error!r}") from None
    if found != [(name, _CODES[dtype], shape) for name, (shape, dtype) in layout.items()]:
        raise CheckpointError(f"{file} does not hold the arrays its name promises")
    position = 0
    for (name, (shape, dtype)), (first, last) in zip(layout.items(), offsets, strict=True):
        if (first, last) != (
            position,
            position + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize,
        ):
            raise CheckpointError(f"{file}: {name}'s bytes are not where they belong")
        position = last
    if 8 + length + position > size:
        raise CheckpointError(f"{file} is truncated: {size} bytes, its arrays end at {8 + length + position}")
    data = np.memmap(file, np.uint8, mode="c", offset=8 + length, shape=(position,))
    return {
        name: data[first:last].view(dtype).reshape(shape)
        for (name, (shape, dtype)), (first, last) in zip(layout.items(), offsets, strict=True)
    }


class Source(WeightSource, Protocol):
    """A checkpoint `bound_weights` reads: its tensors (`WeightSource`) and files, whether a float32
    load binds them as they lie (`GGUFCheckpoint.maps_as_bound`), and what its tensors merge beyond the
    files' bytes (`lora.MergedCheckpoint.merges`: the adapters' scales), part of the cache's key."""

    path: Path
    files: list[Path]
    maps_as_bound: bool
    merges: tuple[str, ...]


def bound_weights(
    source: Source, weight_format: WeightFormat, cache: Path | None = None, step: Step | None = None
) -> StoredWeights:
    """`source`'s parameters as bound in `weight_format` (module docstring), from the cache under `cache`
    (None: `default_cache_dir()`); `step(label)` hears of a conversion."""
    if not weight_format.kernels_only and source.maps_as_bound:
        return with_aliases(dict(stored_tensors(source, weight_format)), source.tied, weight_format)
    root = default_cache_dir() if cache is None else cache
    try:
        return cached_weights(source, weight_format, root, step)
    except OSError as error:
        warnings.warn(
            f"cannot keep converted weights in {root} ({error}); converting in memory", stacklevel=2
        )
        return with_aliases(dict(stored_tensors(source, weight_format)), source.tied, weight_format)


def cached_weights(
    source: Source, weight_format: WeightFormat, cache: Path, step: Step | None = None
) -> StoredWeights:
    """`source`'s parameters as bound in `weight_format`, from the cache under `cache`; the first time,
    converted into it, tensor by tensor (`step(label)` reports that work)."""
    config: GPT2Config = source.config
    layout = stored_layout(config, weight_format, source.tied)
    digest = content_digest(source.files, cache)
    if source.merges:
        digest = hashlib.sha256(json.dumps([digest, *source.merges]).encode()).hexdigest()
    file = cache / "weights" / f"{digest[:32]}-{weight_format}-v{LAYOUT}.safetensors"
    if file.is_file():
        try:
            return with_aliases(read_stored(file, layout), source.tied, weight_format)
        except CheckpointError:
            pass  # not what it should be (another version's, or damaged): written again below
    file.parent.mkdir(parents=True, exist_ok=True)
    label = f"converting the weights of {source.path} to {weight_format}, once (kept in {file.parent})"
    with nullcontext() if step is None else step(label):
        metadata = {"format": weight_format.name, "digest": digest, "config": json.dumps(config.to_dict())}
        write_stored(file, layout, stored_tensors(source, weight_format), metadata)
    return with_aliases(read_stored(file, layout), source.tied, weight_format)
