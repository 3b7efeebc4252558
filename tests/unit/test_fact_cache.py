"""Facts read once per run on a host where nothing has executed yet, read afresh after a command ran
there; and the one-round-trip managed-file fact. Real pyinfra state on the @local connector."""

import pytest
from pyinfra.api import Config, Inventory, State, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.facts import FactBase
from pyinfra.context import ctx_host
from pyinfra.facts.server import Command

import deploys  # noqa: F401  (installs the cache)
from deploys.run import fact_cache
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


class _NeedsMissingTool(FactBase):
    def requires_command(self):
        return "no-such-tool-inference-nodes"

    def command(self):
        return "no-such-tool-inference-nodes --version"


def test_prefetch_reads_many_facts_in_one_command_each_as_pyinfra_would(local_host, tmp_path):
    _, host = local_host
    outputs = {  # what each command prints: pyinfra's own reading of it is the reference
        "no trailing newline": "printf 'a'",
        "trailing newline": "printf 'a\\nb\\n'",
        "empty lines kept": "printf '\\n\\nc\\n\\n'",
        "nothing": "true",
        "exit status ignored by a subshell's exit": "echo x; exit 0",
    }
    reads = [(Command, {"command": c}) for c in outputs.values()]
    fresh = State(Inventory((["@local"], {})), Config())
    connect_all(fresh)
    expected = [fresh.inventory.get_host("@local").get_fact(Command, **kw) for _, kw in reads]

    calls = []
    run = host.run_shell_command
    host.run_shell_command = lambda *a, **kw: calls.append(a) or run(*a, **kw)
    assert fact_cache.prefetch(host, reads) == len(reads)
    assert len(calls) == 1, "one round trip for every read"
    got = [host.get_fact(Command, **kw) for _, kw in reads]
    assert len(calls) == 1, "the reads after the prefetch came from memory"
    assert got == expected


def test_prefetch_keeps_no_failed_or_missing_command_read(local_host, tmp_path):
    _, host = local_host
    marker = tmp_path / "marker"
    marker.write_text("before")
    failing, ok = f"cat {tmp_path / 'absent'}", f"cat {marker}"
    kept_count = fact_cache.prefetch(host, [(Command, {"command": failing}), (_NeedsMissingTool, {}),
                                            (Command, {"command": ok})])
    assert kept_count == 1
    marker.write_text("after")
    assert host.get_fact(Command, command=ok) == "before", "the prefetched answer"
    (tmp_path / "absent").write_text("now here")
    assert host.get_fact(Command, command=failing) == "now here", "a failed read is read again on its own"
    assert host.get_fact(_NeedsMissingTool) is None


def test_prefetch_after_a_command_ran_reads_nothing(local_host):
    state, host = local_host
    StringCommand("true").execute(state, host, {})
    assert fact_cache.prefetch(host, [(Command, {"command": "echo a"}), (Command, {"command": "echo b"})]) == 0


def test_expected_reads_are_made_with_the_next_unanswered_read_and_dropped_once_a_command_ran(local_host, tmp_path):
    state, host = local_host
    (tmp_path / "a").write_text("a1")
    (tmp_path / "b").write_text("b1")
    read_a, read_b, read_c = (f"cat {tmp_path / n}" for n in ("a", "b", "c"))
    calls = []
    run = host.run_shell_command
    host.run_shell_command = lambda *a, **kw: calls.append(a) or run(*a, **kw)
    with ctx_host.use(host):
        fact_cache.expect([(Command, {"command": read_a})])
    assert calls == [], "expecting reads nothing yet"
    assert host.get_fact(Command, command=read_b) == "b1"
    assert len(calls) == 1, "the expected read went with the first unanswered one"
    (tmp_path / "a").write_text("a2")
    assert host.get_fact(Command, command=read_a) == "a1" and len(calls) == 1, "answered from that command"

    with ctx_host.use(host):
        fact_cache.expect([(Command, {"command": read_c})])
    StringCommand("true").execute(state, host, {})
    (tmp_path / "c").write_text("c1")
    calls.clear()
    assert host.get_fact(Command, command=read_a) == "a2", "read afresh after a command ran"
    assert len(calls) == 1 and read_c not in str(calls[0][0]), "the expectation was dropped with the answers"
