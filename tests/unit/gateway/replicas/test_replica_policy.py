"""launch: and replicas: in a policy: what they imply, and the contradictions they are refused for."""

from __future__ import annotations

import pytest

from gateway.config import PolicyError, parse_policy
from gateway.policy import Policy
from gateway.replicas.policy import replica_urls


def policy(deployments: str) -> Policy:
    return parse_policy(f"deployments:\n{deployments}\ntiers:\n  fast: [local]\n", "p.yaml", env={})


def issues_of(deployments: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        policy(deployments)
    return [str(i) for i in info.value.issues]


def test_a_launch_implies_base_url_model_and_served_name() -> None:
    found = policy("""
  local:
    provider: vllm
    model: meta-llama/Llama-3.1-8B-Instruct
    api_key_env: LOCAL_KEY
    launch: {port: 9000, replicas: 2, gpus: [0, 1]}
""").deployments["local"]
    assert found.base_url == "http://127.0.0.1:9000/v1"
    assert found.launch is not None
    assert found.launch.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert found.launch.served_model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert found.launch.api_key_env == "LOCAL_KEY"
    assert replica_urls(found) == ["http://127.0.0.1:9000/v1", "http://127.0.0.1:9001/v1"]


def test_a_served_alias_becomes_the_model_the_gateway_asks_for() -> None:
    found = policy("""
  local:
    provider: vllm
    launch: {model: Qwen/Qwen2.5-7B-Instruct, served_model_name: qwen-7b}
""").deployments["local"]
    assert found.model == "qwen-7b"
    assert found.launch is not None and found.launch.model == "Qwen/Qwen2.5-7B-Instruct"


def test_replica_urls_give_the_base_url() -> None:
    found = policy("""
  local:
    provider: vllm
    replicas: {urls: ["http://vllm-0.vllm:8000/v1/", "http://vllm-1.vllm:8000/v1"], load_factor: 1.5}
""").deployments["local"]
    assert found.base_url == "http://vllm-0.vllm:8000/v1"
    assert replica_urls(found) == ["http://vllm-0.vllm:8000/v1", "http://vllm-1.vllm:8000/v1"]
    plain = policy("  local: {provider: vllm, base_url: 'http://x:1/v1'}").deployments["local"]
    assert replica_urls(plain) == ["http://x:1/v1"]


@pytest.mark.parametrize(
    ("deployment", "message"),
    [
        (
            "  local: {provider: openai, model: m, launch: {}}",
            "deployments.local: Value error, launch and replicas need provider: vllm",
        ),
        ("  local: {provider: vllm, launch: {port: 9000}}", "launch.model: name the model vLLM should load"),
        (
            "  local: {provider: vllm, model: m, base_url: 'http://127.0.0.1:8001/v1', launch: {port: 9000}}",
            "does not match the launch (http://127.0.0.1:9000/v1",
        ),
        (
            "  local: {provider: vllm, model: m, launch: {served_model_name: other}}",
            "launch.served_model_name ('other') differs from model ('m')",
        ),
        ("  local: {provider: vllm, model: m, launch: {}, replicas: {urls: ['http://a:1/v1']}}", "not both"),
        (
            "  local: {provider: vllm, base_url: 'http://c:1/v1', replicas: {urls: ['http://a:1/v1']}}",
            "is not one of replicas.urls",
        ),
        ("  local: {provider: vllm, replicas: {urls: ['ftp://a']}}", "must start with http://"),
        ("  local: {provider: vllm, replicas: {urls: ['http://a:1/v1'], load_factor: 1.0}}", "load_factor"),
        (
            "  local: {provider: vllm, model: m, launch: {replicas: 2, tensor_parallel_size: 2, gpus: [0, 1, 2]}}",
            "= 4 GPUs needed, but gpus lists 3",
        ),
        (
            "  local: {provider: vllm, model: m, launch: {speculative: {method: eagle3}}}",
            "'eagle3' needs a draft model",
        ),
    ],
)
def test_contradictions_are_reported_with_their_path(deployment: str, message: str) -> None:
    found = issues_of(deployment)
    assert any(message in issue for issue in found), found


def test_a_bad_knob_is_reported_at_its_line_and_path() -> None:
    found = issues_of("""
  local:
    provider: vllm
    model: m
    launch:
      max_num_seqs: 0
""")
    assert found == [
        "line 7: deployments.local.launch.max_num_seqs: Input should be greater than or equal to 1"
    ]


def test_two_launches_on_one_port_are_refused() -> None:
    found = issues_of("""
  local: {provider: vllm, model: a, launch: {port: 9000, replicas: 2, gpus: [0, 1]}}
  other: {provider: vllm, model: b, launch: {port: 9001, gpus: [2]}}
""")
    assert any("deployments.other.launch.port: port 9001 is also used by 'local'" in f for f in found), found


def test_gpus_whose_memory_shares_add_up_past_one_are_refused() -> None:
    found = issues_of("""
  local: {provider: vllm, model: a, launch: {port: 9000}}
  other: {provider: vllm, model: b, launch: {port: 9100}}
""")
    assert any("GPU 0 is shared by 'local' (0.9), 'other' (0.9)" in f for f in found), found
    shared = policy("""
  local: {provider: vllm, model: a, launch: {port: 9000, gpu_memory_utilization: 0.45}}
  other: {provider: vllm, model: b, launch: {port: 9100, gpu_memory_utilization: 0.45}}
""")
    assert set(shared.deployments) == {"local", "other"}


def test_the_schema_describes_launch_and_replicas() -> None:
    schema = Policy.model_json_schema()
    deployment = schema["$defs"]["Deployment"]["properties"]
    assert "launch" in deployment and "replicas" in deployment
    assert "max_num_seqs" in schema["$defs"]["VllmLaunch"]["properties"]


def test_the_shipped_launch_example_is_valid() -> None:
    from gateway.config import load_policy
    from gateway.replicas.launch_plan import plan_replicas
    from tests.helpers import ROOT

    found = load_policy(ROOT / "policies/examples/vllm-launch.yaml", env={})
    fast, strong = found.deployments["local-8b"], found.deployments["local-70b"]
    assert fast.launch is not None and strong.launch is not None
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plan_replicas(fast.launch, "local-8b", {})] == ["0", "1"]
    assert plan_replicas(strong.launch, "local-70b", {})[0].env["CUDA_VISIBLE_DEVICES"] == "2,3,4,5"
    assert strong.launch.startup_timeout_s == 1800
