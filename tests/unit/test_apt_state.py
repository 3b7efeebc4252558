"""The apt/dpkg lock wait, run for real on this machine with stand-in commands (no node needed)."""

from __future__ import annotations

import subprocess
import time

from deploys.apt_state import render_lock_dropin
from deploys.ops import LOCK_WAIT_SCRIPT


def _run(timeout: int, script: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(["sh", "-c", LOCK_WAIT_SCRIPT, "lock-wait", str(timeout), "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - t0


def test_a_held_lock_is_waited_for_until_it_is_released(tmp_path):
    flag = tmp_path / "released"
    # fails like apt-get update on a held lists lock until the flag exists, which appears after ~3 s
    script = (f'[ -e {flag} ] && {{ echo updated; exit 0; }}; echo "E: Could not get lock /var/lib/apt/lists/lock. '
              f'It is held by process 4242 (apt-get)" >&2; exit 100')
    subprocess.Popen(["sh", "-c", f"sleep 3; touch {flag}"])
    proc, took = _run(30, script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "updated"
    assert took >= 2.5
    assert "waiting up to 30s for the apt/dpkg lock: Could not get lock /var/lib/apt/lists/lock. It is held by " \
           "process 4242 (apt-get)" in proc.stderr


def test_dpkg_1_22_lock_message_is_waited_for(tmp_path):
    flag = tmp_path / "released"
    script = (f'[ -e {flag} ] && exit 0; echo "dpkg: error: dpkg frontend lock was locked by /usr/bin/python3.13 '
              f'process with pid 2728" >&2; exit 2')  # measured on trixie's dpkg 1.22.22
    subprocess.Popen(["sh", "-c", f"sleep 2; touch {flag}"])
    proc, took = _run(30, script)
    assert proc.returncode == 0 and took >= 1.5, proc.stderr


def test_the_wait_is_bounded_and_says_who_holds_the_lock():
    script = 'echo "dpkg: error: dpkg frontend lock was locked by another process with pid 77" >&2; exit 2'
    proc, took = _run(3, script)
    assert proc.returncode == 2
    assert took < 10
    assert "gave up after 3s waiting for the apt/dpkg lock to run 'sh -c" in proc.stderr
    assert "dpkg frontend lock was locked by another process with pid 77" in proc.stderr
    assert "unattended-upgrades" in proc.stderr  # what to do about it


def test_other_failures_are_not_retried():
    proc, took = _run(30, 'echo "E: Unable to locate package nope" >&2; exit 100')
    assert proc.returncode == 100 and took < 2
    assert "Unable to locate package nope" in proc.stderr and "waiting" not in proc.stderr


def test_lock_dropin_sets_dpkg_lock_timeout():
    assert 'DPkg::Lock::Timeout "600";' in render_lock_dropin(600)
    assert render_lock_dropin(30).splitlines()[-1] == 'DPkg::Lock::Timeout "30";'


def test_holds_parsed_once_for_every_fact():
    from facts.apt import AptHolds, held_packages

    showhold = ["nvidia-open", "libnvidia-compute-580:amd64", "", "  cuda-drivers  "]
    assert AptHolds().process(showhold) == held_packages(showhold) == [
        "cuda-drivers", "libnvidia-compute-580", "nvidia-open"]
