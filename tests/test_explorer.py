"""The head explorer without a browser: its data against `lm.attentions` and the NumPy reference, the
head scores against TransformerLens's definitions written out here as loops, its HTTP routes, and the
commands that serve or write it (`max-gpt2 explore`, `max-gpt2 heads --html`, `serve --explorer`'s
settings). What a browser does with the page is tests/test_explorer_page.py."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from max_gpt2 import cli, reference
from max_gpt2.analysis.head_scores import KINDS, head_scores, ranking, repeated_random_tokens
from max_gpt2.bench.server import free_port
from max_gpt2.cli.console import check_port_free
from max_gpt2.cli.heads import HTML_MAX, check_html
from max_gpt2.explorer.app import EXAMPLE, JSON, ExplorerApp
from max_gpt2.explorer.data import THUMBNAIL, explore, text_of, thumbnails
from max_gpt2.testing import END_OF_TEXT
from tests.support import LM

TEXT = "The cat sat on the mat. The cat sat."


def decoded(data: str, *shape: int) -> np.ndarray:
    """A map as the page reads it: base64 bytes, each round(255 w)."""
    return np.frombuffer(base64.b64decode(data), np.uint8).reshape(shape)


def as_bytes(weights: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(weights, np.float64) * 255).astype(np.uint8)


def ask(app: ExplorerApp, method: str, path: str, body: object = None, query: str = "") -> tuple[int, object]:
    status, kind, answer = app.handle(method, path, query, b"" if body is None else json.dumps(body).encode())
    return status, json.loads(answer) if kind == JSON else answer.decode()


# TransformerLens's head_detector, cell by cell: which weights of query i each kind of head would put
# on key j, for tokens t.
def loop_pattern(kind: str, tokens: list[int], i: int, j: int) -> bool:
    if kind == "previous-token":
        return j == i - 1
    if kind == "duplicate-token":
        return j < i and tokens[j] == tokens[i]
    return 1 <= j <= i and tokens[j - 1] == tokens[i]  # the token after an earlier copy of t[i]


def loop_score(kind: str, attention: np.ndarray, tokens: list[int]) -> float:
    """sum(A * P) / sum(A), one cell at a time."""
    on = total = 0.0
    for i in range(len(tokens)):
        for j in range(len(tokens)):
            total += float(attention[i, j])
            on += float(attention[i, j]) if loop_pattern(kind, tokens, i, j) else 0.0
    return on / total


def causal_softmax(scores: np.ndarray) -> np.ndarray:
    """Rows of `scores` [..., S, S] as distributions over the keys up to each query."""
    length = scores.shape[-1]
    hidden = np.triu(np.ones((length, length), bool), k=1)
    weights = np.exp(np.where(hidden, -np.inf, scores))
    return weights / weights.sum(axis=-1, keepdims=True)


def test_head_scores_are_the_detectors_definitions_and_a_planted_induction_head_comes_first():
    rng = np.random.default_rng(3)
    half = 9
    tokens = repeated_random_tokens(50, half, seed=4)
    tokens = np.concatenate([tokens, tokens[:3]])  # a third copy's start: duplicates of duplicates
    length = len(tokens)
    attentions = causal_softmax(rng.normal(size=(2, 3, length, length)))
    induction = np.zeros((length, length))
    for i in range(length):
        later_copies = [j + 1 for j in range(i) if tokens[j] == tokens[i]]  # the next token's positions
        for j in later_copies:
            induction[i, j] = 1.0
        if not later_copies:
            induction[i, 0] = 1.0  # nothing to predict from: the first token, as real heads do
    attentions[1, 2] = induction / induction.sum(axis=-1, keepdims=True)
    attentions[0, 1] = np.eye(length, k=-1) + np.eye(length) * (np.arange(length) == 0)[:, None]

    scores = head_scores(attentions, tokens)
    as_list = tokens.tolist()
    for kind in KINDS:
        for layer, head in np.ndindex(2, 3):
            expected = loop_score(kind, attentions[layer, head], as_list)
            assert scores.of(kind)[layer, head] == pytest.approx(expected, abs=1e-12), (kind, layer, head)
    with_copies = sum(any(as_list[j] == as_list[i] for j in range(i)) for i in range(length))
    assert with_copies >= length - half  # every query from the second copy on
    assert scores.induction[1, 2] == pytest.approx(with_copies / length, abs=1e-12)
    assert ranking(scores.induction)[0][:2] == (1, 2)
    assert scores.previous[0, 1] == pytest.approx((length - 1) / length)
    assert ranking(scores.previous, top=1) == [(0, 1, pytest.approx((length - 1) / length))]
    ranked = ranking(scores.duplicate, top=6)
    assert [score for *_, score in ranked] == sorted((score for *_, score in ranked), reverse=True)


def test_a_repeated_random_run_never_draws_the_avoided_token():
    tokens = repeated_random_tokens(5, 400, seed=1, avoid=4)
    assert 4 not in tokens and set(tokens.tolist()) == {0, 1, 2, 3}
    np.testing.assert_array_equal(tokens[:400], tokens[400:])


def test_thumbnails_keep_each_blocks_largest_weight():
    rng = np.random.default_rng(0)
    maps = rng.random((2, 3, 150, 150))
    small = thumbnails(maps)
    assert small.shape == (2, 3, THUMBNAIL, THUMBNAIL)
    edges = [k * 150 // THUMBNAIL for k in range(THUMBNAIL + 1)]
    for a in range(THUMBNAIL):
        for b in range(0, THUMBNAIL, 7):
            block = maps[..., edges[a] : edges[a + 1], edges[b] : edges[b + 1]]
            np.testing.assert_array_equal(small[..., a, b], block.max(axis=(-2, -1)))
    np.testing.assert_array_equal(thumbnails(maps[..., :40, :40]), maps[..., :40, :40])  # small: as it is


def test_the_pages_data_is_the_models_attention_and_probabilities(explorer_app, lm_weights):
    lm, tokenizer = explorer_app.lm, explorer_app.lm.tokenizer
    ids = np.array(tokenizer.encode(TEXT).ids)
    exploration = explore(lm, ids, tokenizer)
    np.testing.assert_array_equal(exploration.attentions, lm.attentions(ids[None])[:, 0])
    expected = reference.lm_forward(ids[None], lm_weights(LM), LM)
    logits = expected.logits[0]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)  # float64, [S, vocab]
    np.testing.assert_allclose(exploration.probabilities, probabilities, atol=2e-5)

    summary = exploration.summary()
    length = len(ids)
    assert [token["id"] for token in summary["tokens"]] == ids.tolist()
    assert "".join(token["text"] for token in summary["tokens"]) == TEXT
    assert summary["probabilities"][0] is None
    chosen = probabilities[np.arange(length - 1), ids[1:]]
    np.testing.assert_allclose(summary["probabilities"][1:], chosen, atol=2e-5)
    for row, listed in enumerate(summary["alternatives"][1:]):
        ps = [choice["p"] for choice in listed]
        assert len(listed) == 5 and ps == sorted(ps, reverse=True)
        others = np.delete(probabilities[row], [choice["id"] for choice in listed])
        assert min(ps) >= others.max() - 2e-5  # no token left out is likelier
    shape = (LM.n_layer, LM.n_head, length, length)  # LM's 48 positions fit a thumbnail: no pooling
    assert summary["thumbnails"]["size"] == length
    np.testing.assert_array_equal(
        decoded(summary["thumbnails"]["data"], *shape), as_bytes(exploration.attentions)
    )
    maps = exploration.summary(with_maps=True)["maps"]
    np.testing.assert_array_equal(decoded(maps["data"], *shape), as_bytes(exploration.attentions))
    for kind in KINDS:
        np.testing.assert_allclose(summary["scores"][kind], exploration.scores.of(kind), atol=1e-4)
    mean = exploration.head_map(2, None)
    np.testing.assert_array_equal(
        decoded(mean["data"], length, length), as_bytes(exploration.attentions[2].mean(axis=0))
    )


def test_the_routes_answer_an_exploration_and_its_maps(explorer_app):
    status, html = ask(explorer_app, "GET", "/")
    assert status == 200 and 'id="explorer-settings"' in html
    status, answer = ask(explorer_app, "POST", "/api/explore", {"text": TEXT})
    assert status == 200 and answer["text"] == TEXT and answer["layers"] == LM.n_layer
    length = len(answer["tokens"])
    status, head = ask(explorer_app, "GET", "/api/map", query=f"id={answer['id']}&layer=1&head=4")
    assert status == 200 and (head["layer"], head["head"], head["size"]) == (1, 4, length)
    ids = np.array([token["id"] for token in answer["tokens"]])
    np.testing.assert_array_equal(
        decoded(head["data"], length, length), as_bytes(explorer_app.lm.attentions(ids[None])[1, 0, 4])
    )

    status, continued = ask(explorer_app, "POST", "/api/explore", {"text": TEXT, "new_tokens": 3})
    greedy = explorer_app.lm.generate(ids[None], 3)[0]
    assert status == 200 and [token["id"] for token in continued["tokens"]] == greedy.tolist()
    request = {"text": TEXT, "new_tokens": 4, "temperature": 0.8, "top_k": 20, "seed": 5}
    sampled = [ask(explorer_app, "POST", "/api/explore", request)[1]["tokens"] for _ in range(2)]
    assert sampled[0] == sampled[1] and len(sampled[0]) == length + 4  # a seed repeats its sample

    status, example = ask(explorer_app, "POST", "/api/explore", {"example": "induction"})
    tokens = [token["id"] for token in example["tokens"]]
    assert status == 200 and len(tokens) == 2 * EXAMPLE and tokens[:EXAMPLE] == tokens[EXAMPLE:]
    assert explorer_app.lm.tokenizer.token_to_id(END_OF_TEXT) not in tokens
    best = example["ranking"]["induction"]
    assert [score for *_, score in best] == sorted((score for *_, score in best), reverse=True)
    assert best[0][2] == pytest.approx(max(max(row) for row in example["scores"]["induction"]), abs=1e-4)


@pytest.mark.parametrize(
    ("method", "path", "body", "query", "status", "says"),
    [
        ("POST", "/api/explore", {"text": "  "}, "", 400, "the text is empty"),
        ("POST", "/api/explore", {}, "", 400, "the text is empty"),
        ("POST", "/api/explore", {"text": "ab " * 60}, "", 400, "48"),
        ("POST", "/api/explore", {"text": TEXT, "new_tokens": -1}, "", 400, "new_tokens"),
        ("POST", "/api/explore", {"text": TEXT, "new_tokens": 40}, "", 400, "48"),
        (
            "POST",
            "/api/explore",
            {"text": TEXT, "new_tokens": 2, "temperature": "hot"},
            "",
            400,
            "temperature",
        ),
        (
            "POST",
            "/api/explore",
            {"text": TEXT, "new_tokens": 2, "temperature": 1, "top_p": 3},
            "",
            400,
            "top_p",
        ),
        ("POST", "/api/explore", {"text": "a"}, "", 400, "at least two tokens"),
        ("POST", "/api/explore", [1, 2], "", 400, "a JSON object"),
        ("GET", "/api/map", None, "id=nope&layer=0&head=0", 400, "an exploration kept"),
        ("GET", "/api/map", None, "layer=0", 400, "an exploration kept"),
        ("GET", "/nowhere", None, "", 404, "no route GET /nowhere"),
    ],
)
def test_bad_requests_get_a_message_never_a_traceback(explorer_app, method, path, body, query, status, says):
    got, answer = ask(explorer_app, method, path, body, query)
    assert got == status and says in answer["error"] and "Traceback" not in answer["error"]


def test_a_map_out_of_range_names_the_models_heads_and_a_failure_inside_is_a_500(explorer_app, monkeypatch):
    _, answer = ask(explorer_app, "POST", "/api/explore", {"text": TEXT})
    status, refused = ask(explorer_app, "GET", "/api/map", query=f"id={answer['id']}&layer=3&head=0")
    assert status == 400 and f"{LM.n_layer} layers of {LM.n_head} heads" in refused["error"]
    status, _ = ask(explorer_app, "GET", "/api/map", query=f"id={answer['id']}&layer=0&head=")
    assert status == 200  # no head: the layer's mean

    def broken(*args: object) -> None:
        raise RuntimeError("the device went away")

    with monkeypatch.context() as patch:
        patch.setattr("max_gpt2.explorer.app.explore", broken)
        status, failed = ask(explorer_app, "POST", "/api/explore", {"text": TEXT})
    assert status == 500 and failed["error"] == "RuntimeError: the device went away"
    assert ask(explorer_app, "POST", "/api/explore", {"text": TEXT})[0] == 200  # and it serves on


def test_without_a_tokenizer_the_explorer_takes_token_ids(compiled_lm):
    app = ExplorerApp(compiled_lm(LM))
    assert app.lm.tokenizer is None
    status, answer = ask(app, "POST", "/api/explore", {"text": "5, 17 40 5"})
    assert status == 200 and [token["text"] for token in answer["tokens"]] == ["5", "17", "40", "5"]
    assert answer["text"] == "5, 17, 40, 5"
    status, refused = ask(app, "POST", "/api/explore", {"text": "the cat"})
    assert status == 400 and "no tokenizer" in refused["error"]
    assert settings_of(ask(app, "GET", "/")[1])["textInput"] is False


def settings_of(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="explorer-settings">(.*?)</script>', html, re.S)
    assert found is not None
    return json.loads(found.group(1))


def test_the_page_fetches_nothing_from_elsewhere(explorer_app):
    html = ask(explorer_app, "GET", "/")[1]
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert not re.search(r"@import|\burl\(|<link\b", html)  # CSS's fetches (not JavaScript's URL)
    assert settings_of(html) == {"api": "", "data": None, "textInput": True}


def test_heads_html_writes_the_explorer_with_every_map_inside(lm_checkpoint, explorer_app, tmp_path, capsys):
    out = tmp_path / "page.html"
    status = cli.main(
        [
            "heads",
            "--checkpoint",
            str(lm_checkpoint(LM)),
            "--prompt",
            TEXT,
            "--html",
            str(out),
            "--device",
            "cpu",
        ]
    )
    assert status == 0 and "layer" in capsys.readouterr().out
    html = out.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    data = settings_of(html)["data"]
    ids = np.array([token["id"] for token in data["tokens"]])
    length = len(ids)
    shape = (LM.n_layer, LM.n_head, length, length)
    expected = explorer_app.lm.attentions(ids[None])[:, 0]
    np.testing.assert_array_equal(decoded(data["maps"]["data"], *shape), as_bytes(expected))
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # nothing half-written beside it


def test_a_standalone_page_too_large_or_with_nowhere_to_go_is_refused_before_compiling(tmp_path):
    with pytest.raises(
        ValueError, match=r"1024 tokens x 144 heads make 201 MB of maps; .* 64 MB, 577 tokens"
    ):
        check_html(tmp_path / "a.html", 1024, 144)
    check_html(tmp_path / "a.html", 577, 144)
    assert HTML_MAX >= 144 * 577 * 577 * 4 // 3
    with pytest.raises(ValueError, match=r"the directory .*missing does not exist"):
        check_html(tmp_path / "missing" / "a.html", 10, 4)


def test_explore_refuses_a_port_in_use_before_loading(capsys):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["explore", "--port", str(port), "--checkpoint", "/nonexistent"]) == 2
    assert f"--port {port}: the port is in use" in capsys.readouterr().err


def test_explore_says_why_a_checkpoint_cannot_load(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert cli.main(["explore", "--checkpoint", str(tmp_path), "--port", str(free_port())]) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith("max-gpt2 explore: error: ") and str(tmp_path) in error and "Traceback" not in error
    )


def post(url: str, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_explore_serves_the_page_until_ctrl_c(lm_checkpoint, explorer_app):
    """`max-gpt2 explore` for real: it prints its address, answers, and stops cleanly on SIGINT."""
    port = free_port()
    command = [sys.executable, "-m", "max_gpt2", "explore", "--checkpoint", str(lm_checkpoint(LM))]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        line = process.stdout.readline()  # once loaded
        assert line.strip() == f"the head explorer is at http://127.0.0.1:{port}/ (Ctrl-C stops it)"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:
            assert page.status == 200 and b"explorer-settings" in page.read()
        status, answer = post(f"http://127.0.0.1:{port}/api/explore", {"text": TEXT})
        assert status == 200 and answer["text"] == TEXT
        assert post(f"http://127.0.0.1:{port}/api/explore", {"text": ""}) == (
            400,
            {"error": "the text is empty: type or paste some"},
        )
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()
    check_port_free(port)  # nothing listens there any more


def test_tokens_show_as_their_text_their_id_or_bracketed_past_the_tokenizers_vocabulary(explorer_app):
    tokenizer = explorer_app.lm.tokenizer
    cat = tokenizer.encode(" cat").ids[0]
    assert text_of(tokenizer, cat) == tokenizer.decode([cat]) and text_of(None, cat) == str(cat)
    past = tokenizer.get_vocab_size() + 3  # a model's vocabulary may outgrow its tokenizer's
    assert text_of(tokenizer, past) == f"[{past}]"
