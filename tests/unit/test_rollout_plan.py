"""A rollout's waves and its ledger (deploys/rollout/): the canary first, the serial sizes in order with the last
repeating, the bound on clusters down at once, refused options; the ledger written whole and private, a damaged one
refused, and what a resume runs."""

from __future__ import annotations

import json
import os
import stat

import pytest

from deploys.rollout import ledger as ledger_mod
from deploys.rollout.plan import PlanError, parse_serial, plan_waves

TEN = [f"c{i}" for i in range(10)]


@pytest.mark.parametrize("serial,canaries,max_down,waves", [
    # Ansible's serial list after the canary: 1, then 25 % of 10 = 2, then the rest
    (["1", "25%", "100%"], [], None, [["c0"], ["c1"], ["c2", "c3"], ["c4", "c5", "c6", "c7", "c8", "c9"]]),
    # the last size repeats
    (["3"], [], None, [["c0"], ["c1", "c2", "c3"], ["c4", "c5", "c6"], ["c7", "c8", "c9"]]),
    # no serial: the canary, then everything else at once
    ([], [], None, [["c0"], TEN[1:]]),
    # the canaries the inventory marks (one per hardware class) switch first, together
    (["100%"], ["c3", "c7"], None, [["c3", "c7"], ["c0", "c1", "c2", "c4", "c5", "c6", "c8", "c9"]]),
    # never more than max_down clusters down at once, the canary wave included
    (["100%"], ["c3", "c7"], 1, [["c3"], ["c7"], *[[c] for c in TEN if c not in ("c3", "c7")]]),
    (["100%"], [], 4, [["c0"], ["c1", "c2", "c3", "c4"], ["c5", "c6", "c7", "c8"], ["c9"]]),
    # a percentage below one cluster is one
    (["5%"], [], None, [[c] for c in TEN]),
])
def test_waves(serial, canaries, max_down, waves):
    planned = plan_waves(TEN, canaries, parse_serial(serial), max_down)
    assert planned == waves
    assert sorted(c for w in planned for c in w) == sorted(TEN)  # every cluster once, none split


def test_a_single_cluster_is_its_own_canary_and_nothing_is_planned_for_none():
    assert plan_waves(["only"], [], parse_serial(["1"])) == [["only"]]
    assert plan_waves([], [], [1.0]) == []


@pytest.mark.parametrize("serial", ["0", "0%", "150%", "-1", "a", "1.5", "25 %x"])
def test_a_serial_that_cannot_be_planned_is_refused(serial):
    with pytest.raises(PlanError, match=f"--serial {serial.strip() if serial != '25 %x' else '25 %x'}"):
        parse_serial([serial])


def test_bad_bounds_and_unknown_canaries_are_refused():
    with pytest.raises(PlanError, match="--max-down 0"):
        plan_waves(TEN, [], [1.0], 0)
    with pytest.raises(PlanError, match="canary nope: not a cluster of this rollout"):
        plan_waves(TEN, ["nope"], [1.0])


def _ledger(tmp_path):
    asked = {c: {"image": "registry.example/vllm@sha256:" + "a" * 64, "model_revision": "b" * 40} for c in TEN[:4]}
    return ledger_mod.Ledger(inventory=str(tmp_path / "lab.py"), waves=plan_waves(TEN[:4], [], [1]),
                             clusters={c: ledger_mod.ClusterEntry(asked=a) for c, a in asked.items()})


def test_the_ledger_is_written_whole_private_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = ledger_mod.ledger_path(str(tmp_path / "lab.py"))
    assert path.startswith(str(tmp_path / "state" / "inference-nodes" / "rollouts")) and "/lab-" in path
    ledger = _ledger(tmp_path)
    ledger.mark("c0", "switched")
    ledger_mod.save(path, ledger)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert not os.path.exists(path + ".tmp")
    again = ledger_mod.load(path)
    assert again == ledger and again.clusters["c0"].state == "switched"
    with pytest.raises(ValueError, match="state gone"):
        ledger.mark("c1", "gone")
    with open(path, "w") as f:
        f.write('{"inventory": ')
    with pytest.raises(ValueError, match="is damaged .*move it aside"):
        ledger_mod.load(path)
    assert ledger_mod.load(str(tmp_path / "none.json")) is None


def test_a_resume_runs_what_is_not_switched_and_restarts_what_the_fix_changed(tmp_path):
    ledger = _ledger(tmp_path)
    assert ledger.remaining_waves() == [["c0"], ["c1"], ["c2"], ["c3"]]
    ledger.mark("c0", "switched")
    ledger.mark("c1", "failed", "the gate failed")
    ledger.halted = "c1 failed"
    fixed = {c: dict(e.asked) for c, e in ledger.clusters.items()}
    again = ledger_mod.resumed(ledger, fixed)  # the same release asked: c1 is tried again, c0 stays done
    assert again.halted is None and again.remaining_waves() == [["c1"], ["c2"], ["c3"]]
    again.mark("c1", "switched")
    fixed["c0"] = {**fixed["c0"], "model_revision": "c" * 40}  # the fix asks c0 for another release: c0 again
    assert ledger_mod.resumed(again, fixed).remaining_waves() == [["c0"], ["c2"], ["c3"]]
    json.loads(again.as_json())
