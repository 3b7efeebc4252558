"""Per-run state: what one pyinfra run keeps between hosts and operations, all kept the same way.

A value lives on one of the run's own objects (its State, its Inventory or a Host), under a name, for as
long as that object does: a new run in the same process (the unit tier, the benchmarks) starts empty, and
nothing is keyed by ``id()``, which Python reuses once an object is freed. pyinfra's ``state`` and ``host``
imports are context proxies (the same object in every run): pass the real object (:func:`this_run`,
``host.state``, a ``Host``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, TypeVar

from pyinfra.api import State
from pyinfra.context import ctx_state

T = TypeVar("T")

_kept: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def kept(owner: Any, name: str, make: Callable[[], T]) -> T:
    """The value called ``name`` kept on ``owner`` for this run, made by ``make()`` the first time."""
    values = _kept.setdefault(owner, {})
    if name not in values:
        values[name] = make()
    return values[name]


def keep(owner: Any, name: str, value: Any) -> None:
    """Keep ``value`` as ``name`` on ``owner`` for this run, in place of what was kept before."""
    _kept.setdefault(owner, {})[name] = value


def this_run() -> State:
    """The State of the run in progress (the real object behind pyinfra's ``state`` proxy)."""
    return ctx_state.get()
