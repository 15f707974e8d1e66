"""llama-server's own routes, through the real server, as its clients call them: `POST /completion`
(whole, streamed, stop words, `n_probs`, what it refuses, payloads written for several backends),
`GET /props`, and the aliases of the OpenAI routes llama-server also answers. What each answer must be
comes from `lm.generate` and `lm.score` on the served weights and the `tokenizers` library's decode;
the shapes from llama-server's own (`tools/server/server-task.cpp`), and where llama.cpp is built
(`LLAMA_CPP`), from llama-server itself answering the same requests on the same weights."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from max_gpt2.bench.server import stop_group
from max_gpt2.inference.sampler_chain import LOWEST, STEPS, chain
from max_gpt2.inference.tokenizer import END_OF_TEXT
from tests.conftest import CHAT_TEMPLATE
from tests.llama_cpp import llama_server_on
from tests.support import LM, requires_serving
from tests.test_serve import PROMPTS
from tests.test_serve_api import render, stream_pieces

pytestmark = requires_serving()


def post(server, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """The status and JSON answer of `POST path` (for a stream: the list of its events' JSON)."""
    request = urllib.request.Request(
        f"{server.url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            if not body.get("stream"):
                return response.status, json.loads(text)
            lines = [line for line in text.splitlines() if line.strip()]
            assert all(line.startswith("data: ") for line in lines), lines
            return response.status, [json.loads(line.removeprefix("data: ")) for line in lines]
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def greedy(lm, tokenizer, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], list[str]]:
    """`lm.generate`'s greedy ids after `prompt_ids`, end-of-text ignored, and each one's streamed text."""
    ids = lm.generate(np.array([prompt_ids]), new_tokens, eos_token_id=None)[0, len(prompt_ids) :].tolist()
    return ids, stream_pieces(tokenizer, ids)


def test_completion_answers_as_llama_server_with_the_models_tokens(served_lm, served_model, served_tokenizer):
    prompt_ids = served_tokenizer.encode(PROMPTS[1]).ids
    ids, pieces = greedy(served_model, served_tokenizer, prompt_ids, 9)
    body = {"prompt": PROMPTS[1], "n_predict": 9, "temperature": 0, "return_tokens": True, "ignore_eos": True}
    for path in ("/completion", "/completions"):
        status, answer = post(served_lm, path, body)
        assert status == 200, answer
        assert (answer["content"], answer["tokens"]) == ("".join(pieces), ids)
        assert (answer["stop"], answer["stop_type"], answer["stopping_word"]) == (True, "limit", "")
        assert (answer["tokens_predicted"], answer["tokens_evaluated"]) == (9, len(prompt_ids))
        assert answer["prompt"] == PROMPTS[1] and answer["timings"]["predicted_n"] == 9
        settings = answer["generation_settings"]
        assert (settings["n_predict"], settings["temperature"], settings["n_ctx"]) == (9, 0, LM.n_positions)
        assert set(answer["timings"]) >= {"cache_n", "prompt_n", "prompt_ms", "predicted_per_second"}
    streamed = {**body, "stream": True, "return_tokens": False}  # streamed events carry their ids anyway
    status, events = post(served_lm, "/completion", streamed)  # no `[DONE]`: every line JSON
    assert status == 200 and [event["stop"] for event in events] == [False] * (len(events) - 1) + [True]
    assert "".join(event["content"] for event in events) == "".join(pieces)
    assert [token for event in events for token in event["tokens"]] == ids
    assert [len(event["tokens"]) for event in events] == [1] * 9 + [0]  # one an event, as llama-server
    assert events[-1]["stop_type"] == "limit" and events[-1]["tokens_predicted"] == 9
    word = pieces[5].strip() or pieces[5]  # a stop word: the text ends before it, llama-server's "word"
    status, stopped = post(served_lm, "/completion", {**body, "stop": word})  # a string: one stop word
    cut = "".join(pieces).index(word)
    assert (stopped["content"], stopped["stop_type"], stopped["stopping_word"]) == (
        "".join(pieces)[:cut],
        "word",
        word,
    )


def test_n_probs_are_the_models_log_probabilities(served_lm, served_model, served_tokenizer):
    prompt_ids = served_tokenizer.encode(PROMPTS[0]).ids
    ids, _ = greedy(served_model, served_tokenizer, prompt_ids, 4)
    status, answer = post(
        served_lm,
        "/completion",
        {"prompt": prompt_ids, "n_predict": 4, "temperature": 0, "n_probs": 3, "ignore_eos": True},
    )
    assert status == 200, answer
    probabilities = answer["completion_probabilities"]
    scores = served_model.score(np.array([prompt_ids + ids]), top_k=3)
    for position, entry in enumerate(probabilities):
        at = len(prompt_ids) + position
        assert entry["id"] == ids[position] and entry["token"] == served_tokenizer.decode([ids[position]])
        assert entry["logprob"] == pytest.approx(float(scores.logprobs[0, at]), abs=1e-4)
        assert [top["id"] for top in entry["top_logprobs"]] == scores.top_ids[0, at].tolist()
        assert [top["logprob"] for top in entry["top_logprobs"]] == pytest.approx(
            scores.top_logprobs[0, at].tolist(), abs=1e-4
        )


def llama_penalised_greedy(
    lm, prompt: list[int], new_tokens: int, penalties: dict[str, float], eos: int | None
) -> list[int]:
    """Greedy ids after `prompt` with llama.cpp's penalties, by this test's own loop: each token among
    the last `repeat_last_n` of prompt and text divided (or, at 0 and below, multiplied) by
    `repeat_penalty`, then less its count times `frequency_penalty` and `presence_penalty` once; the
    end-of-text id `eos`, where given, never picked (llama-server's `ignore_eos`)."""
    ids = list(prompt)
    for _ in range(new_tokens):
        row = lm.logits(np.array([ids]))[0, -1].astype(np.float64)
        if eos is not None:
            row[eos] = -np.inf
        window = ids[-int(penalties["repeat_last_n"]) :]
        for token in set(window):
            row[token] = (
                row[token] * penalties["repeat_penalty"]
                if row[token] <= 0
                else row[token] / penalties["repeat_penalty"]
            )
            row[token] -= window.count(token) * penalties["frequency_penalty"] + penalties["presence_penalty"]
        ids.append(int(np.argmax(row)))
    return ids[len(prompt) :]


PENALTIES = {"repeat_penalty": 1.5, "repeat_last_n": 6, "frequency_penalty": 0.6, "presence_penalty": 0.4}


def test_penalties_count_the_last_repeat_last_n_tokens_of_prompt_and_text(
    served_lm, served_model, served_tokenizer
):
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    plain = post(served_lm, "/completion", body)[1]["tokens"]
    for penalties in (PENALTIES, {**PENALTIES, "repeat_last_n": 40}):
        status, answer = post(served_lm, "/completion", {**body, **penalties})
        assert status == 200, answer
        assert answer["tokens"] == llama_penalised_greedy(served_model, prompt, 12, penalties, eos) != plain
        assert {name: answer["generation_settings"][name] for name in penalties} == penalties
    # At /v1/completions llama-server's fields count as llama-server counts; without them, OpenAI's way.
    v1 = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    status, answer = post(served_lm, "/v1/completions", {**v1, **PENALTIES, "return_token_ids": True})
    assert answer["choices"][0]["token_ids"] == llama_penalised_greedy(
        served_model, prompt, 12, PENALTIES, None
    )


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"mirostat": 1}, "mirostat", "mirostat: 2 (Mirostat 2.0) or 0 (off) here; got 1"),
        ({"dry_multiplier": 0.8}, "dry_multiplier", "no such sampler"),
        ({"typical_p": "x"}, "typical_p", "typical_p: Input should be a valid number"),
        ({"repeat_last_n": -2}, "repeat_last_n", "-1 (the whole context), 0 (none) or more; got -2"),
        ({"n_predict": 0}, "n_predict", "-1 (to the context's end) or at least 1"),
        ({"n_probs": 50}, "n_probs", "n_probs: must be 0 to 20"),
        ({"max_tokens": "many"}, "max_tokens", "max_tokens: Input should be a valid integer"),
        ({"echo": True}, "echo", "/v1/completions echoes the prompt"),
        ({"prompt": "word " * LM.n_positions}, "prompt", "maximum context length is"),
    ],
)
def test_completion_refuses_what_it_cannot_honour_naming_llama_servers_field(served_lm, change, field, says):
    status, answer = post(served_lm, "/completion", {"prompt": PROMPTS[0], "n_predict": 2, **change})
    assert (status, answer["error"]["param"]) == (400, field) and says in answer["error"]["message"]
    if field == "prompt":  # llama-server's numbers beside OpenAI's code, which its web page reads
        assert answer["error"]["code"] == "context_length_exceeded"
        assert answer["error"]["n_ctx"] == LM.n_positions < answer["error"]["n_prompt_tokens"]


def test_a_payload_written_for_several_backends_runs_as_llama_server_reads_it(
    served_lm, served_model, served_tokenizer
):
    """Fields llama-server does not read are ignored, as there; `samplers` leaving a sampler out turns it
    off (here every cut: temperature 0 alone is greedy); an empty grammar is none; `n` is `n_cmpl`."""
    prompt_ids = served_tokenizer.encode(PROMPTS[2]).ids
    ids, _ = greedy(served_model, served_tokenizer, prompt_ids, 6)
    payload = {
        "prompt": PROMPTS[2], "n_predict": 6, "max_new_tokens": 6, "max_length": 1024, "ban_eos_token": False,
        "temperature": 0, "top_k": 3, "samplers": ["temperature"], "grammar": "", "rep_pen": 1, "tfs": 1,
        "typical_p": 1, "api_type": "llamacpp", "ignore_eos": True, "return_tokens": True, "n": 2,
    }  # fmt: skip
    status, answers = post(served_lm, "/completion", payload)
    assert status == 200, answers
    assert [(answer["index"], answer["tokens"]) for answer in answers] == [(0, ids), (1, ids)]
    assert answers[0]["generation_settings"]["samplers"] == ["temperature"]
    assert answers[0]["generation_settings"]["top_k"] == 0  # left out: off


def test_samplers_left_off_and_their_parameters_are_taken(served_lm):
    off = {"mirostat": 0, "mirostat_tau": 5, "typical_p": 1, "dry_multiplier": 0, "dry_base": 1.75}
    off |= {"repeat_penalty": 1.1, "repeat_last_n": -1, "id_slot": 0, "n_keep": 4, "seed": 7}
    status, answer = post(served_lm, "/completion", {"prompt": PROMPTS[0], "n_predict": 3, **off})
    assert status == 200 and answer["tokens_predicted"] == 3
    again = post(served_lm, "/completion", {"prompt": PROMPTS[0], "n_predict": 3, **off})[1]
    assert again["content"] == answer["content"]  # seeded: the same sample


CHAIN = {"top_k": 0, "top_p": 0.5, "min_p": 0.0, "temperature": 0.3}  # orders apart on this model


def chain_sets(lm, tokenizer) -> tuple[set[int], set[int]]:
    """The first tokens llama-server's chain keeps for `CHAIN` after `PROMPTS[1]`, and those cutting after
    the temperature (MAX's and vLLM's order) keeps; a check that those apart are likely enough to show."""
    row = lm.logits(np.array([tokenizer.encode(PROMPTS[1]).ids]))[0, -1]
    llama = np.flatnonzero(chain(row, [(name, CHAIN[name]) for name in STEPS if name in CHAIN]) > LOWEST)
    theirs = set(np.flatnonzero(chain(row, [("temperature", 0.3), ("top_p", 0.5)]) > LOWEST).tolist())
    odds = np.exp(row[llama] / 0.3 - (row[llama] / 0.3).max())
    beyond = odds[[token not in theirs for token in llama]].sum() / odds.sum()
    assert beyond > 0.2, "the prompt's logits show the two orders apart"  # 48 draws miss all: < 1e-4
    return set(llama.tolist()), theirs


def test_samples_come_from_llama_servers_chain_cuts_before_the_temperature(
    served_lm, served_model, served_tokenizer
):
    """At temperature 0.3 with top-p, llama-server cuts at the model's own temperature, then tempers:
    every first token sampled is one its chain keeps (`sampler_chain`, checked against a reference of
    llama.cpp's definitions in `tests/test_sampler_chain.py`, and against llama-server's own draws
    below), and tokens come that cutting after the temperature would never give; with `samplers`
    putting the temperature first, only those."""
    llama, theirs = chain_sets(served_model, served_tokenizer)
    for order, allowed, some_beyond in ((None, llama, True), ("tkp", theirs, False)):
        seen = set()
        for seed in range(3):
            body = {"prompt": PROMPTS[1], "n_predict": 1, **CHAIN, "seed": seed, "n_cmpl": 16}
            status, answers = post(
                served_lm, "/completion", {**body, "samplers": order, "return_tokens": True}
            )
            assert status == 200, answers
            seen |= {token for answer in answers for token in answer["tokens"][:1]}
        assert seen <= allowed and bool(seen - theirs) == some_beyond, (order, seen)


def test_ignore_eos_bans_the_end_of_text_as_llama_server_where_vllms_goes_past_it(
    served_lm, served_tokenizer
):
    eos = served_tokenizer.token_to_id(END_OF_TEXT)
    pushed = {
        "prompt": PROMPTS[0],
        "n_predict": 4,
        "temperature": 0,
        "ignore_eos": True,
        "return_tokens": True,
    }
    status, answer = post(served_lm, "/completion", {**pushed, "logit_bias": [[eos, 100]]})
    assert status == 200 and eos not in answer["tokens"] and answer["stop_type"] == "limit"
    v1 = {
        "prompt": PROMPTS[0],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    status, answer = post(served_lm, "/v1/completions", {**v1, "logit_bias": {str(eos): 100}})
    assert answer["choices"][0]["token_ids"] == [eos] * 4


TYPICAL = {"typical_p": 0.3, "top_n_sigma": 1.0}  # each keeps other tokens than the argmax at times
CHAIN_STEP = {"typical_p": "typ_p", "top_n_sigma": "top_n_sigma"}  # each field's step in the chain
DEFAULTS = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.7}  # llama-server's, tempered


LLAMA_DEFAULTS = [("top_k", 40), ("top_p", 0.95), ("min_p", 0.05)]


@pytest.mark.parametrize(
    ("fields", "steps"),
    [
        (TYPICAL, [("top_n_sigma", 1.0), ("top_k", 40), ("typ_p", 0.3), ("top_p", 0.95), ("min_p", 0.05)]),
        ({"xtc_probability": 1.0, "xtc_threshold": 0.02}, [*LLAMA_DEFAULTS, ("xtc", 1.0, 0.02)]),
    ],
    ids=["top_n_sigma, typical_p", "xtc"],
)
def test_the_samplers_only_llama_servers_chain_has_run_in_it(
    served_lm, served_model, served_tokenizer, fields, steps
):
    """Greedy, the chain's temperature 0 takes the likeliest of what top-n-sigma and typical-p keep, or
    what XTC leaves of the top choices, which need not be the argmax: the tokens are this test's loop
    over the model's logits through the chain (XTC's probability 1: its draw always falls within)."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    body = {"prompt": prompt, "n_predict": 10, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    ids, cut_argmax = list(prompt), 0
    for _ in range(10):
        row = served_model.logits(np.array([ids]))[0, -1]
        row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
        ids.append(int(np.argmax(chain(row, steps, chance=0.0))))
        cut_argmax += ids[-1] != int(np.argmax(row))
    status, answer = post(served_lm, "/completion", {**body, **fields})
    assert status == 200 and answer["tokens"] == ids[len(prompt) :] and cut_argmax > 0, answer
    drawn = post(served_lm, "/completion", {**body, **fields, "temperature": 0.7, "seed": 3, "n_cmpl": 8})
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST
    kept = set(np.flatnonzero(chain(row, steps, chance=0.0) > LOWEST).tolist())
    assert {answer["tokens"][0] for answer in drawn[1]} <= kept


def test_mirostat_2_picks_each_token_as_llama_cpps_from_the_seeds_draws(
    served_lm, served_model, served_tokenizer
):
    """Mirostat 2.0 after the temperature, llama.cpp's whole chain then: the tokens are this test's loop
    over the model's logits through llama.cpp's Mirostat (`tests/test_sampler_chain.mirostat_reference`),
    mu from twice tau, the draw for a request's n-th token `np.random.default_rng([seed, n]).random()`."""
    from tests.test_sampler_chain import mirostat_reference

    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    tau, eta, temperature, seed = 3.0, 0.5, 0.8, 11
    ids, mu, not_argmax = list(prompt), 2 * tau, 0
    for n in range(8):
        row = served_model.logits(np.array([ids]))[0, -1]
        row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
        draw = float(np.random.default_rng([seed, n]).random())
        token, mu = mirostat_reference(chain(row, [("temperature", temperature)]), tau, eta, mu, draw)
        ids.append(token)
        not_argmax += token != int(np.argmax(row))
    body = {"prompt": prompt, "n_predict": 8, "mirostat": 2, "mirostat_tau": tau, "mirostat_eta": eta}
    body |= {"temperature": temperature, "seed": seed, "ignore_eos": True, "return_tokens": True}
    body |= {"repeat_penalty": 1.5, "top_k": 1}  # left out of llama.cpp's chain beside Mirostat
    status, answer = post(served_lm, "/completion", body)
    assert status == 200 and answer["tokens"] == ids[len(prompt) :] and not_argmax > 0, answer


def test_props_health_and_the_routes_llama_server_also_answers(served_lm):
    with urllib.request.urlopen(f"{served_lm.url}/props") as response:
        props = json.loads(response.read())
    assert props["default_generation_settings"]["n_ctx"] == LM.n_positions
    settings = props["default_generation_settings"]["params"]
    assert (settings["temperature"], settings["top_k"], settings["n_predict"]) == (0.8, 40, -1)
    assert (settings["typical_p"], settings["top_n_sigma"], settings["mirostat"]) == (1.0, -1.0, 0)
    assert props["chat_template"] == CHAT_TEMPLATE and props["model_alias"] == "gpt2", props
    assert props["total_slots"] == 16  # the batch a CPU decodes (`memory_planner.CPU_BATCH_SIZE`)
    for path in ("/health", "/v1/health"):
        with urllib.request.urlopen(f"{served_lm.url}{path}") as response:
            assert json.loads(response.read()) == {"status": "ok"}
    with urllib.request.urlopen(f"{served_lm.url}/models") as response:
        assert [model["id"] for model in json.loads(response.read())["data"]] == ["gpt2"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    status, answer = post(served_lm, "/chat/completions", chat)
    assert status == 200 and answer["object"] == "chat.completion"
    assert (
        answer["choices"][0]["message"]
        == post(served_lm, "/v1/chat/completions", chat)[1]["choices"][0]["message"]
    )
    assert post(served_lm, "/apply-template", chat)[1] == {"prompt": render(chat["messages"])}  # Jinja, here


def whole_characters(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.fixture(scope="module")
def llama_server(served_lm, tmp_path_factory):
    """llama.cpp's llama-server on the served weights, as the GGUF file `max-gpt2 convert` writes."""
    directory = tmp_path_factory.mktemp("llama-server")
    process, url = llama_server_on(served_lm.checkpoint, directory, "-c", str(LM.n_positions), "-np", "1")
    try:
        yield SimpleNamespace(url=url)
    finally:
        stop_group(process.pid, process.poll)


def test_completion_and_props_answer_as_llama_server_itself_answers(served_lm, llama_server):
    """The same request to both on the same weights: the same greedy tokens, text, stop type and counts,
    every key of llama-server's answer that its README documents, and its /props keys clients read."""
    body = {"prompt": PROMPTS[1], "n_predict": 8, "temperature": 0, "return_tokens": True, "ignore_eos": True}
    for request in (body, {**body, "stop": [" "]}, {**body, **PENALTIES}):
        ours, theirs = (
            post(served_lm, "/completion", request)[1],
            post(llama_server, "/completion", request)[1],
        )
        same = (
            "content",
            "tokens",
            "stop",
            "stop_type",
            "stopping_word",
            "tokens_predicted",
            "tokens_evaluated",
        )
        assert {key: ours[key] for key in same} == {key: theirs[key] for key in same}, (ours, theirs)
        documented = {
            "has_new_line",
            "truncated",
            "prompt",
            "tokens_cached",
            "generation_settings",
            "timings",
        }
        assert documented <= ours.keys() & theirs.keys()
        assert set(theirs["timings"]) <= set(ours["timings"])
    compared = (
        0  # llama-server gives a token that is part of a character no entry of its own: the tokens before
    )
    for prompt in PROMPTS:
        request = {**body, "prompt": prompt, "n_probs": 2}
        ours, theirs = (
            post(served_lm, "/completion", request)[1],
            post(llama_server, "/completion", request)[1],
        )
        assert ours["tokens"] == theirs["tokens"]
        theirs_entries = theirs.get("completion_probabilities", [])  # none where no text was whole
        for mine, other in zip(ours["completion_probabilities"], theirs_entries, strict=False):
            if not whole_characters(bytes(mine["bytes"])):
                break
            assert (mine["id"], mine["bytes"], mine["token"]) == (other["id"], other["bytes"], other["token"])
            assert [top["id"] for top in mine["top_logprobs"]] == [top["id"] for top in other["top_logprobs"]]
            assert mine["logprob"] == pytest.approx(other["logprob"], abs=2e-3)
            compared += 1
    assert compared >= 3
    events = {
        name: post(side, "/completion", {**body, "stream": True})[1]
        for name, side in (("ours", served_lm), ("theirs", llama_server))
    }
    assert "".join(e["content"] for e in events["ours"]) == "".join(e["content"] for e in events["theirs"])
    assert events["ours"][-1]["stop"] and events["theirs"][-1]["stop"]
    with urllib.request.urlopen(f"{llama_server.url}/props") as response:
        theirs = json.loads(response.read())
    with urllib.request.urlopen(f"{served_lm.url}/props") as response:
        ours = json.loads(response.read())
    read = {
        "default_generation_settings",
        "total_slots",
        "model_path",
        "chat_template",
        "bos_token",
        "build_info",
    }
    assert read <= ours.keys() & theirs.keys()
    assert ours["default_generation_settings"]["n_ctx"] == theirs["default_generation_settings"]["n_ctx"]
    honoured = (
        *("temperature", "top_k", "top_p", "min_p", "typical_p", "top_n_sigma", "xtc_probability"),
        *("xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta", "repeat_last_n", "repeat_penalty"),
    )
    mine, llamas = (side["default_generation_settings"]["params"] for side in (ours, theirs))
    for name in honoured:  # the defaults of what both honour, which clients show and send back
        assert mine[name] == pytest.approx(llamas[name]), name


def test_llama_servers_own_draws_come_from_the_chain_we_run(served_model, served_tokenizer, llama_server):
    """llama-server itself, sampling with `CHAIN` on the same weights, draws only tokens our chain keeps,
    and some that cutting after the temperature would not."""
    llama, theirs = chain_sets(served_model, served_tokenizer)
    drawn = set()
    for seed in range(48):
        body = {"prompt": PROMPTS[1], "n_predict": 1, **CHAIN, "seed": seed, "return_tokens": True}
        drawn |= set(post(llama_server, "/completion", body)[1]["tokens"][:1])
    assert drawn <= llama and drawn - theirs, drawn


def test_llama_servers_typical_p_and_top_n_sigma_draw_what_our_chain_keeps(
    served_model, served_tokenizer, llama_server
):
    """Each alone, as llama-server runs it (after its top-n-sigma, which leaves the tokens it cuts in its
    list at -inf, its typical-p's entropy is NaN, 0 * -inf, and what it keeps arbitrary): its first
    tokens drawn at temperature 0.7 are among those our chain keeps, its greedy one the likeliest of them.
    llama.cpp's float16 GELU moves its logits by about 1e-3, and this model's 40 likeliest tokens are near
    alike, so that typical-p's ranking by surprise can swap neighbours: ours is taken at p + 0.1 there."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
    for name, value, margin in (
        ("typical_p", TYPICAL["typical_p"], 0.1),
        ("top_n_sigma", TYPICAL["top_n_sigma"], 0),
    ):
        ours = {"top_n_sigma": -1, "typ_p": 1, CHAIN_STEP[name]: value + margin}
        values = {**DEFAULTS, **ours}
        kept = np.flatnonzero(chain(row, [(step, values[step]) for step in STEPS if step in values]) > LOWEST)
        body = {"prompt": prompt, "n_predict": 1, name: value, "temperature": 0.7, "ignore_eos": True}
        body["return_tokens"] = True
        drawn = {
            post(llama_server, "/completion", {**body, "seed": seed})[1]["tokens"][0] for seed in range(24)
        }
        assert drawn <= set(kept.tolist()) and len(drawn) > 1 and len(kept) < 40, (name, drawn)
        greedy = post(llama_server, "/completion", {**body, "temperature": 0})[1]["tokens"][0]
        assert greedy in kept.tolist() and (margin or greedy == int(kept[np.argmax(row[kept])]))


def test_llama_servers_xtc_leaves_the_top_choice_ours_leaves(served_model, served_tokenizer, llama_server):
    """XTC drawing at every token (probability 1), its threshold midway in the widest gap between the ten
    likeliest probabilities (so that llama.cpp's logits, about 1e-3 from ours, put the same tokens above
    it): llama-server's greedy token is ours, the least likely of those above, not the argmax."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST  # `ignore_eos`, as llama-server bans it
    cut = chain(row, LLAMA_DEFAULTS)  # what reaches XTC: its probabilities are over these
    likeliest = np.sort(cut[cut > LOWEST].astype(np.float64))[::-1]
    probabilities = np.exp(likeliest - likeliest[0]) / np.exp(likeliest - likeliest[0]).sum()
    widest = 1 + int(np.argmax(probabilities[1:10] - probabilities[2:11]))  # at least two reach it
    threshold = float(probabilities[widest] + probabilities[widest + 1]) / 2
    ours = int(np.argmax(chain(row, [*LLAMA_DEFAULTS, ("xtc", 1.0, threshold)], chance=0.0)))
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "xtc_probability": 1.0, "ignore_eos": True}
    answer = post(llama_server, "/completion", {**body, "xtc_threshold": threshold, "return_tokens": True})[1]
    assert answer["tokens"][0] == ours != int(np.argmax(row))


def test_llama_servers_mirostat_draws_what_ours_keeps(served_model, served_tokenizer, llama_server):
    """Mirostat 2.0's first token, whose mu is twice tau: tau is set midway in the widest gap between
    the five likeliest tokens' surprises (so that llama.cpp's logits, about 1e-3 from ours, keep the
    same ones), and llama-server's draws over 24 seeds are among them, more than one."""
    prompt, eos = served_tokenizer.encode(PROMPTS[1]).ids, served_tokenizer.token_to_id(END_OF_TEXT)
    row = served_model.logits(np.array([prompt]))[0, -1]
    row[eos] = LOWEST
    ranked = np.sort(row[row > LOWEST].astype(np.float64))[::-1]
    surprise = -np.log2(np.exp(ranked - ranked[0]) / np.exp(ranked - ranked[0]).sum())
    widest = 1 + int(np.argmax(surprise[2:6] - surprise[1:5]))  # at least two kept
    tau = float(surprise[widest] + surprise[widest + 1]) / 4
    kept = set(np.argsort(-row)[: widest + 1].tolist())
    body = {"prompt": prompt, "n_predict": 1, "mirostat": 2, "mirostat_tau": tau, "temperature": 1.0}
    body |= {"ignore_eos": True, "return_tokens": True}
    drawn = {post(llama_server, "/completion", {**body, "seed": seed})[1]["tokens"][0] for seed in range(24)}
    assert drawn <= kept and len(drawn) > 1, (drawn, kept)
