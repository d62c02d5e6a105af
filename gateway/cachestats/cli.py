"""``switchyard stats``: the cache-hit report of a running gateway (its ``GET /admin/stats``)."""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stats",
        help="cache-hit rates of a running gateway, per deployment, key and template",
        description="Print prompt tokens, cached tokens, hit rate (reported by the provider and "
        "expected by the gateway) and the estimated saving, per deployment, key and template; "
        "templates under 30%% hit rate are flagged with the segment that broke the cache.",
    )
    p.add_argument("--since", default="1h", help="window: 90s, 15m, 1h, 2d (default 1h, at most 48h)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (as /admin/stats gives it)")
    p.add_argument(
        "--url",
        default=os.environ.get("SWITCHYARD_URL", "http://127.0.0.1:8080"),
        help="the gateway (SWITCHYARD_URL, default http://127.0.0.1:8080)",
    )
    p.set_defaults(func=_cmd_stats)


def fetch_report(url: str, since: str, admin_key: str | None) -> dict[str, Any]:
    """GET /admin/stats; raises ``RuntimeError`` with the gateway's own message on an error."""
    query = urllib.parse.urlencode({"since": since})
    request = urllib.request.Request(f"{url.rstrip('/')}/admin/stats?{query}")
    if admin_key:
        request.add_header("Authorization", f"Bearer {admin_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            report: dict[str, Any] = orjson.loads(resp.read())
            return report
    except urllib.error.HTTPError as exc:
        try:
            error = orjson.loads(exc.read())["error"]
            message = str(error["message"])
            if error.get("param"):
                message = f"{error['param']}: {message}"
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = exc.reason
        raise RuntimeError(f"{url} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RuntimeError(f"cannot reach the gateway at {url}: {reason}") from None


def _cmd_stats(args: argparse.Namespace) -> int:
    try:
        report = fetch_report(args.url, args.since, os.environ.get("SWITCHYARD_ADMIN_KEY"))
    except RuntimeError as exc:
        print(f"switchyard stats: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(render(report))
    return 0


_COLUMNS = ("requests", "prompt_tokens", "cached_tokens", "hit_rate", "expected_hit_rate", "saved_usd")
_HEADINGS = ("requests", "prompt tok", "cached tok", "hit", "expected", "saved $")


_RC_COLUMNS = (
    "rc_hits",
    "rc_misses",
    "rc_stores",
    "rc_bypass",
    "rc_hit_rate",
    "rc_saved_tokens",
    "rc_saved_usd",
)
_RC_HEADINGS = ("hits", "misses", "stores", "bypass", "hit", "saved tok", "saved $")


def _cells(row: dict[str, Any], columns: tuple[str, ...] = _COLUMNS) -> list[str]:
    cells = []
    for column in columns:
        value = row.get(column, 0)
        if column.endswith("hit_rate"):
            cells.append(f"{100 * value:.1f}%")
        elif column.endswith("saved_usd"):
            cells.append(f"{value:.4f}")
        else:
            cells.append(f"{value:,}")
    return cells


def _table(
    title: str,
    rows: list[tuple[str, dict[str, Any]]],
    columns: tuple[str, ...] = _COLUMNS,
    headings: tuple[str, ...] = _HEADINGS,
) -> list[str]:
    body = [[name, *_cells(row, columns)] for name, row in rows]
    header = [title, *headings]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(header), *(line(r) for r in body), ""]


_MOVED_SHOWN = 20


def _moved_line(entry: dict[str, Any]) -> str:
    """One request's moves: ``req-1 sim-fast template 5e9b72f5: line -> tool (changes within ...)``."""
    moves = ", ".join(f"{kind} -> {to} ({why})" for kind, why, to in entry["moves"])
    return f"{entry['request_id']} {entry['deployment']} template {entry['template']}: {moves}"


def _response_cache(report: dict[str, Any]) -> list[str]:
    """The response cache's tables (hits answered from Redis, and what they saved), when used."""
    totals = report.get("totals", {})
    if not any(totals.get(c) for c in ("rc_hits", "rc_misses", "rc_stores", "rc_bypass")):
        return []
    lines = ["", "Response cache (answers served from Redis, billed nothing)", ""]
    for title, rows in (
        ("total", [("all", totals)]),
        ("deployment", sorted(report.get("deployments", {}).items())),
        ("key", sorted(report.get("keys", {}).items())),
        ("template", [(t["template"], t) for t in report.get("templates", [])]),
    ):
        used = [(name, row) for name, row in rows if any(row.get(c) for c in _RC_COLUMNS)]
        lines += _table(title, used, _RC_COLUMNS, _RC_HEADINGS)
    return lines


def render(report: dict[str, Any]) -> str:
    """The report as plain-text tables, flagged templates last with their breaking segment."""
    since = report.get("since_s", 0)
    lines = [f"Cache hits over the last {since // 60} min", ""]
    lines += _table("total", [("all", report.get("totals", {}))])
    lines += _table("deployment", sorted(report.get("deployments", {}).items()))
    lines += _table("key", sorted(report.get("keys", {}).items()))
    templates = report.get("templates", [])
    lines += _table("template", [(t["template"] + (" !" if t.get("flagged") else ""), t) for t in templates])
    for t in templates:
        if not t.get("flagged"):
            continue
        segment = t.get("breaking_segment")
        where = (
            f"its requests first differ at {segment['segment']} ({segment['variants']} variants): "
            f"{segment['preview']!r}"
            if segment
            else "too few requests kept to tell where they differ"
        )
        lines.append(f"! template {t['template']}: hit rate {100 * t['hit_rate']:.1f}% < 30%; {where}")
    lines += _response_cache(report)
    moved = report.get("moved", [])
    if moved:
        lines += ["", f"What shaping moved (the last {len(moved)} shaped requests, newest first):"]
        lines += [_moved_line(m) for m in moved[:_MOVED_SHOWN]]
        if len(moved) > _MOVED_SHOWN:
            lines.append(f"... {len(moved) - _MOVED_SHOWN} more (--json has all)")
    writes = report.get("stats_writes", {})
    if writes.get("dropped") or writes.get("expectations_dropped"):
        lines.append(
            f"Redis writes dropped: {writes.get('dropped', 0)} counters, "
            f"{writes.get('expectations_dropped', 0)} expectations (Redis was down or slow)"
        )
    return "\n".join(lines).rstrip() + "\n"
