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


def test_generated_exec_start_runs_exactly_the_rendered_command_line(sandbox):
    """What Podman's generator makes of Exec=, Environment= and HealthCmd= (systemd's quoting is the
    renderer's job): the image is followed by exactly the rendered vLLM command line."""
    import shlex

    from deploys.inference_service import container_argv, service_environment
    from deploys.schema import cluster_head, clusters

    configs = inventory_configs(load_inventory("inventories/lab.py"))
    by_cluster = clusters(configs)
    for host in ("gb10-b1.lab.example", "rtx-pro-a.lab.example"):
        cfg = configs[host]
        members = by_cluster[cfg.cluster_name]
        head, n = cluster_head(members), len(members)
        text = render_cluster(configs)[host]
        script = (f"set -e; d=$(mktemp -d); cat > $d/x.container <<'UNIT'\n{text}UNIT\n"
                  "QUADLET_UNIT_DIRS=$d /usr/lib/systemd/system-generators/podman-system-generator --dryrun; rm -rf $d")
        proc = subprocess.run([NODE_SH, "ssh", sandbox[0], script], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        start = next(line for line in proc.stdout.splitlines() if line.startswith("ExecStart="))
        argv = shlex.split(start.removeprefix("ExecStart="))
        image = argv.index(cfg.image_ref)
        assert argv[image + 1:] == container_argv(cfg, head, n), host
        envs = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
        for key, value in service_environment(cfg, head, n).items():
            assert f"{key}={value}" in envs, (host, key)
        if cfg.node_rank > 0:
            probe = argv[argv.index("--health-cmd") + 1]
            assert probe == "python3 /run/inference-nodes-job-probe.py --port 29500 --role worker"
            assert argv[argv.index("--health-on-failure") + 1] == "kill"
