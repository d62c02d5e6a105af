"""What keeps a web page from driving the gateway through its user's browser.

A browser sends a cross-origin POST without asking first (no CORS preflight) when its
``Content-Type`` is ``text/plain``, a form type, or absent. A gateway that read JSON under
any type could then be made to spend its provider keys by any page its user opens, when
nothing else (a virtual key, the admin key) guards it. So:

- a POST body to ``/v1/*`` or ``/admin/*`` must be JSON (``application/json``, or an
  ``application/*+json`` type), with any parameters: 415 otherwise. Every official OpenAI
  and Anthropic SDK (Python and Node) sends ``application/json``;
- where nothing else guards the endpoint (``/v1/*`` with ``auth: none``, ``/admin/*``
  without an admin key), a request that carries ``Origin`` is refused (403
  ``origin_not_allowed``) unless it comes from the gateway's own loopback origin (its
  dashboard page) or from an origin listed in ``SWITCHYARD_ALLOWED_ORIGINS``. Programs
  (the SDKs, curl) send no ``Origin`` and are not affected. A page whose name was made to
  resolve to 127.0.0.1 (DNS rebinding) is not the gateway's origin: its ``Host`` is not a
  loopback name;
- a listed origin gets CORS answers (its preflight, ``Access-Control-Allow-Origin``), so a
  web app the operator trusts can call the gateway from a browser.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web

from gateway.config import Settings, is_loopback
from gateway.errors import InvalidRequestError, PermissionDeniedError

_EXPOSED = "x-request-id, x-switchyard-model, x-switchyard-route, x-switchyard-attempts, retry-after"


def is_json_type(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` value names JSON (parameters such as charset allowed)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def check_content_type(request: web.Request) -> None:
    """415 for a POST body to a JSON endpoint that does not say it is JSON."""
    if request.method != "POST" or not request.body_exists:
        return
    path = request.path
    if not (path.startswith("/v1/") or path.startswith("/admin/")):
        return
    content_type = request.headers.get("Content-Type")
    if is_json_type(content_type):
        return
    shown = repr(content_type[:60]) if content_type else "none"
    err = InvalidRequestError(
        f"Content-Type {shown} is not accepted: send the JSON body with 'Content-Type: application/json' "
        "(curl: -H 'Content-Type: application/json').",
        code="unsupported_media_type",
    )
    err.status = 415
    raise err


def allowed_origins(settings: Settings) -> frozenset[str]:
    """``SWITCHYARD_ALLOWED_ORIGINS`` as a set of normalised origins (``*``: any)."""
    return frozenset(o.strip().rstrip("/").lower() for o in settings.allowed_origins.split(",") if o.strip())


def _cors(origin: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": _EXPOSED,
        "Vary": "Origin",
    }


def _listed(origin: str, settings: Settings) -> bool:
    listed = allowed_origins(settings)
    return "*" in listed or origin.strip().rstrip("/").lower() in listed


def _own_origin(origin: str, request: web.Request, settings: Settings) -> bool:
    """Whether ``origin`` is the gateway's own address as the browser reached it, by a
    loopback name or the address it is bound to (so its dashboard page)."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        return False
    if parts.netloc.lower() != (request.host or "").lower():
        return False
    return is_loopback(parts.hostname) or parts.hostname == settings.host


def screen_origin(request: web.Request, settings: Settings, unguarded: bool) -> dict[str, str]:
    """The CORS headers for the request's ``Origin`` (none for its own origin or no
    ``Origin``); :class:`PermissionDeniedError` for a foreign origin on an ``unguarded``
    endpoint (one no key protects)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return {}
    if _listed(origin, settings):
        return _cors(origin)
    if unguarded and not _own_origin(origin, request, settings):
        raise PermissionDeniedError(
            f"Requests from the web page origin {origin[:100]!r} are refused: this gateway has no keys "
            "to tell its user's programs from a page they opened. List the origin in "
            "SWITCHYARD_ALLOWED_ORIGINS, or require keys (SWITCHYARD_AUTH=keys, SWITCHYARD_ADMIN_KEY).",
            code="origin_not_allowed",
        )
    return {}


def preflight(request: web.Request, settings: Settings) -> web.Response | None:
    """The answer to a CORS preflight from a listed origin; None when this is not one
    (the router then answers an ``OPTIONS`` as it does any unrouted method)."""
    origin = request.headers.get("Origin")
    if origin is None or "Access-Control-Request-Method" not in request.headers:
        return None
    if not _listed(origin, settings):
        return None
    asked = request.headers.get("Access-Control-Request-Headers", "")[:2000]
    headers = {
        **_cors(origin),
        "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
        "Access-Control-Max-Age": "600",
    }
    if asked:
        headers["Access-Control-Allow-Headers"] = asked
    return web.Response(status=204, headers=headers)


def unguarded(request: web.Request, auth_mode: str, settings: Settings) -> bool:
    """Whether nothing but the origin check stands between a web page and this endpoint."""
    path = request.path
    if path.startswith("/v1/"):
        return auth_mode == "none"
    if path.startswith("/admin/"):
        return settings.admin_key is None
    return False
