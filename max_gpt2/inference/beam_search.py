"""Beam search, as Hugging Face's `generate(num_beams=k)` runs it, on the KV cache of `Steps`.

    out = lm.generate(ids, 20, num_beams=4, num_return_sequences=2, length_penalty=1.0, early_stopping=False)

Each prompt runs as k rows of one batch. A step takes the log-softmax of each
row's logits, applies the sampler's logits controls (over each beam's own
tokens), adds the beam's score, and keeps the best `max(2, 1 + n_eos) * k`
continuations of the prompt's k x vocab: those ending in end-of-text (or at the
last step) among the first k become finished hypotheses, scored
sum(log-probs) / new_tokens ** length_penalty and kept if among the k best; the k
best of the rest run on. `early_stopping` decides when finished hypotheses are
enough (True: k of them; False: once no running beam can beat the worst by
Hugging Face's heuristic; "never": as False, with the longest possible length
where `length_penalty` > 0). This is Hugging Face's vectorised `_beam_search`,
written over NumPy arrays of `[batch, beams, ...]`.

The cache follows the beams without leaving the device: `Steps.reorder_cache`
copies each row that changes from its parent row in place, by a graph (on the CPU
one Mojo op a layer, `gpt2_reorder_rows`); rows whose beam stays are not touched,
nor the positions where a row's tokens equal its parent's (the prompt, and the
tokens the two beams share), whose keys and values are already the same.
"""

from __future__ import annotations

import numpy as np

from max_gpt2.inference.generation_options import Options
from max_gpt2.inference.logit_controls import ban
from max_gpt2.inference.steps import Steps

BLOCK = 256  # values a block in `top`'s first cut
WORST = np.float32(-1.0e9)  # Hugging Face's score for what must not be chosen
# Scores are float32, as Hugging Face keeps them; float64 made the host's share of a 4-beam step
# about ten times larger (docs/performance.md).


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis, float32."""
    scores = np.asarray(logits, dtype=np.float32)
    shifted = scores - scores.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the `k` largest of each row of `scores` [B, N], largest first, [B, k].

    A long row (a step's k x vocab) is first cut to the values at least the k-th largest maximum of
    its blocks of `BLOCK`, which holds the k largest: partitioning all of it took ten times as long.
    """
    if scores.shape[1] <= BLOCK * k:
        chosen = np.argpartition(scores, -k, axis=-1)[:, -k:]
        order = np.argsort(-np.take_along_axis(scores, chosen, axis=-1), axis=-1, kind="stable")
        return np.take_along_axis(chosen, order, axis=-1)
    maxima = np.maximum.reduceat(scores, np.arange(0, scores.shape[1], BLOCK), axis=1)  # [B, N / BLOCK]
    floors = np.partition(maxima, -k, axis=1)[:, -k:].min(axis=1)  # [B]: k values at least this
    rows = []
    for row, floor in zip(scores, floors, strict=True):
        candidates = np.flatnonzero(row >= floor)
        rows.append(candidates[top(row[candidates][None], k)[0]])
    return np.stack(rows)


def beam_search(lm: Steps, ids: np.ndarray, mask: np.ndarray, options: Options) -> np.ndarray:
    """Each prompt's `num_return_sequences` best sequences, int64 `[batch x n, seq + longest]`."""
    sampler, eos, steps, k = options.sampler, options.eos, options.max_new_tokens, options.num_beams
    batch, seq_len = ids.shape
    vocab = lm.config.vocab_size
    rows_ids, rows_mask = np.repeat(ids, k, axis=0), np.repeat(mask, k, axis=0)
    cache = lm.new_cache(batch * k, seq_len + steps)
    logits = lm.prefill(rows_ids, cache, rows_mask)
    history = sampler.history(rows_ids, rows_mask, vocab)
    keep = max(2, 1 + len(eos)) * k
    eos_ids = np.array(eos, dtype=np.int64)
    fill = options.pad if options.pad is not None else 0
    running = np.full((batch, k, steps), fill, dtype=np.int64)  # each beam's new tokens
    running_scores = np.zeros((batch, k), dtype=np.float32)
    running_scores[:, 1:] = WORST  # every beam starts as the prompt: continue the first only
    done = np.full((batch, k, steps), fill, dtype=np.int64)  # the best finished hypotheses
    done_scores, done_lengths = np.full((batch, k), WORST), np.zeros((batch, k), dtype=np.int64)  # float32
    is_done = np.zeros((batch, k), dtype=bool)
    can_improve = np.ones((batch, 1), dtype=bool)
    offsets = (np.arange(batch) * k)[:, None]
    for step in range(steps):
        scores = sampler.controlled(log_softmax(logits), history)
        if step < options.min_new_tokens and eos:
            scores = ban(scores, eos)
        scores = scores.reshape(batch, k, vocab) + running_scores[:, :, None]
        chosen = top(scores.reshape(batch, k * vocab), keep)  # [batch, keep]
        chosen_scores = np.take_along_axis(scores.reshape(batch, k * vocab), chosen, axis=-1)
        parents, tokens = chosen // vocab, chosen % vocab
        candidates = np.take_along_axis(running, parents[:, :, None], axis=1)
        candidates[:, :, step] = tokens
        ends = np.isin(tokens, eos_ids) | (step == steps - 1)

        # The best k that go on.
        going_on = chosen_scores + ends * WORST
        best = top(going_on, k)
        fed = running[:, :, :step]  # each beam's tokens in the cache after the prompt
        running = np.take_along_axis(candidates, best[:, :, None], axis=1)
        running_scores = np.take_along_axis(going_on, best, axis=-1)
        parent_beams = np.take_along_axis(parents, best, axis=-1)  # [batch, k]
        parent_rows = (parent_beams + offsets).reshape(-1)
        same = np.take_along_axis(fed, parent_beams[:, :, None], axis=1) == fed  # [batch, k, step]
        kept = seq_len + np.cumprod(same, axis=-1).sum(axis=-1).reshape(-1)  # positions already equal

        # The finished: those of the first k that ended, if better than the worst kept.
        just_done = ends & (np.arange(keep) < k)[None, :]
        finished_scores = chosen_scores / float(step + 1) ** options.length_penalty
        full = is_done.all(axis=1, keepdims=True) & (options.early_stopping is True)
        finished_scores = finished_scores + (full | ~can_improve | ~just_done) * WORST
        merged = top(np.concatenate([done_scores, finished_scores], axis=1), k)
        done = np.take_along_axis(np.concatenate([done, candidates], axis=1), merged[:, :, None], axis=1)
        done_scores = np.take_along_axis(
            np.concatenate([done_scores, finished_scores], axis=1), merged, axis=-1
        )
        lengths = np.concatenate([done_lengths, np.full((batch, keep), step + 1)], axis=1)
        done_lengths = np.take_along_axis(lengths, merged, axis=-1)
        is_done = np.take_along_axis(np.concatenate([is_done, just_done], axis=1), merged, axis=-1)

        # Hugging Face's heuristic: the best a running beam could score, at its longest where that helps.
        longest = options.early_stopping == "never" and options.length_penalty > 0
        best_length = steps if longest else step + 1
        best_running = running_scores[:, :1] / float(best_length) ** options.length_penalty
        worst_done = np.where(is_done, done_scores.min(axis=1, keepdims=True), WORST)
        can_improve &= (best_running > worst_done).any(axis=-1, keepdims=True)
        all_done = is_done.all() and options.early_stopping is True
        if not can_improve.any() or all_done or ends.all():
            break
        new_tokens = running[:, :, step].reshape(-1)
        if history is not None:
            history = history.reordered(parent_rows)
            history.append(new_tokens)
        lm.reorder_cache(cache, parent_rows, kept)
        logits = lm.decode_step(new_tokens, cache)

    returned = options.num_return_sequences
    longest = int(done_lengths[:, :returned].max())
    sequences = done[:, :returned, :longest].reshape(batch * returned, longest)
    return np.concatenate([np.repeat(ids, returned, axis=0), sequences], axis=1)
