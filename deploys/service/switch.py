"""The switch: after a start or restart, wait until the service serves (workers: running; heads: /health and the
serving gate); a head that passes keeps the release (with its workers') as the last good one, one that fails is
handled by `failed_release_policy` (rollback: the last good release back on every member, workers first)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand

from deploys.endpoint import closed_flag_path, retry_hint_paths
from deploys.inventory import node_config
from deploys.model.snapshot import UPGRADE_MARKER
from deploys.ops import host_failed, sudo_args
from deploys.run.reads import operation, read, run_on
from deploys.run.state import kept
from deploys.schema import NodeConfig
from deploys.service.door import (
    door_closed_at_command,
    door_open_command,
    door_tells_command,
    parse_door_closed,
    retry_after_s,
    switch_marker_command,
    switch_marker_path,
)
from deploys.service.bench import bench_command, figures_told, parse_bench, regressions
from deploys.service.outcome import Happened, switch_outcome
from deploys.service.release import (
    as_released,
    failure_record,
    forget_command,
    good_release_dir,
    json_file_command,
    record_command,
    release_history_path,
    release_named,
    restore_good_command,
    save_good_command,
    verdict_command,
)
from deploys.service.restart import restart_due
from deploys.serving_gate import (
    failed_checks,
    gate_checks,
    gate_command,
    journal_told,
    parse_readiness,
    readiness_command,
    wait_serving,
)
from facts.containers import GatePassed
from facts.host import ExistingPaths


GATE_BOUND_S = 900  # the switch marker's extra time for a serving gate (its checks' own timeouts, a slow decode)


def serves(host, cfg: NodeConfig, head: bool, model: str, run, progress, sudo: dict,
            abort=None, renew=None, tick=None) -> tuple[bool, str, dict]:
    """Wait for the service of ``cfg`` (a head: /health; a worker: running), showing its stage as it goes; on a
    head, then the serving gate. ``abort()``: a reason to stop waiting (a worker failed); ``renew(longer_s)``: the
    switch marker renewed before the gate, which cannot renew it while it runs; ``tick()``: at each read of the wait.
    (ok, what happened, the unit's last read)."""
    ready, why, now = wait_serving(run, cfg, head, cfg.service_ready_timeout_sec, progress, abort=abort, tick=tick)
    if not ready or not head:
        return ready, why, now
    progress(why)
    if renew:
        renew(GATE_BOUND_S)
    t0 = time.monotonic()
    ok, out = run_on(host, StringCommand(gate_command(cfg, model)), **sudo)
    checks = gate_checks(out.stdout)
    failed = failed_checks(checks)
    if not ok or failed:
        journal = parse_readiness(run(readiness_command(cfg, head)))["journal"]
        told = "; ".join(failed) if checks else f"{failed[0]} ({out.stderr.strip()[-500:]})"
        return False, (f"{cfg.container_name}.service answers /health but failed the serving gate: {told}"
                       f"{journal_told(journal)}"), now
    return True, f"passed the serving gate ({len(checks)} checks, {time.monotonic() - t0:.1f} s)", {**now, "checks": checks}


def passed_record(serving: dict, now: dict, switch_s: float | None) -> dict:
    """A head's gate record of the release ``serving`` that just passed (``now``: its unit's last read, with the
    gate's checks; ``switch_s``: how long its door was closed, when known)."""
    return {**serving, "invocation": now.get("InvocationID"),
            "passed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "checks": [c["check"] for c in now.get("checks", [])],
            **({"bench": now["bench"]} if now.get("bench") else {}),
            **({"switch_s": round(switch_s)} if switch_s is not None else {})}


def _benched(me: "Member", model: str, release: dict, gated: str, now: dict, progress, renew) -> tuple[bool, str, dict]:
    """After the gate passed (``gated``): the release bench (deploys/service/bench.py) on this head, its figures
    compared with the last good release's. (ok, what happened, the unit's last read with the figures)."""
    cfg = me.cfg
    renew(cfg.release_bench_timeout_s * len(cfg.release_bench_concurrency))
    progress(f"{gated}; benchmarking {release_named(release)} (vllm bench serve, concurrency "
             f"{', '.join(map(str, cfg.release_bench_concurrency))})")
    ran, out = run_on(me.host, StringCommand(bench_command(cfg, model)), **me.sudo)
    err = out.stderr.strip()[-500:]
    try:
        levels = parse_bench(out.stdout) if ran else []
    except (ValueError, KeyError, TypeError) as e:
        levels, err = [], f"its result could not be read ({e})"
    if len(levels) != len(cfg.release_bench_concurrency):
        return False, (f"{cfg.container_name}.service passed the serving gate, but the release bench failed: "
                       f"{err or 'no result'}"), now
    good = me.good() or {}
    now = {**now, "bench": levels}
    if worse := regressions(levels, good.get("bench") or [], cfg):
        return False, (f"{cfg.container_name}.service passed the serving gate but serves slower than the last good "
                       f"{release_named(good)}: {'; '.join(worse)}"), now
    against = f" (the last good release: {figures_told(good['bench'])})" if good.get("bench") else ""
    return True, f"{gated}; bench: {figures_told(levels)}{against}", now


class Member:
    """One member's shell as a head's converge reaches it (its own connection and privilege): the head saves and
    rolls back its workers' releases with its own."""

    def __init__(self, host):
        self.host, self.cfg = host, node_config(host)
        self.sudo = sudo_args(host)

    def run(self, command: str) -> str:
        return run_on(self.host, StringCommand(command), **self.sudo)[1].stdout

    def ok(self, command: str) -> bool:
        return run_on(self.host, StringCommand(command), **self.sudo)[0]

    def good(self, kept_in: str | None = None) -> dict | None:
        """The last good release kept on this member (or the one kept in the release directory ``kept_in``; None:
        none, or unreadable)."""
        text = self.run(f"cat {kept_in or good_release_dir(self.cfg)}/release.json 2>/dev/null; true").strip()
        try:
            good = json.loads(text) if text else None
        except ValueError:
            return None
        return good if isinstance(good, dict) else None

    def history(self) -> tuple[str, ...]:
        """The releases that passed the serving gate on this member, by id (empty: none, or unreadable)."""
        text = self.run(f"cat {release_history_path(self.cfg)} 2>/dev/null; true").strip()
        try:
            entries = json.loads(text) if text else []
        except ValueError:
            return ()
        return tuple(str(e["release"]) for e in entries if isinstance(e, dict) and e.get("release")) \
            if isinstance(entries, list) else ()


def _rollback(me: Member, workers: list[Member], good: dict, release: dict, progress) -> tuple[dict | None, str]:
    """Put the last good release ``good`` back on every member, workers first (their rank starts before the head's).
    (the good release, None when nothing was rolled back; what happened)."""
    kept = {w.host.name: w.good() for w in workers}
    if missing := [name for name, g in kept.items() if (g or {}).get("release") != good.get("release")]:
        return None, (f"{', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not keep the last good "
                      f"{release_named(good)}: nothing rolled back")
    progress(f"{release_named(release)} failed: rolling back to the last good {release_named(good)}"
             + (f", workers first ({', '.join(kept)})" if workers else ""))
    for member in [*workers, me]:
        if not member.ok(restore_good_command(member.cfg, kept.get(member.host.name) or good)):
            return None, f"the rollback to {release_named(good)} could not put its files back on {member.host.name}"
    return good, "rolled back"


def _wait_and_gate(state, host, head: bool, model: str, release: dict, record: str, workers: tuple[str, ...]) -> bool:
    """``_switch_ends``, then the node's switch and model-upgrade markers go (a head's: its workers' too), whatever
    the outcome."""
    try:
        return _switch_ends(state, host, head, model, release, record, workers)
    finally:
        for h in [host, *(state.inventory.get_host(name) for name in workers)]:
            if h is host or (h in state.active_hosts or h in state.failed_hosts):
                member = Member(h)
                member.ok(f"rm -f {switch_marker_path(member.cfg)} {UPGRADE_MARKER}")


def _switch_ends(state, host, head: bool, model: str, release: dict, record: str, workers: tuple[str, ...]) -> bool:
    """Execute time, on one node: wait until its service serves (``serves``), then do what the decision table
    (deploys/service/outcome.py) says: keep the release, tell the head, remember it as failed, stop, or roll the
    cluster back (workers first) and gate the restored release; the host fails saying what failed and what the
    cluster serves now."""
    me = Member(host)
    cfg, service = me.cfg, f"{me.cfg.container_name}.service"
    in_run = [state.inventory.get_host(name) for name in workers]
    # a worker outside this run (--limit: a head restarted alone) is not reached: it keeps what it kept; one that
    # failed in this run is reached: the cluster rolls back as one, it too
    members = [Member(h) for h in in_run if h in state.active_hosts and h not in state.failed_hosts]
    away = tuple(h.name for h in in_run if h not in state.active_hosts and h not in state.failed_hosts)
    failed_switch = kept(state, "switch_failed", dict)  # workers that failed at or after their own switch

    def worker_failed() -> str | None:
        """Why the job cannot form: a worker of this head failed its own switch in this run (its start, or its wait
        beside ours). A worker that failed an earlier step (apt, a download) kept its service as it was: no reason."""
        names = [h.name for h in in_run if h.name in failed_switch]
        return f"worker {', '.join(names)} failed its switch in this run (its error is above)" if names else None

    renewed = [time.monotonic()]

    def renew(longer_s: int = 0) -> None:
        """The switch markers of this node and of the members it reached, renewed (`service_switch_lease_s` from now):
        alerts stay quiet while this converge works, and only while it does."""
        for member in [me, *members]:
            member.ok(switch_marker_command(member.cfg, longer_s))
        renewed[0] = time.monotonic()

    def progress(line: str) -> None:
        host.log_styled(line, log_func=logger.info)
        if time.monotonic() - renewed[0] >= cfg.service_switch_lease_s / 3:  # the wait tells at least every 30 s
            renew()

    # how long the door has been closed (a head's, from its flag: a switch's whole window, its drain included), and
    # what it tells its clients while the converge waits: how long the switch may still take
    closed_s, expected = parse_door_closed(me.run(door_closed_at_command(cfg))) if head else (None, None)
    waited = time.monotonic()
    told = [retry_after_s(expected, 0)]  # what the door was told when it closed

    def door_closed_s() -> float | None:
        return None if closed_s is None else closed_s + time.monotonic() - waited

    def tick() -> None:
        """The closed door's Retry-After, kept to what the switch may still take (written when that changes)."""
        if (elapsed := door_closed_s()) is not None and (now_s := retry_after_s(expected, elapsed)) != told[0]:
            if me.ok(door_tells_command(cfg, now_s)):
                told[0] = now_s

    def write_json(path: str, data: dict) -> bool:
        """``data`` as the JSON file ``path`` on this head, replaced whole."""
        return me.ok(json_file_command(path, data))

    def write_record(passed: dict) -> bool:
        return write_json(record, passed)

    def write_verdict(passed: bool, of: dict) -> None:
        """The last gate's verdict, for the node's metrics (a failure to write it fails nothing: the converge itself
        reports the gate's verdict)."""
        me.ok(verdict_command(cfg, passed, of))

    ok, why, now = serves(host, cfg, head, model, me.run, progress, me.sudo, worker_failed if head else None,
                          renew if head else None, tick if head else None)
    if ok and head and cfg.release_bench:
        ok, why, now = _benched(me, model, release, why, now, progress, renew)
    good = me.good() if head and not ok else None
    todo = switch_outcome(Happened(head=head, service=service, ok=ok, release=release, policy=cfg.failed_release_policy,
                                   good=good, history=me.history() if head and not ok else (), workers_away=away))
    if todo.ok and not head:
        progress(why)
        return True
    if todo.keep_passed:
        write_verdict(True, release)
        passed = passed_record(release, now, door_closed_s())
        if not (all(m.ok(f"{save_good_command(m.cfg, passed)} && {forget_command(m.cfg)}") for m in [*members, me])
                and write_record(passed) and me.ok(door_open_command(cfg))):
            return host_failed(host, f"{host.name}: the serving gate passed, but the release could not be kept "
                                     f"({record}, {good_release_dir(cfg)})")
        progress(f"{why}: {release_named(release)}, kept as the last good release"
                 + (f" (with its workers {', '.join(m.host.name for m in members)})" if members else ""))
        return True
    failure = f"{host.name}: {why}"
    if todo.tell_head:
        failed_switch[host.name] = why  # its head stops waiting for it and rolls back the cluster
        return host_failed(host, failure)
    # a worker that failed its own switch (or an earlier step) is reached too: the cluster is remembered, stopped or
    # rolled back as one, that worker included
    members += [Member(h) for h in in_run if h.name in failed_switch or h in state.failed_hosts
                if h.name not in {m.host.name for m in members}]
    if todo.failed_verdict:  # a passing rollback writes its own
        write_verdict(False, release)
    if todo.record_failed:  # remembered on every member: the next converge does not switch to it again
        remembered = failure_record(release, why)
        for member in [me, *members]:
            member.ok(record_command(member.cfg, remembered))
    if todo.act == "stop":
        stopped = all(m.ok(f"systemctl stop {m.cfg.container_name}.service") for m in [me, *members])
        return host_failed(host, f"{failure}\n{host.name}: {service}" + (" and its workers' services" if members else "")
                           + (" stopped " if stopped else " could not be stopped ") + todo.said)
    if todo.act != "rollback":
        return host_failed(host, f"{failure}\n{host.name}: {todo.said}")
    good, what = _rollback(me, members, good, release, progress)
    if good is None:
        return host_failed(host, f"{failure}\n{host.name}: {what} ({service} left as it is){todo.said}")
    for member in members:
        back, why_back, _ = serves(member.host, member.cfg, False, model, member.run, progress, member.sudo)
        if not back:
            return host_failed(host, f"{failure}\n{host.name}: rolled back to {release_named(good)}, but worker "
                                     f"{member.host.name} does not run it: {why_back}{todo.said}")
    cfg_back, model_back = as_released(cfg, model, good)  # gated where the restored release listens, by its name
    renew()
    back, why_back, now_back = serves(host, cfg_back, head, model_back, me.run, progress, me.sudo, renew=renew,
                                       tick=tick)
    write_verdict(back, good)
    if not back:
        return host_failed(host, f"{failure}\n{host.name}: rolled back to {release_named(good)}, which failed too: "
                                 f"{why_back}{todo.said}")
    # (its release bench figures stay with it: the restored release was not benched again)
    write_record(passed_record({k: v for k, v in good.items() if k in release or k == "bench"}, now_back,
                               door_closed_s()))
    me.ok(door_open_command(cfg))  # the restored release passed: the door opens
    on = f" on {host.name} and {', '.join(workers)}" if workers else ""
    return host_failed(host, f"{failure}\n{host.name}: rolled back: {service} serves the last good "
                             f"{release_named(good)} again{on} (it passed the serving gate){todo.said}")


@operation()
def service_serving(service: str, started_from: str, fingerprint: str, release: dict, record: str, head: bool,
                    workers: tuple[str, ...], model: str):
    """Done means serving: after a start or restart, wait for the service (workers: running; heads: /health,
    bounded by ``service_ready_timeout_sec``, with its stage shown) and pass the serving gate on each head.
    Decided from state: a service that runs what the converge renders, and (a head) whose gate record names this
    release, is left alone, so a no-op converge runs no gate (a restart by systemd, a reboot or an admin is no
    converge change: the audit's `-m serving` checks such a start).

    + service: the generated service name
    + started_from: the file the unit writes at each start
    + fingerprint: hash of the rendered unit and env files
    + release: what the inventory asks the service to run (``release_of``)
    + record: the head's gate record (``gate_record_path``)
    + head: rank 0 (or a single node): serves the API and is gated
    + workers: a head's workers (rank > 0), in rank order: kept and rolled back with it
    + model: the name clients ask for
    """
    current = restart_due(service, started_from, fingerprint)[1] is None
    if head:
        last = read(host, GatePassed, record=record, service=service)["release"] or {}
        done = current and last.get("release") == release["release"]
    else:
        done = current
    if not done:
        yield FunctionCommand(_wait_and_gate, (head, model, release, record, workers), {})
        return
    # no switch to make: what one leaves until it ends goes now (a converge killed after the gate, or one that
    # installed another commit's manifest and then the same again: nothing to switch to)
    if left := read(host, ExistingPaths, paths=switch_leftovers(node_config(), head)):
        yield StringCommand("rm", "-f", *left)
    elif head:
        host.noop(f"{service} passed the serving gate for release {release['release']} at {last.get('passed_at')}")
    else:
        host.noop(f"{service} runs the rendered launch (its head's gate checks the job)")


@operation()
def switch_left_for_later(release: dict):
    """A run that stages only (`release_stage_only`, a rollout's first phase): says what is staged and waits; the
    door, the restart and the gate are a later run's. Changes nothing.

    + release: the release staged (release_of)
    """
    host.noop(f"{release_named(release)} staged beside the one that serves: its switch (door, restart, gate) waits "
              "for a run without release_stage_only")
    return
    yield  # (an operation that yields no command)


def switch_leftovers(cfg: NodeConfig, head: bool) -> tuple[str, ...]:
    """What a switch leaves on a node until it ends (``_wait_and_gate``): the model-upgrade mark, and a head's closed
    door flag and what its door tells."""
    return (UPGRADE_MARKER, *((closed_flag_path(cfg), *retry_hint_paths(cfg)) if head else ()))
