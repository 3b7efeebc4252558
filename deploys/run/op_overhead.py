"""What pyinfra works out on every operation call, worked out cheaper with the same results.

Each operation call (one per host and operation: 276 in a four-node run of deploys/all.py) costs pyinfra
3.10 control-node CPU that does not depend on the host, and the one control process runs every host's:

- where in the deploy code the call was made (``pyinfra.api.util.get_operation_order_from_stack``: the
  file and line of each frame of the call stack, so operations run in code order; ``get_call_location``
  likewise). pyinfra takes the frames from ``inspect.stack()`` and ``inspect.getframeinfo()``, which by
  default also read a line of source for every frame (``findsource``, ``getmodule`` over every loaded
  module), a line pyinfra never uses. Its util module gets the same two functions without source lines
  (``context=0``): the same files and line numbers;
- the global arguments' types (``pyinfra.api.arguments.all_global_arguments``): ``typing.get_type_hints``
  of one fixed class, evaluated afresh at every call and fact; computed once.

Four-node no-op converge (2 cores): these cost 1.7 s of the control process's 4.9 s of CPU (cProfile);
with them gone, and the service check reading one unit's state, it used 2.7-3.6 s (BENCHMARKS.md).
tests/unit/test_op_overhead.py compares the results with pyinfra's own.
"""

from __future__ import annotations

import functools
import inspect

from pyinfra.api import arguments as pyinfra_arguments
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api import util as pyinfra_util

_PYINFRA_ARGUMENTS = pyinfra_arguments.all_global_arguments


def stack_without_source(context: int = 0) -> list[inspect.FrameInfo]:
    """``inspect.stack()`` as its caller would get it, without source lines by default."""
    return inspect.stack(context)[1:]  # from the caller's frame on, as inspect.stack() called there


def frameinfo_without_source(frame, context: int = 0) -> inspect.Traceback:
    """``inspect.getframeinfo()`` without source lines by default."""
    return inspect.getframeinfo(frame, context)


@functools.cache
def _global_arguments() -> tuple[tuple[str, type], ...]:
    return tuple(_PYINFRA_ARGUMENTS())


def all_global_arguments() -> list[tuple[str, type]]:
    """``pyinfra.api.arguments.all_global_arguments``, evaluated once (its class does not change)."""
    return list(_global_arguments())


def install() -> None:
    """Give pyinfra's modules these in place of their own imports (idempotent)."""
    pyinfra_util.stack, pyinfra_util.getframeinfo = stack_without_source, frameinfo_without_source
    pyinfra_arguments.all_global_arguments = all_global_arguments
    pyinfra_facts.all_global_arguments = all_global_arguments
