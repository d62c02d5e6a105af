"""Canonical JSON for tools and response schemas: one byte form per meaning, and no order
the model reads as an instruction changed.

Key order inside a JSON Schema is not all alike. The order of ``properties`` is the order
Structured Outputs generate the keys in (``[steps, final_answer]`` reasons before it
answers), and the order a model reads a tool's parameters in; arrays (``required``,
``enum``, ``items`` lists, ``anyOf``) are ordered by the client. Those keep their order.
What is canonical is the order of a schema node's keywords (``type``, ``description``,
``properties``, ``required`` …) and of the wrapper objects around a schema (a tool's
``type``/``function``/``name``/``parameters``; ``response_format``'s ``json_schema``), which a
client's serializer may emit in any order without meaning anything by it. Literal values
(``enum``, ``const``, ``default``, ``examples``) keep their bytes.
"""

from __future__ import annotations

from typing import Any

# Keywords whose value maps names to schemas, in an order that means something.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keywords whose value is data, not schema: kept as they are.
_LITERALS = frozenset({"enum", "const", "default", "examples", "example"})
# Where a schema sits inside a tool or a response format.
_SCHEMA_KEYS = frozenset({"parameters", "input_schema", "schema"})


def canonical_schema(node: Any) -> Any:
    """A JSON Schema node with its keywords sorted; named schemas and arrays keep their order."""
    if isinstance(node, list):
        return [canonical_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key in sorted(node):
        value = node[key]
        if key in _LITERALS:
            out[key] = value
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: canonical_schema(schema) for name, schema in value.items()}
        else:
            out[key] = canonical_schema(value)
    return out


def canonical_wrapper(obj: Any) -> Any:
    """A tool or a ``response_format``: wrapper keys sorted, the schema inside canonical by
    :func:`canonical_schema`, anything else inside kept as it is."""
    if not isinstance(obj, dict):
        return obj
    out: dict[str, Any] = {}
    for key in sorted(obj):
        value = obj[key]
        if key in _SCHEMA_KEYS:
            out[key] = canonical_schema(value)
        elif key in ("function", "json_schema") and isinstance(value, dict):
            out[key] = canonical_wrapper(value)
        else:
            out[key] = value
    return out
