"""What the server decides about a request before MAX sees it, without a server: the completion body's
checks (`max_gpt2.serving.requests`), the HTTP guard (`max_gpt2.serving.guard`: API key, routes,
`usage` after `n`), the penalties the pipeline applies (`max_gpt2.inference.logit_controls`) against
Hugging Face's and OpenAI's formulas written out here, and the options `max-gpt2 serve` passes on.
Everything skips, saying why, where MAX's serving extra is not installed."""

from __future__ import annotations

import argparse
import io
import json
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from max_gpt2.inference.logit_controls import LOWEST, ban, penalize, token_counts
from tests.support import requires_serving

pytestmark = requires_serving()

GOOD = {"model": "gpt2", "prompt": "The cat", "max_tokens": 4}

# A bad value of each field this server refuses, and what the refusal must say.
REFUSED = [
    ({"prompt": []}, "prompt", "holds no prompt"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": ["a", [1], ""]}, "prompt", "prompt[2]: empty"),
    ({"max_tokens": -1}, "max_tokens", "at least 1"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"temperature": -1}, "temperature", "between 0 and 2"),
    ({"temperature": float("nan")}, "temperature", "between 0 and 2"),
    ({"top_p": 2}, "top_p", "between 0 and 1"),
    ({"min_p": -0.5}, "min_p", "between 0 and 1"),
    ({"frequency_penalty": 2.5}, "frequency_penalty", "between -2 and 2"),
    ({"presence_penalty": -3}, "presence_penalty", "between -2 and 2"),
    ({"repetition_penalty": 0}, "repetition_penalty", "above 0"),
    ({"min_tokens": -1}, "min_tokens", "0 or more"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "more than max_tokens (4)"),
    ({"top_k": -2}, "top_k", "-1 or 0"),
    ({"logprobs": 0}, "logprobs", "1 to 7"),
    ({"logprobs": 8}, "logprobs", "1 to 7"),
    ({"seed": 2**64}, "seed", "64 bits"),
    ({"n": 0}, "n", "1 to 16"),
    ({"n": 17}, "n", "1 to 16"),
    ({"n": "two"}, "n", "an integer"),
    ({"n": 2, "seed": 7}, "n", "the same sample"),
    ({"best_of": 3}, "best_of", "equal to n (1)"),
    ({"n": 2, "stream": True}, "stream", "n = 2"),
    ({"prompt": ["a", "b"], "stream": True}, "stream", "2 prompt(s)"),
    ({"logit_bias": {"5": 10}}, "logit_bias", "does not apply logit biases"),
    ({"suffix": "the end"}, "suffix", "cannot insert"),
    ({"thinking_temperature": 0.5}, "thinking_temperature", "no reasoning"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "no reasoning"),
    ({"target_endpoint": "x"}, "target_endpoint", "disaggregated"),
    ({"dkv_cache_hint": {"a": 1}}, "dkv_cache_hint", "disaggregated"),
]


@pytest.mark.parametrize(("change", "param", "says"), REFUSED, ids=[str(case[0]) for case in REFUSED])
def test_each_refusal_names_the_field_and_what_it_may_be(change, param, says):
    from max_gpt2.serving.requests import Refusal, check_completion

    with pytest.raises(Refusal) as refused:
        check_completion({**GOOD, **change})
    assert refused.value.status == 400
    assert refused.value.param == param
    assert refused.value.message.startswith(param)
    assert says in refused.value.message


def test_what_is_honoured_goes_on_as_it_came_or_rewritten_to_mean_the_same():
    from max_gpt2.serving.requests import FIXED_SEED_ZERO, check_completion

    plain = {**GOOD, "temperature": 0.7, "top_k": 5, "repetition_penalty": 1.2, "stop": ["\n"], "user": "u"}
    assert check_completion(plain).body == plain and check_completion(plain).copies == 1
    # n: each prompt n times in a row, OpenAI's order of choices; best_of equal to n selects nothing.
    fanned = check_completion({**GOOD, "prompt": ["a", [5, 6]], "n": 3, "best_of": 3, "temperature": 0})
    assert fanned.copies == 3
    assert fanned.body["prompt"] == ["a", "a", "a", [5, 6], [5, 6], [5, 6]]
    assert "n" not in fanned.body and "best_of" not in fanned.body
    ids = check_completion({**GOOD, "prompt": [1, 2], "n": 2, "top_k": 1, "seed": 3}).body["prompt"]
    assert ids == [[1, 2], [1, 2]]  # greedy: a seed changes nothing, so n copies are fine with one
    # seed 0 is a seed to OpenAI; MAX would take it as "pick a random one".
    assert check_completion({**GOOD, "seed": 0}).body["seed"] == FIXED_SEED_ZERO
    assert check_completion({**GOOD, "seed": 5}).body["seed"] == 5
    # Unset or empty values of refused fields are no request at all.
    assert check_completion({**GOOD, "suffix": "", "logit_bias": {}, "n": None}).copies == 1
    # Values of the wrong type are MAX's schema's to name.
    assert check_completion({**GOOD, "temperature": "hot"}).body["temperature"] == "hot"


def hugging_face_repetition(row, seen, penalty):
    """`RepetitionPenaltyLogitsProcessor`, one id at a time."""
    row = row.astype(np.float64)
    for token in set(seen):
        row[token] = row[token] * penalty if row[token] < 0 else row[token] / penalty
    return row


def openai_penalties(row, generated, frequency, presence):
    """OpenAI's formula: logit - count * frequency_penalty - (count > 0) * presence_penalty."""
    row = row.astype(np.float64)
    for token in set(generated):
        row[token] -= generated.count(token) * frequency + presence
    return row


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    repetition=st.floats(0.5, 3.0),
    frequency=st.floats(-2.0, 2.0),
    presence=st.floats(-2.0, 2.0),
)
def test_penalties_are_hugging_faces_repetition_then_openais(seed, repetition, frequency, presence):
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(50).astype(np.float32) * 4
    prompt = rng.integers(0, 50, 6).tolist()
    generated = rng.integers(0, 50, rng.integers(0, 9)).tolist()
    expected = openai_penalties(
        hugging_face_repetition(row, prompt + generated, repetition), generated, frequency, presence
    )
    seen = token_counts(prompt + generated, 50) > 0
    got = penalize(row, seen, token_counts(generated, 50), repetition, frequency, presence)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)
    assert got is not row and np.array_equal(row, row.astype(np.float32))  # the input is left alone


def test_banned_ids_are_never_the_argmax_and_ids_outside_the_row_are_ignored():
    row = np.arange(10, dtype=np.float32)
    banned = ban(row, [9, 8, 42])
    assert banned[9] == banned[8] == LOWEST and int(np.argmax(banned)) == 7
    np.testing.assert_array_equal(banned[:8], row[:8])


class FakePipeline:
    model_name = "gpt2"


def guarded_client(api_key: str | None, usage: dict[str, int] | None = None, explorer: Any = None):
    """A Starlette app behind `Guard` (with `explorer`, if given) whose completion route answers with
    what it was sent (and `usage`), through Starlette's test client."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from max_gpt2.serving.guard import install

    async def completions(request: Request) -> JSONResponse:
        return JSONResponse({"sent": (await request.body()).decode(), "usage": usage})

    async def ok(request: Request) -> Response:
        return Response("ok")

    routes = [Route("/v1/completions", completions, methods=["POST"])]
    routes += [Route(path, ok) for path in ("/health", "/v1/models", "/v1/embeddings")]
    app = Starlette(routes=routes)
    app.state.pipeline = FakePipeline()
    install(app, api_key, explorer)
    return TestClient(app)


def test_an_api_key_is_asked_of_every_request_but_health():
    client = guarded_client("s3cret")
    refused = client.post("/v1/completions", json=GOOD)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"]["type"] == "authentication_error"
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Basic s3cret"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200
    assert guarded_client(None).get("/v1/models").status_code == 200


def test_routes_gpt2_cannot_answer_are_refused_with_openais_body():
    client = guarded_client(None)
    chat = client.post("/v1/chat/completions", json={"model": "gpt2", "messages": []})
    assert chat.status_code == 404 and "not a chat model" in chat.json()["error"]["message"]
    embeddings = client.post("/v1/embeddings", json={"model": "gpt2", "input": "hi"})
    assert embeddings.status_code == 404 and "/v1/completions" in embeddings.json()["error"]["message"]
    assert client.get("/v1/completions").status_code == 405
    wrong_model = client.post("/v1/completions", json={**GOOD, "model": "gpt-4"})
    assert wrong_model.status_code == 404 and wrong_model.json()["error"]["param"] == "model"


def test_a_checked_body_goes_on_rewritten_and_n_counts_each_prompt_once_in_usage():
    usage = {"prompt_tokens": 6, "completion_tokens": 12, "total_tokens": 18}
    client = guarded_client(None, usage)
    answer = client.post("/v1/completions", json={**GOOD, "n": 3, "temperature": 0})
    assert answer.status_code == 200
    assert json.loads(answer.json()["sent"])["prompt"] == ["The cat"] * 3
    assert answer.json()["usage"] == {"prompt_tokens": 2, "completion_tokens": 12, "total_tokens": 14}
    assert int(answer.headers["content-length"]) == len(answer.content)
    refused = client.post("/v1/completions", json={**GOOD, "top_p": 2})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "top_p"
    not_json = client.post("/v1/completions", content=b"{not json")  # MAX's route answers it
    assert not_json.json()["sent"] == "{not json"
    assert json.loads(client.post("/v1/completions", json=GOOD).json()["sent"]) == GOOD


def serve_arguments(*options: str) -> argparse.Namespace:
    from max_gpt2.cli import build_parser

    return build_parser().parse_args(["serve", *options])


def test_the_api_key_reaches_the_server_in_its_environment_never_its_command_line(lm_checkpoint, monkeypatch):
    from max_gpt2.cli.serve import serve_command
    from max_gpt2.outputs import Progress
    from max_gpt2.serving.server import API_KEY_VARIABLE
    from tests.support import LM

    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    checkpoint = str(lm_checkpoint(LM))
    command, env = serve_command(
        serve_arguments("--checkpoint", checkpoint, "--api-key", "k1"), Progress(io.StringIO())
    )
    assert env[API_KEY_VARIABLE] == "k1" and not any("k1" in part for part in command)
    assert command[1:3] == ["-m", "max_gpt2.serving.server"]
    monkeypatch.setenv(API_KEY_VARIABLE, "from-env")
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint), Progress(io.StringIO()))
    assert env[API_KEY_VARIABLE] == "from-env"
    monkeypatch.delenv(API_KEY_VARIABLE)
    said = io.StringIO()
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint), Progress(said))
    assert API_KEY_VARIABLE not in env and "warning" not in said.getvalue()
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint, "--host", "0.0.0.0"), Progress(said))
    assert "warning: --host 0.0.0.0 lets other machines reach the model, and no --api-key" in said.getvalue()


def test_only_loopback_hosts_count_as_private():
    from max_gpt2.cli.console import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "127.3.2.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.4", "example.com", "::"]))


def test_the_explorer_answers_under_explore_once_its_model_loads_and_the_api_serves_on(lm_checkpoint):
    from max_gpt2.explorer.loading import ExplorerSettings, LoadingExplorer
    from max_gpt2.serving.guard import EXPLORER
    from tests.support import LM

    explorer = LoadingExplorer(ExplorerSettings(str(lm_checkpoint(LM)), "cpu", "float32", None), EXPLORER)
    client = guarded_client(None, explorer=explorer)
    deadline = time.monotonic() + 600
    while (answer := client.post("/explore/api/explore", json={"text": "The cat sat"})).status_code == 503:
        assert "still loading" in answer.json()["error"] and time.monotonic() < deadline
        time.sleep(0.5)
    assert answer.status_code == 200 and answer.json()["text"] == "The cat sat"
    assert answer.headers["cache-control"] == "no-store"
    page = client.get("/explore/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '"api": "/explore"' in page.text
    layer = client.get("/explore/api/map", params={"id": answer.json()["id"], "layer": 0, "head": 1})
    assert layer.status_code == 200 and layer.json()["size"] == len(answer.json()["tokens"])
    empty = client.post("/explore/api/explore", json={"text": ""})
    assert empty.status_code == 400 and empty.json() == {"error": "the text is empty: type or paste some"}
    assert client.post("/v1/completions", json=GOOD).status_code == 200
    assert client.get("/explorer").status_code == 404  # only /explore and under it


def test_an_explorer_that_cannot_load_says_why_and_the_api_serves_on(tmp_path):
    from max_gpt2.explorer.loading import ExplorerSettings, LoadingExplorer
    from max_gpt2.serving.guard import EXPLORER

    explorer = LoadingExplorer(ExplorerSettings(str(tmp_path / "gone"), "cpu", "float32", None), EXPLORER)
    client = guarded_client(None, explorer=explorer)
    deadline = time.monotonic() + 60
    assert client.get("/explore/").status_code == 200  # the page, at once
    while (answer := client.get("/explore/api/map")).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert answer.status_code == 500
    assert answer.json()["error"].startswith("the explorer's model did not load: ")
    assert str(tmp_path / "gone") in answer.json()["error"]
    assert client.get("/v1/models").status_code == 200


def test_serve_explorer_passes_its_load_to_the_server_and_refuses_an_api_key(lm_checkpoint, monkeypatch):
    from max_gpt2.cli.serve import serve_command
    from max_gpt2.explorer.loading import ExplorerSettings
    from max_gpt2.outputs import Progress
    from max_gpt2.serving.server import API_KEY_VARIABLE, EXPLORER_VARIABLE
    from tests.support import LM

    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    checkpoint = str(lm_checkpoint(LM))
    options = ("--checkpoint", checkpoint, "--explorer", "--weight-format", "q8_0")
    _, env = serve_command(serve_arguments(*options), Progress(io.StringIO()))
    assert ExplorerSettings.from_json(env[EXPLORER_VARIABLE]) == ExplorerSettings(
        checkpoint, "auto", "float32", "q8_0"
    )
    _, env = serve_command(serve_arguments("--checkpoint", checkpoint), Progress(io.StringIO()))
    assert EXPLORER_VARIABLE not in env
    with pytest.raises(ValueError, match="--explorer: the explorer's page cannot send an API key"):
        serve_command(serve_arguments(*options, "--api-key", "k"), Progress(io.StringIO()))
