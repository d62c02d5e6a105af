"""The local GPU backend: launch and supervise ``vllm serve`` on this machine.

- :class:`Supervisor` / :class:`SupervisorThread`: start the replicas a launch plans,
  wait for ``/health``, restart with backoff, drain on stop, log their output.
- :func:`load_launch_file`: the YAML file of ``switchyard local serve CONFIG.yaml``.
- :func:`register_cli`: ``switchyard local ...``.
- ``gpu_check.sh``: the end-to-end check on a machine with a GPU.

What a launch *is* belongs to the gateway, which validates it in a policy: the spec
(:class:`gateway.replicas.launch.VllmLaunch`), its command lines
(:func:`gateway.replicas.launch_plan.plan_replicas`) and the reading of vLLM's
``/metrics`` (:mod:`gateway.replicas.vllm_metrics`). vLLM itself is the optional
``[local]`` extra; nothing here imports it.
"""

from local_backend.vllm._cli import register_cli
from local_backend.vllm._launch_file import load_launch_file
from local_backend.vllm._replica import Replica, ReplicaState
from local_backend.vllm._supervisor import Supervisor, SupervisorThread

__all__ = [
    "Replica",
    "ReplicaState",
    "Supervisor",
    "SupervisorThread",
    "load_launch_file",
    "register_cli",
]
