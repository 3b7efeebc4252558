"""The typed view of pyinfra's inventory: validated once per run, shared by deploys and audits."""

from __future__ import annotations

import ast
import os
from collections import Counter
from fnmatch import fnmatch

from pyinfra import host as current_host
from pyinfra import state as current_state
from pyinfra.api import State
from pyinfra.api.exceptions import NoGroupError
from pyinfra.api.inventory import Inventory, extract_name_data
from pyinfra.context import ctx_state

from deploys.run.state import kept
from deploys.schema import MONITORING_GROUP, Cluster, NodeConfig, cluster_of, clusters, validate_inventory
from deploys.schema.cross_host import monitoring_only_validated
from deploys.schema.monitoring import MonitoringHostConfig


def inventory_configs(inventory: Inventory | None = None) -> dict[str, NodeConfig]:
    """Every host's validated config; raises InventoryValidationError naming host, key and value. Validated once
    per inventory (each deploy file is exec'd once per host), kept on it (deploys/run/state.py).

    Inside a pyinfra run, `--limit` is passed on: a host outside it whose only problems are profile gaps is
    left out (deploys/schema/cross_host.py validate_hosts)."""
    inventory = inventory if inventory is not None else current_state.inventory

    def validated() -> dict[str, NodeConfig]:
        state = ctx_state.get()
        limit = getattr(state, "limit_hosts", None) if getattr(state, "inventory", None) is inventory else None
        return validate_inventory(inventory, limit)

    return kept(inventory, "validated configs", validated)


def monitoring_only_configs(inventory: Inventory | None = None) -> dict[str, MonitoringHostConfig]:
    """The monitoring-only host's config (deploys/schema/monitoring.py MonitoringHostConfig), by name; validated with
    the rest of the inventory (inventory_configs), kept on it."""
    inventory = inventory if inventory is not None else current_state.inventory
    inventory_configs(inventory)  # (the whole inventory first: one error listing every problem)
    return kept(inventory, "monitoring-only configs", lambda: monitoring_only_validated(inventory)[0])


def is_inference_node(host=None) -> bool:
    """Whether ``host`` (default: the host pyinfra is preparing now) serves a model: every host but a monitoring-only
    one."""
    host = host if host is not None else current_host
    return host.name not in monitoring_only_configs(host.inventory)


def host_config(host=None) -> NodeConfig | MonitoringHostConfig:
    """The validated config of ``host`` whichever it is: an inference node's, or a monitoring-only host's (for the
    steps both run: the package manager, the monitoring host)."""
    host = host if host is not None else current_host
    return monitoring_only_configs(host.inventory).get(host.name) or inventory_configs(host.inventory)[host.name]


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


def load_inventory(path: str, override_data: dict | None = None, group_data: tuple[str, ...] = ()) -> Inventory:
    """Load an inventory file the way the pyinfra CLI does (group_data beside it, ``--data`` overrides, extra
    ``--group-data`` directories), without connecting. Also records the hosts a group lists more than once
    (``listed_twice``: name -> groups), which pyinfra merges without a word (the later entry's values win), so
    validation names them (deploys/schema/cross_host.py group_problems)."""
    import runpy

    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):
        inventory = make_inventory(path, cwd=os.getcwd(), override_data=override_data or {},
                                   group_data_directories=list(group_data) or None)
    inventory.listed_twice = {}
    if os.path.isfile(path):
        for group, value in runpy.run_path(path).items():
            if group.startswith("_") or group == MONITORING_GROUP or not isinstance(value, (list, tuple)):
                continue  # what pyinfra takes for a group: a list, or a (hosts, data) tuple
            members = value[0] if isinstance(value, tuple) else value
            for name, n in Counter(name for name, _ in extract_name_data(members)).items():
                if n > 1:
                    inventory.listed_twice.setdefault(name, []).append(group)
    return inventory


class LimitError(ValueError):
    """A ``--limit``/``--exclude`` pattern that would run nothing, or something else than it says."""


def hosts_matching(inventory: Inventory, patterns, option: str = "--limit") -> list:
    """The hosts ``patterns`` select: pyinfra's rules (a group's name, else a glob over host names) plus a
    cluster's name (``cluster_name``). One resolver for every entry point (deploy, validate, render, audit).

    A comma is refused (pyinfra does not split one: `--limit a,b` selects nothing), and a pattern that
    selects nothing is an error: never a green run of nothing."""
    selected: list = []
    for pattern in patterns:
        if "," in pattern:
            each = " ".join(f"{option} {p}" for p in pattern.split(",") if p)
            raise LimitError(f"{option} {pattern}: pyinfra does not split a comma (it would select nothing); "
                             f"give one {option} per name: {each}")
        try:
            hosts = list(inventory.get_group(pattern))
        except NoGroupError:
            hosts = ([h for h in inventory if h.data.get("cluster_name") == pattern]
                     or [h for h in inventory if fnmatch(h.name, pattern)])
        if not hosts:
            groups = sorted(g for g in inventory.groups if g != "all")
            clusters = sorted({str(h.data.get("cluster_name")) for h in inventory if h.data.get("cluster_name")})
            raise LimitError(f"{option} {pattern}: no host, group or cluster of the inventory is called that "
                             f"(groups: {', '.join(groups) or 'none'}; clusters: {', '.join(clusters) or 'none'}; "
                             "host names match as globs)")
        selected += [h for h in hosts if h not in selected]
    return selected


def limited_hosts(inventory: Inventory, limit=(), exclude=()) -> list | None:
    """The hosts a run with these ``--limit``/``--exclude`` options acts on (None: no option, every host)."""
    if not limit and not exclude:
        return None
    hosts = hosts_matching(inventory, limit) if limit else list(inventory)
    excluded = hosts_matching(inventory, exclude, "--exclude") if exclude else []
    return [h for h in hosts if h not in excluded]


def with_cluster_groups(namespace: dict) -> None:
    """Make every cluster a pyinfra group of the inventory module whose ``globals()`` this is (called at its
    end), so pyinfra's own ``--limit gb10-dspark`` selects the cluster's members as it selects a group.

    A group's cluster name is read where the inventory sets it: the host entry, the group's data in this file,
    or an assignment ``cluster_name = "…"`` in ``group_data/<group>.py`` or ``group_data/all.py`` beside it."""
    group_data = os.path.join(os.path.dirname(os.path.abspath(namespace["__file__"])), "group_data")
    everywhere = _literal(os.path.join(group_data, "all.py"), "cluster_name")
    clusters: dict[str, list] = {}
    for group, value in list(namespace.items()):
        if group.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        entries, data = (value[0], value[1]) if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict) else (value, {})
        group_name = data.get("cluster_name") or _literal(os.path.join(group_data, f"{group}.py"), "cluster_name") or everywhere
        for entry in entries:
            name, host_data = entry if isinstance(entry, tuple) else (entry, {})
            cluster = host_data.get("cluster_name") or group_name
            if isinstance(cluster, str) and cluster not in namespace:
                clusters.setdefault(cluster, []).append((name, host_data))
    namespace.update(clusters)


def _literal(path: str, name: str):
    """The value of a top-level ``name = <literal>`` in the Python file at ``path`` (None: absent or computed)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError):
        return None
    value = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                value = None
    return value


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
