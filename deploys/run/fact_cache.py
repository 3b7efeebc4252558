"""Facts read once per run while they cannot have changed.

pyinfra 3 runs every operation's body twice, to decide whether it changes anything (prepare) and to run
it (execute), and each `host.get_fact` is a command on the node both times; it keeps no fact cache.
Until a command has executed on a host in this run, nothing on that host has changed (operations do not
write while they prepare), so a fact asked again with the same arguments has the answer already read:
it is returned from memory. From a host's first executed command on, its facts are read afresh, as
pyinfra does. A no-op converge thus reads each fact once instead of twice or more.

:func:`prefetch` fills the same answers ahead of time: the facts a run is known to ask for are read in one
command per host (each in its own subshell, split by a random marker) instead of one round trip each. Each
answer is what pyinfra would have returned for that read; a read that fails, lacks its command or cannot be
processed is not kept, so asked for later it is read on its own, with pyinfra's own handling and messages.
Each component declares the reads its operations will make (:func:`expect`, at the top of its ``@deploy``,
while pyinfra prepares); they are read together with the next read that is not answered yet. A no-op
converge thus spends one command on most of a node's facts: each command costs an SSH channel, a session
and a shell on the node, which on a machine running four nodes was the larger part of a no-op run.
A declared read the run does not make costs only its share of that command; one it makes but nobody
declared is read on its own, as before. Within that command, the per-unit reads of pyinfra's
``systemd.service`` (``SystemdStatus``, ``SystemdEnabled``) share one ``systemctl show`` of every unit named.
"""

from __future__ import annotations

import contextlib
import copy
import secrets
from typing import Any, Iterable

from pyinfra import logger
from pyinfra.api import QuoteString, StringCommand
from pyinfra.api import command as pyinfra_command
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.facts import FactBase
from pyinfra.api.host import Host
from pyinfra.context import ctx_host
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from deploys.run.state import keep, kept

_EXPECTED = "expected fact reads"  # per host: reads to make together with the next unanswered one
_ANSWERS = "fact answers"  # per host (deploys/run/state.py): {(fact, args): answer}, or None once a command ran
_COMMANDS = (pyinfra_command.StringCommand, pyinfra_command.FileUploadCommand,
             pyinfra_command.FileDownloadCommand, pyinfra_command.FunctionCommand, pyinfra_command.RsyncCommand)


def _key(cls, args, kwargs) -> tuple:
    return cls, repr(args), repr(sorted(kwargs.items()))


FactRead = tuple[type[FactBase], dict[str, Any]]  # a fact class and the keyword arguments a deploy reads it with


def expect(reads: Iterable[FactRead]) -> None:
    """Reads this run's operations will make on the host being prepared: made together, in one command,
    with the next read that is not answered yet. Leave out facts that may do heavy work (a full re-hash):
    a command executed on the host in between would have them made twice."""
    host = ctx_host.get()
    if kept(host, _ANSWERS, dict) is not None:
        kept(host, _EXPECTED, list).extend(reads)


def service_reads(unit: str) -> list[FactRead]:
    """What pyinfra's ``systemd.service`` reads for one system unit."""
    same = {"machine": None, "services": [unit], "user_mode": False, "user_name": None}
    return [(SystemdStatus, same), (SystemdEnabled, dict(same))]


def prefetch(host: Host, reads: Iterable[FactRead]) -> int:
    """Read ``reads`` on ``host`` in one command into this run's answers; returns how many were kept.
    Facts with preconditions or their own shell are left to be read on their own."""
    answers = kept(host, _ANSWERS, dict)
    if answers is None:
        return 0
    todo, parts, executor, seen, unit_reads = [], [], None, set(), []
    marker = f"@@facts-{secrets.token_hex(8)}"  # a line no fact prints
    for cls, kwargs in reads:
        key = _key(cls, (), kwargs)
        if (key in answers or key in seen or not issubclass(cls, FactBase) or cls.shell_executable
                or cls.check_preconditions is not FactBase.check_preconditions):
            continue
        fact = cls()
        fact_kwargs, global_kwargs = pyinfra_facts._handle_fact_kwargs(host.state, host, cls, (), kwargs)
        run_as = {k: v for k, v in global_kwargs.items() if k in CONNECTOR_ARGUMENT_KEYS}
        if executor is not None and run_as != executor:
            continue  # read with other connector arguments (another user, say): on its own
        executor = run_as
        seen.add(key)
        if (units := _named_system_units(cls, {k: v for k, v in fact_kwargs.items() if k != "self"})) is not None:
            unit_reads.append((key, fact, units))
            continue
        command = pyinfra_facts._make_command(fact.command, dict(fact_kwargs))
        todo.append((key, fact))
        parts.append(_section(command, pyinfra_facts._make_command(fact.requires_command, dict(fact_kwargs)), marker))
    units = list(dict.fromkeys(u for _, _, names in unit_reads for u in names))
    if units:
        parts.append(_section(_unit_show(units), SystemdStatus().requires_command(), marker))
    if len(todo) + len(unit_reads) < 2:
        return 0
    status, output = host.run_shell_command(StringCommand(*parts), print_output=host.state.print_fact_output,
                                            print_input=host.state.print_fact_input, **executor)
    if not status:
        return 0
    logger.debug("%sread %d facts in one command", host.print_prefix, len(todo) + len(unit_reads))
    sections = _split(output.stdout_lines, marker)
    for (key, fact), (rc, lines) in zip(todo, sections):
        if rc != 0 or lines == [pyinfra_facts._MISSING_COMMAND_MARKER]:
            continue
        try:
            answers[key] = fact.process(lines) if lines else fact.default()
        except Exception:  # noqa: BLE001  read again on its own, where pyinfra reports it
            continue
    if units and len(sections) == len(todo) + 1 and sections[-1][0] == 0:  # (no systemctl: no Id= blocks)
        blocks = _unit_blocks(sections[-1][1], units)
        for key, fact, names in unit_reads if blocks else ():
            # the lines pyinfra's own read of these units would get: their blocks, a blank line between
            with contextlib.suppress(Exception):  # read again on its own, where pyinfra reports it
                answers[key] = fact.process([line for name in names for line in ["", *blocks[name]]][1:])
    return sum(1 for key in [*(k for k, _ in todo), *(k for k, _, _ in unit_reads)] if key in answers)


def _section(command, requires, marker: str) -> StringCommand:
    """One fact's part of the prefetch: its command (or pyinfra's missing-command marker when ``requires``
    is not installed) in a subshell, then the marker line with its exit status."""
    if requires:
        command = StringCommand("if", "command", "-v", requires, ">/dev/null", "2>&1;", "then", "(", command,
                                ");", "else", "echo", f"'{pyinfra_facts._MISSING_COMMAND_MARKER}';", "fi")
    return StringCommand("(", command, ");", "printf", f"'\\n{marker} %d\\n'", "$?;")


def _named_system_units(cls, kwargs) -> list[str] | None:
    """The units a ``SystemdStatus``/``SystemdEnabled`` read of the system manager names (no pattern), or
    None for any other read. These are answered from one ``systemctl show`` for all of them: pyinfra's
    ``systemd.service`` reads both per unit, each a systemctl call and a round of work for PID 1."""
    if cls not in (SystemdStatus, SystemdEnabled) or set(kwargs) - {"machine", "services", "user_mode", "user_name"}:
        return None
    if kwargs.get("machine") or kwargs.get("user_mode") or kwargs.get("user_name"):
        return None
    services = kwargs.get("services")
    names = [services] if isinstance(services, str) else list(services or [])
    if not names or any(not isinstance(n, str) or not n or set(n) & set("*?[\\") for n in names):
        return None
    return names


def _unit_show(units: list[str]) -> StringCommand:
    """pyinfra's systemctl command for both facts, with both state properties (each fact's ``process``
    skips the other's line), for every unit at once; systemctl prints one block per name given, in order."""
    return StringCommand("systemctl", "show", "--all", "--property", "Id",
                         *(p for cls in (SystemdStatus, SystemdEnabled) for p in ("--property", cls.state_key)),
                         *(QuoteString(u) for u in units))


def _unit_blocks(lines: list[str], units: list[str]) -> dict[str, list[str]] | None:
    """Each unit's block of ``systemctl show`` output, or None when the blocks do not match the names."""
    blocks, current = [], []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if len(blocks) != len(units) or any(not b[0].startswith("Id=") for b in blocks):
        return None
    return dict(zip(units, blocks))


def _split(lines: list[str], marker: str) -> list[tuple[int, list[str]]]:
    """Each command's (exit status, stdout lines) from the prefetch's output. The marker line starts with a
    newline of its own: one empty line before it is the marker's, not the command's."""
    sections, current = [], []
    for line in lines:
        if line.startswith(marker + " "):
            if current and current[-1] == "":
                current.pop()
            sections.append((int(line.split()[-1]), current))
            current = []
        else:
            current.append(line)
    return sections


def install() -> None:
    """Wrap Host.get_fact and every command's execute once (idempotent)."""
    if getattr(Host.get_fact, "_per_run_cache", False):
        return
    read = Host.get_fact

    def get_fact(self, cls, *args, **kwargs):
        answers = kept(self, _ANSWERS, dict)
        if answers is None or not isinstance(cls, type):
            return read(self, cls, *args, **kwargs)
        key = _key(cls, args, kwargs)
        if key not in answers and (expected := kept(self, _EXPECTED, list)):
            keep(self, _EXPECTED, [])
            prefetch(self, [*expected, *([] if args else [(cls, kwargs)])])
        if key not in answers:
            answers[key] = read(self, cls, *args, **kwargs)
        return copy.deepcopy(answers[key])

    get_fact._per_run_cache = True
    Host.get_fact = get_fact

    for command_cls in _COMMANDS:
        execute = command_cls.execute

        def counted(self, state, host, connector_arguments, _execute=execute):
            keep(host, _ANSWERS, None)  # a command executed on this host: its facts are read afresh from now on
            return _execute(self, state, host, connector_arguments)

        command_cls.execute = counted
