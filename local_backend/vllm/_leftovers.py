"""What a crashed ``vllm serve`` may leave behind, and how a restart gets around it.

After the API server exits, its engine processes may take a while to die (a worker with a
pending SIGKILL, on CPU, took 2-96 s), and a process that left the group can keep the
output pipe and the port. The supervisor waits for them only ``launch.exit_wait_s``; then it
logs what is left (:func:`group_members`) and, when the port is still held
(:func:`port_free`), restarts the replica on a fresh one (:func:`on_port`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

from gateway.procutil import free_port
from gateway.replicas.launch_plan import ReplicaPlan

_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep (uninterruptible)",
    "Z": "zombie",
    "T": "stopped",
}


def group_members(pgid: int) -> list[dict[str, object]]:
    """The processes of group ``pgid`` still in the process table, each with its state
    (read from ``/proc``; empty where there is no ``/proc``)."""
    found: list[dict[str, object]] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            found.append({"pid": int(entry), "state": _STATES.get(fields[0], fields[0])})
    return found


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (nothing else listens there)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As vLLM's (and aiohttp's) servers do: a port in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def on_port(plan: ReplicaPlan, host: str) -> ReplicaPlan:
    """``plan`` moved to a port free now on ``host`` (its argv and URL follow)."""
    port = free_port(host if host not in ("", "0.0.0.0", "::") else "127.0.0.1")
    argv = list(plan.argv)
    argv[argv.index("--port") + 1] = str(port)
    base_url = plan.base_url.replace(f":{plan.port}/", f":{port}/", 1)
    return dataclasses.replace(plan, argv=tuple(argv), port=port, base_url=base_url)
