from pathlib import Path

import pytest

from gateway.cli import main, policy_schema_json
from gateway.config import PolicyError, interpolate_env, load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[3]

GOOD = """
deployments:
  gpt-fast: {base_url: "https://api.example.com/v1", model: small}
  gpt-strong: {base_url: "https://api.example.com/v1"}
tiers:
  fast: [gpt-fast]
  strong: [{deployment: gpt-strong, weight: 2}]
aliases: {small: gpt-fast}
"""


def issues_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return [str(i) for i in info.value.issues]


def test_good_policy_loads_with_defaults() -> None:
    policy = parse_policy(GOOD, "p.yaml")
    assert policy.tiers["strong"][0].weight == 2
    assert policy.tiers["fast"][0].deployment == "gpt-fast"
    assert policy.routing.default_tier == "fast"
    timeouts = policy.timeouts_for("gpt-fast")
    assert (timeouts.connect_s, timeouts.first_token_s, timeouts.idle_s, timeouts.total_s) == (5, 60, 60, 600)


def test_unknown_deployment_in_tier_is_reported_with_path_and_line() -> None:
    found = issues_of(GOOD.replace("fast: [gpt-fast]", "fast: [gpt-fast, gpt-fsat]"))
    assert found == ["line 6: tiers.fast[1]: unknown deployment 'gpt-fsat'"]


def test_every_error_is_reported_not_just_the_first() -> None:
    text = """
deployments:
  a: {base_url: "ftp://x", timeout: 3}
  b: {base_url: "http://x", max_connections: 0}
tiers: {fast: [a]}
"""
    found = issues_of(text)
    assert any(f.startswith("line 3: deployments.a.base_url:") and "http://" in f for f in found)
    assert any(f.startswith("line 3: deployments.a.timeout: unknown key") for f in found)
    assert any(f.startswith("line 4: deployments.b.max_connections:") for f in found)


def test_cross_reference_errors() -> None:
    text = GOOD + "\nrouting: {default_tier: medium}\n"
    text = text.replace("aliases: {small: gpt-fast}", "aliases: {small: nothing, fast: gpt-fast}")
    found = issues_of(text)
    assert "line 8: aliases.small: unknown deployment or tier 'nothing'" in found
    assert "line 8: aliases.fast: name already used in tiers" in found
    assert "line 10: routing.default_tier: unknown tier 'medium'" in found


def test_durations_accept_units() -> None:
    policy = parse_policy(GOOD + "\ndispatch: {timeouts: {first_token_s: 150ms, total_s: 2m}}\n", "p")
    timeouts = policy.timeouts_for("gpt-fast")
    assert timeouts.first_token_s == pytest.approx(0.15)
    assert timeouts.total_s == 120
    assert "dispatch.timeouts.idle_s" in issues_of(GOOD + "\ndispatch: {timeouts: {idle_s: soon}}\n")[0]


def test_deployment_timeout_overrides_one_by_one_and_null_removes_a_bound() -> None:
    text = GOOD.replace("model: small}", "model: small, timeouts: {idle_s: null, connect_s: 1}}")
    policy = parse_policy(text + "\ndispatch: {timeouts: {first_token_s: 3}}\n", "p")
    t = policy.timeouts_for("gpt-fast")
    assert (t.connect_s, t.first_token_s, t.idle_s, t.total_s) == (1, 3, None, 600)


def test_yaml_syntax_error_has_a_line() -> None:
    found = issues_of("deployments:\n  a: [unclosed\n")
    assert found[0].startswith("line ")
    assert "not valid YAML" in found[0]


def test_env_interpolation() -> None:
    env = {"HOST": "h.example", "EMPTY": ""}
    assert interpolate_env("${HOST}/${MISSING:-d}/${EMPTY:-e}/${MISSING}", env) == "h.example/d/e/${MISSING}"


@pytest.mark.parametrize(
    "path",
    [
        "policies/default.yaml",
        "policies/examples/vllm-local.yaml",
        "policies/examples/mixed.yaml",
        "policies/examples/cache.yaml",
        "gateway/embedded_policy.yaml",
    ],
)
def test_shipped_policies_are_valid(path: str) -> None:
    load_policy(ROOT / path)


def test_policy_check_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    assert main(["policy", "check", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("fast: [gpt-fast]", "fast: [gpt-fsat]"))
    assert main(["policy", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:6: tiers.fast[0]: unknown deployment 'gpt-fsat'" in err


def test_committed_schema_matches_the_models() -> None:
    committed = (ROOT / "policies" / "schema.json").read_bytes()
    assert committed == policy_schema_json(), "run: switchyard policy schema --out policies/schema.json"
