"""The request fields that name tokens by id, checked against the vocabulary: `logit_bias` in OpenAI's
form (an object of ids to biases) and llama-server's (`[id, bias]` pairs, `false` banning a token), and
`stop_token_ids` (vLLM's). A text in place of an id (llama-server tokenizes it) is refused, naming it:
`POST /tokenize` gives a text's ids. And `prompts`: a completion's `prompt` or an embedding's `input`,
texts or token ids."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from max_gpt2.inference.logit_controls import LOWEST
from max_gpt2.serving.api.protocol import Refusal

LOGIT_BIAS = 100.0  # OpenAI's bound on a bias, either way


def logit_bias(
    bias: dict[str, float | bool] | Sequence[tuple[int | str, float | bool]] | None, vocab_size: int
) -> dict[int, float]:
    """`logit_bias` by token id, each id in the vocabulary and each bias within OpenAI's bound, or `false`:
    the token banned, as llama-server bans it (the lowest float32, as end-of-text is banned)."""
    pairs = bias.items() if isinstance(bias, dict) else bias or ()
    biases = {}
    for key, value in pairs:
        token = token_id("logit_bias", "logit_bias", key, vocab_size)
        if value is True:
            raise Refusal(
                "logit_bias",
                f"logit_bias[{key}]: true biases nothing; give a number, or false to ban the token",
            )
        if value is False:
            biases[token] = float(LOWEST)
        elif math.isfinite(value) and -LOGIT_BIAS <= value <= LOGIT_BIAS:
            biases[token] = float(value)
        else:
            raise Refusal(
                "logit_bias",
                f"logit_bias[{key}]: must be from -{LOGIT_BIAS:g} to {LOGIT_BIAS:g}, or false; got {value}",
            )
    return biases


def token_id(field: str, where: str, token: int | str, vocab_size: int) -> int:
    """`token` (an id, or its ASCII digits) as an id of the vocabulary; a `Refusal` naming `where` else."""
    if (isinstance(token, int) or (token.isascii() and token.isdigit())) and 0 <= int(token) < vocab_size:
        return int(token)
    raise Refusal(field, f"{where}: {token!r} is not a token id of the vocabulary (0 to {vocab_size - 1})")


def prompts(given: str | list[Any], field: str = "prompt") -> list[str | list[int]]:
    """A request's texts or token-id lists (`field`: a completion's `prompt`, an embedding's `input`,
    either one of them or a list of them); none, or an empty one, refused. Ids and lengths are the
    tokenizer's to check (`GPT2TextTokenizer.check_ids`)."""
    single = isinstance(given, str) or (given and all(isinstance(token, int) for token in given))
    if not (single or given):
        raise Refusal(field, f"{field}: the list holds nothing; give a text, token ids, or a list of them")
    each = [given] if single else list(given)
    for index, one in enumerate(each):
        if one in ("", []):
            where = field if single else f"{field}[{index}]"
            raise Refusal(field, f"{where}: empty; GPT-2 needs at least one token")
    return each
