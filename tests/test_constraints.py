"""Constrained decoding (`max_gpt2.inference.constraints`) on the compiled test LM, random weights:
every output parses and validates (`jsonschema`, Python's `re`), greedy picks the model's likeliest
token among those an independent check written here allows, and what cannot be honoured is refused."""

from __future__ import annotations

import codecs
import json
import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from max_gpt2 import Constraint, Sampler, load_tokenizer
from max_gpt2.inference import utf8
from max_gpt2.inference.constraints import GrammarEngine, GrammarEngines
from max_gpt2.inference.tokenizer import token_bytes
from tests.support import LM

EOS = 0  # the test tokenizer's <|endoftext|> (`max_gpt2.testing.write_tokenizer`)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "where": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "ok": {"type": "null"}},
            "required": ["x"],
        },
    },
    "required": ["name", "size", "kind", "where"],
}
SAMPLERS = [Sampler(), Sampler(do_sample=True, seed=3), Sampler(do_sample=True, temperature=1.5, seed=8)]


@pytest.fixture
def lm_and_tokenizer(compiled_lm, lm_checkpoint):
    return compiled_lm(LM), load_tokenizer(lm_checkpoint(LM))


def texts(tokenizer, out: np.ndarray, prompt: int) -> list[tuple[str, bool]]:
    """Each row's new text up to end-of-text (strict UTF-8: a constraint keeps it valid), and whether
    it ended there."""
    rows = []
    for row in out[:, prompt:]:
        ended = EOS in row.tolist()
        new = row[: row.tolist().index(EOS)] if ended else row
        rows.append((b"".join(token_bytes(tokenizer, int(t)) for t in new).decode("utf-8"), ended))
    return rows


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["greedy", "sampled", "hot"])
def test_every_output_of_a_schema_parses_and_validates(lm_and_tokenizer, sampler):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks the outputs")
    lm, tokenizer = lm_and_tokenizer
    ids = np.array([tokenizer.encode("The cat").ids] * 3)
    options = {"eos_token_id": EOS, "tokenizer": tokenizer, "context_overflow": "shift"}
    rows = 1 if not sampler.do_sample else 2
    schema = Constraint.json_schema(SCHEMA)
    out = lm.generate(ids, 160, sampler=sampler, constraint=schema, num_return_sequences=rows, **options)
    for text, ended in texts(tokenizer, out, ids.shape[1]):
        assert ended, f"{text!r} did not end"
        jsonschema.validate(json.loads(text), SCHEMA)


def allowed_by_pattern(tokenizer, prefix: str, pattern: re.Pattern[str], longest: int) -> np.ndarray:
    """Written here, apart from the engine: the tokens whose text keeps `prefix` within `pattern`'s
    characters and `longest` characters, and end-of-text once the text is not empty."""
    allowed = np.zeros(LM.vocab_size, dtype=bool)
    for id_ in range(1, tokenizer.get_vocab_size()):
        text = prefix + token_bytes(tokenizer, id_).decode("utf-8", "replace")
        allowed[id_] = len(text) <= longest and pattern.fullmatch(text) is not None
    allowed[EOS] = bool(prefix)
    return allowed


def test_greedy_takes_the_likeliest_token_an_independent_check_allows(lm_and_tokenizer):
    lm, tokenizer = lm_and_tokenizer
    ids = np.array([tokenizer.encode("The cat sat").ids])
    pattern, free_choice_taken = re.compile("[a-z ]*"), 0
    prefix = ""
    for step in lm.stream(
        ids, 16, constraint=Constraint.regex("[a-z ]{1,12}"), eos_token_id=EOS, tokenizer=tokenizer
    ):
        allowed = allowed_by_pattern(tokenizer, prefix, pattern, 12)
        token, likeliest = int(step.tokens[0]), int(np.argmax(step.logits[0]))
        assert token == int(np.argmax(np.where(allowed, step.logits[0], -np.inf)))
        free_choice_taken += token == likeliest
        if token == EOS:
            break
        prefix += token_bytes(tokenizer, token).decode("utf-8")
    assert re.fullmatch("[a-z ]{1,12}", prefix)
    assert free_choice_taken < 16  # the model's own choice was refused at least once here


@pytest.mark.parametrize("sampler", SAMPLERS[:2], ids=["greedy", "sampled"])
def test_a_choice_gives_exactly_one_of_the_choices(lm_and_tokenizer, sampler):
    lm, tokenizer = lm_and_tokenizer
    choices = ["yes", "no", 'say "hi"', "back\\slash"]
    ids = np.array([tokenizer.encode("The cat").ids] * 4)
    out = lm.generate(
        ids, 20, sampler=sampler, constraint=Constraint.choice(choices), eos_token_id=EOS, tokenizer=tokenizer
    )
    for text, ended in texts(tokenizer, out, ids.shape[1]):
        assert ended and text in choices


def test_a_gbnf_grammar_and_one_constraint_a_prompt(lm_and_tokenizer):
    lm, tokenizer = lm_and_tokenizer
    grammar = 'root ::= "(" digits ("+" digits)* ")"\ndigits ::= [0-9] [0-9]?'
    ids = np.array([tokenizer.encode("The cat").ids] * 3)
    constraints = [Constraint.grammar(grammar), None, Constraint.regex("[a-c]{2,5}")]
    sampler = Sampler(do_sample=True, seed=5)
    out = lm.generate(ids, 40, sampler=sampler, constraint=constraints, eos_token_id=EOS, tokenizer=tokenizer)
    (sums, ended), (letters, ended_too) = texts(tokenizer, out[[0, 2]], ids.shape[1])
    assert ended and re.fullmatch(r"\([0-9]{1,2}(\+[0-9]{1,2})*\)", sums)
    assert ended_too and re.fullmatch("[a-c]{2,5}", letters)
    greedy_free = lm.generate(ids, 12, eos_token_id=EOS, tokenizer=tokenizer)
    greedy = lm.generate(
        ids, 12, constraint=[None, Constraint.json_object(), None], eos_token_id=EOS, tokenizer=tokenizer
    )
    np.testing.assert_array_equal(greedy[[0, 2]], greedy_free[[0, 2]])  # free rows are untouched


def test_a_constraint_that_cannot_finish_runs_to_the_length(lm_and_tokenizer):
    lm, tokenizer = lm_and_tokenizer
    ids = np.array([tokenizer.encode("The cat").ids])
    out = lm.generate(ids, 6, constraint=Constraint.regex("[a-z]{40}"), eos_token_id=EOS, tokenizer=tokenizer)
    ((text, ended),) = texts(tokenizer, out, ids.shape[1])
    assert not ended and re.fullmatch("[a-z]+", text) and len(out[0]) == ids.shape[1] + 6


def test_drafted_tokens_are_kept_only_where_the_constraint_allows_them(lm_and_tokenizer):
    """Prompt lookup under a constraint: the text is the text without drafts, some drafts kept."""
    lm, tokenizer = lm_and_tokenizer
    constraint = Constraint.regex("[a-z ]{1,80}")
    options = {"constraint": constraint, "eos_token_id": EOS, "tokenizer": tokenizer}
    ids = np.array([tokenizer.encode("the cat the cat the cat the cat").ids])
    plain = lm.generate(ids, 30, **options)
    steps = lm.stream(ids, 30, prompt_lookup_num_tokens=4, **options)
    drafted = np.concatenate([ids[0], [int(step.tokens[0]) for step in steps]])
    np.testing.assert_array_equal(drafted, plain[0, : len(drafted)])
    assert len(drafted) == len(plain[0]) or drafted[-1] == EOS
    assert steps.drafts.accepted > 0


def test_a_models_grammar_engines_are_made_once_each_and_the_last_few_kept(lm_and_tokenizer):
    """`lm.grammars`: the engine for a tokenizer and stop ids is made once and used by every constrained
    call; a new tokenizer or stop ids make another, and past `KEPT` the least recently used goes."""
    lm, tokenizer = lm_and_tokenizer
    ids = np.array([tokenizer.encode("The cat").ids])
    options = {"constraint": Constraint.regex("[a-c]{2}"), "eos_token_id": EOS, "tokenizer": tokenizer}
    lm.generate(ids, 4, **options)
    engine = lm.grammars.engine(tokenizer, [EOS])
    out = lm.generate(ids, 4, **options)
    assert lm.grammars.engine(tokenizer, [EOS]) is engine
    assert re.fullmatch("[a-c]{2}", texts(tokenizer, out, ids.shape[1])[0][0])
    grammars = GrammarEngines(LM.vocab_size)
    first = grammars.engine(tokenizer, [EOS])
    assert grammars.engine(tokenizer, [EOS]) is first and grammars.engine(tokenizer, [EOS, 5]) is not first
    for stop in range(6, 6 + GrammarEngines.KEPT - 1):
        grammars.engine(tokenizer, [stop])
    assert grammars.engine(tokenizer, [EOS, 5]) is not None and len(grammars.made) == GrammarEngines.KEPT
    assert grammars.engine(tokenizer, [EOS]) is not first  # the least recently used went


def test_looking_ahead_fills_each_drafted_position_and_leaves_the_matcher_as_it_was(lm_and_tokenizer):
    """`RowGuide.ahead`: the allowed prefix of a draft, each position's mask as after accepting the tokens
    before it, the matcher rolled back (its next mask unchanged)."""
    _, tokenizer = lm_and_tokenizer
    engine = GrammarEngine(tokenizer, LM.vocab_size, [EOS])
    guide = engine.row(Constraint.choice(["ab", "ba"]))
    a, b = (tokenizer.token_to_id(letter) for letter in "ab")
    before = guide.mask(np.zeros(LM.vocab_size))
    bitmask = np.full((4, engine.words), -1, dtype=np.int32)
    assert guide.ahead([a, b, EOS], bitmask) == 3
    assert guide.ahead([a, a, EOS]) == 1
    np.testing.assert_array_equal(guide.mask(np.zeros(LM.vocab_size)), before)
    walked = engine.row(Constraint.choice(["ab", "ba"]))
    for index, token in enumerate([a, b, EOS]):
        allowed = walked.mask(np.zeros(LM.vocab_size)) == 0
        assert (
            np.unpackbits(bitmask[index].view(np.uint8), bitorder="little")[: LM.vocab_size] == allowed
        ).all()
        walked.accept(token)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"constraint": Constraint.json_schema("{not json")}, "json_schema: "),
        ({"constraint": Constraint.json_schema({"type": "object", "required": 3})}, "json_schema: "),
        ({"constraint": Constraint.regex("(a")}, "regex: "),
        ({"constraint": Constraint.grammar("root ::= ")}, "grammar: "),
        ({"constraint": Constraint.grammar('start ::= "a"')}, "grammar: "),
        ({"constraint": [Constraint.regex("a")] * 3}, "constraint: one a prompt, for 2 prompts; got 3"),
        ({"constraint": "a"}, "constraint must be a Constraint or a list of them"),
        ({"constraint": Constraint.regex("a"), "min_new_tokens": 2}, "which min_new_tokens would forbid"),
        ({"constraint": Constraint.regex("a"), "num_beams": 2}, "constraint does not take num_beams > 1"),
    ],
)
def test_what_cannot_be_honoured_is_refused_before_any_step(lm_and_tokenizer, options, message):
    lm, tokenizer = lm_and_tokenizer
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        lm.generate(np.array([[5, 6], [7, 8]]), 4, eos_token_id=EOS, tokenizer=tokenizer, **options)


def test_a_choice_list_is_checked():
    with pytest.raises(ValueError, match="choice needs a list of non-empty strings"):
        Constraint.choice("yes")


def decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=12))
@example(b"\xed\xa0")  # a surrogate's start: Python's decoder waits, no byte can finish it
def test_the_utf8_states_agree_with_pythons_decoder(data):
    """`utf8.after` against Python's own decoder: a boundary where the bytes decode, inside a character
    where they are a valid start of more, -1 where no continuation could make them valid. Python's
    incremental decoder waits on some starts no byte can finish (a surrogate's `ED A0`): those count
    as inside only where a continuation (a first byte of 80-BF, then 80s) decodes."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data, final=False)
        state = "inside" if decoder.getstate()[0] else "boundary"
    except UnicodeDecodeError:
        state = "broken"
    if state == "inside" and not any(
        decodes(data + bytes([first]) + b"\x80" * more) for first in range(0x80, 0xC0) for more in range(3)
    ):
        state = "broken"
    got = utf8.after(0, data)
    assert {"boundary": got == 0, "inside": got > 0, "broken": got == -1}[state], (data, got)


DIGIT = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
}
TAG = {"type": "tag", "begin": "<f>", "content": {"type": "json_schema", "json_schema": DIGIT}, "end": "</f>"}


@pytest.mark.parametrize("triggered", [False, True], ids=["tag", "triggered"])
def test_a_structural_tag_holds_each_tag_to_its_form(lm_and_tokenizer, triggered):
    """A tag: `<f>`, JSON valid against its schema, `</f>`. Triggered tags (the text ended after the first,
    `<` and `f` made likelier): free text with no trigger, then the tag whole at the text's end, or free
    text alone. Checked by a regular expression and `jsonschema`."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks the outputs")
    lm, tokenizer = lm_and_tokenizer
    ids = np.array([tokenizer.encode("A").ids] * 3)
    form = {"type": "triggered_tags", "triggers": ["<f"], "tags": [TAG], "stop_after_first": True}
    constraint = Constraint.structural_tag({"type": "structural_tag", "format": form if triggered else TAG})
    bias = {tokenizer.token_to_id(c): 6.0 for c in "<f"} if triggered else {}
    sampler = Sampler(do_sample=True, seed=4, logit_bias=bias)
    new = LM.n_positions - ids.shape[1]
    out = lm.generate(ids, new, sampler=sampler, constraint=constraint, eos_token_id=EOS, tokenizer=tokenizer)
    made = texts(tokenizer, out, ids.shape[1])
    for text, ended in made:
        found = re.fullmatch(r"(.*?)<f>(.*)</f>", text, re.S)
        assert ended and (found or (triggered and "<f" not in text)), text
        if found:
            assert "<f" not in found[1] and (triggered or not found[1])
            jsonschema.validate(json.loads(found[2]), DIGIT)
    assert not triggered or any(re.match(r"(.+?)<f>", text, re.S) for text, _ in made)  # free text first


def test_vllms_older_structural_tag_reads_as_its_triggered_tags():
    older = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": DIGIT, "end": "</f>"}],
        "triggers": ["<f"],
    }
    triggered = {"type": "triggered_tags", "triggers": ["<f"], "tags": [TAG]}
    assert json.loads(Constraint.structural_tag(older).source) == {
        "type": "structural_tag",
        "format": triggered,
    }
    with pytest.raises(ValueError, match="structures\\[0\\]: an object of"):
        Constraint.structural_tag({**older, "structures": [{"begin": "<f>"}]})
    with pytest.raises(ValueError, match='has a "format", or "structures" and "triggers"'):
        Constraint.structural_tag({"type": "structural_tag"})
