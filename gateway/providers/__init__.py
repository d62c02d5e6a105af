"""Providers: one module per provider dialect behind one interface, and one registry.

- :mod:`~gateway.providers.base`: the :class:`Provider` interface (read its docstring to add one);
- :mod:`~gateway.providers.openai`, :mod:`~gateway.providers.vllm`, :mod:`~gateway.providers.anthropic`,
  :mod:`~gateway.providers.azure`, :mod:`~gateway.providers.compatible`: the adapters
  (:mod:`~gateway.providers.azure_policy` and :mod:`~gateway.providers.presets`: their
  policy keys and quirks, which the policy reads without importing an adapter);
- :mod:`~gateway.providers.registry`: name -> adapter class, which the policy is checked against;
- :mod:`~gateway.providers.transport`: the HTTP call's interface (and aiohttp's client behind it);
  :mod:`~gateway.providers.http1` (the pool) and :mod:`~gateway.providers.http1_connection`
  (one connection): the lean HTTP/1.1 client used by default; :mod:`~gateway.providers.clients`:
  which of the two a deployment gets; :mod:`~gateway.providers.mock`: the test double;
- :mod:`~gateway.providers.sse`: OpenAI-style SSE framing; :mod:`~gateway.providers.pool`: a
  provider per deployment, kept across reloads.
"""
