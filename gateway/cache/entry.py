"""One cache entry's bytes: a JSON header line (who stored it, when, its usage and cost)
and then the answer's JSON exactly as a non-stream request got it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

VERSION = 1


class CorruptEntry(ValueError):
    """Bytes under a cache key that are not an entry (they are deleted, and count as a miss)."""


@dataclass(slots=True)
class Entry:
    """A stored answer and what the accounting needs of it."""

    kind: str
    body: bytes
    usage: dict[str, Any] | None
    deployment: str
    created_at: float
    key_id: str | None = None
    template: str | None = None
    cost_nano_usd: int = 0
    obj: dict[str, Any] | None = None
    """The answer parsed (set when read back: a hit's bytes are checked before they are sent)."""

    def encode(self) -> bytes:
        """The bytes stored in Redis."""
        head = {
            "v": VERSION,
            "kind": self.kind,
            "usage": self.usage,
            "deployment": self.deployment,
            "created_at": self.created_at,
            "key_id": self.key_id,
            "template": self.template,
            "cost_nano_usd": self.cost_nano_usd,
        }
        return orjson.dumps(head) + b"\n" + self.body

    def answer(self) -> dict[str, Any]:
        """The stored answer as an object (for a stream's replay)."""
        obj = self.obj if self.obj is not None else orjson.loads(self.body)
        if not isinstance(obj, dict):
            raise CorruptEntry("the answer is not a JSON object")
        return obj


def decode(data: bytes, kind: str) -> Entry:
    """The entry in ``data``; :class:`CorruptEntry` when it is not one of ``kind``."""
    head_bytes, sep, body = data.partition(b"\n")
    try:
        head = orjson.loads(head_bytes)
    except orjson.JSONDecodeError:
        raise CorruptEntry("the header is not JSON") from None
    if (
        not sep
        or not body
        or not isinstance(head, dict)
        or head.get("v") != VERSION
        or head.get("kind") != kind
        or not isinstance(head.get("deployment"), str)
    ):
        raise CorruptEntry("not an entry of this kind")
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CorruptEntry("the answer is not JSON") from None
    if not isinstance(obj, dict):
        raise CorruptEntry("the answer is not a JSON object")
    usage = head.get("usage")
    cost = head.get("cost_nano_usd")
    return Entry(
        kind=kind,
        body=body,
        usage=usage if isinstance(usage, dict) else None,
        deployment=head["deployment"],
        created_at=float(head.get("created_at") or 0),
        key_id=head.get("key_id") if isinstance(head.get("key_id"), str) else None,
        template=head.get("template") if isinstance(head.get("template"), str) else None,
        cost_nano_usd=cost if isinstance(cost, int) else 0,
        obj=obj,
    )
