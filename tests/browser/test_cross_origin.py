"""A web page on another origin, in a real headless Chromium, cannot make its user's browser
spend through a keyless gateway on localhost: the "simple" cross-origin POSTs a page may
send without a preflight (``text/plain``, a form type, a typeless body) reach no upstream,
while the gateway's own dashboard page keeps reading the admin API."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.procutil import free_port
from tests.browser.test_dashboard import browser, pytestmark  # noqa: F401 - the fixture and the skip
from tests.helpers import SimServer, sim_policy

ATTACK = """<!doctype html><html><body><script>
const target = "%(gateway)s/v1/chat/completions";
const body = JSON.stringify({model: "fast", messages: [{role: "user", content: "spend"}]});
const sent = [
  fetch(target, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body}),
  fetch(target, {method: "POST", mode: "no-cors", body: new Blob([body])}),
  fetch(target, {method: "POST", mode: "no-cors",
                 headers: {"Content-Type": "application/x-www-form-urlencoded"}, body}),
];
Promise.allSettled(sent).then(() => { document.title = "sent"; });
</script></body></html>"""


@pytest.fixture()
def attacker(request: pytest.FixtureRequest) -> Iterator[Any]:
    pages: dict[str, bytes] = {}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield pages, f"http://localhost:{server.server_address[1]}"
    server.shutdown()


def test_a_foreign_page_cannot_drive_a_keyless_gateway(
    make_gateway: Any,
    sim: SimServer,
    browser: Any,  # noqa: F811 - the fixture imported above
    attacker: Any,
) -> None:
    pages, origin = attacker
    gw = make_gateway(sim_policy(sim.base_url))
    sim.reset()
    pages["/attack.html"] = (ATTACK % {"gateway": gw.url}).encode()
    browser.get(origin + "/attack.html")
    deadline = time.monotonic() + 10
    while browser.title != "sent":
        assert time.monotonic() < deadline, "the page's requests did not settle"
        time.sleep(0.1)
    while len([line for line in gw.log_lines() if line.get("event") == "request"]) < 3:
        assert time.monotonic() < deadline, "the gateway did not log the page's three requests"
        time.sleep(0.1)
    assert sim.stats()["requests_total"] == 0, "a cross-origin page reached the upstream"
    statuses = {line["status"] for line in gw.log_lines() if line.get("event") == "request"}
    assert statuses <= {403, 415}, statuses
    # The gateway's own dashboard (same origin) still reads the admin API.
    browser.get(gw.url + "/dashboard")
    deadline = time.monotonic() + 10
    while not browser.execute_script("return document.querySelectorAll('[data-k]').length"):
        assert time.monotonic() < deadline, "the dashboard did not load its figures"
        time.sleep(0.1)
