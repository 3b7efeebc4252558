"""The `swarm` sync mode on a light cluster (tests/sandbox/fleet.py: three light nodes with systemd, sshd and
python3-libtorrent on one switch, every link capped; pyinfra runs from the control node's namespace on it).

The control node pushes one copy to the first node; that node makes the torrent of its verified copy and seeds the
other two over a private swarm; every node's verifier passes, the model audit passes, nothing of the swarm runs or
listens afterwards, the control node's uplink carried about one copy (not three), and a second run changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from deploys.model.swarm import SWARM_STATE, SWARM_UNIT
from tests.node.conftest import _cannot_boot, changed_operations, failure_excerpt
from tests.sandbox import fleet

pytestmark = pytest.mark.model  # the node tier's subject (`make test-fast SUBJECT=model`)

NODES = 3
RATE = "64mbit"
MODEL_STEP = "bench/fleet_deploy.py"  # the model's part of deploys/all.py: validate, snapshot, integrity


def in_ctl(*cmd: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(fleet.in_ns(fleet.CTL, *cmd), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def light_cluster(tmp_path_factory):
    reason = _cannot_boot()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"node tier cannot run under CI: {reason}")
        pytest.skip(reason)
    work = str(tmp_path_factory.mktemp("swarm"))
    fleet.down()
    fleet.control_node(RATE)
    hub, manifest, size = fleet.hub_started(work, 3, 8)
    try:
        fleet.up(NODES, RATE, None, {})
        inventory = os.path.join(work, "light.py")
        fleet.write_inventory(inventory, NODES, {
            "model_repo": fleet.REPO, "model_revision": fleet.COMMIT, "model_manifest": manifest,
            "model_hub_endpoint": f"http://127.0.0.1:{fleet.HUB_PORT}", "model_sync_mode": "swarm",
            "model_swarm_piece_mib": 1, "model_control_cache": os.path.join(work, "control-cache")})
        yield inventory, size
    finally:
        hub.terminate()
        fleet.down()


def converge(inventory: str) -> subprocess.CompletedProcess:
    proc = in_ctl(sys.executable, "-m", "pyinfra", "-y", "--json", inventory, MODEL_STEP)
    assert proc.returncode == 0, failure_excerpt(proc.stderr)
    return proc


def test_a_light_cluster_converges_through_the_swarm_and_audits_clean(light_cluster):
    inventory, size = light_cluster
    names = [fleet.node_name(i) for i in range(NODES)]
    before = fleet.counters()
    first = converge(inventory)
    after = fleet.counters()
    log = first.stderr
    assert f"seeding its verified model copy to {', '.join(names[1:])}" in log, log[-3000:]
    for name in names[1:]:
        assert "holds every piece from the swarm" in "\n".join(
            line for line in log.splitlines() if f"[{name}]" in line), log[-3000:]
    assert "the control node feeds it instead" not in log, log[-3000:]
    assert "serving its verified model copy on" not in log, log[-3000:]  # no rsync daemon of the push fan-out

    # the control node sent one copy (to the first node), the first node seeded the others
    moved = {n: {k: after[n][k] - before.get(n, {}).get(k, 0) for k in ("rx", "tx")} for n in after}
    control_out = moved[fleet.CTL]["rx"]
    assert size <= control_out < 1.3 * size, (control_out, size)
    assert moved[names[0]]["rx"] > 0.9 * size, moved  # the seed's uplink carried the others' copies
    for name in names[1:]:
        assert moved[name]["tx"] > size, moved

    for name in names:
        left = fleet.ssh(name, f"systemctl is-active {SWARM_UNIT}; test -e {SWARM_STATE} && echo state-left; "
                               "ss -Htln; pgrep -af '[s]warm.py serve' || true")
        assert left.stdout.split()[0] in ("inactive", "unknown"), left.stdout
        assert "state-left" not in left.stdout and ":6881" not in left.stdout and "swarm.py" not in left.stdout, \
            left.stdout

    audit = in_ctl(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "tests/audit/test_model_snapshot.py", "-k", "not start_gate", "--inventory", inventory)
    assert audit.returncode == 0, audit.stdout[-4000:] + audit.stderr[-2000:]
    assert "failed" not in audit.stdout.splitlines()[-1], audit.stdout[-2000:]

    again = converge(inventory)
    assert changed_operations(again) == [], changed_operations(again)


def test_the_control_node_seeds_where_the_inventory_says_so(light_cluster):
    """`model_swarm_seed: control`: two nodes lost their copy; the control node seeds them from its own copy (one
    swarm of three: the control node and both nodes), its seed ends with the run."""
    inventory, size = light_cluster
    names = [fleet.node_name(i) for i in range(1, NODES)]
    for name in names:
        assert fleet.ssh(name, "rm -rf /srv/model/*").returncode == 0
    with open(inventory) as f:
        text = f.read()
    control = inventory.replace(".py", "-control.py")
    with open(control, "w") as f:
        f.write(text.replace("'model_sync_mode': 'swarm'", "'model_sync_mode': 'swarm', 'model_swarm_seed': 'control', "
                             f"'model_swarm_control_address': '{fleet.CTL_ADDRESS}'"))
    before = fleet.counters()
    log = converge(control).stderr
    after = fleet.counters()
    assert f"control node: seeding {fleet.REPO}@{fleet.COMMIT[:12]} on {fleet.CTL_ADDRESS}:6881" in log, log[-3000:]
    for name in names:
        assert "holds every piece from the swarm" in "\n".join(
            line for line in log.splitlines() if f"[{name}]" in line), log[-3000:]
    assert "control node: its model seed stopped" in log, log[-3000:]
    assert "the control node feeds it instead" not in log, log[-3000:]
    moved = {n: after[n]["tx"] - before[n]["tx"] for n in names}
    assert all(v > size for v in moved.values()), moved
    assert in_ctl("sh", "-c", "ss -Htln; pgrep -af '[s]warm.py serve' || true").stdout.count(":6881") == 0



def test_a_seed_that_cannot_listen_leaves_its_nodes_to_the_control_node(light_cluster):
    """The first node's swarm port is taken (another listener on its address): its seed fails its listening check,
    and both other nodes are fed by the control node at once, with a warning each; the run passes."""
    inventory, size = light_cluster
    names = [fleet.node_name(i) for i in range(1, NODES)]
    for name in names:
        assert fleet.ssh(name, "rm -rf /srv/model/*").returncode == 0
    seed = fleet.node_name(0)
    taken = fleet.ssh(seed, "systemd-run --unit=port-taken python3 -m http.server 6881 --bind "
                            f"{fleet.address_of(seed)} && sleep 1")
    assert taken.returncode == 0, taken.stderr
    try:
        before = fleet.counters()
        log = converge(inventory).stderr
        after = fleet.counters()
    finally:
        fleet.ssh(seed, "systemctl stop port-taken")
    assert f"cannot listen on {fleet.address_of(seed)}:6881: the port is taken" in log, log[-3000:]
    for name in names:
        assert f"the model swarm cannot feed {name} ({seed}, the seed, is not seeding): the control node feeds it " \
               "instead" in log, log[-3000:]
    assert after[fleet.CTL]["rx"] - before[fleet.CTL]["rx"] > len(names) * size  # a copy each, from the control node
    left = fleet.ssh(seed, f"systemctl is-active {SWARM_UNIT}; test -e {SWARM_STATE} && echo state-left")
    assert left.stdout.split()[0] in ("inactive", "failed", "unknown") and "state-left" not in left.stdout, left.stdout


def test_a_run_killed_mid_swarm_is_finished_by_the_next(light_cluster):
    """The run is SIGKILLed (pyinfra and its children) while two nodes fetch from the seed (its uplink slowed to make
    the window): the swarms it started run on, bounded; the next run finishes the sync, every node verified, and
    stops every swarm: nothing is left."""
    inventory, size = light_cluster
    names = [fleet.node_name(i) for i in range(1, NODES)]
    seed = fleet.node_name(0)
    for name in names:
        assert fleet.ssh(name, "rm -rf /srv/model/*").returncode == 0
    fleet.cap(seed, "eth0", "8mbit")
    t0 = time.monotonic()
    try:
        run = subprocess.Popen(fleet.in_ns(fleet.CTL, sys.executable, "-m", "pyinfra", "-y", inventory, MODEL_STEP),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            status = fleet.ssh(names[0], f"cat {SWARM_STATE}/status.json 2>/dev/null", timeout=10).stdout
            if status and 0 < json.loads(status)["done"] < size:
                break
            time.sleep(0.5)
        assert run.poll() is None, "the run ended before the swarm was under way"
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        print(f"killed {time.monotonic() - t0:.1f} s into the run")
    finally:
        fleet.cap(seed, "eth0", RATE)
    running = [n for n in [seed, *names]
               if fleet.ssh(n, f"systemctl is-active {SWARM_UNIT}").stdout.strip() == "active"]
    assert seed in running, running  # the killed run's swarms go on (RuntimeMaxSec bounds them)
    t1 = time.monotonic()
    log = converge(inventory).stderr
    print(f"the next run took {time.monotonic() - t1:.1f} s")
    for name in [seed, *names]:
        left = fleet.ssh(name, f"systemctl is-active {SWARM_UNIT}; test -e {SWARM_STATE} && echo state-left; "
                               "ss -Htln")
        assert left.stdout.split()[0] in ("inactive", "unknown"), (name, left.stdout)
        assert "state-left" not in left.stdout and ":6881" not in left.stdout, (name, left.stdout)
    t2 = time.monotonic()
    again = converge(inventory)
    print(f"a third run: {time.monotonic() - t2:.1f} s")
    assert changed_operations(again) == [], (changed_operations(again), log[-2000:])
