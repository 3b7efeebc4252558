"""A release that failed is remembered on every member of its cluster, and not switched to again.

When a head's serving gate fails (whatever `failed_release_policy` then does), the head writes the release that failed
(its id, image, model commit, time and the first line of why) to ``failed_release_path`` (deploys/service/release.py)
on itself and on each of its workers. A later converge that asks for that same release holds only the switch back on
each member: the steps that make the release (the image pull, the model snapshot and its deep verify, the service)
are skipped (no download, no re-hash, no restart), and everything else converges (packages, driver, limits, the
endpoint's keys and certificate, monitoring), the endpoint and the node's metrics pointed at the release that serves.
The run warns at once and fails the host at its end: the node stays on what it serves and is behind its inventory,
named with the release, when it failed and why, and how to try again (`--data retry_failed_release=true`, or a
changed inventory). The record stays while the inventory asks for other releases; a pass of the release asked for
removes it.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy

from deploys.inventory import node_cluster, node_config
from deploys.ops import fail_host
from deploys.run.reads import operation, read
from deploys.run.held import defer, hold, release_held
from deploys.service.release import failed_release_path, gate_record_path, release_named, release_of
from deploys.service.unit import fingerprint, render_container
from facts.containers import GatePassed, JsonRecord


def asked_release() -> dict:
    """The release the inventory asks the cluster of the host being prepared to serve: its head's (the id every
    member's record names)."""
    cluster = node_cluster()
    head = cluster.head
    unit = render_container(head, head, cluster.size, cluster.members)
    return release_of(head, fingerprint(unit, head, head, cluster.size))


@operation()
def failed_release_not_retried(held: bool, why: str):
    """Say that the switch to a release that failed here before is held back (decided by ``release_asked`` while the
    run is planned: the release's own steps, planned after it, skip themselves), or why it is not.

    + held: the release is held back
    + why: ``decision``'s words
    """
    if held:
        host.log_styled(f"{why.splitlines()[0]}: its switch is held back (the image, the model and the service stay as "
                        "they are); the rest converges", log_func=logger.warning)
    host.noop(why.splitlines()[0] if held else why)
    yield from ()  # a decision only: the release's own steps act on it (an operation body is a generator)


@operation()
def release_held_told():
    """At the end of a run whose switch was held back on this host: fail it, saying why and how to go on."""
    if why := release_held():
        yield fail_host(why)
    else:
        host.noop("the release asked for was not held back")


def decision(name: str, failed: dict, asked: dict, retry: bool) -> tuple[bool, str]:
    """(refused, why) for host ``name`` whose record of a failed release is ``failed`` ({}: none)."""
    if not failed:
        return False, "no failed release is remembered here"
    when = f"failed here at {failed.get('failed_at')}"
    if failed.get("release") != asked["release"]:
        return False, f"{release_named(failed)} {when}; the inventory asks for another"
    if retry:
        return False, f"{release_named(failed)} {when}: trying it again (retry_failed_release)"
    return True, (f"{name}: the inventory asks for {release_named(failed)}, which {when}: {failed.get('reason')}\n{name}: "
                  "its switch was held back (no image pull, no model download or re-hash, no restart; the rest converged); the node stays "
                  "on the release it serves and is behind its inventory. Try the release again with `--data "
                  "retry_failed_release=true` once what failed is fixed outside the inventory, or change the inventory")


def served_release() -> dict:
    """The release a head serves (the record of its last passed gate: its API among it); {} elsewhere or unknown."""
    cfg = node_config()
    if not cfg.is_head:
        return {}
    return read(host, GatePassed, record=gate_record_path(cfg), service=f"{cfg.container_name}.service")["release"] or {}


@deploy("Release asked for")
def release_asked():
    """Whether this host's switch is held back, decided while the run is planned (an operation's body runs only when
    pyinfra executes it, after every later step was planned): the record is read now, and the hold kept for the
    steps planned after (deploys/run/held.py). The record stays until a release the inventory asks for passes the
    gate here (or another fails)."""
    cfg = node_config()
    held, why = decision(host.name, read(host, JsonRecord, path=failed_release_path(cfg)), asked_release(),
                         cfg.retry_failed_release)
    hold(why if held else None, served_release() if held else None)
    if cfg.release_stage_only and not held:
        defer(served_release())
    failed_release_not_retried(name="Do not switch to a release that failed here", held=held, why=why)


@deploy("Release held back")
def release_held_reported():
    release_held_told(name="Say that the switch was held back (a release that failed here)")
