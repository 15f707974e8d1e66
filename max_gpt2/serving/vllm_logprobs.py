"""vLLM's log-probability fields in the worker: `prompt_logprobs`' ranks and `logprob_token_ids`' ids.

- `prompt_logprobs: k` reports, for every prompt token after the first, its log-probability, its rank
  and its k likeliest alternatives. The rank is how many of the vocabulary's tokens the model finds at
  least as likely there (the token itself counted: the likeliest is 1), as vLLM counts it (`ranks`).
- `logprob_token_ids` reports, at each generated token, the log-probabilities of the ids listed in
  place of the likeliest ones (`listed`), from the logits MAX's graph reads.

MAX's ragged log-probability graph gives the log-probabilities and the likeliest of a prompt (`echo`)
and of each token, but no rank, and MAX's `LogProbabilities` has no field for one: its queue to the API
process decodes that type, so a subclass's field would not arrive. A position's rank travels instead in
its alternatives, as the value under `RANK_KEY`, an id no token has (MAX's ids are 32 bits; GPT-2 has
50,257): MAX's API process decodes that id to no text, and `take_rank` takes it out before anything
reads the alternatives. Which rows of a step ask for either comes with its inputs (`AskedInputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from max.pipelines.architectures.llama3_modulev3.inputs import Llama3Inputs
from max.pipelines.context import LogProbabilities, TextContext

from max_gpt2.inference.beam_search import log_softmax

RANK_KEY = 2**32 - 1  # the largest 32-bit id: past any GPT-2 vocabulary


@dataclass
class AskedInputs(Llama3Inputs):
    """A step's inputs, with the batch rows of the requests whose prompts' tokens are ranked (`ranked`)
    and of those that list the ids each token reports (`listed`: row -> the ids)."""

    ranked: tuple[int, ...] = ()
    listed: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, inputs: Llama3Inputs, contexts: list[TextContext]) -> Llama3Inputs:
        """`inputs` with what `contexts` (one a batch row) ask; as they were where none asks."""
        ranked = tuple(row for row, each in enumerate(contexts) if getattr(each, "prompt_ranks", False))
        listed = {
            row: ids for row, each in enumerate(contexts) if (ids := getattr(each, "logprob_ids", None))
        }
        if not (ranked or listed):
            return inputs
        values = {each.name: getattr(inputs, each.name) for each in fields(inputs) if each.init}
        return cls(**values, ranked=ranked, listed=listed)


def asks(inputs: Llama3Inputs) -> tuple[tuple[int, ...], dict[int, tuple[int, ...]]]:
    """The rows of a step's `inputs` whose prompts are ranked, and those that list ids (`AskedInputs`)."""
    return (inputs.ranked, inputs.listed) if isinstance(inputs, AskedInputs) else ((), {})


def ranks(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """[T - 1]: the rank of each of `tokens[1:]` ([T] ids) among the logits [T, V] of the position
    before it: how many ids' logits are at least its own (the log-softmax keeps their order)."""
    own = logits[np.arange(len(tokens) - 1), tokens[1:]]  # [T - 1]
    return np.count_nonzero(logits[:-1] >= own[:, None], axis=1)


def with_ranks(result: LogProbabilities, found: np.ndarray) -> LogProbabilities:
    """`result` (a prompt's log-probabilities, the first token's empty, then one a prompt token) with the
    prompt tokens' `found` ranks [P - 1] under `RANK_KEY` in their alternatives."""
    tops = [dict(top) for top in result.top_log_probabilities]
    for top, rank in zip(tops[1 : 1 + len(found)], found.tolist(), strict=True):
        top[RANK_KEY] = float(rank)
    return LogProbabilities(
        token_log_probabilities=result.token_log_probabilities,
        top_log_probabilities=tops,
        sampled_token_ids=result.sampled_token_ids,
    )


def listed(result: LogProbabilities, row: np.ndarray, ids: tuple[int, ...]) -> LogProbabilities:
    """`result` with its last position's alternatives (its new token's) the `ids` listed, their
    log-probabilities in `row` [V] (the logits that token was drawn after), and the token's own."""
    logs = log_softmax(row)
    top = {token: float(logs[token]) for token in ids}
    top[result.sampled_token_ids[-1]] = result.token_log_probabilities[-1]
    return LogProbabilities(
        token_log_probabilities=result.token_log_probabilities,
        top_log_probabilities=[*result.top_log_probabilities[:-1], top],
        sampled_token_ids=result.sampled_token_ids,
    )


def take_rank(top: dict[int, Any]) -> tuple[dict[int, Any], int | None]:
    """A position's alternatives as MAX's API process gives them (id -> (text, log-probability)), without
    `RANK_KEY`, and the rank it carried (None where the worker put none)."""
    if RANK_KEY not in top:
        return top, None
    rest = dict(top)
    _, rank = rest.pop(RANK_KEY)
    return rest, int(rank)
