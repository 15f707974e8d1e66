"""Edits of next-token logits before a token is picked: penalties for repeats, bans, and biases.

    logits = penalize(logits, seen, generated, repetition=1.3, frequency=0.5, presence=0.2)  # [..., V]
    logits = ban(logits, eos_ids)                                                           # [..., V]
    logits = add_bias(logits, {50256: -100.0})                                              # [..., V]
    logits = only(logits, allowed_ids)                                                      # [..., V]
    logits = banned_words(logits, [(262, 3797), (3797,)], generated_ids)                    # [V]

Every function takes logits of any leading shape, `[V]` for one row or `[B, V]` for a
batch, and returns a new float32 array: the work is a few vectorised passes over
the vocabulary, never a Python loop over tokens. Which tokens a row has seen is a
boolean `[..., V]` and how often it generated each an int `[..., V]`
(`token_counts` makes them from ids; `max_gpt2.inference.token_history` keeps them
step by step).

`repetition` is Hugging Face's `repetition_penalty` (`RepetitionPenaltyLogitsProcessor`):
each token seen (the prompt and the tokens generated so far) has its logit
divided by the penalty where positive and multiplied by it where negative, once
however often it occurs. `frequency` and `presence` are OpenAI's penalties over the
generated tokens only: a token's logit loses `frequency` for each time it was
generated and `presence` once if it was. Repetition goes first, then the other
two, as MAX's sampler orders them. llama.cpp's penalties count otherwise: all three over the last
`n` tokens of the prompt and the text alike (`last_counts`, for both `seen` and `generated`), with the
same arithmetic. `ban` gives ids the lowest float32 logit (`only`: every id but those given;
`banned_words`: each word's last token where the text so far ends with the rest, as vLLM's
`bad_words`), so no sampler or argmax picks them (Hugging Face bans with -inf; the lowest finite
value keeps a softmax over a row whose every token is banned defined).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

LOWEST = np.finfo(np.float32).min


def token_counts(ids: np.ndarray | Sequence[int], vocab: int) -> np.ndarray:
    """How often each token id occurs in `ids` (int [n]), int64 `[vocab]`."""
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab)[:vocab]


def last_counts(ids: np.ndarray | Sequence[int], n: int, vocab: int) -> np.ndarray:
    """How often each token id occurs among the last `n` of `ids` (none where `n` is 0), int64 `[vocab]`:
    what llama.cpp's penalties count (its `penalty_last_n` tokens of the prompt and the text)."""
    ids = np.asarray(ids, dtype=np.int64)
    return token_counts(ids[max(0, len(ids) - n) :] if n > 0 else ids[:0], vocab)


def penalize(
    logits: np.ndarray,
    seen: np.ndarray,
    generated: np.ndarray,
    repetition: float = 1.0,
    frequency: float = 0.0,
    presence: float = 0.0,
) -> np.ndarray:
    """`logits` (float [..., V]) with the penalties applied, float32; `seen` (bool [..., V]) marks the
    tokens the repetition penalty counts, `generated` (int [..., V]) how often the frequency and presence
    penalties count each: the prompt's and the text's, and the text's (or `last_counts` for both)."""
    scores = np.array(logits, dtype=np.float32)
    # Only the tokens seen are computed: a boolean mask's pass over the vocabulary, then their values.
    if repetition != 1.0:
        values = scores[seen]
        scores[seen] = np.where(values < 0, values * np.float32(repetition), values / np.float32(repetition))
    if frequency or presence:
        counted = generated > 0
        scores[counted] -= (generated[counted] * frequency + presence).astype(np.float32)
    return scores


def add_bias(logits: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """`logits` (float [..., V]) with each id's bias added (OpenAI's `logit_bias`), as a new float32 array."""
    scores = np.array(logits, dtype=np.float32)
    ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
    scores[..., ids] += np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
    return scores


def ban(logits: np.ndarray, ids: np.ndarray | Sequence[int]) -> np.ndarray:
    """`logits` (float [..., V]) with `ids` set to the lowest float32 in every row, as a new float32
    array; ids outside the vocabulary (an end-of-text id past a small one) are no token and are skipped."""
    scores = np.array(logits, dtype=np.float32)
    ids = np.asarray(list(ids), dtype=np.int64)
    scores[..., ids[(ids >= 0) & (ids < scores.shape[-1])]] = LOWEST
    return scores


def only(logits: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """`logits` (float [..., V]) with every id but `ids` banned (vLLM's `allowed_token_ids`), as a new
    float32 array."""
    scores = np.full_like(np.asarray(logits, dtype=np.float32), LOWEST)
    kept = np.asarray(ids, dtype=np.int64)
    scores[..., kept] = np.asarray(logits, dtype=np.float32)[..., kept]
    return scores


def banned_words(logits: np.ndarray, words: Sequence[Sequence[int]], generated: Sequence[int]) -> np.ndarray:
    """`logits` [V] with the last id of each of `words` (ids, at least one) banned where the `generated`
    ids end with the rest of it (a word of one id always), as vLLM bans its `bad_words`, as a new float32
    array."""
    tail = list(generated)
    return ban(
        logits, [word[-1] for word in words if len(word) == 1 or tail[-(len(word) - 1) :] == list(word[:-1])]
    )
