"""A release that failed is remembered on every member of its cluster, and not switched to again.

When a head's serving gate fails (whatever `failed_release_policy` then does), the head writes the release that failed
(its id, image, model commit, time and the first line of why) to ``failed_release_path`` (deploys/service/release.py)
on itself and on each of its workers. A later converge that asks for that same release is refused on each member before anything on the node
changes (no download, no re-hash, no restart): the node stays on what it serves and the run says it is behind its
inventory, naming the release, when it failed and why, and how to try again (`--data retry_failed_release=true`, or a
changed inventory). The record stays while the inventory asks for other releases; a pass of the release asked for
removes it.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from deploys.inventory import node_cluster, node_config
from deploys.ops import fail_host
from deploys.run.reads import operation, read
from deploys.service.release import failed_release_path, release_named, release_of
from deploys.service.unit import fingerprint, render_container
from facts.containers import JsonRecord


def asked_release() -> dict:
    """The release the inventory asks the cluster of the host being prepared to serve: its head's (the id every
    member's record names)."""
    cluster = node_cluster()
    head = cluster.head
    unit = render_container(head, head, cluster.size, cluster.members)
    return release_of(head, fingerprint(unit, head, head, cluster.size))


@operation()
def failed_release_not_retried(path: str, asked: dict, retry: bool):
    """Refuse to switch to a release that failed here before (unless ``retry``). The record stays until a release
    the inventory asks for passes the gate here (or another fails): asking for the failed one again is refused.

    + path: this member's failed-release record
    + asked: the release the inventory asks the cluster to serve (its head's)
    + retry: `retry_failed_release`
    """
    refused, why = decision(host.name, read(host, JsonRecord, path=path), asked, retry)
    if refused:
        yield fail_host(why)
    else:
        host.noop(why)


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
                  "nothing changed; the node stays on the release it serves and is behind its inventory. Try the "
                  "release again with `--data retry_failed_release=true` once what failed is fixed outside the "
                  "inventory, or change the inventory")


@deploy("Release asked for")
def release_asked():
    cfg = node_config()
    failed_release_not_retried(name="Do not switch to a release that failed here", path=failed_release_path(cfg),
                               asked=asked_release(), retry=cfg.retry_failed_release)
