"""Deployments served by several vLLM replicas: launched by Switchyard (``launch:``) or run
elsewhere (``replicas:``), watched through ``/health`` and ``/metrics``, and chosen per
request by prefix affinity with bounded load.

- :mod:`gateway.replicas.policy`: the policy fields and their cross-checks;
- :mod:`gateway.replicas.affinity`: the stable-prefix hash and the replica choice;
- :mod:`gateway.replicas.upstream`: :class:`~gateway.replicas.upstream.ReplicaSetUpstream`;
- :mod:`gateway.replicas.status`: ``/readyz`` and ``/admin/replicas`` figures, and the launches
  a policy asks for.

Only the policy and affinity modules are imported here: the policy model imports this
package, and the upstream imports the policy model.
"""

from gateway.replicas.affinity import PREFIX_HASH, HashRing, affinity_key, choose, stable_prefix_hash
from gateway.replicas.policy import ReplicaSetPolicy, replica_urls

__all__ = [
    "PREFIX_HASH",
    "HashRing",
    "ReplicaSetPolicy",
    "affinity_key",
    "choose",
    "replica_urls",
    "stable_prefix_hash",
]
