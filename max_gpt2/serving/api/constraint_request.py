"""What a request's text must be, as the request bodies spell it: OpenAI's `response_format`, vLLM's
`structured_outputs` and its older `guided_*` fields, llama-server's `json_schema` and `grammar`
(`Constrained`, a part of every completion and chat request). Which constraint they make, and its
checks: `max_gpt2.serving.api.constraint_fields`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`: the schema is enforced whether `strict` or not, as vLLM's."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: `text` (free), `json_object` (any object) or `json_schema`; vLLM's and
    MAX's `structural_tag` too, its `format` or vLLM's older `structures` and `triggers`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None
    structures: list[Any] | None = None
    triggers: list[str] | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one of a JSON schema, any JSON object, a regex, choices, a grammar, a
    structural tag. Its JSON's options either way ask for what is written anyway: no free whitespace and
    no properties beyond a schema's (either is allowed where they are false)."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False


class Constrained(BaseModel):
    """What the output must be (`max_gpt2.serving.api.requests`): OpenAI's, vLLM's and llama-server's."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    guided_json: dict[str, Any] | str | None = None  # vLLM's older names for `structured_outputs`' own
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
