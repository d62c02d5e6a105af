"""One launch spec -> the replicas to start: each one's argv, GPUs, port and environment.

Pure data: nothing here starts a process (the local backend's supervisor does). The gateway
plans a policy's launches to check them against this machine (GPUs on offer, the API
key variable) before anything starts.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.replicas.launch import CPU_KV_CACHE_ENV, DEFAULT_CPU_KV_CACHE_GIB, VllmLaunch

# Present on any machine with an NVIDIA driver loaded (also inside containers given a GPU).
_GPU_MARKERS = ("/dev/nvidiactl", "/proc/driver/nvidia")


class LaunchError(ValueError):
    """A launch that cannot start as configured (beyond what validation can see)."""


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """Everything needed to start one replica: its command line, its environment additions,
    its GPUs and port. ``env`` holds only what the launcher adds to the parent's environment."""

    name: str
    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    gpus: tuple[str, ...]
    port: int
    base_url: str

    @property
    def health_url(self) -> str:
        """vLLM's ``GET /health``."""
        return self.base_url.removesuffix("/v1") + "/health"

    @property
    def metrics_url(self) -> str:
        """vLLM's ``GET /metrics``."""
        return self.base_url.removesuffix("/v1") + "/metrics"

    def command_line(self) -> str:
        """A shell line that starts this replica (for ``--dry-run``, logs and docs); secrets are
        shown by their variable name only."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items() if k != "VLLM_API_KEY")
        if "VLLM_API_KEY" in self.env:
            env += ' VLLM_API_KEY="$..."'
        return (env + " " if env else "") + shlex.join(self.argv)


def _default_gpus(needed: int, environ: Mapping[str, str]) -> list[str]:
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        # The gateway was itself given a GPU set: place replicas inside it, never outside.
        return [g.strip() for g in visible.split(",") if g.strip()]
    return [str(i) for i in range(needed)]


def has_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU driver (else vLLM runs its CPU backend)."""
    return any(os.path.exists(marker) for marker in _GPU_MARKERS)


def cpu_kv_cache_env(launch: VllmLaunch, gpu: bool | None) -> dict[str, str]:
    """``VLLM_CPU_KVCACHE_SPACE`` for the launch: the knob when set; without a GPU (no driver
    here and no ``gpus`` listed), a safe default: vLLM's CPU backend otherwise takes
    ``gpu_memory_utilization`` of the RAM."""
    if launch.cpu_kv_cache_gib is not None:
        gib = launch.cpu_kv_cache_gib
    elif gpu is False and launch.gpus is None and CPU_KV_CACHE_ENV not in launch.env:
        gib = DEFAULT_CPU_KV_CACHE_GIB
    else:
        return {}
    # vLLM (0.32) reads the variable with int(): whole GiB.
    return {CPU_KV_CACHE_ENV: str(gib)}


def plan_replicas(
    launch: VllmLaunch,
    name: str = "vllm",
    environ: Mapping[str, str] | None = None,
    gpu: bool | None = None,
) -> list[ReplicaPlan]:
    """The replicas ``launch`` describes, each with its argv, GPUs, port and environment.

    ``gpu``: whether vLLM will run on a GPU (``None``: not known; the supervisor learns it
    from the installed vLLM before the first start, ``--dry-run`` from :func:`has_gpu`);
    ``False`` sizes the CPU KV cache explicitly (:func:`cpu_kv_cache_env`).

    Raises :class:`LaunchError` when the model is not set or the GPUs available (from
    ``gpus`` or the parent's ``CUDA_VISIBLE_DEVICES``) are too few.
    """
    environ = os.environ if environ is None else environ
    kv_env = cpu_kv_cache_env(launch, gpu)
    if not launch.model:
        raise LaunchError("launch.model is not set: name the model vLLM should load")
    world = launch.gpus_per_replica
    gpus = (
        [str(g) for g in launch.gpus]
        if launch.gpus is not None
        else _default_gpus(world * launch.replicas, environ)
    )
    if world * launch.replicas > len(gpus):
        raise LaunchError(
            f"{world * launch.replicas} GPUs needed (tensor_parallel_size x pipeline_parallel_size x "
            f"replicas) but CUDA_VISIBLE_DEVICES offers {len(gpus)}: {','.join(gpus)}"
        )
    key: str | None = None
    if launch.api_key_env:
        key = environ.get(launch.api_key_env)
        if not key:
            raise LaunchError(f"launch.api_key_env names {launch.api_key_env}, which is not set")
    served = launch.served_model_name or launch.model
    knob_words = [word for words in launch.knob_flags().values() for word in words]
    urls = launch.replica_urls()
    plans = []
    for i in range(launch.replicas):
        mine = tuple(gpus[i * world : (i + 1) * world])
        port = launch.port + i
        argv = (
            launch.executable,
            "serve",
            launch.model,
            "--host",
            launch.host,
            "--port",
            str(port),
            "--served-model-name",
            served,
            *knob_words,
            *launch.extra_args,
        )
        env = {**launch.env, "CUDA_VISIBLE_DEVICES": ",".join(mine), **kv_env}
        if key is not None:
            env["VLLM_API_KEY"] = key
        plans.append(
            ReplicaPlan(name=name, index=i, argv=argv, env=env, gpus=mine, port=port, base_url=urls[i])
        )
    return plans
