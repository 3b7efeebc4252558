"""The sandbox nodes an inventory names, as `name port gpus fabric driver` lines (for node.sh, the Makefile and
the tests)."""

from __future__ import annotations

import sys

from deploys.inventory import inventory_configs, load_inventory


def sandbox_nodes(inventory_file: str = "inventories/sandbox.py") -> list[tuple[str, int, int, str, str]]:
    """(name, ssh port, stand-in GPU count = the node's gpu_indices, fabric address or '-', `preinstalled` for a
    DGX OS node whose driver node.sh preinstalls, else '-') for every host; a monitoring-only host has no GPU."""
    inventory = load_inventory(inventory_file)
    configs = inventory_configs(inventory)
    return [(h.name, int(h.data.ssh_port), max(configs[h.name].gpu_indices) + 1,
             configs[h.name].fabric_address or "-",
             "preinstalled" if configs[h.name].nvidia_driver_source == "preinstalled" else "-")
            if h.name in configs else (h.name, int(h.data.ssh_port), 0, "-", "-") for h in inventory]


def generate_manifests(inventory_file: str = "inventories/sandbox.py", endpoint: str = "http://127.0.0.1:8802"):
    """Generate (with the project's own generator) the manifests of every (repo, commit) the sandbox pins,
    from the stand-in hub, into $SANDBOX_DIR/manifests/ where inventories/sandbox.py looks for them."""
    import json
    import os

    from deploys.model.manifest import generate

    out_dir = os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "manifests")
    os.makedirs(out_dir, exist_ok=True)
    from tests.sandbox.standin_hub import BROKEN_COMMIT

    pins = {(configs.model_repo, configs.model_revision)
            for configs in inventory_configs(load_inventory(inventory_file)).values()}
    # the scrambled known-answer model, for tests that pin it instead (HTTP 200 with nonsense)
    pins |= {(repo, BROKEN_COMMIT) for repo, _ in pins}
    for repo, commit in sorted(pins):
        path = os.path.join(out_dir, f"{repo.replace('/', '--')}@{commit}.json")
        with open(path, "w") as f:
            json.dump(generate(repo, commit, endpoint), f, indent=1, sort_keys=True)
        print(path)


def endpoint_lines(inventory_file: str = "inventories/sandbox.py") -> list[str]:
    """For each head with an endpoint, the curl line a client on the LAN runs: TLS verified against the lab CA, its
    key from a 0600 header file beside the clients file (never on a command line)."""
    import os

    from deploys.endpoint import endpoint_url
    from deploys.schema.control_readers import read_clients

    lines = []
    for cfg in inventory_configs(load_inventory(inventory_file)).values():
        if not (cfg.endpoint_enabled and cfg.is_head):
            continue
        clients = read_clients(cfg.endpoint_clients_file)
        client = next(n for n in clients if n != cfg.endpoint_metrics_client)
        header = os.path.join(os.path.dirname(cfg.endpoint_clients_file), f"{client}.header")
        fd = os.open(header, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"Authorization: Bearer {clients[client]}\n")
        lines.append(f"curl -sS --fail --cacert {cfg.endpoint_tls_ca} -H @{header} {endpoint_url(cfg)}/v1/models")
    return lines


def monitoring_lines(inventory_file: str = "inventories/sandbox.py") -> list[str]:
    """The monitoring host's Prometheus URL (on loopback: the sandbox's nodes share this machine's network) and the
    alerts active now, read from Prometheus; fails when Prometheus does not answer."""
    import json
    import urllib.request

    from deploys.monitoring.host import prometheus_url
    from deploys.monitoring.node import monitoring_host_name

    inventory = load_inventory(inventory_file)
    watcher = monitoring_host_name(inventory)
    if watcher is None:
        return ["no monitoring host in this inventory (group `monitoring`)"]
    from deploys.inventory import host_config

    url = prometheus_url(host_config(inventory.get_host(watcher)))
    with urllib.request.urlopen(url + "/api/v1/alerts", timeout=10) as r:
        alerts = json.load(r)["data"]["alerts"]
    with urllib.request.urlopen(url + "/api/v1/targets", timeout=10) as r:
        targets = json.load(r)["data"]["activeTargets"]
    up = sum(t["health"] == "up" for t in targets)
    lines = [f"  Prometheus on {watcher}: {url}  ({up} of {len(targets)} targets up; alerts: {url}/alerts)"]
    lines += [f"    {a['state']:8} {a['labels'].get('alertname')}"
              + (f" on {a['labels']['host']}" if a["labels"].get("host") else " (the monitoring itself)")
              + f": {a.get('annotations', {}).get('summary', '')}" for a in alerts] or ["    no alert is active"]
    return lines + delivered_lines()


def delivered_lines() -> list[str]:
    """What the demo's receiver (tests/sandbox/node.sh listener) took: the dead man's switch's pings and every other
    notification, from its log."""
    import os

    log = os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "monitoring", "webhook.log")
    try:
        with open(log) as f:
            lines = [line.rstrip("\n") for line in f if line[:1].isdigit()]
    except FileNotFoundError:
        return [f"  no receiver log ({log}): `tests/sandbox/node.sh listener` starts it"]
    pings = [line for line in lines if "dead man's switch" in line]
    others = [line for line in lines if "dead man's switch" not in line]
    out = [f"  Delivered to the receiver on 127.0.0.1:9199 ({log}):",
           f"    dead man's switch (/watchdog): {len(pings)} Watchdog ping(s)"
           + (f", the last at {pings[-1].split()[0]}" if pings else " (none: it would page)")]
    return out + ([f"    alerts webhook (/alerts): {line}" for line in others] or ["    alerts webhook (/alerts): nothing"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--manifests"]:
        generate_manifests(*sys.argv[2:])
    elif sys.argv[1:2] == ["--monitoring"]:
        print("\n".join(monitoring_lines(*sys.argv[2:])))
    elif sys.argv[1:2] == ["--endpoints"]:
        print("\n".join(endpoint_lines(*sys.argv[2:])))
    else:
        for node in sandbox_nodes(*sys.argv[1:]):
            print(*node)
