"""Hosts in miniature for tests/test_many_hosts.py: each host a network namespace of its own, joined to the test's
side by a veth pair whose host end sits on a bridge (the "switch"); the server side (PostgreSQL, the receiver)
listens on the bridge's address.

    test side (root namespace)          host i (namespace asyncq-<tag>-<i>)
    bridge aq<tag>b 10.x.y.1/24 ──── aq<tag>h<i> ═══ aq<tag>n<i> 10.x.y.(10+i)/24

Cutting a host's link takes the bridge end of its veth down (``ip link set … down``): like a switch port going
dark, the host's packets vanish without an error, its TCP connections stall and resume when the link is back.
Every name carries a random tag, the subnet is one no interface or route of the machine uses, and everything made
is removed when the block ends, however it ends (deleting a namespace deletes its veth pair).

Namespaces need root (CAP_NET_ADMIN) and iproute2's ``ip``; :func:`namespace_problem` says why they cannot be made.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field


def ip(*arguments: str) -> str:
    """Run ``ip`` with ``arguments``; its output (``RuntimeError`` with its message if it fails)."""
    done = subprocess.run(["ip", *arguments], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(arguments)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def namespace_problem() -> str | None:
    """Why network namespaces cannot be made here (``None``: they can; tried with a namespace made and removed)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's ({sys.platform} here)"
    if os.geteuid() != 0:
        return "not root: network namespaces and veth pairs need CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "no iproute2 `ip` command"
    probe = f"asyncq-probe-{secrets.token_hex(4)}"
    try:
        ip("netns", "add", probe)
    except RuntimeError as error:
        return f"cannot make a network namespace: {error}"
    with contextlib.suppress(RuntimeError):
        ip("netns", "del", probe)
    return None


def unused_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200-254.x.0 that no address or route of this machine falls in."""
    taken = ip("-4", "-o", "addr", "show") + ip("-4", "route", "show", "table", "all")
    for _ in range(200):
        subnet = ipaddress.ip_network(f"10.{random.randint(200, 254)}.{random.randint(0, 255)}.0/24")
        prefix = ".".join(str(subnet.network_address).split(".")[:3]) + "."
        if prefix not in taken:
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet found for the test's network")


@dataclass
class Network:
    """The bridge and one namespace per host, as made."""

    tag: str
    subnet: ipaddress.IPv4Network
    hosts: int
    namespaces: list[str] = field(default_factory=list)
    bridge: str = ""

    @property
    def server_address(self) -> str:
        """The bridge's address: where the server side listens, reachable from every host."""
        return str(self.subnet.network_address + 1)

    def host_address(self, host: int) -> str:
        return str(self.subnet.network_address + 10 + host)

    def port_of(self, host: int) -> str:
        """The bridge end of host ``host``'s veth pair (its "switch port")."""
        return f"aq{self.tag}h{host}"

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run on host ``host`` (``ip netns exec`` execs it: the process id is the program's own)."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def cut(self, host: int) -> None:
        ip("link", "set", self.port_of(host), "down")

    def restore(self, host: int) -> None:
        ip("link", "set", self.port_of(host), "up")

    def leftovers(self) -> list[str]:
        """Names of this network still present on the machine (none once the block has ended)."""
        present = ip("netns", "list") + ip("-o", "link", "show")
        return [name for name in [*self.namespaces, self.bridge] if name and name in present]


def _make(network: Network) -> None:
    tag, prefix = network.tag, network.subnet.prefixlen
    network.bridge = f"aq{tag}b"
    ip("link", "add", network.bridge, "type", "bridge")
    ip("addr", "add", f"{network.server_address}/{prefix}", "dev", network.bridge)
    ip("link", "set", network.bridge, "up")
    for host in range(network.hosts):
        namespace, port, inside = f"asyncq-{tag}-{host}", network.port_of(host), f"aq{tag}n{host}"
        ip("netns", "add", namespace)
        network.namespaces.append(namespace)
        ip("link", "add", port, "type", "veth", "peer", "name", inside, "netns", namespace)
        ip("link", "set", port, "master", network.bridge)
        ip("link", "set", port, "up")
        ip("-n", namespace, "addr", "add", f"{network.host_address(host)}/{prefix}", "dev", inside)
        ip("-n", namespace, "link", "set", inside, "up")
        ip("-n", namespace, "link", "set", "lo", "up")


def _remove(network: Network) -> list[str]:
    """Delete what was made (namespaces first: each takes its veth pair with it); the errors met."""
    errors = []
    for namespace in network.namespaces:
        try:
            ip("netns", "del", namespace)
        except RuntimeError as error:
            errors.append(str(error))
    for host in range(network.hosts):  # a veth whose namespace was never made
        with contextlib.suppress(RuntimeError):
            ip("link", "del", network.port_of(host))
    if network.bridge:
        try:
            ip("link", "del", network.bridge)
        except RuntimeError as error:
            errors.append(str(error))
    return errors


@contextlib.contextmanager
def host_network(hosts: int) -> Iterator[Network]:
    """A bridge and ``hosts`` namespaces linked to it, removed when the block ends (the processes running in
    them must be ended first: a namespace outlives its name while a process is in it)."""
    network = Network(secrets.token_hex(3), unused_subnet(), hosts)
    try:
        _make(network)
        yield network
    except BaseException:
        for error in _remove(network):  # the block's own failure is the one to see
            print(f"removing the test's network: {error}", file=sys.stderr)
        raise
    errors = _remove(network)
    if errors:
        raise RuntimeError(f"the test's network was not fully removed: {errors}")
