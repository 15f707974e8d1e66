"""What a client may ask of `max-gpt2 serve`, against a running server through the real OpenAI client.

Bad requests get a 4xx naming the field and leave the server serving the same ids; the options it
honours give the ids of a greedy loop over the float64 reference's logits with the option applied,
written here (Hugging Face's repetition penalty, OpenAI's frequency and presence penalties, a minimum
length banning the stop ids), independent of MAX's sampler and of `max_gpt2.inference.logit_controls`;
the API key of the second server (`conftest.SERVED`) is asked of every request but `/health`.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from max_gpt2 import reference
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.testing import END_OF_TEXT
from tests.support import LM, requires_serving
from tests.test_serve import NEW_TOKENS, PROMPTS, Completion, client, complete, served

pytestmark = requires_serving()

# What the client sent, and more: each bad request, the status it gets, and what its message names.
BAD: list[tuple[dict[str, Any], int, str]] = [
    ({"prompt": [1, 2, 10_000_000]}, 400, "token id 10000000 at position 2 is outside"),
    ({"prompt": "word " * LM.n_positions}, 400, f"maximum context length is {LM.n_positions} tokens"),
    ({"prompt": []}, 400, "prompt: the list holds nothing"),
    ({"prompt": ""}, 400, "prompt: empty"),
    ({"max_tokens": -2}, 400, "max_tokens: must be at least 1"),
    ({"temperature": -1}, 400, "temperature: must be between 0 and 2"),
    ({"top_p": 2}, 400, "top_p: must be between 0 and 1"),
    ({"n": 0}, 400, "n: must be 1 to 16"),
    ({"best_of": 2}, 400, "best_of"),
    ({"logit_bias": {"999": 10}}, 400, "logit_bias: '999' is not a token id of the vocabulary (0 to 319)"),
    ({"suffix": "the end"}, 400, "suffix"),
    ({"seed": 2**70}, 400, "seed: must fit in 64 bits"),
    ({"stop": ["x", ""]}, 400, "stop[1]: empty"),
    ({"extra_body": {"include_stop_str_in_output": "maybe"}}, 400, "include_stop_str_in_output: Input"),
    ({"extra_body": {"repetition_penalty": -1}}, 400, "repetition_penalty: must be above 0"),
    ({"extra_body": {"min_tokens": 20}, "max_tokens": 4}, 400, "min_tokens: 20 is more than max_tokens"),
    ({"extra_body": {"cache_salt": ""}}, 400, "cache_salt: String should have at least 1 character"),
    ({"extra_body": {"cache_prompt": "maybe"}}, 400, "cache_prompt: Input should be a valid boolean"),
    ({"model": "gpt-4"}, 404, "model: 'gpt-4' is not served here"),
    ({"logit_bias": {"\u00b2": 1}}, 400, "logit_bias: '\u00b2' is not a token id"),  # digits, not ASCII ones
    ({"extra_body": {"stop_token_ids": [7, 320]}}, 400, "stop_token_ids[1]: 320 is not a token id"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options: only with stream: true"),
    ({"extra_body": {"modalities": ["text", "audio"]}}, 400, "modalities: GPT-2 reads and writes text"),
    ({"prompt": ["hi", "word " * LM.n_positions]}, 400, "prompt[1]: "),
]


@pytest.fixture(scope="module")
def server(served_lm):
    return served_lm


@pytest.fixture(scope="module")
def weights(server) -> dict[str, np.ndarray]:
    return Checkpoint(server.checkpoint).model_weights()


@pytest.fixture(scope="module")
def tokenizer(server):
    return load_tokenizer(server.checkpoint)


@pytest.fixture(scope="module")
def expected(server, weights, tokenizer) -> dict[str, Completion]:
    """What the server answers each prompt (greedy, `NEW_TOKENS`) before any bad request, which is
    the reference's greedy text."""
    eos = {tokenizer.token_to_id(END_OF_TEXT)}
    answers = {prompt: served(complete(server, prompt).choices[0]) for prompt in PROMPTS}
    for prompt, answer in answers.items():
        wanted = reference_greedy(weights, tokenizer.encode(prompt).ids, NEW_TOKENS, eos)
        assert answer.ids == wanted, prompt
    return answers


def reference_greedy(
    weights: dict[str, np.ndarray],
    prompt: list[int],
    new_tokens: int,
    stop_ids: set[int],
    repetition: float = 1.0,
    frequency: float = 0.0,
    presence: float = 0.0,
    min_tokens: int = 0,
) -> list[int]:
    """The ids a greedy loop over the float64 reference's logits picks with these options, up to and
    with a stop id (listed as MAX lists it)."""
    ids, new = list(prompt), []
    for _ in range(new_tokens):
        logits, _ = reference.lm_logits_and_largest_score(np.array([ids]), weights, LM)
        row = logits[0, -1].copy()  # float64 [V]
        for token in set(ids):  # Hugging Face: prompt and output, once per id
            row[token] = row[token] * repetition if row[token] < 0 else row[token] / repetition
        for token in set(new):  # OpenAI: the output only
            row[token] -= new.count(token) * frequency + presence
        if len(new) < min_tokens:
            row[[token for token in stop_ids if token < len(row)]] = -np.inf
        second, first = np.sort(row)[-2:]
        # float32 logits of this small model are within ~1e-6 of float64's: a closer pair may swap.
        assert first - second > 2e-5, "a near tie: float32 may pick either; choose another prompt"
        new.append(int(np.argmax(row)))
        ids.append(new[-1])
        if new[-1] in stop_ids:
            break
    return new


def ask(server, prompt: Any, **options: Any) -> Any:
    """`complete`, with MAX's own fields (`top_k`, `min_tokens`, ...) sent in the body as the client
    sends unknown ones."""
    body = options.pop("extra_body", {})
    return client(server).completions.create(
        model=options.pop("model", "gpt2"),
        prompt=prompt,
        **{"max_tokens": 10, "temperature": 0, **options},
        extra_body={"return_token_ids": True, **body},
    )


def refusal(server, change: dict[str, Any]) -> tuple[int, str]:
    """The status and message a bad request gets (it must get one)."""
    import openai

    change = dict(change)
    try:
        ask(server, change.pop("prompt", PROMPTS[0]), **change)
    except openai.APIStatusError as error:
        return error.status_code, error.message
    raise AssertionError(f"{change} was served")


def test_each_bad_request_gets_a_4xx_naming_the_field_and_the_server_goes_on(server, expected):
    for change, status, says in BAD:
        got_status, message = refusal(server, change)
        assert (got_status, says in message) == (status, True), (change, message)
        assert served(complete(server, PROMPTS[2]).choices[0]) == expected[PROMPTS[2]], change


def test_routes_gpt2_cannot_answer_get_404_and_health_stays_open(server):
    import openai

    with pytest.raises(openai.NotFoundError, match="not served here"):
        client(server).embeddings.create(model="gpt2", input="hi")
    with urllib.request.urlopen(f"{server.url}/health") as response:
        assert response.status == 200


def test_64_concurrent_requests_every_fourth_bad_leave_every_good_one_right(server, expected):
    """More clients than a batch holds, every fourth request bad (each kind in turn) and every other
    good one streamed: the bad ones get their 4xx, the good ones their ids, and the server goes on."""
    import openai

    def request(i: int) -> Completion | tuple[int, bool]:
        prompt = PROMPTS[i % len(PROMPTS)]
        if i % 4 == 3:
            change, _, says = BAD[(i // 4) % len(BAD)]
            got_status, message = refusal(server, change)
            return got_status, says in message
        if i % 2:
            chunks = [chunk.choices[0] for chunk in complete(server, prompt, stream=True) if chunk.choices]
            return Completion([t for c in chunks for t in served(c).ids], "".join(c.text for c in chunks))
        return served(complete(server, prompt).choices[0])

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(request, range(64)))
    for i, result in enumerate(results):
        wanted = (BAD[(i // 4) % len(BAD)][1], True) if i % 4 == 3 else expected[PROMPTS[i % len(PROMPTS)]]
        assert result == wanted, i
    assert served(complete(server, PROMPTS[2]).choices[0]) == expected[PROMPTS[2]]
    with pytest.raises(openai.BadRequestError):  # and bad ones are still refused, not crashed on
        ask(server, [1, 2, 10_000_000])


@pytest.mark.parametrize(
    "options",
    [
        {"repetition_penalty": 1.5},
        {"frequency_penalty": 1.5},
        {"presence_penalty": 1.2},
        {"repetition_penalty": 1.3, "frequency_penalty": 0.7, "presence_penalty": -0.5},
    ],
    ids=str,
)
def test_penalties_give_the_reference_greedy_loops_ids(server, weights, tokenizer, options):
    eos = {tokenizer.token_to_id(END_OF_TEXT)}
    names = {
        "repetition_penalty": "repetition",
        "frequency_penalty": "frequency",
        "presence_penalty": "presence",
    }
    penalties = {names[name]: value for name, value in options.items()}
    openais = {name: value for name, value in options.items() if name != "repetition_penalty"}
    maxs = {name: value for name, value in options.items() if name == "repetition_penalty"}
    for prompt in PROMPTS[:2]:
        prompt_ids = tokenizer.encode(prompt).ids
        wanted = reference_greedy(weights, prompt_ids, 10, eos, **penalties)
        assert wanted != reference_greedy(weights, prompt_ids, 10, eos)  # the option changes something
        assert served(ask(server, prompt, extra_body=maxs, **openais).choices[0]).ids == wanted, prompt


def test_min_tokens_bans_the_stop_ids_until_then(server, weights, tokenizer):
    """A stop id the plain greedy text reaches at its second token: with `min_tokens` 5 it cannot end
    before 5 tokens, as Hugging Face's `min_new_tokens` bans end-of-text."""
    eos = tokenizer.token_to_id(END_OF_TEXT)
    prompt_ids = tokenizer.encode(PROMPTS[0]).ids
    stop = reference_greedy(weights, prompt_ids, 10, {eos})[1]
    assert reference_greedy(weights, prompt_ids, 10, {eos, stop})[-1] == stop
    wanted = reference_greedy(weights, prompt_ids, 10, {eos, stop}, min_tokens=5)
    assert len(wanted) >= 5
    choice = ask(server, PROMPTS[0], extra_body={"min_tokens": 5, "stop_token_ids": [stop]}).choices[0]
    assert served(choice).ids == wanted
    plain = ask(server, PROMPTS[0], extra_body={"stop_token_ids": [stop]}).choices[0]
    assert served(plain).ids == reference_greedy(weights, prompt_ids, 10, {eos, stop})


def test_n_gives_each_prompt_n_choices_and_counts_its_tokens_once(server, expected, tokenizer):
    answer = ask(server, PROMPTS[:2], n=2, max_tokens=12)
    assert [served(choice) for choice in answer.choices] == [expected[p] for p in PROMPTS[:2] for _ in (0, 1)]
    assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]
    assert answer.usage.prompt_tokens == sum(len(tokenizer.encode(p).ids) for p in PROMPTS[:2])
    sampled = ask(server, PROMPTS[0], n=4, temperature=1.0)  # no seed: four draws of their own
    assert len({tuple(served(choice).ids) for choice in sampled.choices}) > 1


def test_a_top_k_past_the_vocabulary_is_every_token_and_text_modalities_are_what_is_done(server, expected):
    """vLLM's: a `top_k` of more tokens than the vocabulary holds (320) is the whole vocabulary (2**31 once
    took the worker's memory until the kernel killed it); OpenAI's default `modalities: ["text"]` is
    accepted."""
    seeded = {"temperature": 1.0, "seed": 11, "max_tokens": 12}
    every = served(ask(server, PROMPTS[0], **seeded, extra_body={"top_k": 320}).choices[0])
    for top_k in (2**31, 2**70):
        assert served(ask(server, PROMPTS[0], **seeded, extra_body={"top_k": top_k}).choices[0]) == every
    text = ask(server, PROMPTS[2], max_tokens=NEW_TOKENS, extra_body={"modalities": ["text"]}).choices[0]
    assert served(text) == expected[PROMPTS[2]]


def test_seed_zero_is_a_seed(server):
    draws = [served(ask(server, PROMPTS[1], temperature=1.0, seed=0).choices[0]).ids for _ in range(2)]
    assert draws[0] == draws[1]


def test_the_api_key_is_asked_of_every_request_but_health(served_q4_0_lm):
    import openai

    server = served_q4_0_lm
    assert server.api_key
    outsider = openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        outsider.completions.create(model="gpt2", prompt="q", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        outsider.models.list()
    request = urllib.request.Request(f"{server.url}/v1/models")  # no key at all
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 401
    with urllib.request.urlopen(f"{server.url}/health") as response:
        assert response.status == 200
    assert len(served(complete(server, "q", max_tokens=2).choices[0]).ids) == 2
