"""Text to token ids and back, with Hugging Face's `tokenizers` library (byte-level BPE, as GPT-2).

A GPT-2 checkpoint directory holds its tokenizer either as `tokenizer.json` or as
the original `vocab.json` + `merges.txt`; `load_tokenizer` reads whichever is
there, as Hugging Face does: from the original pair, `<|endoftext|>` is one special
token (50256 in GPT-2's vocabulary), never seven pieces of text. `TextStream` turns
generated ids back into text as they arrive, holding back the bytes of a character
that a later token may complete. `token_bytes` gives the bytes a token stands for.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt")
END_OF_TEXT = "<|endoftext|>"
"""GPT-2's document separator, its end-of-text token, and the special token of its original files."""


def tokenizer_directory(path: Path) -> Path:
    """Where a checkpoint's tokenizer files sit: the directory itself, or the one holding the file."""
    return path if path.is_dir() else path.parent


def load_tokenizer(path: str | Path) -> Tokenizer | None:
    """The tokenizer of the checkpoint at `path` (a directory or a file in it), or None if it has none."""
    directory = tokenizer_directory(Path(path))
    tokenizer_json = directory / "tokenizer.json"
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    try:
        if tokenizer_json.is_file():
            return Tokenizer.from_file(str(tokenizer_json))
        if vocab.is_file() and merges.is_file():
            return gpt2_tokenizer(vocab, merges)
    except Exception as error:  # the library reports every malformed file as a bare Exception
        raise ValueError(f"cannot read the tokenizer in {directory}: {error}") from None
    return None


def gpt2_tokenizer(vocab: Path, merges: Path) -> Tokenizer:
    """GPT-2's tokenizer from its original files: byte-level BPE, no prefix space, `<|endoftext|>` special.

    As Hugging Face's `GPT2Tokenizer` reads the same files: the end-of-text
    token is matched whole in the text, keeping its id in `vocab.json` (50256 in
    GPT-2's), or taking the next free id where the vocabulary lacks it.
    """
    tokenizer = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(END_OF_TEXT, special=True, normalized=False)])
    return tokenizer


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
    return bytes(_BYTE_LEVEL[character] for character in piece)


class TextStream:
    """Decodes ids one at a time; what it has emitted, plus `flush()`, is the decode of them all.

    Byte-level BPE can split one character over several tokens: text ending in an
    incomplete character (decoded as U+FFFD) waits for the next token. Decoding
    the whole sequence each time costs little next to a model step.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = 0  # characters of the decoded text already handed out

    def __call__(self, token_id: int) -> str:
        """The text `token_id` completes (possibly empty).

        An id the tokenizer does not know (a model's vocabulary may be larger than its
        tokenizer's) shows as `[id]` rather than vanishing, as `decode` would let it.
        """
        if self.tokenizer.id_to_token(int(token_id)) is None:
            shown = f"{self.flush()}[{int(token_id)}]"
            self._ids, self._emitted = [], 0
            return shown
        self._ids.append(int(token_id))
        text = self.tokenizer.decode(self._ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):
            return ""
        return self._take(text)

    def flush(self) -> str:
        """Whatever is held back, invalid bytes included (as U+FFFD)."""
        return self._take(self.tokenizer.decode(self._ids, skip_special_tokens=False), final=True)

    def _take(self, text: str, final: bool = False) -> str:
        """What of `text`, the decode of every id so far, is new; `final` on the last call."""
        new, self._emitted = text[self._emitted :], len(text)
        return new
