"""How a log-probability entry names a token: its own text (special tokens spelled out) and bytes, or
`token_id:N` where vLLM's `return_tokens_as_token_ids` asks; and llama-server's entries built from them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from max.serve.pipelines.llm import TokenGeneratorPipeline

from max_gpt2.inference.tokenizer import token_bytes
from max_gpt2.serving.api.choices import Token, tokenizer_of


class TokenNames:
    """Each token id's own text, special tokens spelled out (`<|endoftext|>`), as a log-probability entry
    names it, and its bytes (a byte-level token may hold part of a character); each found once. With
    `as_ids` (vLLM's `return_tokens_as_token_ids`) the name is `token_id:N`, and the bytes its own."""

    def __init__(self, engine: TokenGeneratorPipeline, as_ids: bool = False) -> None:
        self.tokenizer, self.as_ids = tokenizer_of(engine), as_ids
        self.names: dict[int, str] = {}
        self.spelled: dict[int, list[int]] = {}

    def __call__(self, token: int) -> str:
        if token not in self.names:
            self.names[token] = f"token_id:{token}" if self.as_ids else self._spelled(token)
        return self.names[token]

    def text(self, token: int) -> str:
        """The token's own text, special tokens spelled out, whether or not it is named by id."""
        return self._spelled(token) if self.as_ids else self(token)

    def _spelled(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def bytes(self, token: int) -> list[int]:
        if token not in self.spelled:
            spelled = self(token).encode("utf-8") if self.as_ids else token_bytes(self.tokenizer, token)
            self.spelled[token] = list(spelled)
        return self.spelled[token]

    def llama_entries(self, tokens: Sequence[Token], alternatives: int, drawn: bool) -> list[dict[str, Any]]:
        """llama-server's entries for `tokens`: each one's id, name, bytes and log-probability, and its
        `alternatives` likeliest in `top_logprobs`; with `drawn` (its `post_sampling_probs`), `prob` and
        `top_probs`: probabilities in what each token was drawn from."""
        value, top = ("prob", "top_probs") if drawn else ("logprob", "top_logprobs")

        def entry(token: int, logprob: float | None) -> dict[str, Any]:
            shown = math.exp(logprob) if drawn and logprob is not None else logprob
            return {"id": token, "token": self(token), "bytes": self.bytes(token), value: shown}

        return [
            {
                **entry(token.id, token.logprob),
                top: [entry(*each) for each in list(token.top.items())[:alternatives]],
            }
            for token in tokens
        ]
