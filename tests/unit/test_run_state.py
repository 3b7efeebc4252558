"""Per-run state (deploys/run/state.py): kept on the run's own objects, made once each, gone with them."""

import gc

from pyinfra.api import Inventory

from deploys.run import state as run_state
from deploys.inventory import inventory_configs
from tests.unit.profiles import profile


class Owner:
    """Stands for a run's State, Inventory or Host (any object that can be weakly referenced)."""


def test_made_once_per_owner_and_name():
    made = []
    first, second = Owner(), Owner()
    a = run_state.kept(first, "plan", lambda: made.append(1) or {"n": len(made)})
    assert run_state.kept(first, "plan", dict) is a  # not made again
    assert run_state.kept(second, "plan", lambda: {"n": "other"}) == {"n": "other"}
    assert run_state.kept(first, "other name", list) == [] and made == [1]
    run_state.keep(first, "plan", None)
    assert run_state.kept(first, "plan", dict) is None


def test_gone_with_its_owner():
    owner = Owner()
    run_state.kept(owner, "plan", dict)
    del owner
    gc.collect()
    assert not any(isinstance(o, Owner) for o in run_state._kept.keys())


def test_each_inventory_is_validated_on_its_own():
    """Validation is kept per inventory object: a later inventory (which may reuse a freed one's id) is
    validated afresh, never answered with another's configs."""
    data = {**profile("rtx_pro_6000_pair"), "node_rank": 0}
    seen = []
    for nofile in (4096, 8192, 4096):
        inventory = Inventory((["@local"], {**data, "limits_nofile": nofile}))
        configs = inventory_configs(inventory)
        assert inventory_configs(inventory) is configs  # once per inventory
        seen.append(configs["@local"].limits_nofile)
        del inventory, configs
        gc.collect()
    assert seen == [4096, 8192, 4096]
