"""The typed view of pyinfra's inventory: validated once per run, shared by deploys and audits."""

from __future__ import annotations

import os
from collections import Counter

from pyinfra import host as current_host
from pyinfra import state as current_state
from pyinfra.api import State
from pyinfra.api.inventory import Inventory, extract_name_data
from pyinfra.context import ctx_state

from deploys.run_state import kept
from deploys.schema import Cluster, NodeConfig, cluster_of, clusters, validate_inventory


def _remember_hosts_listed_twice() -> None:
    """pyinfra merges a host listed twice in one group without a word (the later entry's values win):
    record such names on the inventory (``listed_twice``: name -> groups) so validation names them
    (deploys/schema/cross_host.py group_problems). Installed on import, before the CLI builds the inventory."""
    original = Inventory.make_hosts_and_groups
    if getattr(original, "remembers_listed_twice", False):
        return

    def make_hosts_and_groups(self, names, groups):
        self.listed_twice = {}
        for group, value in groups.items():
            members = value[0] if isinstance(value, tuple) else value
            for name, n in Counter(name for name, _ in extract_name_data(members)).items():
                if n > 1:
                    self.listed_twice.setdefault(name, []).append(group)
        return original(self, names, groups)

    make_hosts_and_groups.remembers_listed_twice = True
    Inventory.make_hosts_and_groups = make_hosts_and_groups


_remember_hosts_listed_twice()

def inventory_configs(inventory: Inventory | None = None) -> dict[str, NodeConfig]:
    """Every host's validated config; raises InventoryValidationError naming host, key and value. Validated once
    per inventory (each deploy file is exec'd once per host), kept on it (deploys/run_state.py).

    Inside a pyinfra run, `--limit` is passed on: a host outside it whose only problems are profile gaps is
    left out (deploys/schema/cross_host.py validate_hosts)."""
    inventory = inventory if inventory is not None else current_state.inventory

    def validated() -> dict[str, NodeConfig]:
        state = ctx_state.get()
        limit = getattr(state, "limit_hosts", None) if getattr(state, "inventory", None) is inventory else None
        return validate_inventory(inventory, limit)

    return kept(inventory, "validated configs", validated)


def node_config(host=None) -> NodeConfig:
    """The validated config of ``host`` (default: the host pyinfra is preparing now)."""
    host = host if host is not None else current_host
    return inventory_configs(host.inventory)[host.name]


def node_cluster(host=None) -> Cluster:
    """The serving group of ``host`` (default: the host pyinfra is preparing now): head, size, members."""
    host = host if host is not None else current_host
    return cluster_of(inventory_configs(host.inventory), host.name)


def cluster_member_names(host=None) -> list[str]:
    """The host names of every member of ``host``'s serving group, by rank (workers after the head)."""
    host = host if host is not None else current_host
    configs = inventory_configs(host.inventory)
    return [name for name, _ in sorted(clusters(configs)[configs[host.name].cluster_name], key=lambda m: m[1].node_rank)]


def load_inventory(path: str) -> Inventory:
    """Load an inventory file the way the pyinfra CLI does (group_data beside it), without connecting."""
    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):
        return make_inventory(path, cwd=os.getcwd())


def ssh_options(data: dict) -> list[str]:
    """OpenSSH `-o` options reaching a host the way pyinfra does, from its inventory data (for rsync and
    testinfra, which use OpenSSH rather than paramiko). Host-key checking follows the inventory."""
    strict = {"yes": "yes", "no": "no", "off": "no", "accept-new": "accept-new"}.get(
        str(data.get("ssh_strict_host_key_checking", "accept-new")), "yes"
    )
    opts = [f"StrictHostKeyChecking={strict}", "BatchMode=yes", "LogLevel=ERROR"]
    if data.get("ssh_port"):
        opts.append(f"Port={data['ssh_port']}")
    if data.get("ssh_user"):
        opts.append(f"User={data['ssh_user']}")
    if data.get("ssh_key"):
        opts.append(f"IdentityFile={data['ssh_key']}")
    known = data.get("ssh_known_hosts_file")
    if known:
        opts.append(f"UserKnownHostsFile={known if known == '/dev/null' else os.path.abspath(known)}")
    return opts
