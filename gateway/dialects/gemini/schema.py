"""OpenAI's JSON Schema (tool ``parameters``, ``response_format`` schemas) as Gemini takes it.

Gemini accepts JSON Schema itself in ``parametersJsonSchema`` (function declarations) and
``responseJsonSchema`` (structured output), both on the Gemini API and on Vertex AI, but
only a subset of its keywords: ``$id $defs $ref $anchor type format title description
enum items prefixItems minItems maxItems minimum maximum anyOf oneOf properties
additionalProperties required`` and Google's own ``propertyOrdering``. So a schema is
copied with:

- ``const: x`` written as ``enum: [x]`` (the same constraint in a supported keyword);
- every other keyword dropped (``$schema``, ``pattern``, ``minLength``, ``default``,
  ``strict`` ...): a constraint the model is not held to, rather than a request refused;
- ``propertyOrdering`` added to each object with ``properties``, in the order the schema
  declares them, unless the schema gives one: structured output then generates the keys in
  the declared order, as OpenAI's does (a reasoning field before its answer stays before).

Property names (the keys of ``properties``, ``$defs``) are names, never keywords: they are
kept whatever they are called. The input is never changed.
"""

from __future__ import annotations

from typing import Any

SUPPORTED = frozenset(
    {
        "$id",
        "$defs",
        "$ref",
        "$anchor",
        "type",
        "format",
        "title",
        "description",
        "enum",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "anyOf",
        "oneOf",
        "properties",
        "additionalProperties",
        "required",
        "propertyOrdering",
    }
)
"""The JSON Schema keywords Gemini documents for ``responseJsonSchema``/``parametersJsonSchema``."""

_NAMED = frozenset({"properties", "$defs"})
"""Keywords whose value maps names to schemas."""

_LISTS = frozenset({"anyOf", "oneOf", "prefixItems"})
"""Keywords whose value is a list of schemas."""


def gemini_schema(schema: Any) -> Any:
    """A copy of JSON ``schema`` in the subset Gemini accepts (see the module docstring)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "const" and "enum" not in schema:
            out["enum"] = [value]
        elif key not in SUPPORTED:
            continue
        elif key in _NAMED and isinstance(value, dict):
            out[key] = {name: gemini_schema(sub) for name, sub in value.items()}
        elif key in _LISTS and isinstance(value, list):
            out[key] = [gemini_schema(sub) for sub in value]
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = gemini_schema(value)
        else:
            out[key] = value
    properties = out.get("properties")
    if isinstance(properties, dict) and len(properties) > 1 and "propertyOrdering" not in out:
        out["propertyOrdering"] = list(properties)
    return out
