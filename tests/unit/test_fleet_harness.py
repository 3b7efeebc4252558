"""The light fleet harness's pure parts (tests/sandbox/fleet.py): addresses, the inventory it writes (the schema
takes it as it takes a lab's), the waves bench/fleet.py reports."""

from __future__ import annotations

import json

from deploys.inventory import load_inventory
from deploys.model.fanout import fanout_plan
from deploys.schema import validate_inventory
from tests.sandbox import fleet

REPO, COMMIT = "deepseek-ai/DeepSeek-V4-Flash-0731", "7872f01b1d1fe23eabc4c98b48bffcef5a386062"


def test_addresses_are_distinct_inside_the_switch_and_apart_from_the_control_node():
    import ipaddress

    addresses = [fleet.node_address(i) for i in range(600)]
    assert len(set(addresses)) == 600 and fleet.CTL_ADDRESS not in addresses
    net = ipaddress.ip_network(f"{fleet.CTL_ADDRESS}/{fleet.PREFIX}", strict=False)
    assert all(ipaddress.ip_address(a) in net and not a.endswith((".0", ".255")) for a in addresses)
    assert [fleet.address_of(fleet.node_name(i)) for i in (0, 1, 249, 250)] == \
        ["10.44.1.1", "10.44.1.2", "10.44.1.250", "10.44.2.1"]


def fleet_configs(tmp_path, count: int, data: dict) -> dict:
    """The validated configs of the inventory ``fleet.write_inventory`` writes for ``count`` nodes (a one-file
    manifest of REPO at COMMIT; ``data`` on top)."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"repo": REPO, "commit": COMMIT, "files": [
        {"path": "model-00001-of-00001.safetensors", "size": 5, "sha256": "a" * 64}]}))
    inventory = tmp_path / "fleet.py"
    fleet.write_inventory(str(inventory), count, {"model_repo": REPO, "model_revision": COMMIT,
                                                  "model_manifest": str(manifest), **data})
    return validate_inventory(load_inventory(str(inventory)))


def test_the_inventory_validates_and_its_push_group_fans_out_in_doubling_waves(tmp_path):
    configs = fleet_configs(tmp_path, 32, {"model_push_fanout": 1})
    assert sorted(configs) == [fleet.node_name(i) for i in range(32)]
    assert {c.model_peer_address for c in configs.values()} == {fleet.node_address(i) for i in range(32)}
    plan = fanout_plan(sorted(configs.items()))
    assert 1 + max(a.wave for a in plan.values()) == 6  # holders double: 1, 2, 4, 8, 16, 32
    assert [n for n, a in plan.items() if a.source is None] == ["fleet-00"]
