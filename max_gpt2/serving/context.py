"""What a served request carries beyond MAX's own, from the route to the worker: OpenAI's `logit_bias`,
the constraint its text is held to, llama-server's sampler chain where it runs on the host (its DRY's
breakers, and its Mirostat, with its state), the tokens llama-server's penalties count, and whether the
token's log-probabilities are of what it was drawn from (llama-server's `post_sampling_probs`).

MAX's request (`TextGenerationRequest`, in the HTTP process) and context (`TextContext`, sent
to the model worker) have no field for a per-token bias, and their grammar fields ask MAX's own
structured output for what it compiles, so ours add both: the route makes a
`GPT2Request`, our tokenizer (`max_gpt2.serving.tokenizer`) turns it into a `GPT2Context`, and
MAX carries that to the worker as the architecture's context type (`arch.py`), where the
pipeline adds each bias to its token's logit before a token is picked and masks what the
constraint forbids (`max_gpt2.serving.constraints`). The constraint travels as its kind and
source (`max_gpt2.inference.constraints.Constraint`'s fields), plain data MAX can send.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
from max.pipelines.context import TextContext
from max.pipelines.modeling.types import TextGenerationRequest

from max_gpt2.inference.sampler_chain import LOWEST, Step
from max_gpt2.inference.token_pickers import Drawn, Picker, first_state, pick


@dataclass(frozen=True)
class GPT2Request(TextGenerationRequest):
    """MAX's request, with `logit_bias`: token id -> what its logit gains (OpenAI's, -100 to 100),
    `constraint`: (kind, source) of the text's `Constraint`, or None, and `cache_prompt`
    (llama-server's): whether the prompt may read pages MAX's prefix cache kept, and `chain`: the steps
    of `max_gpt2.inference.sampler_chain` its logits go through before MAX's sampler, or None, and
    `penalty_last_n`: where given, the penalties count the context's last n tokens, as llama-server's
    (None: the repetition penalty the whole context, the others the text, as Hugging Face and OpenAI),
    `allowed_ids`: the only ids that may come (vLLM's `allowed_token_ids`), or None,
    `picker`: what picks each token after the chain (`max_gpt2.inference.token_pickers`: Mirostat,
    adaptive-p), or None, `dry_breakers`: the sequence breakers of the chain's DRY step, where it
    has one, and `post_sampling`: whether its log-probabilities are of the distribution its token was
    drawn from (after the chain and picker), not of the model's logits, `bad_words`: vLLM's, the
    words its text may not come to hold (the tokenizer gives the context their ids), `prompt_ranks`:
    whether its prompt's log-probabilities carry each token's rank (vLLM's `prompt_logprobs`), and
    `logprob_ids`: the ids each new token reports in place of the likeliest (vLLM's `logprob_token_ids`)."""

    logit_bias: dict[int, float] | None = None
    constraint: tuple[str, str] | None = None
    cache_prompt: bool = True
    chain: tuple[Step, ...] | None = None
    penalty_last_n: int | None = None
    picker: Picker | None = None
    dry_breakers: tuple[str, ...] | None = None
    allowed_ids: tuple[int, ...] | None = None
    post_sampling: bool = False
    bad_words: tuple[str, ...] | None = None
    prompt_ranks: bool = False
    logprob_ids: tuple[int, ...] | None = None


@dataclass(kw_only=True)
class GPT2Context(TextContext):
    """MAX's context, with the request's `logit_bias`, `constraint`, `chain`, `penalty_last_n`, `picker`,
    `dry_breakers`, `allowed_ids`, `post_sampling`, `prompt_ranks` and `logprob_ids`, the ids of its
    `bad_words` (each word's tokens), and the picker's state before each token, by its count of tokens
    generated (the worker's)."""

    logit_bias: dict[int, float] | None = field(default=None)
    constraint: tuple[str, str] | None = field(default=None)
    chain: tuple[Step, ...] | None = field(default=None)
    penalty_last_n: int | None = field(default=None)
    picker: Picker | None = field(default=None)
    dry_breakers: tuple[str, ...] | None = field(default=None)
    allowed_ids: tuple[int, ...] | None = field(default=None)
    post_sampling: bool = field(default=False)
    bad_word_ids: tuple[tuple[int, ...], ...] | None = field(default=None)
    picker_states: dict[int, tuple[float, ...]] | None = field(default=None)
    prompt_ranks: bool = field(default=False)
    logprob_ids: tuple[int, ...] | None = field(default=None)

    @classmethod
    def of(cls, context: TextContext, request: TextGenerationRequest) -> GPT2Context:
        """`context` as a `GPT2Context`, with `request`'s own fields where it is ours."""
        values = {each.name: getattr(context, each.name) for each in fields(TextContext) if each.init}
        if not isinstance(request, GPT2Request):
            return cls(**values)
        ours = (
            "logit_bias",
            "constraint",
            "chain",
            "penalty_last_n",
            "picker",
            "dry_breakers",
            "allowed_ids",
            "post_sampling",
            "prompt_ranks",
            "logprob_ids",
        )
        return cls(**values, **{name: getattr(request, name) for name in ours})

    def picked(self, row: np.ndarray, draw: float) -> tuple[np.ndarray, Drawn]:
        """`row` [V] (the chain's) with the picker's token alone kept (`draw`: uniform in [0, 1)), and what
        it was drawn from; its next state kept: a step run again for the same token picks the same one."""
        assert self.picker is not None
        generated = self.tokens.generated_length
        self.picker_states = self.picker_states or {0: first_state(self.picker)}
        drawn, self.picker_states[generated + 1] = pick(self.picker, row, self.picker_states[generated], draw)
        picked = np.full_like(row, LOWEST)
        picked[drawn.token] = 0.0
        return picked, drawn
