"""Scoring text with a compiled language model: log-probabilities of tokens, and perplexity.

    lp = lm.logprobs(input_ids, attention_mask)   # float32 [batch, seq]: log p(token t | tokens before t)
    scores = lm.score(input_ids, top_k=5)         # the same, and the 5 likeliest tokens at each position
    result = lm.perplexity("some text")           # Perplexity(tokens, nll, perplexity, bits_per_byte)

`score`, `logprobs` and `perplexity` are `Steps`'s methods. A token's
log-probability comes from the logits at the position before it, through a
log-softmax over the vocabulary taken inside the graph (the "scores" variant,
`max_gpt2.model.layers.gpt2.next_token_logprobs`): the graph returns `[batch, seq]`, and the
`[seq, vocab]` logits never reach the host. `score(top_k=k)` takes the k likeliest
alternatives at each position from the same graph ranking `RANKED` of them (the
"ranked" variant). A position with no token before it (the first of a row, its
padding, and padding itself) has none: NaN.

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
from typing import Any, NamedTuple

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.inference.prompts import check_prompt, check_vocabulary, int_array
from max_gpt2.inference.steps import Steps
from max_gpt2.inference.tokenizer import token_bytes
from max_gpt2.model.layers.variants import RANKED

# Most bytes of logits the scoring graph holds at once when windows are batched: GPT-2's windows of
# 1024 tokens scoring their second half hold 103 MB each. 256 MB ran no faster and held 200-340 MB
# more at its peak (docs/performance.md).
WINDOW_LOGITS_BYTES = 128 << 20


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
    tokens_run: int  # tokens run through the model: every window's, context included

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    @property
    def bits_per_byte(self) -> float | None:
        """Total negative log-likelihood in bits over the bytes of the tokens scored."""
        return None if not self.bytes else self.nll * self.tokens / math.log(2) / self.bytes


def score(lm: Steps, input_ids: Any, attention_mask: Any = None, top_k: int = 0) -> Scores:
    """Every token's log-probability given the tokens before it, and the `top_k` (at most `RANKED`)
    likeliest at each position. `input_ids` [batch, seq], left-padded with `attention_mask` as for
    `logits`."""
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 0 <= top_k <= RANKED:
        raise ValueError(f"top_k must be an integer in 0..{RANKED}, got {top_k!r}")
    ids, mask = check_prompt(lm.config, input_ids, attention_mask)
    top_k = min(int(top_k), lm.config.vocab_size)
    batch, seq_len = ids.shape
    chosen = np.full((batch, seq_len), np.nan, dtype=np.float32)
    top_ids = np.full((batch, seq_len, top_k), -1, dtype=np.int64)
    top_logprobs = np.full((batch, seq_len, top_k), np.nan, dtype=np.float32)
    if seq_len > 1 and top_k:
        chosen[:, 1:], values, ranked = lm.next_token_logprobs(ids, mask, 1, ranked=True)
        order = np.argsort(-values, axis=-1, kind="stable")[..., :top_k]  # likeliest first
        top_logprobs[:, 1:] = np.take_along_axis(values, order, axis=-1)
        top_ids[:, 1:] = np.take_along_axis(ranked, order, axis=-1)
    elif seq_len > 1:
        chosen[:, 1:] = lm.next_token_logprobs(ids, mask, 1)
    # Token t has a log-probability when it is real and a real token precedes it.
    none = np.zeros_like(chosen, dtype=bool)
    none[:, 1:] = ~((mask[:, 1:] == 1) & (np.cumsum(mask, axis=1)[:, :-1] > 0))
    chosen[none], top_ids[none], top_logprobs[none] = np.nan, -1, np.nan
    return Scores(chosen, top_ids, top_logprobs)


def logprobs(lm: Steps, input_ids: Any, attention_mask: Any = None) -> np.ndarray:
    """Each token's log-probability given the tokens before it, float32 `[batch, seq]` (NaN: none)."""
    return score(lm, input_ids, attention_mask).logprobs


def perplexity(
    lm: Steps,
    text_or_ids: str | Any,
    stride: int | None = None,
    tokenizer: Tokenizer | None = None,
    progress: Callable[[int, int], None] | None = None,
    chunks: bool = False,
) -> Perplexity:
    """The perplexity of a text (a string, with `tokenizer` or `lm.tokenizer`) or of token ids `[seq]`.

    Windows of `n_positions` tokens every `stride` tokens (default: half of
    `n_positions`), as in Hugging Face's guide, or with `chunks` llama-perplexity's
    side-by-side windows scoring their second half (module docstring; `stride` is then
    not taken). `progress(done, total)` is called as windows finish. Bytes (for bits
    per byte) are known where a tokenizer is, given or the model's.
    """
    tokenizer = tokenizer or lm.tokenizer
    if isinstance(text_or_ids, str):
        if tokenizer is None:
            raise ValueError("scoring text needs a tokenizer: pass tokenizer=, or give token ids")
        ids = np.array(tokenizer.encode(text_or_ids).ids, dtype=np.int64)
    else:
        ids = int_array(text_or_ids, "token ids", ("seq",))
        check_vocabulary(ids, lm.config.vocab_size, "token ids")
    if ids.size < 2:
        raise ValueError(f"perplexity needs at least 2 tokens (the first is never scored), got {ids.size}")
    window = lm.config.n_positions
    if chunks:
        if stride is not None:
            raise ValueError("chunks=True scores side-by-side windows: it takes no stride")
        if ids.size < window:
            raise ValueError(
                f"chunks=True needs at least one whole window of {window} tokens, got {ids.size}"
            )
        half = window // 2 + 1  # llama-perplexity's: the logits from position n_ctx / 2 on
        plan = [(begin, begin + window, begin + half) for begin in range(0, ids.size - window + 1, window)]
    else:
        stride = max(1, window // 2) if stride is None else stride
        if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not 0 < stride <= window:
            raise ValueError(f"stride must be an integer in 1..n_positions={window}, got {stride!r}")
        plan = sliding_windows(ids.size, window, int(stride))
    total_nll, scored_ids, done = 0.0, [], 0
    for group in batches(plan, lm.config.vocab_size):
        begin, _, first = group[0]
        rows = np.stack([ids[b:e] for b, e, _ in group])  # [W, window]
        new = lm.next_token_logprobs(rows, np.ones_like(rows), first - begin)  # [W, tokens scored each]
        total_nll -= float(new.astype(np.float64).sum())
        scored_ids += [ids[f:e] for _, e, f in group]
        done += len(group)
        if progress is not None:
            progress(done, len(plan))
    tokens = np.concatenate(scored_ids)
    n_bytes = sum(len(token_bytes(tokenizer, int(id_))) for id_ in tokens) if tokenizer else None
    run = sum(end - begin for begin, end, _ in plan)
    return Perplexity(int(tokens.size), total_nll / tokens.size, n_bytes, len(plan), run)


def sliding_windows(length: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """Hugging Face's windows over `length` tokens: (begin, end, first token scored) each, every token
    but the text's first scored once, by the earliest window that reaches it."""
    plan, previous_end = [], 0
    for begin in range(0, max(1, length - window + stride), stride):
        end = min(begin + window, length)
        plan.append((begin, end, max(begin + 1, previous_end)))
        previous_end = end
    return plan


def batches(plan: list[tuple[int, int, int]], vocab: int) -> list[list[tuple[int, int, int]]]:
    """`plan`'s windows in runs of one shape (length, first scored), each run no more windows than keep
    its logits within `WINDOW_LOGITS_BYTES`."""
    runs: list[list[tuple[int, int, int]]] = []
    for begin, end, first in plan:
        most = max(1, WINDOW_LOGITS_BYTES // ((end - first) * vocab * 4))
        last = runs[-1] if runs else None
        if (
            last
            and len(last) < most
            and (last[0][1] - last[0][0], last[0][2] - last[0][0]) == (end - begin, first - begin)
        ):
            last.append((begin, end, first))
        else:
            runs.append([(begin, end, first)])
    return runs
