"""The aiohttp side of the gateway.

- :mod:`gateway.http.app`: ``create_app``, the one place that builds and wires the stages;
- :mod:`gateway.http.state`: the typed app keys and the request's context key;
- :mod:`gateway.http.middleware`: a context per request, virtual keys, errors as OpenAI JSON;
- :mod:`gateway.http.proxy` and :mod:`gateway.http.streaming`: the ``/v1`` endpoints;
- :mod:`gateway.http.admin`: the ``/admin`` sub-app behind the admin key;
- :mod:`gateway.http.ops`: health, readiness, metrics and the dashboard page;
- :mod:`gateway.http.serve`: the connection handler and the drain.
"""

from gateway.http.app import create_app
from gateway.http.serve import serve

__all__ = ["create_app", "serve"]
