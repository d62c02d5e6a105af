"""An OpenAI-compatible simulator: the upstream for Switchyard's tests and benchmarks.

It answers ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and
``/v1/models`` in OpenAI's wire format, with a latency model (time to first token,
inter-token latency, prefill time for uncached prompt tokens, a ``max_num_seqs``
queue), a prefix cache that behaves like vLLM's or OpenAI's, vLLM-shaped ``/health``
and ``/metrics``, fault injection, and ``/sim/stats`` for tests to see what happened.

Tokens and the prefix cache (other parts of Switchyard rely on this exact definition):

- A chat request is rendered as a chat template would: each tool as ``orjson.dumps``
  of the request's tool object, in request order, then each message as
  ``<|role|>\\n{content}\\n`` (text parts concatenated; other parts as their JSON).
  A completion's prompt is its text.
- A token is 4 bytes of that UTF-8 text: ``prompt_tokens = ceil(len / 4)``.
- A cache block is ``block_tokens`` tokens (64 bytes by default); blocks are hashed as
  a chain (blake2b of the parent hash and the block bytes), so a change at byte ``p``
  invalidates every block from ``p // 64`` on. Only full blocks are cached.
- ``vllm`` mode: cached tokens = leading blocks found in an LRU of
  ``cache_capacity_blocks`` blocks, times ``block_tokens``, capped below the whole
  prompt (vLLM always computes the last token).
- ``openai`` mode: the same chain, but nothing counts below 1,024 tokens and hits are
  counted in 128-token increments; entries may expire after ``cache_ttl_s`` idle.
- ``none``: nothing is ever cached.

Faults (header ``x-sim-fault: SPEC[, SPEC...]``, or per model with ``--fault`` and
``POST /sim/faults``), each SPEC ``name`` or ``name=value``:
``error=STATUS``, ``rate_limit=SECONDS``, ``hang``, ``slow_first_token=MS``,
``reset_mid_stream=K``, ``stall_mid_stream=K`` or ``K:MS``, ``malformed_chunk=K``
(a ``data: {not json`` event after K chunks, then the stream goes on),
``context_length``, ``empty``, ``bad_json``, ``length``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import math
import random
import signal
import struct
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import orjson
import yaml
from aiohttp import web

BYTES_PER_TOKEN = 4
OPENAI_MIN_CACHED = 1024
OPENAI_INCREMENT = 128
_WORDS = (
    "the harbor light turned slowly over the water while gulls circled the old pier and a keeper "
    "wrote careful notes about wind tide and the ships that passed before dawn"
).split(" ")
_HIST_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class ModelProfile:
    """Latency and output shape of one simulated model (milliseconds)."""

    ttft_ms: float = 20.0
    itl_ms: float = 2.0
    jitter_ms: float = 0.0
    prefill_ms_per_1k_tokens: float = 0.0
    output_tokens: tuple[int, int] = (16, 48)
    embedding_dim: int = 64


def _default_models() -> dict[str, ModelProfile]:
    return {"sim-fast": ModelProfile(ttft_ms=15, itl_ms=2), "sim-strong": ModelProfile(ttft_ms=60, itl_ms=6)}


@dataclass
class SimConfig:
    """Everything the simulator can be told at start."""

    models: dict[str, ModelProfile] = field(default_factory=_default_models)
    accept_any_model: bool = False
    cache_model: Literal["vllm", "openai", "none"] = "vllm"
    block_tokens: int = 16
    cache_capacity_blocks: int = 100_000
    cache_ttl_s: float | None = None
    max_num_seqs: int = 256
    require_api_key: str | None = None
    seed: int = 0
    chunk_tokens: int = 1
    faults: list[FaultRule] = field(default_factory=list)


@dataclass
class FaultRule:
    """A fault applied to a model's requests (``*``: every model)."""

    model: str
    fault: str
    rate: float = 1.0
    count: int | None = None


def parse_faults(text: str) -> dict[str, str]:
    """``"reset_mid_stream=3, slow_first_token=200"`` -> ``{"reset_mid_stream": "3", ...}``."""
    out: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if part:
            name, _, value = part.partition("=")
            out[name.strip()] = value.strip()
    return out


def parse_fault_rule(text: str) -> FaultRule:
    """``MODEL:SPEC[@RATE][#COUNT]`` as given to ``--fault``."""
    model, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"fault rule needs MODEL:SPEC, got {text!r}")
    count: int | None = None
    rate = 1.0
    if "#" in rest:
        rest, _, raw_count = rest.rpartition("#")
        count = int(raw_count)
    if "@" in rest:
        rest, _, raw_rate = rest.rpartition("@")
        rate = float(raw_rate)
    return FaultRule(model=model, fault=rest, rate=rate, count=count)


# --- prompts, tokens, cache -------------------------------------------------------------


def _content_text(content: Any) -> bytes:
    if content is None:
        return b""
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text", "")).encode())
            else:
                out.append(orjson.dumps(part))
        return b"".join(out)
    return orjson.dumps(content)


def render_chat(body: dict[str, Any]) -> bytes:
    """The prompt text a chat template would produce (see the module docstring)."""
    parts = [orjson.dumps(tool) for tool in body.get("tools") or ()]
    for message in body.get("messages") or ():
        if isinstance(message, dict):
            parts.append(b"<|" + str(message.get("role", "")).encode() + b"|>\n")
            parts.append(_content_text(message.get("content")))
            if message.get("tool_calls"):
                parts.append(orjson.dumps(message["tool_calls"]))
            parts.append(b"\n")
    return b"".join(parts)


def token_count(text: bytes) -> int:
    return -(-len(text) // BYTES_PER_TOKEN)


def block_hashes(text: bytes, block_bytes: int) -> list[bytes]:
    """The hash chain of the full blocks of ``text``."""
    hashes = []
    parent = b""
    blake = hashlib.blake2b
    for start in range(0, len(text) - block_bytes + 1, block_bytes):
        parent = blake(parent + text[start : start + block_bytes], digest_size=16).digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """An LRU of block hashes; a lookup counts the leading blocks present."""

    def __init__(self, capacity_blocks: int, ttl_s: float | None) -> None:
        self.capacity = capacity_blocks
        self.ttl_s = ttl_s
        self._blocks: OrderedDict[bytes, float] = OrderedDict()

    def match(self, hashes: list[bytes], now: float) -> int:
        matched = 0
        for h in hashes:
            seen = self._blocks.get(h)
            if seen is None or (self.ttl_s is not None and now - seen > self.ttl_s):
                break
            matched += 1
        return matched

    def insert(self, hashes: list[bytes], now: float) -> None:
        blocks = self._blocks
        # Touch from the tail back, so the head of a chain is the most recently used and
        # the tail of a prefix is evicted first, as in vLLM.
        for h in reversed(hashes):
            blocks[h] = now
            blocks.move_to_end(h)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


# --- state and stats --------------------------------------------------------------------


class _Histogram:
    __slots__ = ("counts", "n", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(_HIST_BUCKETS)
        self.n = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, bound in enumerate(_HIST_BUCKETS):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class _ModelStats:
    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    ttft: _Histogram = field(default_factory=_Histogram)
    itl: _Histogram = field(default_factory=_Histogram)
    e2e: _Histogram = field(default_factory=_Histogram)


class Sim:
    """The simulator's state: config, cache, faults, counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.cache = PrefixCache(config.cache_capacity_blocks, config.cache_ttl_s)
        self.faults: list[FaultRule] = list(config.faults)
        self.slots = asyncio.Semaphore(config.max_num_seqs)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.requests_total = 0
        self.in_flight = 0
        self.completed = 0
        self.cancelled = 0
        self.by_model: dict[str, int] = {}
        self.fault_counts: dict[str, int] = {}
        self.model_stats: dict[str, _ModelStats] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=500)

    def profile(self, model: str) -> ModelProfile | None:
        found = self.config.models.get(model)
        if found is None and self.config.accept_any_model:
            return ModelProfile()
        return found

    def faults_for(self, model: str, header: str | None) -> dict[str, str]:
        active = parse_faults(header) if header else {}
        for rule in self.faults:
            if rule.model not in ("*", model) or (rule.count is not None and rule.count <= 0):
                continue
            if rule.rate < 1.0 and self.rng.random() >= rule.rate:
                continue
            if rule.count is not None:
                rule.count -= 1
            active.update(parse_faults(rule.fault))
        for name in active:
            self.fault_counts[name] = self.fault_counts.get(name, 0) + 1
        return active

    def cached_tokens(self, text: bytes, prompt_tokens: int) -> int:
        """Look the prompt up in the prefix cache and insert its blocks; the cached token count."""
        mode = self.config.cache_model
        if mode == "none":
            return 0
        block_tokens = self.config.block_tokens
        hashes = block_hashes(text, block_tokens * BYTES_PER_TOKEN)
        now = time.monotonic()
        matched = self.cache.match(hashes, now) * block_tokens
        self.cache.insert(hashes, now)
        if mode == "vllm":
            cap = ((prompt_tokens - 1) // block_tokens) * block_tokens
            return max(0, min(matched, cap))
        if prompt_tokens < OPENAI_MIN_CACHED:
            return 0
        cached = (min(matched, prompt_tokens) // OPENAI_INCREMENT) * OPENAI_INCREMENT
        return cached if cached >= OPENAI_MIN_CACHED else 0

    def stats_for(self, model: str) -> _ModelStats:
        found = self.model_stats.get(model)
        if found is None:
            found = self.model_stats[model] = _ModelStats()
        return found


_STATE = web.AppKey("sim", Sim)


class _Reset(Exception):
    """The simulated connection reset: the transport is aborted, the handler just ends."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("simulated reset")
        self.response = response


def _abort(request: web.Request, record: dict[str, Any], response: web.StreamResponse) -> _Reset:
    record["outcome"] = "reset_mid_stream"
    if request.transport is not None:
        request.transport.abort()
    return _Reset(response)


# --- wire helpers -----------------------------------------------------------------------


def _error(status: int, message: str, type_: str, code: str | None, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _fault_error(faults: dict[str, str]) -> web.Response | None:
    if "error" in faults:
        status = int(faults["error"] or 500)
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return _error(status, f"simulated HTTP {status}", kind, None)
    if "rate_limit" in faults:
        seconds = faults["rate_limit"] or "1"
        resp = _error(
            429,
            f"Rate limit reached for requests (simulated). Please try again in {seconds}s.",
            "requests",
            "rate_limit_exceeded",
        )
        resp.headers["Retry-After"] = seconds
        resp.headers["x-ratelimit-remaining-requests"] = "0"
        return resp
    if "context_length" in faults:
        return _error(
            400,
            "This model's maximum context length is 8192 tokens (simulated).",
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        )
    return None


def _words(seed_text: bytes, n: int) -> list[str]:
    seed = int.from_bytes(hashlib.blake2b(seed_text, digest_size=8).digest(), "little")
    return [_WORDS[(seed + i) % len(_WORDS)] for i in range(n)]


def _natural_length(seed_text: bytes, profile: ModelProfile) -> int:
    low, high = profile.output_tokens
    seed = int.from_bytes(hashlib.blake2b(seed_text + b"#len", digest_size=4).digest(), "little")
    return low + seed % max(1, high - low + 1)


@dataclass
class _Plan:
    """What one generation request will produce, and when."""

    model: str
    profile: ModelProfile
    pieces: list[str]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    itl_s: float
    tool_call: dict[str, Any] | None = None


def _jitter(sim: Sim, value_ms: float, jitter_ms: float) -> float:
    if jitter_ms <= 0:
        return max(0.0, value_ms) / 1000.0
    return max(0.0, sim.rng.gauss(value_ms, jitter_ms)) / 1000.0


def _plan(
    sim: Sim, model: str, profile: ModelProfile, text: bytes, body: dict[str, Any], faults: dict[str, str]
) -> _Plan:
    prompt_tokens = token_count(text)
    cached = sim.cached_tokens(text, prompt_tokens)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    natural = 3 if "length" in faults else _natural_length(text, profile)
    limit_n = int(limit) if isinstance(limit, int) and limit > 0 else None
    n = natural if limit_n is None else min(natural, limit_n)
    finish = "length" if ("length" in faults or (limit_n is not None and limit_n < natural)) else "stop"
    words = _words(text, n)
    fmt = body.get("response_format")
    wants_json = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
    tool_call = None
    choice = body.get("tool_choice")
    tools = body.get("tools") or []
    if tools and (choice == "required" or isinstance(choice, dict)):
        name = None
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
        if name is None and isinstance(tools[0], dict):
            name = (tools[0].get("function") or {}).get("name")
        tool_call = {
            "id": "call_" + hashlib.blake2b(text, digest_size=6).hexdigest(),
            "type": "function",
            "function": {"name": name or "tool", "arguments": "{}"},
        }
        finish = "tool_calls"
        pieces: list[str] = []
    elif "empty" in faults:
        pieces = []
    elif wants_json:
        answer = orjson.dumps({"answer": " ".join(words)}).decode()
        if "bad_json" in faults:
            answer = answer[: max(1, len(answer) // 2)]
        pieces = [answer[i : i + 8] for i in range(0, len(answer), 8)]
    else:
        pieces = [(" " if i else "") + w for i, w in enumerate(words)]
    uncached = prompt_tokens - cached
    ttft_ms = profile.ttft_ms + profile.prefill_ms_per_1k_tokens * uncached / 1000.0
    ttft_s = _jitter(sim, ttft_ms, profile.jitter_ms)
    if "slow_first_token" in faults:
        ttft_s += float(faults["slow_first_token"] or 1000) / 1000.0
    return _Plan(
        model,
        profile,
        pieces,
        finish,
        prompt_tokens,
        cached,
        ttft_s,
        _jitter(sim, profile.itl_ms, profile.jitter_ms),
        tool_call,
    )


def _usage(plan: _Plan, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": plan.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
    }


# --- handlers ---------------------------------------------------------------------------


async def _read_body(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _error(400, "We could not parse the JSON body of your request.", "invalid_request_error", None)
    if not isinstance(body, dict):
        return _error(400, "The body must be a JSON object.", "invalid_request_error", None)
    return body


def _check_key(sim: Sim, request: web.Request) -> web.Response | None:
    key = sim.config.require_api_key
    if key is None or request.headers.get("Authorization") == f"Bearer {key}":
        return None
    return _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")


def _record(sim: Sim, request: web.Request, body: dict[str, Any], endpoint: str) -> dict[str, Any]:
    record = {
        "model": body.get("model"),
        "endpoint": endpoint,
        "stream": body.get("stream") is True,
        "prompt_tokens": 0,
        "cached_tokens": 0,
        "status": 0,
        "outcome": "in_flight",
        "x-request-id": request.headers.get("x-request-id"),
        "traceparent": request.headers.get("traceparent"),
        "authorization": "Authorization" in request.headers,
        "body_keys": sorted(body),
        "stream_options": body.get("stream_options"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }
    sim.recent.append(record)
    return record


async def _generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    sim = request.app[_STATE]
    denied = _check_key(sim, request)
    if denied is not None:
        return denied
    parsed = await _read_body(request)
    if isinstance(parsed, web.Response):
        return parsed
    body = parsed
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _error(400, "you must provide a model parameter", "invalid_request_error", None, "model")
    if endpoint == "chat":
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "'messages' is a required property", "invalid_request_error", None, "messages")
        text = render_chat(body)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = "".join(str(p) for p in prompt)
        if not isinstance(prompt, str):
            return _error(400, "'prompt' is a required property", "invalid_request_error", None, "prompt")
        text = prompt.encode()
    profile = sim.profile(model)
    if profile is None:
        return _error(
            404, f"The model `{model}` does not exist.", "invalid_request_error", "model_not_found", "model"
        )
    sim.requests_total += 1
    sim.by_model[model] = sim.by_model.get(model, 0) + 1
    record = _record(sim, request, body, endpoint)
    faults = sim.faults_for(model, request.headers.get("x-sim-fault"))
    failed = _fault_error(faults)
    if failed is not None:
        record.update(status=failed.status, outcome=next(iter(faults)))
        return failed
    stats = sim.stats_for(model)
    sim.in_flight += 1
    started = time.perf_counter()
    try:
        stats.waiting += 1
        try:
            await sim.slots.acquire()
        finally:
            stats.waiting -= 1
        stats.running += 1
        try:
            if "hang" in faults:
                record["outcome"] = "hang"
                await asyncio.Event().wait()
            plan = _plan(sim, model, profile, text, body, faults)
            record.update(prompt_tokens=plan.prompt_tokens, cached_tokens=plan.cached_tokens)
            stats.prompt_tokens += plan.prompt_tokens
            stats.cache_queries += plan.prompt_tokens
            stats.cache_hits += plan.cached_tokens
            if body.get("stream") is True:
                resp = await _stream(request, sim, plan, endpoint, body, faults, record, stats, started)
            else:
                resp = await _unary(request, plan, endpoint, faults, record, stats)
        finally:
            stats.running -= 1
            sim.slots.release()
    except _Reset as reset:
        return reset.response
    except (asyncio.CancelledError, ConnectionError):
        sim.cancelled += 1
        if record["outcome"] in ("in_flight", "hang"):
            record["outcome"] = "cancelled"
        raise
    finally:
        sim.in_flight -= 1
    stats.e2e.observe(time.perf_counter() - started)
    if record["outcome"] == "in_flight":
        record["outcome"] = "completed"
        sim.completed += 1
    return resp


def _ids(endpoint: str) -> tuple[str, str, str]:
    suffix = f"{random.getrandbits(64):016x}"
    if endpoint == "chat":
        return "chatcmpl-" + suffix, "chat.completion", "chat.completion.chunk"
    return "cmpl-" + suffix, "text_completion", "text_completion"


async def _unary(
    request: web.Request,
    plan: _Plan,
    endpoint: str,
    faults: dict[str, str],
    record: dict[str, Any],
    stats: _ModelStats,
) -> web.StreamResponse:
    n = len(plan.pieces)
    await asyncio.sleep(plan.ttft_s + plan.itl_s * max(0, n - 1))
    stats.ttft.observe(plan.ttft_s)
    stats.generation_tokens += n
    if "reset_mid_stream" in faults:
        raise _abort(request, record, web.Response())
    if "stall_mid_stream" in faults:
        record["outcome"] = "stall_mid_stream"
        await asyncio.Event().wait()
    rid, obj, _ = _ids(endpoint)
    content = "".join(plan.pieces)
    if endpoint == "chat":
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content if plan.tool_call is None else None,
        }
        if plan.tool_call is not None:
            message["tool_calls"] = [plan.tool_call]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": plan.finish_reason,
        }
    else:
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": plan.finish_reason}
    payload = {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": plan.model,
        "choices": [choice],
        "usage": _usage(plan, n),
    }
    data = orjson.dumps(payload)
    if "malformed_chunk" in faults:
        record["outcome"] = "malformed_chunk"
        data = data[: len(data) // 2]
    record["status"] = 200
    return web.Response(body=data, content_type="application/json")


async def _stream(
    request: web.Request,
    sim: Sim,
    plan: _Plan,
    endpoint: str,
    body: dict[str, Any],
    faults: dict[str, str],
    record: dict[str, Any],
    stats: _ModelStats,
    started: float,
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    rid, _, obj = _ids(endpoint)
    created = int(time.time())
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    base = {"id": rid, "object": obj, "created": created, "model": plan.model}
    if include_usage:
        base["usage"] = None

    def event(choice: dict[str, Any] | None, usage: dict[str, Any] | None = None) -> bytes:
        chunk = dict(base, choices=[choice] if choice is not None else [])
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def choice_for(delta_text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if endpoint != "chat":
            return {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if first:
            delta = {"role": "assistant", "content": ""}
        elif delta_text is not None:
            delta = {"content": delta_text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    record["status"] = 200
    await asyncio.sleep(max(0.0, t0 + plan.ttft_s - loop.time()))
    first_at = loop.time()
    stats.ttft.observe(first_at - t0)
    step = max(1, sim.config.chunk_tokens)
    groups = ["".join(plan.pieces[i : i + step]) for i in range(0, len(plan.pieces), step)]
    reset_after = int(faults["reset_mid_stream"] or 1) if "reset_mid_stream" in faults else None
    malformed_after = int(faults["malformed_chunk"] or 1) if "malformed_chunk" in faults else None
    stall_after, stall_ms = None, None
    if "stall_mid_stream" in faults:
        raw_after, _, raw_ms = (faults["stall_mid_stream"] or "1").partition(":")
        stall_after, stall_ms = int(raw_after), float(raw_ms) if raw_ms else None
    if endpoint == "chat":
        await resp.write(event(choice_for(None, None, first=True)))
    if plan.tool_call is not None:
        call = dict(plan.tool_call, index=0)
        await resp.write(
            event({"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None})
        )
    for i, text in enumerate(groups):
        if i == reset_after:
            raise _abort(request, record, resp)
        if i == stall_after:
            record["outcome"] = "stall_mid_stream"
            if stall_ms is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(stall_ms / 1000.0)
        if i == malformed_after:
            record["outcome"] = "malformed_chunk"
            await resp.write(b"data: {not json\n\n")
        if i:
            delay = first_at + i * plan.itl_s * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        last = i == len(groups) - 1
        await resp.write(event(choice_for(text, plan.finish_reason if last else None)))
    if not groups:
        await resp.write(event(choice_for(None if endpoint == "chat" else "", plan.finish_reason)))
    if len(groups) > 1:
        stats.itl.observe((loop.time() - first_at) / (len(groups) - 1))
    stats.generation_tokens += len(plan.pieces)
    if include_usage:
        await resp.write(event(None, _usage(plan, len(plan.pieces))))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


def embedding_vector(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text``."""
    rng = random.Random(hashlib.blake2b(text.encode(), digest_size=8).digest())
    values = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


async def embeddings(request: web.Request) -> web.StreamResponse:
    sim = request.app[_STATE]
    denied = _check_key(sim, request)
    if denied is not None:
        return denied
    parsed = await _read_body(request)
    if isinstance(parsed, web.Response):
        return parsed
    body = parsed
    model = str(body.get("model") or "")
    profile = sim.profile(model)
    if profile is None:
        return _error(
            404, f"The model `{model}` does not exist.", "invalid_request_error", "model_not_found", "model"
        )
    raw = body.get("input")
    inputs: list[str]
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        inputs = list(raw)
    elif isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        inputs = [" ".join(map(str, raw))]
    elif isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):
        inputs = [" ".join(map(str, x)) for x in raw]
    else:
        return _error(400, "'input' must be a string or a list", "invalid_request_error", None, "input")
    sim.requests_total += 1
    sim.by_model[model] = sim.by_model.get(model, 0) + 1
    record = _record(sim, request, body, "embeddings")
    faults = sim.faults_for(model, request.headers.get("x-sim-fault"))
    failed = _fault_error(faults)
    if failed is not None:
        record.update(status=failed.status, outcome=next(iter(faults)))
        return failed
    dim = body.get("dimensions") if isinstance(body.get("dimensions"), int) else profile.embedding_dim
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    tokens = 0
    for i, text in enumerate(inputs):
        vector = embedding_vector(text, int(dim))  # type: ignore[arg-type]
        tokens += token_count(text.encode())
        encoded: Any = (
            base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if as_base64 else vector
        )
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    record.update(status=200, outcome="completed", prompt_tokens=tokens)
    sim.completed += 1
    payload = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


async def list_models(request: web.Request) -> web.Response:
    sim = request.app[_STATE]
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "switchyard-sim"}
        for name in sim.config.models
    ]
    return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


def _metric_lines(sim: Sim) -> Iterable[str]:
    def labels(model: str) -> str:
        return f'{{engine="0",model_name="{model}"}}'

    stats = sim.model_stats
    models = list(dict.fromkeys([*sim.config.models, *stats]))
    simple = (
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", "running"),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "waiting"),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            "cache_queries",
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            "cache_hits",
        ),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "prompt_tokens"),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            "generation_tokens",
        ),
    )
    for name, kind, help_text, attr in simple:
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} {kind}"
        for model in models:
            value = getattr(stats.get(model) or _ModelStats(), attr)
            yield f"{name}{labels(model)} {float(value)}"
    used = len(sim.cache._blocks) / max(1, sim.cache.capacity)
    yield "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage."
    yield "# TYPE vllm:kv_cache_usage_perc gauge"
    for model in models:
        yield f"vllm:kv_cache_usage_perc{labels(model)} {used}"
    hists = (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    )
    for name, help_text, attr in hists:
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} histogram"
        for model in models:
            hist: _Histogram = getattr(stats.get(model) or _ModelStats(), attr)
            base = f'engine="0",model_name="{model}"'
            for bound, count in zip(_HIST_BUCKETS, hist.counts, strict=True):
                yield f'{name}_bucket{{{base},le="{bound}"}} {float(count)}'
            yield f'{name}_bucket{{{base},le="+Inf"}} {float(hist.n)}'
            yield f"{name}_count{{{base}}} {float(hist.n)}"
            yield f"{name}_sum{{{base}}} {hist.total}"


async def metrics(request: web.Request) -> web.Response:
    text = "\n".join(_metric_lines(request.app[_STATE])) + "\n"
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def sim_stats(request: web.Request) -> web.Response:
    sim = request.app[_STATE]
    queries = sum(s.cache_queries for s in sim.model_stats.values())
    hits = sum(s.cache_hits for s in sim.model_stats.values())
    body = {
        "requests_total": sim.requests_total,
        "in_flight": sim.in_flight,
        "completed": sim.completed,
        "cancelled": sim.cancelled,
        "by_model": sim.by_model,
        "faults": sim.fault_counts,
        "prefix_cache": {"queries_tokens": queries, "hits_tokens": hits},
        "recent": list(sim.recent),
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def set_fault(request: web.Request) -> web.Response:
    sim = request.app[_STATE]
    parsed = await _read_body(request)
    if isinstance(parsed, web.Response):
        return parsed
    try:
        rule = FaultRule(
            model=str(parsed.get("model", "*")),
            fault=str(parsed["fault"]),
            rate=float(parsed.get("rate", 1.0)),
            count=None if parsed.get("count") is None else int(parsed["count"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return _error(400, f"bad fault rule: {exc}", "invalid_request_error", None)
    sim.faults.append(rule)
    return web.Response(body=orjson.dumps({"faults": len(sim.faults)}), content_type="application/json")


async def clear_faults(request: web.Request) -> web.Response:
    request.app[_STATE].faults.clear()
    return web.Response(body=b'{"faults": 0}', content_type="application/json")


async def reset(request: web.Request) -> web.Response:
    sim = request.app[_STATE]
    sim.reset_stats()
    sim.faults.clear()
    sim.cache.clear()
    return web.Response(body=b"{}", content_type="application/json")


def create_app(config: SimConfig) -> web.Application:
    """The simulator as an aiohttp application (serve it with handler cancellation on)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[_STATE] = Sim(config)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/sim/stats", sim_stats)
    app.router.add_post("/sim/faults", set_fault)
    app.router.add_delete("/sim/faults", clear_faults)
    app.router.add_post("/sim/reset", reset)
    return app


async def serve(config: SimConfig, host: str, port: int) -> web.AppRunner:
    """Start serving; returns the runner (``await runner.cleanup()`` stops it)."""
    # Handler cancellation: a client that goes away cancels its request, as in vLLM.
    runner = web.AppRunner(create_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    return runner


# --- command line -----------------------------------------------------------------------


def _parse_model(text: str) -> tuple[str, ModelProfile]:
    name, *numbers = text.split(":")
    values = [float(x) for x in numbers]
    profile = ModelProfile()
    if values:
        profile = replace(profile, ttft_ms=values[0])
    if len(values) > 1:
        profile = replace(profile, itl_ms=values[1])
    return name, profile


def _profile_fields(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if k == "output_tokens" else v for k, v in spec.items()}


def load_config_file(path: str) -> SimConfig:
    """A YAML mapping of :class:`SimConfig` fields; ``models`` maps names to profile fields."""
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    known = {f.name for f in fields(SimConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown simulator settings: {sorted(unknown)}")
    models = data.pop("models", None)
    faults = data.pop("faults", None)
    config = SimConfig(**data)
    if models is not None:
        config.models = {name: ModelProfile(**_profile_fields(spec or {})) for name, spec in models.items()}
    if faults is not None:
        config.faults = [FaultRule(**rule) for rule in faults]
    return config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's command-line flags (``switchyard sim`` and ``python -m local_backend.sim``)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--config", help="YAML file of simulator settings")
    parser.add_argument(
        "--model",
        action="append",
        metavar="NAME[:TTFT_MS[:ITL_MS]]",
        help="serve this model (repeatable; replaces sim-fast and sim-strong)",
    )
    parser.add_argument("--accept-any-model", action="store_true", default=None)
    parser.add_argument("--cache-model", choices=["vllm", "openai", "none"])
    parser.add_argument("--cache-blocks", type=int, help="prefix cache capacity in blocks")
    parser.add_argument("--cache-ttl-s", type=float)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--chunk-tokens", type=int)
    parser.add_argument(
        "--prefill-ms-per-1k", type=float, help="prefill time per 1,000 uncached tokens, every model"
    )
    parser.add_argument("--require-api-key")
    parser.add_argument("--fault", action="append", metavar="MODEL:SPEC[@RATE][#COUNT]")
    parser.add_argument("--seed", type=int)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    config = load_config_file(args.config) if args.config else SimConfig()
    if args.model:
        config.models = dict(_parse_model(m) for m in args.model)
    if args.prefill_ms_per_1k is not None:
        config.models = {
            n: replace(p, prefill_ms_per_1k_tokens=args.prefill_ms_per_1k) for n, p in config.models.items()
        }
    for attr, value in (
        ("accept_any_model", args.accept_any_model),
        ("cache_model", args.cache_model),
        ("cache_capacity_blocks", args.cache_blocks),
        ("cache_ttl_s", args.cache_ttl_s),
        ("max_num_seqs", args.max_num_seqs),
        ("chunk_tokens", args.chunk_tokens),
        ("require_api_key", args.require_api_key),
        ("seed", args.seed),
    ):
        if value is not None:
            setattr(config, attr, value)
    config.faults.extend(parse_fault_rule(f) for f in args.fault or ())
    return config


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM."""
    config = config_from_args(args)

    async def main() -> None:
        runner = await serve(config, args.host, args.port)
        print(f"switchyard-sim listening on http://{args.host}:{args.port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="switchyard sim", description="OpenAI-compatible simulator")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
