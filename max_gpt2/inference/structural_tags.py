"""Structural tags: xgrammar's description of a text made of parts, each held to its own form.

    {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<call"],
     "tags": [{"type": "tag", "begin": "<call>", "content": {"type": "json_schema", "json_schema": S},
               "end": "</call>"}]}}

is free text in which each `<call>` opens a JSON object valid against S, closed by `</call>`; formats
nest (`sequence`, `or`, `const_string`, `regex`, `grammar`, `any_text`, ...: xgrammar's documentation).
This is what vLLM's and MAX's `response_format: {"type": "structural_tag", "format": ...}` holds. vLLM's
older form, `{"type": "structural_tag", "structures": [{"begin", "schema", "end"}], "triggers": [...]}`,
reads as the triggered tags it stands for (`tag_json`). The engine checks the rest as it compiles.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any


def tag_json(tag: Mapping[str, Any] | str) -> str:
    """`tag` (a structural tag, or its JSON text) as the JSON text the engine compiles; vLLM's older form
    as its triggered tags. A ValueError for a tag in neither form."""
    given = json.loads(tag) if isinstance(tag, str) else tag
    if not isinstance(given, Mapping) or given.get("type", "structural_tag") != "structural_tag":
        raise ValueError('a structural tag is an object of "type": "structural_tag"')
    if "format" in given:
        return json.dumps(given)
    structures, triggers = given.get("structures"), given.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise ValueError('a structural tag has a "format", or "structures" and "triggers" (the older form)')
    tags = []
    for index, structure in enumerate(structures):
        if not isinstance(structure, Mapping) or not {"begin", "schema", "end"} <= structure.keys():
            raise ValueError(f'structures[{index}]: an object of "begin", "schema" and "end"')
        schema = structure["schema"]
        content = {
            "type": "json_schema",
            "json_schema": json.loads(schema) if isinstance(schema, str) else schema,
        }
        tags.append({"type": "tag", "begin": structure["begin"], "content": content, "end": structure["end"]})
    triggered = {"type": "triggered_tags", "triggers": triggers, "tags": tags}
    return json.dumps({"type": "structural_tag", "format": triggered})


def schemas(source: str) -> Iterator[Any]:
    """The JSON schemas a structural tag's JSON text holds, wherever its formats nest them."""
    stack: list[Any] = [json.loads(source)]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            held = node.get("type") == "json_schema" and "json_schema" in node
            if held:
                yield node["json_schema"]
            stack.extend(
                value
                for key, value in node.items()
                if isinstance(value, (Mapping, list)) and not (held and key == "json_schema")
            )
        elif isinstance(node, list):
            stack.extend(node)
