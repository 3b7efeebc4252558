"""The rollout's run (python -m deploys.rollout) on the lab inventory, its converges and head reads replaced by a
record of what they were asked (the node tier runs the real ones): stage everything first, then the waves in
order; the first failure halts before any later wave; the ledger then refuses a new rollout and lets `--resume`
finish what is left."""

from __future__ import annotations

import json

import pytest

from deploys.rollout import __main__ as rollout
from deploys.rollout import ledger as ledgers

BENCH = ("--data", "release_bench=true")


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """The sandbox inventory (three hosts, two clusters; the control-node files it names are made when it loads), a ledger
    directory of its own, and the converges recorded: each returns the hosts the test says fail in that phase
    (``failing``: (host, "stage", "switch" or "abort") pairs)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    runs: list[tuple[list[str], tuple[str, ...]]] = []
    failing: set[tuple[str, str]] = set()

    def converge(inventory_file, cluster_names, *extra, deploy="deploys/all.py"):
        runs.append((list(cluster_names), extra) if deploy == "deploys/all.py" else (deploy, list(cluster_names), extra))
        members = rollout.members_by_cluster(rollout.validate_inventory(rollout.load_inventory(inventory_file)))
        phase = "abort" if deploy != "deploys/all.py" else "stage" if "release_stage_only=true" in extra else "switch"
        return True, {h for c in cluster_names for h in members[c] if (h, phase) in failing}, ""
    monkeypatch.setattr(rollout, "converge", converge)
    monkeypatch.setattr(rollout.lab_status, "read_standings", lambda inventory, heads: {n: None for _, n, _ in heads})
    return "inventories/sandbox.py", runs, failing


def test_everything_is_staged_first_then_the_canary_then_the_rest(lab, capsys):
    inventory, runs, _ = lab
    assert rollout.main([inventory]) == 0
    assert runs == [(["rtx-pro-6000-pair", "gb10-dspark"], ("--data", "release_stage_only=true")),
                    (["rtx-pro-6000-pair"], BENCH), (["gb10-dspark"], BENCH)]
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
    assert runs[1:] == [(["rtx-pro-6000-pair"], BENCH)], "a cluster switched after the canary failed"
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
    assert runs == [(["rtx-pro-6000-pair"], ("--data", "release_stage_only=true")), (["rtx-pro-6000-pair"], BENCH),
                    (["gb10-dspark"], BENCH)]
    assert rollout.main([inventory, "--resume"]) == 2  # nothing left to resume


def test_abort_rolls_back_what_the_rollout_switched_or_tried_to(lab, capsys):
    inventory, runs, failing = lab
    assert rollout.main([inventory, "--abort"]) == 2 and "no rollout to abort" in capsys.readouterr().err
    failing.add(("sandbox-b0", "switch"))  # the pair's wave fails after the canary switched
    assert rollout.main([inventory]) == 1
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    ids = ",".join(sorted(e.asked["release"] for e in ledger.clusters.values()))
    # the pair failed its switch: its converge rolled it back, or (a loud bake) it still serves the new release;
    # its heads decide (deploys/roll_back.py changes nothing where the release left does not serve)
    abort_run = [("deploys/roll_back.py", ["gb10-dspark", "rtx-pro-6000-pair"], ("--data", f"roll_back_from={ids}"))]
    runs.clear()
    failing.add(("sandbox-a", "abort"))
    assert rollout.main([inventory, "--abort"]) == 1  # A's roll back failed: the ledger says so and stays open
    assert runs == abort_run
    assert "not rolled back: rtx-pro-6000-pair" in capsys.readouterr().out
    assert rollout.main([inventory]) == 2 and "--abort again" in capsys.readouterr().err
    assert rollout.main([inventory, "--resume"]) == 2
    failing.clear()
    runs.clear()
    assert rollout.main([inventory, "--abort"]) == 0
    assert runs == [("deploys/roll_back.py", ["rtx-pro-6000-pair"], ("--data", f"roll_back_from={ledger.clusters['rtx-pro-6000-pair'].asked['release']}"))]
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    assert ledger.aborted and {e.state for e in ledger.clusters.values()} == {"rolled back"}
    runs.clear()
    assert rollout.main([inventory, "--abort"]) == 0 and runs == []  # nothing switched is left to roll back
    runs.clear()
    assert rollout.main([inventory, "--resume"]) == 2  # an aborted rollout is over: a new one starts over
    assert rollout.main([inventory]) == 0 and len(runs) == 3


def test_abort_leaves_a_cluster_that_served_the_release_before_the_rollout(lab, monkeypatch):
    inventory, runs, _ = lab
    asked = {}

    def standings(inventory_, heads):  # the pair served the inventory's release already when the rollout began
        from deploys.lab_status import asked_release
        configs = rollout.validate_inventory(rollout.load_inventory(inventory))
        asked.update({n: asked_release(configs, n) for _, n, _ in heads})
        return {n: ({"passed": {**asked[n], "passed_at": "t"}} if n == "sandbox-b0" else None) for _, n, _ in heads}
    monkeypatch.setattr(rollout.lab_status, "read_standings", standings)
    assert rollout.main([inventory]) == 0
    runs.clear()
    assert rollout.main([inventory, "--abort"]) == 0
    assert runs == [("deploys/roll_back.py", ["rtx-pro-6000-pair"],
                     ("--data", f"roll_back_from={asked['sandbox-a']['release']}"))]
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    assert ledger.clusters["gb10-dspark"].state == "rolled back" and "nothing to undo" in ledger.clusters["gb10-dspark"].why


def test_the_ledger_keeps_each_switched_release_with_its_bench_figures(lab, monkeypatch):
    inventory, runs, _ = lab
    figures = [{"concurrency": 1, "output_tok_s": 72.3, "ttft_p95_ms": 226.0}]
    switched = {"release": "r1", "image": "img", "model_revision": "c" * 40, "passed_at": "t", "bench": figures}
    reads = []

    def standings(inventory_, heads):
        reads.append([n for _, n, _ in heads])
        return {n: ({"passed": switched} if len(reads) > 1 else None) for _, n, _ in heads}
    monkeypatch.setattr(rollout.lab_status, "read_standings", standings)
    assert rollout.main([inventory]) == 0
    assert reads[1:3] == [["sandbox-a"], ["sandbox-b0"]]  # each wave's heads, read once it passed
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    assert all(e.after["bench"] == figures and e.after["release"] == "r1" for e in ledger.clusters.values())
    assert all(e.before is None for e in ledger.clusters.values())  # (nothing was read before: not deployed)


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


def test_the_bake_halts_on_a_firing_alert_of_the_waves_clusters_or_a_head_not_live(lab, monkeypatch):
    inventory, _, _ = lab
    configs = rollout.validate_inventory(rollout.load_inventory(inventory))
    slept, rows, firing = [], {"state": rollout.lab_status.LIVE}, [None]
    monkeypatch.setattr(rollout.time, "sleep", slept.append)
    monkeypatch.setattr(rollout.lab_status, "standings", lambda inv, cfgs, heads: [
        {"cluster": c, **rows} for c, _, _ in heads])
    monkeypatch.setattr(rollout, "firing_alerts", lambda inv, watcher: firing[0])
    inv = rollout.load_inventory(inventory)
    firing[0] = []
    assert rollout.quiet(inv, configs, ["gb10-dspark"], 30) is None and slept == [30]
    firing[0] = [{"alertname": "NodeExporterDown", "host": "sandbox-b1", "cluster": "gb10-dspark"},
                 {"alertname": "InferenceServiceDown", "host": "sandbox-a", "cluster": "rtx-pro-6000-pair"}]
    assert rollout.quiet(inv, configs, ["gb10-dspark"], 30) == "alerts firing during the bake: NodeExporterDown on sandbox-b1"
    assert rollout.quiet(inv, configs, ["other-cluster"], 30) is None  # another cluster's alert is not this wave's
    firing[0] = None
    assert "could not be read" in rollout.quiet(inv, configs, ["gb10-dspark"], 30)
    rows["state"] = "gate failing"
    assert rollout.quiet(inv, configs, ["gb10-dspark"], 30) == "cluster gb10-dspark is gate failing after the bake"


def test_a_loud_bake_marks_its_wave_failed_and_no_later_wave_runs(lab, monkeypatch, capsys):
    inventory, runs, _ = lab
    monkeypatch.setattr(rollout, "quiet", lambda inv, cfgs, wave, s: "alerts firing during the bake: X on sandbox-a")
    assert rollout.main([inventory, "--bake-s", "60"]) == 1
    assert runs[1:] == [(["rtx-pro-6000-pair"], BENCH)]
    assert "halted: wave 0: alerts firing during the bake: X on sandbox-a" in capsys.readouterr().out
    ledger = ledgers.load(ledgers.ledger_path(inventory))
    assert {c: e.state for c, e in ledger.clusters.items()} == {"rtx-pro-6000-pair": "failed", "gb10-dspark": "staged"}
