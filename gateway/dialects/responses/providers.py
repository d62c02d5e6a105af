"""The provider a Responses API request is sent through, per deployment: passed through to
an upstream that serves ``/v1/responses`` (``responses_api: native``) or translated to chat
completions (``responses_api: translate``).

Either way the deployment's own provider stays underneath (its transport, its model name,
its error table); :class:`ResponsesProvider` only changes the endpoint, the body and how
the answer is read, so dispatch (retries, fallback, hedging, circuits) runs unchanged and
a fallback from a native deployment to a translated one just works.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.dialects.responses.answer import from_chat
from gateway.dialects.responses.native import NativeResponsesScanner
from gateway.dialects.responses.request import input_items, to_chat
from gateway.dialects.responses.stream import ChatToResponsesScanner
from gateway.dialects.responses.wire import chat_usage
from gateway.providers.base import Answer, CacheHints, PreparedRequest, Provider, Scanner
from gateway.providers.openai import check_answer
from gateway.providers.transport import TransportResponse

ResponsesApi = Literal["native", "translate"]

DEFAULT_RESPONSES_API: dict[str, ResponsesApi] = {"openai": "native"}
"""A deployment's ``responses_api`` when the policy sets none, by provider; any other
provider is ``translate`` (vLLM serves ``/v1/responses`` too, but chat is what every
version serves the same way)."""


def responses_api(provider: Provider) -> ResponsesApi:
    """Whether ``provider``'s deployment is passed Responses requests or gets them translated."""
    chosen = provider.deployment.responses_api
    if chosen is not None:
        return chosen
    return DEFAULT_RESPONSES_API.get(provider.deployment.provider, "translate")


@dataclass(slots=True)
class ResponsesRequestState:
    """One Responses request as the client sent it, and the stored conversation its
    ``previous_response_id`` continues (empty without one)."""

    request: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)

    def adapt(self, inner: Provider) -> Provider:
        """``inner`` as the provider of this request (dispatch calls this per attempt)."""
        return ResponsesProvider(inner, self, responses_api(inner))

    def routing_view(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The request as chat, for the router's features (prompt size, tools, format)."""
        try:
            return to_chat(dict(body), self.history, "the router")
        except Exception:  # an untranslatable request is still routed, on its model name
            return {"model": body.get("model"), "messages": []}


class ResponsesProvider(Provider):
    """A deployment's provider serving one Responses request, natively or translated.

    The upstream pool counts and retires providers by identity: this wrapper compares and
    hashes as the provider it wraps, so releasing it releases that one."""

    def __init__(self, inner: Provider, state: ResponsesRequestState, mode: ResponsesApi) -> None:
        # No Provider.__init__: the transport and names are the wrapped provider's own.
        self.inner = inner
        self.name = inner.name
        self.deployment = inner.deployment
        self.upstream_model = inner.upstream_model
        self.transport = inner.transport
        self.state = state
        self.mode = mode

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.inner

    def __hash__(self) -> int:
        return hash(self.inner)

    @property
    def ready(self) -> bool:
        return self.inner.ready

    def shown_model(self, requested_model: str | None) -> str | None:
        return self.inner.shown_model(requested_model)

    def status_failure(self, status: int) -> str:
        return self.inner.status_failure(status)

    def prepare(self, body: Mapping[str, Any], *, stream: bool, hints: CacheHints | None) -> PreparedRequest:
        if self.mode == "translate":
            chat = to_chat(dict(body), self.state.history, self.name)
            prepared = self.inner.prepare(chat, stream=stream, hints=hints)
            return PreparedRequest(prepared.body, strip_usage=False)
        out = dict(body, model=self.upstream_model)
        if self.state.history:
            # The gateway holds the conversation (any deployment may have answered its
            # earlier turns): the upstream gets it as input items.
            out.pop("previous_response_id", None)
            out["input"] = [*self.state.history, *input_items(out)]
        return PreparedRequest(out)

    def scanner(self, *, strip_usage: bool, shown_model: str | None) -> Scanner:
        if self.mode == "translate":
            inner = self.inner.scanner(strip_usage=False, shown_model=None)
            return ChatToResponsesScanner(self.state.request, inner, shown_model)
        return NativeResponsesScanner(
            model_from=self.upstream_model if shown_model is not None else None,
            model_to=shown_model,
            previous_response_id=self._expanded_previous_id(),
        )

    def _expanded_previous_id(self) -> str | None:
        """The ``previous_response_id`` the gateway replaced by input items (native mode)."""
        previous = self.state.request.get("previous_response_id")
        return previous if self.state.history and isinstance(previous, str) else None

    def read_answer(
        self, body: bytes, content_type: str, shown_model: str | None, *, endpoint: str | None = None
    ) -> Answer:
        # Either way the upstream's body is checked first: a 200 that is no answer is a failure.
        if self.mode == "translate":
            answer = self.inner.read_answer(body, content_type, None, endpoint="/chat/completions")
            response = from_chat(self.state.request, orjson.loads(answer.body), shown_model)
            return Answer(orjson.dumps(response), answer.usage)
        obj = check_answer(self.name, body, "/responses")
        usage = chat_usage(obj.get("usage"))
        previous = self._expanded_previous_id()
        if (shown_model is not None and "model" in obj) or previous is not None:
            if shown_model is not None and "model" in obj:
                obj["model"] = shown_model
            if previous is not None:
                obj["previous_response_id"] = previous
            return Answer(orjson.dumps(obj), usage)
        return Answer(body, usage)

    async def send(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float | None,
    ) -> TransportResponse:
        target = "/chat/completions" if self.mode == "translate" else endpoint
        return await self.inner.send(target, body, headers=headers, connect_timeout_s=connect_timeout_s)

    async def close(self) -> None:
        await self.inner.close()
