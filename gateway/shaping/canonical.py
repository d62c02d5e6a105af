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

import orjson

# Keywords whose value maps names to schemas, in an order that means something.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keywords whose value is data, not schema: kept as they are.
_LITERALS = frozenset({"enum", "const", "default", "examples", "example"})
# Where a schema sits inside a tool or a response format.
_SCHEMA_KEYS = frozenset({"parameters", "input_schema", "schema"})


def _copy(value: Any) -> Any:
    """A literal value, copied when it is a container (a canonical form shares no object that
    can change with the request it was made from)."""
    if type(value) is list or type(value) is dict:
        return orjson.loads(orjson.dumps(value))
    return value


def canonical_schema(node: Any) -> Any:
    """A JSON Schema node with its keywords sorted; named schemas and arrays keep their order.
    Made of new containers all through (strings and numbers shared): it is memoized and
    shared by the requests that carry the same tool. (One comprehension per node, scalars
    kept inline: a tool list in a new key order is rebuilt on its first request.)"""
    if type(node) is dict:
        return {
            key: value
            if type(value := node[key]) is not dict and type(value) is not list
            else _inner(key, value)
            for key in sorted(node)
        }
    if type(node) is list:
        return [v if type(v) is not dict and type(v) is not list else canonical_schema(v) for v in node]
    return node


def _inner(key: str, value: Any) -> Any:
    """A keyword's container value in canonical form (see :func:`canonical_schema`)."""
    if key in _LITERALS:
        return _copy(value)
    if key in _NAMED_SCHEMAS and type(value) is dict:
        return {name: canonical_schema(schema) for name, schema in value.items()}
    return canonical_schema(value)


def canonical_wrapper(obj: Any) -> Any:
    """A tool or a ``response_format``: wrapper keys sorted, the schema inside canonical by
    :func:`canonical_schema`, anything else inside kept as it is (copied)."""
    if not isinstance(obj, dict):
        return _copy(obj)
    out: dict[str, Any] = {}
    for key in sorted(obj):
        value = obj[key]
        if key in _SCHEMA_KEYS:
            out[key] = canonical_schema(value)
        elif key in ("function", "json_schema") and isinstance(value, dict):
            out[key] = canonical_wrapper(value)
        else:
            out[key] = _copy(value)
    return out
