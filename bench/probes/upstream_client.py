"""CPU cost of the upstream HTTP client alone (issue #20): aiohttp's client
(:class:`gateway.providers.transport.HttpTransport`) against the lean HTTP/1.1 one
(:class:`gateway.providers.http1.Http1Transport`), on uvloop, against a canned upstream.

    .venv/bin/python bench/probes/upstream_client.py [--requests 5000] [--rounds 5] [--concurrency "1 16"]

The canned upstream runs in a child process (its CPU is not counted): a fixed 1,046-byte
JSON answer like the overhead benchmark's nginx, and a 22-event SSE answer (~6 kB, the
same size) sent either in one write or one write per event. Each measured request is what
dispatch does: ``send`` (a JSON body), read the body (``iter_chunks`` to its end), ``release``.
Prints this process's CPU time per request (``time.process_time``), req/s and body reads per
request, medians of ``--rounds`` interleaved rounds (aiohttp, http1, aiohttp, ...). In the
paced mode a client that reads faster sees each event as a read of its own where a slower
one finds several waiting: compare CPU per read there too.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from typing import Any

import orjson
import uvloop

from gateway.config import parse_policy
from gateway.policy import Deployment
from gateway.providers.http1 import Http1Transport
from gateway.providers.transport import HttpTransport, Transport

JSON_BODY = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1764000000,
        "model": "canned",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * 480},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 90, "total_tokens": 210},
    }
).ljust(1046)
EVENTS = [
    b"data: "
    + orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1764000000,
            "model": "canned",
            "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}],
            "usage": None,
        }
    ).ljust(270)
    + b"\n\n"
    for i in range(21)
] + [b"data: [DONE]\n\n"]
REQUEST = {
    "model": "canned",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi. " * 20},
    ],
    "max_tokens": 64,
}


def _upstream(port_out: Any) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                path = head.split(b" ", 2)[1]
                if path.endswith(b"/json/chat/completions"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                        % len(JSON_BODY)
                        + JSON_BODY
                    )
                else:
                    body = b"".join(EVENTS)
                    head_out = (
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                        % len(body)
                    )
                    if path.endswith(b"/sse/chat/completions"):
                        writer.write(head_out + body)
                    else:  # one write per event, as a token stream arrives
                        writer.write(head_out)
                        for event in EVENTS:
                            await writer.drain()
                            writer.write(event)
                            await asyncio.sleep(0)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    uvloop.run(main())


def _deployment() -> Deployment:
    policy = parse_policy(
        'deployments:\n  d: {provider: openai, base_url: "http://127.0.0.1/v1", model: canned}\n'
        "tiers: {fast: [d], strong: [d]}\n",
        "bench.yaml",
    )
    return policy.deployments["d"]


async def _one(transport: Transport, endpoint: str) -> int:
    """One request as dispatch makes it; returns the number of body reads it took."""
    resp = await transport.send(endpoint, REQUEST, headers={"x-request-id": "bench"}, connect_timeout_s=5)
    reads = 0
    async for _ in resp.iter_chunks():
        reads += 1
    resp.release()
    return reads


async def _round(
    make: type[Transport], url: str, mode: str, requests: int, concurrency: int
) -> tuple[float, float, float]:
    transport = make(url, _deployment())  # type: ignore[call-arg]
    endpoint = f"/{mode}/chat/completions"
    for _ in range(50):  # open the connections
        await asyncio.gather(*(_one(transport, endpoint) for _ in range(concurrency)))
    per_worker = requests // concurrency
    reads = 0

    async def worker() -> None:
        nonlocal reads
        for _ in range(per_worker):
            took = await _one(transport, endpoint)  # not `reads += await`: that reads `reads` first
            reads += took

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await transport.close()
    done = per_worker * concurrency
    return cpu / done * 1e6, done / wall, reads / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", default="1 16")
    parser.add_argument("--modes", default="json sse sse-paced")
    args = parser.parse_args()
    ports: Any = multiprocessing.get_context("spawn").Queue()
    upstream = multiprocessing.get_context("spawn").Process(target=_upstream, args=(ports,), daemon=True)
    upstream.start()
    url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    clients: dict[str, type[Transport]] = {"aiohttp": HttpTransport, "http1": Http1Transport}
    try:
        columns = ("mode", "conc", "client", "cpu us/req", "range", "req/s", "reads/req")
        print("{:<10} {:>4}  {:<8} {:>10} {:>15} {:>8} {:>9}".format(*columns))
        for mode in args.modes.split():
            for conc in (int(c) for c in args.concurrency.split()):
                results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in clients}
                for _ in range(args.rounds):
                    for name, make in clients.items():
                        results[name].append(uvloop.run(_round(make, url, mode, args.requests, conc)))
                medians = {}
                for name, rows in results.items():
                    cpus = [r[0] for r in rows]
                    medians[name] = statistics.median(cpus)
                    rate = statistics.median(r[1] for r in rows)
                    reads = statistics.median(r[2] for r in rows)
                    spread = f"{min(cpus):.1f}-{max(cpus):.1f}"
                    line = f"{mode:<10} {conc:>4}  {name:<8} {medians[name]:>10.1f} {spread:>15}"
                    print(f"{line} {rate:>8.0f} {reads:>9.1f}")
                saved = medians["aiohttp"] - medians["http1"]
                print(f"{'':<10} {'':>4}  saved    {saved:>10.1f} us/req ({saved / medians['aiohttp']:.0%})")
    finally:
        upstream.terminate()


if __name__ == "__main__":
    main()
