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


def test_a_failure_is_kept_with_its_first_line_and_held_back_when_asked_again():
    why = "grandpa.service answers /health but failed the serving gate: coherence: answer: 'zq'; its journal ends:\nline"
    record = failure_record(RELEASE, why)
    assert record["reason"] == why.splitlines()[0] and record["release"] == RELEASE["release"]
    refused, message = decision("node-a", record, RELEASE, retry=False)
    assert refused
    assert message.startswith("node-a: the inventory asks for release 5d1c0a9e8b7f6a5d (image registry.example/vllm@")
    assert "deepseek-ai/DeepSeek-V4-Flash-0731@9e165c30e270), which failed here at " in message
    assert "coherence: answer" in message and "--data retry_failed_release=true" in message
    assert "its switch was held back (no image pull, no model download or re-hash, no restart; the rest converged)" in message
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


def _run_on_local(tmp_path, deploy: str) -> subprocess.CompletedProcess:
    """``deploy`` (a deploy file's text) run by the real pyinfra CLI on @local, from the repository root."""
    import os
    import sys

    (tmp_path / "deploy.py").write_text(deploy)
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    proc = subprocess.run([pyinfra, "-y", "@local", str(tmp_path / "deploy.py")], capture_output=True, text=True,
                          timeout=120, cwd=os.getcwd())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


HELD_DEPLOY = """
from pyinfra import host
from deploys.run.held import as_served, hold, release_held
from deploys.schema import NodeConfig
from tests.unit.profiles import profile

cfg = NodeConfig.model_validate(profile("rtx_pro_6000_pair"))
before = (release_held(), as_served(cfg).api_port)
hold("why it is held", {"release": "5d1c", "api_port": 8101, "api_bind_address": None})
after = (release_held(), as_served(cfg).api_port, as_served(cfg).api_bind_address == cfg.api_bind_address,
         as_served(cfg).engine_port, as_served(cfg).has_door)
hold(None)
host.log(f"HELD {before} {after} {(release_held(), as_served(cfg).api_port)}")
"""


def test_a_held_release_is_kept_for_the_host_and_points_the_endpoint_at_the_served_api(tmp_path):
    """What the release's own steps read (deploys/run/held.py), on a real pyinfra run: held or not, and the API of
    the release that serves (its recorded port; a field it did not record stays the inventory's)."""
    proc = _run_on_local(tmp_path, HELD_DEPLOY)
    from deploys.schema import NodeConfig
    from tests.unit.profiles import profile

    port = NodeConfig.model_validate(profile("rtx_pro_6000_pair")).api_port
    assert port != 8101
    # (a record from before the door: that release's vLLM is on the clients' port itself, with no door before it)
    assert f"HELD (None, {port}) ('why it is held', 8101, True, 8101, False) (None, {port})" in proc.stdout + proc.stderr, \
        proc.stderr[-2000:]


STAGED_DEPLOY = """
from pyinfra import host
from deploys.run.held import as_served, defer, release_held, switch_deferred
from deploys.schema import NodeConfig
from tests.unit.profiles import profile

cfg = NodeConfig.model_validate(profile("rtx_pro_6000_pair"))
before = (switch_deferred(), as_served(cfg).api_port)
defer({"release": "5d1c", "api_port": 8101, "engine_port": 18101})
host.log(f"STAGED {before} {(switch_deferred(), release_held(), as_served(cfg).api_port, as_served(cfg).engine_port)}")
"""


def test_a_run_that_stages_only_defers_the_switch_and_keeps_the_endpoint_on_the_served_api(tmp_path):
    """`release_stage_only` (a rollout's stage phase), on a real pyinfra run: the switch is deferred (the service step
    stops after staging), nothing is held back (the image, model and unit are staged), and the endpoint and metrics
    stay in front of the release that serves."""
    proc = _run_on_local(tmp_path, STAGED_DEPLOY)
    from deploys.schema import NodeConfig
    from tests.unit.profiles import profile

    port = NodeConfig.model_validate(profile("rtx_pro_6000_pair")).api_port
    assert f"STAGED (False, {port}) (True, None, 8101, 18101)" in proc.stdout + proc.stderr, proc.stderr[-2000:]
