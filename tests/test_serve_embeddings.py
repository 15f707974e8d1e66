"""Embeddings through the real server (`max-gpt2 serve --embeddings --pooling mean`) and the `openai`
client: each vector is the float64 reference's final hidden states of the text, averaged over its tokens
and divided by its length, by this test's own arithmetic; alike whether sent as floats or base64, as
text or ids, alone or batched, in vLLM's dtypes and bytes; llama-server's norms; truncation; a chat's
messages as its template renders them; MAX's request metrics; the generating routes refused; and, where
llama.cpp is built (`LLAMA_CPP`), llama-server's own vectors on the same weights, pooled either way. The
refusals that need no model: test_serve_guard.py; the dtypes' rounding: test_embedding_bytes.py."""

from __future__ import annotations

import base64
import json
import subprocess
import time

import httpx
import numpy as np
import pytest

from max_gpt2 import reference
from max_gpt2.bench.server import stop_group
from max_gpt2.inference.embeddings import Pooling, embed
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from tests.llama_cpp import llama_server_on
from tests.support import LM, requires_serving
from tests.test_serve import client

pytestmark = requires_serving()

TEXTS = ["The cat sat on the mat.", "Dogs", "A longer text, which the batch pads the others to, runs here."]


@pytest.fixture(scope="module")
def server(served_embeddings_lm):
    return served_embeddings_lm


@pytest.fixture(scope="module")
def expected(server):
    """`expected(ids)`: the reference's mean final state of `ids`, and that over its Euclidean length."""
    weights = Checkpoint(server.checkpoint).model_weights()

    def mean_state(ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        mean = reference.lm_forward(np.array([ids]), weights, LM).hidden[0].mean(axis=0)
        return mean, mean / np.sqrt((mean**2).sum())

    return mean_state


def post(server, **body) -> dict:
    answer = httpx.post(f"{server.url}/v1/embeddings", json={"model": "gpt2", **body}, timeout=600)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_openai_client_gets_each_texts_normalised_mean_state(server, expected):
    tokenizer = load_tokenizer(server.checkpoint)
    ids = [tokenizer.encode(text).ids for text in TEXTS]
    answer = client(server).embeddings.create(model="gpt2", input=TEXTS)  # base64, the client's default
    assert [item.index for item in answer.data] == [0, 1, 2] and answer.model == "gpt2"
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(map(len, ids))
    for item, tokens in zip(answer.data, ids, strict=True):
        assert len(item.embedding) == LM.n_embd
        np.testing.assert_allclose(item.embedding, expected(tokens)[1], atol=2e-5)


def test_floats_and_base64_ids_and_text_alone_and_batched_are_one_vector(server):
    tokenizer = load_tokenizer(server.checkpoint)
    floats = [item["embedding"] for item in post(server, input=TEXTS)["data"]]
    encoded = [item["embedding"] for item in post(server, input=TEXTS, encoding_format="base64")["data"]]
    decoded = [np.frombuffer(base64.b64decode(each), "<f4") for each in encoded]
    # Two requests: the worker may batch each otherwise, the same vectors but for float32's rounding.
    np.testing.assert_allclose(np.array(floats, np.float32), np.array(decoded), atol=1e-6)
    by_ids = post(server, input=[tokenizer.encode(text).ids for text in TEXTS])["data"]
    np.testing.assert_allclose([item["embedding"] for item in by_ids], floats, atol=1e-6)
    for text, batched in zip(TEXTS, floats, strict=True):  # 3 texts, 4 a step: padded together above
        alone = post(server, input=text)["data"][0]["embedding"]
        np.testing.assert_allclose(alone, batched, atol=1e-6)
    many = post(server, input=TEXTS * 3)["data"]  # 9 texts: three steps
    np.testing.assert_allclose([item["embedding"] for item in many], floats * 3, atol=1e-6)


def test_vllms_dtypes_endianness_and_bytes_carry_the_same_vectors(server, expected):
    """base64 in float16, big-endian, is the float answer rounded to float16; "bytes" sends every vector's
    bfloat16 bytes as the body, each where vLLM's `metadata` header says; "bytes_only" the body alone;
    vLLM's fields beside floats refused, naming them."""
    tokenizer = load_tokenizer(server.checkpoint)
    floats = np.array([item["embedding"] for item in post(server, input=TEXTS)["data"]], np.float32)
    half = post(server, input=TEXTS, encoding_format="base64", embed_dtype="float16", endianness="big")
    decoded = [np.frombuffer(base64.b64decode(item["embedding"]), ">f2") for item in half["data"]]
    np.testing.assert_allclose(np.array(decoded, np.float32), floats.astype(np.float16), atol=1e-3)
    body = {"model": "gpt2", "input": TEXTS, "encoding_format": "bytes", "embed_dtype": "bfloat16"}
    answer = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=600)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/octet-stream"
    metadata = json.loads(answer.headers["metadata"])
    assert metadata["model"] == "gpt2" and metadata["usage"]["prompt_tokens"] == sum(
        len(tokenizer.encode(text).ids) for text in TEXTS
    )
    for item, tokens in zip(metadata["data"], (tokenizer.encode(text).ids for text in TEXTS), strict=True):
        assert (item["embed_dtype"], item["endianness"], item["shape"]) == ("bfloat16", "native", [LM.n_embd])
        upper = np.frombuffer(answer.content[item["start"] : item["end"]], np.uint16).astype(np.uint32) << 16
        np.testing.assert_allclose(upper.view(np.float32), expected(tokens)[1], rtol=2**-8, atol=1e-5)
    only = httpx.post(
        f"{server.url}/v1/embeddings", json={**body, "encoding_format": "bytes_only"}, timeout=600
    )
    assert only.content == answer.content and "metadata" not in only.headers
    refused = httpx.post(
        f"{server.url}/v1/embeddings", json={"input": "a", "embed_dtype": "float16"}, timeout=60
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "embed_dtype", refused.text


def test_llama_servers_norms_and_vllms_normalize(server, expected):
    ids = load_tokenizer(server.checkpoint).encode(TEXTS[0]).ids
    mean, _ = expected(ids)
    for body in ({"normalize": False}, {"embd_normalize": -1}):
        np.testing.assert_allclose(post(server, input=ids, **body)["data"][0]["embedding"], mean, atol=1e-4)
    taxicab = post(server, input=ids, embd_normalize=1)["data"][0]["embedding"]
    np.testing.assert_allclose(taxicab, mean / np.abs(mean).sum(), atol=1e-6)
    largest = post(server, input=ids, embd_normalize=0)["data"][0]["embedding"]
    np.testing.assert_allclose(largest, mean * 32760 / np.abs(mean).max(), rtol=1e-4)


def test_llama_servers_own_routes_answer_in_its_shape(server, expected):
    """`/embedding` and `/embeddings` with `content` (or `input`), and `/v1/embeddings` given `content`: a
    list of `{index, embedding: [vector]}`, the vectors the reference's, norms as at `/v1/embeddings`."""
    ids = [load_tokenizer(server.checkpoint).encode(text).ids for text in TEXTS]
    for path, field in (("/embedding", "content"), ("/embeddings", "input"), ("/v1/embeddings", "content")):
        answer = httpx.post(f"{server.url}{path}", json={field: TEXTS}, timeout=600)
        assert answer.status_code == 200, answer.text
        assert [item["index"] for item in answer.json()] == [0, 1, 2] and {*answer.json()[0]} == {
            "index",
            "embedding",
        }
        for item, tokens in zip(answer.json(), ids, strict=True):
            (vector,) = item["embedding"]
            np.testing.assert_allclose(vector, expected(tokens)[1], atol=2e-5)
    raw = httpx.post(f"{server.url}/embedding", json={"content": ids[0], "embd_normalize": -1}, timeout=60)
    np.testing.assert_allclose(raw.json()[0]["embedding"][0], expected(ids[0])[0], atol=1e-4)
    for body, field in (
        ({"content": "a", "input": "b"}, "content"),
        ({"content": "a", "encoding_format": "base64"}, "encoding_format"),
    ):
        refused = httpx.post(f"{server.url}/embedding", json=body, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text


def test_a_whole_context_embeds_and_truncation_keeps_the_last_tokens(server, expected):
    ids = np.random.default_rng(3).integers(0, LM.vocab_size, LM.n_positions + 5).tolist()
    whole = post(server, input=ids[-LM.n_positions :])["data"][0]["embedding"]
    np.testing.assert_allclose(whole, expected(ids[-LM.n_positions :])[1], atol=2e-5)
    cut = post(server, input=ids, truncate_prompt_tokens=-1)
    assert cut["usage"]["prompt_tokens"] == LM.n_positions
    np.testing.assert_array_equal(cut["data"][0]["embedding"], whole)
    last = post(server, input=ids, truncate_prompt_tokens=7)["data"][0]["embedding"]
    np.testing.assert_allclose(last, expected(ids[-7:])[1], atol=2e-5)
    refused = httpx.post(f"{server.url}/v1/embeddings", json={"input": ids}, timeout=60).json()["error"]
    assert refused["code"] == "context_length_exceeded" and refused["param"] == "input"


def test_it_generates_nothing_and_says_why(server):
    import openai

    with pytest.raises(openai.NotFoundError, match="was started with --embeddings and generates no text"):
        client(server).completions.create(model="gpt2", prompt="The cat", max_tokens=2)
    tokens = httpx.post(f"{server.url}/tokenize", json={"content": "The cat"}, timeout=60).json()
    assert tokens["tokens"] == load_tokenizer(server.checkpoint).encode("The cat").ids


def test_a_chats_messages_are_one_vector_of_the_text_the_template_renders(server, expected):
    tokenizer = load_tokenizer(server.checkpoint)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = "system: Be brief.\nuser: Hi there\n"  # conftest's CHAT_TEMPLATE, by hand
    for asked, rendered in (({}, text), ({"add_generation_prompt": True}, text + "assistant:")):
        answer = post(server, messages=messages, **asked)  # vLLM's default: no generation prompt
        ids = tokenizer.encode(rendered).ids
        assert answer["usage"]["prompt_tokens"] == len(ids) and len(answer["data"]) == 1
        np.testing.assert_allclose(answer["data"][0]["embedding"], expected(ids)[1], atol=2e-5)
    for body, field, says in (
        ({"messages": messages, "input": "x"}, "messages", "give input or messages, not both"),
        ({"input": "x", "add_generation_prompt": True}, "add_generation_prompt", "for a chat (messages)"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "messages[0].role"),
    ):
        refused = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field
        assert says in refused.json()["error"]["message"]


def test_embeddings_count_in_the_request_metrics_their_tokens_as_input(server):
    from tests.test_serve_api import metric

    inputs = ("maxserve_num_input_tokens_total", 'vllm:prompt_tokens_total{model_name="gpt2"}')
    timed = 'maxserve_request_time_milliseconds_count{path="/v1/embeddings"}'

    def counts() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        return {name: metric(text, name) for name in (*inputs, timed)}

    before, settle = counts(), time.monotonic() + 15  # earlier tests' counts arrive a moment late
    while time.monotonic() < settle:
        time.sleep(1)
        if (again := counts()) == before:
            break
        before = again
    tokens = post(server, input=TEXTS)["usage"]["prompt_tokens"]
    expected = {**dict.fromkeys(inputs, float(tokens)), timed: 1.0}
    deadline = time.monotonic() + 30
    while (grown := {name: n - before[name] for name, n in counts().items()}) != expected:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert grown == expected


@pytest.fixture(scope="module")
def llama_server(server, tmp_path_factory):
    """`llama_server(pooling)`: llama.cpp's llama-server with `--embeddings --pooling POOLING` on the
    served weights, as the GGUF file `max-gpt2 convert` writes; each started once, all stopped after."""
    directory = tmp_path_factory.mktemp("llama-server")
    started: dict[str, tuple[subprocess.Popen, str]] = {}

    def start(pooling: str) -> str:
        if pooling not in started:
            options = ("-c", str(LM.n_positions), "--embeddings", "--pooling", pooling)
            started[pooling] = llama_server_on(
                server.checkpoint, directory, *options, "-ctk", "f32", "-ctv", "f32"
            )
        return started[pooling][1]

    try:
        yield start
    finally:
        for process, _ in started.values():
            stop_group(process.pid, process.poll)


@pytest.mark.parametrize("pooling", list(Pooling))
def test_llama_server_embeds_the_same_weights_alike(server, llama_server, compiled_lm, pooling):
    """The same token ids to llama-server and to ours (the mean: the server; the last token's: the
    library, which the server runs) on the same weights: the same unit vectors, and llama-server's norms."""
    ids = [load_tokenizer(server.checkpoint).encode(text).ids for text in TEXTS]
    url = llama_server(pooling.value)
    theirs = httpx.post(f"{url}/v1/embeddings", json={"input": ids}, timeout=120).json()["data"]
    if pooling is Pooling.MEAN:
        ours = [item["embedding"] for item in post(server, input=ids)["data"]]
    else:
        lm = compiled_lm(LM).with_weights(Checkpoint(server.checkpoint).model_weights())
        ours = [embed(lm, [tokens], pooling=pooling)[0] for tokens in ids]
    # llama.cpp's CPU GELU rounds its input to float16 and reads a float16 table (GGML_GELU_FP16): its
    # unit vectors stray from ours by up to a few 1e-4 (measured: 3.4e-4), their cosines 0.9999994 or more.
    theirs = np.array([item["embedding"] for item in theirs])
    assert ((theirs * np.array(ours)).sum(axis=1) > 0.99999).all()
    np.testing.assert_allclose(theirs, ours, atol=1e-3)
    if pooling is Pooling.MEAN:  # its own route's shape and its norms, through ours
        shapes = [
            httpx.post(f"{at}/embedding", json={"content": ids}, timeout=120).json()
            for at in (url, server.url)
        ]
        assert [{*item} for item in shapes[0]] == [{*item} for item in shapes[1]]
        np.testing.assert_allclose(*([item["embedding"] for item in shape] for shape in shapes), atol=1e-3)
        for norm in (-1, 0, 1, 3):
            body = {"input": ids[:1], "embd_normalize": norm}
            their = httpx.post(f"{url}/v1/embeddings", json=body, timeout=120).json()["data"][0]["embedding"]
            mine = post(server, **body)["data"][0]["embedding"]
            np.testing.assert_allclose(mine, their, atol=2e-3 * np.abs(their).max(), err_msg=f"norm {norm}")
