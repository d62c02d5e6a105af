"""Chat and completions generation: the answer, its timeline, and both wire formats."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from local_backend.sim._answers import Choice, Output, make_choice
from local_backend.sim._config import ModelProfile
from local_backend.sim._faults import FaultPlan
from local_backend.sim._logprobs import chat_logprobs, completion_logprobs
from local_backend.sim._request import (
    JSON_TYPE,
    Call,
    abort,
    dumps,
    fault_plan,
    forced_tool,
    forever,
    int_param,
    logprobs_param,
    max_tokens_param,
    reject,
    response_schema,
    sleep_until,
    stream_params,
    tool_parameters,
    wants_json,
)
from local_backend.sim._tokens import (
    BYTES_PER_TOKEN,
    block_hashes,
    cached_token_count,
    choice_seed,
    is_cacheable,
    prompt_seed,
    token_count,
)

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_DONE = b"data: [DONE]\n\n"
_MALFORMED = b"data: {not json\n\n"


class _Events:
    """SSE events of one stream; content chunks are spliced from prebuilt bytes because
    they are the hot loop of a benchmark."""

    def __init__(self, chat: bool, rid: str, created: int, model: str, include_usage: bool) -> None:
        obj = b"chat.completion.chunk" if chat else b"text_completion"
        self.head = (
            b'data: {"id":' + dumps(rid) + b',"object":"' + obj + b'","created":' + str(created).encode()
            + b',"model":' + dumps(model) + b',"choices":['
        )  # fmt: skip
        self.tail = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"
        self.open = b'"delta":{"content":' if chat else b'"text":'
        self.close = b"}" if chat else b""

    def content(self, index: int, piece: str, finish: str | None) -> bytes:
        fin = b"null" if finish is None else b'"' + finish.encode() + b'"'
        return (
            self.head + b'{"index":' + str(index).encode() + b"," + self.open + dumps(piece) + self.close
            + b',"logprobs":null,"finish_reason":' + fin + b"}" + self.tail
        )  # fmt: skip

    def choice(self, choice: dict[str, Any]) -> bytes:
        return self.head + dumps(choice) + self.tail

    def usage(self, usage: dict[str, Any]) -> bytes:
        return self.head + b'],"usage":' + dumps(usage) + b"}\n\n"


class _Generation:
    """One chat or completions request after validation: its timeline and its answer."""

    def __init__(
        self,
        call: Call,
        chat: bool,
        model: str,
        profile: ModelProfile,
        prompts: list[bytes],
        salt: bytes,
        plan: FaultPlan,
        top_logprobs: int | None = None,
    ) -> None:
        self.call = call
        self.chat = chat
        self.top_logprobs = top_logprobs  # None: no logprobs asked for
        self.model = model
        self.profile = profile
        self.prompts = prompts
        self.salt = salt
        self.plan = plan
        self.metrics = call.state.metrics_for(model)
        self.prompt_tokens = sum(token_count(p) for p in prompts)
        self.cached_tokens = 0
        self.choices: list[Choice] = []
        self.loop = asyncio.get_running_loop()
        self.arrival = self.loop.time()
        self.first_at = self.arrival
        self.itl_s = 0.0
        self.offsets: list[float] | None = None  # per-token offsets from first_at, with jitter
        self.max_tokens_out = 0
        self.counted_tokens = 0  # generation tokens already in the metrics (a stream counts as it goes)
        self.shift_s = 0.0  # added to every later deadline by a stall that resumes

    # timeline

    def prefill(self) -> None:
        """Look the prompts up in the model's prefix cache (and insert them): ``cached_tokens``."""
        state = self.call.state
        config = state.config
        mode = config.cache_model
        if mode != "none" and config.cache_capacity_blocks > 0:
            cache = state.cache_for(self.model)
            block_bytes = config.block_tokens * BYTES_PER_TOKEN
            now = self.loop.time()
            for prompt in self.prompts:
                tokens = token_count(prompt)
                hashes = block_hashes(prompt, block_bytes, self.salt)
                matched = cache.match(hashes, now)
                self.cached_tokens += cached_token_count(matched, tokens, config.block_tokens, mode)
                if is_cacheable(tokens, mode):
                    cache.insert(hashes, now)
        stats = state.stats
        stats.queries_tokens += self.prompt_tokens
        stats.hits_tokens += self.cached_tokens
        metrics = self.metrics
        metrics.prompt_tokens += self.prompt_tokens
        metrics.cache_queries += self.prompt_tokens
        metrics.cache_hits += self.cached_tokens
        self.call.record["cached_tokens"] = self.cached_tokens

    def schedule(self, admitted: float) -> None:
        """Fix the time of the first token and of every later one."""
        profile = self.profile
        state = self.call.state
        uncached = self.prompt_tokens - self.cached_tokens
        ttft_s = state.jittered_s(profile.ttft_ms, profile.jitter_ms)
        ttft_s += (
            profile.prefill_ms_per_1k_tokens * uncached / 1000.0 + self.plan.slow_first_token_ms
        ) / 1000.0
        self.first_at = admitted + ttft_s
        self.max_tokens_out = max((c.tokens for c in self.choices), default=0)
        gaps = max(0, self.max_tokens_out - 1)
        if profile.jitter_ms > 0 and gaps:
            offsets = [0.0]
            total = 0.0
            for _ in range(gaps):
                total += state.jittered_s(profile.itl_ms, profile.jitter_ms)
                offsets.append(total)
            self.offsets = offsets
        else:
            self.itl_s = profile.itl_ms / 1000.0
        self.metrics.queue.observe(admitted - self.arrival)
        self.metrics.ttft.observe(self.first_at - self.arrival)

    def token_at(self, i: int) -> float:
        """When token ``i`` (0-based, any choice) is ready."""
        if i <= 0:
            return self.first_at + self.shift_s
        offset = self.offsets[i] if self.offsets is not None else i * self.itl_s
        return self.first_at + offset + self.shift_s

    def chunk_at(self, chunks: int) -> float:
        """When the first ``chunks`` content chunks are out (the first token for 0)."""
        if chunks <= 0 or self.max_tokens_out == 0:
            return self.token_at(0)
        size = self.call.state.config.chunk_tokens
        return self.token_at(min(chunks * size, self.max_tokens_out) - 1)

    async def stall(self) -> None:
        if self.plan.stall_ms is None:
            await forever()
        else:
            await asyncio.sleep(self.plan.stall_ms / 1000.0)
            self.shift_s += self.plan.stall_ms / 1000.0

    def finish_metrics(self) -> None:
        metrics = self.metrics
        completion = sum(c.tokens for c in self.choices)
        metrics.generation_tokens += completion - self.counted_tokens
        self.call.record["completion_tokens"] = completion
        if self.choices:
            reason = self.choices[0].finish_reason
            metrics.finished[reason] = metrics.finished.get(reason, 0) + 1
        if self.max_tokens_out > 1:
            if self.offsets is None:
                metrics.itl.observe(self.itl_s, self.max_tokens_out - 1)
            else:
                for prev, nxt in zip(self.offsets, self.offsets[1:], strict=False):
                    metrics.itl.observe(nxt - prev)
        metrics.e2e.observe(self.loop.time() - self.arrival)

    def usage(self) -> dict[str, Any]:
        completion = sum(c.tokens for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    # answers

    def _logprobs(self, choice: Choice, text: str, first_token: int) -> dict[str, Any] | None:
        top = self.top_logprobs
        if top is None or choice.tool_name is not None:
            return None
        if self.chat:
            return chat_logprobs(text, first_token, top)
        return completion_logprobs(text, first_token, top, first_token * BYTES_PER_TOKEN)

    def _choice_body(self, choice: Choice) -> dict[str, Any]:
        logprobs = self._logprobs(choice, choice.text, 0)
        if not self.chat:
            return {
                "index": choice.index,
                "text": choice.text,
                "logprobs": logprobs,
                "finish_reason": choice.finish_reason,
            }
        message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
        if choice.tool_name is not None:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": choice.tool_id,
                    "type": "function",
                    "function": {"name": choice.tool_name, "arguments": choice.text},
                }
            ]
        return {
            "index": choice.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }

    async def unary(self) -> web.Response:
        plan = self.plan
        call = self.call
        if plan.reset_after is not None:
            await sleep_until(self.loop, self.chunk_at(plan.reset_after))
            raise abort(call)
        if plan.stall_after is not None:
            await sleep_until(self.loop, self.chunk_at(plan.stall_after))
            await self.stall()
        await sleep_until(self.loop, self.token_at(self.max_tokens_out - 1))
        state = call.state
        body = {
            "id": state.new_id("chatcmpl-" if self.chat else "cmpl-"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [self._choice_body(c) for c in self.choices],
            "usage": self.usage(),
        }
        data = _MALFORMED[6:-2] if plan.malformed_after is not None else dumps(body)
        self.finish_metrics()
        call.record["status"] = 200
        state.stats.finish(call.record, plan.outcome)
        return web.Response(body=data, content_type=JSON_TYPE)

    def _opening(self, events: _Events) -> list[bytes]:
        """The events due with the first token: role chunks, and the end of empty choices."""
        out: list[bytes] = []
        for choice in self.choices:
            if self.chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""}
                if choice.tool_name is not None:
                    function = {"name": choice.tool_name, "arguments": ""}
                    delta["content"] = None
                    delta["tool_calls"] = [
                        {"index": 0, "id": choice.tool_id, "type": "function", "function": function}
                    ]
                out.append(
                    events.choice(
                        {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}
                    )
                )
            if choice.tokens == 0:
                end: dict[str, Any] = {"index": choice.index}
                if self.chat:
                    end["delta"] = {}
                else:
                    end["text"] = ""
                end.update(logprobs=None, finish_reason=choice.finish_reason)
                out.append(events.choice(end))
        return out

    def _piece(self, events: _Events, choice: Choice, first_token: int, final: bool) -> bytes:
        if choice.tool_name is not None:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": choice.text}}]}
            return events.choice(
                {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": "tool_calls"}
            )
        start = first_token * BYTES_PER_TOKEN
        size = self.call.state.config.chunk_tokens * BYTES_PER_TOKEN
        piece = choice.text[start:] if final else choice.text[start : start + size]
        finish = choice.finish_reason if final else None
        if self.top_logprobs is None:
            return events.content(choice.index, piece, finish)
        # Off the benchmark's hot path: only a request that asks for logprobs builds this.
        body: dict[str, Any] = {"index": choice.index}
        if self.chat:
            body["delta"] = {"content": piece}
        else:
            body["text"] = piece
        body.update(logprobs=self._logprobs(choice, piece, first_token), finish_reason=finish)
        return events.choice(body)

    async def stream(self, include_usage: bool) -> web.StreamResponse:
        call = self.call
        state = call.state
        plan = self.plan
        loop = self.loop
        resp = call.response
        assert resp is not None
        rid = state.new_id("chatcmpl-" if self.chat else "cmpl-")
        events = _Events(self.chat, rid, int(time.time()), self.model, include_usage)
        chunk_tokens = state.config.chunk_tokens
        faulty = (
            plan.reset_after is not None or plan.stall_after is not None or plan.malformed_after is not None
        )
        stalled = malformed = False
        written = 0
        # Events wait here until the stream has to sleep: events that are due together go
        # out in one write (with itl 0, the whole answer), which is what TCP would make of
        # them anyway.
        pending: list[bytes] = []

        async def flush() -> None:
            if pending:
                data = b"".join(pending)
                pending.clear()
                await resp.write(data)

        async def wait_until(deadline: float) -> None:
            if deadline > loop.time():
                await flush()
                await sleep_until(loop, deadline)

        async def before_chunk() -> None:
            # Mid-stream faults fire when content chunk K+1 is due (or after the last one).
            nonlocal stalled, malformed
            if plan.reset_after is not None and written >= plan.reset_after:
                await flush()
                raise abort(call)
            if plan.stall_after is not None and not stalled and written >= plan.stall_after:
                stalled = True
                await flush()
                await self.stall()
            if plan.malformed_after is not None and not malformed and written >= plan.malformed_after:
                malformed = True
                pending.append(_MALFORMED)

        await wait_until(self.first_at)
        if faulty:
            await before_chunk()  # a fault after 0 chunks comes before the opening event
        pending.extend(self._opening(events))
        steps = -(-self.max_tokens_out // chunk_tokens)
        for step in range(steps):
            first = step * chunk_tokens
            await wait_until(self.token_at(min(first + chunk_tokens, self.max_tokens_out) - 1))
            for choice in self.choices:
                if choice.tokens <= first:
                    continue
                final = first + chunk_tokens >= choice.tokens
                if choice.tool_name is not None and not final:
                    continue  # a tool call's arguments go out whole, with its last token
                if faulty:
                    await before_chunk()
                pending.append(self._piece(events, choice, first, final))
                written += 1
                # As vLLM's counter, which grows at every engine step, not at the end.
                step_tokens = min(chunk_tokens, choice.tokens - first)
                self.metrics.generation_tokens += step_tokens
                self.counted_tokens += step_tokens
        if faulty:
            await before_chunk()
        if include_usage:
            pending.append(events.usage(self.usage()))
        pending.append(_DONE)
        await flush()
        await resp.write_eof()
        self.finish_metrics()
        state.stats.finish(call.record, plan.outcome)
        return resp


def chat_output(body: dict[str, Any]) -> Output:
    """What a chat body asks the answer to be: JSON (to its schema), a forced tool call, or text."""
    tool_name = forced_tool(body)
    return Output(
        json_object=wants_json(body),
        schema=response_schema(body),
        tool_name=tool_name,
        tool_parameters=tool_parameters(body, tool_name) if tool_name is not None else None,
    )


async def generate(
    call: Call,
    *,
    chat: bool,
    model: str,
    profile: ModelProfile,
    prompts: list[bytes],
    body: dict[str, Any],
    param: str,
) -> web.StreamResponse:
    stream, include_usage = stream_params(body)
    max_tokens = max_tokens_param(body)
    n = int_param(body, "n", 1, 128) or 1
    output = chat_output(body) if chat else Output()
    top_logprobs = logprobs_param(body, chat)
    salt_value = body.get("cache_salt")
    salt = salt_value.encode() if isinstance(salt_value, str) else b""
    plan = fault_plan(call, model, generation=True)
    gen = _Generation(call, chat, model, profile, prompts, salt, plan, top_logprobs)
    call.record["prompt_tokens"] = gen.prompt_tokens
    await reject(plan, gen.prompt_tokens, param)
    state = call.state
    for p_index, prompt in enumerate(prompts):
        seed = prompt_seed(prompt)
        for j in range(n):
            index = p_index * n + j
            gen.choices.append(
                make_choice(index, choice_seed(seed, index), profile, max_tokens, output, plan)
            )
    if stream:
        # Headers go out at once, as vLLM's do; the first event waits for the first token.
        call.response = web.StreamResponse(headers=_SSE_HEADERS)
        await call.response.prepare(call.request)
        call.record["status"] = 200
    admission = state.admission_for(model)
    await admission.acquire()
    try:
        gen.prefill()
        gen.schedule(gen.loop.time())
        if stream:
            return await gen.stream(include_usage)
        return await gen.unary()
    finally:
        admission.release()
