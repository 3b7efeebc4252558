"""Audit fixtures: hosts and expected values come from the same inventory and schema the deploys use.

    pytest tests/audit                                        # inventories/lab.py
    AUDIT_INVENTORY=inventories/sandbox.py pytest tests/audit

Audits are read-only: safe to run against production as a drift check. They connect with OpenSSH
(testinfra's ssh:// backend) using an ssh config generated from the inventory's connection data, so host
key checking follows the inventory (strict in inventories/lab.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import testinfra

from deploys.inventory import inventory_configs, load_inventory, ssh_options
from deploys.schema import NodeConfig

INVENTORY = os.environ.get("AUDIT_INVENTORY", "inventories/lab.py")


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


def _load_nodes() -> list[tuple[str, NodeConfig, dict]]:
    inventory = load_inventory(INVENTORY)
    configs = inventory_configs(inventory)
    return [(h.name, configs[h.name], h.data.dict()) for h in inventory]


NODES = _load_nodes()


@pytest.fixture(scope="session")
def ssh_config(tmp_path_factory) -> str:
    os.makedirs(os.path.expanduser("~/.ssh"), mode=0o700, exist_ok=True)
    path = tmp_path_factory.mktemp("audit") / "ssh_config"
    path.write_text("".join(_ssh_config_block(name, data) for name, _, data in NODES if not name.startswith("@")))
    return str(path)


@pytest.fixture(scope="module", params=NODES, ids=[n[0] for n in NODES])
def node(request, ssh_config) -> Node:
    name, cfg, data = request.param
    if name == "@local":  # e.g. the lent GPU machine (tests/device/inventory.py)
        host = testinfra.get_host("local://", sudo=bool(data.get("_sudo")) and os.geteuid() != 0)
    else:
        host = testinfra.get_host(f"ssh://{name}", ssh_config=ssh_config, sudo=bool(data.get("_sudo")))
    return Node(name, cfg, host)
