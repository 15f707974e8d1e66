"""`POST /v1/completions`: OpenAI's legacy completions, with vLLM's and MAX's extensions.

Each choice's text ends before its first stop string (`stop_reason` names it), with `echo` the
prompt's text in front (with `max_tokens: 0` the prompt's alone, as OpenAI's and vLLM's `echo` answer
it: one token is made, counted in `usage`, and not shown); `logprobs` in OpenAI's legacy shape
(`tokens`, `token_logprobs`, `top_logprobs` keyed by each alternative's text, `text_offset` into the
text returned), streamed chunks included; `return_token_ids` adds the ids (MAX's and vLLM's
extension). The fields and their checks: `max_gpt2.serving.api.requests`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from max_gpt2.serving.api.answer import Shape, respond, token_ids
from max_gpt2.serving.api.choices import Choice, Chunk, Gathered, Token
from max_gpt2.serving.api.protocol import CompletionRequest
from max_gpt2.serving.api.requests import Asked
from max_gpt2.serving.api.token_fields import prompts
from max_gpt2.serving.api.token_names import TokenNames
from max_gpt2.serving.api.vllm_fields import prompt_report


async def create_completion(request: Request) -> Response:
    return await respond(request, CompletionRequest, CompletionShape, lambda _, body: prompts(body.prompt))


class CompletionShape(Shape):
    """A completion's JSON around each choice."""

    object = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, asked: Asked, names: TokenNames) -> None:
        super().__init__(asked, names)
        self.offsets: dict[int, int] = {}  # each streamed choice's text so far

    def choice(self, index: int, choice: Choice, gathered: Gathered) -> dict[str, Any]:
        prompt, made = self._prompt(choice), self._made(gathered.tokens)
        text = "".join(token.text for token in prompt) + ("" if self.asked.echo_only else gathered.text)
        return {
            "index": index,
            "text": text,
            "logprobs": self._logprobs(prompt, made, 0, len(text)),
            "finish_reason": gathered.finish.reason,
            "stop_reason": gathered.finish.stop_reason,
            **token_ids(self.asked, choice, made, True),
            **prompt_report(choice.prompt, self.asked.prompt_logprobs, self.names),
        }

    def delta(self, index: int, choice: Choice, chunk: Chunk, first: bool) -> dict[str, Any]:
        prompt, made = self._prompt(choice) if first else (), self._made(chunk.tokens)
        text = "".join(token.text for token in prompt) + ("" if self.asked.echo_only else chunk.text)
        start = self.offsets.get(index, 0)
        self.offsets[index] = start + len(text)
        return {
            "index": index,
            "text": text,
            "logprobs": self._logprobs(prompt, made, start, start + len(text)),
            "finish_reason": chunk.finish.reason if chunk.finish else None,
            "stop_reason": chunk.finish.stop_reason if chunk.finish else None,
            **token_ids(self.asked, choice, made, first),
        }

    def _prompt(self, choice: Choice) -> Sequence[Token]:
        return choice.prompt if self.asked.echo else ()

    def _made(self, tokens: Sequence[Token]) -> Sequence[Token]:
        return () if self.asked.echo_only else tokens

    def _logprobs(
        self, prompt: Sequence[Token], made: Sequence[Token], start: int, end: int
    ) -> dict[str, Any] | None:
        """OpenAI's legacy logprobs of the `prompt` and `made` tokens, whose text runs from `start` to `end`
        of the choice's text (a token past a stop string's cut starts at its end); None where none were
        asked for."""
        if self.asked.logprobs is None:
            return None
        tokens = [*prompt, *made]
        if self.asked.post_sampling:  # llama-server's entries, of what each token was drawn from
            return {"content": self.names.llama_entries(tokens, self.asked.logprobs, True)}
        offsets, at = [], start
        for token in tokens:
            offsets.append(min(at, end))
            at += len(token.text)
        return {
            "tokens": [self.names(token.id) for token in tokens],
            "token_logprobs": [finite(token.logprob) for token in tokens],
            "top_logprobs": [self._top(token, self.asked.logprobs) for token in prompt]
            + [self._top(token, self.shown) for token in made],
            "text_offset": offsets,
        }

    def _top(self, token: Token, shown: int | None) -> dict[str, float] | None:
        """The `shown` alternatives (None: all), likeliest first, and the chosen token where it is not
        among them, keyed by text (ids that decode alike share a key, the later one's value kept, as
        OpenAI's layout must)."""
        if token.logprob is None:
            return None  # the prompt's first token: nothing came before it
        by_id = dict(list(token.top.items())[:shown])
        by_id[token.id] = token.logprob
        return {self.names(alternative): value for alternative, value in by_id.items()}


def finite(value: float | None) -> float | None:
    """A log-probability as JSON carries it: NaN (the prompt's first token) as null."""
    return None if value is None or value != value else value
