"""What one compiled graph of the language model computes: its head, and whether it runs our kernels.

    Head.LOGITS        logits at the positions asked for (served: every token's)  [B, K, V]
    Head.LAST_LOGITS   each request's last token's logits (the server's)          [R, V]
    Head.SCORES        each asked position's next token's log-probability         [B, K]
    Head.RANKED        that, and the `RANKED` likeliest tokens' log-probabilities and ids
    Head.ATTENTIONS    logits and every head's attention weights                  [L, B, H, S, T]
    Head.HIDDEN        the final layer norm's output at the positions asked for   [B, K, D]

A `Variant` is a head and `kernels`: the blocks through the Mojo decoding kernels (`max_gpt2.kernels`,
a few new tokens on the CPU in float32) or MAX's ops. The in-process model (`GPT2LMHeadModel`,
its variants named in `max_gpt2.inference.lm_graphs`) and the server's (`PagedGPT2LMHeadModel`)
are each built for one variant; a variant's `name` names its graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

RANKED = 20
"""How many likeliest tokens a `Head.RANKED` graph returns at each position (`score(top_k=...)`)."""


class Head(Enum):
    LOGITS = "logits"
    LAST_LOGITS = "last_logits"
    SCORES = "scores"
    RANKED = "ranked"
    ATTENTIONS = "attentions"
    HIDDEN = "hidden"


@dataclass(frozen=True)
class Variant:
    """A graph's head, and whether its blocks run through the decoding kernels."""

    head: Head = Head.LOGITS
    kernels: bool = False

    def __post_init__(self) -> None:
        if self.kernels and self.head is Head.ATTENTIONS:
            raise ValueError("the decoding kernels do not output attention weights")

    @property
    def name(self) -> str:
        """The graph's name: "plain" and "decode" for logits through MAX's ops and through the kernels,
        else the head's, "_decode" added for the kernels' last-token logits."""
        if self.head is Head.LOGITS:
            return "decode" if self.kernels else "plain"
        return self.head.value + ("_decode" if self.kernels and self.head is Head.LAST_LOGITS else "")

    @property
    def scores(self) -> bool:
        """Whether the graph returns log-probabilities, not logits."""
        return self.head in (Head.SCORES, Head.RANKED)

    def __str__(self) -> str:
        return self.name


PLAIN = Variant()
DECODE = Variant(kernels=True)
ATTENTIONS = Variant(Head.ATTENTIONS)
LAST_LOGITS = Variant(Head.LAST_LOGITS)  # the server's prompts and steps through MAX's ops
LAST_LOGITS_DECODE = Variant(Head.LAST_LOGITS, kernels=True)  # the server's steps through the kernels


@dataclass(frozen=True)
class CacheReorder:
    """Beam search's graph: each row of the KV cache takes its parent row's keys and values, in place."""

    name: ClassVar[str] = "reorder"

    def __str__(self) -> str:
        return self.name


REORDER = CacheReorder()
