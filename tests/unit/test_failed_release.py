"""A release that failed is remembered on every member and not switched to again (deploys/service/failed_release.py); the
drill on real nodes: tests/node/test_60_inference_service.py (the scrambled upgrade, converged twice)."""

from __future__ import annotations

import json
import subprocess

from deploys.service.failed_release import decision
from deploys.service.release import failure_record, forget_command, record_command
from deploys.schema import validate_hosts
from tests.unit.test_hostile_input import node_a

RELEASE = {"release": "5d1c0a9e8b7f6a5d", "image": "registry.example/vllm@sha256:" + "a" * 64,
           "model_repo": "deepseek-ai/DeepSeek-V4-Flash-0731", "model_revision": "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"}


def test_a_failure_is_kept_with_its_first_line_and_refused_when_asked_again():
    why = "grandpa.service answers /health but failed the serving gate: coherence: answer: 'zq'; its journal ends:\nline"
    record = failure_record(RELEASE, why)
    assert record["reason"] == why.splitlines()[0] and record["release"] == RELEASE["release"]
    refused, message = decision("node-a", record, RELEASE, retry=False)
    assert refused
    assert message.startswith("node-a: the inventory asks for release 5d1c0a9e8b7f6a5d (image registry.example/vllm@")
    assert "deepseek-ai/DeepSeek-V4-Flash-0731@9e165c30e270), which failed here at " in message
    assert "coherence: answer" in message and "--data retry_failed_release=true" in message
    assert message.count("\n") == 1, "the reason's first line only: no journal"


def test_another_release_or_a_retry_goes_ahead():
    record = failure_record(RELEASE, "failed")
    assert decision("node-a", record, {**RELEASE, "release": "0000000000000000"}, retry=False)[0] is False
    refused, why = decision("node-a", record, RELEASE, retry=True)
    assert not refused and "trying it again" in why
    assert decision("node-a", {}, RELEASE, retry=False) == (False, "no failed release is remembered here")


def test_the_record_is_written_whole_and_forgotten_by_shell(tmp_path, monkeypatch):
    from deploys.service import release as failed_release

    monkeypatch.setattr(failed_release, "STATE_DIR", str(tmp_path))
    cfg = validate_hosts(node_a())["node-a"]
    path = failed_release.failed_release_path(cfg)
    record = failure_record(RELEASE, "it's 'quoted' $(not run)")
    subprocess.run(["sh", "-c", record_command(cfg, record)], check=True)
    assert json.loads(open(path).read()) == record
    subprocess.run(["sh", "-c", forget_command(cfg)], check=True)
    assert not (tmp_path / path.rsplit("/", 1)[1]).exists()


def test_the_retry_key_is_a_boolean_off_by_default():
    assert validate_hosts(node_a())["node-a"].retry_failed_release is False
    assert validate_hosts(node_a(retry_failed_release=True))["node-a"].retry_failed_release is True
