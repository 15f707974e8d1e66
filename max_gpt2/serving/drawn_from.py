"""The log-probabilities of what a token was drawn from, for llama-server's `post_sampling_probs`.

llama-server reports, with `post_sampling_probs`, each token's probability and its likeliest
alternatives' in the distribution its sampler chain left (after the cuts, the temperature and a
picker such as Mirostat), the tokens it cut left out, rather than in the model's own softmax. The
pipeline (`max_gpt2.serving.pipeline`) keeps, for each request that asks, the logits of what its token
is drawn from (`max_gpt2.serving.logit_edits.edited`) in the step's `DrawnOutputs`; the model's
log-probabilities (`max_gpt2.serving.model`) take that request's from them (`drawn_log_probabilities`)
in place of MAX's over the model's logits. Where MAX's sampler would cut and temper, the request's
temperature and cuts run on the host instead, in MAX's order, MAX then only drawing (`in_max_order`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

import numpy as np
from max.pipelines.context import LogProbabilities
from max.pipelines.context.sampling_params import SamplingParams
from max.pipelines.lib import ModelOutputs

from max_gpt2.inference.sampler_chain import Step

Among = tuple[np.ndarray, np.ndarray]  # the ids a token is drawn among, and their chances (summing to 1)
# MAX's sampler settings that leave it only drawing from what the host's chain kept.
ONLY_DRAWS = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0}


@dataclass
class DrawnOutputs(ModelOutputs):
    """A step's outputs, with `drawn`: batch row -> what that request's token is drawn among (`Among`), for
    the requests that report it."""

    drawn: dict[int, Among] = field(default_factory=dict)

    @classmethod
    def of(cls, outputs: ModelOutputs, drawn: dict[int, Among], **changed: object) -> ModelOutputs:
        """`outputs` with `changed` fields, and `drawn` where any request reports it."""
        values = {each.name: getattr(outputs, each.name) for each in fields(outputs)} | changed
        return cls(**values, drawn=drawn) if drawn else type(outputs)(**values)


def drawn_log_probabilities(among: Among, token: int, top_n: int) -> LogProbabilities:
    """MAX's log-probabilities of `token` drawn `among` those ids with those chances, and of its `top_n`
    likeliest, the likeliest first, then `token` where it is not among them, as MAX's own. A token whose
    probability is 0 in float32 is left out of the likeliest."""
    kept, chances = among
    with np.errstate(divide="ignore"):  # a chance that is 0 in float64 has no logarithm
        logs = np.log(chances)
    value = float(logs[kept == token][0])  # it was drawn: among those kept
    shown = chances.astype(np.float32) > 0  # as llama-server's float32 probabilities, filtered at 0
    kept, logs = kept[shown], logs[shown]
    order = np.argsort(-logs, kind="stable")[:top_n]
    top = {int(kept[index]): float(logs[index]) for index in order}
    top.setdefault(token, value)
    return LogProbabilities(
        token_log_probabilities=[value], top_log_probabilities=[top], sampled_token_ids=[token]
    )


def in_max_order(params: SamplingParams) -> tuple[SamplingParams, tuple[Step, ...]]:
    """`params` only drawing, and their temperature and cuts as the host's chain in MAX's sampler's order
    (`max_gpt2.inference.sampler_chain`: the temperature, 0 keeping the likeliest alone, then top-k, top-p
    and min-p), which keeps what MAX's sampler would."""
    steps = (
        ("temperature", float(params.temperature)),
        ("top_k", float(params.top_k)),
        ("top_p", float(params.top_p)),
        ("min_p", float(params.min_p)),
    )
    return dataclasses.replace(params, **ONLY_DRAWS), steps
