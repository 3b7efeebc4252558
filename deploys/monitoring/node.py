"""On every node that turns monitoring on (`monitoring_enabled`): the distribution's `prometheus-node-exporter`
run as the toolkit's own unit on loopback and `node_exporter_address` only, and the textfile directory the stdlib
program files/monitoring/node_facts.py fills on a systemd timer (see deploys/monitoring/__init__.py)."""

from __future__ import annotations

import json
import posixpath
from io import StringIO

from pyinfra import host
from pyinfra.api import StringCommand, deploy
from pyinfra.facts.files import Directory, Link

from deploys.endpoint import closed_flag_path, url_host
from deploys.inventory import node_config
from deploys.model.snapshot import RECORD
from deploys.ops import (
    atomic_put,
    directory_present,
    distro_unit_masked,
    follow_up_done,
    follow_up_reads,
    follow_up_stamp,
    packages_installed,
    unit_running,
)
from deploys.run.held import as_served
from deploys.run.reads import expect, operation, read, service_reads, unit_state
from deploys.schema import NodeConfig
from deploys.schema.monitoring import MONITORING_GROUP
from deploys.service.door import switch_marker_path
from deploys.service.release import gate_last_path, gate_record_path
from deploys.service.unit import started_from_path
from deploys.unit_text import command_line, unit_word
from facts.host import ManagedFiles
from facts.nvidia import SMI_TIMEOUT_S
from files import helper_path

DIR = "/etc/inference-nodes/monitoring"
UNIT_DIR = "/etc/systemd/system"
TEXTFILE_DIR = "/var/lib/inference-nodes/metrics"

EXPORTER = "inference-nodes-node-exporter"
FACTS = "inference-nodes-node-facts"
FACTS_PROGRAM = "/usr/local/lib/inference-nodes/node_facts.py"
FACTS_CONFIG = f"{DIR}/node-facts.json"
NODE_FILES = (FACTS_PROGRAM, FACTS_CONFIG, *(f"{UNIT_DIR}/{u}" for u in (f"{EXPORTER}.service", f"{FACTS}.service",
                                                                         f"{FACTS}.timer")))
DISTRO_UNITS = {"prometheus-node-exporter": "prometheus-node-exporter.service",
                "prometheus": "prometheus.service", "prometheus-alertmanager": "prometheus-alertmanager.service"}

DEEP_VERIFY_PERIOD_S = {"daily": 86400, "weekly": 7 * 86400, "monthly": 31 * 86400}



def monitoring_host_name(inventory) -> str | None:
    """The host of the inventory group `monitoring` (validation allows one), or None."""
    if MONITORING_GROUP not in inventory.groups:
        return None
    members = inventory.get_group(MONITORING_GROUP)
    return members[0].name if members else None


def exporter_addresses(cfg: NodeConfig) -> list[str]:
    """Where the node's exporter listens: loopback, and the address the monitoring host reaches."""
    out = [f"127.0.0.1:{cfg.node_exporter_port}"]
    if cfg.node_exporter_address and cfg.node_exporter_address != "127.0.0.1":
        out.append(f"{url_host(cfg.node_exporter_address)}:{cfg.node_exporter_port}")
    return out


def deep_verify_max_age_s(cfg: NodeConfig) -> int:
    """How old the last deep verify may be: its period and its randomised window, and six hours."""
    return DEEP_VERIFY_PERIOD_S[cfg.model_deep_verify_every] + cfg.model_deep_verify_window_h * 3600 + 6 * 3600


def vllm_scrape(name: str, cfg: NodeConfig, watcher: str | None) -> str:
    """How a head's vLLM metrics reach Prometheus: "endpoint", "loopback" (the head is the monitoring host) or
    "textfile" (the node's facts program reads them on loopback and node-exporter serves them)."""
    if cfg.endpoint_enabled:
        return "endpoint"
    return "loopback" if name == watcher else "textfile"


def render_facts_config(name: str, cfg: NodeConfig, watcher: str | None) -> str:
    republish = cfg.is_head and vllm_scrape(name, cfg, watcher) == "textfile"
    return json.dumps({
        "out": f"{TEXTFILE_DIR}/inference_nodes.prom",
        "module_root": cfg.nvidia_module_root,
        "driver_branch": cfg.nvidia_driver_branch,
        "model_dir": cfg.model_dir,
        "deep_verify_record": RECORD,
        "deep_verify_max_age_s": deep_verify_max_age_s(cfg),
        "interval_s": cfg.monitoring_facts_interval_s,
        "gate_last": gate_last_path(cfg) if cfg.is_head else None,
        "gate_passed": gate_record_path(cfg) if cfg.is_head else None,
        "endpoint_closed_flag": closed_flag_path(cfg) if cfg.is_head else None,
        "switch_marker": switch_marker_path(cfg),
        "restart_account": f"{TEXTFILE_DIR}/restart-account.json",  # (not *.prom: node-exporter reads no other file)
        "started_from": started_from_path(cfg) if cfg.is_head else None,
        "service": f"{cfg.container_name}.service",
        "smi_timeout_s": SMI_TIMEOUT_S,
        "vllm_metrics_url": f"http://{url_host(cfg.engine_address)}:{cfg.engine_port}/metrics" if republish else None,
        "vllm_out": f"{TEXTFILE_DIR}/vllm.prom",
    }, indent=1, sort_keys=True) + "\n"


def render_exporter_unit(cfg: NodeConfig) -> str:
    argv = ["/usr/bin/prometheus-node-exporter", *(f"--web.listen-address={a}" for a in exporter_addresses(cfg)),
            f"--collector.textfile.directory={TEXTFILE_DIR}"]
    return f"""# inference-nodes: node-exporter with the toolkit's own metrics (deploys/monitoring.py)
[Unit]
Description=inference-nodes node-exporter: host, GPU and toolkit metrics for the monitoring host
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User=prometheus
ExecStart={command_line(argv)}
Restart=on-failure
RestartSec=5
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK
CapabilityBoundingSet=
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"""


def render_facts_service() -> str:
    return f"""# inference-nodes: the toolkit's own metrics for node-exporter's textfile collector (deploys/monitoring.py)
[Unit]
Description=inference-nodes: write the node's toolkit metrics (driver, deep verify, serving gate, GPUs)

[Service]
Type=oneshot
ExecStart={command_line(["/usr/bin/python3", FACTS_PROGRAM, "--config", FACTS_CONFIG])}
# nvidia-smi in the kernel on a GPU that fell off the bus cannot be killed: the run is stopped, its metrics go
# stale and NodeFactsStale fires, and the next run is not blocked behind it
TimeoutStartSec=120
Nice=10
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={unit_word(TEXTFILE_DIR)}
ProtectHome=read-only
PrivateTmp=yes
"""


def render_facts_timer(cfg: NodeConfig) -> str:
    return f"""# inference-nodes: how often the node's toolkit metrics are read (deploys/monitoring.py)
[Unit]
Description=inference-nodes: the node's toolkit metrics every {cfg.monitoring_facts_interval_s} s

[Timer]
OnActiveSec=1s
OnUnitActiveSec={cfg.monitoring_facts_interval_s}s
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


@operation()
def node_metrics_removed():
    """Monitoring turned off leaves nothing on the node: units stopped and disabled, files gone."""
    changed = False
    for unit in (f"{FACTS}.timer", f"{EXPORTER}.service"):
        running, enabled = unit_state(host, unit)
        if running or enabled:
            changed = True
            yield StringCommand("systemctl", "disable", "--now", unit)
    present = [p for p, info in read(host, ManagedFiles, paths=NODE_FILES).items() if info is not None]
    if present:
        changed = True
        yield StringCommand("rm", "-f", *present)
        yield StringCommand("rm", "-rf", TEXTFILE_DIR)
    if not changed:
        host.noop("no node metrics on this node")


def node_reads() -> list:
    distro = DISTRO_UNITS["prometheus-node-exporter"]
    return [(ManagedFiles, {"paths": NODE_FILES}), *service_reads(f"{EXPORTER}.service"), *service_reads(f"{FACTS}.timer"),
            (Link, {"path": f"{UNIT_DIR}/{distro}"}), *service_reads(distro), (Directory, {"path": TEXTFILE_DIR}),
            *follow_up_reads("node-exporter-unit", "node-facts-units")]


@deploy("Node metrics")
def node_metrics():
    """node-exporter and the toolkit's own metrics on this node (monitoring_enabled), or none."""
    cfg = node_config()
    expect(node_reads())
    if not cfg.monitoring_enabled:
        node_metrics_removed(name="No node metrics on this node (monitoring_enabled is off)")
        return
    watcher = monitoring_host_name(host.inventory)
    distro_unit_masked(name="Mask the distribution's prometheus-node-exporter.service (the toolkit runs its own unit)",
                       unit=DISTRO_UNITS["prometheus-node-exporter"], ours=f"{EXPORTER}.service")
    packages_installed(name="Install prometheus-node-exporter from the distribution", packages=["prometheus-node-exporter"],
                       recommends=False)
    directory_present(name="The textfile collector's directory", path=TEXTFILE_DIR)
    atomic_put(name="Install the node's metrics program", src=helper_path("monitoring/node_facts.py"), dest=FACTS_PROGRAM,
               mode="0755", batch=NODE_FILES)
    atomic_put(name="Configure the node's metrics program",
               src=StringIO(render_facts_config(host.name, as_served(cfg), watcher)),
               dest=FACTS_CONFIG, batch=NODE_FILES)
    units = {f"{UNIT_DIR}/{FACTS}.service": render_facts_service(), f"{UNIT_DIR}/{FACTS}.timer": render_facts_timer(cfg)}
    for path, text in units.items():
        atomic_put(name=f"Install {posixpath.basename(path)}", src=StringIO(text), dest=path, batch=NODE_FILES,
                   resets=follow_up_stamp("node-facts-units"))
    follow_up_done(name="Apply the metrics timer (daemon-reload, restart)", stamp="node-facts-units",
                   command=f"systemctl daemon-reload && systemctl restart {FACTS}.timer", paths=tuple(units),
                   contents=tuple(units.values()))
    unit_running(name=f"Start and enable {FACTS}.timer", unit=f"{FACTS}.timer")
    exporter = render_exporter_unit(cfg)
    path = f"{UNIT_DIR}/{EXPORTER}.service"
    atomic_put(name=f"Install {EXPORTER}.service", src=StringIO(exporter), dest=path, batch=NODE_FILES,
               resets=follow_up_stamp("node-exporter-unit"))
    follow_up_done(name="Apply node-exporter's unit (daemon-reload, restart)", stamp="node-exporter-unit",
                   command=f"systemctl daemon-reload && systemctl restart {EXPORTER}.service", paths=(path,),
                   contents=(exporter,))
    unit_running(name=f"Start and enable {EXPORTER}.service", unit=f"{EXPORTER}.service")
