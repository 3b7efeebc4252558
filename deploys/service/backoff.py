"""A unit that heals for its whole life: the service restarts on any exit with a growing delay (deploys/service/
unit.py), and a timer on the node sets that delay back to its first step once the service has been healthy for
`service_backoff_reset_after_s` (files/inference_service/backoff_reset.py). systemd never does so by itself, so
after five self-heals in a unit's life every later heal would wait the longest delay (RESTART_MAX_DELAY_S)."""

from __future__ import annotations

from io import StringIO

from deploys.ops import atomic_put, unit_running, units_loaded
from deploys.run.reads import service_reads
from deploys.schema import NodeConfig
from deploys.unit_text import command_line
from facts.host import ManagedFiles, SystemdNeedsReload
from files import helper_path

UNIT = "inference-nodes-backoff-reset"
UNIT_DIR = "/etc/systemd/system"
HELPER = "/usr/local/lib/inference-nodes/backoff_reset.py"


def check_every_s(cfg: NodeConfig) -> int:
    """How often the timer looks: a quarter of the healthy time, at least every 10 s and at most every 5 min."""
    return min(300, max(10, cfg.service_backoff_reset_after_s // 4))


def render_service(cfg: NodeConfig) -> str:
    argv = ["/usr/bin/python3", HELPER, "--service", f"{cfg.container_name}.service",
            "--healthy-after", str(cfg.service_backoff_reset_after_s)]
    return (
        "# Managed by inference-nodes (deploys/service/backoff.py); local edits are overwritten.\n"
        "[Unit]\n"
        "Description=inference-nodes: reset the service's restart backoff once it has been healthy\n"
        "\n[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={command_line(argv)}\n"
    )


def render_timer(cfg: NodeConfig) -> str:
    return (
        "# Managed by inference-nodes (deploys/service/backoff.py); local edits are overwritten.\n"
        "[Unit]\n"
        "Description=inference-nodes: look at the service's restart backoff\n"
        "\n[Timer]\n"
        f"OnBootSec={check_every_s(cfg)}s\n"
        f"OnUnitActiveSec={check_every_s(cfg)}s\n"
        "AccuracySec=5s\n"
        "\n[Install]\n"
        "WantedBy=timers.target\n"
    )


UNITS = (f"{UNIT}.service", f"{UNIT}.timer")
BATCH = (HELPER, *(f"{UNIT_DIR}/{u}" for u in UNITS))  # read in one round trip


def backoff_reads() -> list:
    """What :func:`backoff_reset_installed` reads (for the calling deploy's ``expect``: one round trip with its own)."""
    return [(ManagedFiles, {"paths": BATCH}), (SystemdNeedsReload, {"units": UNITS}), *service_reads(f"{UNIT}.timer")]


def backoff_reset_installed(cfg: NodeConfig) -> None:
    """The helper, its oneshot service and its timer, loaded, enabled and started (a deploy's operations)."""
    atomic_put(batch=BATCH, name="Install the restart-backoff reset", src=helper_path("inference_service/backoff_reset.py"),
               dest=HELPER, user="root", group="root", mode="0644", create_remote_dir=True)
    atomic_put(batch=BATCH, name="Install its service", src=StringIO(render_service(cfg)),
               dest=f"{UNIT_DIR}/{UNIT}.service", user="root", group="root", mode="0644")
    atomic_put(batch=BATCH, name="Install its timer", src=StringIO(render_timer(cfg)), dest=f"{UNIT_DIR}/{UNIT}.timer",
               user="root", group="root", mode="0644")
    units_loaded(name="Load the restart-backoff units", units=list(UNITS))
    unit_running(name="Enable and start the restart-backoff timer", unit=f"{UNIT}.timer", running=True, enabled=True)
