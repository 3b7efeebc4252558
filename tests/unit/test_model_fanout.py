"""Push fan-out plan: who feeds whom, in which wave, and what a serving node exposes."""

from __future__ import annotations

import math

import pytest

from deploys.model import fanout as model_fanout
from deploys.inventory import load_inventory, node_config
from deploys.model.fanout import SEED_DIR, fanout_plan, fanout_waves, render_rsyncd_conf
from tests.unit.profiles import lab_filled_in


@pytest.mark.parametrize("per_source", [1, 2, 3])
@pytest.mark.parametrize("n", list(range(1, 41)))
def test_every_node_is_fed_once_by_the_control_node_or_an_earlier_holder(n, per_source):
    members = [f"n{i:02d}" for i in range(n)]
    plan = fanout_waves(members, per_source)
    assert sorted(plan) == members
    first = [m for m, a in plan.items() if a.wave == 0]
    assert first == members[:per_source] and all(plan[m].source is None for m in first)
    load: dict[tuple[str, int], int] = {}
    for target, a in plan.items():
        if a.wave:
            assert a.source in plan and plan[a.source].wave < a.wave, (target, a)
            load[(a.source, a.wave)] = load.get((a.source, a.wave), 0) + 1
    assert all(v <= per_source for v in load.values())
    # holders multiply by per_source + 1 each wave: the fewest waves that can reach n nodes
    waves = 1 + max(a.wave for a in plan.values())
    expected = 1 if n <= per_source else 1 + math.ceil(math.log(n / per_source, per_source + 1) - 1e-9)
    assert waves == expected


def test_up_to_the_fanout_the_control_node_feeds_every_node():
    assert {a.source for a in fanout_waves(["a", "b"], 2).values()} == {None}
    plan = fanout_waves(["a", "b", "c"], 2)
    assert plan["c"] == model_fanout.Assignment(1, "a")


def test_lab_groups_hosts_that_want_the_same_files_at_the_same_place(tmp_path):
    inv = load_inventory(lab_filled_in(tmp_path))  # C with its profile gaps set
    # the lab has no committed manifest for the real commits yet; a host without one is never planned
    assert fanout_plan([(h.name, node_config(h)) for h in inv]) == {}
    hosts = [(h.name, node_config(h).model_copy(update={"model_manifest": "reviewed.json"})) for h in inv]
    plan = fanout_plan(hosts)
    cfgs = dict(hosts)
    assert set(plan) == set(cfgs)
    for name, a in plan.items():
        if a.source:
            assert (cfgs[a.source].snapshot_dir, cfgs[a.source].model_revision) == \
                   (cfgs[name].snapshot_dir, cfgs[name].model_revision)
    # deployment A is alone at its own path; the four GB10 nodes share one path and commit: the control node
    # feeds two of them, those feed the other two
    assert plan["rtx-pro-a.lab.example"] == model_fanout.Assignment(0, None)
    gb10 = {n: a for n, a in plan.items() if n != "rtx-pro-a.lab.example"}
    assert sorted(a.wave for a in gb10.values()) == [0, 0, 1, 1]
    two = fanout_plan([h for h in hosts if h[0].startswith("gb10-b")])
    assert {a.wave for a in two.values()} == {0}
    hub = [(n, c.model_copy(update={"model_sync_mode": "hub"})) for n, c in hosts]
    assert fanout_plan(hub) == {}


def test_the_seed_is_read_only_chrooted_unprivileged_and_authenticated():
    conf = render_rsyncd_conf("/srv/models/x", 10)
    for line in ("use chroot = yes", "uid = nobody", "read only = yes", "list = no",
                 f"auth users = {model_fanout.SEED_USER}", f"secrets file = {SEED_DIR}/secrets", "strict modes = yes",
                 "path = /srv/models/x", "max connections = 10"):
        assert line in conf
    assert "write only" not in conf and "hosts allow" not in conf


def test_streams_take_every_file_once_largest_first_onto_the_least_loaded():
    from files.model_snapshot.peer_pull import balanced

    sizes = {"a": 100, "b": 60, "c": 50, "d": 40, "e": 10}
    groups = balanced(list(sizes), sizes, 2)
    assert sorted(p for g in groups for p in g) == sorted(sizes)
    # a 100 | b 60, c 50 (the lighter at 60) | d 40 onto a (100 < 110) | e onto b+c (110 < 140)
    assert groups == [["a", "d"], ["b", "c", "e"]]
    assert balanced(["x"], {"x": 1}, 4) == [["x"]]  # never more streams than files
