"""What each row of a generation has seen so far, kept step by step for the logit controls.

    history = TokenHistory(ids, mask, vocab, ngram_size=3)   # the prompt's real tokens
    history.append(tokens)                                   # one new token per row, [B]
    history.seen, history.generated                          # bool and int [B, V], for `penalize`
    history.banned_ngrams()                                  # per row, the ids no_repeat_ngram_size bans
    history = history.reordered(rows)                        # beam search: row b takes row rows[b]'s

Padding is no token: it is neither seen nor part of an n-gram (Hugging Face's
processors see the pad id as a token of the row). A step costs O(B * V) array
work for `seen` and `generated` plus O(B) dictionary work for the n-grams: the
table of each row maps every (n-1)-gram to the tokens that followed it, grown by
one entry a step, so no step rescans the tokens.
"""

from __future__ import annotations

import numpy as np


class TokenHistory:
    """Each row's real tokens: `seen` bool [B, V] (prompt and generated), `generated` int32 [B, V]
    (how often each was generated), and with `ngram_size` n each row's n-gram table."""

    def __init__(self, ids: np.ndarray, mask: np.ndarray, vocab: int, ngram_size: int = 0) -> None:
        batch = ids.shape[0]
        self.seen = np.zeros((batch, vocab), dtype=bool)
        rows, columns = np.nonzero(mask)
        self.seen[rows, ids[rows, columns]] = True
        self.generated = np.zeros((batch, vocab), dtype=np.int32)
        self.ngram_size = ngram_size
        self.tokens: list[list[int]] = []
        self.ngrams: list[dict[tuple[int, ...], tuple[int, ...]]] = []
        if ngram_size:
            self.tokens = [row[real == 1].tolist() for row, real in zip(ids, mask, strict=True)]
            self.ngrams = [_ngram_table(tokens, ngram_size) for tokens in self.tokens]

    def append(self, tokens: np.ndarray) -> None:
        """Adds one token per row, int [B]."""
        rows = np.arange(tokens.shape[0])
        self.seen[rows, tokens] = True
        self.generated[rows, tokens] += 1
        n = self.ngram_size
        if not n:
            return
        for row_tokens, table, token in zip(self.tokens, self.ngrams, tokens.tolist(), strict=True):
            row_tokens.append(token)
            if len(row_tokens) >= n:
                prefix = tuple(row_tokens[len(row_tokens) - n : -1])
                table[prefix] = (*table.get(prefix, ()), token)

    def banned_ngrams(self) -> list[tuple[int, ...]]:
        """Per row, the tokens that would repeat an n-gram the row holds (Hugging Face's
        `NoRepeatNGramLogitsProcessor`): those that followed its last n - 1 tokens before."""
        n = self.ngram_size
        return [
            table.get(tuple(tokens[len(tokens) - n + 1 :]), ()) if len(tokens) >= n - 1 else ()
            for tokens, table in zip(self.tokens, self.ngrams, strict=True)
        ]

    def reordered(self, rows: np.ndarray) -> TokenHistory:
        """A history whose row b is this one's row `rows[b]` (int [B']). A row taken by several gets
        its own copies of its token list and n-gram table (the table's values are tuples, shared)."""
        new = TokenHistory.__new__(TokenHistory)
        new.seen, new.generated, new.ngram_size = self.seen[rows], self.generated[rows], self.ngram_size
        new.tokens, new.ngrams, taken = [], [], set()
        for row in rows.tolist() if self.ngram_size else ():
            shared = row not in taken
            new.tokens.append(self.tokens[row] if shared else list(self.tokens[row]))
            new.ngrams.append(self.ngrams[row] if shared else dict(self.ngrams[row]))
            taken.add(row)
        return new


def _ngram_table(tokens: list[int], n: int) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Every (n-1)-gram of `tokens` -> the tokens that followed it, in order."""
    table: dict[tuple[int, ...], tuple[int, ...]] = {}
    for end in range(n, len(tokens) + 1):
        prefix = tuple(tokens[end - n : end - 1])
        table[prefix] = (*table.get(prefix, ()), tokens[end - 1])
    return table
