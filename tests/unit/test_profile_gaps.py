"""Profile C's write-up (seed 003) names no model commit and no image tag or digest: the toolkit does not
invent them. They are `profile_gaps`; a host whose gap is unset is refused, naming the write-up, and a
`--limit` to the other groups leaves such a host out instead of refusing their run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from deploys.inventory import load_inventory
from deploys.schema import InventoryValidationError, validate_hosts, validate_inventory
from tests.unit.profiles import C_FILLED_IN, lab_filled_in, profile

C_HOSTS = ("spark-c0.lab.example", "spark-c1.lab.example")


def test_lab_refuses_c_naming_each_gap_and_where_the_write_up_stops():
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(load_inventory("inventories/lab.py"))
    problems = err.value.problems
    assert {(p.host, p.key) for p in problems} == {(h, k) for h in C_HOSTS for k in ("model_revision", "image")}
    assert all(p.gap for p in problems)
    msg = str(err.value)
    assert ("host spark-c0.lab.example: key 'model_revision' = <missing>: expected a value: the profile's "
            "write-up stops here (seed 003 names the repository deepseek-ai/DeepSeek-V4-Flash-0731 but no commit)") in msg
    assert "aidendle94/sparkrun-vllm-ds4-gb10" in msg and "--limit" in msg
    group = profile("gb10_mtp")
    assert "model_revision" not in group and "image" not in group and "allow_unpinned_image" not in group


def test_the_digest_gap_is_named_once_the_image_is_set(tmp_path):
    data = {**profile("all"), **profile("gb10_mtp"), "ssh_hostname": "192.0.2.30",
            "model_revision": C_FILLED_IN["model_revision"], "image": C_FILLED_IN["image"]}
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts({"spark-c0": data})
    [p] = err.value.problems
    assert (p.key, p.gap) == ("image_digest", True) and "seed 003 gives no digest" in p.expected


def test_filled_in_c_is_valid_and_uses_exactly_what_the_admin_set(tmp_path):
    configs = validate_inventory(load_inventory(lab_filled_in(tmp_path)))
    c0 = configs["spark-c0.lab.example"]
    assert (c0.model_revision, c0.image, c0.image_digest, c0.allow_unpinned_image) == (
        C_FILLED_IN["model_revision"], C_FILLED_IN["image"], C_FILLED_IN["image_digest"], False)


def test_a_wrong_value_for_a_gap_key_is_a_plain_problem_not_a_gap():
    data = {**profile("all"), **profile("gb10_mtp"), "ssh_hostname": "192.0.2.30", **C_FILLED_IN,
            "model_revision": "main"}
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts({"spark-c0": data})
    assert [(p.key, p.gap) for p in err.value.problems] == [("model_revision", False)]


def test_profile_gaps_must_name_schema_keys():
    data = {**profile("all"), **profile("gb10_mtp"), "ssh_hostname": "192.0.2.30", **C_FILLED_IN,
            "profile_gaps": {"model_revison": "typo"}}
    with pytest.raises(InventoryValidationError) as err:
        validate_hosts({"spark-c0": data})
    assert "key 'profile_gaps'" in str(err.value) and "no key 'model_revison'" in str(err.value)


def _hosts(inv, *names):
    return [h for h in inv if h.name in names]


def test_a_limit_to_the_other_groups_leaves_c_out_and_a_limit_to_c_refuses():
    inv = load_inventory("inventories/lab.py")
    configs = validate_inventory(inv, limit_hosts=_hosts(inv, "gb10-b0.lab.example"))
    assert set(configs) == {"rtx-pro-a.lab.example", "gb10-b0.lab.example", "gb10-b1.lab.example"}
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(inv, limit_hosts=_hosts(inv, "gb10-b0.lab.example", "spark-c1.lab.example"))
    # the limit takes C's whole cluster: both C hosts are named
    assert {p.host for p in err.value.problems} == set(C_HOSTS)


def test_a_limit_never_hides_a_problem_that_is_not_a_gap(tmp_path):
    path = lab_filled_in(tmp_path)
    with open(path, "a") as f:  # spark-c1 is filled in but gets a bad port, spark-c0 keeps a gap
        f.write(textwrap.dedent("""
            gb10_mtp = [
                ("spark-c0.lab.example", {"ssh_hostname": "192.0.2.30", "node_rank": 0, "fabric_address": "198.51.100.30",
                                          "model_revision": None}),
                ("spark-c1.lab.example", {"ssh_hostname": "192.0.2.31", "node_rank": 1, "fabric_address": "198.51.100.31",
                                          "api_port": 70000}),
            ]
        """))
    inv = load_inventory(path)
    with pytest.raises(InventoryValidationError) as err:
        validate_inventory(inv, limit_hosts=_hosts(inv, "gb10-b0.lab.example"))
    assert [(p.host, p.key) for p in err.value.problems] == [("spark-c1.lab.example", "api_port")]


class Listener:
    """A loopback TCP listener that counts the connections it accepts (no SSH: a run that connects fails)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


def test_pyinfra_with_limit_deploys_the_others_and_without_it_connects_to_nothing(tmp_path):
    """Through the real CLI and config.py: each host points at its own listener that counts connections."""
    a, c0, c1 = Listener(), Listener(), Listener()
    inv = tmp_path / "inv"
    (inv / "group_data").mkdir(parents=True)
    for name in ("all.py", "rtx_pro_6000_pair.py", "gb10_mtp.py"):
        (inv / "group_data" / name).write_text(open(f"inventories/group_data/{name}").read())

    def reach(listener):
        return f'"ssh_hostname": "127.0.0.1", "ssh_port": {listener.port}, "ssh_connect_retries": 0'

    (inv / "hosts.py").write_text(textwrap.dedent(f"""
        rtx_pro_6000_pair = [("node-a", {{{reach(a)}}})]
        gb10_mtp = [("node-c0", {{{reach(c0)}, "node_rank": 0, "fabric_address": "198.51.100.30"}}),
                    ("node-c1", {{{reach(c1)}, "node_rank": 1, "fabric_address": "198.51.100.31"}})]
    """))
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    try:
        proc = subprocess.run([pyinfra, "-y", str(inv / "hosts.py"), "deploys/all.py"], capture_output=True,
                              text=True, timeout=120)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and (a.accepted, c0.accepted, c1.accepted) == (0, 0, 0), out
        assert "host node-c0: key 'model_revision' = <missing>: expected a value: the profile's write-up stops here" in out
        proc = subprocess.run([pyinfra, "-y", str(inv / "hosts.py"), "deploys/all.py", "--limit", "rtx_pro_6000_pair"],
                              capture_output=True, text=True, timeout=120)
        out = proc.stdout + proc.stderr
        assert a.accepted >= 1 and (c0.accepted, c1.accepted) == (0, 0), out
        assert "inventory validation failed" not in out  # (paramiko prints its own banner traceback)
    finally:
        for listener in (a, c0, c1):
            listener.sock.close()
