"""What clients of llama-server and vLLM call, through the real server: stop strings as OpenAI cuts
them, chat completions, tokenize, metrics, legacy logprobs, logit_bias, several names, CORS, and
nothing sent off the machine.

The session's servers (`conftest.SERVED`): `served_lm` renders chats with its checkpoint's own
template (`conftest.CHAT_TEMPLATE`) and sends its off-machine traffic to a listener of the test
session's; `served_q4_0_lm` has no template, an API key, two names and one allowed origin. What
each answer must be comes from `lm.generate` and `lm.score` on the served weights, the text from
the `tokenizers` library's stream decoder, a chat's prompt from Jinja rendering the template here,
and stop strings from the reference in `tests/test_serve_stops.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers.decoders import DecodeStream

from max_gpt2.inference.sampling import Sampler
from max_gpt2.inference.tokenizer import token_bytes
from max_gpt2.testing import END_OF_TEXT
from tests.conftest import CHAT_TEMPLATE
from tests.support import LM, requires_serving
from tests.test_serve import PROMPTS, client, complete, served
from tests.test_serve_stops import reference

pytestmark = requires_serving()
LONG = 24  # tokens: room for stop strings to fall anywhere


@pytest.fixture(scope="module")
def server(served_lm):
    return served_lm


@pytest.fixture(scope="module")
def lm(served_model):
    return served_model


@pytest.fixture(scope="module")
def tokenizer(served_tokenizer):
    return served_tokenizer


def greedy(
    lm, tokenizer, prompt_ids: list[int], new_tokens: int, **options: Any
) -> tuple[list[int], list[str]]:
    """`lm.generate`'s greedy ids after `prompt_ids` (to end-of-text, with it, as MAX lists them) and
    each one's text as a client streaming them reads it (`stream_pieces`)."""
    eos = tokenizer.token_to_id(END_OF_TEXT)
    ids = lm.generate(np.array([prompt_ids]), new_tokens, eos_token_id=eos, **options)[0, len(prompt_ids) :]
    ids = ids.tolist()
    ids = ids[: ids.index(eos) + 1] if eos in ids else ids
    return ids, stream_pieces(tokenizer, ids)


def stream_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each id's text as streamed: what it completes (the `tokenizers` library's `DecodeStream`, with no
    prompt before it), the last one also bringing what never became a whole character, so that the
    pieces join to Hugging Face's `decode` of the ids (special tokens left out)."""
    stream = DecodeStream(skip_special_tokens=True)
    pieces = [stream.step(tokenizer, token) or "" for token in ids]
    whole, shown = tokenizer.decode(ids, skip_special_tokens=True), "".join(pieces)
    assert whole.startswith(shown)
    pieces[-1] += whole[len(shown) :]
    return pieces


def post(server, route: str, body: dict[str, Any]) -> tuple[int, Any]:
    """Raw HTTP: the status and the JSON answer."""
    request = urllib.request.Request(
        f"{server.url}{route}",
        json.dumps(body).encode(),
        {
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def stop_cases(pieces: list[str]) -> list[list[str]]:
    """Stop strings taken from the text: its start, inside one token, across two, and one not in it."""
    text = "".join(pieces)
    cases = [[text[:2]]]
    inside = next((piece for piece in pieces[2:] if len(piece) >= 3), None)
    if inside:
        cases.append([inside[1:3]])
    ends = np.cumsum([len(piece) for piece in pieces])
    boundary = next(int(end) for end in ends[3:] if 0 < end < len(text) - 1)
    cases += [[text[boundary - 1 : boundary + 1]], ["\x00never", text[boundary - 1 : boundary + 1]]]
    return cases


def test_stop_strings_end_the_text_before_the_first_match_streamed_or_not(server, lm, tokenizer):
    """Wherever the match falls (the completion's start, inside a token, across two), the text ends
    before it, `stop_reason` names it, and the ids and `usage` stop at the token that completed it;
    streamed, the chunks add up to that text (none showed what the match took away); with
    `include_stop_str_in_output` the match stays; with `min_tokens` earlier matches do not count."""
    prompt_ids = tokenizer.encode(PROMPTS[1]).ids
    ids, pieces = greedy(lm, tokenizer, prompt_ids, LONG)
    assert len("".join(pieces)) > 12, "greedy text long enough to cut"
    ended = "length" if len(ids) == LONG else "stop"  # end-of-text came first
    for stops in stop_cases(pieces):
        for keep, after in ((False, 0), (True, 0), (False, 4)):
            text, kept, matched = reference(pieces, stops, keep, after)
            options = {"stop": stops, "max_tokens": LONG}
            extra = {"return_token_ids": True, "include_stop_str_in_output": keep, "min_tokens": after}
            answer = client(server).completions.create(
                model="gpt2", prompt=PROMPTS[1], temperature=0, extra_body=extra, **options
            )
            choice, case = answer.choices[0], (stops, keep, after)
            assert choice.text == text, case
            assert choice.finish_reason == ("stop" if matched else ended), case
            assert choice.model_extra["stop_reason"] == matched, case
            assert choice.model_extra["token_ids"] == ids[:kept], case
            assert answer.usage.completion_tokens == kept, case
            chunks = client(server).completions.create(
                model="gpt2", prompt=PROMPTS[1], temperature=0, stream=True, extra_body=extra, **options
            )
            chunks = [chunk.choices[0] for chunk in chunks if chunk.choices]
            assert "".join(chunk.text for chunk in chunks) == text, case
            assert [token for chunk in chunks for token in chunk.model_extra["token_ids"] or []] == ids[:kept]
            assert chunks[-1].finish_reason == choice.finish_reason


def test_a_stop_token_id_ends_the_text_without_its_own(server, lm, tokenizer):
    """vLLM's: `stop_reason` is the id, its text left out of the text (kept with
    `include_stop_str_in_output`), the id listed."""
    for prompt in PROMPTS:  # one whose greedy text has a token that writes text on its own
        ids, pieces = greedy(lm, tokenizer, tokenizer.encode(prompt).ids, 12)
        if any(pieces[1:]):
            break
    stop = next(token for token, piece in zip(ids[1:], pieces[1:], strict=True) if piece)
    end = ids.index(stop)
    for keep in (False, True):
        extra = {"stop_token_ids": [stop], "return_token_ids": True, "include_stop_str_in_output": keep}
        answer = client(server).completions.create(
            model="gpt2", prompt=prompt, max_tokens=12, temperature=0, extra_body=extra
        )
        choice = answer.choices[0]
        assert choice.model_extra["token_ids"] == ids[: end + 1]
        assert choice.text == tokenizer.decode(ids[: end + (1 if keep else 0)], skip_special_tokens=True)
        assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("stop", stop)


def render(
    messages: list[dict[str, str]], template: str = CHAT_TEMPLATE, add_generation_prompt: bool = True
) -> str:
    """A chat template rendered as Hugging Face renders one (a sandboxed Jinja, blocks trimmed)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return environment.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt
    )


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The cat sat on"}]


def test_chat_renders_the_checkpoints_template_and_answers_as_our_model(server, lm, tokenizer):
    """The answer is `lm.generate`'s after the rendered prompt; streamed, the role first, then the same
    text; n, stop and max_completion_tokens apply; logprobs come in the chat shape, `lm.score`'s."""
    prompt_ids = tokenizer.encode(render(MESSAGES)).ids
    ids, pieces = greedy(lm, tokenizer, prompt_ids, 10)
    chat = client(server).chat.completions.create(
        model="gpt2", messages=MESSAGES, temperature=0, max_completion_tokens=10, n=2,
        logprobs=True, top_logprobs=4, extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert [choice.message.content for choice in chat.choices] == ["".join(pieces)] * 2
    assert chat.choices[0].message.role == "assistant" and chat.object == "chat.completion"
    assert chat.choices[0].model_extra["token_ids"] == ids
    assert chat.usage.prompt_tokens == len(prompt_ids) and chat.usage.completion_tokens == 2 * len(ids)
    scores = lm.score(np.array([prompt_ids + ids]), top_k=4)
    for position, entry in enumerate(chat.choices[0].logprobs.content):
        at = len(prompt_ids) + position
        assert entry.token == tokenizer.decode([ids[position]], skip_special_tokens=False)
        assert entry.bytes == list(token_bytes(tokenizer, ids[position]))
        assert entry.logprob == pytest.approx(float(scores.logprobs[0, at]), abs=1e-4)
        assert [top.logprob for top in entry.top_logprobs] == pytest.approx(
            scores.top_logprobs[0, at].tolist(), abs=1e-4
        )
        names = [tokenizer.decode([token], skip_special_tokens=False) for token in scores.top_ids[0, at]]
        assert [top.token for top in entry.top_logprobs] == names
    chunks = list(
        client(server).chat.completions.create(
            model="gpt2", messages=MESSAGES, temperature=0, max_tokens=10, stream=True
        )
    )
    opening = chunks[0].choices[0].delta  # the role alone first, as OpenAI and vLLM send it
    assert (opening.role, opening.content, chunks[0].object) == ("assistant", "", "chat.completion.chunk")
    assert all(chunk.choices[0].delta.role is None for chunk in chunks[1:] if chunk.choices)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == "".join(
        pieces
    )
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    text, _, matched = reference(pieces, [pieces[4][:1] or "x"], False, 0)
    stopped = client(server).chat.completions.create(
        model="gpt2", messages=MESSAGES, temperature=0, max_tokens=10, stop=[pieces[4][:1] or "x"]
    )
    assert (
        stopped.choices[0].message.content == text
        and stopped.choices[0].model_extra["stop_reason"] == matched
    )
    held = client(server).chat.completions.create(  # each token's text held back: it may begin the stop
        model="gpt2",
        messages=MESSAGES,
        temperature=0,
        max_tokens=10,
        stream=True,
        stop=["".join(pieces) + "\x07"],
    )
    deltas = [chunk.choices[0].delta for chunk in held if chunk.choices]
    assert deltas[1:-1] and all(delta.content == "" for delta in deltas[1:-1])  # as OpenAI's, not `{}`
    assert deltas[-1].content == "".join(pieces)  # released at the end


def test_chat_refuses_bad_messages_naming_them_and_a_server_without_a_template(server, served_q4_0_lm):
    for messages, says in [
        ([{"role": "user"}], "messages[0].content: required"),
        (
            [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}],
            "messages[1].role: must be one of",
        ),
        ([{"content": "hi"}], "messages[0].role: required"),
    ]:
        status, answer = post(server, "/v1/chat/completions", {"model": "gpt2", "messages": messages})
        assert (status, answer["error"]["param"]) == (400, "messages") and says in answer["error"]["message"]
    status, answer = post(served_q4_0_lm, "/v1/chat/completions", {"model": "gpt2", "messages": MESSAGES})
    assert status == 400 and "--chat-template" in answer["error"]["message"]


def test_tokenize_and_detokenize_take_llama_servers_and_vllms_requests(server, tokenizer):
    text = "The cat sat on the mat."
    ids = tokenizer.encode(text).ids
    assert post(server, "/tokenize", {"content": text}) == (
        200,
        {"tokens": ids, "count": len(ids), "max_model_len": LM.n_positions},
    )
    _, pieces = post(server, "/tokenize", {"content": text, "with_pieces": True})
    assert [piece["id"] for piece in pieces["tokens"]] == ids
    assert "".join(piece["piece"] for piece in pieces["tokens"]) == text
    _, vllm = post(server, "/tokenize", {"model": "gpt2", "prompt": text, "return_token_strs": True})
    assert vllm["tokens"] == ids and vllm["token_strs"] == [tokenizer.id_to_token(token) for token in ids]
    _, chat = post(server, "/tokenize", {"messages": MESSAGES})
    assert chat["tokens"] == tokenizer.encode(render(MESSAGES)).ids
    eos = tokenizer.token_to_id(END_OF_TEXT)
    _, back = post(server, "/detokenize", {"tokens": [*ids, eos]})
    assert back["content"] == back["prompt"] == text + END_OF_TEXT
    status, refused = post(server, "/detokenize", {"tokens": [1, LM.vocab_size + 5]})
    assert status == 400 and refused["error"]["message"].startswith("tokens[1]: ")
    status, refused = post(server, "/tokenize", {"content": "a", "prompt": "b"})
    assert status == 400 and "give one of content" in refused["error"]["message"]


def test_completion_logprobs_are_openais_legacy_shape_streamed_or_not(server, lm, tokenizer):
    """`tokens`, `token_logprobs` (`lm.score`'s), 20 alternatives keyed by text, `text_offset` into the
    text; the streamed chunks' lists add up to the same, offsets counting from the text's start."""
    prompt_ids = tokenizer.encode(PROMPTS[0]).ids
    ids, pieces = greedy(lm, tokenizer, prompt_ids, 8)
    choice = complete(server, PROMPTS[0], max_tokens=8, logprobs=20).choices[0]
    logprobs = choice.logprobs
    assert logprobs.tokens == [tokenizer.decode([token], skip_special_tokens=False) for token in ids]
    assert logprobs.text_offset == [len("".join(pieces[:i])) for i in range(len(ids))]
    scores = lm.score(np.array([prompt_ids + ids]), top_k=20)
    generated = range(len(prompt_ids), len(prompt_ids) + len(ids))
    np.testing.assert_allclose(logprobs.token_logprobs, scores.logprobs[0, generated], atol=1e-4)
    for top, at, token in zip(logprobs.top_logprobs, generated, ids, strict=True):
        # The 20 likeliest by id and the chosen one, keyed by text: ids that decode alike share a key.
        by_id = dict(zip(scores.top_ids[0, at].tolist(), scores.top_logprobs[0, at].tolist(), strict=True))
        by_id[token] = float(scores.logprobs[0, at])
        wanted = {tokenizer.decode([each], skip_special_tokens=False): value for each, value in by_id.items()}
        assert top == pytest.approx(wanted, abs=1e-4)
    streamed = [
        chunk.choices[0].logprobs
        for chunk in complete(server, PROMPTS[0], max_tokens=8, logprobs=20, stream=True)
    ]
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        joined = [value for chunk in streamed if chunk for value in getattr(chunk, field)]
        assert (
            joined == pytest.approx(getattr(logprobs, field))
            if field == "token_logprobs"
            else joined == getattr(logprobs, field)
        )


def test_logit_bias_gives_lm_generates_tokens_with_the_same_bias(server, lm, tokenizer):
    prompt_ids = tokenizer.encode(PROMPTS[2]).ids
    plain, _ = greedy(lm, tokenizer, prompt_ids, 8)
    bias = {plain[1]: -100.0, 65: 7.5}
    biased, _ = greedy(lm, tokenizer, prompt_ids, 8, sampler=Sampler(logit_bias=bias))
    assert biased != plain
    extra = {"return_token_ids": True}
    for stream in (False, True):
        answer = client(server).completions.create(
            model="gpt2", prompt=PROMPTS[2], max_tokens=8, temperature=0, stream=stream,
            logit_bias={str(token): value for token, value in bias.items()}, extra_body=extra,
        )  # fmt: skip
        chunks = [chunk.choices[0] for chunk in answer if chunk.choices] if stream else answer.choices
        assert [token for chunk in chunks for token in served(chunk).ids] == biased
    pairs = [[plain[1], False], [65, 7.5]]  # llama-server's form, `false` a ban
    answer = client(server).completions.create(
        model="gpt2",
        prompt=PROMPTS[2],
        max_tokens=8,
        temperature=0,
        extra_body={**extra, "logit_bias": pairs},
    )
    assert served(answer.choices[0]).ids == biased
    answer = client(server).completions.create(
        model="gpt2", prompt=PROMPTS[2], max_tokens=8, temperature=0, logprobs=1,
        logit_bias={str(token): value for token, value in bias.items()},
    )  # fmt: skip
    scores = lm.score(np.array([prompt_ids + biased])).logprobs[0, len(prompt_ids) :]  # the model's own
    np.testing.assert_allclose(answer.choices[0].logprobs.token_logprobs, scores, atol=1e-4)


def listening_ports(group: int) -> set[int]:
    """The TCP ports the processes of process group `group` listen on (from /proc)."""
    inodes = set()
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(status.read_text().rsplit(")", 1)[1].split()[2]) != group:
                continue
            inodes |= {os.readlink(fd) for fd in (status.parent / "fd").iterdir()}
        except (OSError, ValueError, IndexError):
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and f"socket:[{fields[9]}]" in inodes:  # 0A: listening
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def metric(text: str, name: str) -> float:
    """The value of the Prometheus sample `name` (its labels included), 0 where there is none yet."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.rsplit(" ", 1)[0] == name)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc")
def test_metrics_are_on_the_api_port_in_prometheus_text_and_no_other_port_is_open(server):
    def scrape() -> str:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain")
            return answer.read().decode()

    # Earlier tests' requests reach MAX's metrics process a moment after their answers: wait until
    # the counts stand still, so that what grows below is this test's alone.
    def tokens_and_requests(text: str) -> tuple[float, float]:
        answered = 'maxserve_request_count_total{code="200",path="/v1/completions"}'
        return metric(text, "maxserve_num_output_tokens_total"), metric(text, answered)

    # MAX's gauges come from the model worker a moment after a step, and its queue depth shows in
    # the one scrape after each update only: seen in any scrape since this request, they are served.
    gauges = {
        "maxserve_num_requests_running",
        "maxserve_num_requests_queued",
        "maxserve_cache_num_used_blocks",
    }
    complete(server, PROMPTS[0], max_tokens=1)  # MAX sets its gauges at a first request: run alone too
    before, settle = scrape(), time.monotonic() + 15
    seen = {name for name in gauges if f"\n{name} " in before}
    while time.monotonic() < settle:
        time.sleep(1)
        again = scrape()
        seen |= {name for name in gauges if f"\n{name} " in again}
        steady = tokens_and_requests(again) == tokens_and_requests(before)
        before = again
        if steady and seen == gauges:
            break
    assert seen == gauges, gauges - seen
    answers = [complete(server, prompt, max_tokens=5) for prompt in PROMPTS]
    post(server, "/v1/completions", {"prompt": "x", "top_p": 3})  # a 400
    made = sum(answer.usage.completion_tokens for answer in answers)
    counted = {
        'maxserve_request_count_total{code="200",path="/v1/completions"}': len(PROMPTS),
        'maxserve_request_count_total{code="400",path="/v1/completions"}': 1,
        "maxserve_num_output_tokens_total": made,
        "maxserve_time_to_first_token_milliseconds_count": len(PROMPTS),
        "maxserve_time_per_output_token_milliseconds_count": len(PROMPTS),
    }
    deadline = time.monotonic() + 30  # MAX's metrics process records them as they reach it
    while True:
        after = scrape()
        grown = {name: metric(after, name) - metric(before, name) for name in counted}
        if grown == counted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert grown == counted
    ours = {
        name: metric(after, name)
        for name in ("maxserve_num_output_tokens_total", "maxserve_num_requests_running")
    }
    assert {  # the same series under vLLM's and llama-server's names, which their dashboards read
        "maxserve_num_output_tokens_total": metric(after, 'vllm:generation_tokens_total{model_name="gpt2"}'),
        "maxserve_num_requests_running": metric(after, "llamacpp:requests_processing"),
    } == ours and metric(after, "llamacpp:tokens_predicted_total") == ours["maxserve_num_output_tokens_total"]
    first_token_s = metric(after, 'vllm:time_to_first_token_seconds_sum{model_name="gpt2"}')
    assert first_token_s == pytest.approx(
        metric(after, "maxserve_time_to_first_token_milliseconds_sum") / 1000
    )
    assert listening_ports(server.process.pid) == {server.port}


def test_two_names_are_served_cors_answers_the_allowed_origin_and_the_key_still_holds(served_q4_0_lm, server):
    import openai

    keyed = served_q4_0_lm
    assert [model.id for model in client(keyed).models.list()] == ["gpt2", "gpt2-q4"]
    answer = client(keyed).completions.create(model="gpt2-q4", prompt="q", max_tokens=2)
    assert answer.model == "gpt2-q4" and answer.choices[0].finish_reason == "length"
    with pytest.raises(openai.NotFoundError, match="serves 'gpt2', 'gpt2-q4'"):
        client(keyed).completions.create(model="gpt2-xl", prompt="q", max_tokens=2)
    page = "http://page.example"
    preflight = urllib.request.Request(
        f"{keyed.url}/v1/chat/completions",
        method="OPTIONS",
        headers={
            "Origin": page,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    with urllib.request.urlopen(preflight) as answered:  # no key: a browser sends none with a preflight
        assert answered.status == 200 and answered.headers["Access-Control-Allow-Origin"] == page
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{keyed.url}/v1/models", headers={"Origin": page}))
    assert refused.value.code == 401 and refused.value.headers["Access-Control-Allow-Origin"] == page
    unallowed = urllib.request.Request(f"{server.url}/v1/models", headers={"Origin": page})
    with urllib.request.urlopen(unallowed) as answered:  # CORS is off by default
        assert "Access-Control-Allow-Origin" not in answered.headers


def test_nothing_leaves_the_machine_unless_asked(server, telemetry_listener):
    """`served_lm` sends its proxied HTTP(S) and OpenTelemetry traffic to the session's listener, which
    after all its requests has seen nothing; the same listener does see MAX's start-up telemetry log
    when it is sent (what `--telemetry` would allow), so the check can fail."""
    complete(server, PROMPTS[0], max_tokens=2)
    assert telemetry_listener.received == []
    send = "\n".join(
        [
            "from max.serve.telemetry.common import send_telemetry_log",
            "try:",
            "    send_telemetry_log('gpt2')",
            "except Exception:",
            "    pass",
        ]
    )
    subprocess.run(
        [sys.executable, "-c", send], env={**os.environ, **telemetry_listener.environment()}, timeout=120
    )
    assert any(b"telemetry.modular.com" in received for received in telemetry_listener.received)


def test_a_burst_of_chats_tokenizations_and_bad_bodies_leaves_every_good_answer_right(server, lm, tokenizer):
    """48 requests at once over the new routes, every third a bad one of a kind in turn: the bad get their
    400, the good their answers (chats against `lm.generate`), and the server answers on."""
    prompt_ids = tokenizer.encode(render(MESSAGES)).ids
    _, pieces = greedy(lm, tokenizer, prompt_ids, 6)
    text_ids = tokenizer.encode(PROMPTS[3]).ids
    bad = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}),
        ("/v1/chat/completions", {"messages": MESSAGES, "n": 99}),
        ("/tokenize", {"content": 5}),
        ("/detokenize", {"tokens": [-1]}),
        ("/v1/chat/completions", {"messages": MESSAGES, "continue_final_message": True}),
    ]

    def request(i: int) -> Any:
        if i % 3 == 2:
            route, body = bad[(i // 3) % len(bad)]
            return post(server, route, body)[0]
        if i % 6 == 1:
            return post(server, "/tokenize", {"prompt": PROMPTS[3]})[1]["tokens"]
        chat = dict(model="gpt2", messages=MESSAGES, temperature=0, max_tokens=6, stream=bool(i % 4))
        answer = client(server).chat.completions.create(**chat)
        if not chat["stream"]:
            return answer.choices[0].message.content
        return "".join(chunk.choices[0].delta.content or "" for chunk in answer if chunk.choices)

    with ThreadPoolExecutor(48) as pool:
        results = list(pool.map(request, range(48)))
    for i, result in enumerate(results):
        assert result == (400 if i % 3 == 2 else text_ids if i % 6 == 1 else "".join(pieces)), i
    assert served(complete(server, PROMPTS[2]).choices[0]).ids  # and on it goes


FIELDS = [
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "n", "stop", "stream", "stream_options", "logprobs", "top_logprobs", "echo", "logit_bias", "seed",
    "min_tokens", "stop_token_ids", "include_stop_str_in_output", "content", "tokens", "with_pieces",
    "add_special", "return_token_ids", "response_format", "structured_outputs", "json_schema", "grammar",
    "cache_salt", "cache_prompt", "unknown_field",
]  # fmt: skip
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**66), 2**66)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
SMALL = st.one_of(st.integers(-3, 60), st.sampled_from([[1, 2], "ab", [{"role": "user", "content": "x"}]]))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]),
    body=st.dictionaries(st.sampled_from(FIELDS), SMALL | JSON, max_size=6),
)
def test_no_body_gets_a_5xx_or_stops_the_server(server, route, body):
    """Bodies of the routes' fields (and others) with values of any JSON type: each is answered, a 2xx or
    a 4xx, never a 5xx, and a stream never carries an error."""
    request = urllib.request.Request(f"{server.url}{route}", json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            status, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    assert status < 500, (body, text)
    assert '"error"' not in text or status >= 400, (body, text)
