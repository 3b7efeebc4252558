"""The one way the toolkit reads facts (deploys/run/reads.py, facts/batch.py): each read once while the node cannot
have changed, read afresh after a command ran there, many reads in one command. Real pyinfra state on the @local
connector, real operations run by pyinfra's own run_ops."""

import hashlib
import os
import pwd
import grp

import pytest
from pyinfra.api import Config, FunctionCommand, Inventory, State, StringCommand
from pyinfra.api.connect import connect_all
from pyinfra.api.facts import FactBase, get_fact
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.server import Command
from pyinfra.operations import server

from deploys.run import reads
from facts.batch import FactBatch, Reads, read_key
from facts.host import ManagedFiles


def _local(check_for_changes: bool = True):
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config(), check_for_changes=check_for_changes)
    connect_all(state)
    return state, inventory.get_host("@local")


@pytest.fixture
def local_host():
    return _local()


def _counted(host) -> list:
    calls, run = [], host.run_shell_command
    host.run_shell_command = lambda *a, **kw: calls.append(a) or run(*a, **kw)
    return calls


def test_a_fact_is_read_once_until_the_host_goes_stale(local_host, tmp_path):
    _, host = local_host
    marker = tmp_path / "marker"
    marker.write_text("before")
    cat = f"cat {marker}"
    assert reads.read(host, Command, command=cat) == "before"
    marker.write_text("changed behind pyinfra's back")
    assert reads.read(host, Command, command=cat) == "before", "the second read came from the node"
    reads.stale(host)
    assert reads.read(host, Command, command=cat) == "changed behind pyinfra's back"
    marker.write_text("again")
    reads.run_on(host, StringCommand("true"))  # the toolkit ran a command there outside an operation's own
    assert reads.read(host, Command, command=cat) == "again"


def test_kept_answers_are_copies(local_host):
    _, host = local_host
    first = reads.read(host, ManagedFiles, paths=("/etc/hostname",))
    first["/etc/hostname"] = "mutated by a caller"
    assert reads.read(host, ManagedFiles, paths=("/etc/hostname",))["/etc/hostname"] != "mutated by a caller"


def test_managed_files_reads_owner_mode_and_sha1_of_each_path(local_host, tmp_path):
    _, host = local_host
    present = tmp_path / "with space"
    present.write_bytes(b"content\n")
    present.chmod(0o640)
    (tmp_path / "dir").mkdir()
    got = reads.read(host, ManagedFiles, paths=(str(present), str(tmp_path / "absent"), str(tmp_path / "dir")))
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


def test_a_batch_answers_each_read_as_pyinfra_reads_it_in_one_command(local_host):
    state, host = local_host
    outputs = {  # what each command prints: pyinfra's own reading of it is the reference
        "no trailing newline": "printf 'a'",
        "trailing newline": "printf 'a\\nb\\n'",
        "empty lines kept": "printf '\\n\\nc\\n\\n'",
        "nothing": "true",
        "exit status ignored by a subshell's exit": "echo x; exit 0",
    }
    batch = [(Command, {"command": c}) for c in outputs.values()]
    expected = [get_fact(state, host, cls, args=(), kwargs=kw) for cls, kw in batch]
    calls = _counted(host)
    answers = host.get_fact(FactBatch, reads=Reads(batch))
    assert len(calls) == 1, "one round trip for every read"
    assert [answers[read_key(cls, kw)] for cls, kw in batch] == expected


def test_a_batch_keeps_no_failed_or_missing_command_read(local_host, tmp_path):
    _, host = local_host
    failing, ok = (Command, {"command": f"cat {tmp_path / 'absent'}"}), (Command, {"command": "echo fine"})
    answers = host.get_fact(FactBatch, reads=Reads([failing, (_NeedsMissingTool, {}), ok]))
    assert answers == {read_key(*ok): "fine"}


def test_expected_reads_go_with_the_next_unanswered_read_and_are_dropped_when_the_host_goes_stale(local_host, tmp_path):
    _, host = local_host
    (tmp_path / "a").write_text("a1")
    (tmp_path / "b").write_text("b1")
    read_a, read_b, read_c = (f"cat {tmp_path / n}" for n in ("a", "b", "c"))
    calls = _counted(host)
    with ctx_host.use(host):
        reads.expect([(Command, {"command": read_a})])
    assert calls == [], "expecting reads nothing yet"
    assert reads.read(host, Command, command=read_b) == "b1"
    assert len(calls) == 1, "the expected read went with the first unanswered one"
    (tmp_path / "a").write_text("a2")
    assert reads.read(host, Command, command=read_a) == "a1" and len(calls) == 1, "answered from that command"

    with ctx_host.use(host):
        reads.expect([(Command, {"command": read_c})])
    reads.stale(host)
    (tmp_path / "c").write_text("c1")
    calls.clear()
    assert reads.read(host, Command, command=read_a) == "a2", "read afresh once stale"
    assert len(calls) == 1 and read_c not in str(calls[0][0]), "the expectation was dropped with the answers"


def test_a_failed_read_in_a_batch_is_read_again_on_its_own(local_host, tmp_path):
    _, host = local_host
    absent = tmp_path / "absent"
    with ctx_host.use(host):
        reads.expect([(Command, {"command": "echo other"})])
    calls = _counted(host)
    assert reads.read(host, Command, command=f"cat {absent} 2>/dev/null || echo fallback") == "fallback"
    absent.write_text("now here")
    with ctx_host.use(host):
        reads.expect([(Command, {"command": "echo another"})])
    calls.clear()
    reads.stale(host)
    with ctx_host.use(host):
        reads.expect([(Command, {"command": f"cat {tmp_path / 'missing'}"})])
    assert reads.read(host, Command, command=f"cat {absent}") == "now here"
    assert len(calls) == 1, "one batch; the failing expected read was not read again"


# Operations run by pyinfra itself: a toolkit operation that reads, one that writes, pyinfra's own shell op.
@reads.operation()
def _records(path: str, into: list):
    into.append(reads.read(ctx_host.get(), Command, command=f"cat {path}"))
    return
    yield


@reads.operation()
def _writes(path: str, text: str):
    if reads.read(ctx_host.get(), Command, command=f"cat {path}") != text:
        yield StringCommand("echo", text, ">", str(path))


@reads.operation()
def _writes_then_checks(path: str, text: str, into: list):
    reads.read(ctx_host.get(), Command, command=f"cat {path}")
    yield StringCommand("echo", text, ">", str(path))
    yield FunctionCommand(lambda state, host: into.append(reads.read(host, Command, command=f"cat {path}")) or True, (), {})


def _run(state, host, *ops):
    with ctx_state.use(state):
        state.set_stage(StateStage.Prepare)
        for op, kwargs in ops:
            add_op(state, op, **kwargs)
        state.set_stage(StateStage.Execute)
        run_ops(state)


def test_operations_that_change_nothing_share_reads_and_any_command_makes_them_stale(tmp_path):
    """With -y (no prompt between plan and run): a toolkit operation that yields nothing keeps the answers; one
    whose command runs, and any operation that is not the toolkit's, makes the next read go to the node."""
    state, host = _local(check_for_changes=False)
    path = tmp_path / "value"
    path.write_text("a")
    seen: list = []
    calls = _counted(host)
    _run(state, host,
         (_records, {"path": path, "into": seen}),
         (server.shell, {"commands": [f"echo b > {path}"]}),  # not the toolkit's: stale when it ends
         (_records, {"path": path, "into": seen}),
         (_records, {"path": path, "into": seen}),
         (_writes, {"path": path, "text": "c"}),  # yields: stale
         (_records, {"path": path, "into": seen}),
         (_writes, {"path": path, "text": "c"}))  # reads the c it wrote: no command
    assert seen == ["a", "b", "b", "c"]
    assert path.read_text() == "c\n"
    # read a; the shell; read b (both _records and the first _writes); the write; read c (the last two ops)
    assert [str(c[0]).split()[0] for c in calls] == ["cat", "echo", "cat", "echo", "cat"], calls


def test_a_read_after_a_command_within_the_same_operation_sees_what_it_did(tmp_path):
    state, host = _local(check_for_changes=False)
    path = tmp_path / "value"
    path.write_text("old")
    seen: list = []
    _run(state, host, (_writes_then_checks, {"path": path, "text": "new", "into": seen}))
    assert seen == ["new"]


def test_answers_read_while_planning_are_not_used_after_the_prompt(tmp_path):
    """Without -y pyinfra shows the plan and waits before it executes: the node may change meanwhile."""
    for check_for_changes, want in ((True, "changed while the prompt waited"), (False, "planned")):
        state, host = _local(check_for_changes=check_for_changes)
        path = tmp_path / f"value-{check_for_changes}"
        path.write_text("planned")
        with ctx_state.use(state):
            state.set_stage(StateStage.Prepare)
            assert reads.read(host, Command, command=f"cat {path}") == "planned"
            path.write_text("changed while the prompt waited")
            state.set_stage(StateStage.Execute)
            assert reads.read(host, Command, command=f"cat {path}") == want


def test_a_batch_the_shell_cannot_run_fails_no_host_and_each_read_is_made_alone(local_host):
    state, host = local_host
    with ctx_host.use(host):
        reads.expect([(Command, {"command": "echo 'unbalanced"})])  # breaks the whole batch's script
    assert reads.read(host, Command, command="echo fine") == "fine"
    assert host not in state.failed_hosts


@reads.operation()
def _records_command(command: str, into: list):
    into.append(reads.read(ctx_host.get(), Command, command=command))
    return
    yield


def test_an_operation_run_in_another_directory_reads_there_not_from_kept_answers(tmp_path):
    state, host = _local(check_for_changes=False)
    here = reads.read(host, Command, command="pwd")
    seen: list = []
    _run(state, host, (_records_command, {"command": "pwd", "into": seen, "_chdir": str(tmp_path)}),
         (_records_command, {"command": "pwd", "into": seen}))
    assert seen == [str(tmp_path), here]


def test_an_operation_body_that_is_not_a_generator_is_refused_when_it_is_defined():
    """pyinfra would fail such an operation only when it runs it ('NoneType' object is not iterable, mid-converge):
    the toolkit's decorator refuses it at import, where the unit tier sees it."""
    import pytest

    from deploys.run.reads import operation

    with pytest.raises(TypeError, match="is not a generator"):
        @operation()
        def decides_only():
            return None

    @operation()
    def yields_nothing():
        yield from ()
