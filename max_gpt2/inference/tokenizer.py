"""Text to token ids and back, with Hugging Face's `tokenizers` library (byte-level BPE, as GPT-2).

A GPT-2 checkpoint directory holds its tokenizer either as `tokenizer.json` or as
the original `vocab.json` + `merges.txt`; `load_tokenizer` reads whichever is
there. `TextStream` turns generated ids back into text as they arrive, holding back
the bytes of a character that a later token may complete.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt")


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
    """GPT-2's tokenizer from its original files: byte-level BPE, no prefix space, no special handling."""
    tokenizer = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


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
        return self._take(self.tokenizer.decode(self._ids, skip_special_tokens=False))

    def _take(self, text: str) -> str:
        new, self._emitted = text[self._emitted :], len(text)
        return new
