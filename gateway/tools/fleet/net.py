"""Hosts for the fleet test bed: one Linux network namespace per host, joined by a bridge.

Every host is a namespace of its own (``<prefix>-<name>``) with one interface, ``eth0``,
and one address from ``subnet``; the other end of each host's veth pair sits on a bridge
in a switch namespace (``<prefix>-sw``). Nothing is added to the caller's own namespace,
so the test bed's traffic never leaves the namespaces it made. Cutting a host's link
(:meth:`Topology.cut`) sets its switch-side port down, as a pulled cable would: its
processes keep running, unreachable.

Where namespaces cannot be made (not root, no ``ip``, a container without the
capability) the hosts are loopback addresses, 127.0.0.x, in the caller's namespace:
everything but the link cuts still runs, and :attr:`Topology.isolated` says which it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, slots=True)
class Host:
    """One host of the bed: its name, its namespace (None on loopback) and its address."""

    name: str
    netns: str | None
    address: str
    port_index: int

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host (inside its namespace)."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv


def namespaces_available() -> tuple[bool, str]:
    """Whether network namespaces can be made here, and why not when they cannot."""
    if os.geteuid() != 0:
        return False, "not root"
    if shutil.which("ip") is None:
        return False, "no 'ip' command (iproute2)"
    probe = f"syprobe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return False, made.stderr.strip() or "ip netns add failed"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


class Topology:
    """Makes hosts (namespaces, or loopback addresses as the fallback) and removes them all.

    ``prefix`` names the namespaces (keep it short: interface names are 15 bytes at most);
    ``subnet`` is where host addresses come from, inside the namespaces only.
    """

    def __init__(
        self, prefix: str = "syf", subnet: str = "10.253.0.0/24", *, namespaces: bool | None = None
    ) -> None:
        self.prefix = prefix
        available, self.why_not = namespaces_available() if namespaces is not False else (False, "asked")
        self.isolated = available if namespaces is None else (namespaces and available)
        if namespaces and not available:
            raise RuntimeError(f"network namespaces are unavailable here: {self.why_not}")
        self._net = ipaddress.ip_network(subnet)
        self.hosts: dict[str, Host] = {}
        self._switch = f"{prefix}-sw"
        self._made: list[str] = []
        if self.isolated:
            self._ip("netns", "add", self._switch)
            self._made.append(self._switch)
            self._ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self._switch, "link", "set", "br0", "up")

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def add(self, name: str) -> Host:
        """A new host called ``name`` with the next free address."""
        index = len(self.hosts) + 1
        if not self.isolated:
            host = Host(name, None, f"127.0.0.{10 + index}", index)
            self.hosts[name] = host
            return host
        netns = f"{self.prefix}-{name}"
        address = str(self._net.network_address + 10 + index)
        self._ip("netns", "add", netns)
        self._made.append(netns)
        port = f"p{index}"
        self._ip(
            "link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name", port, "netns", self._switch
        )
        self._ip("-n", self._switch, "link", "set", port, "master", "br0")
        self._ip("-n", self._switch, "link", "set", port, "up")
        self._ip("-n", netns, "addr", "add", f"{address}/{self._net.prefixlen}", "dev", "eth0")
        self._ip("-n", netns, "link", "set", "eth0", "up")
        self._ip("-n", netns, "link", "set", "lo", "up")
        host = Host(name, netns, address, index)
        self.hosts[name] = host
        return host

    def cut(self, host: Host) -> None:
        """Pull ``host``'s cable: its switch port goes down."""
        self._require_isolated("cut a host's link")
        self._ip("-n", self._switch, "link", "set", f"p{host.port_index}", "down")

    def restore(self, host: Host) -> None:
        """Plug ``host``'s cable back in."""
        self._require_isolated("restore a host's link")
        self._ip("-n", self._switch, "link", "set", f"p{host.port_index}", "up")

    def _require_isolated(self, what: str) -> None:
        if not self.isolated:
            raise RuntimeError(f"cannot {what} on loopback hosts: it needs network namespaces")

    @contextlib.contextmanager
    def inside(self, host: Host) -> Iterator[None]:
        """Run the calling thread (and the sockets it opens) in ``host``'s namespace for the
        block; other threads stay where they are. A no-op on loopback hosts."""
        if host.netns is None:
            yield
            return
        libc = ctypes.CDLL(None, use_errno=True)
        here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{host.netns}", os.O_RDONLY)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {host.netns} failed")
            try:
                yield
            finally:
                libc.setns(here, _CLONE_NEWNET)
        finally:
            os.close(here)
            os.close(target)

    def close(self) -> None:
        """Remove every namespace made (processes still inside them should be stopped first)."""
        for netns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self._made.clear()

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
