"""Scoring text: log-probabilities and perplexity against the float64 reference, and the commands.

The reference side computes log-softmax of `reference.lm_logits_and_largest_score`
in float64 and runs Hugging Face's sliding window written out here, window by
window, on the reference model; ours must agree within 1e-4 (log-probabilities,
absolute) and 1e-4 (perplexity, relative).
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from max_gpt2 import GPT2Config, load_tokenizer, reference
from max_gpt2.testing import CORPUS
from tests.support import LM, run_python
from tests.test_lm import left_padding, prompts


def reference_logprobs(ids: np.ndarray, weights, mask=None, config: GPT2Config = LM) -> np.ndarray:
    """log p(token t | tokens before t) in float64 [batch, seq], from the reference's logits; NaN at none."""
    logits, _ = reference.lm_logits_and_largest_score(ids, weights, config, mask)
    shifted = logits - logits.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    expected = np.full(ids.shape, np.nan)
    mask = np.ones_like(ids) if mask is None else mask
    for row in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            if mask[row, t] and mask[row, :t].any():
                expected[row, t] = log_softmax[row, t - 1, ids[row, t]]
    return expected


def reference_perplexity(ids: np.ndarray, weights, stride: int) -> tuple[float, int]:
    """Hugging Face's sliding window ("Perplexity of fixed-length models"), on the reference model."""
    nll_sum, counted, previous_end = 0.0, 0, 0
    for begin in range(0, ids.size, stride):
        end = min(begin + LM.n_positions, ids.size)
        target_length = end - previous_end
        window = ids[begin:end]
        logprobs = reference_logprobs(window[None], weights)[0]
        targets = logprobs[len(window) - target_length :]  # the window's last target_length tokens
        targets = targets[~np.isnan(targets)]  # the window's first token predicts nothing
        nll_sum -= targets.sum()
        counted += targets.size
        previous_end = end
        if end == ids.size:
            break
    return math.exp(nll_sum / counted), counted


def test_logprobs_match_the_reference_with_left_padding(compiled_lm, lm_weights):
    lm, weights = compiled_lm(LM), lm_weights(LM)
    ids, mask = prompts(LM, 3, 9, seed=11), left_padding(3, 9)
    ours = lm.logprobs(ids, mask)
    expected = reference_logprobs(ids, weights, mask)
    assert ours.dtype == np.float32 and ours.shape == (3, 9)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))  # first tokens and padding
    assert np.isnan(ours[:, 0]).all() and np.isnan(ours[2, :5]).all()
    np.testing.assert_allclose(ours[~np.isnan(ours)], expected[~np.isnan(expected)], rtol=0, atol=1e-4)


def test_top_alternatives_are_the_true_top_k(compiled_lm, lm_weights):
    lm, weights = compiled_lm(LM), lm_weights(LM)
    ids = prompts(LM, 2, 7, seed=12)
    scores = lm.score(ids, top_k=5)
    logits, _ = reference.lm_logits_and_largest_score(ids, weights, LM)
    log_softmax = logits - logits.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    for row in range(2):
        for t in range(1, 7):
            order = np.argsort(-log_softmax[row, t - 1])[:5]
            np.testing.assert_array_equal(scores.top_ids[row, t], order)
            np.testing.assert_allclose(scores.top_logprobs[row, t], log_softmax[row, t - 1, order], atol=1e-4)
    assert (scores.top_ids[:, 0] == -1).all() and np.isnan(scores.top_logprobs[:, 0]).all()
    np.testing.assert_array_equal(scores.logprobs, lm.logprobs(ids))
    padded = lm.score(ids, left_padding(2, 7), top_k=3)  # no alternatives where no log-probability
    none = np.isnan(padded.logprobs)
    assert none[1, :3].all() and (padded.top_ids[none] == -1).all()
    assert (padded.top_ids[~none] >= 0).all()


@pytest.mark.parametrize("stride", [LM.n_positions, 24, 17, 1])
def test_perplexity_of_a_text_longer_than_the_context(compiled_lm, lm_weights, stride):
    lm, weights = compiled_lm(LM), lm_weights(LM)
    ids = prompts(LM, 1, 3 * LM.n_positions + 5, seed=13)[0]
    result = lm.perplexity(ids, stride=stride)
    expected, counted = reference_perplexity(ids, weights, stride)
    assert result.tokens == counted
    assert result.perplexity == pytest.approx(expected, rel=1e-4)
    assert result.bytes is None and result.bits_per_byte is None  # ids alone say nothing of bytes


def test_chunks_score_as_llama_perplexity_does(compiled_lm, lm_weights):
    """`chunks=True`: side-by-side windows of n_positions tokens (a partial last one dropped), each
    scoring the tokens after position n_positions / 2, as llama.cpp's perplexity tool does."""
    lm, weights, window = compiled_lm(LM), lm_weights(LM), LM.n_positions
    ids = prompts(LM, 1, 2 * window + 7, seed=21)[0]
    result = lm.perplexity(ids, chunks=True)
    nll_sum, counted = 0.0, 0
    for begin in (0, window):
        logprobs = reference_logprobs(ids[None, begin : begin + window], weights)[0]
        nll_sum -= logprobs[window // 2 + 1 :].sum()
        counted += window - window // 2 - 1
    assert (result.tokens, result.windows, result.tokens_run) == (counted, 2, 2 * window)
    assert result.perplexity == pytest.approx(math.exp(nll_sum / counted), rel=1e-4)
    with pytest.raises(ValueError, match="takes no stride"):
        lm.perplexity(ids, stride=4, chunks=True)
    with pytest.raises(ValueError, match="at least one whole window of 48 tokens"):
        lm.perplexity(ids[: window - 1], chunks=True)


def test_perplexity_of_text_counts_its_bytes(compiled_lm, lm_checkpoint):
    lm, tokenizer = compiled_lm(LM), load_tokenizer(lm_checkpoint(LM))
    text = CORPUS.read_text(encoding="utf-8")[:600]
    ids = np.array(tokenizer.encode(text).ids)
    assert ids.size > LM.n_positions  # several windows
    disjoint = lm.perplexity(text, stride=LM.n_positions, tokenizer=tokenizer)
    assert disjoint.perplexity == pytest.approx(lm.perplexity(ids, stride=LM.n_positions).perplexity)
    # With disjoint windows, each window's first token goes unscored.
    unscored = ids[:: LM.n_positions]
    unscored_bytes = sum(len(tokenizer.decode([int(token)]).encode()) for token in unscored)
    assert disjoint.tokens == ids.size - unscored.size
    assert disjoint.bytes == len(text.encode("utf-8")) - unscored_bytes
    assert disjoint.bits_per_byte == pytest.approx(
        disjoint.nll * disjoint.tokens / math.log(2) / disjoint.bytes
    )


def test_scoring_refuses_what_it_cannot_score(compiled_lm):
    lm = compiled_lm(LM)
    with pytest.raises(ValueError, match="scoring text needs a tokenizer"):
        lm.perplexity("some text")
    with pytest.raises(ValueError, match=r"perplexity needs at least 2 tokens .* got 1"):
        lm.perplexity([5])
    for stride in (49, 0):  # 0 is no stride, not the default
        refused = rf"stride must be an integer in 1..n_positions=48, got {stride}$"
        with pytest.raises(ValueError, match=refused):
            lm.perplexity([5, 6, 7], stride=stride)
    with pytest.raises(ValueError, match=r"token ids must have shape \[seq\], got \[1, 3\]"):
        lm.perplexity([[5, 6, 7]])
    for top_k in (-1, 21):
        with pytest.raises(ValueError, match=f"top_k must be an integer in 0..20, got {top_k}"):
            lm.score([[5, 6]], top_k=top_k)


def test_score_command_prints_each_token(compiled_lm, lm_checkpoint):
    lm, path = compiled_lm(LM), lm_checkpoint(LM)
    done = run_python(
        "-m", "max_gpt2", "score", "--checkpoint", path, "--prompt", "The cat sat", "--top", "2"
    )
    assert done.returncode == 0, done.stderr
    ids = load_tokenizer(path).encode("The cat sat").ids
    done = run_python(
        "-m", "max_gpt2", "score", "--checkpoint", path, "--tokens", ",".join(map(str, ids)), "--json"
    )
    rows = json.loads(done.stdout)["tokens"]
    assert [row["id"] for row in rows] == ids and rows[0]["logprob"] is None
    tokenizer = load_tokenizer(path)
    assert [row["token"] for row in rows] == [tokenizer.decode([token]) for token in ids]  # text, unquoted
    expected = lm.logprobs(np.array([ids]))[0]
    np.testing.assert_allclose([row["logprob"] for row in rows[1:]], expected[1:], atol=1e-5)


def test_score_command_tells_nan_from_the_first_token(lm_checkpoint, tmp_path):
    """Weights that are not finite give NaN log-probabilities: shown as `nan`, not as the first token's `-`,
    with a warning naming the checkpoint."""
    broken = tmp_path / "broken"
    shutil.copytree(lm_checkpoint(LM), broken)
    tensors = load_file(broken / "model.safetensors")
    tensors["ln_f.weight"][0] = np.nan
    save_file(tensors, broken / "model.safetensors")
    done = run_python("-m", "max_gpt2", "score", "--checkpoint", broken, "--tokens", "3,5,7")
    assert done.returncode == 0, done.stderr
    shown = [line.split()[3] for line in done.stdout.splitlines()[1:]]  # position, id, token, logprob
    assert shown == ["-", "nan", "nan"], done.stdout
    assert f"NaN at 2 of 2 positions: its outputs are not finite (check {broken}'s weights)" in done.stderr


def test_perplexity_command_reports_each_file(compiled_lm, lm_checkpoint, tmp_path):
    lm, path = compiled_lm(LM), lm_checkpoint(LM)
    texts = {"a.txt": CORPUS.read_text(encoding="utf-8")[:400], "b.txt": "The cat sat on the mat."}
    for name, text in texts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    files = [str(tmp_path / name) for name in texts]
    done = run_python(
        "-m", "max_gpt2", "perplexity", "--checkpoint", path, *files, "--stride", "24", "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["files"]
    tokenizer = load_tokenizer(path)
    for name, text in texts.items():
        expected = lm.perplexity(text, stride=24, tokenizer=tokenizer)
        assert report[str(tmp_path / name)]["perplexity"] == pytest.approx(expected.perplexity, rel=1e-5)
        assert report[str(tmp_path / name)]["bits_per_byte"] == pytest.approx(
            expected.bits_per_byte, rel=1e-5
        )
    assert "window" in done.stderr  # progress on the long file
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    refused = run_python("-m", "max_gpt2", "perplexity", "--checkpoint", path, str(tmp_path / "bad.txt"))
    assert refused.returncode == 2 and "bad.txt is not UTF-8 text" in refused.stderr
