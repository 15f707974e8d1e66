"""llama-server's `post_sampling_probs`, through the real server: the probabilities of what each token was
drawn from (after the cuts, the temperature and a picker), in llama-server's entries (`prob`,
`top_probs`), on `/completion` in llama-server's chain order, on the OpenAI routes in MAX's (the
temperature first). Each is checked against this test's own cut of the served weights' logits, written
here from llama.cpp's and vLLM's definitions; where llama.cpp is built (`LLAMA_CPP`), against
llama-server's own answer on the same weights."""

from __future__ import annotations

import numpy as np
import pytest

from max_gpt2.inference.tokenizer import END_OF_TEXT
from tests.support import requires_serving
from tests.test_serve import PROMPTS
from tests.test_serve_native import post

pytestmark = requires_serving()


def softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()


def kept_in_llama_order(row: np.ndarray, top_k: int, top_p: float, min_p: float, temperature: float):
    """llama.cpp's default chain on `row` [V]: the `top_k` highest, then the likeliest until their
    probability reaches `top_p`, then those at least `min_p` times the likeliest's, then tempered: the
    ids kept, likeliest first, and their probabilities."""
    ids = np.argsort(-row, kind="stable")[:top_k]
    p = softmax(row[ids])
    ids = ids[: int(np.searchsorted(np.cumsum(p), top_p)) + 1]
    ids = ids[softmax(row[ids]) >= min_p * softmax(row[ids]).max()]
    return ids, softmax(row[ids] / temperature)


def kept_in_max_order(row: np.ndarray, temperature: float, top_p: float):
    """vLLM's and MAX's order: tempered first, then the likeliest until their probability reaches `top_p`."""
    ids = np.argsort(-row, kind="stable")
    p = softmax(row[ids] / temperature)
    ids = ids[: int(np.searchsorted(np.cumsum(p), top_p)) + 1]
    return ids, softmax(row[ids] / temperature)


def check_entries(entries, rows_kept, alternatives: int) -> int:
    """Each entry is the drawn token's probability in what its row kept, and its likeliest alternatives
    in order; the largest number of tokens a row kept (so that a test shows more than one)."""
    widest = 0
    for entry, (ids, p) in zip(entries, rows_kept, strict=True):
        assert "logprob" not in entry and "top_logprobs" not in entry, entry
        assert entry["id"] in ids.tolist(), (entry["id"], ids)
        assert entry["prob"] == pytest.approx(p[ids.tolist().index(entry["id"])], abs=2e-4)
        shown = entry["top_probs"]
        assert [each["id"] for each in shown] == ids[:alternatives].tolist()
        assert [each["prob"] for each in shown] == pytest.approx(p[:alternatives].tolist(), abs=2e-4)
        widest = max(widest, len(ids))
    return widest


def test_completion_reports_what_llama_servers_chain_drew_from(served_lm, served_model, served_tokenizer):
    """`/completion` at temperature 0.7 with top-k 5 (and llama-server's top-p 0.95 and min-p 0.05): each
    token's entry is its probability among what the chain kept, renormalised at the temperature, with
    those tokens, at most `n_probs`, as its `top_probs`; 0-probability tokens are left out."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0.7, "top_k": 5, "n_probs": 8, "seed": 3}
    body |= {"post_sampling_probs": True, "ignore_eos": True, "return_tokens": True}
    status, answer = post(served_lm, "/completion", body)
    assert status == 200, answer
    ids, kept = list(prompt), []
    for token in answer["tokens"]:
        row = served_model.logits(np.array([ids]))[0, -1].astype(np.float64)
        row[eos] = -np.inf  # `ignore_eos`, as llama-server bans it
        kept.append(kept_in_llama_order(row, 5, 0.95, 0.05, 0.7))
        ids.append(token)
    assert check_entries(answer["completion_probabilities"], kept, 8) > 1


def test_greedy_draws_its_token_alone(served_lm):
    """At temperature 0 llama-server's chain keeps the likeliest alone: probability 1, no alternative."""
    body = {"prompt": PROMPTS[0], "n_predict": 3, "temperature": 0, "n_probs": 5, "post_sampling_probs": True}
    status, answer = post(served_lm, "/completion", {**body, "return_tokens": True})
    assert status == 200, answer
    for token, entry in zip(answer["tokens"], answer["completion_probabilities"], strict=True):
        assert entry["id"] == token and entry["prob"] == 1.0
        assert [(each["id"], each["prob"]) for each in entry["top_probs"]] == [(token, 1.0)]


def test_mirostat_reports_the_tokens_it_drew_among(served_lm, served_model, served_tokenizer):
    """Mirostat 2.0's first token (mu twice tau) is drawn among the likeliest whose surprise, -log2 p at
    the temperature, is within mu, renormalised: those are its `top_probs` (tau set midway between the
    third and fourth likeliest's surprises, so that three are)."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1].astype(np.float64) / 0.9
    row[eos] = -np.inf
    p = softmax(row)
    ids = np.argsort(-p, kind="stable")
    tau = float(-np.log2(p[ids[2]]) - np.log2(p[ids[3]])) / 4
    body = {"prompt": prompt, "n_predict": 1, "mirostat": 2, "mirostat_tau": tau, "temperature": 0.9}
    body |= {"n_probs": 20, "post_sampling_probs": True, "ignore_eos": True, "seed": 5}
    status, answer = post(served_lm, "/completion", body)
    assert status == 200, answer
    ids = ids[-np.log2(p[ids]) <= 2 * tau]
    assert check_entries(answer["completion_probabilities"], [(ids, p[ids] / p[ids].sum())], 20) == 3


def test_openai_routes_report_what_maxs_order_drew_from(served_lm, served_model, served_tokenizer):
    """`/v1/completions` and chat, where the temperature comes before the cuts: each token's entries, in
    llama-server's shape, are its probability among what top-p keeps of the tempered distribution."""
    prompt = served_tokenizer.encode(PROMPTS[1]).ids
    fields = {"temperature": 1.3, "top_p": 0.6, "seed": 2, "post_sampling_probs": True, "ignore_eos": True}
    body = {"prompt": prompt, "max_tokens": 3, "logprobs": 6, "return_token_ids": True, **fields}
    status, answer = post(served_lm, "/v1/completions", body)
    assert status == 200, answer
    choice, ids, kept = answer["choices"][0], list(prompt), []
    for token in choice["token_ids"]:
        kept.append(
            kept_in_max_order(served_model.logits(np.array([ids]))[0, -1].astype(np.float64), 1.3, 0.6)
        )
        ids.append(token)
    assert check_entries(choice["logprobs"]["content"], kept, 6) > 1
    chat = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 2, "logprobs": True}
    status, answer = post(served_lm, "/v1/chat/completions", {**chat, "top_logprobs": 4, **fields})
    assert status == 200, answer
    for entry in answer["choices"][0]["logprobs"]["content"]:
        assert 0 < entry["prob"] <= 1 and len(entry["top_probs"]) <= 4 and "logprob" not in entry, entry
        assert sum(each["prob"] for each in entry["top_probs"]) <= 1 + 1e-6


def test_post_sampling_probs_with_echo_is_refused(served_lm):
    body = {"prompt": PROMPTS[0], "max_tokens": 1, "logprobs": 1, "echo": True, "post_sampling_probs": True}
    status, answer = post(served_lm, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "post_sampling_probs", answer


def test_llama_servers_post_sampling_probs_are_ours(served_lm, llama_server, served_tokenizer):
    """The same request to llama-server on the same weights: the same tokens kept, the same order, the
    same probabilities (llama.cpp's float16 GELU moves its logits by about 1e-3); greedy too."""
    prompt = served_tokenizer.encode(PROMPTS[1]).ids
    for fields in ({"temperature": 0.8, "top_k": 6, "min_p": 0.0}, {"temperature": 0.0}):
        body = {"prompt": prompt, "n_predict": 1, "n_probs": 10, "post_sampling_probs": True, **fields}
        body |= {"ignore_eos": True, "seed": 1}
        answers = [post(server, "/completion", body) for server in (served_lm, llama_server)]
        assert all(status == 200 for status, _ in answers), answers
        ours, theirs = (answer["completion_probabilities"][0]["top_probs"] for _, answer in answers)
        assert [each["id"] for each in ours] == [each["id"] for each in theirs], (ours, theirs)
        assert [each["prob"] for each in ours] == pytest.approx([each["prob"] for each in theirs], abs=5e-3)
        assert {key for each in ours for key in each} == {key for each in theirs for key in each}
