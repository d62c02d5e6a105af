"""Tables and JSON for bench/overhead.sh (standard library only).

    report.py line RUNS_JSONL CLK_TCK
        one progress line for the last run in RUNS_JSONL
    report.py hold-line HOLD_JSONL
        one progress line for the last --hold run in HOLD_JSONL
    report.py report RUNS_JSONL META_JSON SANITY_JSONL [--hold HOLD_JSONL] --out FILE
                     [--baseline FILE] [--strict]
        the table, the held-streams table, the target checks, and FILE (JSON); exit 1 if any
        run had errors (with --strict also if a target was missed)

Each run is paired with the direct (and LiteLLM) run of the same round, mode and
concurrency; with several rounds the table shows the median over the rounds. The
targets are the ones in bench/README.md (one worker, this 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TARGETS = {
    "c1_added_p50_ms": 0.5,
    "c1_added_p99_ms": 2.0,
    "c64_rps_nonstream": 2000.0,
    "c64_rps_stream": 1000.0,
    "vs_litellm_rps": 20.0,
}

# Issue 20's targets for the fully featured gateway (`full` with --full, else `gateway`).
ISSUE20 = {
    "cpu_ms_nonstream": 0.30,
    "cpu_ms_stream": 0.35,
    "cpu_flat_pct": 15.0,
    "c1_added_p99_ms": 1.0,
    "rps_nonstream": 3000.0,
    "rps_stream": 2500.0,
    "hold_ttfb_p99_ms": 20.0,
    "full_over_pass_pct": 15.0,
}

# Issue 55's targets for the response cache (--cache): a hit's added p50 at c=1 against
# direct, hits' req/s over misses' (same concurrency), a miss's CPU over the cache off.
ISSUE55 = {
    "hit_c1_added_p50_ms": 0.3,
    "hit_over_miss_rps": 2.0,
    "miss_cpu_us_over_off": 30.0,
}

Run = dict[str, Any]
ByRun = dict[tuple[str, int], Run]  # a target's rows by (mode, concurrency)


def load_lines(path: str) -> list[Run]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# The Responses API modes run on the gateway only; their deltas are against the direct
# run of the chat mode that sends the same conversation upstream.
BASE_MODE = {"responses": "nonstream", "resp-stream": "stream"}


def derive(runs: list[Run], clk_tck: int) -> list[Run]:
    """Per-run numbers: CPU per request, machine load, and the deltas against direct."""
    by_key = {(r["target"], r["mode"], r["concurrency"], r.get("round", 1)): r for r in runs}
    out = []
    for r in runs:
        r = dict(r)
        w = r.get("wrk")
        ticks = r["cpu_ticks"]
        if w:
            n = max(1, w["requests"])
            r["cpu_ms_per_request"] = ticks["app"] * 1000.0 / clk_tck / n
            r["redis_cpu_ms_per_request"] = ticks["redis"] * 1000.0 / clk_tck / n
            r["nginx_cpu_ms_per_request"] = ticks["nginx"] * 1000.0 / clk_tck / n
        total = ticks.get("machine_total") or 0
        r["machine_busy_pct"] = 100.0 * ticks["machine_busy"] / total if total else None
        # CPU that none of the measured processes used (other users of the machine, kernel
        # work not charged to a process, this script): a noise indicator, +-5 % (tick sampling).
        ours = ticks["nginx"] + ticks["redis"] + r.get("wrk_cpu_ms", 0) * clk_tck / 1000.0
        if r["target"] != "direct":
            ours += ticks["app"]
        r["unaccounted_cpu_pct"] = 100.0 * (ticks["machine_busy"] - ours) / total if total else None
        key = (r["mode"], r["concurrency"], r.get("round", 1))
        direct = by_key.get(("direct", BASE_MODE.get(r["mode"], r["mode"]), *key[1:]))
        if r["target"] != "direct" and w and direct and direct.get("wrk"):
            d = direct["wrk"]
            r["added_p50_ms"] = w["latency_ms"]["p50"] - d["latency_ms"]["p50"]
            r["added_p99_ms"] = w["latency_ms"]["p99"] - d["latency_ms"]["p99"]
            r["rps_vs_direct"] = w["rps"] / d["rps"] if d["rps"] else None
        lite = by_key.get(("litellm", *key))
        if r["target"] not in ("direct", "litellm") and w and lite and lite.get("wrk") and lite["wrk"]["rps"]:
            r["rps_vs_litellm"] = w["rps"] / lite["wrk"]["rps"]
        out.append(r)
    return out


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: list[Run]) -> list[Run]:
    """One row per target, mode and concurrency: medians over the rounds, errors summed."""
    groups: dict[tuple[str, str, int], list[Run]] = {}
    for r in runs:
        groups.setdefault((r["target"], r["mode"], r["concurrency"]), []).append(r)
    rows = []
    for (target, mode, conc), members in groups.items():
        # A run in which not one request finished (LiteLLM at c=256 in a short run) has no result.
        done = [r for r in members if r.get("wrk") and r["wrk"]["requests"] > 0]
        row: Run = {
            "target": target,
            "mode": mode,
            "concurrency": conc,
            "rounds": len(members),
            "rounds_without_result": len(members) - len(done),
        }
        if done:
            rps = [r["wrk"]["rps"] for r in done]
            row["rps"] = statistics.median(rps)
            row["rps_spread_pct"] = 100.0 * (max(rps) - min(rps)) / row["rps"] if row["rps"] else None
            for name in ("p50", "p90", "p99", "max"):
                row[f"{name}_ms"] = _median([r["wrk"]["latency_ms"][name] for r in done])
            row["requests"] = sum(r["wrk"]["requests"] for r in done)
            row["errors"] = sum(r["wrk"]["errors"] for r in done)
            # The x-switchyard-cache header of every answer, counted by value (wrk/common.lua).
            if all("cache" in r["wrk"] for r in done):
                row["cache_headers"] = {
                    name: sum(r["wrk"]["cache"][name] for r in done) for name in done[0]["wrk"]["cache"]
                }
            for name in (
                "added_p50_ms",
                "added_p99_ms",
                "rps_vs_direct",
                "rps_vs_litellm",
                "cpu_ms_per_request",
                "redis_cpu_ms_per_request",
                "nginx_cpu_ms_per_request",
                "machine_busy_pct",
                "unaccounted_cpu_pct",
            ):
                value = _median([r.get(name) for r in done])
                if value is not None:
                    row[name] = value
        rows.append(row)
    return rows


NOISY_PCT = 10.0
"""A row whose runs saw more than this share of the machine busy with other work is marked."""


def _noisy(row: Run) -> bool:
    return (row.get("unaccounted_cpu_pct") or 0.0) > NOISY_PCT


def _clamp(value: float | None) -> float | None:
    return None if value is None else max(0.0, value)


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


COLUMNS = [
    ("target", 9, "<"),
    ("mode", 11, "<"),
    ("conc", 4, ">"),
    ("req/s", 8, ">"),
    ("spread", 6, ">"),
    ("p50 ms", 8, ">"),
    ("p99 ms", 8, ">"),
    ("+p50 ms", 8, ">"),
    ("+p99 ms", 8, ">"),
    ("/direct", 7, ">"),
    ("x litellm", 10, ">"),
    ("cpu ms/req", 10, ">"),
    ("box cpu", 7, ">"),
    ("other", 6, ">"),
    ("errors", 6, ">"),
]


def cells(row: Run) -> list[str]:
    if "rps" not in row:
        return [row["target"], row["mode"], str(row["concurrency"]), "no result", *["-"] * (len(COLUMNS) - 4)]
    cpu = row.get("nginx_cpu_ms_per_request") if row["target"] == "direct" else row.get("cpu_ms_per_request")
    return [
        row["target"],
        row["mode"],
        str(row["concurrency"]),
        fmt(row["rps"], ".0f"),
        fmt(row.get("rps_spread_pct"), ".0f", "%") if row["rounds"] > 1 else "-",
        fmt(row["p50_ms"], ".3f"),
        fmt(row["p99_ms"], ".3f"),
        fmt(row.get("added_p50_ms"), "+.3f"),
        fmt(row.get("added_p99_ms"), "+.3f"),
        fmt(row.get("rps_vs_direct"), ".3f"),
        fmt(row.get("rps_vs_litellm"), ".1f", "x"),
        fmt(cpu, ".3f"),
        fmt(row.get("machine_busy_pct"), ".0f", "%"),
        # Shown from 0: below it is accounting error (the machine's busy time is tick-sampled
        # and misses short bursts at c=1, the processes' own CPU time is not); raw in the JSON.
        fmt(_clamp(row.get("unaccounted_cpu_pct")), ".0f", "%" + ("!" if _noisy(row) else "")),
        str(row["errors"] + row["rounds_without_result"]),
    ]


def render(values: list[str]) -> str:
    return "  ".join(
        f"{v:{align}{width}}" for v, (_, width, align) in zip(values, COLUMNS, strict=True)
    ).rstrip()


def table(rows: list[Run]) -> str:
    lines = [render([name for name, _, _ in COLUMNS]), render(["-" * w for _, w, _ in COLUMNS])]
    last = None
    for row in rows:
        key = (row["mode"], row["concurrency"])
        if last is not None and key != last:
            lines.append("")
        last = key
        lines.append(render(cells(row)))
    return "\n".join(lines)


def markdown(rows: list[Run]) -> str:
    names = [name for name, _, _ in COLUMNS]
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join("---" for _ in names) + "|"]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def runs_of(rows: list[Run], target: str) -> ByRun:
    """``target``'s rows that have a result, by (mode, concurrency)."""
    return {(r["mode"], r["concurrency"]): r for r in rows if r["target"] == target and "rps" in r}


def cpu_pairs(mine: ByRun, other: ByRun) -> list[tuple[str, int, float, float]]:
    """(mode, concurrency, CPU ms per request of ``mine``, of ``other``) where both have one."""
    pairs = []
    for key, r in mine.items():
        theirs = other.get(key)
        if r.get("cpu_ms_per_request") is not None and theirs and theirs.get("cpu_ms_per_request"):
            pairs.append((key[0], key[1], r["cpu_ms_per_request"], theirs["cpu_ms_per_request"]))
    return pairs


class Checks(list[Run]):
    """Target checks: each a dict of the measured value, its limit and whether it is met."""

    def add(self, name: str, value: float | None, limit: float, at_most: bool) -> None:
        ok = value is not None and (value <= limit if at_most else value >= limit)
        self.append({"check": name, "value": value, "limit": limit, "at_most": at_most, "ok": ok})

    def show(self) -> None:
        """Print each check on a line: met or missed, the value and its limit."""
        for c in self:
            rel = "<=" if c["at_most"] else ">="
            value = "-" if c["value"] is None else f"{c['value']:.3f}"
            print(f"  [{'ok' if c['ok'] else 'MISS'}] {c['check']}: {value} ({rel} {c['limit']})")


def check_targets(rows: list[Run]) -> Checks:
    checks = Checks()

    gw = runs_of(rows, "gateway")
    for mode in ("nonstream", "stream"):
        r = gw.get((mode, 1))
        if r:
            checks.add(f"{mode} c=1 added p50 ms", r.get("added_p50_ms"), TARGETS["c1_added_p50_ms"], True)
            checks.add(f"{mode} c=1 added p99 ms", r.get("added_p99_ms"), TARGETS["c1_added_p99_ms"], True)
        r = gw.get((mode, 64))
        if r:
            checks.add(f"{mode} c=64 gateway req/s", r["rps"], TARGETS[f"c64_rps_{mode}"], False)
            if "rps_vs_litellm" in r:
                checks.add(
                    f"{mode} c=64 gateway/litellm req/s",
                    r["rps_vs_litellm"],
                    TARGETS["vs_litellm_rps"],
                    False,
                )
    errors = sum(r.get("errors", 0) + r["rounds_without_result"] for r in rows)
    checks.add("errors in all runs (plus runs without a result)", errors, 0, True)
    return checks


def cpu_above(rows: list[Run], target: str, below: str) -> list[str]:
    """What ``target`` spends a request above ``below``, per mode and concurrency: the CPU per
    request of the two side by side (same rounds, medians)."""
    return [
        f"  {mode:11} c={conc:<3} {1000 * (mine_ms - base_ms):+6.1f} us a request"
        f" ({100 * (mine_ms / base_ms - 1):+.1f} %): {base_ms:.3f} -> {mine_ms:.3f} ms"
        for mode, conc, mine_ms, base_ms in cpu_pairs(runs_of(rows, target), runs_of(rows, below))
    ]


def check_issue20(rows: list[Run], hold_rows: list[Run], minus: str = "") -> Checks:
    """Issue 20's targets, for the fully featured gateway (``full``, else ``gateway``).
    With ``minus`` (``--full-minus``) the gateway is not the pass-through: no comparison with it."""
    checks = Checks()

    name = "full" if any(r["target"] == "full" for r in rows) else "gateway"
    mine = runs_of(rows, name)
    passing = runs_of(rows, "gateway")
    for mode in ("nonstream", "stream"):
        cpus = {
            c: r["cpu_ms_per_request"]
            for (m, c), r in mine.items()
            if m == mode and "cpu_ms_per_request" in r
        }
        if not cpus:
            continue
        checks.add(f"{name} {mode} max cpu ms/req", max(cpus.values()), ISSUE20[f"cpu_ms_{mode}"], True)
        if len(cpus) > 1:
            flat = 100.0 * (max(cpus.values()) - min(cpus.values())) / min(cpus.values())
            checks.add(
                f"{name} {mode} cpu ms/req spread over c={sorted(cpus)} %",
                flat,
                ISSUE20["cpu_flat_pct"],
                True,
            )
        r1 = mine.get((mode, 1))
        if r1 and r1.get("added_p99_ms") is not None:
            checks.add(
                f"{name} {mode} c=1 added p99 ms", r1["added_p99_ms"], ISSUE20["c1_added_p99_ms"], True
            )
        for conc in (16, 64):
            r = mine.get((mode, conc))
            if r:
                checks.add(f"{name} {mode} c={conc} req/s", r["rps"], ISSUE20[f"rps_{mode}"], False)
        if name == "full" and not minus:
            over = [100.0 * (a / b - 1.0) for m, _, a, b in cpu_pairs(mine, passing) if m == mode]
            if over:
                checks.add(
                    f"full over pass-through {mode} cpu ms/req, median %",
                    statistics.median(over),
                    ISSUE20["full_over_pass_pct"],
                    True,
                )
    held = next((h for h in hold_rows if h["target"] == name and h.get("ttfb_p99_ms") is not None), None)
    if held:
        checks.add(
            f"{name} --hold {held['streams']}: TTFB p99 ms",
            held["ttfb_p99_ms"],
            ISSUE20["hold_ttfb_p99_ms"],
            True,
        )
        checks.add(
            f"{name} --hold {held['streams']}: streams not complete",
            held["streams"] - held["complete"],
            0,
            True,
        )
    return checks


def _cache_share(row: Run, outcome: str) -> float | None:
    """The share of ``row``'s answers whose x-switchyard-cache header was ``outcome``."""
    counts = row.get("cache_headers")
    total = sum(counts.values()) if counts else 0
    return counts.get(outcome, 0) / total if counts and total else None


def cache_rows(rows: list[Run]) -> list[Run]:
    """Per concurrency of the cache modes (--cache): the hit's added latency, hits' and
    misses' req/s, and what a miss costs over the same unique requests with the cache off
    (CPU of the gateway's worker(s), and of its embedded Redis apart)."""
    on, off = runs_of(rows, "cache"), runs_of(rows, "gateway")
    out = []
    for conc in sorted({c for (m, c) in on if m in ("cache-hit", "cache-miss")}):
        hit, miss = on.get(("cache-hit", conc)), on.get(("cache-miss", conc))
        base, hit_base = off.get(("cache-miss", conc)), off.get(("cache-hit", conc))
        row: Run = {"concurrency": conc}
        if hit:
            row["hit_rps"] = hit["rps"]
            row["hit_added_p50_ms"] = hit.get("added_p50_ms")
            row["hit_added_p99_ms"] = hit.get("added_p99_ms")
            row["hit_cpu_ms_per_request"] = hit.get("cpu_ms_per_request")
            row["hit_share"] = _cache_share(hit, "hit")
            mine = hit.get("cpu_ms_per_request")
            theirs = hit_base.get("cpu_ms_per_request") if hit_base else None
            if mine is not None and theirs is not None:
                row["hit_cpu_us_over_off"] = 1000.0 * (mine - theirs)
        if miss:
            row["miss_rps"] = miss["rps"]
            row["miss_added_p50_ms"] = miss.get("added_p50_ms")
            row["miss_cpu_ms_per_request"] = miss.get("cpu_ms_per_request")
            row["store_share"] = _cache_share(miss, "store")
        if hit and miss and miss["rps"]:
            row["hit_over_miss_rps"] = hit["rps"] / miss["rps"]
        if miss and base:
            row["off_rps"] = base["rps"]
            mine, theirs = miss.get("cpu_ms_per_request"), base.get("cpu_ms_per_request")
            if mine is not None and theirs is not None:
                row["miss_cpu_us_over_off"] = 1000.0 * (mine - theirs)
            mine, theirs = miss.get("redis_cpu_ms_per_request"), base.get("redis_cpu_ms_per_request")
            if mine is not None and theirs is not None:
                row["miss_redis_cpu_us_over_off"] = 1000.0 * (mine - theirs)
        out.append(row)
    return out


def check_issue55(crows: list[Run]) -> Checks:
    """Issue 55's targets, from :func:`cache_rows`."""
    checks = Checks()
    for row in crows:
        conc = row["concurrency"]
        if conc == 1 and "hit_rps" in row:
            checks.add(
                "cache hit c=1 added p50 ms",
                row.get("hit_added_p50_ms"),
                ISSUE55["hit_c1_added_p50_ms"],
                True,
            )
        if "hit_over_miss_rps" in row:
            checks.add(
                f"cache hits/misses req/s c={conc}",
                row["hit_over_miss_rps"],
                ISSUE55["hit_over_miss_rps"],
                False,
            )
        if "miss_cpu_us_over_off" in row:
            checks.add(
                f"cache miss cpu us/req over cache off c={conc}",
                row["miss_cpu_us_over_off"],
                ISSUE55["miss_cpu_us_over_off"],
                True,
            )
    return checks


def _pct(share: float | None) -> str:
    return fmt(None if share is None else 100 * share, ".0f", "%")


def cache_table(crows: list[Run]) -> str:
    """The cache modes' numbers, a line per concurrency."""
    head = (
        f"  {'conc':>4}  {'hit +p50':>8}  {'hit +p99':>8}  {'hit/s':>7}  {'miss/s':>7}  {'off/s':>7}"
        f"  {'hit/miss':>8}  {'hit cpu':>8}  {'miss cpu':>8}  {'redis':>6}  {'hits':>5}  {'stored':>6}"
    )
    lines = [head]
    for r in crows:
        share = [_pct(r.get(k)) for k in ("hit_share", "store_share")]
        lines.append(
            f"  {r['concurrency']:>4}  {fmt(r.get('hit_added_p50_ms'), '+.3f'):>8}"
            f"  {fmt(r.get('hit_added_p99_ms'), '+.3f'):>8}  {fmt(r.get('hit_rps'), '.0f'):>7}"
            f"  {fmt(r.get('miss_rps'), '.0f'):>7}  {fmt(r.get('off_rps'), '.0f'):>7}"
            f"  {fmt(r.get('hit_over_miss_rps'), '.2f', 'x'):>8}"
            f"  {fmt(r.get('hit_cpu_us_over_off'), '+.1f'):>8}"
            f"  {fmt(r.get('miss_cpu_us_over_off'), '+.1f'):>8}"
            f"  {fmt(r.get('miss_redis_cpu_us_over_off'), '+.1f'):>6}  {share[0]:>5}  {share[1]:>6}"
        )
    return "\n".join(lines)


def summarize_hold(holds: list[Run]) -> list[Run]:
    """One row per target: medians over the rounds of bench/hold.py's results."""
    groups: dict[str, list[Run]] = {}
    for h in holds:
        groups.setdefault(h["target"], []).append(h)
    rows = []
    for target, members in groups.items():
        done = [h["hold"] for h in members if h.get("hold")]
        row: Run = {
            "target": target,
            "rounds": len(members),
            "rounds_without_result": len(members) - len(done),
        }
        if done:
            row["streams"] = done[0]["streams"]
            row["ramp_s"] = done[0]["ramp_s"]
            row["complete"] = min(d["complete"] for d in done)
            row["errors"] = sum(d["errors"] for d in done)
            row["open_peak"] = min(d["open_peak"] for d in done)
            for name in ("p50", "p99", "max"):
                row[f"ttfb_{name}_ms"] = _median([d["ttfb_ms"][name] for d in done])
            row["stream_p50_ms"] = _median([d["stream_ms"]["p50"] for d in done])
            groups_of = [d.get("groups") or [{}] for d in done]
            row["rss_peak_kb"] = _median([g[0].get("rss_peak_kb") for g in groups_of])
            row["processes"] = groups_of[0][0].get("processes_at_peak")
            cpu = [
                g[0]["cpu_ms"] / d["streams"]
                for g, d in zip(groups_of, done, strict=True)
                if "cpu_ms" in g[0]
            ]
            row["cpu_ms_per_stream"] = _median(list(cpu))
        rows.append(row)
    return rows


HOLD_COLUMNS = [
    ("target", 9, "<"),
    ("streams", 7, ">"),
    ("complete", 8, ">"),
    ("open peak", 9, ">"),
    ("TTFB p50", 9, ">"),
    ("TTFB p99", 9, ">"),
    ("TTFB max", 9, ">"),
    ("stream p50", 10, ">"),
    ("peak RSS MB", 11, ">"),
    ("cpu ms/stream", 13, ">"),
    ("errors", 6, ">"),
]


def hold_cells(row: Run) -> list[str]:
    if "streams" not in row:
        return [row["target"], "no result", *["-"] * (len(HOLD_COLUMNS) - 2)]
    rss = row.get("rss_peak_kb")
    return [
        row["target"],
        str(row["streams"]),
        str(row["complete"]),
        str(row["open_peak"]),
        fmt(row.get("ttfb_p50_ms"), ".1f"),
        fmt(row.get("ttfb_p99_ms"), ".1f"),
        fmt(row.get("ttfb_max_ms"), ".1f"),
        fmt(row.get("stream_p50_ms"), ".0f"),
        "-" if rss is None else f"{rss / 1024:.1f}",
        fmt(row.get("cpu_ms_per_stream"), ".2f"),
        str(row["errors"] + row["rounds_without_result"]),
    ]


def hold_table(rows: list[Run], markdown_out: bool = False) -> str:
    names = [name for name, _, _ in HOLD_COLUMNS]
    if markdown_out:
        lines = ["| " + " | ".join(names) + " |", "|" + "|".join("---" for _ in names) + "|"]
        return "\n".join(lines + ["| " + " | ".join(hold_cells(r)) + " |" for r in rows])

    def line(values: list[str]) -> str:
        return "  ".join(f"{v:{a}{w}}" for v, (_, w, a) in zip(values, HOLD_COLUMNS, strict=True)).rstrip()

    return "\n".join(
        [line(names), line(["-" * w for _, w, _ in HOLD_COLUMNS]), *(line(hold_cells(r)) for r in rows)]
    )


def compare_baseline(rows: list[Run], baseline_path: str) -> list[Run]:
    base = json.loads(Path(baseline_path).read_text())
    base_gw = {key: r["rps"] for key, r in runs_of(base["summary"], "gateway").items()}
    out = []
    for r in rows:
        b = base_gw.get((r["mode"], r["concurrency"]))
        if r["target"] == "gateway" and "rps" in r and b:
            out.append(
                {
                    "mode": r["mode"],
                    "concurrency": r["concurrency"],
                    "rps": r["rps"],
                    "baseline_rps": b,
                    "ratio": r["rps"] / b,
                }
            )
    return out


def cmd_line(args: argparse.Namespace) -> int:
    runs = derive(load_lines(args.runs), args.clk_tck)
    if not runs:
        return 0
    r = runs[-1]
    head = f"{r['target']:8} {r['mode']:11} c={r['concurrency']:<3}"
    w = r.get("wrk")
    if not w:
        print(f" {head} no result")
        return 0
    extra = ""
    if "added_p50_ms" in r:
        extra = f"  added p50 {r['added_p50_ms']:+.3f} p99 {r['added_p99_ms']:+.3f}"
    if r["target"] != "direct":
        extra += f"  cpu {r['cpu_ms_per_request']:.3f} ms/req"
    print(
        f" {head} {w['rps']:8.0f} req/s  p50 {w['latency_ms']['p50']:7.3f}"
        f"  p99 {w['latency_ms']['p99']:8.3f} ms  errors {w['errors']}{extra}"
    )
    return 0


def cmd_hold_line(args: argparse.Namespace) -> int:
    holds = load_lines(args.hold)
    if not holds:
        return 0
    h = holds[-1]
    d = h.get("hold")
    if not d:
        print(f"  hold {h['target']:8} no result")
        return 0
    group = (d.get("groups") or [{}])[0]
    rss = group.get("rss_peak_kb")
    print(
        f"  hold {h['target']:8} {d['complete']}/{d['streams']} complete, {d['open_peak']} open at peak,"
        f" TTFB p50 {d['ttfb_ms']['p50'] or 0:.1f} p99 {d['ttfb_ms']['p99'] or 0:.1f} ms,"
        f" peak RSS {(rss or 0) / 1024:.1f} MB, errors {d['errors']}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    meta = json.loads(Path(args.meta).read_text())
    s = meta["settings"]
    runs = derive(load_lines(args.runs), s["clk_tck"])
    rows = summarize(runs)
    sanity = load_lines(args.sanity)
    holds = load_lines(args.hold) if args.hold and Path(args.hold).exists() else []
    hold_rows = summarize_hold(holds)
    checks = check_targets(rows)
    minus = s.get("full_minus") or ""
    issue20 = check_issue20(rows, hold_rows, minus)
    crows = cache_rows(rows)
    issue55 = check_issue55(crows)
    rss = meta["rss_after_kb"]
    rounds = f", median of {s['repeat']} rounds" if s.get("repeat", 1) > 1 else ""
    v = meta.get("versions", {})
    rev = v.get("switchyard_git", "?") + ("+uncommitted" if v.get("switchyard_git_dirty") else "")
    print()
    print(
        f"Switchyard overhead, {meta['timestamp_utc']}, {meta['host']['nproc']} cores "
        f"({meta['host']['cpu_model']}), switchyard {rev}, workers={s['workers']},"
        f" {s['duration_s']}s per run{rounds}"
    )
    if minus:
        print(f"gateway: the full policy without {minus} (--full-minus {minus}), next to full")
    print()
    print(table(rows))
    print()
    print(
        "  +p50/+p99: minus direct (same round); /direct, x litellm: req/s ratios; spread: (max-min)/median"
    )
    print(
        "  of req/s over the rounds. cpu ms/req: user+system CPU of the target's processes (nginx for direct;"
    )
    print("  the gateway without its embedded Redis) / requests. box cpu: all cores busy during the run;")
    print("  other: the part not used by nginx, the target, its Redis or wrk (other load = noise);")
    print(f"  '!': more than {NOISY_PCT:.0f} % of the machine went to other work during that row's runs.")
    print()
    line = (
        f"RSS after the runs: gateway {rss['gateway'] / 1024:.1f} MB"
        f" in {rss['gateway_processes']} process(es)"
        f" (+ embedded Redis {rss['gateway_embedded_redis'] / 1024:.1f} MB)"
    )
    for key, name in (("full", "full"), ("portkey", "Portkey"), ("litellm", "LiteLLM")):
        if rss.get(key):
            line += f"; {name} {rss[key] / 1024:.1f} MB in {rss[f'{key}_processes']} process(es)"
    print(line)
    print(f"Load average before the run: {meta.get('load_average_before', '?')}")
    for key, name in (("litellm_status", "LiteLLM"), ("portkey_status", "Portkey")):
        if meta.get(key) not in (None, "", "ok", "not requested"):
            print(f"{name}: {meta[key]}")
    if meta.get("gateway_warning"):
        print(f"WARNING: gateway: {meta['gateway_warning']}")
    for san in sanity:
        if san["mode"] == "stream":
            print(
                f"stream check {san['target']:9}: {san['bytes']} bytes, {san['sse_events']} data lines, "
                f"{san['usage_chunks']} usage chunk(s), complete={san['complete']}"
            )
    if hold_rows:
        print()
        print(
            f"Held streams (--hold): {hold_rows[0].get('streams', '?')} paced SSE streams opened over"
            f" {hold_rows[0].get('ramp_s', '?')} s, ~5 s each; medians over the rounds"
            " (complete, open peak: the least)"
        )
        print()
        print(hold_table(hold_rows))
        print("  TTFB: request sent -> first body bytes, ms; peak RSS: the target's processes (no Redis)")
    if minus:
        print()
        print(f"What {minus} costs (full against gateway, which runs without it; CPU per request):")
        print("\n".join(cpu_above(rows, "full", "gateway")))
    if any(r["target"] == "floor" for r in rows):
        print()
        print("Above the floor (--floor; CPU per request, same rounds):")
        for target, below, what in (
            ("floor", "floor-raw", "aiohttp's server, over a bare asyncio Protocol"),
            ("gateway", "floor", "the gateway's own work, over the least an aiohttp hop does"),
            ("full", "floor", "full's own work, over the least an aiohttp hop does"),
        ):
            lines = cpu_above(rows, target, below)
            if lines:
                print(f" {target} - {below}: {what}")
                print("\n".join(lines))
    if crows:
        print()
        print("Response cache (--cache; deterministic requests; cache-hit: one body, cache-miss: each new):")
        print(cache_table(crows))
        print("  hit +p50/+p99: the cache gateway's hits minus direct (ms); hit/s, miss/s: its req/s;")
        print(
            "  off/s: the cache-off gateway on the same unique bodies; hit cpu, miss cpu: a hit's (a miss's)"
        )
        print("  CPU over the cache-off gateway on the same bodies, us a request (the gateway's worker(s));")
        print("  redis: a miss's over the cache off in the gateway's embedded Redis;")
        print("  hits, stored: the share of answers whose x-switchyard-cache said hit, store.")
    print()
    print("Targets (set for one worker):" if s["workers"] != 1 else "Targets:")
    checks.show()
    if issue20:
        print()
        print("Issue 20's targets:")
        issue20.show()
    if issue55:
        print()
        print("Issue 55's targets (the response cache):")
        issue55.show()
    comparison = None
    if args.baseline:
        comparison = compare_baseline(rows, args.baseline)
        print()
        print(f"Gateway req/s against {args.baseline}:")
        for c in comparison:
            print(
                f"  {c['mode']:11} c={c['concurrency']:<3} {c['rps']:8.0f}"
                f" vs {c['baseline_rps']:8.0f}  x{c['ratio']:.2f}"
            )
    result = {
        "meta": meta,
        "sanity": sanity,
        "summary": rows,
        "targets": checks,
        "issue20_targets": issue20,
        "cache_summary": crows,
        "issue55_targets": issue55,
        "hold_summary": hold_rows,
        "hold_runs": holds,
        "hold_markdown_table": hold_table(hold_rows, markdown_out=True) if hold_rows else "",
        "baseline_comparison": comparison,
        "runs": runs,
        "markdown_table": markdown(rows),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    errors = next(c for c in checks if c["check"].startswith("errors"))
    if not errors["ok"]:
        print("\nFAILED: some runs had errors (see errors_detail in the JSON and the wrk logs).")
        return 1
    if args.strict and not all(c["ok"] for c in checks + issue20 + issue55):
        print("\nFAILED (--strict): a target was missed.")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("line")
    p.add_argument("runs")
    p.add_argument("clk_tck", type=int)
    p.set_defaults(func=cmd_line)
    p = sub.add_parser("hold-line")
    p.add_argument("hold")
    p.set_defaults(func=cmd_hold_line)
    p = sub.add_parser("report")
    p.add_argument("runs")
    p.add_argument("meta")
    p.add_argument("sanity")
    p.add_argument("--out", required=True)
    p.add_argument("--baseline")
    p.add_argument("--hold", help="bench/hold.py results (JSON lines)")
    p.add_argument("--strict", action="store_true")
    p.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
