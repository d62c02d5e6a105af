"""`POST /v1/fanout` and `switchyard batch` against a gateway and the simulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, SimServer


def post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(model: str, text: str = "hi") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 5}


def test_fanout_runs_items_concurrently_and_isolates_failures(make_gateway: Any) -> None:
    with SimServer("--model", "m:300:1") as sim:
        gw = make_gateway(
            f'deployments:\n  m: {{base_url: "{sim.base_url}"}}\ntiers: {{fast: [m]}}\n'
            "dispatch: {retries: {max: 0}}\n"
        )
        sim.set_fault("m", "error=500", count=1)
        items = [chat("m", "zero"), chat("nope"), chat("fast", "two"), chat("m", "three"), {"model": "m"}]
        t0 = time.monotonic()
        status, body = post(gw.base_url + "/fanout", {"requests": items, "max_concurrency": 8})
        elapsed = time.monotonic() - t0
    assert status == 200 and body["object"] == "fanout.result"
    results = body["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3, 4]
    statuses = [r["status"] for r in results]
    assert statuses.count(502) == 1  # the one the fault hit, whichever it was
    assert statuses[1] == 404 and results[1]["body"]["error"]["code"] == "model_not_found"
    assert statuses[4] == 400 and results[4]["body"]["error"]["param"] == "messages"
    ok = [r for r in results if r["status"] == 200]
    assert len(ok) == 2 and all(r["body"]["object"] == "chat.completion" for r in ok)
    assert all(r["headers"]["x-switchyard-model"] == "m" for r in ok)
    # Three items each took >= 300 ms upstream; concurrently the whole is about one of them.
    assert elapsed < 0.85


def test_fanout_per_item_timeout_and_bad_bodies(make_gateway: Any) -> None:
    with SimServer("--model", "m:5:1") as sim:
        gw = make_gateway(f'deployments:\n  m: {{base_url: "{sim.base_url}"}}\ntiers: {{fast: [m]}}\n')
        sim.set_fault("m", "hang", count=1)
        status, body = post(
            gw.base_url + "/fanout",
            {"requests": [chat("m"), chat("m")], "timeout_s": 0.5, "max_concurrency": 1},
        )
        assert status == 200
        assert [r["status"] for r in body["results"]] == [504, 200]
        assert body["results"][0]["body"]["error"]["code"] == "fanout_item_timeout"
        status, body = post(gw.base_url + "/fanout", {"requests": []})
        assert status == 400 and body["error"]["param"] == "requests"
        status, body = post(gw.base_url + "/fanout", {"requests": [{**chat("m"), "stream": True}]})
        assert (
            body["results"][0]["status"] == 400 and body["results"][0]["body"]["error"]["param"] == "stream"
        )


def write_batch(path: Path, n: int) -> None:
    lines = []
    for i in range(n):
        lines.append(
            json.dumps(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": chat("m", f"question {i}"),
                }
            )
        )
    lines.insert(3, "this is not json")
    lines.insert(
        7, json.dumps({"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {}})
    )
    path.write_text("\n".join(lines) + "\n")


def run_batch(gw: Any, inp: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "batch", str(inp), "--out", str(out), "--base-url", gw.url, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_out(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_batch_resume_after_a_kill_leaves_no_duplicates_or_gaps(make_gateway: Any, tmp_path: Path) -> None:
    with SimServer("--model", "m:40:1") as sim:
        gw = make_gateway(f'deployments:\n  m: {{base_url: "{sim.base_url}"}}\ntiers: {{fast: [m]}}\n')
        sim.set_fault("m", "rate_limit=1", count=2)
        inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        write_batch(inp, 60)
        proc = run_batch(gw, inp, out, "--concurrency", "2")
        deadline = time.monotonic() + 20
        while (not out.exists() or len(out.read_text().splitlines()) < 15) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        first = len(read_out(out))
        assert 15 <= first < 62
        proc = run_batch(gw, inp, out, "--concurrency", "4")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    records = read_out(out)
    ids = [r["custom_id"] for r in records]
    assert len(ids) == len(set(ids)), "no duplicates"
    assert set(ids) == {f"req-{i}" for i in range(60)} | {"line-4", "req-1#line-8"}, "no gaps"
    by_id = {r["custom_id"]: r for r in records}
    assert (
        by_id["line-4"]["error"]["code"] == "invalid_input"
        and "line 4" in by_id["line-4"]["error"]["message"]
    )
    assert "duplicate custom_id" in by_id["req-1#line-8"]["error"]["message"]
    good = by_id["req-7"]
    assert good["id"].startswith("batch_req_") and good["error"] is None
    assert good["response"]["status_code"] == 200 and good["response"]["request_id"].startswith("req_")
    assert good["response"]["body"]["object"] == "chat.completion"
    assert all(by_id[f"req-{i}"]["response"]["status_code"] == 200 for i in range(60)), "429s were waited out"


def test_batch_respects_rpm_and_reports_progress(make_gateway: Any, tmp_path: Path) -> None:
    with SimServer("--model", "m:1:0") as sim:
        gw = make_gateway(f'deployments:\n  m: {{base_url: "{sim.base_url}"}}\ntiers: {{fast: [m]}}\n')
        inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        inp.write_text(
            "".join(
                json.dumps(
                    {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat("m")}
                )
                + "\n"
                for i in range(8)
            )
        )
        t0 = time.monotonic()
        proc = run_batch(gw, inp, out, "--rpm", "240", "--concurrency", "8")
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    assert proc.returncode == 0, err
    assert len(read_out(out)) == 8
    # 240 rpm = 4 per second: four at once, then one every 250 ms.
    assert 0.9 < elapsed < 10
    assert "8/8" in err and "req/s" in err and "ETA" in err
