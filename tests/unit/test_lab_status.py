"""Where the lab stands (deploys/lab_status.py): each state from what a head keeps, the table and its JSON, and the
one read of a head's records (ReleaseStanding) run by the real python3 against records on disk."""

from __future__ import annotations

import json
import subprocess

import pytest

from deploys import lab_status
from facts.containers import ReleaseStanding
from tests.unit.test_schema import node_a


def _cfg():
    from deploys.schema import validate_hosts
    return validate_hosts(node_a())["node-a"]


CFG = _cfg()
ASKED = {"image": CFG.image_ref, "model_revision": CFG.model_revision}
OLD = {"release": "r-old", "image": CFG.image_ref, "model_revision": "a" * 40, "passed_at": "2026-12-01T10:00:00+00:00"}
NEW = {"release": "r-new", **ASKED, "passed_at": "2026-12-07T10:00:00+00:00"}


def _seen(passed=None, last=None, history=(), failed=None):
    return {"passed": passed, "last": last, "history": list(history), "failed": failed}


@pytest.mark.parametrize("seen,state,live,previous", [
    (None, "unreachable", None, None),
    (_seen(), "not deployed", None, None),
    (_seen(NEW, {"ok": True, "release": "r-new"}, [OLD, NEW]), "live", "r-new", "r-old"),
    (_seen(OLD, {"ok": True, "release": "r-old"}, [OLD]), "behind inventory", "r-old", None),
    (_seen(OLD, {"ok": True, "release": "r-old"}, [OLD], {"release": "r-new", **ASKED, "reason": "gate"}),
     "failed, rolled back", "r-old", None),
    (_seen(None, {"ok": False, "release": "r-new"}, [], {"release": "r-new", **ASKED, "reason": "gate"}),
     "failed, not serving", None, None),
    (_seen(NEW, {"ok": False, "release": "r-new"}, [OLD, NEW]), "gate failing", "r-new", "r-old"),
    # a failed record of another release than the inventory's says nothing about the one asked for
    (_seen(NEW, {"ok": True, "release": "r-new"}, [NEW], {"release": "r-x", "image": "x", "model_revision": "b" * 40}),
     "live", "r-new", None),
])
def test_each_state_from_what_the_head_keeps(seen, state, live, previous):
    row = lab_status.cluster_standing("c", "h", CFG, seen)
    assert row["state"] == state
    assert (row["live"] or {}).get("release") == live and (row["previous"] or {}).get("release") == previous
    assert row["asked"] == ASKED


def test_a_release_is_its_id_where_both_have_one_so_a_unit_change_is_behind():
    """The same image and commit with another unit or environment (a launch flag) is another release."""
    serving = _seen(NEW, {"ok": True, "release": "r-new"}, [OLD, NEW])
    assert lab_status.cluster_standing("c", "h", CFG, serving, {**ASKED, "release": "r-new"})["state"] == "live"
    assert lab_status.cluster_standing("c", "h", CFG, serving, {**ASKED, "release": "r-flag"})["state"] == "behind inventory"


def test_the_asked_release_id_is_the_one_the_converge_records(tmp_path):
    """asked_release renders the unit as the service step does: its id changes with the service environment, not otherwise."""
    from deploys.schema import validate_hosts

    configs = validate_hosts(node_a())
    one = lab_status.asked_release(configs, "node-a")
    assert lab_status.asked_release(configs, "node-a") == one and len(one["release"]) == 16
    flagged = validate_hosts(node_a(service_env={**CFG.service_env, "MAX_NUM_SEQS": "3"}))
    assert lab_status.asked_release(flagged, "node-a")["release"] != one["release"]


def test_the_table_names_what_serves_what_served_before_and_what_is_asked():
    rows = [lab_status.cluster_standing("pair", "a", CFG, _seen(OLD, {"ok": True, "release": "r-old"}, [OLD])),
            lab_status.cluster_standing("one", "b", CFG, _seen(NEW, {"ok": True, "release": "r-new"}, [OLD, NEW]))]
    table = lab_status.format_table(rows).splitlines()
    assert table[0].split("  ")[0] == "cluster" and set(table[1]) <= {"-", " "}
    assert "behind inventory" in table[2] and "a" * 12 in table[2] and CFG.model_revision[:12] in table[2]
    assert "live" in table[3] and "(same)" in table[3] and "a" * 12 in table[3]  # the release before it
    json.dumps(rows)  # (--json prints them as they are)


def test_the_records_are_read_in_one_command_each_absent_or_damaged_one_none(tmp_path):
    (tmp_path / "passed.json").write_text(json.dumps(NEW))
    (tmp_path / "history.json").write_text(json.dumps([OLD, NEW]))
    (tmp_path / "failed.json").write_text("{not json")
    fact = ReleaseStanding()
    command = fact.command(str(tmp_path / "passed.json"), str(tmp_path / "none.json"), str(tmp_path / "history.json"),
                           str(tmp_path / "failed.json"))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    seen = fact.process(out.splitlines())
    assert seen == {"passed": NEW, "last": None, "history": [OLD, NEW], "failed": None}
    assert lab_status.cluster_standing("c", "h", CFG, seen)["state"] == "live"


def test_the_performance_column_shows_tok_s_per_level_and_its_change_from_the_release_before():
    before = {**OLD, "bench": [{"concurrency": 1, "output_tok_s": 100.0}, {"concurrency": 8, "output_tok_s": 600.0}]}
    now = {**NEW, "bench": [{"concurrency": 1, "output_tok_s": 90.0}, {"concurrency": 8, "output_tok_s": 630.0},
                            {"concurrency": 16, "output_tok_s": 900.0}]}
    row = lab_status.cluster_standing("one", "b", CFG, _seen(now, {"ok": True, "release": "r-new"}, [before, now]))
    assert lab_status.performance_told(row["live"], row["previous"]) == "c1: 90 (-10 %), c8: 630 (+5 %), c16: 900"
    assert "c1: 90 (-10 %)" in lab_status.format_table([row])
    assert lab_status.performance_told(row["previous"], None) == "c1: 100, c8: 600"
    assert lab_status.performance_told({**NEW}, row["previous"]) == "-"  # not benched
