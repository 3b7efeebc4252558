"""A converge leaves Prometheus having loaded its files (issue 53): files/monitoring/prometheus_loaded.py reads
Prometheus's own word on its last reload, against a real HTTP server serving Prometheus's metrics text."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from facts.host import PrometheusReload
from files.monitoring.prometheus_loaded import reload_state, verdict
from tests.unit.local_http import serving

HELPER = "files/monitoring/prometheus_loaded.py"
TEXT = """# HELP prometheus_config_last_reload_successful Whether the last configuration reload attempt was successful.
# TYPE prometheus_config_last_reload_successful gauge
prometheus_config_last_reload_successful {ok}
# TYPE prometheus_config_last_reload_success_timestamp_seconds gauge
prometheus_config_last_reload_success_timestamp_seconds {at}
prometheus_config_last_reload_successful_other 7
"""


@pytest.mark.parametrize("state, since, said", [
    (None, None, "down"),
    ({}, None, "down"),
    ({"prometheus_config_last_reload_successful": 1.0}, None, "loaded"),
    ({"prometheus_config_last_reload_successful": 0.0}, None, "not-loaded"),
    ({"prometheus_config_last_reload_successful": 0.0,
      "prometheus_config_last_reload_success_timestamp_seconds": 2e9}, 1e9, "not-loaded"),
    ({"prometheus_config_last_reload_successful": 1.0,
      "prometheus_config_last_reload_success_timestamp_seconds": 1e9 - 1}, 1e9, "pending"),
    ({"prometheus_config_last_reload_successful": 1.0,
      "prometheus_config_last_reload_success_timestamp_seconds": 1e9}, 1e9, "loaded"),
])
def test_prometheus_says_whether_it_loaded_its_files_since_the_reload_was_asked(state, since, said):
    assert verdict(state, since) == said


def test_the_two_reload_series_are_read_from_the_metrics_text_and_nothing_else():
    assert reload_state(TEXT.format(ok=0, at=1.7e9)) == {"prometheus_config_last_reload_successful": 0.0,
                                                          "prometheus_config_last_reload_success_timestamp_seconds": 1.7e9}


def test_the_fact_maps_anything_but_a_verdict_to_down():
    fact = PrometheusReload()
    assert "prometheus_loaded.py 9190" in fact.command("/usr/local/lib/inference-nodes/prometheus_loaded.py", 9190)
    assert [fact.process(o) for o in (["loaded"], ["not-loaded"], ["down"], [], ["Traceback"])] == \
        ["loaded", "not-loaded", "down", "down", "down"]


@pytest.fixture
def prometheus():
    """A stand-in of Prometheus's /metrics: ``state["ok"]``/``state["at"]`` as it serves them."""
    state = {"ok": 1, "at": 1.0}
    with serving(lambda: TEXT.format(**state)) as port:
        yield port, state


def _check(port, *extra):
    return subprocess.run([sys.executable, HELPER, str(port), *extra], capture_output=True, text=True, timeout=30)


def test_after_a_reload_the_check_waits_for_prometheus_to_load_and_fails_on_its_failure(prometheus):
    port, state = prometheus
    assert _check(port).stdout.strip() == "loaded"
    since = time.time()
    state["at"] = since - 5  # the HUP is not handled yet: the last success is older than the reload asked for
    threading.Timer(1.0, lambda: state.update(at=since + 1)).start()
    t0 = time.monotonic()
    waited = _check(port, "--since", str(since), "--wait", "10")
    assert waited.returncode == 0 and waited.stdout.strip() == "loaded" and time.monotonic() - t0 >= 0.9
    state.update(ok=0)  # Prometheus kept its old rules: said at once, a failure
    failed = _check(port, "--since", str(since), "--wait", "10")
    assert failed.returncode == 1 and failed.stdout.strip() == "not-loaded"
    state.update(ok=1, at=since - 5)  # never reported within the wait
    assert _check(port, "--since", str(since), "--wait", "1").returncode == 1
    assert _check(1, "--since", str(since), "--wait", "0").stdout.strip() == "down"
