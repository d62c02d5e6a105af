"""The fleet test bed (``switchyard fleet-test``): several gateways on several hosts sharing
one Redis Cluster, simulators standing in for vLLM replicas, and a load generator; see
docs/scaling.md."""
