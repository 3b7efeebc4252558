"""See what a deploy would install, without connecting: every file the components write, per host.

    python -m deploys.render INVENTORY OUTDIR [--limit HOST_GROUP_OR_CLUSTER ...] [--distro ubuntu2404]

writes `OUTDIR/<host>/<absolute path on the node>` for the units, env files, limits, apt pins and
sources, registries, the model gate and the fabric env, from the same renderers the deploys use.
Secrets (registry credentials, hub token) are never rendered: only a note that the deploy copies them.
The CUDA repo path needs the node's distribution, which is read on the node: `--distro` (default
`ubuntu2404`) stands in for it here.
"""

from __future__ import annotations

import argparse
import os
import sys

from deploys import apt_state, container_runtime, endpoint, host_tuning, nvidia_driver
from deploys.monitoring import host as mon_host, node as mon_node
from deploys.model import integrity as model_integrity, snapshot as model_snapshot
from deploys.inventory import LimitError, limited_hosts, load_inventory
from deploys.service import backoff as service_backoff, unit as service_unit
from deploys.schema import InventoryValidationError, NodeConfig, cluster_of, validate_inventory
from deploys.schema.control_readers import read_clients
from deploys.schema.cross_host import monitoring_only_validated


def host_files(cfg: NodeConfig, head: NodeConfig | None, nodes: int, members: list[NodeConfig],
               distro: str = "ubuntu2404") -> dict[str, str]:
    """Node path -> content of every file the deploy writes from templates for this host."""
    out = {
        apt_state.LOCK_DROPIN: apt_state.render_lock_dropin(cfg.apt_lock_timeout_s),
        nvidia_driver.PIN_FILE: nvidia_driver.render_apt_pin(cfg.nvidia_driver_branch),
        nvidia_driver.UNATTENDED_FILE: nvidia_driver.render_unattended_blacklist(cfg),
        container_runtime.TOOLKIT_SOURCE: container_runtime.render_toolkit_source(cfg, container_runtime.DEB_ARCH[cfg.node_arch]),
        container_runtime.REFRESH_ENV: container_runtime.render_refresh_env(cfg),
        container_runtime.REGISTRIES_FILE: container_runtime.render_registries(cfg),
        host_tuning.LIMITS_FILE: host_tuning.render_limits(cfg),
        host_tuning.SYSTEMD_DEFAULTS_FILE: host_tuning.render_systemd_defaults(cfg),
        cfg.fabric_env_file: host_tuning.render_fabric_env(cfg),
        model_snapshot.GATE: model_snapshot.render_gate(cfg.snapshot_dir),
        f"{model_integrity.UNIT_DIR}/{model_integrity.UNIT}.service": model_integrity.render_service(cfg),
        f"{model_integrity.UNIT_DIR}/{model_integrity.UNIT}.timer": model_integrity.render_timer(cfg),
        f"{service_unit.UNIT_DIR}/{cfg.container_name}.container":
            service_unit.render_container(cfg, head, nodes, members),
        service_unit.service_env_path(cfg): service_unit.render_service_env(cfg, head, nodes),
        f"{service_backoff.UNIT_DIR}/{service_backoff.UNIT}.service": service_backoff.render_service(cfg),
        f"{service_backoff.UNIT_DIR}/{service_backoff.UNIT}.timer": service_backoff.render_timer(cfg),
    }
    if cfg.nvidia_driver_source == "cuda_repo":
        path = nvidia_driver.cuda_repo_path({"id": distro, "version_id": ""}, cfg.node_arch)
        out[nvidia_driver.CUDA_SOURCE] = nvidia_driver.render_cuda_source(cfg, path)
    if cfg.registry_auth_file:
        out[container_runtime.AUTH_FILE] = "# not rendered: the deploy copies registry_auth_file here (0600)\n"
    if cfg.model_hub_token_file:
        out[model_snapshot.HUB_TOKEN] = "# not rendered: the deploy copies model_hub_token_file here (0600)\n"
    if cfg.is_head:
        out[endpoint.CONF] = endpoint.render_conf(cfg)
        out[endpoint.UNIT_PATH] = endpoint.render_unit(cfg)
        out[endpoint.LOGROTATE] = endpoint.render_logrotate()
    if cfg.endpoint_enabled and cfg.is_head:
        for path, key in ((endpoint.CERT, "endpoint_tls_cert"), (endpoint.KEY, "endpoint_tls_key")):
            out[path] = f"# not rendered: the deploy copies {key} here (0600)\n"
        names = list(read_clients(cfg.endpoint_clients_file))
        for path, which in ((endpoint.CLIENTS_MAP, [n for n in names if n != cfg.endpoint_metrics_client]),
                            (endpoint.MONITOR_MAP, [n for n in names if n == cfg.endpoint_metrics_client])):
            out[path] = (f"# not rendered: the keys of endpoint_clients_file (0600) for: {', '.join(which) or 'nobody'}\n")
    return out


def render_inventory(inventory_file: str, out_dir: str, limit: list[str] | tuple[str, ...] = (),
                     distro: str = "ubuntu2404") -> list[str]:
    """Render the files of the hosts ``limit`` selects (deploys/inventory.py hosts_matching; all when empty)."""
    inventory = load_inventory(inventory_file)
    limited = limited_hosts(inventory, limit)
    configs = validate_inventory(inventory, limited)  # every host first (C's profile gaps only outside --limit)
    only = monitoring_only_validated(inventory)[0]  # a monitoring-only host: its monitoring files alone
    selected = {*configs, *only} if limited is None else {h.name for h in limited}
    watcher = mon_node.monitoring_host_name(inventory)
    written = []
    for name in [*configs, *only]:
        if name not in selected:
            continue
        files = {apt_state.LOCK_DROPIN: apt_state.render_lock_dropin(only[name].apt_lock_timeout_s)} if name in only else {}
        if name in configs:
            cluster = cluster_of(configs, name)
            files = host_files(configs[name], cluster.head, cluster.size, cluster.members, distro)
        files.update(mon_host.rendered_files(name, configs, watcher, only.get(name)))
        for path, text in files.items():
            dest = inside_out_dir(out_dir, name, path)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # env files too
                f.write(text)
            written.append(dest)
    return written


def inside_out_dir(out_dir: str, host: str, node_path: str) -> str:
    """Where ``node_path`` of ``host`` is rendered: below OUTDIR/<host>/, or refused (validation refuses such
    host names already; this is the writer's own guard, links included)."""
    base = os.path.realpath(out_dir)
    host_dir = os.path.realpath(os.path.join(base, host))
    dest = os.path.realpath(os.path.join(host_dir, node_path.lstrip("/")))
    if not host_dir.startswith(base + os.sep) or not dest.startswith(host_dir + os.sep):
        raise SystemExit(f"host {host}: {node_path} would be written outside {out_dir}/{host}/: refused")
    return dest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploys.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("out_dir")
    parser.add_argument("--limit", action="append", default=[],
                        help="a host, group or cluster (host names match as globs; repeatable), as the deploy's --limit")
    parser.add_argument("--distro", default="ubuntu2404", help="the nodes' distribution for NVIDIA's repo path")
    args = parser.parse_args(argv)
    try:
        written = render_inventory(args.inventory, args.out_dir, args.limit, args.distro)
    except (LimitError, InventoryValidationError) as e:
        print(e, file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
