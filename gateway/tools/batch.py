"""``switchyard batch``: run an OpenAI Batch API input file through a gateway.

Input lines are OpenAI's batch format (``{"custom_id", "method", "url", "body"}``); output
lines are OpenAI's batch output (``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}``). Requests run concurrently within ``--rpm``/``--tpm``,
429s are waited out (Retry-After) and retried, and each result is appended to the output
with a single write and an fsync the moment it is known. A run that is interrupted
(Ctrl-C, a crash, a kill) loses only what was in flight; running the same command again
resumes: it repairs a cut-off last line and skips every ``custom_id`` already in the
output, so nothing is duplicated and nothing is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import orjson

from gateway.dispatch.backoff import full_jitter_s, retry_after_s

ALLOWED_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(slots=True)
class Item:
    line: int
    custom_id: str
    url: str
    body: dict[str, Any]
    tokens: int


@dataclass(slots=True)
class Bad:
    line: int
    custom_id: str
    message: str


def repair_and_read_done(out: Path) -> set[str]:
    """The custom_ids already in ``out``; a last line cut off by a crash is removed first."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with out.open("r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())
    done = set()
    for raw in data[:end].splitlines():
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
            custom_id = orjson.loads(raw).get("custom_id")
            if isinstance(custom_id, str):
                done.add(custom_id)
    return done


def estimate_tokens(body: dict[str, Any]) -> int:
    """Prompt bytes / 4 plus the requested completion length (256 when unset)."""
    prompt = len(orjson.dumps(body.get("messages") or body.get("prompt") or body.get("input") or ""))
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return prompt // 4 + (limit if isinstance(limit, int) and limit > 0 else 256)


def read_input(path: Path) -> Iterator[Item | Bad]:
    """Each line as a request, or as a problem with its line number."""
    seen: set[str] = set()
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            custom_id = f"line-{number}"
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield Bad(number, custom_id, f"line {number}: not JSON ({exc})")
                continue
            if not isinstance(obj, dict):
                yield Bad(number, custom_id, f"line {number}: not a JSON object")
                continue
            given = obj.get("custom_id")
            if not isinstance(given, str) or not given:
                yield Bad(number, custom_id, f"line {number}: custom_id must be a non-empty string")
                continue
            custom_id = given
            if custom_id in seen:
                yield Bad(
                    number, f"{custom_id}#line-{number}", f"line {number}: duplicate custom_id {custom_id!r}"
                )
                continue
            seen.add(custom_id)
            method, url, body = obj.get("method", "POST"), obj.get("url"), obj.get("body")
            if method != "POST":
                yield Bad(number, custom_id, f"line {number}: method must be POST, not {method!r}")
            elif url not in ALLOWED_URLS:
                yield Bad(number, custom_id, f"line {number}: url must be one of {', '.join(ALLOWED_URLS)}")
            elif not isinstance(body, dict):
                yield Bad(number, custom_id, f"line {number}: body must be a JSON object")
            else:
                yield Item(number, custom_id, url, body, estimate_tokens(body))


class RequestPacer:
    """Requests and tokens per minute as two token buckets refilled continuously, each
    holding one second's worth: the load is spread evenly, never sent in a minute's burst."""

    def __init__(self, rpm: float | None, tpm: float | None) -> None:
        self._rates = [(rpm / 60.0 if rpm else None), (tpm / 60.0 if tpm else None)]
        self._caps = [max(1.0, (rpm or 0) / 60.0), max(1.0, (tpm or 0) / 60.0)]
        self._levels = list(self._caps)
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, tokens: int) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                waits = []
                for i, (need, rate) in enumerate(((1.0, self._rates[0]), (float(tokens), self._rates[1]))):
                    if rate is None:
                        waits.append(0.0)
                        continue
                    self._levels[i] = min(self._caps[i], self._levels[i] + (now - self._at) * rate)
                    need = min(need, self._caps[i])  # a request bigger than a minute's tokens still runs
                    waits.append(max(0.0, (need - self._levels[i]) / rate))
                self._at = now
                wait = max(waits)
                if wait <= 0:
                    for i, need in enumerate((1.0, float(tokens))):
                        if self._rates[i] is not None:
                            self._levels[i] -= min(need, self._caps[i])
                    return
                await asyncio.sleep(wait)


class Output:
    """Appends whole lines, each followed by an fsync (a kill never leaves half a result)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.written = 0

    def write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, orjson.dumps(record) + b"\n")
        os.fsync(self._fd)
        self.written += 1

    def close(self) -> None:
        os.close(self._fd)


def _record(
    custom_id: str, status: int | None, request_id: str | None, body: Any, error: Any
) -> dict[str, Any]:
    response = None if status is None else {"status_code": status, "request_id": request_id, "body": body}
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }


class Progress:
    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self._stream = stream
        self._tty = stream.isatty()
        self._start = self._shown = time.monotonic()

    def tick(self, ok: bool) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        now = time.monotonic()
        if now - self._shown >= (0.2 if self._tty else 5.0) or self.done == self.total:
            self._shown = now
            self.show()

    def show(self, end: str = "") -> None:
        elapsed = max(1e-6, time.monotonic() - self._start)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        eta_text = f"{eta:.0f}s" if eta != float("inf") else "?"
        line = f"[{bar}] {self.done}/{self.total} {rate:.1f} req/s ETA {eta_text} errors {self.failed}"
        self._stream.write(("\r" if self._tty else "") + line + (end or ("" if self._tty else "\n")))
        self._stream.flush()


async def _send(
    session: aiohttp.ClientSession, base_url: str, item: Item, pacer: RequestPacer, max_retries: int
) -> dict[str, Any]:
    attempt = 0
    while True:
        await pacer.take(item.tokens)
        try:
            async with session.post(base_url + item.url, json=item.body) as resp:
                data = await resp.read()
                request_id = resp.headers.get("x-request-id")
                if resp.status in RETRY_STATUSES and attempt < max_retries:
                    attempt += 1
                    delay = retry_after_s(resp.headers)
                    await asyncio.sleep(delay if delay is not None else full_jitter_s(attempt, 1.0, 30.0))
                    continue
                try:
                    body: Any = orjson.loads(data)
                except orjson.JSONDecodeError:
                    body = data.decode("utf-8", "replace")
                return _record(item.custom_id, resp.status, request_id, body, None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if attempt < max_retries:
                attempt += 1
                await asyncio.sleep(full_jitter_s(attempt, 1.0, 30.0))
                continue
            error = {"code": "request_failed", "message": f"{type(exc).__name__}: {exc}"}
            return _record(item.custom_id, None, None, None, error)


async def run_batch(args: argparse.Namespace) -> int:
    out_path = Path(args.out)
    done = repair_and_read_done(out_path)
    entries = [e for e in read_input(Path(args.input)) if e.custom_id not in done]
    output = Output(out_path)
    progress = Progress(len(entries), sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    queue: asyncio.Queue[Item] = asyncio.Queue()
    for entry in entries:
        if isinstance(entry, Bad):
            print(entry.message, file=sys.stderr)
            output.write(
                _record(
                    entry.custom_id, None, None, None, {"code": "invalid_input", "message": entry.message}
                )
            )
            progress.tick(False)
        else:
            queue.put_nowait(entry)
    pacer = RequestPacer(args.rpm, args.tpm)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    base_url = args.base_url.rstrip("/").removesuffix("/v1")

    async def worker(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            record = await _send(session, base_url, item, pacer, args.max_retries)
            output.write(record)
            status = (record["response"] or {}).get("status_code")
            progress.tick(status is not None and 200 <= status < 300)

    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        workers: asyncio.Future[list[None]] = asyncio.gather(
            *(worker(session) for _ in range(max(1, args.concurrency)))
        )
        stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        await asyncio.wait([workers, stopper], return_when=asyncio.FIRST_COMPLETED)
        interrupted = not workers.done()
        # On a signal, requests in flight are dropped unwritten: a resumed run sends them again.
        workers.cancel()
        stopper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await workers
    output.close()
    progress.show(end="\n")
    if interrupted:
        print(f"interrupted: {output.written} results written; run again to resume", file=sys.stderr)
        return 130
    print(f"done: {progress.done} requests, {progress.failed} failed; results in {out_path}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "batch",
        help="run an OpenAI Batch API input file through a gateway",
        description="Run OpenAI batch input lines concurrently, within rate limits, resumably.",
    )
    p.add_argument("input", help="JSONL of {custom_id, method, url, body}")
    p.add_argument("--out", required=True, help="JSONL results (appended; resumes if it exists)")
    p.add_argument("--base-url", default=os.environ.get("SWITCHYARD_URL", "http://127.0.0.1:8080"))
    p.add_argument(
        "--api-key", default=os.environ.get("SWITCHYARD_API_KEY") or os.environ.get("OPENAI_API_KEY")
    )
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rpm", type=float, help="requests per minute at most")
    p.add_argument(
        "--tpm", type=float, help="tokens per minute at most (estimated: prompt bytes/4 + max_tokens)"
    )
    p.add_argument("--max-retries", type=int, default=5, help="per request, on 429/5xx/connection errors")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    p.set_defaults(func=lambda args: asyncio.run(run_batch(args)))
