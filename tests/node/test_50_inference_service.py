"""Podman's own Quadlet generator (the sandbox's, 5.4) accepts every unit rendered for the lab and the
sandbox inventories and generates a service from each (the 4.9.3 key allow-list is the unit tier's)."""

from __future__ import annotations

import subprocess

from deploys.service.unit import render_cluster
from deploys.inventory import inventory_configs, load_inventory
from tests.node.conftest import NODE_SH
from tests.unit.profiles import lab_filled_in


def test_quadlet_generator_accepts_every_rendered_unit(sandbox, tmp_path):
    units = {}
    for inventory in (lab_filled_in(tmp_path), "inventories/sandbox.py"):  # C with its profile gaps set
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


def test_generated_exec_start_runs_exactly_the_rendered_command_line(sandbox, tmp_path):
    """What Podman's generator makes of Exec=, EnvironmentFile= and HealthCmd= (systemd's quoting is the
    renderer's job): the image is followed by exactly the rendered vLLM command line, and the environment
    comes only from the env files, the service's own last."""
    import shlex

    from deploys.service.unit import container_argv, service_env_path
    from deploys.schema import cluster_head, clusters

    configs = inventory_configs(load_inventory(lab_filled_in(tmp_path)))
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
        assert "--env" not in argv[:image], "no value in the world-readable unit"
        env_files = [argv[i + 1] for i, a in enumerate(argv[:image]) if a == "--env-file"]
        assert env_files[0] == cfg.fabric_env_file and env_files[-1] == service_env_path(cfg), env_files
        if cfg.node_rank > 0:
            probe = argv[argv.index("--health-cmd") + 1]
            assert probe == "python3 /run/inference-nodes-job-probe.py --port 29500 --role worker"
            assert argv[argv.index("--health-on-failure") + 1] == "kill"


# Values an admin could type that systemd or Quadlet would otherwise read differently: quotes, backslashes,
# specifiers, variables, spaces, non-ASCII, an attempt to smuggle a second --env, an empty argument.
HOSTILE_ARGS = ["--x", 'a "quoted" b', "back\\slash", "trailing\\", "50%", "%h", "$HOME", "${PATH}", "it's",
                "a;b && c", "modèle-ü-日本", "--y=1 --z=2"]  # an empty one is refused by validation (Quadlet drops it and
# everything after it)
HOSTILE_ENV = {"MODE": 'x" "LD_PRELOAD=/tmp/evil.so', "PCT": "100%", "VAR": "$PATH", "BS": "a\\b\\",
               "UNI": "café ✓", "SP": "two words", "Q": "'"}


def _hostile_configs(tmp_path):
    from deploys.schema import validate_hosts

    inv = load_inventory(lab_filled_in(tmp_path))
    hosts = {h.name: h.data.dict() for h in inv}
    for name in ("gb10-b0.lab.example", "gb10-b1.lab.example"):
        hosts[name]["vllm_args"] = list(hosts[name].get("vllm_args", [])) + HOSTILE_ARGS
        hosts[name]["service_env"] = {**hosts[name].get("service_env", {}), **HOSTILE_ENV}
    a = "rtx-pro-a.lab.example"
    hosts[a]["service_env"] = {**hosts[a]["service_env"], **HOSTILE_ENV}
    return validate_hosts(hosts)


def test_hostile_values_reach_the_process_exactly_as_written(sandbox, tmp_path):
    """The escaping writers proven end to end: each unit goes through Podman's Quadlet generator, then systemd
    itself runs the generated ExecStart= (podman swapped for a program that records its argv). The recorded
    argv holds exactly the intended vLLM arguments after the image; the environment is only named (env files).
    Then the real Podman reads each rendered service env file into a container: exactly the intended
    variables, hostile values included."""
    import json

    from deploys.service.unit import container_argv, render_service_env, service_env_path, service_environment
    from deploys.schema import cluster_head, clusters

    configs = _hostile_configs(tmp_path)
    by_cluster = clusters(configs)
    units = render_cluster(configs)
    dump = ("#!/usr/bin/python3\nimport json, sys\n"
            "json.dump(sys.argv[1:], open('/run/argv-dump.json', 'w'), ensure_ascii=False)\n")
    for host in ("gb10-b0.lab.example", "gb10-b1.lab.example", "rtx-pro-a.lab.example"):
        cfg = configs[host]
        members = by_cluster[cfg.cluster_name]
        head, n = cluster_head(members), len(members)
        script = (
            "set -e; d=$(mktemp -d); "
            f"cat > /usr/local/bin/argv-dump <<'DUMP'\n{dump}DUMP\nchmod 0755 /usr/local/bin/argv-dump\n"
            f"cat > $d/x.container <<'UNIT'\n{units[host]}UNIT\n"
            "start=$(QUADLET_UNIT_DIRS=$d /usr/lib/systemd/system-generators/podman-system-generator --dryrun "
            "| grep '^ExecStart=' | sed 's|^ExecStart=/usr/bin/podman |ExecStart=/usr/local/bin/argv-dump |')\n"
            "rm -rf $d /run/argv-dump.json\n"
            "printf '[Service]\\nType=oneshot\\n%s\\n' \"$start\" > /run/systemd/system/argv-dump.service\n"
            "systemctl daemon-reload && systemctl start argv-dump.service\n"
            "cat /run/argv-dump.json; rm -f /run/systemd/system/argv-dump.service; systemctl daemon-reload"
        )
        proc = subprocess.run([NODE_SH, "ssh", sandbox[0], script], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        argv = json.loads(proc.stdout.strip().splitlines()[-1])
        assert argv[0] == "run", argv[:3]
        image = argv.index(cfg.image_ref)
        assert argv[image + 1:] == container_argv(cfg, head, n), host
        assert "--env" not in argv[:image], host
        env_files = [argv[i + 1] for i, a in enumerate(argv[:image]) if a == "--env-file"]
        assert env_files[-1] == service_env_path(cfg), host
        # the real Podman reads the env file as the service's would be read (the sandbox image, any name)
        image_ref = inventory_configs(load_inventory("inventories/sandbox.py"))["sandbox-a"].image_ref
        read = ("set -e; f=$(mktemp); cat > $f <<'ENV'\n" + render_service_env(cfg, head, n) + "ENV\n"
                f"podman run --rm --pull=never --network=host --env-file $f --entrypoint python3 {image_ref} -c "
                "'import json, os; print(json.dumps(dict(os.environ)))'; rm -f $f")
        proc = subprocess.run([NODE_SH, "ssh", sandbox[0], read], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        env = json.loads(proc.stdout.strip().splitlines()[-1])
        expected = service_environment(cfg, head, n)
        assert {k: env.get(k) for k in expected} == expected, host
        assert "LD_PRELOAD" not in env
