"""Facts read once per run on a host where nothing has executed yet, read afresh after a command ran
there; and the one-round-trip managed-file fact. Real pyinfra state on the @local connector."""

import pytest
from pyinfra.api import Config, Inventory, State, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.facts.server import Command

import deploys  # noqa: F401  (installs the cache)
from facts.host import ManagedFiles


@pytest.fixture
def local_host():
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config())
    connect_all(state)
    return state, inventory.get_host("@local")


def test_a_fact_is_read_once_until_a_command_executes_on_the_host(local_host, tmp_path):
    state, host = local_host
    marker = tmp_path / "marker"
    marker.write_text("before")
    read = f"cat {marker}"
    assert host.get_fact(Command, command=read) == "before"
    marker.write_text("changed behind pyinfra's back")
    assert host.get_fact(Command, command=read) == "before", "the second read came from the node"
    StringCommand("true").execute(state, host, {})  # an operation's command ran: facts may have changed
    assert host.get_fact(Command, command=read) == "changed behind pyinfra's back"
    marker.write_text("again")
    assert host.get_fact(Command, command=read) == "again", "after a command, every read goes to the node"


def test_cached_answers_are_copies(local_host):
    _, host = local_host
    first = host.get_fact(ManagedFiles, paths=("/etc/hostname",))
    first["/etc/hostname"] = "mutated by a caller"
    assert host.get_fact(ManagedFiles, paths=("/etc/hostname",))["/etc/hostname"] != "mutated by a caller"


def test_managed_files_reads_owner_mode_and_sha1_of_each_path(local_host, tmp_path):
    _, host = local_host
    present = tmp_path / "with space"
    present.write_bytes(b"content\n")
    present.chmod(0o640)
    (tmp_path / "dir").mkdir()
    got = host.get_fact(ManagedFiles, paths=(str(present), str(tmp_path / "absent"), str(tmp_path / "dir")))
    import hashlib
    import os
    import pwd
    import grp

    st = os.stat(present)
    assert got == {
        str(present): {"user": pwd.getpwuid(st.st_uid).pw_name, "group": grp.getgrgid(st.st_gid).gr_name,
                       "mode": 640, "sha1": hashlib.sha1(b"content\n").hexdigest()},
        str(tmp_path / "absent"): None,
        str(tmp_path / "dir"): None,
    }
