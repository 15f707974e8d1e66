"""Prefix reuse through the real server: MAX's prefix cache keeps each prompt's full 128-token pages of
keys and values, and a later prompt that begins alike prefills only what follows them.

`served_pages_lm` serves LM_PAGES (LM with 512 positions, so prompts span pages) with a cache of
4 * 512 / 128 pages. Each answer read from cached pages is checked against the same request
refused the cache (llama-server's `cache_prompt: false`) and against the float64 reference's
log-probabilities; `usage.prompt_tokens_details.cached_tokens` says how many prompt tokens the
cache gave, through the OpenAI client.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import pytest

from max_gpt2 import reference
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from tests.support import LM_PAGES, requires_serving
from tests.test_serve import client

pytestmark = requires_serving()

PAGE = 128  # tokens a page of MAX's cache holds (its default and smallest)
PREFIX, QUESTION, NEW_TOKENS = 300, 16, 8  # a prefix of two full pages and part of a third


@pytest.fixture(scope="module")
def server(served_pages_lm):
    return served_pages_lm


@pytest.fixture(scope="module")
def weights(server) -> dict[str, np.ndarray]:
    return Checkpoint(server.checkpoint).model_weights()


class Answer(NamedTuple):
    """A greedy completion's token ids, their log-probabilities, and the prompt tokens read from the cache."""

    ids: list[int]
    logprobs: list[float]
    cached: int


def tokens(seed: int, count: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, LM_PAGES.vocab_size, count).tolist()


def ask(server, prompt: list[int], **body: Any) -> Answer:
    """A greedy completion of `prompt` (ids) with its log-probabilities, `body` sent as extra fields."""
    answer = client(server).completions.create(
        model="gpt2",
        prompt=prompt,
        max_tokens=NEW_TOKENS,
        temperature=0,
        logprobs=1,
        extra_body={"return_token_ids": True, "ignore_eos": True, **body},
    )
    choice, details = answer.choices[0], answer.usage.prompt_tokens_details
    return Answer(choice.model_extra["token_ids"], choice.logprobs.token_logprobs, details.cached_tokens)


def assert_alike(warm: Answer, cold: Answer) -> None:
    """The answer read from cached pages is the one prefilled whole: the same ids, log-probabilities
    within float32's rounding (the pages were computed in a prefill of another length)."""
    assert warm.ids == cold.ids
    np.testing.assert_allclose(warm.logprobs, cold.logprobs, atol=1e-4)


def reference_logprobs(weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Each token's log-probability after the ones before it, by the float64 reference: [len(ids) - 1]."""
    logits, _ = reference.lm_logits_and_largest_score(np.array([ids]), weights, LM_PAGES)
    shifted = logits[0, :-1] - logits[0, :-1].max(axis=-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return logprobs[np.arange(len(ids) - 1), ids[1:]]


def test_a_prompt_that_begins_as_an_earlier_one_prefills_only_the_rest(server, weights):
    prefix = tokens(1, PREFIX)
    first = ask(server, prefix + tokens(2, QUESTION))
    assert first.cached == 0
    prompt = prefix + tokens(3, QUESTION)
    warm = ask(server, prompt)
    assert warm.cached == PREFIX // PAGE * PAGE  # the full pages the first prompt left; not the third
    cold = ask(server, prompt, cache_prompt=False)
    assert cold.cached == 0
    assert_alike(warm, cold)
    expected = reference_logprobs(weights, prompt + warm.ids)[len(prompt) - 1 :]
    np.testing.assert_allclose(warm.logprobs, expected, atol=1e-4)
    assert ask(server, prompt).cached == PREFIX // PAGE * PAGE  # the same prompt: its own pages


def test_prompts_sharing_a_prefix_answer_alike_batched(server):
    """Four requests at once over one cached prefix, beside a bad one, each as it answers prefilled whole."""
    prefix = tokens(4, PREFIX)
    ask(server, prefix + tokens(5, QUESTION))
    prompts = [prefix + tokens(10 + i, QUESTION) for i in range(4)]

    def request(i: int) -> Answer | int:
        if i == len(prompts):
            return refused(server, prefix, cache_salt="")
        return ask(server, prompts[i])

    with ThreadPoolExecutor(len(prompts) + 1) as pool:
        *warm, bad = pool.map(request, range(len(prompts) + 1))
    assert bad == 400
    for prompt, answer in zip(prompts, warm, strict=True):
        assert answer.cached == PREFIX // PAGE * PAGE
        assert_alike(answer, ask(server, prompt, cache_prompt=False))


def refused(server, prompt: list[int], **body: Any) -> int:
    """The status a request that must be refused gets."""
    import openai

    with pytest.raises(openai.BadRequestError, match="cache_salt") as error:
        ask(server, prompt, **body)
    return error.value.status_code


def test_echo_reads_no_cached_page_and_gives_every_prompt_token_its_log_probability(server, weights):
    """A kept page has no logits: a request for the prompt's log-probabilities prefills it whole, as
    vLLM does for `prompt_logprobs`."""
    prefix = tokens(6, PREFIX)
    ask(server, prefix + tokens(7, QUESTION))
    prompt = prefix + tokens(8, QUESTION)
    answer = client(server).completions.create(
        model="gpt2", prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    assert answer.usage.prompt_tokens_details.cached_tokens == 0
    served = answer.choices[0].logprobs.token_logprobs
    assert len(served) == len(prompt) + 1 and served[0] is None
    np.testing.assert_allclose(served[1 : len(prompt)], reference_logprobs(weights, prompt), atol=1e-4)


def test_a_cache_salt_shares_pages_only_with_requests_of_the_same_salt(server):
    """vLLM's `cache_salt`: pages kept under one salt are read by requests with that salt alone."""
    prefix = tokens(9, PREFIX)
    assert ask(server, prefix + tokens(20, QUESTION), cache_salt="tenant a").cached == 0
    assert ask(server, prefix + tokens(21, QUESTION), cache_salt="tenant b").cached == 0
    assert ask(server, prefix + tokens(22, QUESTION)).cached == 0
    assert ask(server, prefix + tokens(23, QUESTION), cache_salt="tenant a").cached == PREFIX // PAGE * PAGE


def test_a_run_longer_than_the_cache_evicts_the_oldest_pages_and_answers_alike(server):
    """More prompts than the cache's pages hold: the server answers each, the oldest prompt's pages
    are gone when it comes again (MAX's cache evicts the least recently used), and its answer is
    the one it had."""
    pages = int(re.search(r"(\d+) (?:huge )?pages", server.log.read_text()).group(1))  # MAX's log
    prompts = [tokens(100 + i, PREFIX + QUESTION) for i in range(pages // 2 + 2)]
    answers = [ask(server, prompt) for prompt in prompts]  # two full pages each
    assert all(answer.cached == 0 for answer in answers)
    assert len(prompts) * (PREFIX // PAGE) > pages
    again = ask(server, prompts[0])
    assert again.cached == 0
    assert_alike(again, answers[0])
    latest = ask(server, prompts[-1])
    assert latest.cached == PREFIX // PAGE * PAGE
    assert_alike(latest, answers[-1])


def test_openais_explicit_prompt_cache_with_no_breakpoint_reads_no_kept_page(server):
    """OpenAI's `prompt_cache_options`: implicit (its default), and explicit with a part marked by a
    `prompt_cache_breakpoint`, read the pages an earlier chat left, as `usage` says; explicit with none
    marked reads none, as OpenAI's caches nothing then."""
    text = "The cat sat on the mat. " * 14

    def cached(options: dict[str, Any] | None, mark: bool = False) -> int:
        part = {"type": "text", "text": text} | (
            {"prompt_cache_breakpoint": {"mode": "explicit"}} if mark else {}
        )
        answer = client(server).chat.completions.create(
            model="gpt2",
            messages=[{"role": "user", "content": [part]}],
            max_tokens=2,
            temperature=0,
            extra_body={"prompt_cache_options": options} if options else {},
        )
        return answer.usage.prompt_tokens_details.cached_tokens

    cached(None)
    assert cached(None) >= PAGE and cached({"mode": "implicit", "ttl": "30m"}) >= PAGE
    assert cached({"mode": "explicit"}, mark=True) >= PAGE
    assert cached({"mode": "explicit"}) == 0
    for mark, pages in ((True, PAGE), (False, 0)):  # the same through the Responses API
        part = {"type": "input_text", "text": text} | (
            {"prompt_cache_breakpoint": {"mode": "explicit"}} if mark else {}
        )
        answer = client(server).responses.create(
            model="gpt2",
            input=[{"role": "user", "content": [part]}],
            max_output_tokens=2,
            temperature=0,
            prompt_cache_options={"mode": "explicit"},
        )
        assert (answer.usage.input_tokens_details.cached_tokens >= PAGE) == bool(pages)
