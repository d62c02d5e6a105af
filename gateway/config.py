"""Settings from the environment, policy loading with located errors, and hot reload.

A loaded policy is compiled once into an immutable :class:`PolicySnapshot`: the raw
config as validated (``policy``) beside the runtime objects built from it (the router,
the prompt shaper, the resolved timeouts). A request takes the current snapshot once, at
its start, and keeps it to the end, so swapping in a reloaded policy never disturbs
requests in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog
import yaml
from pydantic import BaseModel, Field, ValidationError

from gateway.dispatch.policy import Timeouts
from gateway.policy import Policy
from gateway.routing.resolve import Router
from gateway.shaping.placement import Placements
from gateway.shaping.shaper import PolicyShaper
from gateway.validation import Issue, files_relative_to

_log = structlog.get_logger("switchyard.config")

EMBEDDED_POLICY = Path(__file__).with_name("embedded_policy.yaml")
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class Settings(BaseModel):
    """Process settings, read from ``SWITCHYARD_*`` environment variables (and ``REDIS_URL``)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    policy: str | None = None
    redis_url: str | None = None
    workers: int = Field(1, ge=1, le=256)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    reload_interval_s: float = Field(0.5, gt=0)
    admin_key: str | None = Field(None, repr=False)
    sim_port: int = Field(0, ge=0, le=65535)
    auth: Literal["auto", "keys", "none"] = "auto"
    insecure_no_auth: bool = False
    key_cache_s: float = Field(10.0, ge=0)
    allowed_origins: str = ""
    """Comma-separated web origins (``https://app.example.com``; ``*``: any) that may call
    the gateway from a browser; others are refused where no key guards the endpoint."""
    max_messages: int = Field(2048, ge=1)
    max_content_parts: int = Field(512, ge=1)
    max_json_depth: int = Field(64, ge=4, le=1000)
    drain_timeout_s: float = Field(30.0, ge=0)
    redis_request_timeout_ms: float = Field(50.0, gt=0)
    """The longest a request waits for Redis (its key check, its rate-limit check)."""
    cache_view_max_keys: int = Field(200_000, ge=0)
    """The most response cache keys this process keeps a local view of (0: no view)."""
    cache_view_max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """The most bytes of response cache entries this process holds in its local view."""
    request_header_timeout_s: float = Field(10.0, gt=0)
    """The longest a client may take to send a request's headers (the connection is closed)."""
    request_body_timeout_s: float = Field(30.0, gt=0)
    """The longest a client may take to send a request's body (408 past it)."""
    heartbeat_s: float = Field(2.0, gt=0)
    """How often this gateway writes its heartbeat to Redis (``/admin/fleet``)."""
    policy_from_redis: bool = False
    """Serve the policy last pushed to Redis (``switchyard policy push``) instead of the file."""

    def auth_mode(self) -> Literal["keys", "none"]:
        """``keys`` (a virtual key on every /v1 request) or ``none``. ``auto`` is ``none`` on a
        loopback bind and ``keys`` on any other address. ``none`` on a non-loopback address
        is refused unless ``insecure_no_auth`` says it is meant: a gateway holding paid API
        keys must not serve the network without keys by accident."""
        if self.auth == "auto":
            return "none" if is_loopback(self.host) else "keys"
        if self.auth == "none" and not is_loopback(self.host) and not self.insecure_no_auth:
            raise ValueError(
                f"auth 'none' on the non-loopback address {self.host} would let anyone spend through "
                "this gateway: use SWITCHYARD_AUTH=keys, bind 127.0.0.1, or pass --insecure-no-auth"
            )
        return self.auth

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``env`` (default ``os.environ``); explicit ``overrides`` win when not None."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(f"SWITCHYARD_{name.upper()}")
            if raw not in (None, ""):
                values[name] = raw
        if "redis_url" not in values and env.get("REDIS_URL"):
            values["redis_url"] = env["REDIS_URL"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PolicyError(Exception):
    """A policy that cannot be used; ``issues`` lists every problem found."""

    def __init__(self, source: str, issues: list[Issue]) -> None:
        self.source = source
        self.issues = issues
        super().__init__(f"{source}: " + "; ".join(str(i) for i in issues))


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """A validated policy compiled for serving: immutable, swapped whole on reload.

    Constructing one compiles it: the router (its classifier built), the prompt shaper
    (its detectors compiled) and the timeouts of every deployment in every tier are built
    here, once per load, never per request. A new per-policy runtime object (say the
    deployments' provider adapters) is one more ``init=False`` field set in
    ``__post_init__``.
    """

    policy: Policy
    source: str
    digest: str
    version: int
    loaded_at: float = field(default_factory=time.time)
    router: Router = field(init=False, repr=False, compare=False)
    """Routes a request body to a tier and its deployments (``router.resolve(...)``)."""
    shaper: PolicyShaper = field(init=False, repr=False, compare=False)
    """Shapes a chat body per ``policy.shaping``."""
    cache_active: bool = field(init=False, repr=False, compare=False)
    """Whether any request may use the response cache (``policy.cache.active``, read once:
    the request path's one check when it is off)."""
    _timeouts: dict[tuple[str, str | None], Timeouts] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        policy = self.policy
        # frozen: the compiled fields are set once, here, and never again
        object.__setattr__(self, "router", Router(policy))
        object.__setattr__(self, "shaper", PolicyShaper(policy.shaping, Placements.of(policy)))
        object.__setattr__(self, "cache_active", policy.cache.active)
        tiers: list[str | None] = [None, *policy.tiers]
        object.__setattr__(
            self,
            "_timeouts",
            {(name, tier): policy.timeouts_for(name, tier) for name in policy.deployments for tier in tiers},
        )

    def timeouts(self, deployment: str, tier: str | None = None) -> Timeouts:
        """The resolved timeouts of an attempt on ``deployment`` for ``tier`` (see
        :meth:`Policy.timeouts_for`), computed at load."""
        found = self._timeouts.get((deployment, tier))
        return found if found is not None else self.policy.timeouts_for(deployment, tier)


def interpolate_env(text: str, env: Mapping[str, str]) -> str:
    """Replace ``${VAR}`` and ``${VAR:-default}``; an unset variable without a default stays as written."""

    def sub(match: re.Match[str]) -> str:
        value = env.get(match.group(1))
        if value:
            return value
        return match.group(2) if match.group(2) is not None else match.group(0)

    return _ENV_REF.sub(sub, text)


def parse_policy(text: str, source: str, env: Mapping[str, str] | None = None) -> Policy:
    """Validate policy YAML text; raise :class:`PolicyError` with every located issue."""
    text = interpolate_env(text, os.environ if env is None else env)
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise PolicyError(source, [Issue(loc=(), message=f"not valid YAML: {exc}", line=line)]) from None
    if not isinstance(data, dict):
        raise PolicyError(source, [Issue(loc=(), message="a policy is a YAML mapping")])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        issues = [Issue(loc=tuple(err["loc"]), message=_pydantic_message(err)) for err in exc.errors()]
        raise PolicyError(source, _with_lines(text, issues)) from None
    issues = policy.issues()
    if issues:
        raise PolicyError(source, _with_lines(text, issues))
    return policy


def _pydantic_message(err: Any) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required key missing"
    return str(err["msg"])


def _with_lines(text: str, issues: list[Issue]) -> list[Issue]:
    """Attach the YAML line of each issue's path (as deep as the path exists in the file)."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError:
        return issues
    return [issue.model_copy(update={"line": _line_of(root, issue.loc)}) for issue in issues]


def _line_of(node: Any, loc: tuple[int | str, ...]) -> int | None:
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    line, node = key.start_mark.line + 1, value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def load_policy(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Policy:
    """Read and validate a policy file."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(source, [Issue(loc=(), message=f"cannot read: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise PolicyError(source, [Issue(loc=(), message="not UTF-8 text")]) from None
    with files_relative_to(Path(source).resolve().parent):
        return parse_policy(text, source, env)


def policy_digest(raw: bytes) -> str:
    """The digest ``/readyz`` shows for a policy file's bytes (the same on every gateway)."""
    return hashlib.sha256(raw).hexdigest()[:16]


class PolicyHolder:
    """Holds the current snapshot and reloads it when the file changes.

    An edit that fails validation keeps the previous snapshot serving; the reason is
    kept in :attr:`reload_error` (shown by ``/readyz`` and ``/admin/policy``) and logged.
    """

    def __init__(self, path: str | None, env: Mapping[str, str] | None = None) -> None:
        self.path = path or os.fspath(EMBEDDED_POLICY)
        self._env = env
        self._version = 0
        self._stat: tuple[int, int, int] | None = None
        self.reload_error: PolicyError | None = None
        self._listeners: list[Callable[[PolicySnapshot], None]] = []
        self.current = self._load()

    def _file_stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> PolicySnapshot:
        self._stat = self._file_stat()
        raw = Path(self.path).read_bytes() if self._stat else b""
        policy = load_policy(self.path, self._env)
        self._version += 1
        return PolicySnapshot(
            policy=policy,
            source=self.path,
            digest=policy_digest(raw),
            version=self._version,
        )

    def on_change(self, listener: Callable[[PolicySnapshot], None]) -> None:
        """Call ``listener`` with each newly swapped-in snapshot."""
        self._listeners.append(listener)

    def reload(self) -> bool:
        """Reload now; True when a new snapshot was swapped in."""
        return self._swap(self._load)

    def adopt(self, text: bytes, source: str) -> bool:
        """Serve the policy ``text`` (pushed to Redis, say) instead of the file's: validated
        as a file would be, with the same digest a file of these bytes gets, so every
        gateway serving it reports one digest. True when it was swapped in."""

        def load() -> PolicySnapshot:
            policy = parse_policy(text.decode("utf-8", "replace"), source, self._env)
            self._version += 1
            return PolicySnapshot(
                policy=policy, source=source, digest=policy_digest(text), version=self._version
            )

        return self._swap(load)

    def _swap(self, load: Callable[[], PolicySnapshot]) -> bool:
        try:
            snapshot = load()
        except PolicyError as exc:
            self.reload_error = exc
            _log.error("policy_reload_failed", source=exc.source, issues=[str(i) for i in exc.issues])
            return False
        self.reload_error = None
        if snapshot.digest == self.current.digest:
            return False
        self.current = snapshot
        _log.info("policy_reloaded", source=snapshot.source, version=snapshot.version, digest=snapshot.digest)
        for listener in self._listeners:
            listener(snapshot)
        return True

    def changed_on_disk(self) -> bool:
        return self._file_stat() != self._stat

    async def watch(self, interval_s: float) -> None:
        """Poll the file's stat; reload on change. Runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            if self.changed_on_disk():
                self.reload()
