"""A rollout's waves, decided before anything changes (pure): the canary wave first, then the other clusters in the
inventory's order in waves of the sizes ``--serial`` gives (Ansible's `serial: [1, "25%", "100%"]`: a count or a
percentage of all the clusters, the last size repeating), never more clusters in one wave than ``--max-down`` (the
clusters a wave restarts are down together). A wave holds whole clusters: a cluster is never split."""

from __future__ import annotations

import math
import re

SERIAL_ITEM = re.compile(r"^(?:(\d+)|(\d+(?:\.\d+)?)%)$")


class PlanError(ValueError):
    """A rollout option that cannot be planned (said before anything runs)."""


def parse_serial(items: list[str]) -> list[int | float]:
    """``--serial`` values: ``3`` (clusters) or ``25%`` (of all the rollout's clusters) -> 3 or 0.25."""
    out: list[int | float] = []
    for item in items:
        m = SERIAL_ITEM.match(item.strip())
        if not m:
            raise PlanError(f"--serial {item}: a number of clusters (1) or a percentage of them (25%)")
        value: int | float = int(m.group(1)) if m.group(1) else float(m.group(2)) / 100
        if value <= 0 or (isinstance(value, float) and value > 1):
            raise PlanError(f"--serial {item}: at least one cluster, at most 100%")
        out.append(value)
    return out or [1.0]


def wave_size(item: int | float, total: int) -> int:
    """A serial item as a number of clusters: a percentage of ``total`` rounded down, at least one."""
    return item if isinstance(item, int) else max(1, math.floor(item * total + 1e-9))


def plan_waves(clusters: list[str], canaries: list[str], serial: list[int | float],
               max_down: int | None = None) -> list[list[str]]:
    """The waves, in order. ``clusters``: every cluster of the rollout, in inventory order; ``canaries``: those
    marked `rollout_canary` (none: the first cluster is the canary)."""
    if max_down is not None and max_down < 1:
        raise PlanError(f"--max-down {max_down}: at least 1 (a wave restarts at least one cluster)")
    unknown = [c for c in canaries if c not in clusters]
    if unknown:
        raise PlanError(f"canary {', '.join(unknown)}: not a cluster of this rollout ({', '.join(clusters)})")
    if not clusters:
        return []
    canary = [c for c in clusters if c in canaries] or clusters[:1]
    rest = [c for c in clusters if c not in canary]
    waves = _bounded([canary], max_down)
    sizes = iter(serial)
    size = wave_size(next(sizes), len(clusters))
    while rest:
        waves += _bounded([rest[:size]], max_down)
        rest = rest[size:]
        size = wave_size(next(sizes, size), len(clusters))  # (the last size repeats)
    return waves


def _bounded(waves: list[list[str]], max_down: int | None) -> list[list[str]]:
    if max_down is None:
        return waves
    return [wave[i:i + max_down] for wave in waves for i in range(0, len(wave), max_down)]
