"""The toolkit's one way to read a fact: each read once while the node cannot have changed, many in one command.

pyinfra reads a fact with a command on the node each time it is asked, and keeps nothing between reads. A
converge asks for the same facts when a deploy plans its operations and again when each operation runs, some
fifty reads per host. Every read the toolkit makes goes through :func:`read`, which keeps each answer until a
command may have changed the node:

- a command one of the toolkit's own operations yields (:func:`operation`, the one decorator they use) makes
  the host's answers stale before it runs, and again once the operation ends;
- any other operation (pyinfra's, or one a lab adds) makes them stale when it ends, whatever it did
  (pyinfra's public callback, :class:`ReadsFollowOperations`), as does :func:`run_on` for a command the
  toolkit runs on a node outside an operation's commands (a head reaching its workers);
- answers read while pyinfra planned are not used once it executes, unless the run was started with ``-y``
  (no prompt in between: nothing on the node changed since);
- answers are copies: a caller that edits one edits its own.

:func:`expect` declares the reads a component's operations will make (at the top of its ``@deploy``); they are
read in one command (``facts.batch.FactBatch``) with the next read that has no answer yet. A no-op converge thus
runs a few commands per host instead of one per read. Nothing here replaces any part of pyinfra: it is an
ordinary fact, an ordinary decorator around pyinfra's ``@operation`` and an ordinary state callback.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable, Iterable

from pyinfra.api import State, operation as pyinfra_operation
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra import context
from pyinfra.context import ctx_host
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from deploys.run.state import keep, kept
from facts.batch import FactBatch, Read, Reads, batchable, read_key

FactRead = Read  # a fact class and the keyword arguments a deploy reads it with

_ANSWERS = "fact answers"  # per host: {read_key: answer}
_STAGE = "fact answers read in"  # per host: the stage the answers were read in
_EXPECTED = "expected fact reads"  # per host: reads to make together with the next unanswered one
_QUIET = "toolkit operations that yielded nothing"  # per host: op hashes, at execute
_WATCHING = "reads follow operations"  # per State: the callback is installed


def read(host: Host, cls, **kwargs) -> Any:
    """What ``host.get_fact(cls, **kwargs)`` returns, read from the node only when no answer is kept."""
    host = _real(host)
    _watch(host.state)
    if _reads_as_another(host) or any(k.startswith("_") for k in kwargs):
        return host.get_fact(cls, **kwargs)  # another user, directory or environment: pyinfra's own read, not kept
    answers = _answers(host)
    key = read_key(cls, kwargs)
    if key not in answers:
        pending, expected = [], kept(host, _EXPECTED, list)
        if batchable(cls):
            pending = [r for r in dict((read_key(*r), r) for r in [*expected, (cls, kwargs)]).items()
                       if r[0] not in answers]
        keep(host, _EXPECTED, [])
        if len(pending) > 1:  # a batch that fails fails no host: its reads are then made alone, as pyinfra makes them
            answers.update(host.get_fact(FactBatch, reads=Reads(r for _, r in pending), _ignore_errors=True) or {})
        if key not in answers:
            answers[key] = host.get_fact(cls, **kwargs)
    return copy.deepcopy(answers[key])


def expect(reads: Iterable[FactRead]) -> None:
    """Reads this run's operations will make on the host being prepared: made together, in one command, with
    the next read that has no answer yet. Leave out facts that may do heavy work (a full re-hash): a command
    run on the host in between would have them made twice."""
    kept(ctx_host.get(), _EXPECTED, list).extend(reads)


def service_reads(unit: str) -> list[FactRead]:
    """What :func:`unit_state` reads for one system unit (for ``expect``)."""
    same = {"machine": None, "services": [unit], "user_mode": False, "user_name": None}
    return [(SystemdStatus, same), (SystemdEnabled, dict(same))]


def unit_state(host: Host, unit: str) -> tuple[bool, bool]:
    """Whether the system unit ``unit`` is running, and whether it is enabled (the reads of :func:`service_reads`)."""
    running, enabled = (read(host, cls, **kwargs).get(unit, False) for cls, kwargs in service_reads(unit))
    return bool(running), bool(enabled)


def stale(host: Host) -> None:
    """Forget what was read on ``host``: a command ran there (or is about to)."""
    host = _real(host)
    keep(host, _ANSWERS, {})
    keep(host, _EXPECTED, [])


def run_on(host: Host, command, **kwargs):
    """``host.run_shell_command(command, **kwargs)`` for a command the toolkit runs outside an operation's own
    commands (from a FunctionCommand, or on another member of a cluster): the host's answers go stale."""
    stale(host)
    try:
        return host.run_shell_command(command, **kwargs)
    finally:
        stale(host)


def operation(func: Callable | None = None, **options) -> Callable:
    """pyinfra's ``@operation(**options)`` for the toolkit's own operations: each command the body yields while
    pyinfra executes makes the host's answers stale before it runs and after the operation; an operation that
    yields nothing leaves them as they are."""

    def decorate(body: Callable) -> Callable:
        if not inspect.isgeneratorfunction(body):  # pyinfra would fail only when it runs the operation
            raise TypeError(f"operation {body.__module__}.{body.__qualname__} is not a generator: an operation body "
                            "yields its commands (`yield from ()` where it has none)")

        @functools.wraps(body)
        def commands(*args, **kwargs):
            host = ctx_host.get()
            executing = host.state.is_executing
            quiet = kept(host, _QUIET, set)
            if executing:
                quiet.add(host.current_op_hash)
            for command in body(*args, **kwargs):
                if executing:
                    quiet.discard(host.current_op_hash)
                    stale(host)
                yield command

        return pyinfra_operation(**options)(commands)

    return decorate(func) if func is not None else decorate


class ReadsFollowOperations(BaseStateCallback):
    """Once an operation ends on a host, that host's answers go stale unless it was one of the toolkit's own
    that yielded no command."""

    @staticmethod
    def operation_host_success(state: State, host: Host, op_hash, *args, **kwargs) -> None:
        _ended(host, op_hash)

    @staticmethod
    def operation_host_error(state: State, host: Host, op_hash, *args, **kwargs) -> None:
        _ended(host, op_hash)


def _ended(host: Host, op_hash) -> None:
    quiet = kept(host, _QUIET, set)
    if op_hash not in quiet:
        stale(host)
    quiet.discard(op_hash)


# pyinfra's per-operation arguments that change who reads, where, or with what environment
_READ_AS = ("_sudo_user", "_su_user", "_doas_user", "_chdir", "_env")


def _reads_as_another(host: Host) -> bool:
    """Whether the operation being run sets one of _READ_AS (the kept answers were read without it)."""
    arguments = host.current_op_global_arguments or {}
    return any(arguments.get(name) for name in _READ_AS)


def _real(host) -> Host:
    """The Host object itself: pyinfra's ``host`` import is a proxy, the same object for every host."""
    return ctx_host.get() if host is context.host else host


def _watch(state: State) -> None:
    """Install the callback on this run's State once (before the first answer is kept)."""
    if not kept(state, _WATCHING, lambda: False):
        state.add_callback_handler(ReadsFollowOperations())
        keep(state, _WATCHING, True)


def _answers(host: Host) -> dict:
    """The host's kept answers, dropped when they were read while planning and pyinfra has since shown the plan
    and asked before executing (no ``-y``: the node may have changed while the prompt waited)."""
    state = host.state
    stage = kept(host, _STAGE, lambda: state.current_stage)
    if (state.current_stage == StateStage.Execute and stage == StateStage.Prepare and state.check_for_changes):
        stale(host)
    keep(host, _STAGE, state.current_stage)
    return kept(host, _ANSWERS, dict)
