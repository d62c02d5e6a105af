"""Every metric (and label) the Grafana dashboards query is one that is exported: ``switchyard_*``
by a real gateway after real traffic, ``vllm:*`` by the simulator (which uses vLLM's names)."""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
from typing import Any

import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import ROOT, SimServer

DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
# Labels Prometheus adds to every scraped series, and the histogram bucket bound.
SCRAPE_LABELS = {"instance", "job", "le"}
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:$.])([A-Za-z_:][A-Za-z0-9_:]*)(?![A-Za-z0-9_:]|\s*\()")


def parse_expr(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """The metric names an expression reads (each with the labels its selector matches on)
    and the labels it groups by."""
    metrics: dict[str, set[str]] = {}
    grouping: set[str] = set()
    for name, matchers in _SELECTOR.findall(expr):
        metrics.setdefault(name, set()).update(_MATCHER.findall(re.sub(r'"[^"]*"', '""', matchers)))
    for labels in _GROUPING.findall(expr):
        grouping.update(label.strip() for label in labels.split(",") if label.strip())
    bare = _GROUPING.sub(" ", expr)
    bare = re.sub(r"\{[^}]*\}", " ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)
    bare = re.sub(r'"[^"]*"', " ", bare)
    for name in _IDENT.findall(bare):
        if name.lower() not in PROMQL_WORDS:
            metrics.setdefault(name, set())
    return metrics, grouping


def test_parse_expr_finds_metrics_selector_labels_and_grouping() -> None:
    metrics, grouping = parse_expr(
        'histogram_quantile(0.95, sum by (le, deployment) (rate(a_bucket{tier!="", x=~"$d"}[5m]))) / b_total'
    )
    assert metrics == {"a_bucket": {"tier", "x"}, "b_total": set()}
    assert grouping == {"le", "deployment"}


def dashboard_queries() -> list[tuple[str, str]]:
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                out.append((f"{path.name}: {panel['title']}", target["expr"]))
        for variable in dashboard.get("templating", {}).get("list", []):
            query = variable.get("definition") or ""
            found = re.match(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*(\w+)\s*\)", query)
            if found:
                out.append((f"{path.name}: ${variable['name']}", f"{found[1]}{{{found[2]}!=''}}"))
    return out


def exported(url: str) -> dict[str, set[str]]:
    """Sample name -> label names, from a live ``/metrics``."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_every_metric_the_dashboards_query_is_exported(make_gateway: Any, sim: SimServer) -> None:
    sim.reset()
    gw = make_gateway(
        f"""
deployments:
  sim-fast: {{provider: vllm, base_url: "{sim.base_url}", price: {{input: 1.0, output: 2.0}}}}
  sim-strong: {{provider: vllm, base_url: "{sim.base_url}"}}
tiers:
  fast: [sim-fast]
  strong: [sim-strong]
dispatch:
  retries: {{max: 1, backoff: {{base_s: 0.01}}}}
  circuit: {{consecutive_failures: 1, cooldown_s: 30}}
"""
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "Hello there"}]
    for model in ("fast", "strong"):
        client.chat.completions.create(model=model, messages=messages)
        list(client.chat.completions.create(model=model, messages=messages, stream=True))
    # One failure opens sim-strong's circuit, so the transition counter has a series too.
    sim.set_fault("sim-strong", "error=500", count=2)
    with contextlib.suppress(openai.APIError):
        client.chat.completions.create(model="strong", messages=messages)
    sim.clear_faults()
    time.sleep(0.3)
    names = exported(gw.url) | exported(sim.url)
    queries = dashboard_queries()
    assert len(queries) >= 15
    assert any("switchyard_" in expr for _, expr in queries) and any("vllm:" in expr for _, expr in queries)
    problems = []
    for where, expr in queries:
        metrics, grouping = parse_expr(expr)
        assert metrics, f"{where}: no metric found in {expr!r}"
        available: set[str] = set(SCRAPE_LABELS)
        for metric, labels in metrics.items():
            if metric not in names:
                problems.append(f"{where}: {metric} is not exported")
                continue
            available |= names[metric]
            missing = labels - names[metric] - SCRAPE_LABELS
            if missing:
                problems.append(f"{where}: {metric} has no label(s) {sorted(missing)}")
        if grouping - available:
            problems.append(f"{where}: grouped by unknown label(s) {sorted(grouping - available)}")
    assert not problems, "\n".join(problems)
