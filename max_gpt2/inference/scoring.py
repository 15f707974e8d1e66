"""Scoring text with a compiled language model: log-probabilities of tokens, and perplexity.

    lp = lm.logprobs(input_ids, attention_mask)   # float32 [batch, seq]: log p(token t | tokens before t)
    scores = lm.score(input_ids, top_k=5)         # the same, and the 5 likeliest tokens at each position
    result = lm.perplexity("some text")           # Perplexity(tokens, nll, perplexity, bits_per_byte)

`score`, `logprobs` and `perplexity` are `CompiledLM`'s methods, written here on its `logits`.
A token's log-probability comes from the logits at the position before it, through
a log-softmax over the vocabulary computed stably (the largest logit subtracted
before exponentiating, sums in float64). A position with no token before it
(the first of a row, its padding, and padding itself) has none: NaN.

Texts longer than `n_positions` are scored with Hugging Face's sliding window
(its "Perplexity of fixed-length models" guide): windows of `n_positions` tokens
start every `stride` tokens, and each window scores only the tokens no earlier
window scored, with up to `n_positions` tokens of context. The first token of the
text, and the first of any window that scores all of its tokens (`stride` =
`n_positions`), have no context and are not scored, as there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.inference.prompts import check_prompt
from max_gpt2.inference.tokenizer import token_bytes

if TYPE_CHECKING:
    from max_gpt2.inference.lm import CompiledLM


class Scores(NamedTuple):
    """Each token's log-probability, and the likeliest tokens where it was chosen (`top_k` of them)."""

    logprobs: np.ndarray  # float32 [batch, seq]; NaN where a token has no token before it
    top_ids: np.ndarray  # int64 [batch, seq, top_k], likeliest first; -1 where logprobs is NaN
    top_logprobs: np.ndarray  # float32 [batch, seq, top_k]; NaN where logprobs is NaN


@dataclass(frozen=True)
class Perplexity:
    """How well a model predicts a text: the mean negative log-likelihood of the tokens it scored."""

    tokens: int  # tokens scored
    nll: float  # mean negative log-likelihood per scored token, in nats
    bytes: int | None  # UTF-8 bytes of the scored tokens, where a tokenizer gives them
    windows: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    @property
    def bits_per_byte(self) -> float | None:
        """Total negative log-likelihood in bits over the bytes of the tokens scored."""
        return None if not self.bytes else self.nll * self.tokens / math.log(2) / self.bytes


def score(lm: CompiledLM, input_ids: Any, attention_mask: Any = None, top_k: int = 0) -> Scores:
    """Every token's log-probability given the tokens before it, and the `top_k` likeliest at each position.

    `input_ids` [batch, seq], left-padded with `attention_mask` as for `logits`.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer, got {top_k!r}")
    ids, mask = check_prompt(lm.config, input_ids, attention_mask)
    top_k = min(int(top_k), lm.config.vocab_size)
    logits = lm.logits(ids, mask)[:, :-1]  # [B, S - 1, V]: position t predicts token t + 1
    batch, seq_len = ids.shape
    logprobs = np.full((batch, seq_len), np.nan, dtype=np.float32)
    top_ids = np.full((batch, seq_len, top_k), -1, dtype=np.int64)
    top_logprobs = np.full((batch, seq_len, top_k), np.nan, dtype=np.float32)
    # Token t has a log-probability when it is real and a real token precedes it.
    scored = (mask[:, 1:] == 1) & (np.cumsum(mask, axis=1)[:, :-1] > 0)  # [B, S - 1]
    for row in range(batch):
        positions = np.flatnonzero(scored[row])
        if positions.size == 0:
            continue
        distribution = log_softmax(logits[row, positions])  # [P, V] float64, log p of each token
        targets = ids[row, positions + 1]
        logprobs[row, positions + 1] = distribution[np.arange(positions.size), targets]
        if top_k:
            best = np.argpartition(-distribution, top_k - 1, axis=-1)[:, :top_k]
            best_values = np.take_along_axis(distribution, best, axis=-1)
            order = np.argsort(-best_values, axis=-1, kind="stable")
            top_ids[row, positions + 1] = np.take_along_axis(best, order, axis=-1)
            top_logprobs[row, positions + 1] = np.take_along_axis(best_values, order, axis=-1)
    return Scores(logprobs, top_ids, top_logprobs)


def logprobs(lm: CompiledLM, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
    """Each token's log-probability given the tokens before it, float32 `[batch, seq]` (NaN: none)."""
    return lm.score(input_ids, attention_mask).logprobs


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, float64: the largest logit is subtracted before exponentiating."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def perplexity(
    lm: CompiledLM,
    text_or_ids: str | Any,
    stride: int | None = None,
    tokenizer: Tokenizer | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Perplexity:
    """The perplexity of a text (a string, with `tokenizer` or `lm.tokenizer`) or of token ids `[seq]`.

    Windows of `n_positions` tokens every `stride` tokens (default: half of
    `n_positions`), as in Hugging Face's guide (module docstring). `progress(done,
    total)` is called after each window. Bytes (for bits per byte) are known
    where a tokenizer is, given or the model's.
    """
    tokenizer = tokenizer or lm.tokenizer
    if isinstance(text_or_ids, str):
        if tokenizer is None:
            raise ValueError("scoring text needs a tokenizer: pass tokenizer=, or give token ids")
        ids = np.array(tokenizer.encode(text_or_ids).ids, dtype=np.int64)
    else:
        ids = np.asarray(text_or_ids)
        if ids.ndim != 1:
            raise ValueError(f"token ids must have shape [seq], got {list(ids.shape)}")
    if ids.size < 2:
        raise ValueError(f"perplexity needs at least 2 tokens (the first is never scored), got {ids.size}")
    window = lm.config.n_positions
    stride = stride or max(1, window // 2)
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not 0 < stride <= window:
        raise ValueError(f"stride must be an integer in 1..n_positions={window}, got {stride!r}")
    starts = list(range(0, max(1, ids.size - window + stride), stride))
    total_nll, scored_ids, previous_end = 0.0, [], 0
    for done, begin in enumerate(starts, start=1):
        end = min(begin + window, ids.size)
        new = lm.logprobs(ids[None, begin:end])[0, max(1, previous_end - begin) :]  # the unscored ones
        total_nll -= float(new.astype(np.float64).sum())
        scored_ids.append(ids[end - new.size : end])
        previous_end = end
        if progress is not None:
            progress(done, len(starts))
    tokens = np.concatenate(scored_ids)
    n_bytes = sum(len(token_bytes(tokenizer, int(id_))) for id_ in tokens) if tokenizer else None
    return Perplexity(int(tokens.size), total_nll / tokens.size, n_bytes, len(starts))
