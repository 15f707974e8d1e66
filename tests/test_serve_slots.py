"""llama-server's `GET /slots` through the real server: `served_pages_lm` decodes 4 requests together
(`--max-batch-size 4`), so 4 slots each show the request they hold, in the order the requests came, and a
fifth waits for one to free; `?fail_on_no_slot=1` is a 503 while all are busy, as llama-server answers.
Where llama.cpp is built (`LLAMA_CPP`), a slot's keys and values after one request are llama-server's.
The actions on a slot, which need no model: test_serve_guard.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.support import requires_serving
from tests.test_serve_native import post

pytestmark = requires_serving()

TOKENS = 200  # long enough that the first four are still decoding when the slots are read


@pytest.fixture(scope="module")
def server(served_pages_lm):
    return served_pages_lm


def stream(server, prompt: list[int], temperature: float) -> Any:
    """A streamed completion, open: its headers read (MAX has the request), its events not yet."""
    body = {"model": "gpt2", "prompt": prompt, "max_tokens": TOKENS, "temperature": temperature, "seed": 3}
    body |= {"ignore_eos": True, "stream": True}
    request = urllib.request.Request(
        f"{server.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(request, timeout=120)


def slots(server, query: str = "") -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{server.url}/slots{query}", timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_each_slot_shows_its_request_and_a_fifth_waits_for_one(server):
    opened = []
    for index in range(4):
        opened.append(stream(server, [10 + index] * (5 + index), 0.5 + index / 10))
        opened[-1].readline()  # its first event: it is decoding
    fifth = stream(server, [40] * 9, 0.0)
    status, busy = slots(server)
    assert status == 200 and [slot["id"] for slot in busy] == [0, 1, 2, 3]
    assert all(slot["is_processing"] and slot["n_ctx"] == 512 for slot in busy)
    tasks = [slot["id_task"] for slot in busy]
    assert tasks == sorted(tasks) and len(set(tasks)) == 4  # seated in the order they came
    for index, slot in enumerate(busy):
        made = slot["next_token"][0]["n_decoded"]
        assert 1 <= made == TOKENS - slot["next_token"][0]["n_remain"]
        assert slot["n_prompt_tokens"] == 5 + index + made - 1  # what its cache holds, as llama-server's
        assert slot["n_prompt_tokens_processed"] + slot["n_prompt_tokens_cache"] == 5 + index
        assert slot["params"]["temperature"] == pytest.approx(0.5 + index / 10)
        assert slot["params"]["n_predict"] == TOKENS and slot["params"]["seed"] == 3
    status, refused = slots(server, "?fail_on_no_slot=1")
    assert status == 503 and refused["error"]["type"] == "unavailable_error", refused
    for each in [*opened, fifth]:
        each.read()
        each.close()
    status, idle = slots(server, "?fail_on_no_slot=1")
    assert status == 200 and not any(slot["is_processing"] for slot in idle)
    last = max(idle, key=lambda slot: slot["id_task"])  # the fifth, in a freed slot: as llama-server
    assert last["id_task"] > tasks[-1] and last["n_prompt_tokens"] == 9 + TOKENS - 1  # leaves a slot
    assert last["params"]["temperature"] == 0 and last["next_token"][0] == {
        "has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0,
    }  # fmt: skip


def test_a_slot_shows_what_llama_servers_shows_after_the_same_request(served_lm, llama_server):
    """Its keys, the request's prompt size and progress, and what it sampled with (llama-server's
    `/completion` defaults, its chain run on our host; greedy, with no seed): ours are a part of
    llama-server's `params`, with its values."""
    sampled = {"prompt": "The cat sat on", "n_predict": 6, "seed": 3, "temperature": 0.7, "ignore_eos": True}
    for body in (sampled, {"prompt": "The cat", "n_predict": 2, "temperature": 0}):
        states = {}
        for name, side in (("ours", served_lm), ("theirs", llama_server)):
            assert post(side, "/completion", body)[0] == 200
            with urllib.request.urlopen(f"{side.url}/slots") as answer:
                held = [state for state in json.loads(answer.read()) if "id_task" in state]
            states[name] = max(held, key=lambda state: state["id_task"])
        ours, theirs = states["ours"], states["theirs"]
        assert ours.keys() == theirs.keys() and ours["next_token"] == theirs["next_token"]
        shown = ("n_ctx", "is_processing", "n_prompt_tokens", "n_prompt_tokens_processed")
        assert [ours[key] for key in shown] == [theirs[key] for key in shown]
        assert ours["params"].keys() <= theirs["params"].keys()
        for name, value in ours["params"].items():  # the seed left to chance, the cuts of a greedy one
            assert value == pytest.approx(theirs["params"][name]), name
