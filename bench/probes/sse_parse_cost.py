"""CPU cost of checking every streamed event (issue #13): the scanner parses each event's
JSON (``orjson.loads``) to find the real ``[DONE]`` and refuse a malformed event, where it
used to look at each event's last byte and search bytes for markers.

    .venv/bin/python bench/probes/sse_parse_cost.py [--n 2000]

Feeds a 200-event stream (one event per upstream read, as a token-by-token upstream
sends, and all at once) through :class:`gateway.providers.sse.StreamScanner` and prints
microseconds per event and per stream (best of 5 rounds), next to the bare cost of
``orjson.loads`` on the same events. No I/O: this is the added CPU on the hot path.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

from gateway.providers.sse import StreamScanner

EVENTS = 200


def _event(i: int) -> bytes:
    chunk = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1764000000,
        "model": "gpt-4.1-mini",
        "choices": [{"index": 0, "delta": {"content": f" word{i}"}, "logprobs": None, "finish_reason": None}],
        "usage": None,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _best_us(fn: Callable[[], None], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="streams per round")
    args = parser.parse_args()
    events = [_event(i) for i in range(EVENTS)]
    events.append(b"data: [DONE]\n\n")
    whole = b"".join(events)
    payloads = [e[6:-2] for e in events[:-1]]

    def per_read() -> None:
        scanner = StreamScanner(model_from="gpt-4.1-mini", model_to="fast")
        for event in events:
            scanner.feed(event)

    def one_read() -> None:
        StreamScanner().feed(whole)

    def bare_loads() -> None:
        for payload in payloads:
            orjson.loads(payload)

    n = max(1, args.n // 10)
    rows = [
        ("scanner, one event per read (with model rewrite)", _best_us(per_read, n)),
        ("scanner, whole stream in one read", _best_us(one_read, n)),
        ("orjson.loads alone", _best_us(bare_loads, n)),
    ]
    print(f"{EVENTS} events of {len(events[0])} bytes")
    print("| what | us per stream | us per event |")
    print("|---|---|---|")
    for label, us in rows:
        print(f"| {label} | {us:.0f} | {us / EVENTS:.2f} |")


if __name__ == "__main__":
    main()
