"""The served model's own token counts, for a vLLM Switchyard launched from a model directory.

Such a directory carries the model's tokenizer (``tokenizer.json``), which the ``tokenizers``
library reads offline (the ``chat-templates`` extra; the ``embeddings`` extra brings it too).
It is loaded once per model, in a worker thread, when a policy that names the deployment is
first used, never on a request's path; a template's stable prefix (its tools and the head's
stable units) is counted once, also in a worker thread, and kept by its prefix hash. Until a
count is there (and for every deployment whose tokenizer Switchyard cannot read) the
shaping header gives the calibrated estimate (:class:`~gateway.cachestats.prefix.Geometries`).

Each count also tells the deployment's bytes per token on its own prompts' stable text: the
expectations of cached tokens (the ``x-switchyard-prefix-hit`` header and the statistics)
use that ratio, measured with the model's tokenizer, instead of the one calibrated from
the deployment's replies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from gateway.cachestats.prefix import GEOMETRY, Geometries

if TYPE_CHECKING:
    from gateway.policy import Deployment, Policy

_log = structlog.get_logger("switchyard.shaping")

_KEPT = 4096
"""Stable prefixes counted per process (a template's requests share one)."""


def launched_model_dir(spec: Deployment) -> Path | None:
    """The model directory of a vLLM Switchyard launches (None: not launched, or a hub name)."""
    model = (spec.launch.model if spec.launch is not None else None) or spec.model
    if spec.launch is None or not model:
        return None
    path = Path(model)
    return path if path.is_dir() else None


def load_tokenizer(model_dir: Path) -> Any | None:
    """The model's ``tokenizer.json`` as a ``tokenizers.Tokenizer`` (None when the directory has
    none, it does not parse, or the library is not installed)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        _log.info(
            "shaping.tokenizer_unavailable",
            model_dir=str(model_dir),
            hint="install the chat-templates extra (pip install 'switchyard[chat-templates]') to count"
            " tokens with the model's own tokenizer; estimating bytes per token until then",
        )
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises its own Exception subclass on a bad file
        _log.warning("shaping.tokenizer_unreadable", path=str(path), error=str(exc))
        return None


def count_tokens(tokenizer: Any, texts: tuple[str | bytes, ...]) -> int:
    """Tokens of ``texts`` with the model's tokenizer, without the special tokens it adds."""
    decoded = [t.decode() if isinstance(t, bytes) else t for t in texts]
    return sum(len(tokenizer.encode(text, add_special_tokens=False).ids) for text in decoded if text)


class ModelTokenizers:
    """Per deployment, its model's tokenizer (loaded in the background) and the stable
    prefixes it has counted. State changes on the event loop's thread only; the work runs in
    the loop's default executor."""

    def __init__(self, geometry: Geometries | None = None) -> None:
        self.geometry = GEOMETRY if geometry is None else geometry
        self._model_of: dict[str, Path] = {}  # deployment -> its model directory
        self._tokenizers: dict[Path, Any] = {}  # loaded (None: tried, none usable)
        self._counts: OrderedDict[tuple[Path, str], int] = OrderedDict()
        self._counting: set[tuple[Path, str]] = set()
        self._totals: dict[Path, tuple[int, int]] = {}  # bytes and tokens counted, per model
        self._tasks: set[asyncio.Future[Any]] = set()

    def ask(self, policy: Policy) -> None:
        """Load, in the background, the tokenizer of each launched vLLM deployment of
        ``policy`` not loaded before (outside an event loop: nothing is loaded)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        for name, spec in policy.deployments.items():
            model_dir = launched_model_dir(spec) if spec.provider == "vllm" else None
            if model_dir is None:
                self._model_of.pop(name, None)
                continue
            self._model_of[name] = model_dir
            if model_dir in self._tokenizers:
                self._use_ratio(name, model_dir)
                continue
            self._tokenizers[model_dir] = None  # asked: not again
            future = loop.run_in_executor(None, load_tokenizer, model_dir)
            self._track(future, lambda f, d=model_dir: self._loaded(d, f.result()))

    def _track(self, future: asyncio.Future[Any], done: Any) -> None:
        self._tasks.add(future)

        def finished(f: asyncio.Future[Any]) -> None:
            self._tasks.discard(f)
            if not f.cancelled() and f.exception() is None:
                done(f)

        future.add_done_callback(finished)

    def _loaded(self, model_dir: Path, tokenizer: Any | None) -> None:
        self._tokenizers[model_dir] = tokenizer

    def stable_tokens(self, deployment: str, prefix_hash: str, texts: tuple[str | bytes, ...]) -> int | None:
        """The stable prefix's tokens (``texts``: its tools' JSON and the head's stable text)
        with ``deployment``'s own tokenizer, once counted; None until then (the count is
        started in the background) or where there is no tokenizer."""
        model_dir = self._model_of.get(deployment)
        tokenizer = self._tokenizers.get(model_dir) if model_dir is not None else None
        if tokenizer is None or model_dir is None or not prefix_hash:
            return None
        key = (model_dir, prefix_hash)
        found = self._counts.get(key)
        if found is not None:
            self._counts.move_to_end(key)
            return found
        if key not in self._counting:
            self._counting.add(key)
            size = sum(len(t) if isinstance(t, bytes) else len(t.encode()) for t in texts)
            future = asyncio.get_running_loop().run_in_executor(None, count_tokens, tokenizer, texts)
            self._track(future, lambda f: self._counted(key, size, f.result()))
        return None

    def _counted(self, key: tuple[Path, str], size: int, tokens: int) -> None:
        self._counting.discard(key)
        self._counts[key] = tokens
        while len(self._counts) > _KEPT:
            self._counts.popitem(last=False)
        if tokens:
            held_bytes, held_tokens = self._totals.get(key[0], (0, 0))
            self._totals[key[0]] = (held_bytes + size, held_tokens + tokens)
            for name, model_dir in self._model_of.items():
                if model_dir == key[0]:
                    self._use_ratio(name, model_dir)

    def _use_ratio(self, deployment: str, model_dir: Path) -> None:
        """The deployment's bytes per token, as its tokenizer measured them (if it has)."""
        size, tokens = self._totals.get(model_dir, (0, 0))
        if tokens:
            self.geometry.use_tokenizer_ratio(deployment, size / tokens)

    async def settled(self) -> None:
        """Wait for the loads and counts under way (tests, shutdown)."""
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)


TOKENIZERS = ModelTokenizers()
"""The process's model tokenizers."""
