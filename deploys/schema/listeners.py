"""One table per host of every (address, port) something of the toolkit's listens on, and one owner per address.

Each component checks its own keys; only here are they seen together. Two listeners of one host on the same port
collide when their addresses overlap (the same address, or a wildcard over it: `::` takes every address of both
families on Linux, `0.0.0.0` every IPv4 one), and one of them fails when the host boots: the endpoint on sshd's
port, the node exporter on the head's torch port or on vLLM's API. Addresses compare as text: every address key is
an ``IpAddress`` (deploys/schema/base.py), held in its one canonical spelling.

What is in the table, per host (pyinfra's ssh_port is the port sshd listens on, on every address):

- ``ssh_port`` (not for a connector's `@local`), the API's door (``api_bind_address``:``api_port``, heads) and
  vLLM behind it (loopback, ``engine_port``), the torch
  rendezvous of a multi-node head (every address, ``vllm_master_port``), the endpoint (heads with it on), node
  exporter (loopback and ``node_exporter_address``, with ``monitoring_enabled``), Prometheus and Alertmanager
  (loopback, on the host of the group `monitoring`), and the push fan-out's rsync daemon (its peer address, every
  address when that is a host name), and the model swarm (its peer address).
"""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from dataclasses import dataclass

from deploys.schema.node import NodeConfig
from deploys.schema.problems import Problem

EVERY_ADDRESS = "::"  # a listener on every address (IPv6 sockets take IPv4 too: Linux's bindv6only=0)
LOOPBACK = "127.0.0.1"
HOST_OWN = ("127.0.0.1", "::1")  # loopback addresses every host has: never one host's alone


@dataclass(frozen=True)
class Listener:
    host: str
    key: str  # the key that sets the port (the one a collision is reported under)
    address: str
    port: int
    what: str

    def __str__(self) -> str:
        shown = "every address" if self.address == EVERY_ADDRESS else self.address
        return f"{self.what} ({self.key}) on {shown}:{self.port}"

    def named(self, other_host: str) -> str:
        return str(self) if other_host == self.host else f"{self.host}'s {self}"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def host_listeners(name: str, cfg: NodeConfig, data: dict, cluster_size: int, ssh_port: int | None,
                   is_monitoring_host: bool) -> list[Listener]:
    """Everything ``name`` listens on, in the order a collision is reported (the later entry is named)."""
    def listener(key: str, address: str, port: int, what: str) -> Listener:
        return Listener(name, key, address, port, what)

    out: list[Listener] = []
    if not name.startswith("@") and ssh_port is not None:
        out.append(listener("ssh_port", EVERY_ADDRESS, ssh_port, "sshd"))
    if cfg.is_head:
        out.append(listener("api_port", cfg.api_bind_address, cfg.api_port, "the API's door"))
        out.append(listener("engine_port", cfg.engine_address, cfg.engine_port, "vLLM's API"))
        if cluster_size > 1:
            out.append(listener("vllm_master_port", EVERY_ADDRESS, cfg.vllm_master_port,
                                "the head's torch rendezvous (it binds every address)"))
        if cfg.endpoint_enabled:
            out.append(listener("endpoint_port", cfg.endpoint_address, cfg.endpoint_port, "the endpoint"))
    if cfg.monitoring_enabled:
        out.append(listener("node_exporter_port", LOOPBACK, cfg.node_exporter_port, "node exporter"))
        if cfg.node_exporter_address not in (None, LOOPBACK):
            out.append(listener("node_exporter_port", cfg.node_exporter_address, cfg.node_exporter_port,
                                "node exporter"))
    if is_monitoring_host:
        out.append(listener("prometheus_port", LOOPBACK, cfg.prometheus_port, "Prometheus"))
        out.append(listener("alertmanager_port", LOOPBACK, cfg.alertmanager_port, "Alertmanager"))
    if cfg.model_sync_mode == "push":
        peer = peer_address(name, cfg, data)
        out.append(listener("model_peer_port", peer if _is_ip(str(peer)) else EVERY_ADDRESS, cfg.model_peer_port,
                            "the fan-out's rsync daemon"))
    if cfg.model_sync_mode == "swarm" and (swarm := swarm_address(name, cfg, data))[1] is None:
        out.append(listener("model_swarm_port", swarm[0], cfg.model_swarm_port, "the model swarm"))
    return out


def peer_address(name: str, cfg: NodeConfig, data) -> str:
    """Where a node serves its model copy to its peers (the push fan-out's daemon, the swarm): ``model_peer_address``,
    else the SSH host, the network the control node reaches every node on (``data``: the host's inventory data)."""
    return str(cfg.model_peer_address or data.get("ssh_hostname") or name)


def swarm_address(name: str, cfg: NodeConfig, data: dict) -> tuple[str, str | None]:
    """The address a node's model swarm binds to (its peer address: ``model_peer_address``, else the SSH host), and
    why it cannot (None: it can). The swarm listens on one address, so it must be an IP address of the node."""
    peer = peer_address(name, cfg, data)
    if not _is_ip(peer):
        return peer, ("an IP address of this node for the model swarm to bind to (the SSH host is a name: set "
                      "model_peer_address)")
    if ipaddress.ip_address(peer).is_unspecified or ipaddress.ip_address(peer).is_multicast:
        return peer, "one IP address of this node for the model swarm to bind to, not a wildcard"
    return peer, None


def swarm_problems(configs: dict[str, NodeConfig], hosts: dict[str, dict]) -> list[Problem]:
    """Nodes of the `swarm` mode whose swarm could not bind to one address of theirs."""
    problems = []
    for name, cfg in configs.items():
        if cfg.model_sync_mode == "swarm":
            address, why = swarm_address(name, cfg, hosts.get(name, {}))
            if why:
                problems.append(Problem(name, "model_peer_address", address, why))
    return problems


# the key naming the address of each listener's port key
_ADDRESS_KEY = {"ssh_port": "ssh_hostname", "api_port": "api_bind_address", "engine_port": "api_bind_address",
                "vllm_master_port": "fabric_address",
                "endpoint_port": "endpoint_address", "node_exporter_port": "node_exporter_address",
                "prometheus_port": "prometheus_port", "alertmanager_port": "alertmanager_port",
                "model_peer_port": "model_peer_address", "model_swarm_port": "model_peer_address"}


def _overlap(a: str, b: str) -> bool:
    if a == b:
        return True
    ia, ib = ipaddress.ip_address(a), ipaddress.ip_address(b)
    return any(x.is_unspecified and (x.version == 6 or y.version == 4) for x, y in ((ia, ib), (ib, ia)))


def listener_problems(configs: dict[str, NodeConfig], hosts: dict[str, dict], ssh_ports: dict[str, int | None],
                      watcher: str | None) -> list[Problem]:
    """Two listeners of one network that collide, and an address two hosts claim as their own. A host has a
    network of its own; the hosts with ``fabric_on_one_host`` (the sandbox's nodes on one machine) share one."""
    sizes = Counter(cfg.cluster_name for cfg in configs.values())
    problems: list[Problem] = []
    networks: dict[str, list[Listener]] = defaultdict(list)
    owners: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name, cfg in configs.items():
        table = networks["(one machine)" if cfg.fabric_on_one_host else name]
        listeners = host_listeners(name, cfg, hosts.get(name, {}), sizes[cfg.cluster_name], ssh_ports.get(name),
                                   name == watcher)
        for listener in listeners:
            clash = next((earlier for earlier in table if earlier.port == listener.port
                          and _overlap(earlier.address, listener.address)), None)
            if clash is not None:
                problems.append(Problem(name, listener.key, listener.port, f"a port no other listener takes: "
                                        f"{listener} collides with {clash.named(name)} (one of them would fail at "
                                        "boot)"))
            table.append(listener)
        if cfg.fabric_on_one_host:
            continue  # one machine's addresses are every node's
        # the addresses this host uses as its own: its fabric address and those its listeners take (not the SSH
        # address a peer daemon defaults to: behind NAT, several machines share one)
        claimed = [("fabric_address", cfg.fabric_address)] + [
            (_ADDRESS_KEY[lst.key], lst.address) for lst in listeners
            if not (lst.key in ("model_peer_port", "model_swarm_port") and cfg.model_peer_address is None)]
        for key, address in claimed:
            if (address and address not in HOST_OWN and not ipaddress.ip_address(address).is_unspecified
                    and (name, key) not in owners[address]):
                owners[address].append((name, key))
    for address, named in owners.items():
        if len({n for n, _ in named}) > 1:
            for name, key in named:
                others = ", ".join(f"{n}'s {k}" for n, k in named if n != name)
                problems.append(Problem(name, key, address, f"an address of this host alone (it is also {others}: "
                                        "one machine, or a copy-paste slip; Prometheus would scrape one host under "
                                        "another's name)"))
    return problems
