"""Podman's own Quadlet generator (the sandbox's, 5.4) accepts every unit rendered for the lab and the
sandbox inventories and generates a service from each (the 4.9.3 key allow-list is the unit tier's)."""

from __future__ import annotations

import subprocess

from deploys.inference_service import render_cluster
from deploys.inventory import inventory_configs, load_inventory
from tests.node.conftest import NODE_SH


def test_quadlet_generator_accepts_every_rendered_unit(sandbox, tmp_path):
    units = {}
    for inventory in ("inventories/lab.py", "inventories/sandbox.py"):
        for host, text in render_cluster(inventory_configs(load_inventory(inventory))).items():
            units[host.split(".")[0]] = text
    node = sandbox[0]
    script = ["set -e; d=$(mktemp -d)"]
    for name, text in units.items():
        script.append(f"cat > $d/{name}.container <<'UNIT'\n{text}UNIT")
    script.append("QUADLET_UNIT_DIRS=$d /usr/lib/systemd/system-generators/podman-system-generator --dryrun; rm -rf $d")
    proc = subprocess.run([NODE_SH, "ssh", node, "\n".join(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in units:
        assert f"---{name}.service---" in proc.stdout, name
    assert "unsupported key" not in proc.stdout + proc.stderr
    assert proc.stdout.count("ExecStartPre=/usr/local/bin/inference-nodes-model-gate") == len(units)
