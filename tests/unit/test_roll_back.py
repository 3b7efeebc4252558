"""Taking a cluster back to the release before (deploys/roll_back.py): the head's decision from what it serves and
keeps, and the previous release promoted to the good one by a real shell."""

from __future__ import annotations

import json
import subprocess

import pytest

from deploys.service.roll_back import promote_previous_command, release_before, roll_back_decision

NEW = {"release": "b" * 16, "image": "reg/vllm@sha256:" + "b" * 64, "model_revision": "2" * 40}
OLD = {"release": "a" * 16, "image": "reg/vllm@sha256:" + "a" * 64, "model_revision": "1" * 40}


@pytest.mark.parametrize("served, leaving, previous, kept, act, words", [
    (NEW, {NEW["release"]}, OLD, 2, "roll back", "back to release aaaaaaaaaaaaaaaa"),
    (OLD, {NEW["release"]}, {}, 2, "stay", "not a release to leave"),           # a second run: rolled back already
    ({}, {NEW["release"]}, OLD, 2, "stay", "no gated release"),                  # never served one
    (NEW, {NEW["release"]}, {}, 2, "refuse", "no good release before"),          # the first release it ever served
    (NEW, {NEW["release"], OLD["release"]}, OLD, 2, "refuse", "one to leave too"),
    (NEW, {NEW["release"]}, OLD, 1, "refuse", "releases_kept=1 pruned"),         # its model and image are gone
])
def test_the_head_decides_from_what_it_serves_and_keeps(served, leaving, previous, kept, act, words):
    got, why = roll_back_decision("node-1", served, leaving, previous, kept)
    assert got == act and words in why and why.startswith("node-1")


def test_the_previous_release_becomes_the_good_one(tmp_path, monkeypatch):
    from deploys.service import release as svc
    from deploys.schema import NodeConfig
    from tests.unit.profiles import profile

    monkeypatch.setattr(svc, "RELEASES_DIR", str(tmp_path))
    cfg = NodeConfig.model_validate({**profile("gb10_dspark"), "node_rank": 0, "fabric_address": "198.51.100.20",
                                     "tensor_parallel_size": 1})
    root = tmp_path / cfg.container_name
    for name, release in (("good", NEW), ("previous", OLD)):
        (root / name).mkdir(parents=True)
        (root / name / "release.json").write_text(json.dumps(release))
    command = promote_previous_command(cfg)
    assert subprocess.run(["sh", "-c", command], timeout=30).returncode == 0
    assert json.loads((root / "good" / "release.json").read_text()) == OLD
    assert sorted(p.name for p in root.iterdir()) == ["good"]
    assert subprocess.run(["sh", "-c", command], capture_output=True, timeout=30).returncode != 0  # none left: refused
    assert json.loads((root / "good" / "release.json").read_text()) == OLD


def test_the_release_before_is_the_previous_one_or_a_killed_roll_backs_good_one():
    assert release_before(OLD, NEW, NEW) == OLD
    assert release_before({}, OLD, NEW) == OLD  # killed after the promote, before the gate record: the next run finishes
    assert release_before({}, NEW, NEW) == {}   # the only release it kept is the one it serves
    assert release_before({}, {}, NEW) == {}
