"""Facts read once per run while they cannot have changed.

pyinfra 3 runs every operation's body twice, to decide whether it changes anything (prepare) and to run
it (execute), and each `host.get_fact` is a command on the node both times; it keeps no fact cache.
Until a command has executed on a host in this run, nothing on that host has changed (operations do not
write while they prepare), so a fact asked again with the same arguments has the answer already read:
it is returned from memory. From a host's first executed command on, its facts are read afresh, as
pyinfra does. A no-op converge thus reads each fact once instead of twice or more.
"""

from __future__ import annotations

import copy

from pyinfra.api import command as pyinfra_command
from pyinfra.api.host import Host

from deploys.run_state import keep, kept

_ANSWERS = "fact answers"  # per host (deploys/run_state.py): {(fact, args): answer}, or None once a command ran
_COMMANDS = (pyinfra_command.StringCommand, pyinfra_command.FileUploadCommand,
             pyinfra_command.FileDownloadCommand, pyinfra_command.FunctionCommand, pyinfra_command.RsyncCommand)


def _key(cls, args, kwargs) -> tuple:
    return cls, repr(args), repr(sorted(kwargs.items()))


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
