"""``GET /admin/dashboard`` after known traffic: counts, mix, error and retry rates, cost, the
per-key view and the cache table, as a real gateway reports them from Redis."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from gateway.dashboard import bucket_of, bucket_value_ms, key_label, percentile_ms
from tests.helpers import GatewayProcess, SimServer, sim_policy


def test_buckets_are_ten_percent_wide_and_percentiles_are_within_five_percent() -> None:
    for ms in (0.05, 0.1, 0.37, 1.0, 12.5, 480.0, 90_000.0):
        index = bucket_of(ms)
        assert bucket_value_ms(index) == pytest.approx(ms, rel=0.05) or ms <= 0.1
    samples = [float(i) for i in range(1, 201)]  # 1..200 ms
    hist: dict[int, int] = {}
    for ms in samples:
        hist[bucket_of(ms)] = hist.get(bucket_of(ms), 0) + 1
    assert percentile_ms(hist, 0.5) == pytest.approx(100.0, rel=0.05)
    assert percentile_ms(hist, 0.95) == pytest.approx(190.0, rel=0.05)
    assert percentile_ms({}, 0.5) is None


def test_key_labels_are_stable_distinct_and_do_not_contain_the_key() -> None:
    a, b = key_label("Bearer sk-alpha-123"), key_label("Bearer sk-beta-456")
    assert a == key_label("Bearer sk-alpha-123") and a != b
    assert a is not None and a.startswith("key_") and "alpha" not in a
    assert key_label(None) is None and key_label("Basic abc") is None


def test_a_process_names_a_bounded_number_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.dashboard as dash

    monkeypatch.setattr(dash, "_labels", {})
    monkeypatch.setattr(dash, "MAX_KEYS", 2)
    first, second = key_label("Bearer one"), key_label("Bearer two")
    assert key_label("Bearer three") == key_label("Bearer four") == "key_other"
    assert key_label("Bearer one") == first and first != second


def dashboard(gw: GatewayProcess, since: str = "1h") -> Any:
    with urllib.request.urlopen(f"{gw.url}/admin/dashboard?since={since}", timeout=5) as resp:
        return json.loads(resp.read())


def send_traffic(gw: GatewayProcess, sim: SimServer) -> None:
    """Key alpha: 3 fast + 1 strong stream; key beta: 2 fast, one of them retried after a 500;
    3 requests of template 'support' whose system prompts differ (their cache breaker)."""
    alpha = openai.OpenAI(base_url=gw.base_url, api_key="sk-alpha", max_retries=0)
    beta = openai.OpenAI(base_url=gw.base_url, api_key="sk-beta", max_retries=0)
    hello = [{"role": "user", "content": "Hello there"}]
    for _ in range(3):
        alpha.chat.completions.create(model="fast", messages=hello)
    list(alpha.chat.completions.create(model="strong", messages=hello, stream=True))
    beta.chat.completions.create(model="fast", messages=hello)
    sim.set_fault("sim-fast", "error=500", count=1)
    beta.chat.completions.create(model="fast", messages=hello)
    for i in range(3):
        system = f"You are support agent number {i * 7919} of the night shift. Be brief and kind."
        alpha.chat.completions.create(
            model="strong",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "My order is late"}],
            extra_headers={"x-switchyard-template": "support"},
        )


DISPATCH = "dispatch:\n  retries: {max: 2, backoff: {base_s: 0.01}}\n"


def priced_policy(sim: SimServer) -> str:
    return f"""
deployments:
  sim-fast: {{provider: vllm, base_url: "{sim.base_url}", price: {{input: 1.0, output: 4.0}}}}
  sim-strong: {{provider: vllm, base_url: "{sim.base_url}"}}
tiers:
  fast: [sim-fast]
  strong: [sim-strong]
{DISPATCH}"""


def test_dashboard_api_reports_known_traffic(make_gateway: Any, sim: SimServer) -> None:
    sim.reset()
    gw = make_gateway(priced_policy(sim))
    send_traffic(gw, sim)
    time.sleep(0.5)  # stats reach Redis within ~100 ms
    d = dashboard(gw)
    fast, strong = d["deployments"]["sim-fast"], d["deployments"]["sim-strong"]
    assert fast["requests"] == 5 and strong["requests"] == 4
    assert fast["retries"] == 1 and fast["retry_rate"] == 0.2
    assert fast["errors"] == 0 and fast["error_rate"] == 0.0
    assert strong["ttft_ms"]["count"] == 1 and fast["ttft_ms"]["count"] == 0
    assert strong["itl_ms"]["count"] == 1
    assert fast["e2e_ms"]["count"] == 5 and 0 < fast["e2e_ms"]["p50"] <= fast["e2e_ms"]["p95"] < 2000
    assert fast["cost_usd"] > 0 and strong["cost_usd"] == 0
    assert d["tiers"] == {
        "fast": {"requests": 5, "share": 0.5556},
        "strong": {"requests": 4, "share": 0.4444},
    }
    alpha, beta = key_label("Bearer sk-alpha"), key_label("Bearer sk-beta")
    assert set(d["keys"]) == {alpha, beta}
    assert d["keys"][alpha]["sim-fast"]["requests"] == 3 and d["keys"][alpha]["sim-strong"]["requests"] == 4
    assert d["keys"][beta]["sim-fast"]["requests"] == 2 and d["keys"][beta]["sim-fast"]["retries"] == 1
    assert sum(k["sim-fast"]["cost_usd"] for k in d["keys"].values()) == pytest.approx(fast["cost_usd"])
    [support] = [t for t in d["cache"]["templates"] if t["template"] == "support"]
    assert support["requests"] == 3 and support["flagged"] is True
    assert support["breaking_segment"]["segment"].startswith("system")
    assert d["totals"]["requests"] == 9


def test_dashboard_page_is_served(make_gateway: Any, sim: SimServer) -> None:
    gw = make_gateway(priced_policy(sim))
    with urllib.request.urlopen(gw.url + "/dashboard", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/html")
        page = resp.read().decode()
    assert "/admin/dashboard" in page and "<script>" in page


def test_with_an_admin_key_the_page_loads_but_its_data_needs_the_key(
    make_gateway: Any, sim: SimServer
) -> None:
    gw = make_gateway(priced_policy(sim), env={"SWITCHYARD_ADMIN_KEY": "s3cret"})
    with urllib.request.urlopen(gw.url + "/dashboard", timeout=5) as resp:
        assert resp.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(gw.url + "/admin/dashboard", timeout=5)
    assert info.value.code == 403
    assert json.loads(info.value.read())["error"]["code"] == "invalid_admin_key"
    request = urllib.request.Request(
        gw.url + "/admin/dashboard?since=5m", headers={"Authorization": "Bearer s3cret"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert json.loads(resp.read())["since_s"] == 300


def test_requests_that_reach_no_deployment_are_counted_by_code_and_key(
    make_gateway: Any, sim: SimServer
) -> None:
    """400, 404, 401 and 429 storms: /metrics counted them, the dashboard showed 1 request."""
    admin_key = "adm-dash-77e1"
    gw = make_gateway(
        sim_policy(sim.base_url), env={"SWITCHYARD_AUTH": "keys", "SWITCHYARD_ADMIN_KEY": admin_key}
    )
    admin_headers = {"Content-Type": "application/json", "Authorization": f"Bearer {admin_key}"}

    def create(name: str, **limits: Any) -> Any:
        req = urllib.request.Request(
            gw.url + "/admin/keys", data=json.dumps({"name": name, **limits}).encode(), headers=admin_headers
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    limited, plain = create("limited", rpm=1), create("plain")
    hello = [{"role": "user", "content": "hi"}]
    one = openai.OpenAI(base_url=gw.base_url, api_key=limited["key"], max_retries=0)
    one.chat.completions.create(model="fast", messages=hello)
    for _ in range(2):
        with pytest.raises(openai.RateLimitError):
            one.chat.completions.create(model="fast", messages=hello)
    wrong = openai.OpenAI(base_url=gw.base_url, api_key="sk-sy-0123456789ab_wrong", max_retries=0)
    for _ in range(3):
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="fast", messages=hello)
    other = openai.OpenAI(base_url=gw.base_url, api_key=plain["key"], max_retries=0)
    for _ in range(2):
        with pytest.raises(openai.NotFoundError):
            other.chat.completions.create(model="gpt-9", messages=hello)
        with pytest.raises(openai.BadRequestError):
            other.chat.completions.create(model="fast", messages=[{"role": "wizard", "content": "x"}])  # type: ignore[misc,list-item]
    deadline = time.monotonic() + 5
    req = urllib.request.Request(gw.url + "/admin/dashboard?since=1h", headers=admin_headers)
    while True:
        with urllib.request.urlopen(req, timeout=5) as resp:
            d = json.loads(resp.read())
        if d["totals"]["requests"] >= 10 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    totals = d["totals"]
    assert totals["requests"] == 10 and totals["errors"] == 9, totals
    assert totals["errors_by_code"] == {
        "rate_limit_exceeded": 2,
        "invalid_api_key": 3,
        "model_not_found": 2,
        "invalid_value": 2,
    }
    assert "(none)" not in d["deployments"] and d["deployments"]["sim-fast"]["requests"] == 1
    assert d["keys"][limited["id"]]["(none)"]["errors_by_code"] == {"rate_limit_exceeded": 2}
    assert d["keys"][plain["id"]]["(none)"]["requests"] == 4
    assert d["keys"]["-"]["(none)"]["errors"] == 3
    assert sum(d["series"]["requests"]) == 10 and sum(d["series"]["errors"]) == 9
    # Latencies stay the upstreams': refused requests add no sample and no chart line.
    assert totals["e2e_ms"]["count"] == 1 and "(none)" not in d["series"]["deployments"]
