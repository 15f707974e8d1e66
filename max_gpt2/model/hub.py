"""Turning what a user typed (a local path, or a Hugging Face Hub id) into a local path.

A local path always wins. Anything that does not exist locally but looks like a
Hub id (`gpt2`, `openai-community/gpt2-xl`) is fetched with `huggingface_hub`,
an optional dependency, taking only the safetensors, JSON and `merges.txt` files
(weights, config and tokenizer; never a pickle).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def resolve(path_or_id: str | Path) -> Path:
    """Returns a local path for `path_or_id`, downloading a Hub snapshot if needed."""
    path = Path(path_or_id)
    if path.exists():
        return path
    text = str(path_or_id)
    if not _HUB_ID.fullmatch(text):
        raise FileNotFoundError(f"no such file or directory: {text}")
    try:
        hub = importlib.import_module("huggingface_hub")
    except ImportError:
        raise FileNotFoundError(
            f"no such file or directory: {text} (to fetch {text!r} from the Hugging Face "
            f"Hub instead, install huggingface_hub and be online)"
        ) from None
    try:
        return Path(hub.snapshot_download(text, allow_patterns=["*.safetensors", "*.json", "merges.txt"]))
    except Exception as error:  # the Hub client raises many unrelated types
        raise FileNotFoundError(
            f"no such file or directory: {text}, and fetching it from the Hugging Face Hub failed: {error}"
        ) from error
