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


KeyPath = tuple[str | int, ...]
"""A place inside a JSON value: the keys and list indices from its root."""


def kept_orders(obj: Any) -> list[tuple[KeyPath, tuple[str, ...]]]:
    """Where :func:`canonical_wrapper` keeps an object's key order in ``obj`` (the named
    schemas, the literals, a wrapper's other values): each such object's path and keys. Two
    values equal but for key order (the same JSON with sorted keys) have the same canonical
    form if these objects' keys come in the same order in both."""
    out: list[tuple[KeyPath, tuple[str, ...]]] = []
    _kept_wrapper(obj, (), out)
    return out


def _kept_wrapper(obj: Any, path: KeyPath, out: list[tuple[KeyPath, tuple[str, ...]]]) -> None:
    if not isinstance(obj, dict):
        _kept_all(obj, path, out)
        return
    for key, value in obj.items():
        if key in _SCHEMA_KEYS:
            _kept_schema(value, (*path, key), out)
        elif key in ("function", "json_schema") and isinstance(value, dict):
            _kept_wrapper(value, (*path, key), out)
        else:
            _kept_all(value, (*path, key), out)


def _kept_schema(node: Any, path: KeyPath, out: list[tuple[KeyPath, tuple[str, ...]]]) -> None:
    if type(node) is dict:
        for key, value in node.items():
            if type(value) is dict or type(value) is list:
                if key in _LITERALS:
                    _kept_all(value, (*path, key), out)
                elif key in _NAMED_SCHEMAS and type(value) is dict:
                    out.append(((*path, key), tuple(value)))
                    for name, schema in value.items():
                        _kept_schema(schema, (*path, key, name), out)
                else:
                    _kept_schema(value, (*path, key), out)
            elif isinstance(value, (dict, list, tuple)):
                _kept_all(value, (*path, key), out)  # kept as it is
    elif type(node) is list:
        for i, value in enumerate(node):
            _kept_schema(value, (*path, i), out)
    else:
        _kept_all(node, path, out)


def _kept_all(value: Any, path: KeyPath, out: list[tuple[KeyPath, tuple[str, ...]]]) -> None:
    """Every object in ``value`` keeps its order (a literal, copied as it is)."""
    if isinstance(value, dict):
        out.append((path, tuple(value)))
        for key, inner in value.items():
            _kept_all(inner, (*path, key), out)
    elif isinstance(value, (list, tuple)):
        for i, inner in enumerate(value):
            _kept_all(inner, (*path, i), out)
