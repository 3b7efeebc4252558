"""The rollout's run (python -m deploys.rollout) on the lab inventory, its converges and head reads replaced by a
record of what they were asked (the node tier runs the real ones): stage everything first, then the waves in
order; the first failure halts before any later wave; the ledger then refuses a new rollout and lets `--resume`
finish what is left."""

from __future__ import annotations

import json

import pytest

from deploys.rollout import __main__ as rollout
from deploys.rollout import ledger as ledgers


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """The sandbox inventory (three hosts, two clusters; the control-node files it names are made when it loads), a ledger
    directory of its own, and the converges recorded: each returns the hosts the test says fail in that phase
    (``failing``: (host, "stage" or "switch") pairs)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    runs: list[tuple[list[str], tuple[str, ...]]] = []
    failing: set[tuple[str, str]] = set()

    def converge(inventory_file, cluster_names, *extra):
        runs.append((list(cluster_names), extra))
        members = rollout.members_by_cluster(rollout.validate_inventory(rollout.load_inventory(inventory_file)))
        phase = "stage" if extra else "switch"
        return True, {h for c in cluster_names for h in members[c] if (h, phase) in failing}, ""
    monkeypatch.setattr(rollout, "converge", converge)
    monkeypatch.setattr(rollout.lab_status, "read_standings", lambda inventory, heads: {n: None for _, n, _ in heads})
    return "inventories/sandbox.py", runs, failing


def test_everything_is_staged_first_then_the_canary_then_the_rest(lab, capsys):
    inventory, runs, _ = lab
    assert rollout.main([inventory]) == 0
    assert runs == [(["rtx-pro-6000-pair", "gb10-dspark"], ("--data", "release_stage_only=true")),
                    (["rtx-pro-6000-pair"], ()), (["gb10-dspark"], ())]
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    assert {c: e.state for c, e in ledger.clusters.items()} == {"rtx-pro-6000-pair": "switched", "gb10-dspark": "switched"}
    assert "every cluster switched" in capsys.readouterr().out
    runs.clear()
    assert rollout.main([inventory]) == 0  # a finished ledger: the next rollout starts over
    assert len(runs) == 3


def test_a_failed_canary_halts_before_any_other_cluster_switches_and_resume_finishes(lab, capsys):
    inventory, runs, failing = lab
    failing.add(("sandbox-a", "switch"))
    assert rollout.main([inventory]) == 1
    assert runs[1:] == [(["rtx-pro-6000-pair"], ())], "a cluster switched after the canary failed"
    out = capsys.readouterr().out
    assert "halted: wave 0 failed on rtx-pro-6000-pair" in out and "not switched: rtx-pro-6000-pair, gb10-dspark" in out
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    assert ledger.halted and ledger.clusters["rtx-pro-6000-pair"].state == "failed"
    assert ledger.clusters["gb10-dspark"].state == "staged"
    runs.clear()
    assert rollout.main([inventory]) == 2 and runs == []  # unfinished: neither a fresh start nor a silent resume
    assert "--resume once the inventory is fixed" in capsys.readouterr().err
    failing.clear()
    assert rollout.main([inventory, "--resume"]) == 0
    # the failed cluster is staged again; the one staged before is not
    assert runs == [(["rtx-pro-6000-pair"], ("--data", "release_stage_only=true")), (["rtx-pro-6000-pair"], ()),
                    (["gb10-dspark"], ())]
    assert rollout.main([inventory, "--resume"]) == 2  # nothing left to resume


def test_a_stage_that_fails_anywhere_switches_nothing(lab, capsys):
    inventory, runs, failing = lab
    failing.add(("sandbox-b1", "stage"))
    assert rollout.main([inventory]) == 1
    assert runs == [(["rtx-pro-6000-pair", "gb10-dspark"], ("--data", "release_stage_only=true"))]
    assert "the stage failed on gb10-dspark: no cluster switched" in capsys.readouterr().out


def test_a_converge_that_gives_no_results_fails_every_cluster_it_ran(lab, monkeypatch):
    inventory, runs, _ = lab
    monkeypatch.setattr(rollout, "converge", lambda *a: (runs.append(a) or False, set(), "pyinfra exited 1"))
    assert rollout.main([inventory]) == 1
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    assert {e.state for e in ledger.clusters.values()} == {"failed"} and len(runs) == 1


def test_the_plan_changes_nothing_and_bad_options_say_why(lab, capsys):
    inventory, runs, _ = lab
    assert rollout.main([inventory, "--plan", "--max-down", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["wave 0 (canary): rtx-pro-6000-pair", "wave 1: gb10-dspark"]
    assert runs == [] and ledgers.load(ledgers.ledger_path(inventory)) is None
    assert rollout.main([inventory, "--serial", "200%"]) == 2
    assert rollout.main([inventory, "--limit", "nope"]) == 2
    assert "--serial 200%" in capsys.readouterr().err
    json.dumps(None)
