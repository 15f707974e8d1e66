"""What each attention head does, in four numbers and the kind of head they point to.

    attentions = lm.attentions(input_ids, attention_mask)   # [layers, batch, heads, seq, seq]
    rows = summarize(attentions, attention_mask)            # one HeadSummary per layer and head
    print(format_summary(rows))

For every head, averaged over the real queries of every row that have at least
one earlier real token (the first token of a row can only look at itself, so it
tells nothing about the head):

    previous   weight on the real token just before the query
    first      weight on the row's first real token
    self       weight on the query's own token
    entropy    the row's entropy over log(keys the query may see): 0 = all weight
               on one key, 1 = spread evenly over every key it may see

The label is the largest of the four: "previous-token", "first-token", "self",
or "broad" for entropy. (At the second token, previous and first are the same
key, so short prompts cannot tell those two kinds apart.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

LABELS = ("previous-token", "first-token", "self", "broad")


@dataclass(frozen=True)
class HeadSummary:
    """One head's averages (see the module docstring) and its nearest label."""

    layer: int
    head: int
    previous: float
    first: float
    itself: float
    entropy: float
    label: str

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["self"] = values.pop("itself")
        return values


def summarize(
    attentions: np.ndarray, attention_mask: np.ndarray | None = None, layers: list[int] | None = None
) -> list[HeadSummary]:
    """Summaries of every head in `attentions` `[layers, batch, heads, seq, seq]`, layer by layer.

    `attention_mask` `[batch, seq]` (1 = token, 0 = padding) is the one the
    weights were computed with; `layers` numbers the first axis (default 0, 1, ...).
    """
    n_layer, batch, n_head, seq_len, _ = attentions.shape
    mask = np.ones((batch, seq_len), bool) if attention_mask is None else np.asarray(attention_mask) == 1
    positions = np.arange(seq_len)
    seen = np.cumsum(mask, axis=1)  # [B, S]: real keys a query may see, itself included
    queries = mask & (seen >= 2)  # [B, S]: the queries summarized
    if not queries.any():
        raise ValueError("the prompt needs at least two real tokens to tell kinds of heads apart")
    first = np.argmax(mask, axis=1)  # [B]: the first real token of each row
    # The last real token before each query: a running maximum of real positions, shifted by one.
    real_positions = np.where(mask, positions, -1)
    previous = np.concatenate(
        [np.full((batch, 1), -1), np.maximum.accumulate(real_positions, axis=1)[:, :-1]], axis=1
    )  # [B, S]

    def weight_on(keys: np.ndarray) -> np.ndarray:
        """Each query's weight on one key per (row, query), `keys` [B, S] -> [L, B, H, S]."""
        index = np.broadcast_to(
            np.maximum(keys, 0)[None, :, None, :, None], (n_layer, batch, n_head, seq_len, 1)
        )
        return np.take_along_axis(attentions, index, axis=-1)[..., 0]

    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(attentions > 0, attentions * np.log(attentions), 0.0)
        spread = -plogp.sum(axis=-1) / np.log(seen)[None, :, None, :]  # [L, B, H, S]
    columns = {
        "previous": weight_on(previous),
        "first": weight_on(np.broadcast_to(first[:, None], (batch, seq_len))),
        "itself": weight_on(np.broadcast_to(positions, (batch, seq_len))),
        "entropy": spread,
    }
    # Average over the summarized queries: move them last, then select them.
    averages = {
        name: values.transpose(0, 2, 1, 3)[:, :, queries].mean(axis=-1) for name, values in columns.items()
    }
    numbers = layers if layers is not None else list(range(n_layer))
    rows = []
    for li, layer in enumerate(numbers):
        for head in range(n_head):
            scores = [float(averages[name][li, head]) for name in ("previous", "first", "itself", "entropy")]
            rows.append(HeadSummary(layer, head, *scores, label=LABELS[int(np.argmax(scores))]))
    return rows


def format_summary(rows: list[HeadSummary]) -> str:
    """The summaries as a table, a line per head."""
    lines = ["layer  head  previous   first    self  entropy  label"]
    for row in rows:
        lines.append(
            f"{row.layer:>5}  {row.head:>4}  {row.previous:>8.3f}  {row.first:>6.3f}  "
            f"{row.itself:>6.3f}  {row.entropy:>7.3f}  {row.label}"
        )
    return "\n".join(lines)
