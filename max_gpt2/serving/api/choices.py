"""One choice of a completion or a chat answer: a request through MAX's engine, token by token.

MAX's `TokenGeneratorPipeline` (the HTTP process's engine, `app.state.pipeline`) tokenizes a
request, hands it to the model worker and yields its tokens as the worker makes them, a few at
a time. `Choice` turns those into what both routes answer with:

- each token's text: the new ids decoded as a stream (`TextStream`; special tokens left out),
  so the choice's text is Hugging Face's `decode` of its tokens: bytes that are not yet a whole
  character wait for the next token, and those that never become one (a character the prompt
  began, or the length cut) come out as U+FFFD, as `decode` writes them;
- its log-probability and likeliest alternatives, where the request asked for them (with
  `echo`, the prompt's too, the first token's None);
- the text cut at the first stop string (`StopCut`), the worker told to stop there, and the
  tokens kept up to the one that completed the match, so token ids and `usage` agree with
  the text; a stop token id's own text left out (vLLM's), unless asked for.

`Chunk`s come one a token as the worker sends them (several at once where a scheduler step made
several), as llama-server and vLLM stream; the last one carries the `Finish`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from max.pipelines.context import GenerationStatus
from max.pipelines.modeling.types import TextGenerationRequest
from max.serve.pipelines.llm import TokenGeneratorOutput, TokenGeneratorPipeline
from tokenizers import Tokenizer

from max_gpt2.inference.tokenizer import TextStream
from max_gpt2.serving.api.repetition import Repetition
from max_gpt2.serving.api.stops import StopCut
from max_gpt2.serving.vllm_logprobs import take_rank


@dataclass(frozen=True)
class Rules:
    """How a choice ends besides its length: stop strings (`keep`: with the match, and a stop token's
    text), stop token ids, and `min_tokens` (no stop string counts before that many tokens); whether its
    text leaves special tokens out (`skip_special`, vLLM's `skip_special_tokens`); and llama-server's
    limits, which end it as its length would: lines indented less than `indent` (`StopCut`), and a
    newline past `predict_s` seconds from the first token; and vLLM's `repetition_detection`."""

    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    keep: bool = False
    min_tokens: int = 0
    skip_special: bool = True
    indent: int = 0
    predict_s: float | None = None
    repetition: Repetition | None = None


@dataclass(frozen=True)
class Token:
    """One token of a choice: its id, the text it adds (possibly "", part of a character), and where
    asked for, its log-probability and the likeliest alternatives by id, likeliest first, and a prompt
    token's rank (vLLM's `prompt_logprobs`: `max_gpt2.serving.vllm_logprobs`)."""

    id: int
    text: str
    logprob: float | None = None
    top: dict[int, float] = field(default_factory=dict)
    rank: int | None = None


@dataclass(frozen=True)
class Finish:
    """Why a choice ended: OpenAI's `finish_reason` ("stop" or "length"; vLLM's "repetition") and vLLM's
    `stop_reason`: the stop string or stop token id matched, "repetition_detected" for a repetition (None
    for end-of-text and for length)."""

    reason: str
    stop_reason: str | int | None = None


@dataclass(frozen=True)
class Chunk:
    """What a choice adds at once: the text a client may see now, the tokens made, and at the end why."""

    text: str
    tokens: tuple[Token, ...]
    finish: Finish | None = None


@dataclass(frozen=True)
class Gathered:
    """One choice, whole (`gather`): its text, the tokens kept, why it ended."""

    text: str
    tokens: list[Token]
    finish: Finish


class Choice:
    """A request submitted to MAX's engine (`start`), its output read as `Chunk`s (`chunks`)."""

    def __init__(
        self, engine: TokenGeneratorPipeline, request: TextGenerationRequest, rules: Rules, stream: Any
    ) -> None:
        self.engine, self.request, self.rules, self._stream = engine, request, rules, stream
        self.cut = StopCut(rules.stop, rules.keep, rules.min_tokens, rules.indent)
        self.first_at: float | None = None  # when the first token came (`Rules.predict_s`)
        self.prompt: tuple[Token, ...] = ()  # with the prompt's log-probabilities where `echo` asked
        self.made = 0  # tokens kept, for `usage`
        self.ids: list[int] = []  # theirs, where `Rules.repetition` reads them
        self.cached = 0  # prompt tokens MAX's prefix cache held (`usage.prompt_tokens_details`)
        self.new_line = False  # whether a token made so far holds a newline (llama-server's `/slots`)
        self._ended = False  # the engine said the request is done (else the worker is told to stop)

    @classmethod
    async def start(
        cls, engine: TokenGeneratorPipeline, request: TextGenerationRequest, rules: Rules
    ) -> Choice:
        """Tokenizes and submits `request`: a bad prompt raises here (MAX's `InputError`), before a
        response has begun."""
        return cls(engine, request, rules, await engine.next_token_chunk(request, parse_reasoning=False))

    @property
    def done(self) -> bool:
        """Whether the request has ended: the engine said so, or the worker was told to stop it."""
        return self._ended

    async def chunks(self) -> AsyncGenerator[Chunk, None]:
        """The choice's chunks, one a token as llama-server and vLLM stream them (the worker may send
        several at once); the worker is told to stop at a stop string, or if the reader leaves."""
        decoder: TextStream | None = None
        try:
            async for output in self._stream:
                self._ended = output.status.is_done
                if decoder is None:
                    given = output.prompt_token_ids
                    prompt = [] if given is None else [int(token) for token in given]
                    decoder = TextStream(tokenizer_of(self.engine), self.rules.skip_special)
                    self.prompt = self._prompt_tokens(prompt, output)
                    self.cached = output.cached_token_count or 0  # the first output alone carries it
                for chunk in self._chunks(output, decoder):
                    yield chunk
                    if chunk.finish is not None:
                        return
            yield Chunk(self.cut.flush(), (), Finish("stop"))  # the engine ended it unasked (shutting down)
        finally:
            await self.close()

    async def close(self) -> None:
        """Lets go of the engine's output; the worker is told to stop where the request has not ended
        (a stop string, a reader who left, a choice no one reads)."""
        if not self._ended:
            self._ended = True
            self.engine.model_worker.cancel(self.request.request_id)
        await self._stream.aclose()

    def _chunks(self, output: TokenGeneratorOutput, decoder: TextStream) -> Iterator[Chunk]:
        """One output of the engine as a chunk a token it keeps, with the text each lets a client see;
        the last with the finish where the output ends the choice (and a chunk of no token where it ends
        with none)."""
        ids = list(output.token_ids or ())
        values, tops, _ = log_probabilities(output)
        values, tops = values[len(values) - len(ids) :], tops[len(tops) - len(ids) :]  # past echo's prompt
        done = output.status.is_done
        for index, token in enumerate(ids):
            last = done and index == len(ids) - 1
            stopped_by_id = last and output.status == GenerationStatus.END_OF_SEQUENCE  # a stop id or EOS
            if stopped_by_id and not self.rules.keep:
                piece = decoder.flush()  # vLLM leaves a stop token's text out: only what waited before it
            else:  # the last token brings whatever still waits for a whole character
                piece = decoder(token) + (decoder.flush() if last else "")
            made = Token(token, piece, values[index] if values else None, tops[index] if tops else {})
            self.new_line = self.new_line or "\n" in piece
            shown = self.cut.add(piece)
            self.made += 1
            self.first_at = self.first_at or time.perf_counter()
            if self.cut.matched is not None:
                yield Chunk(shown, (made,), Finish("stop", self.cut.matched))
                return
            if self.cut.short or (self._late(piece) and not last):
                yield Chunk(shown + self.cut.flush(), (made,), Finish("length"))
                return
            if last:
                yield Chunk(shown + self.cut.flush(), (made,), self._finish(output, ids))
                return
            if self._repeats(token):
                yield Chunk(shown + self.cut.flush(), (made,), Finish("repetition", "repetition_detected"))
                return
            yield Chunk(shown, (made,))
        if done and not ids:
            yield Chunk(self.cut.flush(), (), self._finish(output, ids))

    def _repeats(self, token: int) -> bool:
        """Whether the tokens kept, `token` the last and `min_tokens` of them at least, end as
        `Rules.repetition` looks for."""
        rule = self.rules.repetition
        if rule is None:
            return False
        self.ids.append(token)
        return self.made >= self.rules.min_tokens and rule.found(self.ids)

    def _late(self, piece: str) -> bool:
        """Whether `piece` brings a newline past `Rules.predict_s` from the first token."""
        limit = self.rules.predict_s
        return limit is not None and "\n" in piece and time.perf_counter() - (self.first_at or 0.0) > limit

    def _finish(self, output: TokenGeneratorOutput, ids: list[int]) -> Finish:
        if output.status == GenerationStatus.MAXIMUM_LENGTH:
            return Finish("length")
        # end-of-text or a stop token id: both "stop" (vLLM names only the latter)
        stopped = ids[-1] if ids and ids[-1] in self.rules.stop_token_ids else None
        return Finish("stop", stopped)

    def _prompt_tokens(self, prompt: list[int], output: TokenGeneratorOutput) -> tuple[Token, ...]:
        """The prompt's tokens with their text and, where `echo` asked, their log-probabilities (and
        ranks, where asked)."""
        pieces = texts_of(tokenizer_of(self.engine), prompt, self.rules.skip_special)
        values, tops, ranks = log_probabilities(output) if self.request.echo else ([], [], [])
        if len(values) < len(prompt):
            return tuple(Token(token, piece) for token, piece in zip(prompt, pieces, strict=True))
        return tuple(
            Token(token, piece, values[index], tops[index], ranks[index]) if index else Token(token, piece)
            for index, (token, piece) in enumerate(zip(prompt, pieces, strict=True))
        )


async def gather(choice: Choice) -> Gathered:
    """`choice` read to its end."""
    text, tokens, finish = [], [], None
    async for chunk in choice.chunks():
        text.append(chunk.text)
        tokens.extend(chunk.tokens)
        finish = chunk.finish or finish
    assert finish is not None, "a choice ends with a finish"
    return Gathered("".join(text), tokens, finish)


def texts_of(tokenizer: Tokenizer, ids: Sequence[int], skip_special: bool) -> list[str]:
    """The text each of `ids` adds, the last with whatever waited for a whole character: together, the
    decode of them all (`TextStream`)."""
    decoder = TextStream(tokenizer, skip_special)
    pieces = [decoder(token) for token in ids]
    if pieces:
        pieces[-1] += decoder.flush()
    return pieces


def log_probabilities(
    output: TokenGeneratorOutput,
) -> tuple[list[float], list[dict[int, float]], list[int | None]]:
    """An output's log-probabilities, one a position, its alternatives by id, likeliest first, and the
    rank the worker found where it was asked to (empty lists where none were asked for)."""
    values = list(output.token_log_probabilities or ())
    tops, ranks = [], []
    for given in output.top_log_probabilities or ():
        top, rank = take_rank(given)
        tops.append(
            dict(sorted(((token, value) for token, (_, value) in top.items()), key=lambda item: -item[1]))
        )
        ranks.append(rank)
    return values, tops, ranks


def tokenizer_of(engine: TokenGeneratorPipeline) -> Tokenizer:
    """The `tokenizers` tokenizer behind MAX's (a Hugging Face fast tokenizer)."""
    return engine.tokenizer.delegate.backend_tokenizer
