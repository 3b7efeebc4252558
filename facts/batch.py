"""Several facts read in one command: an ordinary compound fact (deploys/run/reads.py reads it).

Each command pyinfra runs costs an SSH channel, a session and a shell on the node; a no-op converge that read
each fact on its own ran some fifty of them per host. ``FactBatch`` runs every read it is given in one command,
each in a subshell of its own, split by a random marker line that carries the read's exit status, and answers
each with the fact's own ``process`` (or ``default`` for no output): what a read of that fact on its own returns.
A read whose command fails, whose ``requires_command`` is missing, or whose output its ``process`` refuses gets
no answer here; asked for again, it is read on its own, with pyinfra's own handling and messages.

Within that command, the per-unit reads of ``SystemdStatus`` and ``SystemdEnabled`` (two ``systemctl show``
calls per unit, each a round of work for PID 1) share one ``systemctl show`` of every unit named.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

Read = tuple[type[FactBase], dict[str, Any]]  # a fact class and the keyword arguments it is read with


def read_key(cls: type[FactBase], kwargs: dict[str, Any]) -> tuple:
    """The one key a read is known by (deploys/run/reads.py keeps answers under it)."""
    return cls, repr(sorted(kwargs.items()))


def batchable(cls: type) -> bool:
    """Whether a read of ``cls`` can go into a batch: a fact run by the default shell, with no preconditions."""
    return (isinstance(cls, type) and issubclass(cls, FactBase) and not cls.shell_executable
            and cls.check_preconditions is FactBase.check_preconditions)


class Reads(tuple):
    """The reads a batch makes; short in pyinfra's fact log lines (``-v`` prints a fact's arguments)."""

    def __repr__(self) -> str:
        return f"<{len(self)} reads>"

    __str__ = __repr__


class FactBatch(FactBase):
    """``{read_key: answer}`` for each of ``reads`` that could be answered, from one command."""

    default = dict

    def command(self, reads: Reads) -> StringCommand:
        self._marker = f"@@facts-{secrets.token_hex(8)}"  # a line no fact prints
        self._singles, self._unit_reads, parts = [], [], []
        for cls, kwargs in reads:
            fact = cls()
            if (units := _named_system_units(cls, kwargs)) is not None:
                self._unit_reads.append((read_key(cls, kwargs), fact, units))
                continue
            self._singles.append((read_key(cls, kwargs), fact))
            parts.append(self._section(_text(fact.command, kwargs), _text(fact.requires_command, kwargs)))
        self._units = list(dict.fromkeys(u for _, _, names in self._unit_reads for u in names))
        if self._units:
            parts.append(self._section(_unit_show(self._units), SystemdStatus().requires_command()))
        return StringCommand(*parts) if parts else StringCommand("true")

    def _section(self, command, requires) -> StringCommand:
        """One read's part: its command in a subshell, then the marker line with its exit status (``missing``
        where ``requires`` is not installed)."""
        run = StringCommand("(", command, ");", "printf", f"'\\n{self._marker} %d\\n'", "$?;")
        if not requires:
            return run
        return StringCommand("if", "command", "-v", requires, ">/dev/null", "2>&1;", "then", run, "else",
                             "printf", f"'\\n{self._marker} missing\\n';", "fi;")

    def process(self, output: list[str]) -> dict:
        sections = _split(output, self._marker)
        answers = {}
        for (key, fact), (status, lines) in zip(self._singles, sections):
            if status != "0":
                continue
            with contextlib.suppress(Exception):  # read again on its own, where pyinfra reports it
                answers[key] = fact.process(lines) if lines else fact.default()
        if self._units and len(sections) == len(self._singles) + 1 and sections[-1][0] == "0":
            blocks = _unit_blocks(sections[-1][1], self._units)  # (no systemctl: no Id= blocks)
            for key, fact, names in self._unit_reads if blocks else ():
                # the lines pyinfra's own read of these units would get: their blocks, a blank line between
                with contextlib.suppress(Exception):
                    answers[key] = fact.process([line for name in names for line in ["", *blocks[name]]][1:])
        return answers


def _text(command, kwargs: dict):
    """A fact's ``command`` or ``requires_command`` (a method or a plain value) for ``kwargs``."""
    return command(**kwargs) if callable(command) else command


def _named_system_units(cls, kwargs: dict) -> list[str] | None:
    """The units a ``SystemdStatus``/``SystemdEnabled`` read of the system manager names (no pattern), or None
    for any other read."""
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
    """pyinfra's systemctl command for both facts, with both state properties (each fact's ``process`` skips the
    other's line), for every unit at once; systemctl prints one block per name given, in order."""
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


def _split(lines: list[str], marker: str) -> list[tuple[str, list[str]]]:
    """Each read's (exit status or ``missing``, stdout lines). The marker line starts with a newline of its own:
    one empty line before it is the marker's, not the read's."""
    sections, current = [], []
    for line in lines:
        if line.startswith(marker + " "):
            if current and current[-1] == "":
                current.pop()
            sections.append((line.split()[-1], current))
            current = []
        else:
            current.append(line)
    return sections
