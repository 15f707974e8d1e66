"""Which JSON Schema keywords the grammar engine holds a text to: a schema that asks for one it would
compile into nothing is refused, naming where, rather than answered with text that fails the schema.

    unheld(source)   # None, or "#/properties/n/multipleOf: ..." for the first keyword not held

MAX's bundled xgrammar drops these silently (vLLM refuses the same ones for it); the lists are
measured against `jsonschema` in `tests/test_schema_keywords.py`: for each refused keyword the engine
takes a text the keyword forbids, and each kept one it holds. `oneOf` is held as `anyOf`, exact where
no text matches two branches (a tagged union's `const` or `enum` tags make them so).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

IGNORED = frozenset(
    [
        "multipleOf",
        "contains",
        "minContains",
        "maxContains",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "propertyNames",
    ]
)
"""Keywords the engine compiles into nothing."""
FORMATS = frozenset(
    [
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    ]
)
"""The string formats the engine holds a text to (others it lets be any string)."""
BESIDE_REF = frozenset(
    [
        "$ref",
        "$defs",
        "definitions",
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
    ]
)
"""What may stand beside `$ref`: the engine reads the schema referred to alone."""
SUBSCHEMA = ("additionalProperties", "items", "unevaluatedProperties", "unevaluatedItems")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def unheld(source: str) -> str | None:
    """Where the schema `source` (JSON text) asks for what the engine would not hold a text to, and
    what: None where it asks for nothing such, or is not JSON (the engine's own error then)."""
    try:
        schema = json.loads(source)
    except ValueError:
        return None
    return next(_unheld(schema, "#"), None)


def _unheld(schema: Any, where: str) -> Iterator[str]:
    if not isinstance(schema, Mapping):
        return
    for keyword in sorted(schema.keys() & IGNORED):
        yield f"{where}/{keyword}: the grammar engine cannot hold a text to {keyword}"
    if schema.get("uniqueItems") is True:
        yield f"{where}/uniqueItems: the grammar engine cannot hold a text to uniqueItems"
    if "format" in schema and schema["format"] not in FORMATS:
        held = ", ".join(sorted(FORMATS))
        yield f"{where}/format: the grammar engine holds a text to no format {schema['format']!r} ({held})"
    lengths = schema.keys() & {"minLength", "maxLength"}
    shapes = schema.keys() & {"pattern", "format"}
    if lengths and shapes:
        both = f"{' and '.join(sorted(lengths))} beside {' and '.join(sorted(shapes))}"
        yield f"{where}: {both}: the grammar engine holds a text to one or the other, not both"
    if shapes == {"pattern", "format"}:
        yield f"{where}: pattern beside format: the grammar engine holds a text to one or the other, not both"
    if "$ref" in schema and (beside := sorted(schema.keys() - BESIDE_REF)):
        yield f"{where}: {', '.join(beside)} beside $ref: the grammar engine reads the referred schema alone"
    for keyword in SUBSCHEMA:
        yield from _unheld(schema.get(keyword), f"{where}/{keyword}")
    for keyword in SUBSCHEMA_LISTS:
        if isinstance(branches := schema.get(keyword), list):
            for index, branch in enumerate(branches):
                yield from _unheld(branch, f"{where}/{keyword}/{index}")
    for keyword in SUBSCHEMA_MAPS:
        if isinstance(named := schema.get(keyword), Mapping):
            for name, each in named.items():
                escaped = str(name).replace("~", "~0").replace("/", "~1")  # a JSON pointer's (RFC 6901)
                yield from _unheld(each, f"{where}/{keyword}/{escaped}")
