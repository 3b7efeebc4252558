"""The push fan-out's seed daemon admits its own address and its targets' only, where they are addresses."""

from __future__ import annotations

from deploys.model.fanout import seed_allow_list, seed_firewall_properties


def test_addresses_are_listed_once_with_the_seed_itself():
    assert seed_allow_list("10.0.0.1", ["10.0.0.2", "10.0.0.3", "10.0.0.2"]) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert seed_allow_list("fd00::1", ["fd00::2"]) == ["fd00::1", "fd00::2"]


def test_a_host_name_anywhere_leaves_the_daemon_unrestricted():
    assert seed_allow_list("10.0.0.1", ["10.0.0.2", "node-b1.lab"]) is None
    assert seed_allow_list("seed.lab", ["10.0.0.2"]) is None
    assert seed_firewall_properties(None) == []


def test_deny_any_then_allow_each_address():
    assert seed_firewall_properties(["10.0.0.1", "10.0.0.2"]) == [
        "--property=IPAddressDeny=any", "--property=IPAddressAllow=10.0.0.1", "--property=IPAddressAllow=10.0.0.2"]


def test_seed_daemon_fact_from_what_the_node_prints():
    from facts.model import SeedDaemon

    fact = SeedDaemon()
    assert fact.process(["active", "seed-dir"]) == {"running": True, "secret_dir": True}
    assert fact.process(["activating"]) == {"running": True, "secret_dir": False}
    assert fact.process(["inactive", "seed-dir"]) == {"running": False, "secret_dir": True}
    assert fact.process(["failed"]) == {"running": False, "secret_dir": False}
    assert fact.process([]) == {"running": False, "secret_dir": False}  # no systemctl output at all
