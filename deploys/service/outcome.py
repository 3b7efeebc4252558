"""The switch's decision table: what a node does once its wait (and, on a head, the serving gate) ended, decided from
what happened alone (pure: no node is read, nothing runs; deploys/service/switch.py carries it out).

| situation (a head's or single node's wait ended)  | recorded as failed      | then                  | the door   |
|---------------------------------------------------|-------------------------|-----------------------|------------|
| it serves and passed the gate                     | no (a record is forgot) | keep it as last good  | opens      |
| failed, `failed_release_policy=keep`               | unless known good       | leave it as it is     | stays shut |
| failed, `failed_release_policy=stop`               | unless known good       | stop every member     | stays shut |
| failed, a worker is outside this run (`--limit`)  | unless known good       | nothing rolled back   | stays shut |
| failed, no release has passed here yet            | yes                     | nothing to roll back  | stays shut |
| failed, it *is* the last good release             | never                   | nothing older: the    | stays shut |
|                                                   |                         | host's fault, said so |            |
| failed, an older good release is kept             | unless known good       | roll back, workers    | opens once |
|                                                   |                         | first, gate it again  | it passes  |
| a worker failed at or after its own switch        | (its head decides)      | its head stops        | (the head) |
|                                                   |                         | waiting, rolls back   |            |

A release is *known good* when it passed the serving gate here before (the node's release history, or the last
good release kept): its failure now is the host's (a held dpkg lock, a driver update, a missing device), so it is
never remembered as a failed release, which would refuse every later converge. A head's own start that fails takes
the same rows as a failed gate (its wait sees the failed unit), and so does a release bench (`release_bench`) that
fails or finds the release slower than the last good one beyond its thresholds (deploys/service/bench.py). A worker that failed at or after its own switch tells
its head, which stops waiting and decides for the cluster; a worker that failed an earlier step of the run (its
service untouched) counts for nothing here. Every failure that leaves no release serving writes a failed gate
verdict, so `ServingGateFailed` pages at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Happened:
    """What happened on one node in its switch."""

    head: bool  # rank 0 or a single node: serves the API and is gated
    service: str  # the node's service, as its messages name it
    ok: bool  # it serves (a head: and passed the gate, and the release bench where it runs)
    release: dict  # what the inventory asks for (``release_of``)
    policy: str = "rollback"  # `failed_release_policy`
    good: dict | None = None  # the last good release kept on this node
    history: tuple[str, ...] = ()  # the releases that passed the gate here, by id
    workers_away: tuple[str, ...] = ()  # a head's workers outside this run


@dataclass(frozen=True)
class ToDo:
    """What the node does about it (``switch_outcome``)."""

    ok: bool  # the host's own verdict: a failure fails the host
    keep_passed: bool = False  # keep the release as the last good one (workers' too), forget a failed-release record
    tell_head: bool = False  # a worker: its head stops waiting and decides for the cluster
    record_failed: bool = False  # remember the release as failed on every member reached
    act: str = "none"  # "none" | "stop" | "rollback"
    failed_verdict: bool = False  # write a failed gate verdict for the release (it pages at once)
    said: str = ""  # what the host says after its own failure line


def known_good(release: dict, good: dict | None, history: tuple[str, ...]) -> bool:
    """``release`` passed the serving gate here before (it is in the history, or the last good one kept)."""
    return release.get("release") in history or (good or {}).get("release") == release.get("release")


def switch_outcome(h: Happened) -> ToDo:
    """The decision table of the module's docstring, one row per return."""
    if h.ok:
        return ToDo(ok=True, keep_passed=h.head)
    if not h.head:
        return ToDo(ok=False, tell_head=True)
    known = known_good(h.release, h.good, h.history)
    record = not known
    host_fault = ("; it passed the serving gate here before, so it is not remembered as a failed release: what "
                  "failed is this host's (see above)") if known else ""
    left = f"({h.service} left as it is){host_fault}"
    if h.policy == "keep":
        return ToDo(ok=False, record_failed=record, failed_verdict=True,
                    said=f"{h.service} left as it is (failed_release_policy=keep){host_fault}")
    if h.policy == "stop":
        return ToDo(ok=False, record_failed=record, act="stop", failed_verdict=True,
                    said=f"(failed_release_policy=stop){host_fault}")
    if h.workers_away:
        return ToDo(ok=False, record_failed=record, failed_verdict=True,
                    said=f"its workers {', '.join(h.workers_away)} are not in this run: nothing rolled back {left}")
    if not h.good:
        return ToDo(ok=False, record_failed=record, failed_verdict=True,
                    said=f"no release has passed the serving gate on this node yet: nothing to roll back to {left}")
    if h.good.get("release") == h.release.get("release"):
        return ToDo(ok=False, record_failed=False, failed_verdict=True,
                    said=f"this is the last good release itself: nothing older to roll back to ({h.service} left as "
                         "it is); it is not remembered as a failed release: what failed is this host's (see above)")
    return ToDo(ok=False, record_failed=record, act="rollback", failed_verdict=True, said=host_fault)
