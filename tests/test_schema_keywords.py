"""The JSON Schema keywords refused as not held (`max_gpt2.inference.schema_keywords`), measured on MAX's
grammar engine against `jsonschema`: each refused keyword's schema, compiled as it is, lets through a
text `jsonschema` finds invalid (so the refusal is needed: a MAX that comes to hold it fails here),
and each kept keyword's schema takes a valid text and stops an invalid one. No model, no graph."""

from __future__ import annotations

import json
import re

import pytest

from max_gpt2 import Constraint, load_tokenizer
from max_gpt2.inference.constraints import COMPILE, GrammarEngine
from max_gpt2.inference.schema_keywords import FORMATS
from max_gpt2.max_internals import grammar_matcher
from tests.support import LM

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema says which texts are valid")
EOS = 0  # the test tokenizer's <|endoftext|>


@pytest.fixture(scope="module")
def engine(lm_checkpoint) -> GrammarEngine:
    return GrammarEngine(load_tokenizer(lm_checkpoint(LM)), LM.vocab_size, [EOS])


def held(engine: GrammarEngine, schema: dict, text: str) -> bool:
    """Whether the engine, given `schema` as it is (no refusal), lets `text` be a whole answer."""
    matcher = grammar_matcher(COMPILE["json_schema"](engine.compiler, json.dumps(schema)), [EOS])
    return bool(matcher.accept_string(text) and matcher.accept_token(EOS))


def valid(schema: dict, text: str) -> bool:
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    return jsonschema.Draft202012Validator(schema, format_checker=checker).is_valid(json.loads(text))


def under(schema: dict) -> dict:
    """`schema` as the one property of an object, so that a pointer below the root is named."""
    return {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}


INTEGERS = {"type": "array", "items": {"type": "integer"}}
AB = {"type": "object", "properties": {"a": {}, "b": {}}}
REFUSED = [  # (schema of v, an invalid v the engine lets through, the pointer named)
    ({"type": "integer", "multipleOf": 5}, "7", "/v/multipleOf"),
    ({**INTEGERS, "uniqueItems": True}, "[1, 1]", "/v/uniqueItems"),
    ({**INTEGERS, "contains": {"const": 2}}, "[1]", "/v/contains"),
    ({"not": {"type": "integer"}}, "1", "/v/not"),
    ({**AB, "propertyNames": {"pattern": "^z"}}, '{"a": 1}', "/v/propertyNames"),
    ({**AB, "dependentRequired": {"a": ["b"]}}, '{"a": 1}', "/v/dependentRequired"),
    ({**AB, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, '{"a": 1}', "/v/if"),
    ({"type": "string", "format": "date", "maxLength": 5}, '"2020-01-01"', "/v: maxLength beside format"),
    ({"type": "string", "pattern": "^[a-z]+$", "minLength": 3}, '"a"', "/v: minLength beside pattern"),
    ({"type": "string", "format": "regex"}, '"("', "/v/format"),
    ({"$ref": "#/$defs/n", "minimum": 5}, "3", "/v: minimum beside $ref"),
]  # fmt: skip
KEPT = [  # (schema of v, a valid v, an invalid v)
    ({"const": 3}, "3", "4"),
    ({"enum": [1, "a"]}, '"a"', "2"),
    ({"type": "integer", "minimum": 2, "exclusiveMaximum": 5}, "4", "5"),
    ({"type": "string", "maxLength": 3}, '"abc"', '"abcd"'),
    ({"type": "string", "pattern": "^a+$"}, '"aa"', '"ab"'),
    ({**INTEGERS, "minItems": 2, "maxItems": 2}, "[1, 2]", "[1]"),
    ({**INTEGERS, "uniqueItems": False}, "[1, 1]", '["x"]'),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1]", "[1, 2]"),
    ({"patternProperties": {"^z": {"const": 1}}, "additionalProperties": False}, '{"z": 1}', '{"z": 2}'),
    ({"type": "object", "minProperties": 1, "maxProperties": 1}, '{"a": 1}', "{}"),
    ({"allOf": [{"type": "integer", "minimum": 5}, {"maximum": 9}]}, "7", "3"),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "null", '"x"'),
    ({"oneOf": [{"const": "cat"}, {"const": "dog"}]}, '"dog"', '"cow"'),  # disjoint: oneOf is anyOf
    ({"$ref": "#/$defs/n", "description": "a number"}, "1", '"x"'),
]  # fmt: skip
EXAMPLES = {  # a valid string of each format the engine holds; "a b" is none of them
    "date": "2020-01-31", "time": "12:00:00Z", "date-time": "2020-01-31T12:00:00Z", "duration": "P1D",
    "email": "a@b.co", "hostname": "a.b", "ipv4": "1.2.3.4", "ipv6": "::1",
    "uuid": "123e4567-e89b-12d3-a456-426614174000", "uri": "http://a.b/c", "uri-reference": "/c",
    "uri-template": "/c{d}", "json-pointer": "/c", "relative-json-pointer": "0/c",
}  # fmt: skip


def with_defs(schema: dict) -> dict:
    return {**under(schema), "$defs": {"n": {"type": "integer"}}}


@pytest.mark.parametrize(("schema", "invalid", "pointer"), REFUSED)
def test_a_keyword_the_engine_does_not_hold_is_refused_naming_where(engine, schema, invalid, pointer):
    whole, text = with_defs(schema), '{"v": ' + invalid + "}"
    assert held(engine, whole, text) and not valid(whole, text)  # the engine would let it through
    with pytest.raises(ValueError, match="json_schema: #/properties" + re.escape(pointer)):
        engine.compiled(Constraint.json_schema(whole))


@pytest.mark.parametrize(("schema", "good", "bad"), KEPT)
def test_a_keyword_kept_is_held(engine, schema, good, bad):
    whole = with_defs(schema)
    engine.compiled(Constraint.json_schema(whole))  # not refused
    for text, expected in (('{"v": ' + good + "}", True), ('{"v": ' + bad + "}", False)):
        assert held(engine, whole, text) is expected and valid(whole, text) is expected, text


@pytest.mark.parametrize("form", sorted(FORMATS))
def test_every_format_kept_is_held(engine, form):
    assert EXAMPLES.keys() == FORMATS
    whole = under({"type": "string", "format": form})
    assert held(engine, whole, json.dumps({"v": EXAMPLES[form]}))
    assert not held(engine, whole, json.dumps({"v": "a b"}))
