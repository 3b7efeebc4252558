"""The switch's decision table (deploys/service/outcome.py), row by row, without nodes: what a node does once its
wait and gate ended. The executor and the real parts are the node tier's (tests/node/test_60_inference_service.py)."""

import pytest

from deploys.service.outcome import Happened, ToDo, known_good, switch_outcome

NEW = {"release": "new0000000000000", "image": "img@sha256:2", "model_revision": "b" * 40}
OLD = {"release": "old0000000000000", "image": "img@sha256:1", "model_revision": "a" * 40}
SERVICE = "inference.service"


def head(**kw) -> Happened:
    return Happened(**{"head": True, "service": SERVICE, "ok": False, "release": NEW, "good": OLD,
                       "history": (OLD["release"],), **kw})


def test_a_head_that_passed_keeps_the_release_and_opens_the_door():
    assert switch_outcome(head(ok=True)) == ToDo(ok=True, keep_passed=True)


def test_a_worker_that_runs_is_done_and_one_that_failed_tells_its_head():
    assert switch_outcome(Happened(head=False, service=SERVICE, ok=True, release=NEW)) == ToDo(ok=True)
    assert switch_outcome(Happened(head=False, service=SERVICE, ok=False, release=NEW)) == ToDo(ok=False, tell_head=True)


def test_a_new_release_that_fails_is_remembered_and_rolled_back_to_the_last_good_one():
    todo = switch_outcome(head())
    assert todo == ToDo(ok=False, record_failed=True, act="rollback", failed_verdict=True, said="")


@pytest.mark.parametrize("history, good", [((NEW["release"], OLD["release"]), OLD), ((), NEW), ((NEW["release"],), None)])
def test_a_release_that_passed_here_before_is_never_remembered_as_failed(history, good):
    """N1: the head restarts a release that passed here (its history, or the last good one kept) and fails: the fault
    is the host's (a dpkg lock after a boot, a driver update, a missing device), said as such."""
    assert known_good(NEW, good, history)
    todo = switch_outcome(head(history=history, good=good))
    assert not todo.record_failed and todo.failed_verdict and not todo.ok
    assert "not remembered as a failed release: what failed is this host's" in todo.said


def test_the_last_good_release_itself_failing_has_nothing_to_roll_back_to_and_says_whose_fault():
    todo = switch_outcome(head(good=NEW, history=(NEW["release"],)))
    assert todo.act == "none" and not todo.record_failed and todo.failed_verdict
    assert todo.said.startswith(f"this is the last good release itself: nothing older to roll back to ({SERVICE} left")


def test_an_older_known_release_that_fails_rolls_back_without_a_record():
    """The inventory went back to a release in the history, which fails on this host now: the last good one comes
    back, and the older one is not remembered as failed (it is not the release's fault)."""
    todo = switch_outcome(head(history=(NEW["release"], OLD["release"])))
    assert todo.act == "rollback" and not todo.record_failed and "is this host's" in todo.said


@pytest.mark.parametrize("policy, act, said", [
    ("keep", "none", f"{SERVICE} left as it is (failed_release_policy=keep)"),
    ("stop", "stop", "(failed_release_policy=stop)"),
])
def test_the_policy_keep_or_stop_decides_before_any_rollback(policy, act, said):
    todo = switch_outcome(head(policy=policy, history=()))
    assert todo == ToDo(ok=False, record_failed=True, act=act, failed_verdict=True, said=said)


def test_workers_outside_the_run_get_nothing_rolled_back():
    todo = switch_outcome(head(workers_away=("b1",), history=()))
    assert todo.act == "none" and todo.record_failed and todo.failed_verdict
    assert todo.said == f"its workers b1 are not in this run: nothing rolled back ({SERVICE} left as it is)"


def test_a_first_release_that_fails_is_remembered_with_nothing_to_roll_back_to():
    todo = switch_outcome(head(good=None, history=()))
    assert todo.act == "none" and todo.record_failed and todo.failed_verdict
    assert todo.said.startswith("no release has passed the serving gate on this node yet: nothing to roll back to")


def test_every_head_failure_leaves_a_failed_verdict_so_it_pages():
    rows = [head(), head(policy="keep"), head(policy="stop"), head(workers_away=("b1",)), head(good=None, history=()),
            head(good=NEW)]
    assert all(switch_outcome(r).failed_verdict and not switch_outcome(r).ok for r in rows)
