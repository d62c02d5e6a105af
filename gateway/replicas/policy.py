"""A deployment's replicas in the policy: ``launch:`` (Switchyard starts vLLM) or ``replicas:``
(vLLM servers run elsewhere), and how requests are spread over them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import Field, field_validator

from gateway.replicas.launch import VllmLaunch
from gateway.validation import Issue, Seconds, StrictModel

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default for --gpu-memory-utilization


class ReplicaSetPolicy(StrictModel):
    """Several servers of one model behind one deployment.

    - ``urls``: each replica's base URL (servers Switchyard does not start); with
      ``launch:`` the URLs come from the launch (port, port + 1, ...) and this stays empty.
    - ``prefix_affinity``: requests that share a stable prefix go to the replica that
      served it (consistent hashing with bounded load); off: always the least-loaded one.
    - ``load_factor`` and ``load_slack``: a replica takes a request only while its load (requests
      running + waiting) stays within ``load_factor`` x the mean load + ``load_slack``, so one
      hot prefix cannot overload one replica; the slack keeps a prefix at home while the
      absolute imbalance is a few requests (a cache miss costs more than that).
    - ``health_interval_s`` / ``metrics_interval_s``: how often each replica's ``/health``
      and ``/metrics`` are read; ``probe_timeout_s`` bounds each read.
    - ``unhealthy_after``: failed health checks in a row before a replica is skipped
      (a refused connection takes it out at once).
    """

    urls: list[str] = Field(default_factory=list, description="Base URLs of replicas run elsewhere.")
    prefix_affinity: bool = True
    load_factor: float = Field(1.25, gt=1.0, le=100.0)
    load_slack: int = Field(4, ge=0, le=10_000)
    health_interval_s: Seconds = Field(2.0, gt=0)
    metrics_interval_s: Seconds = Field(2.0, gt=0)
    probe_timeout_s: Seconds = Field(1.0, gt=0)
    unhealthy_after: int = Field(2, ge=1)

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, value: list[str]) -> list[str]:
        out = []
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"a replica URL must start with http:// or https://, got {url!r}")
            out.append(url.rstrip("/"))
        if len(set(out)) != len(out):
            raise ValueError("a replica URL is listed twice")
        return out


DEFAULT_REPLICAS = ReplicaSetPolicy()


class ReplicatedDeployment(Protocol):
    """What the replica checks read of a deployment (``gateway.policy.Deployment`` has it all):
    the policy module builds on this one, never the other way round."""

    @property
    def provider(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def base_url(self) -> str: ...
    @property
    def launch(self) -> VllmLaunch | None: ...
    @property
    def replicas(self) -> ReplicaSetPolicy | None: ...


def fill_replica_defaults(data: Any) -> Any:
    """Before a deployment is validated: derive what its launch or replica list implies.

    - ``base_url`` defaults to the first replica's URL;
    - with ``launch:``, the model the gateway sends upstream, the model vLLM loads and the
      name it serves default to one another, and the launch's API key to the deployment's.
    """
    if not isinstance(data, dict):
        return data
    data = dict(data)
    launch = data.get("launch")
    if isinstance(launch, dict):
        launch = dict(launch)
        given_model = data.get("model")
        upstream_model = given_model or launch.get("served_model_name") or launch.get("model")
        if upstream_model is not None:
            data["model"] = upstream_model
            launch.setdefault("served_model_name", upstream_model)
        if given_model is not None:
            launch.setdefault("model", given_model)  # what vLLM loads; never the served alias
        if data.get("api_key_env"):
            launch.setdefault("api_key_env", data["api_key_env"])
        if "base_url" not in data:
            data["base_url"] = _first_launch_url(launch)
        data["launch"] = launch
    replicas = data.get("replicas")
    if "base_url" not in data and isinstance(replicas, dict):
        urls = replicas.get("urls")
        if isinstance(urls, list) and urls and isinstance(urls[0], str):
            data["base_url"] = urls[0]
    return data


def _first_launch_url(launch: Mapping[str, Any]) -> str:
    host = launch.get("host", "127.0.0.1")
    port = launch.get("port", 8001)
    if not isinstance(host, str) or not isinstance(port, int):
        return "http://127.0.0.1:8001/v1"  # the launch's own validation reports the bad value
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def replica_urls(deployment: ReplicatedDeployment) -> list[str]:
    """The base URLs requests to ``deployment`` may go to."""
    if deployment.launch is not None:
        return deployment.launch.replica_urls()
    if deployment.replicas is not None and deployment.replicas.urls:
        return list(deployment.replicas.urls)
    return [deployment.base_url]


def check_replicas(deployment: ReplicatedDeployment) -> None:
    """Raise ``ValueError`` when a deployment's launch/replicas contradict its other settings."""
    if deployment.launch is None and deployment.replicas is None:
        return
    if deployment.provider != "vllm":
        raise ValueError("launch and replicas need provider: vllm")
    launch = deployment.launch
    if launch is None:
        urls = replica_urls(deployment)
        if deployment.base_url not in urls:
            raise ValueError(f"base_url {deployment.base_url} is not one of replicas.urls")
        return
    if deployment.replicas is not None and deployment.replicas.urls:
        raise ValueError(
            "give launch (Switchyard starts the replicas) or replicas.urls (they run elsewhere), not both"
        )
    if not launch.model:
        raise ValueError("launch.model: name the model vLLM should load (a Hugging Face id or a path)")
    urls = launch.replica_urls()
    if deployment.base_url != urls[0]:
        raise ValueError(
            f"base_url {deployment.base_url} does not match the launch ({urls[0]}, from launch.host and "
            "launch.port): leave base_url out"
        )
    if launch.served_model_name != deployment.model:
        raise ValueError(
            f"launch.served_model_name ({launch.served_model_name!r}) differs from model "
            f"({deployment.model!r}): the gateway asks for `model`, so vLLM must serve that name"
        )


def launch_issues(deployments: Mapping[str, ReplicatedDeployment]) -> list[Issue]:
    """Conflicts between launches: two replicas on one host and port, or GPUs whose memory
    share (``gpu_memory_utilization``, vLLM default 0.9) adds up to more than the whole GPU."""
    found: list[Issue] = []
    ports: dict[tuple[str, int], str] = {}
    memory: dict[str, list[tuple[str, float]]] = {}
    for name, deployment in deployments.items():
        launch = deployment.launch
        if launch is None:
            continue
        host = "127.0.0.1" if launch.host in ("0.0.0.0", "", "::", "localhost") else launch.host
        for i in range(launch.replicas):
            port = launch.port + i
            other = ports.setdefault((host, port), name)
            if other != name:
                found.append(
                    Issue(
                        loc=("deployments", name, "launch", "port"),
                        message=f"port {port} is also used by '{other}'",
                    )
                )
        world = launch.gpus_per_replica * launch.replicas
        gpus = [str(g) for g in launch.gpus] if launch.gpus is not None else [str(i) for i in range(world)]
        share = launch.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        for gpu in gpus[:world]:
            memory.setdefault(gpu, []).append((name, share))
    for gpu, users in memory.items():
        if len(users) > 1 and sum(share for _, share in users) > 1.0 + 1e-9:
            names = ", ".join(f"'{n}' ({share})" for n, share in users)
            last = users[-1][0]
            found.append(
                Issue(
                    loc=("deployments", last, "launch", "gpu_memory_utilization"),
                    message=f"GPU {gpu} is shared by {names}: gpu_memory_utilization adds up to more than 1",
                )
            )
    return found
