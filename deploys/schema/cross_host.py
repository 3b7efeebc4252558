"""Rules across hosts, and the entry points that validate a whole inventory.

- :func:`clusters` / :func:`cluster_of`: the one way a host's serving group is resolved (its members in
  inventory order, the head, the size), for the rules below, the renderers and the deploys.
- :func:`cluster_problems`: size, ranks, one head, fabric addresses, values every node must share.
- :func:`machine_problems`: one inventory name per machine; :func:`group_problems`: groups that disagree.
- :func:`validate_hosts` / :func:`validate_inventory`: every host parsed (deploys/schema/parse.py), then
  these rules; one :class:`InventoryValidationError` lists every problem.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import ipaddress

from deploys.schema.listeners import HOST_OWN, listener_problems, swarm_problems
from deploys.schema.monitoring import MONITORING_GROUP, MonitoringHostConfig, file_word
from deploys.schema.node import NodeConfig
from deploys.schema.parse import parse_monitoring_host, parse_node
from deploys.schema.problems import InventoryValidationError, Problem


def clusters(configs: dict[str, NodeConfig]) -> dict[str, list[tuple[str, NodeConfig]]]:
    """Hosts by `cluster_name`, in inventory order: (host name, config) pairs."""
    out: dict[str, list[tuple[str, NodeConfig]]] = defaultdict(list)
    for name, cfg in configs.items():
        out[cfg.cluster_name].append((name, cfg))
    return dict(out)


def cluster_head(members: list[tuple[str, NodeConfig]]) -> NodeConfig | None:
    """The rank-0 node of ``members`` (None only in an inventory that failed validation)."""
    return next((cfg for _, cfg in members if cfg.is_head), None)


@dataclass(frozen=True)
class Cluster:
    """One serving group as a node's unit needs it: the head's config, the number of nodes, and every
    member's config in inventory order."""

    name: str
    head: NodeConfig | None
    size: int
    members: list[NodeConfig]


def cluster_of(configs: dict[str, NodeConfig], host: str) -> Cluster:
    """The serving group ``host`` belongs to, among the validated ``configs`` of its inventory."""
    name = configs[host].cluster_name
    members = clusters(configs)[name]
    return Cluster(name, cluster_head(members), len(members), [cfg for _, cfg in members])


def cluster_problems(configs: dict[str, NodeConfig]) -> list[Problem]:
    """Rules across the nodes of a cluster: size, ranks, one head, fabric addresses."""
    problems: list[Problem] = []
    for cluster, members in clusters(configs).items():
        n = len(members)
        for name, cfg in members:
            expected_tp = len(cfg.gpu_indices) * n
            if cfg.tensor_parallel_size != expected_tp:
                problems.append(Problem(
                    name, "tensor_parallel_size", cfg.tensor_parallel_size,
                    f"{expected_tp} = {len(cfg.gpu_indices)} GPU(s) per node × {n} node(s) in cluster {cluster}",
                ))
            if cfg.node_rank >= n:
                problems.append(Problem(name, "node_rank", cfg.node_rank, f"a rank in 0..{n - 1} (cluster {cluster} has {n} node(s))"))
            if n > 1 and cfg.fabric_address is None:
                problems.append(Problem(name, "fabric_address", None, f"an address, since cluster {cluster} spans {n} nodes"))
        by_rank: dict[int, list[str]] = defaultdict(list)
        for name, cfg in members:
            by_rank[cfg.node_rank].append(name)
        for rank, names in sorted(by_rank.items()):
            if len(names) > 1:
                for name in names:
                    problems.append(Problem(name, "node_rank", rank, f"a rank unique in cluster {cluster} (also on {', '.join(x for x in names if x != name)})"))
        if 0 not in by_rank:
            for name, cfg in members:
                problems.append(Problem(name, "node_rank", cfg.node_rank, f"exactly one head (rank 0) in cluster {cluster}; none has rank 0"))
        addresses: dict[str, list[str]] = defaultdict(list)
        for name, cfg in members:
            if cfg.fabric_address:
                addresses[cfg.fabric_address].append(name)
        for addr, names in addresses.items():
            if len(names) > 1:
                for name in names:
                    problems.append(Problem(name, "fabric_address", addr, f"an address unique in cluster {cluster}"))
        for name, cfg in members:
            if cfg.endpoint_enabled and not cfg.is_head:
                problems.append(Problem(name, "endpoint_enabled", True, f"false on a worker: the endpoint of cluster "
                                        f"{cluster} runs on its head (rank 0), the one node with an API"))
        for key in ("model_repo", "model_revision", "model_manifest", "image", "image_digest", "tensor_parallel_size",
                    "vllm_launch", "vllm_command", "vllm_args", "vllm_speculative_config", "served_model_name", "vllm_master_port",
                    "container_exec", "service_env", "model_mount", "model_layout", "gpu_indices", "rollout_canary",
                    "release_stage_only"):
            values = {repr(getattr(cfg, key)) for _, cfg in members}
            if len(values) > 1:
                for name, cfg in members:
                    problems.append(Problem(name, key, getattr(cfg, key), f"the same value on every node of cluster {cluster}"))
    return problems


# An inventory name: a host name or address (it becomes a folder of `deploys.render`, an rsync and ssh
# destination), or a pyinfra connector's (`@local`, `@docker/NAME`). Never a path, an option or shell syntax.
HOST_NAME = re.compile(r"@[a-z]+(/[A-Za-z0-9][A-Za-z0-9._:@-]*)?|[A-Za-z0-9][A-Za-z0-9._:@-]*")
# Its longest use as one file name, the monitoring host's `scrape-<name>.key`, stays within Linux's 255 bytes.
HOST_NAME_MAX = 200
SSH_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
SSH_USER = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*")


def ssh_port(data: dict[str, Any]) -> int | None:
    """The host's SSH port as a number (22 when unset), or None when it is not one."""
    port = data.get("ssh_port")
    if port is None:
        return 22
    if isinstance(port, bool) or not isinstance(port, (int, str)) or not str(port).isdigit():
        return None
    return int(port) if 1 <= int(port) <= 65535 else None


def connection_problems(hosts: dict[str, dict[str, Any]]) -> list[Problem]:
    """The inventory name and pyinfra's connection keys the toolkit reads too (rsync and ssh destinations,
    the render folder): each a name, address, port or user, never a path, an option or shell syntax."""
    problems = []
    for name, data in hosts.items():
        if not HOST_NAME.fullmatch(name):
            problems.append(Problem(name, "(host name)", name, "a host name or address: letters, digits and . _ : @ - "
                                    "(no '/', '..', spaces or a leading '-'), or a pyinfra connector's @name"))
        elif len(name) > HOST_NAME_MAX:
            problems.append(Problem(name[:40] + "…", "(host name)", f"{len(name)} characters",
                                    f"a name of at most {HOST_NAME_MAX} characters (it names files on the control "
                                    "node and the monitoring host; set ssh_hostname to the long one)"))
        if ssh_port(data) is None:
            problems.append(Problem(name, "ssh_port", data.get("ssh_port"), "a port number from 1 to 65535"))
        for key, pattern, what in (("ssh_hostname", SSH_HOSTNAME, "a host name or IP address"),
                                   ("ssh_user", SSH_USER, "a user name")):
            value = data.get(key)
            if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
                problems.append(Problem(name, key, value, f"{what} (letters, digits and . _ - only; no leading '-')"))
    return problems


def machine_problems(hosts: dict[str, dict[str, Any]]) -> list[Problem]:
    """One machine (SSH address and port) under two inventory names would get two services on one port."""
    by_machine: dict[tuple[str, int], list[str]] = defaultdict(list)
    for name, data in hosts.items():
        if name.startswith("@"):
            continue
        address = str(data.get("ssh_hostname") or name).lower().rstrip(".")
        by_machine[(address, ssh_port(data) or 0)].append(name)
    return [
        Problem(name, "ssh_hostname", address,
                f"one inventory name per machine ({address}:{port} is also {', '.join(n for n in names if n != name)})")
        for (address, port), names in by_machine.items() if len(names) > 1 for name in names
    ]


def group_problems(inventory) -> list[Problem]:
    """A host in two groups that set one key differently gets whichever pyinfra merges last: name it.
    Groups holding every host (`all`, the inventory file's own group, applied last) are layers, not rivals
    (so in a one-host inventory no group is compared)."""
    problems = [
        Problem(name, "(inventory entry)", name, f"one entry per host: it is listed more than once in group "
                f"{' and '.join(groups)} (pyinfra merges the entries silently; the later one's values win)")
        for name, groups in getattr(inventory, "listed_twice", {}).items()
    ]
    everyone = set(inventory)
    for host in inventory:
        own = inventory.get_host_data(host.name) or {}
        groups = [g for g, members in inventory.groups.items() if host in members and set(members) != everyone]
        seen: dict[str, tuple[str, Any]] = {}
        for group in groups:
            for key, value in (inventory.get_group_data(group) or {}).items():
                if key in own or key.startswith("__"):
                    continue
                if key in seen and seen[key][1] != value:
                    problems.append(Problem(
                        host.name, key, value,
                        f"one value: the host is in groups {seen[key][0]} and {group}, which set it differently "
                        "(set it on the host, or in one of the groups)"))
                seen.setdefault(key, (group, value))
    return problems


def validate_hosts(hosts: dict[str, dict[str, Any]], deployed: set[str] | None = None,
                   watcher: str | None = None, others: dict[str, dict[str, Any]] | None = None) -> dict[str, NodeConfig]:
    """Validate every host's data and the cluster rules; raise one error listing every problem.

    ``deployed`` (pyinfra's --limit, widened to whole clusters): a host outside it whose only problems are
    profile gaps is left out of the result instead of refusing the run, so deploying A and B need not wait
    for the values C's write-up leaves open. Any other problem on any host still refuses the run. ``watcher``:
    the host of the group `monitoring` (its Prometheus and Alertmanager join its table of listeners, where it is
    one of ``hosts``). ``others``: the data of hosts that are not inference nodes (a monitoring-only host), for the
    rules on names and machines every host follows.
    """
    configs: dict[str, NodeConfig] = {}
    problems: list[Problem] = []
    outside: list[Problem] = []  # control-node file problems of hosts outside the limit
    for name, data in hosts.items():
        cfg, errs = parse_node(name, data)
        if deployed is not None and name not in deployed and errs and all(p.gap or p.control_file for p in errs):
            outside += [p for p in errs if p.control_file]
            if cfg is not None:  # its keys are right; only its files are not on this control node
                configs[name] = cfg
            continue
        problems += errs
        if cfg is not None and not errs:
            configs[name] = cfg
    everyone = {**hosts, **(others or {})}
    problems += connection_problems(everyone) + machine_problems(everyone)
    if not problems:
        problems = cluster_problems(configs) + swarm_problems(configs, hosts) + listener_problems(
            configs, hosts, {name: ssh_port(data) for name, data in hosts.items()}, watcher)
    problems += _needed_outside_the_limit(outside, configs, deployed, watcher)
    if problems:
        raise InventoryValidationError(problems)
    return configs


def _needed_outside_the_limit(outside: list[Problem], configs: dict[str, NodeConfig], deployed: set[str] | None,
                              watcher: str | None) -> list[Problem]:
    """Control-node file problems of hosts outside the limit: warned, unless a host in the run reads that file (the
    monitoring host reads each scraped head's CA and metrics key), then refused as any other problem."""
    from pyinfra import logger

    needed = []
    for problem in outside:
        cfg = configs.get(problem.host)
        if (watcher is not None and deployed is not None and watcher in deployed and cfg is not None
                and cfg.monitoring_enabled and cfg.is_head and cfg.endpoint_enabled):
            needed.append(replace(problem, expected=f"{problem.expected} (the monitoring host {watcher}, in this "
                                  "run, reads it)"))
        else:
            logger.warning(f"--> {problem} (outside this run's limit: left as it is)")
    return needed


def monitoring_problems(inventory, configs: dict[str, NodeConfig]) -> list[Problem]:
    """The group `monitoring` names one host, which reaches every monitored node's exporter (an exporter on
    loopback only is its own host's) and scrapes each monitored head's vLLM through its endpoint with a key."""
    watchers = monitoring_hosts(inventory)
    if len(watchers) > 1:
        return [Problem(name, f"(group {MONITORING_GROUP})", name, f"one host in group {MONITORING_GROUP} (it lists "
                        f"{', '.join(watchers)}): one Prometheus scrapes the inventory") for name in watchers]
    problems = []
    for name, cfg in configs.items():
        if cfg.monitoring_enabled and not watchers:
            problems.append(Problem(name, "monitoring_enabled", True, f"a host in the inventory group "
                                    f"`{MONITORING_GROUP}` to scrape this node (the inventory has none: its exporter "
                                    "would run unscraped and no alert would ever fire)"))
        if not cfg.monitoring_enabled or not watchers:
            continue
        address = cfg.node_exporter_address
        own_loopback = address is not None and ipaddress.ip_address(address).is_loopback and (
            address in HOST_OWN or not cfg.fabric_on_one_host)
        if name != watchers[0] and (address is None or own_loopback):
            problems.append(Problem(name, "node_exporter_address", cfg.node_exporter_address, f"an address of {name} that "
                                    f"the monitoring host {watchers[0]} reaches ("
                                    + ("unset, node-exporter listens on loopback only)" if cfg.node_exporter_address is None
                                       else "not loopback: Prometheus would scrape its own host's exporter under "
                                       f"{name}'s name; loopback stands for a node's own only with "
                                       "fabric_on_one_host, the sandbox's one machine)")))
        if cfg.is_head and cfg.endpoint_enabled and cfg.endpoint_metrics_client is None:
            problems.append(Problem(name, "endpoint_metrics_client", None, f"a client of endpoint_clients_file whose key "
                                    f"the monitoring host {watchers[0]} reads vLLM's /metrics with (monitoring_enabled "
                                    "and the endpoint are on)"))
    scraped = [n for n, c in configs.items() if c.monitoring_enabled and c.is_head and c.endpoint_enabled]
    words: dict[str, list[str]] = defaultdict(list)
    for name in scraped:
        words[file_word(name)].append(name)
    for same in (names for names in words.values() if len(names) > 1):
        problems += [Problem(n, "(inventory name)", n, f"a name apart from {', '.join(x for x in same if x != n)} once "
                             "characters other than letters, digits, `.`, `_` and `-` are `_` (the monitoring host keeps "
                             "each head's scrape key under that name)") for n in same]
    return problems


def monitoring_warnings(inventory, configs: dict[str, NodeConfig]) -> list[str]:
    """What a valid inventory still leaves unwatched (said before the run, never refused): a monitoring host with no
    dead man's switch. Nothing inside the lab pages when that host, its Prometheus or its Alertmanager stops, or
    when the alerts' webhook refuses them (the Watchdog is held back then: deploys/monitoring/host.py)."""
    return [f"host {name}: alertmanager_watchdog_url_file is unset: no outside dead man's switch hears the Watchdog, "
            "so nothing pages when this monitoring host, its Prometheus or its Alertmanager stops, or when the "
            "alerts' webhook fails (docs/monitoring.md)"
            for name, cfg in {**configs, **monitoring_only_validated(inventory)[0]}.items()
            if name in monitoring_hosts(inventory) and cfg.alertmanager_watchdog_url_file is None]


def monitoring_only_hosts(inventory) -> list[str]:
    """The hosts of the group `monitoring` that belong to no serving cluster (no `cluster_name` in their data): they
    run Prometheus and Alertmanager and nothing of an inference node (MonitoringHostConfig)."""
    return [name for name in monitoring_hosts(inventory) if inventory.get_host(name).data.get("cluster_name") is None]


def monitoring_host_data(inventory, name: str) -> tuple[dict[str, Any], set[str]]:
    """A monitoring-only host's data and the keys asked of it: those its own entry or the group `monitoring` sets.
    The other keys it has come from the groups every host is in (group_data/all.py, the inventory file's own group):
    defaults for the lab's inference nodes, which a monitoring-only host reads only where they are its keys."""
    asked = set(inventory.get_host_data(name) or {}) | set(inventory.get_group_data(MONITORING_GROUP) or {})
    return inventory.get_host(name).data.dict(), {k for k in asked if not k.startswith("__")}


def monitoring_only_validated(inventory) -> tuple[dict[str, MonitoringHostConfig], list[Problem]]:
    """Each monitoring-only host's config (one, in a valid inventory), or its problems."""
    configs, problems = {}, []
    for name in monitoring_only_hosts(inventory):
        cfg, errs = parse_monitoring_host(name, *monitoring_host_data(inventory, name))
        problems += errs
        if cfg is not None and not errs:
            configs[name] = cfg
    return configs, problems


def monitoring_hosts(inventory) -> list[str]:
    """The hosts of the inventory group `monitoring` (one, in a valid inventory)."""
    if MONITORING_GROUP not in inventory.groups:
        return []
    return [h.name for h in inventory.get_group(MONITORING_GROUP, [])]


def validate_inventory(inventory, limit_hosts=None) -> dict[str, NodeConfig]:
    """Validate every host of a pyinfra inventory (all of them, not only those --limit selects; see
    validate_hosts for the one exception, profile gaps outside the limit)."""
    problems = group_problems(inventory)
    only, only_problems = monitoring_only_validated(inventory)
    problems += only_problems
    hosts = {h.name: h.data.dict() for h in inventory if h.name not in monitoring_only_hosts(inventory)}
    deployed = None
    if limit_hosts is not None:
        limited = {h.name for h in limit_hosts}
        cluster_name = {name: data.get("cluster_name") for name, data in hosts.items()}
        deployed = {name for name in hosts
                    if name in limited or cluster_name[name] in {cluster_name[x] for x in limited if x in cluster_name}}
    try:
        watchers = monitoring_hosts(inventory)
        configs = validate_hosts(hosts, deployed, watchers[0] if len(watchers) == 1 else None,
                                 {h.name: h.data.dict() for h in inventory if h.name in only})
        problems += monitoring_problems(inventory, configs)
    except InventoryValidationError as e:
        problems += e.problems
    if problems:
        raise InventoryValidationError(problems)
    return configs
