"""Audit fixtures: hosts and expected values come from the same inventory and schema the deploys use.

    pytest tests/audit                                        # state only (inventories/lab.py): read-only
    pytest tests/audit --inventory inventories/sandbox.py [--limit HOST_GROUP_OR_CLUSTER] [-m serving]
    pytest tests/audit --junitxml audit.xml -rf               # JUnit XML; one line per failed promise
    pytest tests/audit --full-verify                          # + re-hash every model file now (slow)
    pytest tests/audit -m serving                             # + a short smoke on each head (one request of each kind)
    pytest tests/audit -m drained [--qualify]                 # the load-bearing gates: a drained node only

Plain `pytest tests/audit` checks state only; the serving checks run when `-m` selects them (`serving`: one
request of each kind, safe beside users; `drained`: concurrency proof, KV capacity, long context and, with
`--qualify`, the restart: they take the node's slots or restart it). Every serving check first reads the unit:
an inactive, failed or crash-looping service fails at once with its state and journal, and one readiness
result (bounded by `service_ready_timeout_sec`) serves every check of that head.

Audits are read-only (`--qualify` aside): safe to run against production as a drift check. They connect with OpenSSH
(testinfra's ssh:// backend) using an ssh config generated from the inventory's connection data, so host
key checking follows the inventory (strict in inventories/lab.py).
"""

from __future__ import annotations

import importlib

# pyinfra's CLI package (which the inventory loader imports) monkey-patches the standard library with gevent when
# first imported: first, before anything imports ssl (requests, for the endpoint's checks), as the real CLI does.
importlib.import_module("pyinfra_cli")

import functools  # noqa: E402
import os  # noqa: E402
from dataclasses import dataclass

import pytest  # noqa: E402
import testinfra  # noqa: E402

from deploys.inventory import LimitError, limited_hosts, load_inventory, ssh_options
from deploys.schema import NodeConfig, validate_inventory
from deploys.schema.cross_host import monitoring_only_validated
from deploys.schema.monitoring import MonitoringHostConfig

DEFAULT_INVENTORY = os.environ.get("AUDIT_INVENTORY", "inventories/lab.py")


def pytest_addoption(parser):
    parser.addoption("--inventory", default=DEFAULT_INVENTORY,
                     help="pyinfra inventory whose hosts are audited (default: $AUDIT_INVENTORY or inventories/lab.py)")
    parser.addoption("--limit", action="append", default=[],
                     help="a host, group or cluster name or a host-name glob, as the deploy's --limit (repeatable)")
    parser.addoption("--full-verify", action="store_true",
                     help="also re-hash every model file against the manifest on each node (slow; writes nothing)")
    parser.addoption("--qualify", action="store_true",
                     help="also run the qualification gates that disturb a service (gate_restart: restarts it)")


SERVING_MARKERS = ("serving", "drained", "long_context")


def pytest_collection_modifyitems(config, items):
    """Without `-m`, the audit checks state only: the checks that send requests run when asked for."""
    if config.getoption("markexpr"):
        return
    keep = [i for i in items if not any(i.get_closest_marker(m) for m in SERVING_MARKERS)]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@dataclass
class Node:
    name: str
    cfg: NodeConfig  # (a MonitoringHostConfig for a monitoring-only host: the audits marked monitoring_only_host_too)
    host: object  # testinfra Host


def _ssh_config_block(name: str, data: dict) -> str:
    lines = [f"Host {name}", f"  HostName {data.get('ssh_hostname') or name}"]
    lines += [f"  {opt.replace('=', ' ', 1)}" for opt in ssh_options(data)]
    lines += ["  ControlMaster auto", "  ControlPath ~/.ssh/cm-audit-%C", "  ControlPersist 60"]
    return "\n".join(lines) + "\n"


@functools.cache
def audited_inventory(inventory_file: str, limits: tuple[str, ...]) -> tuple[dict[str, NodeConfig], dict[str, dict], list[str]]:
    """(typed config and host data of every host validated, the names the limits select), the limits resolved as
    the deploy resolves its --limit (deploys/inventory.py hosts_matching): a limit that selects nothing is an
    error, never a green audit of nothing; profile gaps outside the limit's clusters are left out as the deploy
    leaves them. The configs are the inference nodes'; a monitoring-only host is in the data and the selection,
    and its config in :func:`monitoring_only`."""
    from deploys.schema import InventoryValidationError

    inventory = load_inventory(inventory_file)
    try:
        limit = limited_hosts(inventory, limits)
        configs = validate_inventory(inventory, limit)
    except (LimitError, InventoryValidationError) as e:  # the problems, naming host and key; never a traceback
        raise pytest.UsageError(str(e)) from None
    only = monitoring_only(inventory_file)
    selected = [h.name for h in (inventory if limit is None else limit) if h.name in configs or h.name in only]
    return configs, {h.name: h.data.dict() for h in inventory if h.name in configs or h.name in only}, selected


@functools.cache
def monitoring_only(inventory_file: str) -> dict[str, MonitoringHostConfig]:
    """The monitoring-only host's config by name (none when the monitoring host is an inference node)."""
    return monitoring_only_validated(load_inventory(inventory_file))[0]


def load_nodes(inventory_file: str, limits: tuple[str, ...],
               monitoring_only_too: bool = False) -> list[tuple[str, NodeConfig | MonitoringHostConfig, dict]]:
    """(name, typed config, host data) of every inference node the limits select (all when none), and the
    monitoring-only host's where ``monitoring_only_too``."""
    configs, data, selected = audited_inventory(inventory_file, limits)
    only = monitoring_only(inventory_file) if monitoring_only_too else {}
    return [(name, configs.get(name) or only[name], data[name]) for name in selected if name in configs or name in only]


def pytest_generate_tests(metafunc):
    if "node_spec" in metafunc.fixturenames:
        nodes = load_nodes(metafunc.config.getoption("inventory"), tuple(metafunc.config.getoption("limit")),
                           metafunc.definition.get_closest_marker("monitoring_only_host_too") is not None)
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
    # every validated host, not only the limit's: a head's checks reach its cluster's workers (cluster_members)
    _, data, _ = audited_inventory(pytestconfig.getoption("inventory"), tuple(pytestconfig.getoption("limit")))
    path.write_text("".join(_ssh_config_block(name, d) for name, d in data.items() if not name.startswith("@")))
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

    configs, data, _ = audited_inventory(pytestconfig.getoption("inventory"), tuple(pytestconfig.getoption("limit")))
    specs = {name: (cfg, data[name]) for name, cfg in configs.items()}

    def members(node: Node) -> list[Node]:
        same = [(n, c) for n, (c, _) in specs.items() if c.cluster_name == node.cfg.cluster_name]
        return [Node(n, c, _testinfra_host(n, specs[n][1], ssh_config)) for n, c in restart_order(same)]
    return members


@pytest.fixture(scope="session")
def readiness():
    """node -> (ready, why): the service's readiness, read once per head for the whole session
    (deploys/serving_gate.py wait_serving, as the converge waits: fails at once on a unit that is not starting)."""
    from deploys.serving_gate import wait_serving

    seen: dict[str, tuple[bool, str]] = {}

    def ready(node: Node) -> tuple[bool, str]:
        if node.name not in seen:
            ok, why, _ = wait_serving(lambda command: node.host.run(command).stdout, node.cfg, True,
                                      node.cfg.service_ready_timeout_sec)
            seen[node.name] = (ok, f"{node.name}: {why}")
        return seen[node.name]
    return ready


@pytest.fixture
def serving_node(node, readiness) -> Node:
    """The head, once its service answers /health; fails at once (state, journal) when it cannot."""
    ok, why = readiness(node)
    if not ok:
        pytest.fail(why, pytrace=False)
    return node
