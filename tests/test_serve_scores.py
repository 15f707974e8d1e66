"""vLLM's Score and Rerank APIs on a server of embeddings, through the real server: each pair's score is
the cosine of the two texts' mean final states computed by the float64 reference (`max_gpt2.reference`),
paired 1:1, 1:N and N:N under each of vLLM's names for the sides; reranking sorts by it and keeps
`top_n`; every refusal names its field."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from max_gpt2 import reference
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from tests.support import LM, requires_serving

pytestmark = requires_serving()

QUERY = "The cat sat on the mat."
TEXTS = ["A cat on a mat.", "Dogs bark at night", "The cat sat on the mat, again.", "Numbers: 1 2 3"]


@pytest.fixture(scope="module")
def cosine(served_embeddings_lm):
    """`cosine(a, b)`: the cosine of texts `a`'s and `b`'s mean final states, by the reference."""
    weights = Checkpoint(served_embeddings_lm.checkpoint).model_weights()
    tokenizer = load_tokenizer(served_embeddings_lm.checkpoint)

    def mean(text: str) -> np.ndarray:
        return (
            reference.lm_forward(np.array([tokenizer.encode(text).ids]), weights, LM).hidden[0].mean(axis=0)
        )

    def of(a: str, b: str) -> float:
        x, y = mean(a), mean(b)
        return float(x @ y / np.sqrt((x @ x) * (y @ y)))

    return of


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=600)


def tokens(server, *texts: str) -> int:
    tokenizer = load_tokenizer(server.checkpoint)
    return sum(len(tokenizer.encode(text).ids) for text in texts)


def test_scores_are_the_cosines_of_the_texts_vectors_paired_as_vllm_pairs_them(served_embeddings_lm, cosine):
    server = served_embeddings_lm
    cases = [
        ("/score", {"text_1": QUERY, "text_2": TEXTS}, [(QUERY, text) for text in TEXTS]),
        (
            "/v1/score",
            {"data_1": TEXTS[:2], "data_2": TEXTS[2:]},
            list(zip(TEXTS[:2], TEXTS[2:], strict=True)),
        ),
        ("/score", {"queries": [QUERY], "documents": TEXTS[0]}, [(QUERY, TEXTS[0])]),
        ("/score", {"queries": QUERY, "items": TEXTS[1:3]}, [(QUERY, text) for text in TEXTS[1:3]]),
    ]
    seen = []
    for path, body, pairs in cases:
        answer = post(server, path, {"model": "gpt2", **body})
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert got["object"] == "list" and got["id"].startswith("score-") and got["model"] == "gpt2"
        assert [(item["index"], item["object"]) for item in got["data"]] == [
            (i, "score") for i in range(len(pairs))
        ]
        expected = [cosine(a, b) for a, b in pairs]
        assert [item["score"] for item in got["data"]] == pytest.approx(expected, abs=1e-5)
        used = sum(tokens(server, a, b) for a, b in pairs)
        assert got["usage"]["prompt_tokens"] == got["usage"]["total_tokens"] == used
        seen += expected
    assert max(seen) - min(seen) > 1e-3  # the texts score apart: the comparison can fail


def test_rerank_sorts_the_documents_by_score_and_keeps_top_n(served_embeddings_lm, cosine):
    server = served_embeddings_lm
    expected = [cosine(QUERY, text) for text in TEXTS]
    order = sorted(range(len(TEXTS)), key=lambda index: -expected[index])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        answer = post(server, path, {"query": QUERY, "documents": TEXTS, "top_n": 3})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [item["index"] for item in results] == order[:3]
        assert [item["document"]["text"] for item in results] == [TEXTS[index] for index in order[:3]]
        assert [item["relevance_score"] for item in results] == pytest.approx(
            [expected[i] for i in order[:3]], abs=1e-5
        )
        assert answer.json()["usage"]["total_tokens"] == sum(tokens(server, QUERY, text) for text in TEXTS)
    every = post(server, "/rerank", {"query": QUERY, "documents": TEXTS, "return_documents": False}).json()
    assert [item["index"] for item in every["results"]] == order and "document" not in every["results"][0]


@pytest.mark.parametrize(
    ("path", "body", "field", "says"),
    [
        ("/score", {"text_1": TEXTS[:2], "text_2": TEXTS[:3]}, "text_2", "pair 1:1, 1:N or N:N"),
        ("/score", {"text_1": QUERY}, "text_1", "give one pair of sides"),
        ("/score", {"text_1": QUERY, "text_2": "a", "data_2": "b"}, "data_2", "give one pair of sides"),
        ("/score", {"text_1": [], "text_2": "a"}, "text_1", "the list holds nothing"),
        ("/score", {"text_1": "a", "text_2": "b", "instruction": "x"}, "instruction", "instruction"),
        ("/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n", "0 (every document) or more"),
        ("/rerank", {"query": "a", "documents": []}, "documents", "the list holds nothing"),
        (
            "/rerank",
            {"query": "a " * (LM.n_positions + 3), "documents": ["b"]},
            "query",
            "maximum context length",
        ),
    ],
)
def test_what_cannot_be_scored_is_refused_naming_its_field(served_embeddings_lm, path, body, field, says):
    answer = post(served_embeddings_lm, path, body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == field, answer.text
    assert says in answer.json()["error"]["message"]
