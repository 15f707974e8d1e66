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
from typing import Any

import numpy as np
import pytest

from tests.conftest import CHAT_TEMPLATE
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


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"mirostat": 3}, "mirostat", "mirostat: 0 (off), 1 or 2 (Mirostat 2.0); got 3"),
        ({"lora": [{"id": 0, "scale": 1}]}, "lora", "an id of the adapters (none: no adapter is merged)"),
        ({"n_indent": -1}, "n_indent", "n_indent: 0 or more; got -1"),
        ({"t_max_predict_ms": -2}, "t_max_predict_ms", "t_max_predict_ms: -1 (none) or more; got -2"),
        ({"adaptive_decay": 1.5}, "adaptive_decay", "adaptive_decay: 0 to 0.99; got 1.5"),
        ({"min_keep": -1, "temperature": 1.0}, "min_keep", "min_keep: 0 or more; got -1"),
        ({"dry_multiplier": 0.8, "dry_sequence_breakers": []}, "dry_sequence_breakers", "a non-empty list"),
        ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers", "Input should be a valid array"),
        ({"dry_allowed_length": -1}, "dry_allowed_length", "0 or more; got -1"),
        ({"dry_penalty_last_n": -2}, "dry_penalty_last_n", "-1 (the context), 0 (off) or more; got -2"),
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


def test_props_health_and_the_routes_llama_server_also_answers(served_lm):
    with urllib.request.urlopen(f"{served_lm.url}/props") as response:
        props = json.loads(response.read())
    assert props["default_generation_settings"]["n_ctx"] == LM.n_positions
    settings = props["default_generation_settings"]["params"]
    assert (settings["temperature"], settings["top_k"], settings["n_predict"]) == (0.8, 40, -1)
    assert (settings["typical_p"], settings["top_n_sigma"], settings["mirostat"]) == (1.0, -1.0, 0)
    assert (settings["dry_multiplier"], settings["dynatemp_range"]) == (0.0, 0.0)
    assert props["chat_template"] == CHAT_TEMPLATE and props["model_alias"] == "gpt2", props
    assert props["total_slots"] == 16  # the batch a CPU decodes (`memory_planner.CPU_BATCH_SIZE`)
    for path in ("/health", "/v1/health"):
        with urllib.request.urlopen(f"{served_lm.url}{path}") as response:
            assert json.loads(response.read()) == {"status": "ok"}
    status, refused = post(served_lm, "/props", {"n_ctx": 8})  # llama-server's answer without --props
    assert status == 501 and refused["error"]["type"] == "not_supported_error", refused
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


def test_completion_and_props_answer_as_llama_server_itself_answers(served_lm, llama_server):
    """The same request to both on the same weights: the same greedy tokens, text, stop type and counts,
    every key of llama-server's answer that its README documents, and its /props keys clients read."""
    body = {"prompt": PROMPTS[1], "n_predict": 8, "temperature": 0, "return_tokens": True, "ignore_eos": True}
    for request in (body, {**body, "stop": [" "]}):
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
        for setting in ("dry_sequence_breakers", "samplers"):  # the default chain, in its order
            assert ours["generation_settings"][setting] == theirs["generation_settings"][setting], setting
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
    changed = [post(side, "/props", {}) for side in (served_lm, llama_server)]  # neither started with --props
    assert [(status, body["error"]["type"]) for status, body in changed] == [(501, "not_supported_error")] * 2
    assert ours["default_generation_settings"]["n_ctx"] == theirs["default_generation_settings"]["n_ctx"]
    honoured = (
        *("temperature", "top_k", "top_p", "min_p", "typical_p", "top_n_sigma", "xtc_probability"),
        *("xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta", "repeat_last_n", "repeat_penalty"),
        *("dynatemp_range", "dynatemp_exponent", "dry_multiplier", "dry_base", "dry_allowed_length"),
        *("dry_penalty_last_n", "adaptive_target", "adaptive_decay", "min_keep"),
    )
    mine, llamas = (side["default_generation_settings"]["params"] for side in (ours, theirs))
    for name in honoured:  # the defaults of what both honour, which clients show and send back
        assert mine[name] == pytest.approx(llamas[name]), name


def test_response_fields_pick_the_results_fields_as_llama_server_picks_them(served_lm, served_tokenizer):
    """Each path's value under the path as its key (`a/b` inside `a`), one leading nowhere left out, as
    llama-server's `json_get_nested_values`; streamed, the last object alone; no effect at `/v1`."""
    fields = ["content", "tokens", "generation_settings/n_predict", "timings/prompt_n", "nothing/here"]
    body = {"prompt": PROMPTS[1], "n_predict": 3, "temperature": 0, "return_tokens": True, "ignore_eos": True}
    whole = post(served_lm, "/completion", body)[1]
    picked = post(served_lm, "/completion", {**body, "response_fields": fields})[1]
    assert picked == {
        "content": whole["content"],
        "tokens": whole["tokens"],
        "generation_settings/n_predict": 3,
        "timings/prompt_n": len(served_tokenizer.encode(PROMPTS[1]).ids),
    }
    events = post(served_lm, "/completion", {**body, "response_fields": ["stop_type"], "stream": True})[1]
    assert events[-1] == {"stop_type": "limit"} and events[0]["content"]
    v1 = {"prompt": PROMPTS[1], "max_tokens": 2, "response_fields": ["content"]}
    assert "choices" in post(served_lm, "/v1/completions", v1)[1]


def test_llama_servers_response_fields_are_ours(served_lm, llama_server):
    fields = ["content", "tokens", "generation_settings/n_predict", "stop_type", "nothing/here"]
    body = {"prompt": PROMPTS[1], "n_predict": 4, "temperature": 0, "return_tokens": True, "ignore_eos": True}
    ours, theirs = (
        post(side, "/completion", {**body, "response_fields": fields})[1]
        for side in (served_lm, llama_server)
    )
    assert ours == theirs and len(ours) == 4, (ours, theirs)


INDENTED = {"prompt": "def f():", "n_predict": 12, "temperature": 0, "grammar": 'root ::= "a\\n  b\\nc"'}


def test_n_indent_ends_the_text_at_a_line_indented_less(served_lm):
    """Held to "a\\n  b\\nc" by its grammar, the text ends before "c", whose line has no indentation,
    where `n_indent` asks for 2 (stop type "limit", as llama-server's); without it, the whole text."""
    whole = post(served_lm, "/completion", INDENTED)[1]
    cut = post(served_lm, "/completion", {**INDENTED, "n_indent": 2})[1]
    assert (whole["content"], cut["content"], cut["stop_type"]) == ("a\n  b\nc", "a\n  b\n", "limit"), cut
    streamed = post(served_lm, "/completion", {**INDENTED, "n_indent": 2, "stream": True})[1]
    assert "".join(event["content"] for event in streamed) == "a\n  b\n"


def test_t_max_predict_ms_ends_the_text_at_a_newline_past_its_time(served_lm, served_tokenizer):
    newline = served_tokenizer.encode("\n").ids[0]
    body = {"prompt": PROMPTS[0], "n_predict": 40, "temperature": 0, "logit_bias": [[newline, 100]]}
    assert post(served_lm, "/completion", body)[1]["tokens_predicted"] == 40
    timed = post(served_lm, "/completion", {**body, "t_max_predict_ms": 1})[1]
    assert timed["stop_type"] == "limit" and 1 < timed["tokens_predicted"] < 40
    assert timed["content"] == "\n" * timed["tokens_predicted"]


def test_llama_servers_n_indent_cuts_where_ours_does(served_lm, llama_server):
    ours, theirs = (
        post(side, "/completion", {**INDENTED, "n_indent": 2})[1] for side in (served_lm, llama_server)
    )
    assert (
        (ours["content"], ours["stop_type"])
        == (theirs["content"], theirs["stop_type"])
        == ("a\n  b\n", "limit")
    )
