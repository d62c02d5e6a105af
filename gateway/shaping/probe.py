"""What a vLLM deployment's chat template accepts, asked of the deployment itself.

vLLM renders a chat request with the model's chat template, and many templates raise on a
system message anywhere but first; others take one anywhere. Instead of assuming the least
(``end_of_system``), the gateway asks each ``vllm`` deployment once per policy (and model)
through vLLM's ``POST /tokenize`` with ``messages``: it applies the chat template and
tokenizes, generating nothing, and answers an error where the template raises. A placement
is accepted when every conversation it produces renders and its late system message is in
the prompt (more tokens than without it: a template that silently drops a late system
message must not get one). The latest accepted placement is used; a deployment whose
``/tokenize`` does not answer keeps its default. For a vLLM Switchyard launches from a
model directory, the model's own chat template is rendered first
(:mod:`gateway.shaping.chat_template`), so the placement is known before vLLM is up. A
``shaping.deployment_placement`` the policy sets wins over both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from gateway.replicas.policy import replica_urls
from gateway.shaping.chat_template import PLAIN, PROBES, render_placement
from gateway.shaping.policy import Placement
from gateway.shaping.tokens import launched_model_dir

if TYPE_CHECKING:
    from gateway.policy import Deployment, Policy

_PROBE_TIMEOUT_S = 10.0
_RETRIES, _RETRY_S = 60, 10.0  # a deployment that does not answer yet: asked for 10 minutes


def tokenize_url(base_url: str) -> str:
    """vLLM's ``/tokenize``: at the server's root, beside the ``/v1`` API prefix."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/tokenize"


async def _count(
    session: aiohttp.ClientSession, url: str, model: str, messages: list[Any], headers: dict[str, str]
) -> int | None:
    """The prompt's token count as the deployment's chat template renders ``messages``; None
    when it refuses them (or does not answer)."""
    body = {"model": model, "messages": messages, "add_generation_prompt": True}
    async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
        if response.status != 200:
            return None
        answer = await response.json(loads=orjson.loads)
    count = answer.get("count") if isinstance(answer, dict) else None
    return count if isinstance(count, int) else None


async def probe_placement(
    session: aiohttp.ClientSession, base_url: str, model: str, headers: dict[str, str] | None = None
) -> Placement | None:
    """The latest placement the deployment at ``base_url`` renders for ``model``;
    ``end_of_system`` when it renders none; None when its ``/tokenize`` does not answer (not
    vLLM, an old vLLM, down): then nothing is known."""
    try:
        return await _probe_once(session, base_url, model, headers)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def _probe_once(
    session: aiohttp.ClientSession, base_url: str, model: str, headers: dict[str, str] | None
) -> Placement | None:
    """:func:`probe_placement`, a connection error raised (the caller may try again later)."""
    url = tokenize_url(base_url)
    sent = {"Content-Type": "application/json", **(headers or {})}
    try:
        if await _count(session, url, model, PLAIN, sent) is None:
            return None  # not even a plain conversation: no answer from this endpoint
        for placement, conversations in PROBES:
            for without, with_late in conversations:
                plain = await _count(session, url, model, without, sent)
                late = await _count(session, url, model, with_late, sent)
                if plain is None or late is None or late <= plain:
                    break  # refused, or the late message silently dropped
            else:
                return placement
    except aiohttp.ClientConnectionError:
        raise
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return "end_of_system"


class ProbedPlacements:
    """Per deployment, the placement its ``/tokenize`` accepted (the process's: every policy
    snapshot reads it). ``version`` changes with each answer, so that compiled placements
    (:class:`~gateway.shaping.placement.Placements`) know to compile again."""

    def __init__(self) -> None:
        self.found: dict[tuple[str, str, str], Placement] = {}
        self.version = 0
        self._asked: set[tuple[str, str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def placement(self, name: str, spec: Deployment) -> Placement | None:
        """What deployment ``name`` was found to accept (None: not asked, or no answer)."""
        return self.found.get(_key(name, spec))

    def ask(self, policy: Policy) -> None:
        """Probe, in the background, each ``vllm`` deployment of ``policy`` not asked before
        whose placement the policy does not set (outside an event loop: nothing is asked)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for name, spec in policy.deployments.items():
            key = _key(name, spec)
            if spec.provider != "vllm" or key in self._asked or name in policy.shaping.deployment_placement:
                continue
            self._asked.add(key)
            self._read_template(key, spec)
            task = loop.create_task(self._probe(key, spec))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _read_template(self, key: tuple[str, str, str], spec: Deployment) -> None:
        """For a vLLM Switchyard launches from a model directory: what its chat template
        renders, known before vLLM answers (:mod:`gateway.shaping.chat_template`)."""

        model_dir = launched_model_dir(spec)
        if model_dir is None:
            return
        found = render_placement(model_dir)
        if found is not None:
            self.found[key] = found
            self.version += 1

    async def _probe(self, key: tuple[str, str, str], spec: Deployment) -> None:
        headers = dict(spec.headers)
        api_key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        timeout = aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S * len(PROBES) * 4)
        found: Placement | None = None
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for _ in range(_RETRIES):
                try:
                    found = await _probe_once(session, key[1], key[2], headers)
                except aiohttp.ClientConnectionError:
                    # Not up yet (a vLLM Switchyard launched takes minutes to start): later.
                    await asyncio.sleep(_RETRY_S)
                    continue
                break
        if found is not None:
            self.found[key] = found
            self.version += 1

    async def settled(self) -> None:
        """Wait for the probes under way (tests, shutdown)."""
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _key(name: str, spec: Deployment) -> tuple[str, str, str]:
    """A deployment's probe key: its name, the URL asked (the first replica's) and the model."""
    return name, replica_urls(spec)[0], spec.model or name


PROBED = ProbedPlacements()
"""The process's probed placements."""
