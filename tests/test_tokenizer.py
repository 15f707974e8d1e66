"""Text in and out: the shipped tokenizer, both file formats, and decoding a stream of ids."""

from __future__ import annotations

import pytest

from max_gpt2.inference.tokenizer import TextStream, load_tokenizer
from max_gpt2.testing import END_OF_TEXT, write_tokenizer

TEXTS = ["The cat sat by the window.", "naïve café, 14 °C — 🐈", "def add(a, b):\n    return a + b\n", " "]


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(path, vocab_size=400)
    return path


def test_training_is_deterministic_and_fits_the_vocabulary(tmp_path, directory):
    again = write_tokenizer(tmp_path, vocab_size=400)
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        assert (tmp_path / name).read_bytes() == (directory / name).read_bytes()
    assert again.get_vocab_size() <= 400 and again.token_to_id(END_OF_TEXT) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["merges.txt", "tokenizer.json", "vocab.json"]


@pytest.mark.parametrize("text", TEXTS)
def test_both_formats_encode_alike_and_round_trip(tmp_path, directory, text):
    from_json = load_tokenizer(directory)
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    from_pair = load_tokenizer(tmp_path / "model.safetensors")  # a file in the directory works too
    ids = from_json.encode(text).ids
    assert ids == from_pair.encode(text).ids
    assert from_json.decode(ids) == text == from_pair.decode(ids)
    assert max(ids) < 400


def test_merges_make_common_words_single_tokens(directory):
    assert len(load_tokenizer(directory).encode(" the").ids) == 1


@pytest.mark.parametrize("text", TEXTS)
def test_text_stream_emits_whole_characters(directory, text):
    tokenizer = load_tokenizer(directory)
    stream = TextStream(tokenizer)
    pieces = [stream(token) for token in tokenizer.encode(text).ids]
    assert "".join(pieces) == text and stream.flush() == ""
    assert all("\ufffd" not in piece for piece in pieces)  # never half a character


def test_text_stream_hands_out_invalid_bytes_at_the_end(directory):
    tokenizer = load_tokenizer(directory)
    ids = [*tokenizer.encode("ok ").ids, *tokenizer.encode("é").ids[:1]]  # the first byte of two
    stream = TextStream(tokenizer)
    shown = "".join(stream(token) for token in ids)
    assert shown == "ok " and shown + stream.flush() == tokenizer.decode(ids) == "ok \ufffd"


def test_no_tokenizer_and_a_broken_one(tmp_path):
    assert load_tokenizer(tmp_path) is None
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"cannot read the tokenizer in {tmp_path}"):
        load_tokenizer(tmp_path)


def test_vocabulary_too_small_for_bytes(tmp_path):
    with pytest.raises(ValueError, match=r"needs vocab_size >= 257"):
        write_tokenizer(tmp_path, vocab_size=97)


def test_text_stream_shows_ids_the_tokenizer_does_not_know(directory):
    tokenizer = load_tokenizer(directory)
    stream = TextStream(tokenizer)
    ids = [*tokenizer.encode("ok ").ids, 400, 12345, *tokenizer.encode(" then").ids]
    assert "".join(stream(token) for token in ids) + stream.flush() == "ok [400][12345] then"
