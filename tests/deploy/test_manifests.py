"""The deployment files parse and agree with each other and with the app: ports, env var names,
the policy mount path, image names, probe paths (they must exist in the gateway's router)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.config import PolicyHolder, Settings, interpolate_env, parse_policy
from gateway.http import create_app
from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
BASE = DEPLOY / "k8s" / "base"
OVERLAY = DEPLOY / "k8s" / "overlays" / "production"
GATEWAY_IMAGE = "switchyard/gateway"


@cache
def app_paths() -> frozenset[tuple[str, str]]:
    app = create_app(Settings(), PolicyHolder(None))
    return frozenset(
        (route.method, route.resource.canonical) for route in app.router.routes() if route.resource
    )


def settings_env_names() -> set[str]:
    return {f"SWITCHYARD_{name.upper()}" for name in Settings.model_fields} | {"REDIS_URL"}


def load_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def test_every_yaml_and_json_file_under_deploy_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml")) + [COMPOSE]
    assert len(files) > 10
    for path in files:
        assert load_all(path), path
    for path in DEPLOY.rglob("*.json"):
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] and dashboard["panels"], path


def test_probe_paths_exist_in_the_gateway() -> None:
    assert ("GET", "/healthz") in app_paths() and ("GET", "/readyz") in app_paths()


# -- Dockerfile -----------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_and_runs_as_a_non_root_user() -> None:
    steps = dockerfile()
    stages = [rest for word, rest in steps if word == "FROM"]
    assert len(stages) >= 2 and stages[0].endswith("AS build") and stages[-1].endswith("AS runtime")
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    final = steps[last:]
    users = [rest for word, rest in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert any(word == "COPY" and rest.startswith("--from=build") for word, rest in final)
    assert ("EXPOSE", "8080") in final
    assert ("ENTRYPOINT", '["switchyard"]') in final
    health = next(rest for word, rest in final if word == "HEALTHCHECK")
    assert "http://127.0.0.1:8080/healthz" in health
    assert re.search(r"SWITCHYARD_PORT=8080", " ".join(rest for word, rest in final if word == "ENV"))
    assert (ROOT / ".dockerignore").read_text().count(".venv")


# -- docker compose -------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def service(name: str) -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"][name]
    return found


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port, url
    return parts.hostname, parts.port


def flag(args: list[str], name: str) -> str:
    return str(args[args.index(name) + 1])


def test_compose_has_every_service_and_vllm_only_under_the_gpu_profile() -> None:
    services = compose()["services"]
    assert set(services) >= {
        "gateway",
        "redis",
        "otel-collector",
        "jaeger",
        "prometheus",
        "grafana",
        "vllm",
        "sim",
    }
    assert services["vllm"]["profiles"] == ["gpu"]
    assert all("profiles" not in spec for name, spec in services.items() if name != "vllm")
    device = services["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_compose_gateway_env_ports_and_mounts_agree() -> None:
    gateway = service("gateway")
    env = gateway["environment"]
    for name in env:
        if name.startswith("SWITCHYARD_"):
            assert name in settings_env_names(), f"{name} is not a gateway setting"
    assert gateway["image"].split(":")[0] == GATEWAY_IMAGE and service("sim")["image"] == gateway["image"]
    assert gateway["build"]["dockerfile"] == "deploy/Dockerfile"
    assert gateway["ports"] == [f"{env['SWITCHYARD_PORT']}:{env['SWITCHYARD_PORT']}"]
    # Redis, the simulator, vLLM and the collector are reached by service name and port.
    assert host_port(env["REDIS_URL"]) == ("redis", 6379)
    sim_host, sim_port = host_port(env["SIM_URL"])
    assert sim_host == "sim" and flag(service("sim")["command"], "--port") == str(sim_port)
    vllm_host, vllm_port = host_port(env["VLLM_URL"])
    assert vllm_host == "vllm" and flag(service("vllm")["command"], "--port") == str(vllm_port)
    otel_host, otel_port = host_port(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    collector = yaml.safe_load((DEPLOY / "otel" / "collector.yaml").read_text())
    assert otel_host == "otel-collector"
    # The gateway exports OTLP over HTTP (protobuf): the collector's http receiver.
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(f":{otel_port}")
    # The policy is mounted where SWITCHYARD_POLICY says, and every file it may be is valid.
    mount = next(v for v in gateway["volumes"] if v.endswith(":ro") and "policy" in v)
    source, target, _ = mount.rsplit(":", 2)
    assert target == env["SWITCHYARD_POLICY"]
    assert "${SWITCHYARD_COMPOSE_POLICY:-policy.yaml}" in source
    for name in ("policy.yaml", "policy-gpu.yaml"):
        path = ROOT / source.replace("${SWITCHYARD_COMPOSE_POLICY:-policy.yaml}", name)
        policy = parse_policy(path.read_text(), str(path), env={k: str(v) for k, v in env.items()})
        for deployment in policy.deployments.values():
            if deployment.provider == "vllm":
                host, port = host_port(deployment.base_url)
                assert (host, port) in {(sim_host, sim_port), (vllm_host, vllm_port)}
            if deployment.api_key_env:
                assert deployment.api_key_env in env


def test_compose_mounted_files_exist() -> None:
    for name, spec in compose()["services"].items():
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and "${" not in source:
                assert (ROOT / source).exists(), f"{name}: {source}"


def test_compose_vllm_serves_with_prompt_token_details_and_prefix_caching() -> None:
    vllm = service("vllm")
    assert vllm["entrypoint"] == ["vllm", "serve"]
    assert (
        "--enable-prompt-tokens-details" in vllm["command"] and "--enable-prefix-caching" in vllm["command"]
    )
    assert flag(vllm["command"], "--served-model-name") == "local"
    gpu_policy = parse_policy((DEPLOY / "compose" / "policy-gpu.yaml").read_text(), "p", env={})
    assert gpu_policy.deployments["local"].model == "local"
    assert "/health" in vllm["healthcheck"]["test"][-1]


def test_prometheus_scrapes_the_gateway_and_vllm_at_their_ports() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway_port = service("gateway")["environment"]["SWITCHYARD_PORT"]
    assert jobs["switchyard-gateway"]["static_configs"][0]["targets"] == [f"gateway:{gateway_port}"]
    assert jobs["vllm"]["static_configs"][0]["targets"] == [
        f"vllm:{flag(service('vllm')['command'], '--port')}"
    ]
    assert jobs["vllm"]["metrics_path"] == "/metrics"
    gateway_path = jobs["switchyard-gateway"]["metrics_path"]
    assert gateway_path == "/metrics"
    assert ("GET", gateway_path) in app_paths()


def test_collector_sends_traces_to_jaeger_and_grafana_is_provisioned() -> None:
    collector = yaml.safe_load((DEPLOY / "otel" / "collector.yaml").read_text())
    traces = collector["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"]
    exporter = collector["exporters"][traces["exporters"][0]]
    assert exporter["endpoint"] == "jaeger:4317"
    assert service("jaeger")["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    grafana = service("grafana")
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/dashboards.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == mounts["./deploy/grafana/dashboards"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    sources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/datasources.yaml").read_text())
    urls = {s["type"]: s["url"] for s in sources["datasources"]}
    assert (
        host_port(urls["prometheus"]) == ("prometheus", 9090)
        and "9090:9090" in service("prometheus")["ports"]
    )
    assert host_port(urls["jaeger"]) == ("jaeger", 16686)
    dashboard = json.loads((DEPLOY / "grafana/dashboards/vllm.json").read_text())
    assert all(p["datasource"]["uid"] == "prometheus" for p in dashboard["panels"])


# -- Kubernetes -----------------------------------------------------------------------


def base_documents() -> list[dict[str, Any]]:
    """The base's resources plus its generated ConfigMaps (what kustomize would emit, minus
    hash suffixes and labels)."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        docs.extend(load_all(BASE / resource))
    for generator in kustomization["configMapGenerator"]:
        data = {}
        for item in generator.get("files", []):
            data[Path(item).name] = (BASE / item).read_text()
        for item in generator.get("literals", []):
            key, _, value = item.partition("=")
            data[key] = value
        docs.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    return docs


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize renders the overlay)")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and (
            doc["metadata"]["name"] == name or doc["metadata"]["name"].startswith(name + "-")
        ):
            return doc
    raise AssertionError(f"no {kind} {name}")


def has(docs: list[dict[str, Any]], kind: str, name: str) -> bool:
    return any(d["kind"] == kind and d["metadata"]["name"] == name for d in docs)


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name
    )
    return found


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def check_cluster(docs: list[dict[str, Any]], with_redis: bool) -> None:
    gateway = find(docs, "Deployment", "switchyard-gateway")
    pod = gateway["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert gateway["spec"]["selector"]["matchLabels"].items() <= labels.items()
    gw = container(gateway, "gateway")
    assert gw["image"].split(":")[0].endswith(GATEWAY_IMAGE)
    env = env_of(gw)
    for name in env:
        if name.startswith("SWITCHYARD_"):
            assert name in settings_env_names(), f"{name} is not a gateway setting"
    ports = {p["name"]: p["containerPort"] for p in gw["ports"]}
    assert ports["http"] == int(env["SWITCHYARD_PORT"]["value"])
    assert env["SWITCHYARD_HOST"]["value"] == "0.0.0.0"
    # Probes: the app's paths, on the named port.
    for probe, path in (
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ):
        assert gw[probe]["httpGet"] == {"path": path, "port": "http"}
        assert ("GET", path) in app_paths()
    # Secrets: the admin key (required) and the OpenAI key (optional) by reference.
    admin = env["SWITCHYARD_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    openai_key = env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert admin["name"] == openai_key["name"] == "switchyard-secrets"
    assert (
        admin["key"] == "SWITCHYARD_ADMIN_KEY"
        and openai_key["key"] == "OPENAI_API_KEY"
        and openai_key["optional"]
    )
    assert not any(d["kind"] == "Secret" for d in docs)  # referenced, never shipped
    # The policy ConfigMap is mounted where SWITCHYARD_POLICY points, and is a valid policy.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mount = next(m for m in gw["volumeMounts"] if m["name"] == "policy")
    config_volume = volumes["policy"]["configMap"]
    item = config_volume["items"][0]
    assert f"{mount['mountPath']}/{item['path']}" == env["SWITCHYARD_POLICY"]["value"]
    policy_map = find(docs, "ConfigMap", "switchyard-policy")
    assert config_volume["name"] == policy_map["metadata"]["name"]
    values = {name: e["value"] for name, e in env.items() if "value" in e}
    policy = parse_policy(policy_map["data"][item["key"]], "policy.yaml", env=values)
    vllm_service = find(docs, "Service", "vllm")
    for deployment in policy.deployments.values():
        if deployment.api_key_env:
            assert deployment.api_key_env in env
        if deployment.provider == "vllm":
            host, port = host_port(deployment.base_url)
            assert (
                host == vllm_service["metadata"]["name"] and port == vllm_service["spec"]["ports"][0]["port"]
            )
    # envFrom: the config map (REDIS_URL ...) exists; its keys are settings.
    config = find(docs, "ConfigMap", "switchyard-config")
    refs = [ref for ref in gw["envFrom"]]
    assert refs[0]["configMapRef"]["name"] == config["metadata"]["name"]
    assert set(config["data"]) <= settings_env_names()
    if with_redis:
        redis_service = find(docs, "Service", "redis")
        assert host_port(config["data"]["REDIS_URL"]) == ("redis", redis_service["spec"]["ports"][0]["port"])
        redis_pod = find(docs, "Deployment", "redis")["spec"]["template"]["metadata"]["labels"]
        assert redis_service["spec"]["selector"].items() <= redis_pod.items()
    # Security: non-root, no privilege escalation, read-only root.
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] != 0
    assert gw["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in gw["volumeMounts"])
    # Service, HPA, PDB point at the gateway.
    svc = find(docs, "Service", "switchyard")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] in ports
    hpa = find(docs, "HorizontalPodAutoscaler", "switchyard-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "switchyard-gateway",
    }
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdb = find(docs, "PodDisruptionBudget", "switchyard-gateway")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]  # a drain can always make progress
    # vLLM: a GPU, its port behind its Service, health on that port, cached-token usage on.
    vllm = find(docs, "Deployment", "vllm")
    vc = container(vllm, "vllm")
    assert vc["resources"]["limits"]["nvidia.com/gpu"] >= 1
    vllm_ports = {p["name"]: p["containerPort"] for p in vc["ports"]}
    assert int(flag(vc["args"], "--port")) == vllm_ports["http"]
    assert vllm_service["spec"]["ports"][0]["targetPort"] == "http"
    assert vllm_service["spec"]["selector"].items() <= vllm["spec"]["template"]["metadata"]["labels"].items()
    assert vc["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "--enable-prompt-tokens-details" in vc["args"] and "--enable-prefix-caching" in vc["args"]
    served = flag(vc["args"], "--served-model-name")
    assert [d.model for d in policy.deployments.values() if d.provider == "vllm"] == [served]


def test_kubernetes_base_cross_references_hold() -> None:
    check_cluster(base_documents(), with_redis=True)


def test_kubernetes_base_renders_with_kustomize() -> None:
    check_cluster(kustomize(BASE), with_redis=True)


def test_production_overlay_uses_an_external_redis_cluster_from_a_secret() -> None:
    docs = kustomize(OVERLAY)
    check_cluster(docs, with_redis=False)
    assert not has(docs, "Deployment", "redis") and not has(docs, "Service", "redis")
    assert all(doc["metadata"].get("namespace") == "switchyard" for doc in docs)
    gateway = find(docs, "Deployment", "switchyard-gateway")
    gw = container(gateway, "gateway")
    # envFrom order: the Secret comes last, so its REDIS_URL wins over the config map's.
    assert gw["envFrom"][-1] == {"secretRef": {"name": "switchyard-redis"}}
    assert gw["image"] == "registry.example.com/switchyard/gateway:0.1.0"
    assert gateway["spec"]["replicas"] == 3 and find(docs, "Deployment", "vllm")["spec"]["replicas"] == 2
    assert find(docs, "HorizontalPodAutoscaler", "switchyard-gateway")["spec"]["minReplicas"] == 3
    # The overlay's documented URL is one the gateway accepts.
    text = (OVERLAY / "kustomization.yaml").read_text()
    example = re.search(r"REDIS_URL='([^']+)'", text)
    assert example is not None
    from gateway.store import is_cluster_url

    assert is_cluster_url(example.group(1))


def test_policy_env_interpolation_matches_the_deployment_env() -> None:
    # VLLM_URL in the Deployment is what the policy's ${VLLM_URL:-...} reads.
    policy_text = (BASE / "policy.yaml").read_text()
    gateway = find(base_documents(), "Deployment", "switchyard-gateway")
    env = {e["name"]: e.get("value", "") for e in container(gateway, "gateway")["env"]}
    assert "${VLLM_URL:-http://vllm:8000/v1}" in policy_text
    assert interpolate_env("${VLLM_URL:-x}", env) == env["VLLM_URL"] == "http://vllm:8000/v1"
