"""Drafts for speculative decoding: tokens guessed cheaply, for the model to check several at once.

A decoding step at batch 1 reads every weight for one token; `extend` checks S drafted tokens in
one read (`max_gpt2.inference.generation` keeps the ones the model itself would have chosen). A
drafter proposes the tokens that may follow a row's sequence so far:

    PromptLookup(10)          the tokens that followed the last n-gram (n = 2, then 1) where it
                              occurred earlier in the sequence: Hugging Face's
                              `prompt_lookup_num_tokens`, for text that repeats its input
    AssistantModel(draft, 8)  a smaller model's greedy continuation, its own KV cache in step:
                              Hugging Face's `assistant_model` and `num_assistant_tokens`

How many tokens a draft may hold adapts (`Pacing`, kept by `Speculation`, the same for every
drafter): 2 at first, twice as many after a draft accepted whole (up to K), one more than were
accepted after one cut short, and after a draft of which nothing was accepted one, once drafting
has paused for a step, then 2, 4, ... 16 after each such draft in a row: text with nothing to guess
costs little more than plain decoding, and a run of right guesses soon drafts K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from max_gpt2.inference.kv_cache import KVCache
from max_gpt2.inference.steps import Steps

LONGEST_PAUSE = 16  # steps without drafting after drafts of which nothing was accepted, at most
FIRST_SIZE = 2  # the first draft's tokens, at most: a wrong first guess costs little


class Pacing:
    """How many tokens to draft next, from how the last drafts fared (module docstring)."""

    def __init__(self, most: int) -> None:
        self.most, self.size, self.pause, self.paused = most, min(most, FIRST_SIZE), 0, 0

    def next_size(self) -> int:
        """Tokens to draft at this step: 0 while paused."""
        if self.paused:
            self.paused -= 1
            return 0
        return self.size

    def record(self, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens of which the first `accepted` were accepted."""
        self.size = min(self.most, 2 * drafted) if accepted == drafted else accepted + 1
        self.pause = 0 if accepted else min(LONGEST_PAUSE, max(1, 2 * self.pause))
        self.paused = self.pause


class Drafter(Protocol):
    """Proposes tokens to follow a sequence (one row: batch 1), and hears how many were accepted."""

    most: int  # tokens a draft holds at most (K)

    def check(self, capacity: int) -> None:
        """Refuses, before any work, a generation of up to `capacity` positions it cannot draft for."""

    def start(self, ids: np.ndarray, mask: np.ndarray, capacity: int) -> None:
        """A new generation from the prompt `ids`, `mask` [1, seq], of up to `capacity` positions."""

    def propose(self, sequence: np.ndarray, size: int) -> np.ndarray:
        """Up to `size` (>= 1) tokens (int64 [n], maybe none) to follow `sequence` (int64 [length]: the
        prompt's tokens, padding left out, and every token chosen since)."""

    def record(self, drafted: int, accepted: int) -> None:
        """The last proposal of `drafted` tokens had its first `accepted` accepted."""


class PromptLookup:
    """Drafts by looking the sequence's last n-gram up in the sequence itself (module docstring).

    The last `max_ngram` tokens, then fewer down to one, are looked for earlier in the sequence;
    at the first place one occurs, the tokens that followed it there are the draft (Hugging Face's
    `PromptLookupCandidateGenerator` rule).
    """

    def __init__(self, num_tokens: int, max_ngram: int = 2) -> None:
        self.most, self.max_ngram = num_tokens, max_ngram

    def check(self, capacity: int) -> None:
        pass

    def start(self, ids: np.ndarray, mask: np.ndarray, capacity: int) -> None:
        pass

    def propose(self, sequence: np.ndarray, size: int) -> np.ndarray:
        length = len(sequence)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            # Where an earlier n-gram (starting before length - n) equals the last one, token by token.
            same = sequence[: length - n] == sequence[length - n]
            for j in range(1, n):
                same &= sequence[j : length - n + j] == sequence[length - n + j]
            starts = np.flatnonzero(same)
            if starts.size:
                first = int(starts[0]) + n
                return sequence[first : first + size]
        return sequence[:0]

    def record(self, drafted: int, accepted: int) -> None:
        pass


class AssistantModel:
    """Drafts with a smaller model's greedy tokens (module docstring). Its KV cache holds the sequence's
    first tokens and the draft's; what the main model did not keep is dropped from it, and the
    tokens it has not seen are run into it before the next draft."""

    def __init__(self, lm: Steps, num_tokens: int) -> None:
        self.lm, self.most = lm, num_tokens
        self.cache: KVCache | None = None
        self.held = 0  # tokens of the sequence (then of the draft) the cache holds

    def check(self, capacity: int) -> None:
        if self.lm.config.n_positions < capacity:
            raise ValueError(
                f"assistant_model's n_positions={self.lm.config.n_positions} is shorter than the prompt "
                f"and its new tokens ({capacity} positions)"
            )

    def start(self, ids: np.ndarray, mask: np.ndarray, capacity: int) -> None:
        self.cache = self.lm.new_cache(1, capacity)
        tokens = ids[mask == 1]  # one row: its padding is left out, as the positions leave it out
        # The prompt but its last token, so that every proposal runs at least one token in.
        if len(tokens) > 1:
            self.lm.prefill(tokens[None, :-1], self.cache)
        self.held = len(tokens) - 1

    def propose(self, sequence: np.ndarray, size: int) -> np.ndarray:
        assert self.cache is not None, "start comes first"
        new = sequence[self.held :]
        if self.cache.length == 0:
            logits = self.lm.prefill(new[None], self.cache)
        else:
            logits = self.lm.extend(new[None], self.cache)[:, -1]
        draft = [int(np.argmax(logits[0]))]
        while len(draft) < size:
            draft.append(int(np.argmax(self.lm.decode_step(np.array(draft[-1:]), self.cache)[0])))
        self.held = len(sequence) + size - 1
        return np.array(draft, dtype=np.int64)

    def record(self, drafted: int, accepted: int) -> None:
        assert self.cache is not None
        dropped = max(0, drafted - 1 - accepted)  # the draft's tokens run into the cache but not accepted
        if dropped > 0:
            self.cache.truncate(self.cache.length - dropped)
            self.held -= dropped


@dataclass
class DraftCounts:
    """Tokens drafted in a generation, and how many of them were accepted."""

    drafted: int = 0
    accepted: int = 0


class Speculation:
    """One row's drafts in flight: the drafted tokens the model has run (in the KV cache, with the logits
    after each) that generation has not reached yet, and the counts of drafted and accepted tokens.

    After token t is chosen, `run` drafts d1..dn to follow it and extends the cache by t, d1..dn at
    once: the logits after t come back, the others wait. When the next token is chosen, `take`
    hands on the logits after d1 if it is d1 (accepted), else drops d1..dn from the cache.
    """

    def __init__(self, drafter: Drafter, prompt: np.ndarray, capacity: int, counts: DraftCounts) -> None:
        self.drafter, self.counts, self.pacing = drafter, counts, Pacing(drafter.most)
        self.tokens = np.zeros(capacity, dtype=np.int64)  # the sequence: the prompt, then each token chosen
        self.tokens[: len(prompt)], self.length = prompt, len(prompt)
        self.waiting: list[tuple[int, np.ndarray]] = []  # (drafted token, logits [1, vocab] after it)
        self.size = self.accepted = 0  # of the draft in flight

    def take(self, token: int, cache: KVCache) -> np.ndarray | None:
        """The chosen `token`: the logits after it where it is the next drafted token (already run), else
        None, the drafts in flight dropped from `cache`."""
        self.tokens[self.length] = token
        self.length += 1
        if not self.waiting:
            return None
        drafted, logits = self.waiting.pop(0)
        if drafted == token:
            self.counts.accepted, self.accepted = self.counts.accepted + 1, self.accepted + 1
            if not self.waiting:
                self._record()
            return logits
        cache.truncate(cache.length - 1 - len(self.waiting))
        self.waiting = []
        self._record()
        return None

    def _record(self) -> None:
        """The draft in flight is decided: its size and how many were accepted, told to both who ask."""
        self.pacing.record(self.size, self.accepted)
        self.drafter.record(self.size, self.accepted)

    def run(self, lm: Steps, cache: KVCache, remaining: int) -> np.ndarray:
        """Runs the last chosen token into `cache`, with up to `remaining` drafted tokens after it; the
        logits after it, float32 [1, vocab]."""
        token = int(self.tokens[self.length - 1])
        room = min(remaining, cache.capacity - cache.length - 1)
        size = min(room, self.pacing.next_size()) if room > 0 else 0
        draft = self.drafter.propose(self.tokens[: self.length], size) if size > 0 else []
        if not len(draft):
            return lm.decode_step(np.array([token]), cache)
        logits = lm.extend(np.array([[token, *draft]]), cache)[0]  # [1 + n, vocab]
        self.waiting = [(int(d), logits[i + 1 : i + 2]) for i, d in enumerate(draft)]
        self.size, self.accepted = len(draft), 0
        self.counts.drafted += len(draft)
        return logits[:1]
