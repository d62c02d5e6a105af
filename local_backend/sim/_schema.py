"""Deterministic JSON values that conform to a JSON schema: the simulator's structured
output (``response_format`` ``json_schema``) and its tool-call arguments.

The subset covered is what OpenAI's structured outputs and tool schemas use, and what
pydantic emits for a model: ``type`` (one or a list), ``properties`` / ``required``
(every property, in schema order), ``additionalProperties``, ``items`` /
``prefixItems`` with ``minItems`` / ``maxItems`` / ``uniqueItems``, ``enum``, ``const``,
numeric bounds (``minimum``, ``maximum``, the exclusive ones, ``multipleOf``), string
lengths and the simple ``format`` values, ``$ref`` into ``$defs`` / ``definitions``
(recursion stops at :data:`MAX_DEPTH`), ``anyOf`` / ``oneOf`` (the first branch that is not
``null``) and ``allOf`` (merged). ``pattern`` is not honoured: a matching string would
need a regex generator.

The same schema and seed always give the same value, so answers stay cacheable and
reproducible; the seed comes from the prompt, as the plain text answers' does.
"""

from __future__ import annotations

import math
import uuid
import zlib
from typing import Any

from local_backend.sim._tokens import answer_text

MAX_DEPTH = 6
"""Below this many nested objects/arrays only what the schema requires is generated."""

_FORMATS = {
    "date-time": "2024-05-17T09:30:00Z",
    "date": "2024-05-17",
    "time": "09:30:00",
    "duration": "PT1H30M",
    "email": "keeper@example.com",
    "idn-email": "keeper@example.com",
    "hostname": "harbor.example.com",
    "idn-hostname": "harbor.example.com",
    "ipv4": "192.0.2.17",
    "ipv6": "2001:db8::17",
    "uri": "https://example.com/harbor",
    "iri": "https://example.com/harbor",
    "uri-reference": "/harbor/light",
    "iri-reference": "/harbor/light",
    "url": "https://example.com/harbor",
}
_TYPE_ORDER = ("object", "array", "string", "integer", "number", "boolean", "null")


def instance(schema: Any, seed: int) -> Any:
    """A value that validates against ``schema`` (the subset in the module docstring)."""
    return _Generator(schema if isinstance(schema, dict) else {}).value(schema, seed, 0)


_ANNOTATIONS = frozenset(
    {"type", "title", "description", "$schema", "$id", "$comment", "examples", "default"}
)


def is_free_form(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` is "any JSON object" (``{"type": "object"}`` and nothing that
    constrains it): the JSON-mode answer fits it as well as anything."""
    return schema.get("type", "object") == "object" and set(schema) <= _ANNOTATIONS


def _mix(seed: int, salt: str | int) -> int:
    return zlib.crc32(str(salt).encode(), seed & 0xFFFFFFFF)


class _Generator:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def resolve(self, schema: Any, seen: int = 0) -> dict[str, Any]:
        """``schema`` with its ``$ref`` followed and ``allOf`` merged."""
        if not isinstance(schema, dict):
            return {}
        out: dict[str, Any] = schema
        ref = out.get("$ref")
        if isinstance(ref, str) and seen < 64:
            rest = {k: v for k, v in out.items() if k != "$ref"}
            out = _merge(self.resolve(self._pointer(ref), seen + 1), rest)
        parts = out.get("allOf")
        if isinstance(parts, list) and parts:
            merged = {k: v for k, v in out.items() if k != "allOf"}
            for part in parts:
                merged = _merge(merged, self.resolve(part, seen + 1))
            out = merged
        return out

    def _pointer(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return {}  # a remote reference: anything goes
        node: Any = self.root
        for raw in ref[1:].split("/"):
            if not raw:
                continue
            key = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict):
                node = node.get(key, {})
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return {}
        return node

    def value(self, raw: Any, seed: int, depth: int) -> Any:
        schema = self.resolve(raw)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[seed % len(enum)]
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                rest = {k: v for k, v in schema.items() if k != key}
                return self.value(_merge(rest, self.resolve(self._branch(branches, depth))), seed, depth)
        kind = _type_of(schema, depth)
        if kind == "object":
            return self._object(schema, seed, depth)
        if kind == "array":
            return self._array(schema, seed, depth)
        if kind == "integer":
            return _integer(schema, seed)
        if kind == "number":
            return _number(schema, seed)
        if kind == "boolean":
            return seed % 2 == 0
        if kind == "null":
            return None
        return _string(schema, seed)

    def _branch(self, branches: list[Any], depth: int) -> Any:
        # The first branch that is not null; deep in a recursive schema, null if offered.
        resolved = [self.resolve(b) for b in branches]
        if depth >= MAX_DEPTH:
            for branch, schema in zip(branches, resolved, strict=True):
                if schema.get("type") == "null":
                    return branch
        for branch, schema in zip(branches, resolved, strict=True):
            if schema.get("type") != "null":
                return branch
        return branches[0]

    def _object(self, schema: dict[str, Any], seed: int, depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        names = list(properties) if depth < MAX_DEPTH else [n for n in properties if n in required]
        names += [r for r in required if r not in properties]
        out: dict[str, Any] = {}
        for name in names:
            sub = properties.get(name)
            if sub is None:
                extra = schema.get("additionalProperties")
                sub = extra if isinstance(extra, dict) else {}
            out[name] = self.value(sub, _mix(seed, name), depth + 1)
        low = schema.get("minProperties")
        extra = schema.get("additionalProperties", True)
        if isinstance(low, int) and extra is not False:
            sub = extra if isinstance(extra, dict) else {}
            i = 0
            while len(out) < low:
                out.setdefault(f"field_{i}", self.value(sub, _mix(seed, i), depth + 1))
                i += 1
        return out

    def _array(self, schema: dict[str, Any], seed: int, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", {})
        low = schema.get("minItems", 0)
        low = low if isinstance(low, int) and low > 0 else 0
        high = schema.get("maxItems")
        wanted = max(low, len(prefix)) if depth >= MAX_DEPTH else max(low, len(prefix), 1 + seed % 2)
        if isinstance(high, int):
            wanted = min(wanted, max(high, low))
        if items is False:
            wanted = min(wanted, len(prefix))
        unique = schema.get("uniqueItems") is True
        out: list[Any] = []
        attempt = 0
        while len(out) < wanted and attempt < wanted * 8 + 8:
            i = len(out)
            sub = prefix[i] if i < len(prefix) else (items if isinstance(items, dict) else {})
            item = self.value(sub, _mix(seed, f"{i}:{attempt}"), depth + 1)
            attempt += 1
            if unique and any(_same(item, seen) for seen in out):
                continue
            out.append(item)
        return out


def _same(a: Any, b: Any) -> bool:
    # JSON equality: 1 == 1.0 but True != 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Both schemas' constraints (``allOf``): properties and required joined, the rest from ``b``."""
    out = {**a, **b}
    if isinstance(a.get("properties"), dict) and isinstance(b.get("properties"), dict):
        out["properties"] = {**a["properties"], **b["properties"]}
    if isinstance(a.get("required"), list) and isinstance(b.get("required"), list):
        out["required"] = [*a["required"], *(r for r in b["required"] if r not in a["required"])]
    return out


def _type_of(schema: dict[str, Any], depth: int) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if isinstance(k, str)]
        if depth >= MAX_DEPTH and "null" in kinds:
            return "null"
        kinds = [k for k in kinds if k != "null"] or kinds
        kinds.sort(key=lambda k: _TYPE_ORDER.index(k) if k in _TYPE_ORDER else len(_TYPE_ORDER))
        kind = kinds[0] if kinds else None
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema or "minItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return "string"


def _string(schema: dict[str, Any], seed: int) -> str:
    fmt = schema.get("format")
    low = schema.get("minLength", 0)
    low = low if isinstance(low, int) and low > 0 else 0
    high = schema.get("maxLength")
    high = high if isinstance(high, int) and high >= low else None
    if fmt == "uuid":
        text = str(uuid.UUID(int=(seed * 0x9E3779B97F4A7C15) % (1 << 128), version=4))
    elif isinstance(fmt, str) and fmt in _FORMATS:
        text = _FORMATS[fmt]
    else:
        text = answer_text(seed, 12 + seed % 20).strip()
        if " " in text:
            text = text[: text.rfind(" ")]  # end on a whole word
    if len(text) < low:
        text += answer_text(_mix(seed, "pad"), low - len(text))
    if high is not None and len(text) > high:
        text = text[:high]
    return text


def _num(value: Any) -> float | None:
    """``value`` as a finite number, or None when it is not one."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _bounds(schema: dict[str, Any]) -> tuple[float | None, float | None, bool, bool]:
    """The lower and upper bounds, and whether each is exclusive."""
    low, high = _num(schema.get("minimum")), _num(schema.get("maximum"))
    low_open = high_open = False
    ex_low, ex_high = _num(schema.get("exclusiveMinimum")), _num(schema.get("exclusiveMaximum"))
    if ex_low is not None and (low is None or ex_low >= low):
        low, low_open = ex_low, True
    if ex_high is not None and (high is None or ex_high <= high):
        high, high_open = ex_high, True
    return low, high, low_open, high_open


def _integer_step(schema: dict[str, Any]) -> int | None:
    step = _num(schema.get("multipleOf"))
    return int(step) if step is not None and step >= 1 and step.is_integer() else None


def _integer(schema: dict[str, Any], seed: int) -> int:
    low, high, low_open, high_open = _bounds(schema)
    lo = None if low is None else (math.floor(low) + 1 if low_open else math.ceil(low))
    hi = None if high is None else (math.ceil(high) - 1 if high_open else math.floor(high))
    step = _integer_step(schema) or 1
    if lo is not None and hi is not None:
        start = lo + seed % (hi - lo + 1) if hi >= lo else lo
    elif lo is not None:
        start = lo + seed % 10
    elif hi is not None:
        start = hi - seed % 10
    else:
        start = seed % 100
    value = start - start % step  # a multiple of step, at or below start
    if lo is not None and value < lo:
        value += step
    if hi is not None and value > hi:
        value -= step
    return value


def _number(schema: dict[str, Any], seed: int) -> float | int:
    if _integer_step(schema) is not None:
        return _integer(schema, seed)
    low, high, low_open, high_open = _bounds(schema)
    step = _num(schema.get("multipleOf"))
    if step is not None and step > 0:
        # A fractional step: the smallest multiple at or above the lower bound (best
        # effort: float division makes "multiple of 0.1" fragile for any validator).
        k = max(1, math.ceil(low / step)) if low is not None else 1
        if low is not None and low_open and k * step <= low:
            k += 1
        return k * step if k != 1 else step
    frac = (seed % 1000) / 1000.0
    if low is not None and high is not None:
        value = low + (high - low) * (0.25 + frac / 2)  # strictly inside when low < high
        if (low_open and value <= low) or (high_open and value >= high):
            value = (low + high) / 2
        return round(value, 3) if high - low > 0.01 else value
    if low is not None:
        return round(low + 1.0 + frac * 10, 3)
    if high is not None:
        return round(high - 1.0 - frac * 10, 3)
    return round(frac * 100, 2)
