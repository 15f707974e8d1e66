"""Text to token ids and back, with Hugging Face's `tokenizers` library (byte-level BPE, as GPT-2).

A GPT-2 checkpoint directory holds its tokenizer either as `tokenizer.json` or as
the original `vocab.json` + `merges.txt`; `load_tokenizer` reads whichever is
there, as Hugging Face does: from the original pair, `<|endoftext|>` is one special
token (50256 in GPT-2's vocabulary), never seven pieces of text. A GGUF file carries
its tokenizer in its metadata (`tokenizer.ggml.tokens`, `.token_type`, `.merges`), read
where no tokenizer file sits beside it (`gguf_tokenizer`; `gguf_vocabulary` writes one). `TextStream` turns
generated ids back into text as they arrive, holding back the bytes of a character
that a later token may complete. `token_bytes` gives the bytes a token stands for.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from max_gpt2.model.checkpoints.gguf_file import GGUFFile

if TYPE_CHECKING:
    from max_gpt2.model.checkpoints.checkpoint import OpenedCheckpoint

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt")
END_OF_TEXT = "<|endoftext|>"
"""GPT-2's document separator, its end-of-text token, and the special token of its original files."""
NORMAL, CONTROL, UNUSED = 1, 3, 5
"""llama.cpp's token types (`tokenizer.ggml.token_type`): a token, a special one, a placeholder id."""


def tokenizer_directory(path: Path) -> Path:
    """Where a checkpoint's tokenizer files sit: the directory itself, or the one holding the file."""
    return path if path.is_dir() else path.parent


def load_tokenizer(path: str | Path, metadata: Mapping[str, Any] | None = None) -> Tokenizer | None:
    """The tokenizer of the checkpoint at `path` (a directory or a file in it), or None if it has none.

    Files beside a GGUF file win, with a warning where their vocabulary's size is not its own; without
    them its own metadata is read (`metadata`, if the caller has parsed the file already).
    """
    path = Path(path)
    directory = tokenizer_directory(path)
    tokenizer_json = directory / "tokenizer.json"
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    beside: Tokenizer | None = None
    try:
        if tokenizer_json.is_file():
            beside = Tokenizer.from_file(str(tokenizer_json))
        elif vocab.is_file() and merges.is_file():
            beside = gpt2_tokenizer(vocab, merges)
    except Exception as error:  # the library reports every malformed file as a bare Exception
        raise ValueError(f"cannot read the tokenizer in {directory}: {error}") from None
    if metadata is None and path.suffix == ".gguf" and path.is_file():
        metadata = GGUFFile(path).metadata
    if beside is not None:
        own = len(metadata.get("tokenizer.ggml.tokens", ())) if metadata is not None else 0
        if own and own != (size := beside.get_vocab_size()):
            warnings.warn(
                f"the tokenizer files in {directory} ({size} tokens) replace {path.name}'s ({own} tokens)",
                stacklevel=2,
            )
        return beside
    return None if metadata is None else gguf_tokenizer(metadata, str(path))


def checkpoint_tokenizer(checkpoint: OpenedCheckpoint) -> Tokenizer | None:
    """An opened checkpoint's tokenizer (`load_tokenizer`), its metadata read already."""
    return load_tokenizer(checkpoint.path, checkpoint.tokenizer_metadata)


def gpt2_tokenizer(vocab: Path, merges: Path) -> Tokenizer:
    """GPT-2's tokenizer from its original files: byte-level BPE, no prefix space, `<|endoftext|>` special.

    As Hugging Face's `GPT2Tokenizer` reads the same files: the end-of-text
    token is matched whole in the text, keeping its id in `vocab.json` (50256 in
    GPT-2's), or taking the next free id where the vocabulary lacks it. A `merges.txt` with no merge
    is refused: BPE without merges would split every text into single bytes, silently.
    """
    with merges.open("rb") as stream:
        head = [stream.readline() for _ in range(2)]  # an optional "#version" line, then the first merge
    if not any(line.strip() and not line.startswith(b"#version") for line in head):
        raise ValueError(f"{merges} holds no merge: without them GPT-2's BPE splits every text into bytes")
    return _byte_level(Tokenizer(models.BPE.from_file(str(vocab), str(merges))), [END_OF_TEXT])


def _byte_level(tokenizer: Tokenizer, special: list[str]) -> Tokenizer:
    """GPT-2's byte-level pre-tokenizer (its regex, no prefix space) and decoder around a BPE model,
    with the `special` tokens matched whole."""
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    return tokenizer


def gguf_tokenizer(metadata: Mapping[str, Any], source: str) -> Tokenizer | None:
    """GPT-2's tokenizer from a GGUF file's `tokenizer.ggml.*` metadata (None if it carries none):
    the tokens by id (placeholders, type UNUSED, left out), the merges, CONTROL tokens special.
    Refuses, naming `source`, a tokenizer other than GPT-2's byte-level BPE and pre-tokenizer."""
    if "tokenizer.ggml.tokens" not in metadata:
        return None
    kind, pre = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre", "gpt-2")
    if kind != "gpt2" or pre != "gpt-2":
        raise ValueError(
            f"{source}: its tokenizer is {kind!r} with pre-tokenizer {pre!r} (tokenizer.ggml.model, .pre); "
            f"GPT-2's byte-level BPE ('gpt2', 'gpt-2') is read here"
        )
    tokens, merges = metadata["tokenizer.ggml.tokens"], metadata.get("tokenizer.ggml.merges", [])
    if not merges:  # as llama.cpp refuses it
        raise ValueError(f"{source}: tokenizer.ggml.merges is missing or empty: GPT-2's BPE needs its merges")
    types = metadata.get("tokenizer.ggml.token_type", np.full(len(tokens), NORMAL))
    if not isinstance(tokens, list) or not isinstance(merges, list) or len(types) != len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.tokens, .merges and .token_type do not fit together")
    kinds = np.asarray(types).tolist()  # Python ints: a NumPy scalar's comparison costs ten times more
    vocab = {
        token: id_ for id_, (token, kind) in enumerate(zip(tokens, kinds, strict=True)) if kind != UNUSED
    }
    pairs = [tuple(merge.split(" ")) for merge in merges]
    if len(vocab) != len(kinds) - kinds.count(UNUSED) or set(map(len, pairs)) - {2}:
        raise ValueError(f"{source}: tokenizer.ggml.tokens repeats a token, or a merge is not two tokens")
    try:
        model = models.BPE(vocab=vocab, merges=pairs)
    except Exception as error:  # the library reports a merge of unknown tokens as a bare Exception
        raise ValueError(f"{source}: cannot build its tokenizer: {error}") from None
    special = [token for token, kind in zip(tokens, kinds, strict=True) if kind == CONTROL]
    return _byte_level(Tokenizer(model), special)


def gguf_vocabulary(tokenizer: Tokenizer, vocab_size: int) -> dict[str, Any]:
    """The `tokenizer.ggml.*` metadata for `tokenizer` over a model of `vocab_size` ids, as llama.cpp's
    converter writes GPT-2's: every id a token (`[PADn]`, UNUSED, where the tokenizer has none)."""
    model = json.loads(tokenizer.to_str())["model"]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    by_id = {id_: token for token, id_ in tokenizer.get_vocab(with_added_tokens=True).items()}
    if outside := sorted(id_ for id_ in by_id if id_ >= vocab_size):
        raise ValueError(f"the tokenizer has ids past the model's vocabulary of {vocab_size}: {outside[:5]}")
    special = {id_ for id_, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    tokens = [by_id.get(id_, f"[PAD{id_}]") for id_ in range(vocab_size)]
    types = [
        UNUSED if id_ not in by_id else CONTROL if id_ in special else NORMAL for id_ in range(vocab_size)
    ]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": merges,
    }


def _byte_of_character() -> dict[str, int]:
    """Byte-level BPE's alphabet, read backwards: the byte each of its 256 characters stands for.

    Bytes that print as themselves (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) are their own
    character; the other 68 bytes take the characters from U+0100 on, in byte order.
    """
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    hidden = [byte for byte in range(256) if byte not in shown]
    return {chr(byte): byte for byte in shown} | {chr(256 + i): byte for i, byte in enumerate(hidden)}


_BYTE_LEVEL = _byte_of_character()


def token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    """The bytes token `token_id` stands for; exact where decoding a token alone is not.

    A byte-level token may hold part of a character, so its bytes come from its
    characters mapped back to bytes; a special token (`<|endoftext|>`) stands for
    its own text.
    """
    special = tokenizer.get_added_tokens_decoder()
    if token_id in special:
        return special[token_id].content.encode("utf-8")
    piece = tokenizer.id_to_token(token_id)
    if piece is None:
        raise ValueError(f"token id {token_id} is not in the tokenizer's vocabulary")
    return piece_bytes(piece)


def piece_bytes(piece: str) -> bytes:
    """The bytes a byte-level BPE piece (`Ġcat`: b" cat") stands for."""
    return bytes(_BYTE_LEVEL[character] for character in piece)


class TextStream:
    """Decodes ids one at a time; what it has emitted, plus `flush()`, is the decode of them all.

    Byte-level BPE can split one character over several tokens: text ending in an
    incomplete character (decoded as U+FFFD) waits for the next token. Its decode is
    piecewise (ids after a whole character read the same alone as after the rest), so
    each step decodes only the ids since the last whole character. `skip_special_tokens`
    leaves out end-of-text and the other special tokens, as `decode` does with it.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self._whole = ""  # the decode of the ids up to the last whole character
        self._pending: list[int] = []  # the ids after it
        self._emitted = 0  # characters of the decoded text already handed out

    def __call__(self, token_id: int) -> str:
        """The text `token_id` completes (possibly empty).

        An id the tokenizer does not know (a model's vocabulary may be larger than its
        tokenizer's) shows as `[id]` rather than vanishing, as `decode` would let it.
        """
        if self.tokenizer.id_to_token(int(token_id)) is None:
            shown = f"{self.flush()}[{int(token_id)}]"
            self._whole, self._pending, self._emitted = "", [], 0
            return shown
        self._pending.append(int(token_id))
        tail = self._decode()
        if tail.endswith("\ufffd"):
            return ""
        self._whole, self._pending = self._whole + tail, []
        return self._take(self._whole)

    def flush(self) -> str:
        """Whatever is held back, invalid bytes included (as U+FFFD)."""
        return self._take(self._whole + self._decode(), final=True)

    def _decode(self) -> str:
        return self.tokenizer.decode(self._pending, skip_special_tokens=self.skip_special_tokens)

    def _take(self, text: str, final: bool = False) -> str:
        """What of `text`, the decode of every id so far, is new; `final` on the last call."""
        new, self._emitted = text[self._emitted :], len(text)
        return new
