"""The `swarm` sync mode's pure parts: what validation refuses before any connection (a layout the swarm cannot
write, a seed with no address, a wildcard or a host name to bind to, a port another listener takes), who seeds
whom, and the wait that tells a finished swarm from a dead or stalled one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from deploys.model import fanout as model_fanout
from deploys.model.fanout import Assignment, fanout_plan, swarm_waves
from deploys.schema import validate_hosts
from tests.unit.test_fleet_harness import fleet_configs
from tests.unit.test_hostile_input import node_a, pair_b
from tests.unit.test_values_as_consumers_read_them import _refused

SWARM = dict(model_sync_mode="swarm", model_layout="plain", model_root="/srv/model")


def test_a_swarm_node_validates_with_its_defaults():
    cfg = validate_hosts(node_a(**SWARM))["node-a"]
    assert (cfg.model_swarm_seed, cfg.model_swarm_port, cfg.model_swarm_keep_seeding_h) == ("first", 6881, 0)


REFUSED = [
    ("the cache layout", node_a(**{**SWARM, "model_layout": "hf_cache"}), ("node-a", "model_sync_mode"),
     "`swarm` with `model_layout: plain`"),
    ("a control seed with no address", node_a(**SWARM, model_swarm_seed="control"),
     ("node-a", "model_swarm_control_address"), "the control node's IP address"),
    ("a control seed on every address", node_a(**SWARM, model_swarm_seed="control",
                                                model_swarm_control_address="0.0.0.0"),
     ("node-a", "model_swarm_control_address"), "not a wildcard"),
    ("a control address that is a name", node_a(**SWARM, model_swarm_seed="control",
                                                 model_swarm_control_address="ctl.lab.example"),
     ("node-a", "model_swarm_control_address"), "an IP address"),
    ("a node reached by a host name", node_a(**SWARM, ssh_hostname="rtx-pro-a.lab.example"),
     ("node-a", "model_peer_address"), "an IP address of this node for the model swarm to bind to"),
    ("a node whose peer address is a wildcard", node_a(**SWARM, model_peer_address="0.0.0.0"),
     ("node-a", "model_peer_address"), "not a wildcard"),
    ("the swarm on sshd's port", node_a(**SWARM, ssh_port=2222, model_swarm_port=2222),
     ("node-a", "model_swarm_port"), "sshd (ssh_port)"),
    ("the swarm on a worker's exporter port", pair_b({}, {**SWARM, "monitoring_enabled": True, "model_swarm_port": 9100,
                                                          "node_exporter_address": "192.0.2.21"}),
     ("node-b1", "model_swarm_port"), "collides with node exporter"),
    ("a privileged port", node_a(**SWARM, model_swarm_port=80), ("node-a", "model_swarm_port"),
     "greater than or equal to 1024"),
]


@pytest.mark.parametrize("hosts,where,expected", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_unsafe_swarm_settings_are_refused_naming_host_and_key(hosts, where, expected):
    problems = _refused(hosts)
    assert where in problems, problems
    assert expected in problems[where]


def test_the_first_node_seeds_its_group_or_the_control_node_seeds_every_node():
    assert swarm_waves(["a", "b", "c"], "first") == {"a": Assignment(0, None), "b": Assignment(1, "a"),
                                                     "c": Assignment(1, "a")}
    assert swarm_waves(["a", "b", "c"], "control") == {n: Assignment(0, None) for n in "abc"}
    assert swarm_waves(["a"], "first") == {"a": Assignment(0, None)}


def test_swarm_and_push_hosts_of_one_commit_are_separate_groups(tmp_path):
    configs = sorted(fleet_configs(tmp_path, 3, {"model_sync_mode": "swarm"}).items())
    mixed = configs[:2] + [(configs[2][0], configs[2][1].model_copy(update={"model_sync_mode": "push"}))]
    assert fanout_plan(mixed) == {"fleet-00": Assignment(0, None), "fleet-01": Assignment(1, "fleet-00"),
                                  "fleet-02": Assignment(0, None)}
    assert sorted(model_fanout.distribution_groups(mixed).values()) == [["fleet-00", "fleet-01"], ["fleet-02"]]


def _wait(tmp_path, *args, timeout=30):
    return subprocess.run([sys.executable, "files/model_snapshot/swarm.py", "wait", str(tmp_path / "status.json"),
                           "--every", "1", *args], capture_output=True, text=True, timeout=timeout)


def _status(tmp_path, **fields):
    tmp = tmp_path / "status.tmp"
    tmp.write_text(json.dumps({"done": 0, "wanted": 100, "seeding": False, "peers": 1, **fields}))
    os.replace(tmp, tmp_path / "status.json")


def test_wait_returns_once_every_piece_is_held(tmp_path):
    _status(tmp_path, done=100, seeding=True)
    done = _wait(tmp_path)
    assert done.returncode == 0 and "(done)" in done.stdout, done.stdout + done.stderr


def test_wait_fails_when_the_swarm_stopped_writing_its_status(tmp_path):
    _status(tmp_path, done=10)
    old = time.time() - 60
    os.utime(tmp_path / "status.json", (old, old))
    dead = _wait(tmp_path, "--stale-s", "5")
    assert dead.returncode == 1 and "the swarm is not running" in dead.stderr, dead.stderr


def test_wait_fails_when_nothing_arrives_for_the_stall_bound(tmp_path):
    writer = subprocess.Popen([sys.executable, "-c", f"""
import json, os, time
for _ in range(40):
    with open({str(tmp_path / 'w.tmp')!r}, 'w') as f:
        json.dump({{"done": 10, "wanted": 100, "seeding": False, "peers": 0}}, f)
    os.replace({str(tmp_path / 'w.tmp')!r}, {str(tmp_path / 'status.json')!r})
    time.sleep(0.5)
"""])
    try:
        time.sleep(0.5)
        stalled = _wait(tmp_path, "--stall-s", "3")
    finally:
        writer.kill()
    assert stalled.returncode == 1 and "nothing arrived for 3 s (10 of 100 bytes, 0 peers)" in stalled.stderr, \
        stalled.stderr
