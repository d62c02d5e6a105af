"""The preflight's reading of what the installed vLLM said about a launch."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateway.replicas.launch import VllmLaunch
from gateway.replicas.launch_plan import LaunchError, plan_replicas
from local_backend.vllm._preflight import (
    VllmNotInstalledError,
    _judge,
    python_of,
    resolve_executable,
)

PLAN = plan_replicas(VllmLaunch(model="m"), "local", {}, gpu=True)[0]


def report(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "version": "0.32.0",
        "platform": "cpu",
        "unknown_flags": [],
        "parse_error": None,
        "engine_error": None,
        "block_size": 128,
    }
    return {**base, **fields}


def test_a_knob_the_installed_vllm_lacks_is_refused_by_name() -> None:
    with pytest.raises(LaunchError) as info:
        _judge(PLAN, report(unknown_flags=["--calculate-kv-scales", "--made-up"]))
    message = str(info.value)
    assert "local: vLLM 0.32.0 does not accept" in message
    assert "knob calculate_kv_scales (--calculate-kv-scales)" in message
    assert "--made-up (in extra_args)" in message


def test_parser_and_engine_refusals_are_reported_with_vllms_words() -> None:
    with pytest.raises(LaunchError, match="refuses the command line: argument --dtype: invalid choice"):
        _judge(PLAN, report(parse_error="argument --dtype: invalid choice: 'x'"))
    with pytest.raises(LaunchError, match="refuses the configuration: ValueError: fp8 is not supported"):
        _judge(PLAN, report(engine_error="ValueError: fp8 is not supported"))


def test_an_accepted_launch_reports_platform_and_block_size() -> None:
    result = _judge(PLAN, report())
    assert (result.version, result.platform, result.block_size, result.skipped) == (
        "0.32.0",
        "cpu",
        128,
        None,
    )


def test_a_missing_executable_says_how_to_install_vllm() -> None:
    with pytest.raises(VllmNotInstalledError) as info:
        resolve_executable("vllm", {"PATH": "/nonexistent"})
    message = str(info.value)
    assert "cannot start 'vllm': not found on PATH" in message
    assert "pip install 'switchyard[local]'" in message and "docs/local-backend.md" in message
    assert "\n" not in message


def test_the_interpreter_of_an_entry_point_is_its_shebang(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text("#!/opt/venv/bin/python3.11\nimport sys\n")
    assert python_of(str(script)) == "/opt/venv/bin/python3.11"
    script.write_text('#!/bin/sh\nexec python "$@"\n')
    assert python_of(str(script)) is None
    sibling = tmp_path / "python"
    sibling.write_text("")
    sibling.chmod(sibling.stat().st_mode | stat.S_IXUSR)
    assert python_of(str(script)) == str(sibling)


def test_a_version_with_shutdown_timeout_drains_for_the_launchs_drain_time() -> None:
    plan = plan_replicas(VllmLaunch(model="m", drain_timeout_s=20), "local", {}, gpu=True)[0]
    newer = _judge(plan, report(flags=["--port", "--shutdown-timeout"]))
    assert newer.versioned(plan, 20).argv[-2:] == ("--shutdown-timeout", "20")
    older = _judge(plan, report(flags=["--port"]))
    assert older.versioned(plan, 20) == plan
    own = plan_replicas(VllmLaunch(model="m", extra_args=["--shutdown-timeout=5"]), "local", {}, gpu=True)[0]
    assert newer.versioned(own, 20) == own
