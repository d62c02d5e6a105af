"""The files ``switchyard route ...`` reads: a policy, and JSONL of prompts with labels or
per-model quality.

A row is a request body (``{"messages": [...]}``) or a bare ``{"prompt": "..."}`` (read as
one user message), with either ``label`` (``fast`` | ``strong``) or per-model quality
``weak`` and ``strong`` (1/0 for right/wrong, or any score); ``bench``, ``domain`` and
``id`` are optional and group the report and the held-out folds.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import orjson

from gateway.config import EMBEDDED_POLICY, PolicyError, load_policy
from gateway.policy import Policy


def policy_from(path: str | None) -> Policy:
    """The policy at ``path``, else ``$SWITCHYARD_POLICY``, else the embedded one."""
    source = path or os.environ.get("SWITCHYARD_POLICY") or str(EMBEDDED_POLICY)
    try:
        return load_policy(source)
    except PolicyError as exc:
        raise SystemExit(f"{exc}") from None


def load_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a JSONL file, each with ``messages`` (built from ``prompt`` when absent)."""
    out = []
    for number, raw in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SystemExit(f"{path}:{number}: not JSON ({exc})") from None
        if isinstance(obj, dict) and "messages" not in obj and isinstance(obj.get("prompt"), str):
            obj["messages"] = [{"role": "user", "content": obj["prompt"]}]
        if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
            raise SystemExit(f"{path}:{number}: expected an object with 'messages' or 'prompt'")
        out.append(obj)
    return out


def body_of(row: dict[str, Any]) -> dict[str, Any]:
    """The request body in a row, asking for ``auto``."""
    return {**row, "model": "auto"}


def labels(rows: list[dict[str, Any]], path: str) -> list[int]:
    """Each row's label as 1 (strong) or 0 (fast)."""
    out = []
    for number, row in enumerate(rows, start=1):
        label = row.get("label")
        if label not in ("fast", "strong"):
            raise SystemExit(f"{path}: row {number}: label must be 'fast' or 'strong', not {label!r}")
        out.append(1 if label == "strong" else 0)
    return out


def require_gain(rows: list[dict[str, Any]], path: str) -> None:
    """Refuse a per-model quality file whose strong answers are judged no better than the weak
    ones: routing cannot buy quality there, APGR and PGR divide by a gain of zero or less (they
    come out negative or meaningless), and "keep the better policy" would pick the worse."""
    weak = sum(float(row["weak"]) for row in rows) / len(rows)
    strong = sum(float(row["strong"]) for row in rows) / len(rows)
    if strong <= weak:
        raise SystemExit(
            f"{path}: the strong answers are judged no better than the weak ones (mean quality "
            f"strong {strong:.3f}, weak {weak:.3f}, over {len(rows)} rows): routing cannot buy "
            "quality here, so no fit or comparison on this file means anything. Check the judge "
            "(routing.judge) and which deployments the tiers name, or grade more pairs."
        )


def holdout_of(row: dict[str, Any], share: float) -> bool:
    """Whether a row is held out of a fit (``route fit --holdout``): a stable hash of its ``id``
    (else its messages), so the same rows are held out at every run."""
    key = str(row.get("id")) if row.get("id") is not None else orjson.dumps(row.get("messages")).decode()
    return zlib.crc32(key.encode()) % 10_000 < share * 10_000


def write_rows(rows: list[dict[str, Any]], path: str) -> None:
    """Rows as JSONL."""
    Path(path).write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def has_quality(rows: list[dict[str, Any]]) -> bool:
    """Whether every row carries per-model quality (``weak`` and ``strong``)."""
    return bool(rows) and all(
        isinstance(row.get("weak"), int | float) and isinstance(row.get("strong"), int | float)
        for row in rows
    )
