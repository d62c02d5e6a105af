"""``switchyard policy check`` runs the preflight of each ``launch:`` where vLLM is installed
(issue #50, item 12): a knob set the installed vLLM refuses is an error there, not only at
``serve``; where vLLM is not installed it says the launch was not checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.cli import main

POLICY = """
deployments:
  local:
    provider: vllm
    launch:
      model: org/m
      port: 8001
      gpus: [0]
      extra_args: [{extra}]
tiers: {{fast: [local]}}
"""

FAKE_CLI_ARGS = '''
class _Known(dict):
    """Every flag is known but those this stand-in "version" dropped."""

    def __contains__(self, flag):
        return not str(flag).startswith("--made-up")


def make_arg_parser(parser):
    parser._option_string_actions = _Known(parser._option_string_actions)
    return parser
'''


def fake_vllm(tmp_path: Path) -> dict[str, str]:
    """A ``vllm`` entry point (this Python) whose importable ``vllm`` has a parser of its own."""
    site = tmp_path / "site"
    for package in ("vllm", "vllm/entrypoints", "vllm/entrypoints/openai", "vllm/utils"):
        (site / package).mkdir(parents=True, exist_ok=True)
        (site / package / "__init__.py").write_text("")
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.0-stand-in"\n')
    (site / "vllm/utils/__init__.py").write_text(
        "from argparse import ArgumentParser as FlexibleArgumentParser\n"
    )
    (site / "vllm/entrypoints/openai/cli_args.py").write_text(FAKE_CLI_ARGS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    entry = bin_dir / "vllm"
    entry.write_text(f"#!{sys.executable}\nraise SystemExit('not to be run')\n")
    entry.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(site)}


def test_policy_check_refuses_a_knob_the_installed_vllm_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in fake_vllm(tmp_path).items():
        monkeypatch.setenv(name, value)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(extra='"--made-up-knob"'))
    assert main(["policy", "check", str(policy)]) == 1
    err = capsys.readouterr().err
    assert "deployments.local.launch: local: vLLM 0.0-stand-in does not accept --made-up-knob" in err


def test_policy_check_says_when_vllm_is_not_there_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(extra='"--made-up-knob"'))
    assert main(["policy", "check", str(policy)]) == 0
    captured = capsys.readouterr()
    assert "ok (1 deployments" in captured.out
    assert "deployments.local.launch: not checked against vLLM: cannot start 'vllm': not found on PATH" in (
        captured.err
    )
