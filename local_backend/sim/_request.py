"""Request parsing and validation, OpenAI-shaped errors, and the fault answers."""

from __future__ import annotations

import asyncio
import math
import struct
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from local_backend.sim._canned import ANSWERING, Canned
from local_backend.sim._config import ModelProfile
from local_backend.sim._faults import (
    NO_FAULTS,
    FaultPlan,
    FaultSpec,
    FaultSpecError,
    build_plan,
    parse_fault_specs,
)
from local_backend.sim._logprobs import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS
from local_backend.sim._state import SimState

MAX_LIST_INPUTS = 2048
MAX_CONTEXT_TOKENS = 8192  # only quoted by the context_length fault's message
FAULT_HEADER = "x-sim-fault"
JSON_TYPE = "application/json"
dumps = orjson.dumps

_SERVER_MESSAGES = {
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The server is overloaded or not ready yet.",
    504: "Gateway timeout.",
}


class SimError(Exception):
    """An error answer in OpenAI's shape; ``outcome`` names the fault that caused it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        outcome: str = "completed",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or ("server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.outcome = outcome

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return web.Response(
            status=self.status, body=dumps(body), content_type=JSON_TYPE, headers=self.headers
        )


class Reset(Exception):
    """The connection was aborted on purpose (``reset_mid_stream``)."""


def missing(param: str) -> SimError:
    return SimError(
        400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def invalid(param: str, expected: str, value: object) -> SimError:
    got = type(value).__name__ if value is not None else "null"
    return SimError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str) -> SimError:
    return SimError(400, f"Invalid '{param}': {message}", param=param, code="invalid_value")


def _fault_error(spec: FaultSpec, prompt_tokens: int, param: str) -> SimError:
    if spec.name == "rate_limit":
        seconds = spec.retry_after_s
        return SimError(
            429,
            f"Rate limit reached for requests (simulated). Please try again in {seconds:g}s.",
            type_="requests",
            code="rate_limit_exceeded",
            headers={
                "Retry-After": str(math.ceil(seconds)),
                "retry-after-ms": str(round(seconds * 1000)),
                "x-ratelimit-limit-requests": "60",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": f"{seconds:g}s",
            },
            outcome="rate_limit",
        )
    if spec.name == "context_length":
        return SimError(
            400,
            f"This model's maximum context length is {MAX_CONTEXT_TOKENS} tokens. However, your messages "
            f"resulted in {max(prompt_tokens, MAX_CONTEXT_TOKENS + 1)} tokens. Please reduce the length of "
            "the messages.",
            param=param,
            code="context_length_exceeded",
            outcome="context_length",
        )
    status = spec.status
    message = _SERVER_MESSAGES.get(status, f"Simulated error (HTTP {status}).")
    return SimError(status, message, outcome="error")


# --- request parsing --------------------------------------------------------------------


@dataclass(slots=True)
class Call:
    """One API request on its way through a handler."""

    state: SimState
    request: web.Request
    record: dict[str, Any]
    response: web.StreamResponse | None = None


def check_auth(call: Call) -> None:
    key = call.state.config.require_api_key
    if key is None:
        return
    given = call.request.headers.get("Authorization", "")
    if given != f"Bearer {key}":
        shown = given.removeprefix("Bearer ").strip()
        detail = (
            f"Incorrect API key provided: {shown[:3]}***{shown[-4:]}."
            if shown
            else "You didn't provide an API key."
        )
        raise SimError(401, detail, code="invalid_api_key")


async def read_json(call: Call) -> dict[str, Any]:
    raw = await call.request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise SimError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
            "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
            "valid JSON.)",
        ) from None
    if not isinstance(body, dict):
        raise SimError(400, "The request body must be a JSON object.")
    record = call.record
    record["body_keys"] = sorted(body)
    record["stream"] = body.get("stream") is True
    record["stream_options"] = body.get("stream_options")
    record["prompt_cache_key"] = body.get("prompt_cache_key")
    record["cache_control"] = _cache_control_marks(body.get("messages"))
    return body


def _cache_control_marks(messages: Any) -> list[str]:
    """Where the request marked cache breakpoints (Anthropic-style ``cache_control`` on a
    content part), as ``"message:part"``; recorded so a client's marks can be checked."""
    marks: list[str] = []
    if not isinstance(messages, list):
        return marks
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            marks += [
                f"{i}:{j}"
                for j, part in enumerate(content)
                if isinstance(part, dict) and "cache_control" in part
            ]
    return marks


def require_model(call: Call, body: dict[str, Any]) -> tuple[str, ModelProfile]:
    model = body.get("model")
    if model is None:
        raise missing("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "a non-empty string", model)
    call.record["model"] = model
    profile = call.state.profile(model)
    if profile is None:
        raise SimError(
            404,
            f"The model `{model}` does not exist or you do not have access to it.",
            code="model_not_found",
        )
    call.state.stats.count_model(model)
    return model, profile


def int_param(body: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(name, "an integer", value)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid_value(name, f"expected a value {bound}, but got {value} instead.")
    return value


def stream_params(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", "a boolean", stream)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("stream_options", "an object", options)
        if not stream:
            raise SimError(
                400,
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
                code="invalid_value",
            )
    include_usage = bool(stream) and isinstance(options, dict) and options.get("include_usage") is True
    return bool(stream), include_usage


def max_tokens_param(body: dict[str, Any]) -> int | None:
    newer = int_param(body, "max_completion_tokens", 1)
    older = int_param(body, "max_tokens", 1)
    return newer if newer is not None else older


def wants_json(body: dict[str, Any]) -> bool:
    fmt = body.get("response_format")
    if fmt is None:
        return False
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid_value("response_format", "type must be one of 'text', 'json_object', 'json_schema'.")
    return bool(kind != "text")


def response_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema of a ``json_schema`` response format (None for any other format)."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("response_format.json_schema", "an object", spec)
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid("response_format.json_schema.schema", "an object", schema)
    return schema


def tool_parameters(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``parameters`` schema of the tool ``name`` (an empty object schema if it has none)."""
    for tool in body.get("tools") or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            if isinstance(parameters, dict):
                return parameters
    return {"type": "object", "properties": {}}


def logprobs_param(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives per token the request asks for, or None if it asks for no
    logprobs (chat: ``logprobs: true`` and ``top_logprobs``; completions: ``logprobs: k``)."""
    if not chat:
        return int_param(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise invalid("logprobs", "a boolean", wanted)
    top = int_param(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise invalid_value("top_logprobs", "'logprobs' must be set to true when 'top_logprobs' is used.")
    return (top or 0) if wanted else None


def forced_tool(body: dict[str, Any]) -> str | None:
    """The function a request forces (``tool_choice`` "required" or naming one), else None."""
    choice = body.get("tool_choice")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("tools", "an array", tools)
    if choice is None or choice in ("auto", "none"):
        return None
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise invalid_value("tool_choice", "a named tool choice needs function.name.")
        return name
    if choice != "required":
        raise invalid_value("tool_choice", "expected 'none', 'auto', 'required' or a named function.")
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"])
    raise SimError(
        400, "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        param="tool_choice",
    )  # fmt: skip


def check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        raise missing("messages")
    if not isinstance(messages, list):
        raise invalid("messages", "an array", messages)
    if not messages:
        raise SimError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
            "array instead.",
            param="messages",
            code="empty_array",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}]", "an object", message)
        if not isinstance(message.get("role"), str):
            raise missing(f"messages[{i}].role")


def _token_ids(value: list[Any], param: str) -> bytes:
    # A token id is one token, so it is 4 bytes of prompt: token_count() stays len(ids).
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31 for x in value):
        raise invalid_value(param, "token ids must be integers in [0, 2**31).")
    return struct.pack(f"<{len(value)}i", *value)


def prompt_list(value: object, param: str) -> list[bytes]:
    """A string, a list of strings, a token-id list or a list of token-id lists -> prompts."""
    if value is None:
        raise missing(param)
    if isinstance(value, str):
        return [value.encode("utf-8", "surrogatepass")]
    if not isinstance(value, list) or not value:
        raise invalid(param, "a string or a non-empty array", value)
    if len(value) > MAX_LIST_INPUTS:
        raise invalid_value(param, f"at most {MAX_LIST_INPUTS} inputs, got {len(value)}.")
    if all(isinstance(x, str) for x in value):
        return [x.encode("utf-8", "surrogatepass") for x in value]
    if all(isinstance(x, int) for x in value):
        return [_token_ids(value, param)]
    if all(isinstance(x, list) and x for x in value):
        return [_token_ids(x, param) for x in value]
    raise invalid(param, "strings or token-id arrays", value)


def fault_plan(call: Call, model: str, generation: bool) -> FaultPlan:
    header = call.request.headers.get(FAULT_HEADER)
    specs: list[FaultSpec] = []
    if header:
        try:
            specs = parse_fault_specs(header)
        except FaultSpecError as exc:
            raise SimError(400, f"Invalid {FAULT_HEADER} header: {exc}", param=FAULT_HEADER) from None
    specs.extend(call.state.faults.draw(model))
    plan = build_plan(specs, generation)
    if plan is not NO_FAULTS:
        call.record["faults"] = list(plan.names)
        call.state.stats.count_faults(plan.names)
    return plan


async def forever() -> None:
    """Wait until the client goes away (the handler is cancelled then)."""
    await asyncio.get_running_loop().create_future()


async def sleep_until(loop: asyncio.AbstractEventLoop, deadline: float) -> None:
    # Absolute deadlines: a late wake-up shortens the next sleep instead of adding up.
    delay = deadline - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def reject(plan: FaultPlan, prompt_tokens: int, param: str) -> None:
    spec = plan.reject
    if spec is None:
        return
    if spec.name == "hang":
        await forever()
    if spec.name in ANSWERING:
        raise Canned(spec.name)
    raise _fault_error(spec, prompt_tokens, param)


def abort(call: Call) -> Reset:
    transport = call.request.transport
    if transport is not None:
        transport.abort()
    return Reset()
