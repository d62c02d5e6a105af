"""Providers: one module per provider dialect behind one interface, and one registry.

- :mod:`~gateway.providers.base`: the :class:`Provider` interface (read its docstring to add one);
- :mod:`~gateway.providers.openai`, :mod:`~gateway.providers.vllm`: the adapters;
- :mod:`~gateway.providers.registry`: name -> adapter class, which the policy is checked against;
- :mod:`~gateway.providers.transport`: the HTTP call; :mod:`~gateway.providers.mock` its test double;
- :mod:`~gateway.providers.sse`: OpenAI-style SSE framing; :mod:`~gateway.providers.pool`: a
  provider per deployment, kept across reloads.
"""
