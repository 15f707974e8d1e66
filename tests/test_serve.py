"""Our GPT-2 behind MAX's own server: `max-gpt2 serve` started for real, real HTTP requests.

One server for the session (it compiles the paged-cache graph and MAX's sampler:
minutes on 2 cores, so `conftest.py` starts it as soon as the tests are
collected), on a checkpoint of LM's shapes with a tokenizer, so that what it
returns can be checked against `lm.generate` on the same weights. The session
stops it at the end whatever happened. What needs no server is in `test_serve_offline.py`.
Everything skips, saying why, where MAX's serving extra is not installed
(`pip install -e '.[serve]'`; `make test` installs it).
"""

from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import pytest

from max_gpt2.bench.server import ServerProcess
from max_gpt2.inference.tokenizer import load_tokenizer
from max_gpt2.model.checkpoints.checkpoint import Checkpoint
from max_gpt2.testing import END_OF_TEXT
from tests.support import LM, requires_serving

pytestmark = requires_serving()

PROMPTS = ["The cat sat on", "Attention is all", "q", "What every head does"]
NEW_TOKENS = 12


def complete(server: ServerProcess, prompt: str, **options: Any) -> Any:
    """A completion (greedy unless `options` say otherwise) through the OpenAI client, with the token
    ids (MAX's and vLLM's extension)."""
    options = {"max_tokens": NEW_TOKENS, "temperature": 0, **options}
    return client(server).completions.create(
        model="gpt2", prompt=prompt, extra_body={"return_token_ids": True}, **options
    )


def client(server: ServerProcess) -> Any:
    """The OpenAI client for `server`, with its API key if it has one."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key or "none", max_retries=0)


@pytest.fixture(scope="module")
def server(served_lm) -> ServerProcess:
    return served_lm


class Completion(NamedTuple):
    """The token ids after a prompt, and the text a client reads for them."""

    ids: list[int]
    text: str


@pytest.fixture(scope="module")
def lm(compiled_lm, server):
    """`lm.generate`'s model with the served checkpoint's weights."""
    return compiled_lm(LM).with_weights(Checkpoint(server.checkpoint).model_weights())


@pytest.fixture(scope="module")
def expected(lm, server) -> dict[str, Completion]:
    """What `lm.generate` (greedy) writes after each prompt, stopping at end-of-text as MAX does.

    The text is Hugging Face's `decode` of those ids (special tokens left out): random weights
    pick bytes that are not UTF-8, which it writes as U+FFFD.
    """
    tokenizer = load_tokenizer(server.checkpoint)
    eos = tokenizer.token_to_id(END_OF_TEXT)
    completions = {}
    for prompt in PROMPTS:
        prompt_ids = tokenizer.encode(prompt).ids
        new = lm.generate(np.array([prompt_ids]), NEW_TOKENS, eos_token_id=eos)[0, len(prompt_ids) :].tolist()
        new = new[: new.index(eos)] if eos in new else new
        completions[prompt] = Completion(new, tokenizer.decode(new, skip_special_tokens=True))
    assert sum(len(completion.text) for completion in completions.values()) > 10  # not vacuous
    return completions


def served(choice: Any) -> Completion:
    return Completion(choice.model_extra["token_ids"] or [], choice.text)


def test_greedy_completions_are_what_our_model_generates(server, expected):
    for prompt in PROMPTS:
        assert served(complete(server, prompt).choices[0]) == expected[prompt], prompt


def test_prompt_lookup_keeps_the_servers_output_and_drafts_where_text_repeats(server, lm):
    """The server drafts by prompt lookup (`--prompt-lookup 8`): a prompt that repeats itself, alone and
    beside three more, gets `lm.generate`'s greedy tokens, and the server's log says it kept some of
    the tokens it drafted (random weights soon repeat their own text too)."""
    tokenizer = load_tokenizer(server.checkpoint)
    prompts = ["The cat sat on the mat. The cat", *PROMPTS[1:]]
    eos, lengths, expected = tokenizer.token_to_id(END_OF_TEXT), [], []
    for i, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt).ids
        length = LM.n_positions - len(ids) - 2 * i  # to the context's end, or near it
        lengths.append(length)
        new = lm.generate(np.array([ids]), length, eos_token_id=eos)[0, len(ids) :].tolist()
        expected.append(new[: new.index(eos) + 1] if eos in new else new)  # MAX's ids end with it
    logged = len(server.log.read_text(errors="replace"))
    assert served(complete(server, prompts[0], max_tokens=lengths[0]).choices[0]).ids == expected[0]
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = pool.map(
            lambda i: served(complete(server, prompts[i], max_tokens=lengths[i]).choices[0]).ids, range(4)
        )
        assert list(got) == expected
    lines = server.log.read_text(errors="replace")[logged:].splitlines()
    kept = [int(line.split(" kept ")[1].split()[0]) for line in lines if "prompt lookup: request" in line]
    assert any(kept), server.tail(40)


def test_concurrent_requests_each_get_their_own_completion(server, expected):
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        choices = list(pool.map(lambda prompt: complete(server, prompt).choices[0], PROMPTS * 2))
    assert [served(choice) for choice in choices] == [expected[prompt] for prompt in PROMPTS * 2]


def test_streaming_sends_the_completion_as_it_comes(server, expected):
    """The tokens arrive over several chunks, in order, with the text a streaming decoder writes. Not
    one a chunk: MAX hands the API process whatever tokens are ready when it reads, and on a loaded
    machine (the whole suite on 2 cores, two servers and the prewarm compiling) 12 tokens once came
    in 6 chunks."""
    prompt = PROMPTS[1]
    chunks = [chunk.choices[0] for chunk in complete(server, prompt, stream=True) if chunk.choices]
    ids = [served(chunk).ids for chunk in chunks]
    assert [token for chunk in ids for token in chunk] == expected[prompt].ids
    assert sum(1 for chunk in ids if chunk) >= 2  # not the whole completion at its end
    assert "".join(chunk.text for chunk in chunks) == expected[prompt].text


def test_requests_arriving_while_others_decode_get_the_tokens_they_get_alone(server, expected):
    """In-flight batching: prompts of different lengths join the steps of requests already decoding
    (a batch of up to GPT2MemoryPlanner's size), and each gets `lm.generate`'s tokens, to its own length."""
    cases = [(prompt, 4 + 4 * (i % 3)) for i, prompt in enumerate(PROMPTS * 3)]

    def late_request(i: int) -> list[int]:
        time.sleep(0.05 * i)
        prompt, max_tokens = cases[i]
        return served(complete(server, prompt, max_tokens=max_tokens).choices[0]).ids

    with ThreadPoolExecutor(len(cases)) as pool:
        got = list(pool.map(late_request, range(len(cases))))
    # Guards the stale cache-length copy GPT2PipelineModel.execute waits for: under load it once gave a
    # request a wrong last token here (docs/performance.md).
    assert got == [expected[prompt].ids[:max_tokens] for prompt, max_tokens in cases], server.tail(80)


def test_sampled_requests_beside_greedy_ones_leave_them_their_tokens(server, expected, lm):
    """A step with a sampled request runs MAX's sampler; an all-greedy one takes the argmax on the host
    (`GPT2TextGenerationPipeline`). Mixed in one batch, the greedy requests still get `lm.generate`'s
    tokens and the sampled ones tokens of the vocabulary, not all the greedy ones."""
    with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
        greedy = pool.map(lambda prompt: served(complete(server, prompt).choices[0]), PROMPTS)
        sampled = pool.map(
            lambda prompt: served(complete(server, prompt, temperature=1.0, top_p=0.9).choices[0]), PROMPTS
        )
        assert list(greedy) == [expected[prompt] for prompt in PROMPTS]
        sampled = list(sampled)
    for completion in sampled:
        assert 0 < len(completion.ids) <= NEW_TOKENS
        assert all(0 <= token < lm.config.vocab_size for token in completion.ids)
    # Random weights spread the next token's probability thin: 48 draws are not all the argmax.
    assert [completion.ids for completion in sampled] != [expected[prompt].ids for prompt in PROMPTS]


def test_a_client_that_leaves_mid_stream_frees_its_place(server, expected):
    """A streamed request dropped after two tokens is cancelled; the others finish right, and then
    as many requests as a batch holds are answered together."""
    stream = client(server).completions.create(
        model="gpt2", prompt=PROMPTS[0], max_tokens=LM.n_positions - 8, temperature=0, stream=True
    )
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        others = pool.map(lambda prompt: served(complete(server, prompt).choices[0]), PROMPTS)
        for _, _ in zip(range(2), stream, strict=False):
            pass
        stream.close()  # the connection is dropped here
        assert list(others) == [expected[prompt] for prompt in PROMPTS]
    with ThreadPoolExecutor(16) as pool:
        choices = list(pool.map(lambda prompt: complete(server, prompt).choices[0], PROMPTS * 4))
    assert [served(choice) for choice in choices] == [expected[prompt] for prompt in PROMPTS * 4]


def test_logprobs_are_our_models_with_the_true_top_alternatives(server, expected, lm):
    tokenizer = load_tokenizer(server.checkpoint)
    for prompt in PROMPTS[:2]:
        choice = complete(server, prompt, logprobs=3).choices[0]
        prompt_ids, new = tokenizer.encode(prompt).ids, expected[prompt].ids
        ours = lm.score(np.array([prompt_ids + new]), top_k=3)
        generated = range(len(prompt_ids), len(prompt_ids) + len(new))
        served_logprobs = choice.logprobs.token_logprobs[: len(new)]  # an end-of-text token may follow
        np.testing.assert_allclose(served_logprobs, ours.logprobs[0, generated], atol=1e-4)
        for top, position in zip(choice.logprobs.top_logprobs, generated, strict=False):
            # By id, likeliest first, the chosen token added if not among them; then OpenAI's layout
            # keys them by their text (special tokens spelled out): ids that decode alike share a key,
            # the later one's value kept.
            by_id = dict(
                zip(ours.top_ids[0, position].tolist(), ours.top_logprobs[0, position].tolist(), strict=True)
            )
            by_id[(prompt_ids + new)[position]] = float(ours.logprobs[0, position])
            names = {token: tokenizer.decode([token], skip_special_tokens=False) for token in by_id}
            wanted = {names[token]: value for token, value in by_id.items()}
            assert top.keys() == wanted.keys()
            assert [top[key] for key in wanted] == pytest.approx(list(wanted.values()), abs=1e-4)


def test_echo_gives_the_prompts_log_probabilities(server, lm):
    """What lm-evaluation-harness reads: the prompt's tokens, the first null, then the new token's."""
    tokenizer = load_tokenizer(server.checkpoint)
    prompt_ids = tokenizer.encode(PROMPTS[3]).ids
    for prompt in (PROMPTS[3], prompt_ids):  # as text and as token ids, as the harness sends it
        choice = complete(server, prompt, echo=True, logprobs=1, max_tokens=1).choices[0]
        new = served(choice).ids
        ours = lm.logprobs(np.array([prompt_ids + new]))[0]
        served_logprobs = choice.logprobs.token_logprobs
        assert len(served_logprobs) == len(prompt_ids) + 1
        assert served_logprobs[0] is None or np.isnan(served_logprobs[0])
        np.testing.assert_allclose(served_logprobs[1:], ours[1:], atol=1e-4)


def test_echo_with_no_new_tokens_gives_the_prompt_alone(server, lm):
    """OpenAI's and vLLM's `echo` with `max_tokens: 0`, a scorer's way: the prompt's text and its tokens'
    log-probabilities alone (the first null), streamed too; without `echo`, 0 stays refused."""
    import openai

    tokenizer = load_tokenizer(server.checkpoint)
    prompt_ids = tokenizer.encode(PROMPTS[3]).ids
    answer = complete(server, PROMPTS[3], echo=True, logprobs=1, max_tokens=0)
    choice = answer.choices[0]
    assert choice.text == PROMPTS[3] and len(choice.logprobs.token_logprobs) == len(prompt_ids)
    np.testing.assert_allclose(
        choice.logprobs.token_logprobs[1:], lm.logprobs(np.array([prompt_ids]))[0, 1:], atol=1e-4
    )
    assert served(choice).ids == [] and answer.usage.completion_tokens == 1  # made, as vLLM counts it
    chunks = list(complete(server, PROMPTS[3], echo=True, logprobs=1, max_tokens=0, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == PROMPTS[3]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        complete(server, PROMPTS[3], max_tokens=0)


def test_requests_it_cannot_answer_get_a_400_and_the_server_goes_on(server, expected):
    import openai

    with pytest.raises(openai.BadRequestError, match="logprobs"):
        complete(server, PROMPTS[0], logprobs=21)  # vLLM's most is 20
    with pytest.raises(
        openai.BadRequestError, match=f"maximum context length is {LM.n_positions} tokens"
    ) as e:
        complete(server, "word " * LM.n_positions, echo=True, logprobs=1, max_tokens=1)
    assert (e.value.code, e.value.param) == ("context_length_exceeded", "prompt")  # OpenAI's code
    assert e.value.body["n_ctx"] == LM.n_positions  # and llama-server's numbers
    with pytest.raises(openai.BadRequestError, match="messages: This model's maximum context length is") as e:
        client(server).chat.completions.create(
            model="gpt2", messages=[{"role": "user", "content": "word " * LM.n_positions}], max_tokens=1
        )
    assert (e.value.code, e.value.param) == ("context_length_exceeded", "messages")
    assert served(complete(server, PROMPTS[2]).choices[0]) == expected[PROMPTS[2]]


def test_the_head_explorer_is_served_beside_the_api(server, lm):
    """`--explorer`: the page at /explore/, and explorations from the served checkpoint's own weights."""
    import json
    import urllib.error
    import urllib.request

    with urllib.request.urlopen(f"{server.url}/explore/", timeout=60) as page:
        assert page.status == 200 and b'"api": "/explore"' in page.read()
    request = urllib.request.Request(
        f"{server.url}/explore/api/explore", json.dumps({"text": PROMPTS[0]}).encode(), method="POST"
    )
    deadline = time.monotonic() + 900  # its model loads once the page is first asked for
    while True:
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                explored = json.loads(answer.read())
                break
        except urllib.error.HTTPError as error:
            assert error.code == 503 and "still loading" in json.loads(error.read())["error"], error.code
            assert time.monotonic() < deadline
            time.sleep(1)
    ids = np.array([token["id"] for token in explored["tokens"]])
    assert explored["text"] == PROMPTS[0] and len(ids) > 1
    served_map = urllib.request.urlopen(f"{server.url}/explore/api/map?id={explored['id']}&layer=2&head=1")
    weights = np.frombuffer(base64.b64decode(json.loads(served_map.read())["data"]), np.uint8)
    expected_map = np.rint(lm.attentions(ids[None])[2, 0, 1] * 255).astype(np.uint8).ravel()
    assert np.abs(weights.astype(int) - expected_map).max() <= 1  # the same weights, computed apart
    assert served(complete(server, PROMPTS[2]).choices[0]).ids  # and completions go on
