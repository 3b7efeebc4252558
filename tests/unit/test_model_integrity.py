"""The deep verify's units, from typed keys: when it runs, how gently, what it does on a mismatch, and how
old the audit lets its last verdict be."""

import pytest
from pydantic import ValidationError

from deploys.model.integrity import render_service, render_timer, verify_argv
from deploys.model.snapshot import max_age_s
from deploys.service.unit import unit_sections
from deploys.schema import NodeConfig
from tests.unit.profiles import profile


def cfg(**changes) -> NodeConfig:
    return NodeConfig.model_validate({**profile("rtx_pro_6000_pair"), **changes})


def test_default_is_weekly_in_a_night_window_and_stops_the_service_on_a_mismatch():
    c = cfg()
    timer = dict(unit_sections(render_timer(c))["Timer"])
    # a run missed while the node was down is not started at boot, when vLLM loads the same bytes
    assert timer == {"OnCalendar": "Sun *-*-* 03:00:00", "RandomizedDelaySec": "4h", "Persistent": "false"}
    service = dict(unit_sections(render_service(c))["Service"])
    assert service["Nice"] == "19" and service["IOSchedulingClass"] == "idle" and service["Type"] == "oneshot"
    # the idle class does nothing under NVMe's `none` scheduler: the device's reads are capped too
    assert service["IOReadBandwidthMax"] == f"{c.model_dir} 500M"
    argv = verify_argv(c)
    assert argv[argv.index("--stop-service") + 1] == f"{c.container_name}.service"
    assert {"--full", "--drop-cold", "--record"} <= set(argv) and argv[argv.index("--max-rate") + 1] == "500"
    uncapped = cfg(model_deep_verify_max_mbps=None)
    assert "--max-rate" not in verify_argv(uncapped) and "IOReadBandwidth" not in render_service(uncapped)
    assert max_age_s(c) == 7 * 86400 + 4 * 3600 + 12 * 3600


@pytest.mark.parametrize("every,calendar,days", [("daily", "*-*-* 01:30:00", 1), ("monthly", "*-*-01 01:30:00", 31)])
def test_interval_window_rate_and_policy_keys(every, calendar, days):
    c = cfg(model_deep_verify_every=every, model_deep_verify_at="01:30", model_deep_verify_window_h=0,
            model_deep_verify_max_mbps=200, model_deep_verify_on_mismatch="keep_serving")
    assert dict(unit_sections(render_timer(c))["Timer"])["OnCalendar"] == calendar
    argv = verify_argv(c)
    assert argv[argv.index("--max-rate") + 1] == "200" and "--stop-service" not in argv
    assert max_age_s(c) == days * 86400 + 12 * 3600


@pytest.mark.parametrize("key,value", [
    ("model_deep_verify_at", "3:00"), ("model_deep_verify_at", "24:00"), ("model_deep_verify_at", "03:00\n"),
    ("model_deep_verify_at", "03:00; rm -rf /"), ("model_deep_verify_every", "hourly"),
    ("model_deep_verify_window_h", 24), ("model_deep_verify_max_mbps", 0),
    ("model_deep_verify_on_mismatch", "ignore"),
])
def test_bad_schedule_values_are_refused(key, value):
    with pytest.raises(ValidationError, match=key):
        cfg(**{key: value})


def test_needs_reload_fact_from_systemctl_show_output():
    from facts.host import SystemdNeedsReload

    fact = SystemdNeedsReload()
    units = ("inference-nodes-model-verify.service", "inference-nodes-model-verify.timer")
    assert fact.command(units=units) == ("systemctl show -p NeedDaemonReload --value "
                                         "inference-nodes-model-verify.service inference-nodes-model-verify.timer")
    assert fact.process(["no", "", "yes"]) is True  # one value per unit, a blank line between
    assert fact.process(["no", "", "no"]) is False
    assert fact.process([]) is False


def test_a_stale_record_asks_the_converge_for_a_full_re_hash_under_the_same_cap(tmp_path):
    """The fact's own command on real files, with a verifier that prints the flags it was given: no record, or
    one older than the audit allows (the timer missed its window and does not catch up at boot), is a full
    re-hash; a fresh one is the stamp's fast path; either way under the read-rate cap."""
    import json
    import os
    import subprocess
    import time

    from facts.model import ModelVerification

    verifier, manifest, record = tmp_path / "v.py", tmp_path / "m.json", tmp_path / "record.json"
    verifier.write_text("import json, sys\nprint(json.dumps({'ok': True, 'argv': sys.argv[1:]}))\n")
    manifest.write_text("{}")
    c = cfg()

    def flags() -> list[str]:
        command = ModelVerification().command(verifier=str(verifier), manifest=str(manifest), snapshot_dir="/s",
                                              stamp="/st", record=str(record), stale_after_s=max_age_s(c),
                                              max_rate=c.model_deep_verify_max_mbps)
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        return json.loads(out.splitlines()[-1])["argv"]

    assert "--full" in flags() and flags()[flags().index("--max-rate") + 1] == "500"  # no record
    record.write_text("{}")
    assert "--full" not in flags()
    old = time.time() - max_age_s(c) - 600
    os.utime(record, (old, old))
    assert "--full" in flags()


def test_an_upgrade_starts_where_another_commits_manifest_replaces_the_installed_one():
    """The model-upgrade mark is written only where the converge replaces the node's manifest (a first install has
    no live release for the deep verify to misjudge; the same manifest again is no upgrade)."""
    import hashlib

    from deploys.model.snapshot import upgrade_starts

    new, old = b'{"commit": "9e16"}', b'{"commit": "7872"}'
    installed = {"user": "root", "group": "root", "mode": 644, "sha1": hashlib.sha1(old).hexdigest()}
    assert upgrade_starts(installed, new)
    assert not upgrade_starts(installed, old)
    assert not upgrade_starts(None, new)
    assert "--skip-while" in verify_argv(cfg()) and cfg().model_upgrade_marker_h == 12
    with pytest.raises(ValidationError, match="model_upgrade_marker_h"):
        cfg(model_upgrade_marker_h=0)


def test_a_model_step_run_again_before_the_switch_leaves_a_counting_mark_as_it_is():
    """Slice 2: the live manifest stays another commit's until the switch, so the model step alone run twice (a
    resumed download) finds the upgrade again: a mark that still counts for over half its bound is left as it is
    (the second run changes nothing); an expired, unreadable or missing one is written anew."""
    from deploys.model.snapshot import marker_left_s

    now = 1_000_000.0
    assert marker_left_s(['{"until": 1036000}'], now) == 36000
    assert marker_left_s(['{"until": 999000}'], now) == 0
    for lines in (None, [], ["not json"], ['{"until": "soon"}'], ['{"until": true}'], ["[1]"]):
        assert marker_left_s(lines, now) == 0, lines
