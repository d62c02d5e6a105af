"""Batch input parsing, crash repair and rate limiting, alone."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from gateway.tools.batch import Bad, Item, RequestPacer, read_input, repair_and_read_done


def test_bad_lines_are_reported_with_their_number(tmp_path: Path) -> None:
    lines = [
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": []},
        },
        "not json",
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}},
        {"custom_id": "b", "method": "GET", "url": "/v1/chat/completions", "body": {}},
        {"custom_id": "c", "method": "POST", "url": "/v1/files", "body": {}},
        {"method": "POST", "url": "/v1/embeddings", "body": {}},
        {"custom_id": "d", "method": "POST", "url": "/v1/embeddings", "body": []},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    got = list(read_input(path))
    assert isinstance(got[0], Item) and got[0].custom_id == "a"
    bad = [g for g in got if isinstance(g, Bad)]
    assert [b.line for b in bad] == [2, 3, 4, 5, 6, 7]
    assert "not JSON" in bad[0].message and "duplicate custom_id 'a'" in bad[1].message
    assert bad[1].custom_id == "a#line-3" and bad[4].custom_id == "line-6"


def test_repair_removes_a_cut_off_last_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"custom_id": "a"}\n{"custom_id": "b"}\n{"custom_id": "c", "resp')
    assert repair_and_read_done(out) == {"a", "b"}
    assert out.read_bytes().endswith(b'"b"}\n')
    assert repair_and_read_done(tmp_path / "missing.jsonl") == set()


def test_limiter_spaces_requests() -> None:
    async def run() -> float:
        pacer = RequestPacer(rpm=600, tpm=None)  # 10 per second
        pacer._levels[0] = 0  # start empty to see the rate
        t0 = time.monotonic()
        for _ in range(5):
            await pacer.take(10)
        return time.monotonic() - t0

    assert 0.4 < asyncio.run(run()) < 1.5


def test_limiter_tokens() -> None:
    async def run() -> float:
        pacer = RequestPacer(rpm=None, tpm=6000)  # 100 tokens per second
        pacer._levels[1] = 0
        t0 = time.monotonic()
        await pacer.take(50)
        return time.monotonic() - t0

    assert 0.4 < asyncio.run(run()) < 1.0
