"""Taking a cluster off the release it serves, back to the good release it served before (a rollout's `--abort`, or
an admin who wants yesterday's release back): `pyinfra -y INVENTORY deploys/roll_back.py --limit CLUSTER`.

Every member keeps the good release before its last (``previous_release_dir``, saved when another release passed the
gate). The head closes its door and drains, puts that release's files back on its workers, then on itself (workers
first: their rank starts before the head's), waits until they run and its own /health, and gates it where it listens.
Passed: it is the cluster's good release again, and the release it left is recorded as failed on every member, so a
plain converge with the same inventory holds its switch back (deploys/service/failed_release.py) instead of switching
to it again. Failed: the host fails saying so, the door stays closed, and a converge of the inventory puts its release
back. Decided from state: a head that does not serve a release to leave changes nothing (a second run is a no-op).
"""

from __future__ import annotations

import posixpath
import time

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, deploy

from deploys.endpoint import closed_flag_path
from deploys.inventory import cluster_member_names, node_config
from deploys.ops import fail_host, host_failed
from deploys.run.reads import operation, read
from deploys.schema import NodeConfig
from deploys.service.door import door_close_command, door_open_command, drain, switch_marker_command, switch_marker_path
from deploys.service.failed_release import asked_release
from deploys.service.release import (as_released, failure_record, gate_record_path, good_release_dir, json_file_command,
                                     previous_release_dir, record_command, release_named, restore_good_command,
                                     verdict_command)
from deploys.service.switch import Member, passed_record, serves
from deploys.service.unit import served_model_name
from facts.containers import GatePassed, JsonRecord

GATE_FIELDS = ("invocation", "passed_at", "checks", "switch_s")  # a gate record's own, beside the release's


def roll_back_decision(name: str, served: dict, leaving: set[str], previous: dict, releases_kept: int) -> tuple[str, str]:
    """What head ``name`` does: ("stay" | "refuse" | "roll back", why). ``served``: its gate record ({}: none);
    ``leaving``: the release ids to take it off; ``previous``: the good release it kept before its last ({}: none)."""
    if served.get("release") not in leaving:
        return "stay", (f"{name} serves {release_named(served) if served else 'no gated release'}, not a release to "
                        "leave: nothing to roll back")
    if not previous.get("release"):
        return "refuse", (f"{name}: no good release before {release_named(served)} is kept here (one passes the gate "
                          "before another can be rolled back to): nothing rolled back")
    if previous["release"] in leaving:
        return "refuse", f"{name}: the release before it, {release_named(previous)}, is one to leave too: nothing rolled back"
    if releases_kept < 2:
        return "refuse", (f"{name}: releases_kept={releases_kept} pruned the release before it ({release_named(previous)}: "
                          "its model commit and image): nothing rolled back")
    return "roll back", f"{name}: from {release_named(served)} back to {release_named(previous)}"


def release_before(previous: dict, good: dict, served: dict) -> dict:
    """The good release a head kept before the one it serves: its previous release directory's, or, where a roll back
    was killed between this head's promote and its gate record (the record still names the release left), its good
    one; {} where it keeps none."""
    if previous:
        return previous
    return good if good.get("release") not in (None, served.get("release")) else {}


def promote_previous_command(cfg: NodeConfig) -> str:
    """Shell: the previous good release becomes the last good one (renamed in; the release left is dropped)."""
    good, previous = good_release_dir(cfg), previous_release_dir(cfg)
    return (f"[ -d {previous} ] && rm -rf {good}.old && {{ [ ! -e {good} ] || mv {good} {good}.old; }} && "
            f"mv {previous} {good} && rm -rf {good}.old")


def where_kept(member: Member, release: str) -> tuple[str | None, dict | None]:
    """The release directory of ``member`` that keeps ``release`` and that release's record: its previous one, or its
    good one where a roll back killed after this member's promote moved it there; (None, None) where neither does."""
    for kept_in in (previous_release_dir(member.cfg), good_release_dir(member.cfg)):
        if (found := member.good(kept_in)) and found.get("release") == release:
            return kept_in, found
    return None, None


def promoted(member: Member, kept_in: str) -> str:
    """Shell: ``member``'s previous release made its good one, unless it is already (``kept_in``: where_kept's)."""
    return promote_previous_command(member.cfg) if kept_in == previous_release_dir(member.cfg) else "true"


def _rolled_back(state, host, served: dict, previous: dict, model: str, workers: tuple[str, ...]) -> bool:
    """Execute time, on a head: the cluster back on ``previous`` (its door closed, workers first, gated)."""
    me = Member(host)
    cfg = me.cfg
    hosts = [state.inventory.get_host(name) for name in workers]
    if away := [h.name for h in hosts if h not in state.active_hosts or h in state.failed_hosts]:
        return host_failed(host, f"{host.name}: worker {', '.join(away)} is not in this run: a cluster rolls back whole "
                                 f"(--limit {cfg.cluster_name}): nothing rolled back")
    members = [Member(h) for h in hosts]
    kept = {m.host.name: where_kept(m, previous["release"]) for m in members}
    kept[host.name] = where_kept(me, previous["release"])
    if missing := [name for name, (kept_in, _) in kept.items() if kept_in is None]:
        return host_failed(host, f"{host.name}: {', '.join(missing)} does not keep {release_named(previous)}: nothing "
                                 "rolled back")

    def progress(line: str) -> None:
        host.log_styled(line, log_func=logger.info)

    def renew(longer_s: int = 0) -> None:
        for member in [me, *members]:
            member.ok(switch_marker_command(member.cfg, longer_s))

    def failed(why: str) -> bool:
        return host_failed(host, f"{host.name}: {why}; its door stays closed: a converge of the inventory "
                                 f"(`pyinfra -y INVENTORY deploys/all.py --limit {cfg.cluster_name}`) puts its release back")

    try:
        renew(cfg.endpoint_drain_s)
        flag = closed_flag_path(cfg)
        me.ok(f"install -d -m 0755 {posixpath.dirname(flag)} && {door_close_command(cfg, served.get('switch_s'))}")
        closed = time.monotonic()  # (how long the door stays closed: the record's switch_s, the next Retry-After)
        drain(state, host, as_released(cfg, "", served)[0])
        progress(f"rolling back from {release_named(served)} to {release_named(previous)}"
                 + (f", workers first ({', '.join(workers)})" if workers else ""))
        for member in [*members, me]:
            kept_in, record = kept[member.host.name]
            if not member.ok(restore_good_command(member.cfg, record, kept_in)):
                return failed(f"the files of {release_named(previous)} could not be put back on {member.host.name}")
        for member in members:
            ok, why, _ = serves(member.host, member.cfg, False, model, member.run, progress, member.sudo)
            if not ok:
                return failed(f"worker {member.host.name} does not run {release_named(previous)}: {why}")
        cfg_back, model_back = as_released(cfg, model, previous)  # gated where it listens, by its name
        renew()
        ok, why, now = serves(host, cfg_back, True, model_back, me.run, progress, me.sudo, renew=renew)
        me.ok(verdict_command(cfg, ok, previous))
        if not ok:
            return failed(f"{release_named(previous)} failed too: {why}")
        left = failure_record(served, "taken off by deploys/roll_back.py (roll_back_from: a rollout's --abort, or an "
                                      "admin)")
        # kept in this order, so that a run killed in between is finished by the next: the release left recorded as
        # failed on every member, then each worker's previous release made its good one (a worker whose previous
        # release is already its good one: where_kept), the head's last, with its gate record in the same command (its
        # record is what the next run decides from: still the release left, it rolls back again)
        record = json_file_command(gate_record_path(cfg), passed_record(
            {k: v for k, v in previous.items() if k not in GATE_FIELDS}, now, time.monotonic() - closed))
        if not (all(m.ok(f"{record_command(m.cfg, left)} && {promoted(m, kept[m.host.name][0])}") for m in members)
                and me.ok(f"{record_command(cfg, left)} && {promoted(me, kept[host.name][0])} && {record}")):
            return failed(f"{release_named(previous)} serves and passed the gate, but could not be kept as the good release")
        me.ok(door_open_command(cfg))
        progress(f"{why}: {release_named(previous)} serves again"
                 + (f" (with its workers {', '.join(workers)})" if workers else "")
                 + f"; {release_named(served)} is recorded as failed here (a converge holds its switch back)")
        return True
    finally:
        for member in [me, *members]:
            member.ok(f"rm -f {switch_marker_path(member.cfg)}")


@operation()
def release_rolled_back(service: str, record: str, previous: str, good: str, leaving: tuple[str, ...], head: bool,
                        workers: tuple[str, ...], model: str, releases_kept: int):
    """A head serving a release to leave goes back to the good release it served before, with its workers
    (``_rolled_back``); one that serves another release changes nothing.

    + service: the generated service name
    + record: the head's gate record (``gate_record_path``)
    + previous: the release directory kept before the last good one (``previous_release_dir``)
    + good: the last good release's directory (``good_release_dir``)
    + leaving: the release ids to take the cluster off
    + head: rank 0 (or a single node): workers are rolled back by their head
    + workers: a head's workers, in rank order
    + model: the name clients ask for
    + releases_kept: how many passed releases pruning keeps (below 2, the previous one is gone)
    """
    if not head:
        host.noop("its head rolls it back with the cluster, workers first")
        return
    served = read(host, GatePassed, record=record, service=service)["release"] or {}
    kept = read(host, JsonRecord, path=f"{previous}/release.json")
    if not kept:
        kept = release_before(kept, read(host, JsonRecord, path=f"{good}/release.json"), served)
    act, why = roll_back_decision(host.name, served, set(leaving), kept, releases_kept)
    if act == "stay":
        host.noop(why)
    elif act == "refuse":
        yield fail_host(why)
    else:
        yield FunctionCommand(_rolled_back, (served, kept, model, workers), {})


@deploy("Roll back to the release before")
def release_back():
    cfg = node_config()
    leaving = tuple(cfg.roll_back_from.split(",")) if cfg.roll_back_from else (asked_release()["release"],)
    members = cluster_member_names()
    release_rolled_back(name="Put the good release before this one back (workers first, gated)",
                        service=f"{cfg.container_name}.service", record=gate_record_path(cfg),
                        previous=previous_release_dir(cfg), good=good_release_dir(cfg), leaving=leaving, head=cfg.is_head,
                        workers=tuple(members[1:]) if cfg.is_head else (), model=served_model_name(cfg),
                        releases_kept=cfg.releases_kept)
