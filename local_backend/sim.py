"""An OpenAI-compatible simulator: the upstream of Switchyard's tests and benchmarks.

``switchyard sim --port 8001`` or ``python -m local_backend.sim --port 8001``; in code
:func:`create_app`, :func:`serve` or :class:`SimThread`.

Endpoints, in OpenAI's wire format: ``POST /v1/chat/completions`` and
``POST /v1/completions`` (stream and not), ``POST /v1/embeddings`` (``float`` or
``base64``, ``dimensions``), ``GET /v1/models``; vLLM's ``GET /health`` (200, empty) and
``GET /metrics`` (vLLM V1 names, labels ``model_name`` and ``engine``). Control API for
tests: ``GET /sim/stats``, ``GET|POST|DELETE /sim/faults``, ``POST /sim/reset``.

Latency: a request first waits for one of the model's ``max_num_seqs`` slots (FIFO);
its first token comes ``ttft_ms`` (+ ``prefill_ms_per_1k_tokens`` per 1,000 *uncached*
prompt tokens, + any ``slow_first_token`` fault) after it got the slot, every later token
``itl_ms`` after the previous one (``jitter_ms``: std-dev of both, seeded). A non-stream
answer arrives when its last token is ready: TTFT + ITL * (n - 1). Deadlines are
absolute (``loop.time()``), so sleeps do not drift; with ``itl_ms`` 0 nothing sleeps.

Answers: ``n`` tokens of a fixed English sentence read in order from a word chosen by a
hash of the prompt, 4 bytes per token; ``n`` is drawn from ``output_tokens`` by the same
hash, cut by ``max_completion_tokens``/``max_tokens`` (``finish_reason`` ``length``).
``response_format`` json_object/json_schema: ``{"answer": "..."}``. ``tool_choice``
``"required"`` (first tool) or naming a function: one tool call with arguments ``"{}"``,
``finish_reason`` ``tool_calls``. ``n`` > 1 and lists of prompts give one choice each.
Streams: a ``role`` chunk, then one chunk per ``chunk_tokens`` tokens (the last one
carries ``finish_reason``), then, only with ``stream_options.include_usage``, a chunk
with ``choices: []`` and ``usage`` (every earlier chunk then says ``"usage": null``),
then ``data: [DONE]``.

Tokens and the prefix cache (the rest of Switchyard relies on this exact definition):

- A chat request renders as a chat template would: each tool as ``orjson.dumps`` of the
  request's tool object, in request order, no separator; then each message as
  ``<|role|>\\n{content}{tool_calls}\\n`` where content is the string, or the text parts
  concatenated with every other part as its ``orjson.dumps``, and ``tool_calls`` (when
  present) is ``orjson.dumps`` of the message's list. A completion's prompt is its text;
  token-id prompts are 4 bytes per id.
- A token is 4 bytes of that UTF-8 text: ``prompt_tokens = ceil(len / 4)``.
- A cache block is ``block_tokens`` tokens (64 bytes by default). Blocks are hashed as a
  chain, ``h[i] = blake2b(h[i-1] + block_i, digest_size=16)`` (``h[-1]`` empty, or the
  digest of the request's ``cache_salt``), so a change at byte ``p`` invalidates every
  block from ``p // 64`` on. Only full blocks are cached. Each model has its own cache.
- ``vllm``: cached tokens = leading blocks found in an LRU of ``cache_capacity_blocks``
  blocks, times ``block_tokens``, capped at the largest multiple of ``block_tokens``
  below ``prompt_tokens`` (vLLM always computes the last token). After the lookup every
  full block is inserted or touched, tail first, so a chain's tail is evicted first.
- ``openai``: the same chain and cap, but prompts under 1,024 tokens are neither
  counted nor stored, and hits are floored to 128-token steps (zero below 1,024).
- ``none``: ``cached_tokens`` is always 0.
- ``cache_ttl_s`` (any mode): an entry not touched for that long is gone.
- ``/metrics``: ``vllm:prefix_cache_queries_total += prompt_tokens`` and
  ``vllm:prefix_cache_hits_total += cached_tokens``, per model.

Faults: header ``x-sim-fault: SPEC[, SPEC...]``, or per model with ``--fault
MODEL:SPEC[@RATE][#COUNT]`` and ``POST /sim/faults {"model", "fault", "rate", "count"}``
(``model`` ``*`` is every model; ``rate`` a probability per request from the seeded RNG;
``count`` at most that many injections, then the rule is dropped). SPEC is ``name`` or
``name=value``:

- ``error=STATUS`` (4xx/5xx, default 500), ``rate_limit=SECONDS`` (429, ``Retry-After``,
  ``retry-after-ms``, ``x-ratelimit-remaining-requests: 0``; type ``requests``, code
  ``rate_limit_exceeded`` as OpenAI sends; default 1 s), ``context_length`` (400,
  ``context_length_exceeded``), ``hang`` (no response headers, ever, until the client
  leaves). The first of these given wins and nothing is generated.
- ``slow_first_token=MS`` (default 1000): MS more before the first token (stream) or the
  response (non-stream).
- ``reset_mid_stream=K`` (default 1): after K content chunks the TCP connection is
  aborted: no terminating chunk, no ``[DONE]``. Non-stream: aborted when K chunks' worth
  of tokens are ready, before any response byte.
- ``stall_mid_stream=K`` or ``K:MS`` (default 1): after K chunks nothing more is sent,
  until the client leaves, or for MS and then the stream goes on (later tokens shift by
  MS). Non-stream: the response is late by as much (or never comes).
- ``malformed_chunk=K`` (default 1): a ``data: {not json`` event after K chunks, then the
  stream goes on to ``[DONE]``. Non-stream: a 200 whose body is ``{not json``.
- ``empty``: empty content, ``finish_reason`` stop. ``bad_json``: the content is a
  truncated ``{"answer": "...`` (JSON requested or not). ``length=N`` (default 3): the
  answer stops after N tokens with ``finish_reason`` length.

K counts content chunks over all choices; K=0 fires before the opening (role) event, so
nothing valid precedes the fault; a K at or past the last chunk fires after the
last one (before the usage chunk and ``[DONE]``). Embeddings honour only the first four
kinds and ``slow_first_token``. Every injected fault is counted in ``/sim/stats``.

``/sim/stats``: ``requests_total``, ``in_flight``, ``completed``, ``cancelled`` (the
client left before the end), ``aborted`` (``reset_mid_stream``), ``by_model``,
``faults`` (injections by name), ``prefix_cache {queries_tokens, hits_tokens}`` and
``recent``: the last 500 API requests, oldest first, each with ``seq``, ``endpoint``,
``model``, ``stream``, ``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
``status``, ``outcome`` (``in_flight``, ``completed``, ``cancelled``, or the first fault's
name), ``faults``, ``x-request-id``, ``traceparent``, ``authorization`` (a header was
sent: bool), ``body_keys`` (sorted top-level keys of the body), ``stream_options``,
``prompt_cache_key``, ``started_at`` (unix s) and ``duration_ms``. ``POST /sim/reset``
clears stats, fault rules, caches and metrics, and re-seeds the RNGs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from local_backend._sim_app import build_app, embedding_vector
from local_backend._sim_config import (
    ModelProfile,
    SimConfig,
    add_arguments,
    config_from_args,
    config_from_mapping,
    load_config_file,
    parse_model_flag,
)
from local_backend._sim_faults import (
    FAULT_NAMES,
    FaultRule,
    FaultSpec,
    FaultSpecError,
    parse_fault_rule,
    parse_fault_spec,
    parse_fault_specs,
)
from local_backend._sim_state import SIM_STATE, SimState
from local_backend._sim_tokens import (
    BYTES_PER_TOKEN,
    PrefixCache,
    block_hashes,
    cached_token_count,
    render_chat,
    token_count,
)

__all__ = [
    "BYTES_PER_TOKEN",
    "FAULT_NAMES",
    "SIM_STATE",
    "FaultRule",
    "FaultSpec",
    "FaultSpecError",
    "ModelProfile",
    "PrefixCache",
    "RunningSim",
    "SimConfig",
    "SimControl",
    "SimState",
    "SimThread",
    "add_arguments",
    "block_hashes",
    "cached_token_count",
    "config_from_args",
    "config_from_mapping",
    "create_app",
    "embedding_vector",
    "load_config_file",
    "main",
    "parse_fault_rule",
    "parse_fault_spec",
    "parse_fault_specs",
    "parse_model_flag",
    "render_chat",
    "run",
    "serve",
    "token_count",
]

SHUTDOWN_TIMEOUT_S = 1.0


def create_app(config: SimConfig) -> web.Application:
    """The simulator as an aiohttp application.

    Serve it with ``handler_cancellation=True`` (as :func:`serve` and aiohttp's test
    server do): that is how a client that goes away cancels its request and is counted
    ``cancelled``. The state is ``app[SIM_STATE]``.
    """
    return build_app(config)


class RunningSim:
    """A simulator serving on a socket; :meth:`stop` ends it."""

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self.runner = runner
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """``http://host:port`` (the control API and ``/health`` live here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``.../v1``."""
        return self.url + "/v1"

    @property
    def state(self) -> SimState:
        """The live state (for in-process tests)."""
        return self.runner.app[SIM_STATE]

    async def stop(self) -> None:
        """Close the listener and every open connection (hanging requests included)."""
        await self.runner.cleanup()


async def serve(config: SimConfig, host: str = "127.0.0.1", port: int = 8001) -> RunningSim:
    """Start serving ``config`` on ``host:port`` (0: a free port, see ``.port``)."""
    # No access log: it would cost more than a simulated request.
    runner = web.AppRunner(
        create_app(config), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if port == 0 and runner.addresses else port
    return RunningSim(runner, host, int(bound))


class SimControl:
    """A small synchronous client of the control API (``/sim/...``) over real HTTP."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
            return json.loads(resp.read() or b"null")

    def stats(self) -> dict[str, Any]:
        """``GET /sim/stats``."""
        result: dict[str, Any] = self._call("GET", "/sim/stats")
        return result

    def reset(self) -> None:
        """``POST /sim/reset``: stats, fault rules, caches and metrics start over."""
        self._call("POST", "/sim/reset", {})

    def add_fault(self, model: str, fault: str, rate: float = 1.0, count: int | None = None) -> list[Any]:
        """``POST /sim/faults``; returns the rules now in force."""
        body = {"model": model, "fault": fault, "rate": rate, "count": count}
        rules: list[Any] = self._call("POST", "/sim/faults", body)["faults"]
        return rules

    def faults(self) -> list[Any]:
        """``GET /sim/faults``."""
        rules: list[Any] = self._call("GET", "/sim/faults")["faults"]
        return rules

    def clear_faults(self) -> None:
        """``DELETE /sim/faults``."""
        self._call("DELETE", "/sim/faults")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class SimThread:
    """A simulator on its own event loop in a daemon thread, for synchronous tests::

    with SimThread(SimConfig(cache_model="openai")) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="x")
    """

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or SimConfig()
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: RunningSim | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="switchyard-sim", daemon=True)

    @property
    def url(self) -> str:
        """``http://host:port`` (the port is known once started)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``.../v1``."""
        return self.url + "/v1"

    @property
    def control(self) -> SimControl:
        """A control-API client for this simulator."""
        return SimControl(self.url)

    def _main(self) -> None:
        loop = _loop_factory()()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            self._running = await serve(self.config, self.host, self.port)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self.port = self._running.port
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._running.stop()

    def start(self, timeout_s: float = 10.0) -> SimThread:
        """Start and wait until it listens."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("the simulator did not start")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn: Callable[[SimState], Any]) -> Any:
        """Run ``fn(state)`` on the simulator's loop and return its result."""

        async def invoke() -> Any:
            assert self._running is not None
            return fn(self._running.state)

        return self._submit(invoke())

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def __enter__(self) -> SimThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run(args: argparse.Namespace) -> int:
    """Serve the flags' config until SIGINT/SIGTERM (``switchyard sim``). Prints
    ``switchyard-sim listening on http://HOST:PORT`` once it listens."""
    try:
        config = config_from_args(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"switchyard sim: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        running = await serve(config, args.host, args.port)
        print(f"switchyard-sim listening on {running.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await running.stop()

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    except OSError as exc:  # the port is taken, the host does not exist, ...
        print(f"switchyard sim: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m local_backend.sim [flags]``."""
    parser = argparse.ArgumentParser(prog="switchyard sim", description="OpenAI-compatible simulator")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
