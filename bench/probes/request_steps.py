"""What each step of the request path costs inside a serving gateway, under load: the
pipeline's steps (limits, validation, the response cache's plan, settle, lookup and
store, shaping, the whole of ``_prepare``; the lookup is the local view's, which answers
the bench's lookups) timed where they run, between other requests' work, not in a warm
loop of their own. ``bench/overhead.sh`` runs one executable as ``switchyard``, so give it
a launcher:

    printf '#!/bin/sh\nexec %s %s "$@"\n' "$PWD/.venv/bin/python" \\
        "$PWD/bench/probes/request_steps.py" >/tmp/sy-steps && chmod +x /tmp/sy-steps
    SWITCHYARD=/tmp/sy-steps bash bench/overhead.sh --cache --modes "cache-hit cache-miss" \\
        --concurrency 16 --keep

It is ``switchyard`` with the steps wrapped: every 5,000 non-stream requests (the cache
modes' requests; streams are not counted) each gateway writes one
line to its log (``request_steps`` with microseconds a request per step, wall time of the
step itself, ``perf_counter`` around it: 0.1 µs), kept in the bench's work directory with
``--keep``. A step that did not run in a window is absent from its line; steps nest
(``prepare`` holds ``limits``, ``validate``, ``plan``, ``settle`` and, cache off, ``shape``).

It settled why the response cache's miss cost more in the overhead bench than its parts in
process: the same steps run 3-4x slower between other requests' work than alone in a loop
(7 December: ``plan`` 20.6 µs here against 5.6 µs in ``bench/response_cache.py``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import gateway.pipeline as pipeline
from gateway.cache.view import LocalView
from gateway.cli import main
from gateway.shaping.service import ShapingState

WINDOW = 5000
_spent: dict[str, float] = {}
_requests = [0]


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            _spent[name] = _spent.get(name, 0.0) + clock() - started

    return timed


def _counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    async def counted(*args: Any, **kwargs: Any) -> Any:
        _requests[0] += 1
        if _requests[0] == WINDOW:
            steps = {name: round(1e6 * s / WINDOW, 1) for name, s in _spent.items()}
            print(f"request_steps us/request over {WINDOW}: {steps}", file=sys.stderr, flush=True)
            _spent.clear()
            _requests[0] = 0
        return await fn(*args, **kwargs)

    return counted


STEPS = {
    "check_limits": "limits",
    "validate": "validate",
    "plan_request": "plan",
    "_settle": "settle",
    "_keep_unary": "store",
    "_prepare": "prepare",
    "unary_hit": "hit",
}
"""The pipeline's functions timed, and the name each has in the log line."""
for _function, _step in STEPS.items():
    setattr(pipeline, _function, _timed(_step, getattr(pipeline, _function)))
LocalView.find = _timed("lookup", LocalView.find)  # type: ignore[method-assign]
pipeline.run_unary = _counted(pipeline.run_unary)
ShapingState.shape = _timed("shape", ShapingState.shape)  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
