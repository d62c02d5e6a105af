"""AWS Bedrock's dialect: the Converse and ConverseStream APIs behind the gateway's chat completions.

A chat-completions request is translated to a Converse request
(:mod:`gateway.dialects.bedrock.request`, cache points placed like Anthropic's breakpoints),
POSTed to ``/model/{modelId}/converse`` or ``/model/{modelId}/converse-stream`` and signed
with SigV4 (service ``bedrock``) by botocore, the one place this adapter uses it: imported
when a Bedrock deployment is built, credentials from the standard chain (environment,
profile, container or instance role) resolved off the event loop. The answer, or its binary
event stream, comes back as chat completions (:mod:`gateway.dialects.bedrock.response`).

Errors: Bedrock names the error in ``x-amzn-ErrorType`` (or the body's ``__type``); the body
is rewritten to OpenAI's error object, and the status to what the error means for dispatch:
``ThrottlingException`` 429 (rate limited, retried after a backoff), ``ModelNotReadyException``
(429 on the wire) 503, ``ModelTimeoutException`` (408) 504, ``ModelErrorException`` (424) 502,
``ServiceUnavailableException`` 503, ``ValidationException`` 400 (the client's, relayed),
``AccessDeniedException``/``UnrecognizedClientException`` 403 (the gateway's credentials:
``upstream_auth_failed``, raised here with an AWS hint).
A stream that opens with an exception frame is read as that error (:func:`open_stream`).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson
from yarl import URL

from gateway.dialects.bedrock.eventstream import EventStreamDecoder, EventStreamError
from gateway.dialects.bedrock.request import (
    CACHE_POINT_SECTIONS,
    cache_sections,
    model_family,
    to_converse_request,
    unsupported,
)
from gateway.dialects.bedrock.response import ConverseStreamScanner, error_body, to_chat_completion
from gateway.dispatch.failures import failure
from gateway.errors import SwitchyardError
from gateway.providers.base import Answer, CacheHints, PreparedRequest, Provider, json_answer, wants_usage
from gateway.providers.bedrock_policy import INSTALL_HINT, BedrockSettings
from gateway.providers.transport import HttpTransport, Transport, TransportResponse

if TYPE_CHECKING:
    from gateway.policy import Deployment

SERVICE = "bedrock"
"""The SigV4 service name of the Bedrock runtime."""

STATUS_OF = {
    "ModelNotReadyException": 503,
    "ModelTimeoutException": 504,
    "ModelErrorException": 502,
    "ModelStreamErrorException": 502,
    "ServiceUnavailableException": 503,
    "ThrottlingException": 429,
    "ValidationException": 400,
}
"""Bedrock errors whose wire status says something else to dispatch than what they mean (and
the status of a stream that opens with one of them as an exception frame; any other: 500)."""


class _Converse(dict[str, Any]):
    """A prepared Converse body, and whether it goes to the stream endpoint."""

    def __init__(self, body: dict[str, Any], *, stream: bool) -> None:
        super().__init__(body)
        self.stream = stream


class _Refused(dict[str, Any]):
    """A request the deployment cannot take: :meth:`BedrockProvider.send` raises its error,
    inside the attempt, so the connection accounting around a send stays as it is."""

    def __init__(self, error: SwitchyardError) -> None:
        super().__init__()
        self.error = error


class _ErrorAnswer(TransportResponse):
    """A Bedrock error answer: its body as OpenAI's error object, its status as it means."""

    def __init__(self, resp: TransportResponse, status: int, body: bytes) -> None:
        self._resp = resp
        self.status = status
        self.headers = resp.headers
        self._body = body

    async def read(self) -> bytes:
        return self._body

    async def _none(self) -> AsyncIterator[bytes]:
        yield self._body

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self._none()

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


class _Replayed(TransportResponse):
    """A stream whose first bytes were read to see its first frame: they come first again."""

    def __init__(self, resp: TransportResponse, head: list[bytes], rest: AsyncIterator[bytes]) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers
        self._head = head
        self._rest = rest

    async def read(self) -> bytes:
        return b"".join(self._head) + await self._resp.read()

    def iter_chunks(self) -> AsyncIterator[bytes]:
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        # A plain iterator, not an async generator: nothing left for the loop to finalise.
        if self._head:
            return self._head.pop(0)
        return await anext(self._rest)

    def complete(self) -> bool:
        return not self._head and self._resp.complete()

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


async def open_stream(resp: TransportResponse) -> TransportResponse:
    """``resp`` (a ConverseStream answer) once its first frame arrived: an exception frame
    there (``throttlingException`` ...) becomes the error answer it stands for, so dispatch
    treats it like the HTTP error of the same name (a throttled stream is rate limited: a
    backoff, not a fault of the deployment). A corrupt or cut first frame is left to the
    stream scanner, which reports it."""
    chunks = resp.iter_chunks()
    decoder = EventStreamDecoder()
    head: list[bytes] = []
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        head.append(chunk)
        try:
            messages = decoder.feed(chunk)
        except EventStreamError:
            break
        if not messages:
            continue
        first = messages[0]
        if first.header(":message-type") in ("exception", "error"):
            name = first.header(":exception-type") or first.header(":error-code") or "InternalServerException"
            kind = name[:1].upper() + name[1:]
            status, body = translate_error(
                STATUS_OF.get(kind, 500), {"x-amzn-ErrorType": kind}, first.payload
            )
            return _ErrorAnswer(resp, status, body)
        break
    return _Replayed(resp, head, chunks)


def error_kind(headers: Mapping[str, str], body: Any) -> str:
    """The Bedrock error's name (``ThrottlingException``) from its header or its body."""
    kind = headers.get("x-amzn-ErrorType") or headers.get("X-Amzn-Errortype") or ""
    if not kind and isinstance(body, dict):
        kind = str(body.get("__type") or body.get("code") or "")
    # "ThrottlingException:http://internal..." or "com.amazon.coral.service#ThrottlingException"
    return kind.split(":")[0].rpartition("#")[2]


def translate_error(status: int, headers: Mapping[str, str], data: bytes) -> tuple[int, bytes]:
    """A Bedrock error answer's status (as dispatch should read it) and OpenAI-shaped body."""
    try:
        body = orjson.loads(data) if data else {}
    except orjson.JSONDecodeError:
        body = {"message": data[:500].decode("utf-8", "replace")}
    kind = error_kind(headers, body) or f"HTTP {status}"
    message = body.get("message") or body.get("Message") if isinstance(body, dict) else None
    status = STATUS_OF.get(kind, status)
    return status, orjson.dumps(error_body(kind, str(message or ""), status))


class _Signer:
    """SigV4 for one deployment: botocore's signer and the credentials of the standard chain
    (or the profile the policy names), resolved on first use and refreshed in a thread."""

    def __init__(self, settings: BedrockSettings) -> None:
        try:
            # Imported here, by name: only a Bedrock deployment needs botocore (it ships no types).
            session = importlib.import_module("botocore.session")
            self._auth = importlib.import_module("botocore.auth").SigV4Auth
            self._request = importlib.import_module("botocore.awsrequest").AWSRequest
        except ImportError:
            raise RuntimeError(f"provider bedrock needs botocore: {INSTALL_HINT}") from None
        self._session = session.Session(profile=settings.profile)
        self._region = settings.region
        self._credentials: Any = None
        self._lock = asyncio.Lock()

    async def _frozen(self) -> Any:
        credentials = self._credentials
        if credentials is None or getattr(credentials, "refresh_needed", lambda: False)():
            async with self._lock:
                # The chain may read files or ask an instance endpoint: never on the loop.
                if self._credentials is None:
                    self._credentials = await asyncio.to_thread(self._session.get_credentials)
                if self._credentials is None:
                    return None
                return await asyncio.to_thread(self._credentials.get_frozen_credentials)
        return credentials.get_frozen_credentials()

    async def headers(self, name: str, url: str, payload: bytes) -> dict[str, str]:
        """The signature headers of a POST of ``payload`` (JSON) to ``url``."""
        frozen = await self._frozen()
        if frozen is None or not frozen.access_key:
            raise failure(
                "upstream_auth_failed",
                f"deployment '{name}' found no AWS credentials: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, bedrock.profile or AWS_PROFILE, or run with a role",
            )
        request = self._request("POST", url, data=payload, headers={"Content-Type": "application/json"})
        self._auth(frozen, SERVICE, self._region).add_auth(request)
        return {k: v for k, v in request.headers.items() if k.lower() != "content-type"}


class BedrockProvider(Provider):
    """``provider: bedrock``: ``model`` is the model id (or inference profile), ``bedrock:``
    the region, credentials profile and endpoint (see :mod:`gateway.providers.bedrock_policy`)."""

    def __init__(self, name: str, deployment: Deployment, transport: Transport | None = None) -> None:
        settings = deployment.bedrock
        if settings is None:  # the policy check requires it; a hand-built deployment may not
            raise ValueError(f"deployment '{name}': provider bedrock needs a bedrock: section")
        self._signer = _Signer(settings)
        # Credentials are SigV4 only: never an API key as a bearer header.
        super().__init__(name, deployment.model_copy(update={"api_key_env": None}), transport)
        self.deployment = deployment
        self._path = f"/model/{quote(self.upstream_model, safe='')}"

    @property
    def places_cache_points(self) -> bool:
        """Whether the gateway adds cache points: ``cache_breakpoints`` when the policy sets it,
        else on for the model families with prompt caching (Claude, Nova); other models
        answer a cache point with a ValidationException."""
        chosen = self.deployment.cache_breakpoints
        if chosen is not None:
            return chosen
        return model_family(self.upstream_model) in CACHE_POINT_SECTIONS

    @property
    def cache_sections(self) -> tuple[str, ...]:
        """Where this model takes cache points at all (a client's marks included)."""
        return cache_sections(self.upstream_model, cache_breakpoints=self.deployment.cache_breakpoints)

    def prepare(self, body: Mapping[str, Any], *, stream: bool, hints: CacheHints | None) -> PreparedRequest:
        try:
            request = to_converse_request(
                body,
                model_id=self.upstream_model,
                structured_outputs=self.deployment.structured_outputs,
                cache_points=self.places_cache_points,
                min_cache_tokens=self.deployment.min_cache_tokens,
                sections=self.cache_sections,
                stable_chars=hints.head_stable_chars if hints is not None else 0,
                stable_parts=hints.head_stable_parts if hints is not None else 0,
            )
        except SwitchyardError as exc:
            return PreparedRequest(_Refused(exc))
        return PreparedRequest(
            _Converse(request, stream=stream), strip_usage=stream and not wants_usage(body)
        )

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        if isinstance(body, _Refused):
            raise body.error
        if endpoint != "/chat/completions":
            raise unsupported("endpoint", f"{endpoint} has no Converse equivalent")
        path = self._path + ("/converse-stream" if getattr(body, "stream", False) else "/converse")
        # The transport serialises the same mapping the same way: the signed bytes are the sent ones.
        url = self.deployment.base_url + path
        if isinstance(self.transport, HttpTransport):
            # aiohttp's URL parsing decodes %3A in a path: sign the path it will send.
            url = str(URL(url))
        signed = await self._signer.headers(self.name, url, orjson.dumps(body))
        resp = await self.transport.send(
            path, body, headers={**headers, **signed}, connect_timeout_s=connect_timeout_s
        )
        if resp.status < 400:
            return await open_stream(resp) if getattr(body, "stream", False) else resp
        data = await resp.read()
        status, translated = translate_error(resp.status, resp.headers, data)
        if status in (401, 403):
            resp.release()
            raise self._refused_credentials(orjson.loads(translated)["error"]["code"])
        return _ErrorAnswer(resp, status, translated)

    def _refused_credentials(self, kind: str) -> SwitchyardError:
        # The shared row's hint names api_key_env; here it is AWS credentials and IAM. Bedrock's
        # own text is left out: a signature error spells out the request it signed.
        return failure(
            "upstream_auth_failed",
            f"deployment '{self.name}' was refused by Bedrock ({kind}): check the gateway's AWS "
            f"credentials and that they may call bedrock:InvokeModel on {self.upstream_model}",
        )

    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> ConverseStreamScanner:
        return ConverseStreamScanner(strip_usage=strip_usage, model=shown_model or self.upstream_model)

    def read_answer(
        self, body: bytes, content_type: str, shown_model: str | None, *, endpoint: str | None = None
    ) -> Answer:
        name = self.name
        answer = json_answer(name, body)
        output = answer.get("output") if isinstance(answer, dict) else None
        if not isinstance(output, dict) or not isinstance(output.get("message"), dict):
            raise failure(
                "invalid_answer",
                f"deployment '{name}' answered 200 with something other than a Converse answer",
            )
        completion = to_chat_completion(answer, shown_model or self.upstream_model)
        return Answer(orjson.dumps(completion), completion["usage"])
