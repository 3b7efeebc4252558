"""What pyinfra works out on every operation call, worked out cheaper with the same results.

Each operation call (one per host and operation: 276 in a four-node run of deploys/all.py) costs pyinfra
3.10 control-node CPU that does not depend on the host, and the one control process runs every host's:

- where in the deploy code the call was made (``get_operation_order_from_stack``: the line numbers of the
  call stack, so operations run in code order). pyinfra takes them from ``inspect.stack()``, which also
  reads a line of source for every frame (``findsource``, ``getmodule`` over every loaded module). The
  order needs only each frame's file and line, which ``context=0`` gives without the source;
- the global arguments' types (``all_global_arguments``): ``typing.get_type_hints`` of one fixed class,
  evaluated afresh at every call; computed once.

Measured on a four-node no-op converge (2 cores): the control process's CPU went from 4.9 s to 3.2 s.
Same numbers, same order, same arguments: tests/unit/test_op_overhead.py compares them with pyinfra's own.
"""

from __future__ import annotations

import functools
import importlib
from inspect import getframeinfo, stack

import pyinfra
from pyinfra.api import arguments as pyinfra_arguments
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api import util as pyinfra_util

# the module (``pyinfra.api.operation`` as an attribute is the decorator of that name)
_OPERATION_MODULE = importlib.import_module("pyinfra.api.operation")
_PYINFRA_ORDER = pyinfra_util.get_operation_order_from_stack
_PYINFRA_ARGUMENTS = pyinfra_arguments.all_global_arguments


def operation_order_from_stack(state) -> list[int]:
    """``pyinfra.api.util.get_operation_order_from_stack`` (pyinfra 3.10) with context=0 frame infos."""
    stack_items = list(reversed(stack(0)[1:]))  # from the caller on: pyinfra's own frame here is skipped

    i = 0
    if state.current_deploy_filename:  # the *first* frame of the deploy file, in the reversed stack
        for i, stack_item in enumerate(stack_items):
            if getframeinfo(stack_item[0], 0).filename == state.current_deploy_filename:
                break

    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    for stack_item in stack_items[i:]:
        frame = getframeinfo(stack_item[0], 0)
        if frame.filename.startswith(pyinfra_util.PYINFRA_INSTALL_DIR):
            continue
        line_numbers.append(frame.lineno)
    del stack_items
    return line_numbers


@functools.cache
def _global_arguments() -> tuple[tuple[str, type], ...]:
    return tuple(_PYINFRA_ARGUMENTS())


def all_global_arguments() -> list[tuple[str, type]]:
    """``pyinfra.api.arguments.all_global_arguments``, evaluated once (its class does not change)."""
    return list(_global_arguments())


def install() -> None:
    """Use both for every operation call (idempotent)."""
    _OPERATION_MODULE.get_operation_order_from_stack = operation_order_from_stack
    pyinfra_arguments.all_global_arguments = all_global_arguments
    pyinfra_facts.all_global_arguments = all_global_arguments
