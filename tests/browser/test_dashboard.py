"""``GET /dashboard`` in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium; no browser is downloaded): after real traffic every figure on the page
is the API's, formatted, and the page refreshes itself. A screenshot is kept in the test's
output folder."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers import GatewayProcess, SimServer
from tests.integration.telemetry.test_dashboard_api import priced_policy, send_traffic

NONE = "\N{EN DASH}"  # what the page shows for a figure without samples
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run does)",
)


@pytest.fixture()
def browser() -> Iterator[Any]:
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not fetch a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1300"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def api(gw: GatewayProcess) -> Any:
    with urllib.request.urlopen(f"{gw.url}/admin/dashboard?since=1h", timeout=5) as resp:
        return json.loads(resp.read())


def lookup(data: Any, path: str) -> Any:
    for part in path.split("/"):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def formatted(value: Any, fmt: str, path: str) -> str:
    """The page's formatting (FORMATS in index.html)."""
    if value is None and fmt in ("int", "pct"):
        return NONE
    if fmt == "int":
        return str(value)
    if fmt == "ms":
        return NONE if value is None else f"{value:.1f}"
    if fmt == "pct":
        return f"{value * 100:.1f}%"
    if fmt == "usd":
        return f"${value:.6f}"
    if path.endswith("breaking_segment"):
        return NONE if value is None else f"#{value['index']} {value['segment']}: {value['preview']}"
    return NONE if value is None else str(value)


def shown(driver: Any) -> dict[str, tuple[str, str]]:
    """Every figure on the page, read in one script run (the page re-renders as it refreshes)."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('[data-k]'))"
        ".map(e => [e.dataset.k, e.dataset.f, e.textContent])"
    )
    return {k: (f, text) for k, f, text in rows}


def chart_lines(driver: Any, chart: str) -> dict[str, list[float]]:
    """The values of every point drawn in one chart, by line (the page's SVG circles)."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll(`svg[data-chart='${arguments[0]}'] circle`))"
        ".map(e => [e.dataset.line, Number(e.dataset.v)])",
        chart,
    )
    lines: dict[str, list[float]] = {}
    for line, value in rows:
        lines.setdefault(line, []).append(value)
    return lines


def chart_sum(driver: Any, chart: str, line: str) -> float:
    return sum(chart_lines(driver, chart).get(line, []))


def wait_for(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_dashboard_shows_the_api_figures_and_refreshes(
    make_gateway: Any, sim: SimServer, browser: Any, output_dir: Path
) -> None:
    from selenium.webdriver.support.ui import Select

    sim.reset()
    gw = make_gateway(priced_policy(sim))
    send_traffic(gw, sim)
    time.sleep(0.5)
    browser.get(gw.url + "/dashboard")
    Select(browser.find_element("id", "every")).select_by_value("2")
    wait_for(lambda: "deployments/sim-fast/requests" in shown(browser))
    data = api(gw)
    figures = shown(browser)
    mismatches = [
        (path, text, formatted(lookup(data, path), fmt, path))
        for path, (fmt, text) in figures.items()
        if text != formatted(lookup(data, path), fmt, path)
    ]
    assert not mismatches, mismatches
    # Every section is there: both deployments with their latencies, the mix, keys, the cache.
    for path in (
        "deployments/sim-fast/e2e_ms/p95",
        "deployments/sim-strong/ttft_ms/p95",
        "deployments/sim-strong/itl_ms/p50",
        "deployments/sim-fast/retry_rate",
        "tiers/fast/share",
        "tiers/strong/share",
        "cache/totals/hit_rate",
        "totals/cost_usd",
    ):
        assert path in figures, path
    assert figures["deployments/sim-fast/requests"][1] == "5"
    assert figures["tiers/fast/share"][1] == "55.6%"
    assert figures["deployments/sim-fast/retry_rate"][1] == "20.0%"
    assert sum(1 for p in figures if p.startswith("keys/")) == 3 * 6  # alpha: 2 models, beta: 1
    breaking = [text for p, (_, text) in figures.items() if p.endswith("breaking_segment") and text != NONE]
    assert breaking and breaking[0].startswith("#")
    # The charts draw the same traffic: every point is a circle carrying the API's value.
    assert chart_sum(browser, "requests", "requests") == 9
    assert chart_sum(browser, "tiers", "fast") == 5 and chart_sum(browser, "tiers", "strong") == 4
    assert chart_sum(browser, "cost", "cost") == pytest.approx(data["totals"]["cost_usd"])
    e2e_lines = chart_lines(browser, "e2e_ms")
    assert {"sim-fast p50", "sim-fast p95", "sim-strong p50", "sim-strong p95"} <= set(e2e_lines)
    assert max(e2e_lines["sim-fast p95"]) == max(
        v for v in data["series"]["deployments"]["sim-fast"]["e2e_ms"]["p95"] if v is not None
    )
    assert len(chart_lines(browser, "ttft_ms")["sim-strong p50"]) == 1  # the one stream
    assert set(chart_lines(browser, "cache")) == {"reported", "expected"}
    browser.save_screenshot(str(output_dir / "dashboard.png"))

    # Live: new traffic shows up without reloading the page.
    client = openai.OpenAI(base_url=gw.base_url, api_key="sk-alpha", max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "again"}])
    wait_for(lambda: shown(browser)["deployments/sim-fast/requests"][1] == "7")
    assert shown(browser)["totals/requests"][1] == "11"
    wait_for(lambda: chart_sum(browser, "requests", "requests") == 11)
    # A request refused before any deployment counts too, by its error code.
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    wait_for(lambda: shown(browser).get("totals/errors_by_code/model_not_found", ("", ""))[1] == "1")
    assert shown(browser)["totals/requests"][1] == "12"
    assert shown(browser)["deployments/sim-fast/requests"][1] == "7"
