"""Constrained decoding: each row's new text held to a JSON schema, any JSON, a regular expression,
one of a list of choices, a GBNF grammar or a structural tag (free text and tags, each held to its own
form: `max_gpt2.inference.structural_tags`), on MAX's bundled grammar engine (xgrammar).

    out = lm.generate(ids, 40, constraint=Constraint.json_schema(schema))        # every row
    out = lm.generate(ids, 40, constraint=[Constraint.regex(r"[0-9]+"), None])    # one a prompt; None: free
    out = lm.generate(ids, 8, constraint=Constraint.choice(["yes", "no"]))

Each step the engine says which tokens may come next in each constrained row (a bitmask over the
vocabulary, [rows, ceil(V / 32)] int32), and of those the ones that keep the text valid UTF-8
(`max_gpt2.inference.utf8`); the others get the lowest float32 logit after the logits
controls and before the sampler or argmax, so a greedy row takes the unconstrained choice wherever
that was allowed. The chosen token advances the row's matcher. Once the text is complete only the
end-of-text ids may follow, and the row ends on one as with `eos_token_id`; a row that runs out of
`max_new_tokens` first ends incomplete (the server's `finish_reason: "length"`). JSON is written
without free whitespace (`, ` and `: ` between items), so a small model cannot wander in blank space.
A schema, pattern or grammar the engine cannot compile is refused with its message, before any step,
as is a schema keyword it would not hold the text to (`max_gpt2.inference.schema_keywords`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from max_gpt2.inference.logit_controls import LOWEST
from max_gpt2.inference.schema_keywords import unheld
from max_gpt2.inference.structural_tags import schemas, tag_json
from max_gpt2.inference.tokenizer import piece_bytes
from max_gpt2.inference.utf8 import Utf8Tokens
from max_gpt2.max_internals import bitmask_words, grammar_compiler, grammar_matcher

# The engine's errors start with its log prefix: "[10:09:12] external/.../file.cc:168: ".
_LOG_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def _schema(compiler: Any, text: str) -> Any:
    return compiler.compile_json_schema(text, any_whitespace=False, strict_mode=True)


# How each kind of constraint compiles (xgrammar's compiler, the constraint's source).
COMPILE: dict[str, Callable[[Any, str], Any]] = {
    "json_schema": _schema,
    "json_object": _schema,
    "regex": lambda compiler, text: compiler.compile_regex(text),
    "grammar": lambda compiler, text: compiler.compile_grammar(text, "root"),
    "structural_tag": lambda compiler, text: compiler.compile_structural_tag(text),
}


@dataclass(frozen=True)
class Constraint:
    """What a row's new text must be, as plain data (the server carries it to its model worker): made
    by `json_schema`, `json_object`, `regex`, `choice`, `grammar` or `structural_tag`. `kind` is one of
    `COMPILE`'s, `source` the schema or the tag as JSON text, the pattern or the grammar (GBNF)."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in COMPILE or not isinstance(self.source, str):
            raise ValueError(f"a constraint is one of {', '.join(COMPILE)} with its text; got {self!r}")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str) -> Constraint:
        """JSON that validates against `schema` (a dict, or its JSON text); no properties beyond
        those it lists, as OpenAI's `strict`."""
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
        return cls("json_object", '{"type": "object"}')

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Text the whole of which matches `pattern` (xgrammar's regular expressions)."""
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: Sequence[str]) -> Constraint:
        """Exactly one of `choices` (non-empty strings)."""
        if isinstance(choices, str) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"choice needs a list of non-empty strings; got {choices!r}")
        # A JSON string literal is a valid EBNF one: quotes, backslashes and control characters escaped.
        return cls.grammar("root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices))

    @classmethod
    def grammar(cls, gbnf: str) -> Constraint:
        """Text that `gbnf`'s rule `root` derives (GBNF: `root ::= "yes" | "no"`)."""
        return cls("grammar", gbnf)

    @classmethod
    def structural_tag(cls, tag: Mapping[str, Any] | str) -> Constraint:
        """Text as the structural tag `tag` (a dict, or its JSON text) lays it out: its `format`, or vLLM's
        older `structures` and `triggers` (`max_gpt2.inference.structural_tags`)."""
        return cls("structural_tag", tag_json(tag))


def _schemas(constraint: Constraint) -> list[str]:
    """The JSON schemas (as JSON text) `constraint` holds a text to, where it holds it to any."""
    if constraint.kind == "structural_tag":
        return [json.dumps(schema) for schema in schemas(constraint.source)]
    return [constraint.source] if constraint.kind == "json_schema" else []


class GrammarEngine:
    """The grammar engine for one tokenizer and vocabulary: it compiles constraints and makes their
    row guides. `vocab_size` is the model's (ids past the tokenizer's are no text, never allowed);
    `stop_ids` end a row once its text is complete."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: Sequence[int]) -> None:
        if not stop_ids:
            raise ValueError("a constraint ends a row on end-of-text: give eos_token_id")
        pieces = [""] * vocab_size
        for piece, id_ in tokenizer.get_vocab(with_added_tokens=True).items():
            if id_ < vocab_size:
                pieces[id_] = piece
        special = [id_ for id_ in tokenizer.get_added_tokens_decoder() if id_ < vocab_size]
        self.vocab_size, self.stop_ids = vocab_size, [int(id_) for id_ in stop_ids]
        self.words = bitmask_words(vocab_size)
        self.compiler = grammar_compiler(tokenizer.to_str(), pieces, self.stop_ids, special)
        self.utf8 = Utf8Tokens([piece_bytes(piece) for piece in pieces], special)
        self.utf8_words = self.utf8.packed(self.words)  # int32 [states, words]: the same as bitmasks
        stops = np.zeros(self.words * 32, dtype=bool)
        stops[self.stop_ids] = True
        self.stop_words = np.packbits(stops, bitorder="little").view(np.int32)  # a complete text's next

    def compiled(self, constraint: Constraint) -> Any:
        """`constraint` compiled; a ValueError names its kind and gives the engine's message, or where a
        schema asks for what the engine would not hold a text to (`schema_keywords`)."""
        for schema in _schemas(constraint):
            if (problem := unheld(schema)) is not None:
                raise ValueError(f"{constraint.kind}: {problem}")
        try:
            return COMPILE[constraint.kind](self.compiler, constraint.source)
        except RuntimeError as error:
            message = _LOG_PREFIX.sub("", str(error).strip().splitlines()[0])
            raise ValueError(f"{constraint.kind}: {message}") from None

    def row(self, constraint: Constraint, compiled: Any = None) -> RowGuide:
        """A `RowGuide` for one row held to `constraint` (`compiled` where it is compiled already)."""
        compiled = self.compiled(constraint) if compiled is None else compiled
        return RowGuide(grammar_matcher(compiled, self.stop_ids), self)

    def guide(self, constraints: Sequence[Constraint | None]) -> Guide:
        """A `Guide` for rows constrained by `constraints` (one a row; None: free)."""
        compiled = {c: self.compiled(c) for c in dict.fromkeys(c for c in constraints if c is not None)}
        rows = {row: self.row(c, compiled[c]) for row, c in enumerate(constraints) if c is not None}
        return Guide(rows, self)


class GrammarEngines:
    """A model's grammar engines by tokenizer and stop ids, the `KEPT` last used each made once (an
    engine takes a fifth of a second for GPT-2's 50,257 tokens), so that constrained calls after the
    first start at once. It holds the tokenizers it keeps engines for, so their ids stay theirs."""

    KEPT = 4

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.made: dict[tuple[int, tuple[int, ...]], tuple[Tokenizer, GrammarEngine]] = {}

    def engine(self, tokenizer: Tokenizer, stop_ids: Sequence[int]) -> GrammarEngine:
        key = (id(tokenizer), tuple(int(id_) for id_ in stop_ids))
        made = self.made.pop(key, None) or (tokenizer, GrammarEngine(tokenizer, self.vocab_size, key[1]))
        self.made[key] = made  # the last used last
        while len(self.made) > self.KEPT:
            del self.made[next(iter(self.made))]
        return made[1]


class RowGuide:
    """One row's matcher: `mask` its next-token logits, `accept` the token chosen. Its text stays
    valid UTF-8 (`utf8`: where its last character stands). Once it is complete only the stop ids
    may follow (a server that ignores end-of-text goes on with them)."""

    def __init__(self, matcher: Any, engine: GrammarEngine) -> None:
        self.matcher, self.engine, self.utf8 = matcher, engine, 0

    def fill(self, bitmask: np.ndarray, index: int) -> None:
        """Writes which tokens may come next into row `index` of `bitmask` (int32 [rows, words]): the
        grammar's, of them those that keep the text valid UTF-8."""
        if self.matcher.is_terminated():
            bitmask[index] = self.engine.stop_words
            return
        self.matcher.fill_next_token_bitmask(bitmask, index)
        bitmask[index] &= self.engine.utf8_words[self.utf8]

    def mask(self, row: np.ndarray) -> np.ndarray:
        """`row` (float [V]) with the tokens not allowed next at the lowest float32, as a new array."""
        bitmask = np.empty((1, self.engine.words), dtype=np.int32)
        self.fill(bitmask, 0)
        return blocked(row[None], bitmask)[0]

    def accept(self, token: int) -> None:
        """Advances the matcher by `token`; a RuntimeError where the constraint forbids it."""
        if self._take(int(token)) is None:
            raise RuntimeError(f"token {int(token)} breaks the constraint")

    def _take(self, token: int) -> int | None:
        """Advances by `token` where the constraint allows it: the tokens the matcher took (1, or 0 once
        the text is complete); None, nothing advanced, where it forbids it."""
        following = int(self.engine.utf8.following[self.utf8, token])
        if following < 0:
            return None
        took = 0
        if not self.matcher.is_terminated():
            if not self.matcher.accept_token(token):
                return None
            took = 1
        self.utf8 = following
        return took

    def ahead(self, tokens: Sequence[int], bitmask: np.ndarray | None = None) -> int:
        """How many of `tokens` (a draft), one after another, the constraint allows from here; with
        `bitmask` (int32 [S, words], S > that many), its row i filled with what may follow the first i
        of them. The matcher is rolled back to where it was: only chosen tokens advance it."""
        utf8, accepted, allowed = self.utf8, 0, 0
        try:
            for token in tokens:
                if bitmask is not None:
                    self.fill(bitmask, allowed)
                took = self._take(int(token))
                if took is None:
                    break
                accepted, allowed = accepted + took, allowed + 1
            else:
                if bitmask is not None and allowed < len(bitmask):
                    self.fill(bitmask, allowed)
        finally:
            if accepted:
                self.matcher.rollback(accepted)
            self.utf8 = utf8
        return allowed


def blocked(scores: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """`scores` (float [rows, V]) at the lowest float32 where `bitmask` (int32 [rows, words], bit i of a
    row: token i allowed) has no bit, as a new float32 array. Arithmetic, not a select: the lowest
    float32 added to a logit is the lowest float32 again, and a pass without branches costs the same
    whatever the mask holds (a select is several times slower on a mask of mixed bits)."""
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, count=scores.shape[-1], bitorder="little")
    out = np.subtract(allowed, 1, dtype=np.float32)  # 0 where allowed, -1 where not
    out *= -LOWEST
    out += scores
    return np.maximum(out, LOWEST, out=out)  # a logit already at the lowest stays there, not -inf


class Guide:
    """The constrained rows of a batch through one generation: `mask` the logits of a step, then
    `accept` the tokens chosen. `rows` maps a batch row to its `RowGuide`."""

    def __init__(self, rows: dict[int, RowGuide], engine: GrammarEngine) -> None:
        self.rows = rows
        self.index = np.fromiter(rows, dtype=np.int64, count=len(rows))
        self.bitmask = np.full((len(rows), engine.words), -1, dtype=np.int32)  # [constrained rows, words]

    def mask(self, scores: np.ndarray, finished: np.ndarray) -> np.ndarray:
        """`scores` (float32 [batch, V]) with what each unfinished constrained row may not take next at
        the lowest float32, as a new array (a finished row's token is replaced by its fill)."""
        for index, (row, guide) in enumerate(self.rows.items()):
            if finished[row]:
                self.bitmask[index] = -1
            else:
                guide.fill(self.bitmask, index)
        if len(self.index) == len(scores):  # every row constrained: no gather and scatter
            return blocked(scores, self.bitmask)
        scores = np.array(scores, dtype=np.float32)
        scores[self.index] = blocked(scores[self.index], self.bitmask)
        return scores

    def accept(self, tokens: np.ndarray, finished: np.ndarray) -> None:
        """Advances each unfinished constrained row by its token (int64 [batch])."""
        for row, guide in self.rows.items():
            if not finished[row]:
                guide.accept(int(tokens[row]))
