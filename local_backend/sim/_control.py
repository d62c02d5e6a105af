"""A small synchronous client of the simulator's control API (``/sim/...``)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class SimControl:
    """A small synchronous client of the control API (``/sim/...``) over real HTTP."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
            return json.loads(resp.read() or b"null")

    def stats(self) -> dict[str, Any]:
        """``GET /sim/stats``."""
        result: dict[str, Any] = self._call("GET", "/sim/stats")
        return result

    def reset(self) -> None:
        """``POST /sim/reset``: stats, fault rules, caches and metrics start over."""
        self._call("POST", "/sim/reset", {})

    def add_fault(self, model: str, fault: str, rate: float = 1.0, count: int | None = None) -> list[Any]:
        """``POST /sim/faults``; returns the rules now in force."""
        body = {"model": model, "fault": fault, "rate": rate, "count": count}
        rules: list[Any] = self._call("POST", "/sim/faults", body)["faults"]
        return rules

    def faults(self) -> list[Any]:
        """``GET /sim/faults``."""
        rules: list[Any] = self._call("GET", "/sim/faults")["faults"]
        return rules

    def clear_faults(self) -> None:
        """``DELETE /sim/faults``."""
        self._call("DELETE", "/sim/faults")
