"""Model integrity over time: a systemd timer on every node re-hashes the whole snapshot against the pinned
manifest (bit rot, a bad copy, a careless `dd conv=notrunc`: what the stamp's size/mtime/inode cannot see).

The run is low impact (nice 19, idle IO class, batch CPU policy, a read-rate cap in the verifier and on the
device, files it read dropped from the page cache again; a run missed while the node was down is not started at
boot, when vLLM loads the same files) and records its verdict and time in RECORD, which the audit reads.
On a mismatch the verifier names the files in the journal and removes the stamp, so the service cannot
start again from the bad snapshot; with `model_deep_verify_on_mismatch: stop` it also stops the service.
The next converge repairs the files and restarts the service (its started-from record holds the stamp).
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api import deploy

from deploys.run.held import release_held
from deploys.run.reads import expect, service_reads
from deploys.inventory import node_config
from deploys.model.snapshot import MANIFEST, RECORD, STAMP, UPGRADE_MARKER, VERIFIER
from deploys.ops import atomic_put, unit_running, units_loaded
from deploys.schema import NodeConfig
from deploys.unit_text import command_line, unit_word
from facts.host import ManagedFiles, SystemdNeedsReload

UNIT = "inference-nodes-model-verify"
UNIT_DIR = "/etc/systemd/system"
CALENDAR = {"daily": "*-*-*", "weekly": "Sun *-*-*", "monthly": "*-*-01"}


def verify_argv(cfg: NodeConfig) -> list[str]:
    """The deep verify checks the live release: its manifest, and (`hf_cache`) the snapshot of that manifest's
    commit, not the inventory's, which may be a commit staged beside it that does not serve yet (issue 52 slice 5)."""
    where = [cfg.model_dir, "--hf-snapshot"] if cfg.model_layout == "hf_cache" else [cfg.snapshot_dir]
    argv = ["/usr/bin/python3", VERIFIER, MANIFEST, *where, "--stamp", STAMP, "--full",
            "--record", RECORD, "--drop-cold", "--quiet", "--skip-while", UPGRADE_MARKER]
    if cfg.model_deep_verify_max_mbps:
        argv += ["--max-rate", str(cfg.model_deep_verify_max_mbps)]
    if cfg.model_deep_verify_on_mismatch == "stop":
        argv += ["--stop-service", f"{cfg.container_name}.service"]
    return argv


def render_service(cfg: NodeConfig) -> str:
    return (
        "# Managed by inference-nodes (deploys/model/integrity.py); local edits are overwritten.\n"
        "[Unit]\n"
        "Description=inference-nodes: re-hash the model snapshot against the pinned manifest\n"
        f"ConditionPathExists={MANIFEST}\n"
        "\n[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={command_line(verify_argv(cfg))}\n"
        "Nice=19\n"
        "CPUSchedulingPolicy=batch\n"
        "IOSchedulingClass=idle\n"
        + (f"IOReadBandwidthMax={unit_word(cfg.model_dir)} {cfg.model_deep_verify_max_mbps}M\n"
           if cfg.model_deep_verify_max_mbps else "")
    )


# The timer's header still names this file's path before deploys/model/: other text would rewrite every node's
# timer (and reload systemd) on the next converge, so it changes with the timer's next real change.
def render_timer(cfg: NodeConfig) -> str:
    return (
        "# Managed by inference-nodes (deploys/model_integrity.py); local edits are overwritten.\n"
        "[Unit]\n"
        "Description=inference-nodes: scheduled deep verify of the model snapshot\n"
        "\n[Timer]\n"
        f"OnCalendar={CALENDAR[cfg.model_deep_verify_every]} {cfg.model_deep_verify_at}:00\n"
        f"RandomizedDelaySec={cfg.model_deep_verify_window_h}h\n"
        "Persistent=false\n"
        "\n[Install]\n"
        "WantedBy=timers.target\n"
    )


@deploy("Model integrity")
def model_integrity():
    cfg: NodeConfig = node_config()
    if cfg.model_manifest is None or release_held():
        return  # the model deploy refuses the host already / the deep verify checks the release that serves
    units = (f"{UNIT}.service", f"{UNIT}.timer")
    batch = tuple(f"{UNIT_DIR}/{u}" for u in units)  # read in one round trip
    expect([(ManagedFiles, {"paths": batch}), (SystemdNeedsReload, {"units": units}), *service_reads(f"{UNIT}.timer")])
    atomic_put(batch=batch, name="Install the deep verify service", src=StringIO(render_service(cfg)),
               dest=f"{UNIT_DIR}/{UNIT}.service", user="root", group="root", mode="0644")
    atomic_put(batch=batch, name="Install its timer", src=StringIO(render_timer(cfg)), dest=f"{UNIT_DIR}/{UNIT}.timer",
               user="root", group="root", mode="0644")
    units_loaded(name="Load the deep verify units", units=list(units))
    unit_running(name="Enable and start the deep verify timer", unit=f"{UNIT}.timer", running=True,
                    enabled=True)
