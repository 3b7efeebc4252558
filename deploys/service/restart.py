"""The restart decision: whether a node's service must start or restart now, read from the node (what it started
from against what the converge renders and what is verified now), workers (rank > 0) before heads; a multi-node
cluster changes only as a whole."""

from __future__ import annotations

import hashlib
import posixpath

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand
from pyinfra.facts.files import FileContents, Sha256File
from pyinfra.facts.systemd import SystemdStatus

from deploys.inventory import node_config
from deploys.model.snapshot import GATE, MANIFEST, STAMP, kept_tree, manifest_sha1, staged_state
from deploys.ops import (cluster_all_here, follow_up_record_command, follow_up_stamp, host_failed, staged_path,
                         sudo_args)
from deploys.run.reads import operation, read, run_on
from deploys.run.state import kept
from deploys.service.door import door_close_command, drain, switch_marker_command
from deploys.service.release import as_released, gate_record_path, model_switch_command
from deploys.service.unit import QUADLET_STAMP, staged_install_command
from facts.containers import GatePassed, ServiceStartedFrom
from facts.host import ManagedFiles


def restart_reason(running: bool, start: dict, fingerprint: str, manifest: str | None = None) -> str | None:
    """Why the service must be started or restarted now, read from the node (None: it runs what the converge
    renders): down; started from another unit or env (a converge change, or a hand edit that was applied); the
    live model release is another commit than the inventory's ``manifest`` (sha1; the new one is staged beside, the
    switch installs it; no live manifest: the model step installs it in place, the stamp decides); or from another
    verified snapshot (files repaired since it started: it may have loaded the bad one)."""
    if not running:
        return "not running"
    if start["unit"] != fingerprint:
        return "started from another unit or environment"
    if manifest and start.get("manifest") not in (None, manifest):  # (none: installed in place by the model step)
        return "it serves another model commit than the inventory's"
    if not start["verified"]:
        return "its snapshot is not verified now"
    if start["snapshot"] != start["verified"]:
        return "the model snapshot changed since it started (repaired files)"
    return None


def restart_due(service: str, started_from: str, fingerprint: str) -> tuple[bool, str | None]:
    """Read from the node being planned or run: whether ``service`` runs, and why it must (re)start now (None: it
    runs what the converge renders; ``restart_reason``). The same reads every step of a switch decides from."""
    running = read(host, SystemdStatus, services=[service]).get(service)
    start = read(host, ServiceStartedFrom, **started_from_reads(started_from))
    return bool(running), restart_reason(running, start, fingerprint, manifest_sha1(node_config()))


def started_from_reads(started_from: str) -> dict:
    """ServiceStartedFrom's arguments, the same in every step of a switch (one read)."""
    return {"record": started_from, "stamp": STAMP, "manifest": MANIFEST}


@operation()
def cluster_changes_whole(unit_path: str, unit_text: str, cluster: str, members: list[str]):
    """A multi-node cluster changes as one: its members' units change only when every member is in this run and
    none failed before the restart (pull, argument check, sync, apt), else every member fails naming the cause,
    with no unit changed (a head cannot take a worker that runs another launch, nor a worker a head's).

    + unit_path: the installed unit
    + unit_text: the unit about to be installed
    + cluster: the cluster's name
    + members: the host names of every member
    """
    if len(members) < 2:
        host.noop("a single-node cluster")
        return
    if read(host, Sha256File, path=unit_path) == hashlib.sha256(unit_text.encode()).hexdigest():
        host.noop("unit unchanged")
        return
    yield FunctionCommand(cluster_all_here, (cluster, members), {})


@operation()
def service_files_placed(service: str, started_from: str, fingerprint: str, staged: tuple[tuple[str, str], ...],
                         batch: tuple[str, ...]):
    """The unit and environment the converge staged (``staged_path``) go in place now when no (re)start of the
    service follows in this run (a hand edit never applied is undone, and the generator runs); else the restart
    step puts them in place after the door closed, so that until then an exit of the running release restarts
    that release. Where the live files already hold what is rendered: staged copies left by a killed run go, and
    the generator runs if a killed run never ran it.

    + service: the generated service name
    + started_from: the file the unit writes at each start
    + fingerprint: hash of the rendered unit and fabric env
    + staged: (live path, sha256 of its rendered content) for the unit and the environment
    + batch: the deploy's managed files (the live and staged paths among them)
    """
    on_node = read(host, ManagedFiles, paths=batch)
    unit = next(live for live, _ in staged if live.endswith(".container"))
    if all(on_node.get(staged_path(live)) is None for live, _ in staged):
        stamp = read(host, FileContents, path=follow_up_stamp(QUADLET_STAMP))
        if stamp and stamp[0].strip() == dict(staged)[unit]:  # (the stamp of one file: the sha256 of its content)
            host.noop("the unit and environment in place are the rendered ones")
            return
        yield StringCommand("sh", "-c", QuoteString(f"systemctl daemon-reload && "
                                                    f"{follow_up_record_command(QUADLET_STAMP, (unit,))}"))
        return
    if restart_due(service, started_from, fingerprint)[1] is not None:
        host.noop(f"staged: {service}'s restart puts them in place, once its door closed")
        return
    yield StringCommand("sh", "-c", QuoteString(staged_install_command(staged)))


@operation()
def service_current(service: str, started_from: str, fingerprint: str, record: str, act: bool = True,
                    staged: tuple[tuple[str, str], ...] = ()):
    """Start ``service`` if it is down; restart it if it started from anything but the rendered unit and
    fabric env or from another verified snapshot (``restart_reason``); else leave it alone.
    The model gate runs first so a bad snapshot is reported here, not only in the journal.

    + service: the generated service name
    + started_from: the file the unit writes at each start (hash of what it started from)
    + fingerprint: hash of the rendered unit and fabric env
    + record: the head's gate record, removed before a (re)start: the new start has passed no gate yet
    + act: False for hosts whose turn is another operation (workers start before heads)
    + staged: (live path, sha256) of each file this converge staged (``staged_path``): put in place just before
      the (re)start, after the door closed
    """
    if not act:
        host.noop("started in the other rank-ordered step")
        return
    running, reason = restart_due(service, started_from, fingerprint)
    start = read(host, ServiceStartedFrom, **started_from_reads(started_from))
    if reason is None:
        host.noop(f"{service} running, started from the rendered unit and the verified snapshot")
        return
    if running and start["unit"] == fingerprint and start["verified"]:
        logger.info(f"{host.name}: {reason.replace('it started', f'{service} started')}: restarting it")
    yield FunctionCommand(_switch_started, (service, record, bool(running), node_config().is_head, staged), {})


def _switch_started(state, host, service: str, record: str, running: bool, head: bool,
                    staged: tuple[tuple[str, str], ...] = ()) -> bool:
    """Execute time: the model gate, then the gate record goes (the new start has passed no gate yet), the switch
    marker is written, the staged unit and environments are put in place, and the service (re)starts. A worker whose
    switch fails here tells its head (which stops waiting and rolls the cluster back); a head whose own start fails
    goes on to its wait, which sees the failed unit and takes the switch's failure rows (deploys/service/outcome.py):
    rollback, record, a failed verdict."""
    sudo = sudo_args(host)
    steps = ((StringCommand(GATE), "the model gate refused its snapshot"),
             (StringCommand("sh", "-c", QuoteString(f"rm -f {record} && {switch_marker_command(node_config(host))}")),
              "its gate record or switch marker could not be written"),
             *([(StringCommand("sh", "-c", QuoteString(staged_install_command(staged))),
                 "its new unit and environment could not be put in place")] if staged else []),
             (StringCommand("systemctl", "restart" if running else "start", service), f"{service} did not start"))
    for number, (command, what) in enumerate(steps):
        ok, out = run_on(host, command, **sudo)
        if ok:
            continue
        said = " ".join(line.strip() for line in out.stderr.strip().splitlines()[-3:])
        why = f"{what}" + (f": {said[-600:]}" if said else "")
        if head and number == len(steps) - 1:
            host.log_styled(f"{why}; the switch decides what follows (its wait sees the failed unit)",
                            log_func=logger.warning)
            return True
        if not head:
            kept(state, "switch_failed", dict)[host.name] = why
        return host_failed(host, f"{host.name}: {why}")
    return True


@operation()
def model_release_switched(batch: tuple[str, ...]):
    """The model release switches behind the closed door, just before the restart: where the live manifest is
    another commit's than the inventory's, the commit the model step staged and verified beside it
    becomes the live one (``model_switch_command``). Until here the live release kept its manifest, stamp and gate:
    it could restart, and the deep verify checked what serves.

    + batch: the deploy's managed files (the live manifest among them), read in one round trip
    """
    cfg = node_config()
    live = read(host, ManagedFiles, paths=batch).get(MANIFEST)
    if cfg.model_manifest is None or live is None or live["sha1"] == manifest_sha1(cfg):
        host.noop("the live model release is the inventory's commit (or none: the model step installs it in place)")
        return
    yield StringCommand("sh", "-c", QuoteString(model_switch_command(staged_state(cfg.model_revision), cfg.snapshot_dir,
                                                                     kept_tree(cfg, cfg.model_revision))))


@operation()
def switch_marked(service: str, started_from: str, fingerprint: str):
    """A head or single node whose service is about to restart (``restart_reason``) writes its switch marker before
    anything of the switch happens: before its door closes (a closed door is never unexplained: EndpointClosed pages
    once no switch is in progress) and before its workers restart (the head's vLLM exits when they go, and systemd
    restarts it: planned work, not a crash for InferenceServiceRestarting). Its bound covers the drain too.

    + service: the generated service name
    + started_from: the file the unit writes at each start
    + fingerprint: hash of the rendered unit and fabric env
    """
    if restart_due(service, started_from, fingerprint)[1] is None:
        host.noop(f"{service} is not restarted")
        return
    cfg = node_config()
    yield StringCommand("sh", "-c", QuoteString(switch_marker_command(cfg, cfg.endpoint_drain_s)))


@operation()
def door_closed_for_the_switch(service: str, started_from: str, fingerprint: str, flag: str):
    """A head whose service is about to restart (``restart_reason``) closes its door to new API requests first
    (the flag its nginx answers a JSON 503 for, on the clients' loopback port and the endpoint alike) and lets the requests in flight finish, at most ``endpoint_drain_s``:
    clients never get an answer from a release that has not passed the gate, nor a cut stream while it can be
    helped. Opened again once a release passed (``_wait_and_gate``, or ``service_serving`` on a later converge).

    + service: the generated service name
    + started_from: the file the unit writes at each start
    + fingerprint: hash of the rendered unit and fabric env
    + flag: the door's closed flag (``closed_flag_path``)
    """
    running, reason = restart_due(service, started_from, fingerprint)
    if reason is None:
        host.noop(f"{service} is not restarted: its door stays as it is")
        return
    cfg = node_config()
    # (its switch marker was written just before: switch_marked)
    passed = read(host, GatePassed, record=gate_record_path(cfg), service=service)["release"] or {}
    yield StringCommand("install", "-d", "-m", "0755", posixpath.dirname(flag))  # nginx's workers must see the flag
    # its Retry-After: as long as the last switch kept it closed (the converge counts it down while it waits)
    yield StringCommand("sh", "-c", QuoteString(door_close_command(cfg, passed.get("switch_s"))))
    if running:  # the requests in flight are the running release's: asked where it listens (its gate record says)
        yield FunctionCommand(drain, (as_released(cfg, "", passed)[0],), {})
