"""Audit fixtures: hosts and expected values come from the same inventory and schema the deploys use.

    pytest tests/audit                                        # inventories/lab.py
    pytest tests/audit --inventory inventories/sandbox.py [--limit GROUP_OR_HOST_GLOB] [-m serving]
    pytest tests/audit --junitxml audit.xml -rf               # JUnit XML; one line per failed promise
    pytest tests/audit --full-verify                          # + re-hash every model file now (slow)
    pytest tests/audit -m serving --qualify                   # + the qualification gates that restart a service

Audits are read-only (`--qualify` aside): safe to run against production as a drift check. They connect with OpenSSH
(testinfra's ssh:// backend) using an ssh config generated from the inventory's connection data, so host
key checking follows the inventory (strict in inventories/lab.py).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

import pytest
import testinfra

from deploys.inventory import inventory_configs, load_inventory, ssh_options
from deploys.schema import NodeConfig

DEFAULT_INVENTORY = os.environ.get("AUDIT_INVENTORY", "inventories/lab.py")


def pytest_addoption(parser):
    parser.addoption("--inventory", default=DEFAULT_INVENTORY,
                     help="pyinfra inventory whose hosts are audited (default: $AUDIT_INVENTORY or inventories/lab.py)")
    parser.addoption("--limit", action="append", default=[],
                     help="a group name or a host-name glob, as pyinfra's --limit (repeatable)")
    parser.addoption("--full-verify", action="store_true",
                     help="also re-hash every model file against the manifest on each node (slow; writes nothing)")
    parser.addoption("--qualify", action="store_true",
                     help="also run the qualification gates that disturb a service (gate_restart: restarts it)")


@dataclass
class Node:
    name: str
    cfg: NodeConfig
    host: object  # testinfra Host


def _ssh_config_block(name: str, data: dict) -> str:
    lines = [f"Host {name}", f"  HostName {data.get('ssh_hostname') or name}"]
    lines += [f"  {opt.replace('=', ' ', 1)}" for opt in ssh_options(data)]
    lines += ["  ControlMaster auto", "  ControlPath ~/.ssh/cm-audit-%C", "  ControlPersist 60"]
    return "\n".join(lines) + "\n"


def load_nodes(inventory_file: str, limits: list[str]) -> list[tuple[str, NodeConfig, dict]]:
    """(name, typed config, host data) of every host the limits select (all when none)."""
    from deploys.schema import InventoryValidationError

    inventory = load_inventory(inventory_file)
    try:
        configs = inventory_configs(inventory)
    except InventoryValidationError as e:  # the problems, naming host and key; never a traceback
        raise pytest.UsageError(str(e)) from None
    selected = []
    for h in inventory:
        if limits and not any(lim in h.groups or fnmatch.fnmatch(h.name, lim) for lim in limits):
            continue
        selected.append((h.name, configs[h.name], h.data.dict()))
    return selected


def pytest_generate_tests(metafunc):
    if "node_spec" in metafunc.fixturenames:
        nodes = load_nodes(metafunc.config.getoption("inventory"), metafunc.config.getoption("limit"))
        if "head_only" in metafunc.fixturenames:  # the serving gate runs against each cluster's head
            nodes = [n for n in nodes if n[1].node_rank == 0]
        metafunc.parametrize("node_spec", nodes, ids=[n[0] for n in nodes], scope="module")


@pytest.fixture(scope="session")
def head_only():
    return True


@pytest.fixture(scope="session")
def ssh_config(tmp_path_factory, pytestconfig) -> str:
    os.makedirs(os.path.expanduser("~/.ssh"), mode=0o700, exist_ok=True)
    path = tmp_path_factory.mktemp("audit") / "ssh_config"
    nodes = load_nodes(pytestconfig.getoption("inventory"), [])
    path.write_text("".join(_ssh_config_block(name, data) for name, _, data in nodes if not name.startswith("@")))
    return str(path)


def _testinfra_host(name: str, data: dict, ssh_config: str):
    if name == "@local":  # e.g. the lent GPU machine (tests/device/inventory.py)
        return testinfra.get_host("local://", sudo=bool(data.get("_sudo")) and os.geteuid() != 0)
    return testinfra.get_host(f"ssh://{name}", ssh_config=ssh_config, sudo=bool(data.get("_sudo")))


@pytest.fixture(scope="module")
def node(node_spec, ssh_config) -> Node:
    name, cfg, data = node_spec
    return Node(name, cfg, _testinfra_host(name, data, ssh_config))


@pytest.fixture(scope="session")
def cluster_members(ssh_config, pytestconfig):
    """node -> every node of its cluster (limits aside), in restart order: workers before the head."""
    from deploys.serving_gate import restart_order

    specs = {name: (cfg, data) for name, cfg, data in load_nodes(pytestconfig.getoption("inventory"), [])}

    def members(node: Node) -> list[Node]:
        same = [(n, c) for n, (c, _) in specs.items() if c.cluster_name == node.cfg.cluster_name]
        return [Node(n, c, _testinfra_host(n, specs[n][1], ssh_config)) for n, c in restart_order(same)]
    return members
