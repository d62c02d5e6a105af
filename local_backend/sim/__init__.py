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
``response_format`` json_object (or a json_schema that is any object):
``{"answer": "..."}``; any other json_schema: a value that validates against it, as long
as the schema makes it (:mod:`local_backend.sim._schema`, seeded by the prompt's hash).
``tool_choice`` ``"required"`` (first tool) or naming a function: one tool call whose
arguments validate against the tool's ``parameters``, ``finish_reason`` ``tool_calls``.
``logprobs``/``top_logprobs`` (chat) and ``logprobs`` (completions): per 4-character
token, in OpenAI's shapes, stream and not (:mod:`local_backend.sim._logprobs`).
``n`` > 1 and lists of prompts give one choice each.
Streams: a ``role`` chunk, then one chunk per ``chunk_tokens`` tokens (the last one
carries ``finish_reason``), then, only with ``stream_options.include_usage``, a chunk
with ``choices: []`` and ``usage`` (every earlier chunk then says ``"usage": null``),
then ``data: [DONE]``.

Tokens and the prefix cache (the rest of Switchyard relies on this exact definition):

- A chat request renders as a chat template would, by the gateway's own definition
  (:func:`gateway.prompt_render.render_chat`: tools as JSON in request order, then
  each message as ``<|role|>\\n{content}{tool_calls}\\n``), so the gateway's expected
  hits and the simulator's ``cached_tokens`` are counted over the same bytes. A
  completion's prompt is its text; token-id prompts are 4 bytes per id.
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
- Answering faults (what a broken server sends instead of an answer; nothing is
  generated): ``empty_200`` (a 200 with an empty body; stream: SSE headers, then the
  end, no event), ``error_200`` (a 200 whose body, or first event, is an error object),
  ``truncated_200`` (half of a valid body, or of the first event, then the end),
  ``invalid_200`` (a body, or a stream's third event, 0.3 s after the first two, that
  ends in ``}`` but is not JSON; the stream then goes on to ``[DONE]``),
  ``done_in_content`` (stream: content that contains ``data: [DONE]``, 0.3 s later
  another chunk, then the end without the real ``[DONE]``), ``done_no_close`` (stream:
  a short answer and ``[DONE]``, then the connection held open until the client leaves),
  ``headers_hang`` (200 headers, then nothing until the client leaves). Without a
  stream ``done_*`` answer normally. They speak OpenAI's wire format, on every endpoint
  (on ``/v1/responses`` a stream's good events are the Responses API's typed events, the
  bad one as it is).
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

from local_backend.sim._app import create_app
from local_backend.sim._cli import main, run
from local_backend.sim._config import (
    ModelProfile,
    SimConfig,
    add_arguments,
    config_from_args,
    config_from_mapping,
    load_config_file,
    parse_model_flag,
)
from local_backend.sim._control import SimControl
from local_backend.sim._faults import (
    FAULT_NAMES,
    FaultRule,
    FaultSpec,
    FaultSpecError,
    FaultTable,
    build_plan,
    parse_fault_rule,
    parse_fault_spec,
    parse_fault_specs,
)
from local_backend.sim._server import RunningSim, serve
from local_backend.sim._state import SIM_STATE, Admission, SimState
from local_backend.sim._stats import ModelMetrics, render_metrics
from local_backend.sim._thread import SimThread
from local_backend.sim._tokens import (
    BYTES_PER_TOKEN,
    JSON_MIN_TOKENS,
    PrefixCache,
    answer_text,
    block_hashes,
    cached_token_count,
    is_cacheable,
    json_answer,
    natural_length,
    token_count,
)

__all__ = [
    "BYTES_PER_TOKEN",
    "FAULT_NAMES",
    "JSON_MIN_TOKENS",
    "SIM_STATE",
    "Admission",
    "FaultRule",
    "FaultSpec",
    "FaultSpecError",
    "FaultTable",
    "ModelMetrics",
    "ModelProfile",
    "PrefixCache",
    "RunningSim",
    "SimConfig",
    "SimControl",
    "SimState",
    "SimThread",
    "add_arguments",
    "answer_text",
    "block_hashes",
    "build_plan",
    "cached_token_count",
    "config_from_args",
    "config_from_mapping",
    "create_app",
    "is_cacheable",
    "json_answer",
    "load_config_file",
    "main",
    "natural_length",
    "parse_fault_rule",
    "parse_fault_spec",
    "parse_fault_specs",
    "parse_model_flag",
    "render_metrics",
    "run",
    "serve",
    "token_count",
]
