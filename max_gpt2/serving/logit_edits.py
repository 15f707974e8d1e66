"""What the model worker does to one request's next-token logits [V] before a token is picked, in order:

1. its controls (`controlled`): vLLM's allowed ids and bad words, OpenAI's biases, the penalties, and
   end-of-text banned until `min_tokens` (`max_gpt2.inference.logit_controls`);
2. its constraint's mask (`max_gpt2.serving.constraints`);
3. llama-server's sampler chain, where it runs on the host (`max_gpt2.inference.sampler_chain`): MAX's
   sampler then draws from what it leaves at temperature 1;
4. a token picker (Mirostat, adaptive-p: `max_gpt2.inference.token_pickers`), which keeps its token alone.

`edited` runs them, and gives beside the row MAX's sampler takes what a picker drew among, where one
picks (llama-server's `post_sampling_probs` reports what a token is drawn from: `serving.drawn_from`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from max.pipelines.context import TextContext

from max_gpt2.inference.dry import Heads
from max_gpt2.inference.logit_controls import (
    add_bias,
    ban,
    banned_words,
    last_counts,
    only,
    penalize,
    token_counts,
)
from max_gpt2.inference.sampler_chain import Step, chain
from max_gpt2.inference.token_pickers import Drawn
from max_gpt2.serving.constraints import constraint_of


def needs_controls(context: TextContext) -> bool:
    """Whether `context`'s logits are penalised, biased, held to some ids or EOS banned (`controlled`)."""
    return (
        context.sampling_params.needs_penalties
        or bool(getattr(context, "logit_bias", None))  # MAX's own contexts (padding) have none
        or getattr(context, "allowed_ids", None) is not None
        or bool(getattr(context, "bad_word_ids", None))
        or context.tokens.generated_length < context.min_tokens
    )


def edits_logits(context: TextContext) -> bool:
    """Whether the pipeline edits `context`'s next logits: its controls (then its step drafts nothing),
    its constraint's mask (`max_gpt2.serving.constraints`), or llama-server's sampler chain."""
    return needs_controls(context) or constraint_of(context) is not None or chain_of(context) is not None


def chain_of(context: TextContext) -> tuple[Step, ...] | None:
    """The steps of llama-server's sampler chain `context`'s logits go through on the host, or None."""
    return getattr(context, "chain", None)  # MAX's own contexts (padding) have none


def reports_drawn(context: TextContext) -> bool:
    """Whether `context`'s log-probabilities are of what its token is drawn from (`post_sampling_probs`)."""
    return bool(getattr(context, "post_sampling", False) and context.log_probabilities)


def host_draw(context: TextContext) -> float:
    """The draw of XTC or of a token picker for `context`'s next token, uniform in [0, 1): the same for
    the same seed and token."""
    generator = np.random.default_rng([context.sampling_params.seed or 0, context.tokens.generated_length])
    return float(generator.random())


def controlled(row: np.ndarray, context: TextContext) -> np.ndarray:
    """`context`'s next-token logits [V] with its penalties and biases applied and, until it has
    `min_tokens` tokens, its end-of-text ids banned (`max_gpt2.inference.logit_controls`): repetition
    over the prompt and the tokens generated so far, as Hugging Face; `logit_bias` added (first, as
    `max_gpt2.inference.sampling` orders it) and frequency and presence over the generated ones, as
    OpenAI; or, where it has a `penalty_last_n`, all three over the context's last n tokens, as
    llama-server."""
    params, tokens, vocab = context.sampling_params, context.tokens, row.shape[-1]
    if (allowed := getattr(context, "allowed_ids", None)) is not None:  # before all else, as vLLM
        row = only(row, allowed)
    if words := getattr(context, "bad_word_ids", None):  # then vLLM's bad words, over the text
        row = banned_words(row, words, tokens.generated)
    if bias := getattr(context, "logit_bias", None):  # first, as Hugging Face's order and the library's
        row = add_bias(row, bias)
    if (last_n := getattr(context, "penalty_last_n", None)) is None:  # MAX's own contexts have none
        seen, counts = token_counts(tokens.all, vocab) > 0, token_counts(tokens.generated, vocab)
    else:
        counts = last_counts(tokens.all, last_n, vocab)
        seen = counts > 0
    row = penalize(
        row, seen, counts, params.repetition_penalty, params.frequency_penalty, params.presence_penalty
    )
    if tokens.generated_length < context.min_tokens:
        row = ban(row, sorted(context.eos_tracker.eos_token_ids))
    return row


def edited(
    row: np.ndarray,
    context: TextContext,
    masked: Callable[[TextContext, np.ndarray], np.ndarray],
    dry_heads: Callable[[tuple[str, ...]], Heads],
) -> tuple[np.ndarray, Drawn | None]:
    """`context`'s next-token logits `row` [V] after its edits (module docstring; `masked` applies its
    constraint, `dry_heads` finds DRY's breakers), and where a picker picks its token, what it drew among
    (else the row's own softmax is what the token is drawn from)."""
    if needs_controls(context):
        row = controlled(row, context)
    if constraint_of(context) is not None:
        row = masked(context, row)
    if (steps := chain_of(context)) is not None:  # over what the mask allows, as llama-server
        drawn = any(step[0] == "xtc" for step in steps)  # a generator made only where it is read
        heads = dry_heads(breakers) if (breakers := getattr(context, "dry_breakers", None)) else None
        row = chain(row, steps, host_draw(context) if drawn else 1.0, context.tokens.all, heads)
    if getattr(context, "picker", None) is None:
        return row, None
    return context.picked(row, host_draw(context))  # type: ignore[attr-defined]
