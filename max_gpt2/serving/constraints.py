"""The served requests' constraints in the model worker: each constrained request's `RowGuide`,
kept up with its text, masking its next-token logits.

A request's guide is made at its first step from its context's `constraint` (a
`max_gpt2.inference.constraints.Constraint`'s kind and source, which the route has compiled once
already to refuse what the engine cannot), then advanced by the tokens its context has generated
since its last step, whichever path chose them (our argmax, several a scheduler step, or MAX's
sampler), so its mask always follows the text. Once the text is complete only end-of-text may
follow, and the request ends there with `finish_reason: "stop"`; one that reaches `max_tokens`
first ends with "length", as vLLM's. With prompt lookup a request's draft is cut at its first token
the constraint forbids, and each drafted position's logits are masked as after the drafted tokens
before it (the matcher rolled back after: only kept tokens advance it). The pipeline drops a
request's guide when MAX releases it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from max.pipelines.context import TextContext

from max_gpt2.inference.constraints import Constraint, GrammarEngine, RowGuide, blocked


def constraint_of(context: TextContext) -> tuple[str, str] | None:
    """The (kind, source) of `context`'s constraint; None where it has none (MAX's own contexts too)."""
    return getattr(context, "constraint", None)


class ServedConstraints:
    """The constrained requests' guides, by request id. `engine` gives the grammar engine for the
    model's vocabulary (the tokenizer's, made at the first constrained request)."""

    def __init__(self, engine: Callable[[], GrammarEngine]) -> None:
        self.engine = engine
        self.guides: dict[str, tuple[RowGuide, int]] = {}  # request id -> its guide, tokens it has taken

    def mask(self, context: TextContext, row: np.ndarray) -> np.ndarray:
        """`context`'s next-token logits `row` (float [V]) with what its constraint forbids next at the
        lowest float32."""
        return self._guide(context).mask(row)

    def allowed(self, context: TextContext, draft: np.ndarray) -> np.ndarray:
        """`draft` (int64 [n]) up to its first token `context`'s constraint forbids there."""
        return draft[: self._guide(context).ahead(draft.tolist())]

    def mask_run(self, context: TextContext, draft: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The logits `rows` (float [S, V], S > len(draft)) after `context`'s last token and each token of
        its `draft` (allowed: `allowed`), each with what the constraint forbids there at the lowest
        float32, as a new array."""
        guide = self._guide(context)
        bitmask = np.full((len(rows), guide.engine.words), -1, dtype=np.int32)
        guide.ahead(draft.tolist(), bitmask)
        return blocked(rows, bitmask)

    def _guide(self, context: TextContext) -> RowGuide:
        """`context`'s guide, advanced by the tokens it has generated since it was last asked for."""
        given = constraint_of(context)
        assert given is not None, "only constrained requests are masked"
        key = str(context.request_id)
        guide, taken = self.guides.get(key) or (self.engine().row(Constraint(*given)), 0)
        generated = context.tokens.generated
        for token in generated[taken:]:
            guide.accept(int(token))
        self.guides[key] = (guide, len(generated))
        return guide

    def release(self, request_id: object) -> None:
        """Forgets a request MAX has released (ended, or cancelled)."""
        self.guides.pop(str(request_id), None)
