"""llama-server's own completion API, for its clients: `POST /completion` (and `/completions`).

The request is read as llama-server reads it and run as the `/v1/completions` request that asks
the same (`max_gpt2.serving.api.native_fields`); the answer comes in llama-server's shape
(`Results`): `content`, `tokens`, `stop`, `stop_type` ("eos", "limit" or "word"), `stopping_word`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `generation_settings`, `timings` and, with
`n_probs`, `completion_probabilities` (`response_fields` picks some, `picked`). Streamed, each event is
one such object with `stop: false`, carrying its tokens' ids, the last with `stop: true`, and no
`[DONE]`, as llama-server streams; `sse_ping_interval` sets the seconds between pings while nothing
comes (none by default).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from max.serve.router.openai_routes import record_request_start
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from max_gpt2.max_internals import error_body
from max_gpt2.serving.api.answer import (
    compact,
    record_end,
    start,
    streamed,
    withdraw,
)
from max_gpt2.serving.api.choices import Choice, Finish, Token
from max_gpt2.serving.api.llama_chain import in_llama_order, text_limits
from max_gpt2.serving.api.native_fields import (
    RENAMED,
    NativeCompletion,
    as_completion,
    eos_banned,
    generation_settings,
)
from max_gpt2.serving.api.protocol import Refusal, parse, refusal_response
from max_gpt2.serving.api.requests import Asked, check
from max_gpt2.serving.api.served import Served
from max_gpt2.serving.api.token_fields import prompts
from max_gpt2.serving.api.token_names import TokenNames
from max_gpt2.serving.api.waiting import side_by_side, unless_client_leaves

logger = logging.getLogger("max.serve")


async def create_native_completion(request: Request) -> Response:
    served = Served.of(request)
    try:
        native = parse(NativeCompletion, await request.body())
        body = as_completion(native, served.lora_scales)
        settings = generation_settings(native, body, served.context_length)
        model = served.model_name(body.model)
        asked = named_natively(
            lambda: check(body, served.vocab_size, served.context_length, served.lora_scales)
        )
        asked = in_llama_order(text_limits(asked, native), native, served.context_length)
        asked = eos_banned(asked, native, served.tokenizer.eos_token_ids)
        if asked.constraint is not None:
            await asyncio.to_thread(served.check_constraint, asked)
        choices = await start(request, served, asked, model, prompts(body.prompt), "prompt")
    except Refusal as refusal:
        return refusal_response(refusal)
    results = Results(asked, TokenNames(served.engine), model, choices, settings, native)
    record_request_start()  # MAX's running-requests gauge, and its request counts at the end
    if asked.stream:
        return streamed(results.events(request.url.path), asked)
    try:
        whole = await unless_client_leaves(request, asyncio.gather(*map(results.whole, range(len(choices)))))
    finally:
        await withdraw(choices)
        results.record(request.url.path)
    return JSONResponse(whole[0] if len(whole) == 1 else whole)


def named_natively(check_fields: Callable[[], Asked]) -> Asked:
    """`check_fields()`, its refusal naming the field as llama-server's clients name it."""
    try:
        return check_fields()
    except Refusal as refusal:
        theirs = RENAMED.get(refusal.param or "", refusal.param)
        refusal.message = refusal.message.replace(f"{refusal.param}:", f"{theirs}:", 1)
        refusal.param = theirs
        raise


class Results:
    """llama-server's JSON for each prompt's result, whole or streamed (module docstring)."""

    def __init__(
        self,
        asked: Asked,
        names: TokenNames,
        model: str,
        choices: list[Choice],
        settings: dict[str, Any],
        native: NativeCompletion,
    ) -> None:
        self.asked, self.names, self.model, self.choices = asked, names, model, choices
        self.settings, self.timings_per_token = settings, native.timings_per_token
        self.response_fields = native.response_fields
        self.started = time.perf_counter()
        self.first: dict[int, float] = {}  # when each result's first token came
        self.text: dict[int, list[str]] = {index: [] for index in range(len(choices))}
        self.tokens: dict[int, list[Token]] = {index: [] for index in range(len(choices))}

    async def whole(self, index: int) -> dict[str, Any]:
        """Result `index`, once its choice has ended."""
        finish: Finish | None = None
        async for chunk in self.choices[index].chunks():
            self._add(index, chunk.text, chunk.tokens)
            finish = chunk.finish or finish
        assert finish is not None, "a choice ends with a finish"
        text = "".join(self.text[index])
        return self._final(index, text, self.tokens[index], finish)

    async def events(self, path: str) -> AsyncIterator[str]:
        """Each result's partial objects as its chunks come, then its final one; no `[DONE]`. A result that
        fails ends the stream with an error object, as llama-server's do."""
        try:
            async for index, chunk in side_by_side([choice.chunks() for choice in self.choices]):
                self._add(index, chunk.text, chunk.tokens)
                if chunk.text or chunk.tokens:
                    yield compact(self._partial(index, chunk.text, chunk.tokens))
                if chunk.finish is not None:
                    yield compact(self._final(index, "", (), chunk.finish))
        except Exception as error:  # the stream has begun: the error goes in it
            logger.exception("a streamed answer failed")
            yield compact(error_body(500, f"the answer failed while streaming: {error}", None))
        finally:
            self.record(path)

    def record(self, path: str) -> None:
        record_end(path, self.started, self.choices, self.asked)

    def _add(self, index: int, text: str, tokens: Sequence[Token]) -> None:
        if tokens:
            self.first.setdefault(index, time.perf_counter())
        self.text[index].append(text)
        self.tokens[index].extend(tokens)

    def _partial(self, index: int, text: str, tokens: Sequence[Token], last: bool = False) -> dict[str, Any]:
        """A streamed event (ids always, as llama-server streams them), or with `last` a result's start."""
        choice, shown = self.choices[index], self.asked.return_token_ids or (self.asked.stream and not last)
        return {
            "index": index,
            "content": text,
            "tokens": [token.id for token in tokens] if shown else [],
            "stop": False,
            "model": self.model,
            "tokens_predicted": choice.made,
            "tokens_evaluated": len(choice.prompt),
            **({"timings": self._timings(index)} if self.timings_per_token else {}),
            **self._probabilities(tokens),
        }

    def _final(self, index: int, text: str, tokens: Sequence[Token], finish: Finish) -> dict[str, Any]:
        """A result's last object; streamed (`text` ""), its text and tokens came in the partial ones."""
        choice, word = self.choices[index], isinstance(finish.stop_reason, str)
        return picked(
            self.response_fields,
            {
                **self._partial(index, text, tokens, last=True),
                "stop": True,
                "prompt": "".join(token.text for token in choice.prompt),
                "has_new_line": "\n" in "".join(self.text[index]),
                "truncated": False,
                "stop_type": "limit" if finish.reason == "length" else "word" if word else "eos",
                "stopping_word": finish.stop_reason if word else "",
                "tokens_cached": choice.cached,
                "generation_settings": self.settings,
                "timings": self._timings(index),
            },
        )

    def _timings(self, index: int) -> dict[str, Any]:
        """llama-server's `timings` so far: the prompt's until the first token (queueing included)."""
        choice, now = self.choices[index], time.perf_counter()
        first = self.first.get(index, now)
        prompt_ms, predicted_ms = (first - self.started) * 1000, (now - first) * 1000
        prompt_n = len(choice.prompt) - choice.cached
        return {
            "cache_n": choice.cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else None,
            "prompt_per_second": prompt_n * 1000 / prompt_ms if prompt_ms else None,
            "predicted_n": choice.made,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / choice.made if choice.made else None,
            "predicted_per_second": choice.made * 1000 / predicted_ms if predicted_ms else None,
        }

    def _probabilities(self, tokens: Sequence[Token]) -> dict[str, Any]:
        """llama-server's `completion_probabilities` of `tokens`, where `n_probs` asked for them."""
        if self.asked.logprobs is None or not tokens:
            return {}
        entries = self.names.llama_entries(tokens, self.asked.logprobs, self.asked.post_sampling)
        return {"completion_probabilities": entries}


def picked(paths: Sequence[str], result: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `response_fields`: the fields of `result` at `paths` alone (`a/b` one inside `a`,
    under its path as its key), a path that leads nowhere left out; all of `result` where none given."""
    if not paths:
        return result
    found: dict[str, Any] = {}
    for path in paths:
        value: Any = result
        for key in path.split("/"):
            value = value.get(key, picked) if isinstance(value, dict) else picked  # `picked`: none there
        if value is not picked:
            found[path] = value
    return found
