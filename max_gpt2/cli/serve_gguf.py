"""What MAX's server reads beside a GGUF file: a model directory made for it in the cache.

MAX's server takes a model directory (`config.json`, the tokenizer) and weight files; a GGUF
file carries all three. `model_directory` writes `config.json` (the file's `gpt2.*` shapes,
naming our architecture) and `tokenizer.json` (the file's own tokenizer, or the one beside it)
into `CACHE/served/DIGEST/`, with the file's chat template (`tokenizer.chat_template`) in
`tokenizer_config.json` where it has one, beside a link `model.gguf` to the file, which `max-gpt2 serve`
passes as MAX's weight path: its weights are read from the file itself, by the GGUF adapter
`max_gpt2.serving.arch` registers. DIGEST is the file's content (`weights_cache.content_digest`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer

from max_gpt2.model.checkpoints.gguf_checkpoint import GGUFCheckpoint
from max_gpt2.model.checkpoints.weights_cache import content_digest
from max_gpt2.outputs import write_atomically

WEIGHTS = "model.gguf"
CHAT_TEMPLATE = "tokenizer.chat_template"  # llama.cpp's key for the file's chat template


def model_directory(checkpoint: GGUFCheckpoint, tokenizer: Tokenizer, architecture: str, cache: Path) -> Path:
    """The directory MAX serves `checkpoint` from (module docstring); its weights are `WEIGHTS` in it."""
    directory = cache / "served" / content_digest(checkpoint.files, cache)[:32]
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [architecture], **checkpoint.config.to_dict()}
    write_atomically(
        directory / "config.json", lambda partial: partial.write_text(json.dumps(config, indent=2))
    )
    write_atomically(directory / "tokenizer.json", lambda partial: tokenizer.save(str(partial)))
    if template := checkpoint.tokenizer_metadata.get(CHAT_TEMPLATE):
        text = json.dumps({"chat_template": template})
        write_atomically(directory / "tokenizer_config.json", lambda partial: partial.write_text(text))
    link = directory / f".{os.getpid()}.{WEIGHTS}"
    link.unlink(missing_ok=True)
    os.symlink(checkpoint.path.resolve(), link)
    os.replace(link, directory / WEIGHTS)
    return directory
