"""Before any replica starts: is vLLM installed, and does *this* vLLM accept the command line?

The launch's argv is run through the installed vLLM's own parser and engine configuration
(:mod:`local_backend.vllm._probe`, run by that vLLM's Python, since vLLM usually lives in a
venv of its own), so a knob the version lacks (``--calculate-kv-scales`` is gone in 0.32) or
a value it refuses is one clear error before launch, not a crash loop after it. The probe
also reports what the gateway's accounting needs to know: the KV cache block size.

When the executable is not a Python entry point that can import vLLM (a wrapper script, a
stand-in), the check is skipped with a log line: supervision still catches a bad start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from gateway.replicas.launch import VllmLaunch, knob_of_flag
from gateway.replicas.launch_plan import LaunchError, ReplicaPlan, plan_replicas

_log = structlog.get_logger("switchyard.vllm")
_PROBE = Path(__file__).with_name("_probe.py")
PROBE_TIMEOUT_S = 180.0
INSTALL_HINT = (
    "install it with `pip install 'switchyard[local]'` (GPU), or on a CPU-only machine follow "
    "docs/local-backend.md 'Try the local backend without a GPU' (tests/vllm/setup_vllm.sh), "
    "or set executable: to its path"
)


class VllmNotInstalledError(LaunchError):
    """The launch's ``vllm`` executable is not on PATH (or not executable)."""


@dataclass(frozen=True, slots=True)
class Preflight:
    """What the installed vLLM said about a launch: ``None`` where it was not asked (skipped)."""

    version: str | None = None
    platform: str | None = None
    block_size: int | None = None
    skipped: str | None = None
    flags: frozenset[str] = frozenset()

    def versioned(self, plan: ReplicaPlan, drain_timeout_s: float) -> ReplicaPlan:
        """``plan`` with the flags only some vLLM versions have, where this one has them:
        ``--shutdown-timeout`` (>= 0.2x; its default 0 aborts the requests in flight on
        SIGTERM) set to the launch's drain time, unless the launch sets it itself."""
        if "--shutdown-timeout" in self.flags and not any(
            word.split("=", 1)[0] == "--shutdown-timeout" for word in plan.argv
        ):
            extra = ("--shutdown-timeout", str(max(1, int(drain_timeout_s))))
            return dataclasses.replace(plan, argv=(*plan.argv, *extra))
        return plan


def resolve_executable(executable: str, environ: Mapping[str, str]) -> str:
    """The path of the launch's executable, or :class:`VllmNotInstalledError` with a hint."""
    found = shutil.which(executable, path=environ.get("PATH", os.defpath))
    if found is None:
        raise VllmNotInstalledError(
            f"cannot start {executable!r}: not found on PATH, vLLM is not installed? {INSTALL_HINT}"
        )
    return found


def python_of(executable_path: str) -> str | None:
    """The interpreter of a pip-installed entry point (its ``#!`` line), else a ``python`` beside it."""
    try:
        with open(executable_path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if first.startswith(b"#!"):
        words = first[2:].decode(errors="replace").split()
        if words and "python" in Path(words[0]).name:
            return words[0]
    sibling = Path(executable_path).with_name("python")
    return str(sibling) if sibling.is_file() and os.access(sibling, os.X_OK) else None


async def preflight(plan: ReplicaPlan, environ: Mapping[str, str]) -> Preflight:
    """Check ``plan``'s argv against the installed vLLM; :class:`LaunchError` says what it refused."""
    executable = resolve_executable(plan.argv[0], environ)
    python = python_of(executable)
    if python is None:
        return _skipped(plan, f"{executable} is not a Python entry point")
    env = {**environ, **plan.env, "HF_HUB_OFFLINE": environ.get("HF_HUB_OFFLINE", "1")}
    proc = await asyncio.create_subprocess_exec(
        python,
        str(_PROBE),
        json.dumps(list(plan.argv[1:])),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return _skipped(plan, f"the check did not finish within {PROBE_TIMEOUT_S:g} s")
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        if "No module named 'vllm'" in tail[0]:
            return _skipped(plan, f"{python} cannot import vllm")
        return _skipped(plan, f"the check failed: {tail[0]}")
    return _judge(plan, report)


def _skipped(plan: ReplicaPlan, why: str) -> Preflight:
    _log.info("vllm_preflight_skipped", deployment=plan.name, reason=why)
    return Preflight(skipped=why)


def _judge(plan: ReplicaPlan, report: dict[str, object]) -> Preflight:
    version = str(report.get("version") or "?")
    where = f"{plan.name}: vLLM {version}"
    unknown = [str(flag) for flag in report.get("unknown_flags") or []]  # type: ignore[attr-defined]
    if unknown:
        problems = []
        for flag in unknown:
            knob = knob_of_flag(flag)
            problems.append(
                f"knob {knob} ({flag})" if knob else f"{flag} (in extra_args)",
            )
        raise LaunchError(
            f"{where} does not accept {', '.join(problems)}: remove it from the launch, or install "
            "a vLLM version that has it"
        )
    if report.get("parse_error"):
        raise LaunchError(f"{where} refuses the command line: {report['parse_error']}")
    if report.get("engine_error"):
        raise LaunchError(f"{where} refuses the configuration: {report['engine_error']}")
    block = report.get("block_size")
    flags = report.get("flags")
    result = Preflight(
        version=version,
        platform=str(report.get("platform") or "") or None,
        block_size=block if isinstance(block, int) else None,
        flags=frozenset(str(f) for f in flags) if isinstance(flags, list) else frozenset(),
    )
    _log.info(
        "vllm_preflight_ok",
        deployment=plan.name,
        version=result.version,
        platform=result.platform,
        block_size=result.block_size,
    )
    return result


@dataclass(frozen=True, slots=True)
class LaunchCheck:
    """What :func:`check_launches` found: refusals by deployment, and the launches it could
    not check against vLLM (not installed here, or not a Python entry point) with why."""

    refused: dict[str, str]
    unchecked: dict[str, str]


async def check_launches(launches: Mapping[str, VllmLaunch], environ: Mapping[str, str]) -> LaunchCheck:
    """For ``switchyard policy check``: plan each launch on this machine and run its preflight,
    all at once; what the gateway would refuse at start is refused here with the same words."""
    refused: dict[str, str] = {}
    unchecked: dict[str, str] = {}

    async def one(name: str, launch: VllmLaunch) -> None:
        try:
            plan = plan_replicas(launch, name, environ)[0]
            result = await preflight(plan, environ)
        except VllmNotInstalledError as exc:
            unchecked[name] = str(exc)
        except (LaunchError, OSError) as exc:
            refused[name] = str(exc)
        else:
            if result.skipped is not None:
                unchecked[name] = result.skipped

    await asyncio.gather(*(one(name, launch) for name, launch in launches.items()))
    return LaunchCheck(refused, unchecked)
