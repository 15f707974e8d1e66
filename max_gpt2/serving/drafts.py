"""Prompt lookup in the server: drafts for a decoding step's requests, checked in the same run.

`max-gpt2 serve --prompt-lookup K` (`ServingSettings.prompt_lookup`): in a step where every request is
greedy and decoding (`max_gpt2.serving.pipeline`), each request's last token goes in with up to K
tokens looked up in its own prompt and text (`max_gpt2.inference.drafting.PromptLookup`, as many as
its `Pacing` allows, the library's rule). With R requests and S = 1 + the longest draft, the
decoding graph runs S tokens a request (a shorter draft is padded with its last token, never kept;
so no request drafts past the room another has left) and returns the logits after each, [R * S, V].
A request keeps the argmax after its last token, then, while that was its next drafted token, the
argmax after that one: what one-token steps would have chosen, since the decoding graph computes
each token as in a one-token step. The output is the same with drafting and without.

MAX's paged cache reserves room for K drafted tokens a request (`num_draft_tokens` in its cache
parameters: `model_config`) and takes a request's length from the tokens it kept: the keys and
values of rejected drafts lie past it, to be written over. A step of R requests drafts at most
`SKINNY_ROWS` tokens in all, where the decoding kernels' products are cheap.

Whether drafts pay depends on how many are kept and on what a run of more tokens costs, which
grows with the step's requests and the weights' format (docs/performance.md). `RunRates` measures
it as the server runs: for each number of requests, the tokens a second of recent runs with drafts
and without (`Rate`); the first run goes without, and so does one every `REMEASURE` drafted runs, to
compare against; where, `JUDGED_AFTER` drafted runs on, the drafted runs are the slower, drafting
pauses (1, 2, 4, ... 64 runs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from max.pipelines.architectures.llama3_modulev3.inputs import Llama3Inputs
from max.pipelines.context import TextContext

from max_gpt2.inference.drafting import DraftCounts, Pacing, PromptLookup
from max_gpt2.model.layers.kernel_layers import SKINNY_ROWS

# MAX's server passes on the records of its own components' loggers only.
logger = logging.getLogger("max.pipelines.max_gpt2")


@dataclass
class CheckedDrafts(Llama3Inputs):
    """A step's inputs where each request brings its last token and a draft, S tokens a request, end to
    end: the pipeline model runs them through its decoding graph and gives the logits after each,
    `ModelOutputs.logits` [R * S, V]."""


@dataclass
class RequestDrafts:
    """One request's pacing of its drafts, and its counts so far."""

    pacing: Pacing
    counts: DraftCounts = field(default_factory=DraftCounts)


KEPT = 0.95  # a run's weight in the sums of tokens and seconds falls by this much each run after it
JUDGED_AFTER = 8  # drafted runs after which their rate is compared with runs' without drafts
LONGEST_PAUSE = 64  # runs without drafts, at most, after drafted runs proved the slower
REMEASURE = 32  # drafted runs between two without drafts


@dataclass
class Rate:
    """Tokens and seconds of recent runs, each run's share falling by `KEPT` with each later one."""

    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens, self.seconds = KEPT * self.tokens + tokens, KEPT * self.seconds + seconds

    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class Rates:
    """A number of requests' runs with drafts and without, and drafting's pause."""

    plain: Rate = field(default_factory=Rate)
    drafted: Rate = field(default_factory=Rate)
    since_plain: int = 0  # drafted runs since the last run without drafts
    since_judged: int = 0  # drafted runs since their rate was last found the lower
    paused: int = 0  # runs left without drafts
    pause: int = 0  # the last pause's length


class RunRates:
    """Whether to draft in a run of R requests, from how the runs of R requests fared (module docstring)."""

    def __init__(self) -> None:
        self.by_requests: dict[int, Rates] = {}

    def drafting(self, requests: int) -> bool:
        """Whether this run of `requests` requests drafts."""
        rates = self.by_requests.setdefault(requests, Rates())
        if rates.paused:
            rates.paused -= 1
            return False
        return bool(rates.plain.seconds) and rates.since_plain < REMEASURE  # a run without drafts first

    def ran(self, requests: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A run of `requests` requests, with drafts or without, made `tokens` tokens in `seconds`."""
        rates = self.by_requests.setdefault(requests, Rates())
        if not drafted:
            rates.plain.add(tokens, seconds)
            rates.since_plain = 0
            return
        rates.drafted.add(tokens, seconds)
        rates.since_plain, rates.since_judged = rates.since_plain + 1, rates.since_judged + 1
        if rates.since_judged < JUDGED_AFTER:
            return
        if rates.drafted.per_second() < rates.plain.per_second():
            rates.pause = min(LONGEST_PAUSE, max(1, 2 * rates.pause))
            rates.paused, rates.since_judged = rates.pause, 0
        else:
            rates.pause = 0


class ServedDrafts:
    """Each request's drafts by prompt lookup of up to `most` tokens, and what became of them."""

    def __init__(self, most: int) -> None:
        self.lookup = PromptLookup(most)
        self.requests: dict[str, RequestDrafts] = {}
        self.rates = RunRates()

    def propose(self, contexts: list[TextContext]) -> list[np.ndarray]:
        """Each request's draft (int64 [n], maybe empty) to follow its last token: within the step's
        share of `SKINNY_ROWS` and within the room every request of the step has left before its
        `max_length`, since each request's run is padded to the longest draft (past its `max_length`,
        a padded run would pass the model's positions). Requests not in this step are forgotten."""
        known = self.requests
        self.requests = {
            str(c.request_id): known.get(str(c.request_id)) or RequestDrafts(Pacing(self.lookup.most))
            for c in contexts
        }
        sequences = [np.asarray(context.tokens.all, dtype=np.int64) for context in contexts]  # prompt, text
        share = SKINNY_ROWS // len(contexts) - 1  # drafted tokens a request may bring
        rooms = (c.max_length - len(sequence) - 1 for c, sequence in zip(contexts, sequences, strict=True))
        room = min(share, *rooms)  # the last kept token is free
        drafts = []
        for context, sequence in zip(contexts, sequences, strict=True):
            size = min(room, self.requests[str(context.request_id)].pacing.next_size()) if room > 0 else 0
            drafts.append(self.lookup.propose(sequence, size) if size else sequence[:0])
        return drafts

    def keep(self, context: TextContext, draft: np.ndarray, chosen: np.ndarray) -> list[int]:
        """The tokens `context` keeps of a run of its last token and `draft`: `chosen` [S] is the argmax
        after each of them (the last token first)."""
        kept = 1
        while kept <= len(draft) and chosen[kept - 1] == draft[kept - 1]:
            kept += 1
        if len(draft):
            drafts = self.requests[str(context.request_id)]
            drafts.pacing.record(len(draft), kept - 1)
            drafts.counts.drafted += len(draft)
            drafts.counts.accepted += kept - 1
        return [int(token) for token in chosen[:kept]]

    def finish(self, context: TextContext) -> None:
        """Logs a request's counts once it is done."""
        drafts = self.requests.pop(str(context.request_id), None)
        if drafts is not None and drafts.counts.drafted:
            counts = drafts.counts
            logger.info(
                "prompt lookup: request %s kept %d of %d drafted tokens",
                context.request_id,
                counts.accepted,
                counts.drafted,
            )
