"""Audit of the model snapshot: the node's start gate passes against the manifest the inventory pins
(so every rank of a cluster reports the same manifest digest), the cache layout keeps its ref, and the
scheduled deep verify runs and last found every file good, recently enough (`--full-verify` re-hashes
every file now as well)."""

import json
import shlex
import time

import pytest

from deploys.model.fanout import SEED_DIR, SEED_UNIT
from deploys.model.swarm import SWARM_STATE, SWARM_UNIT
from deploys.model.integrity import UNIT, UNIT_DIR, render_service, render_timer
from deploys.model.snapshot import max_age_s
from deploys.model.snapshot import HUB_TOKEN, MANIFEST, RECORD, STAMP, VERIFIER
from files.model_snapshot.snapshot_manifest import manifest_digest


def _manifest(node):
    if node.cfg.model_manifest is None:
        pytest.fail(f"{node.name}: no model_manifest in the inventory: the snapshot cannot be trusted")
    with open(node.cfg.model_manifest) as f:
        return json.load(f)


def test_start_gate_passes_against_the_pinned_manifest(node):
    digest = manifest_digest(_manifest(node))
    result = node.host.run("inference-nodes-model-gate")
    assert result.rc == 0, result.stderr.strip()
    assert f"verified against {digest}" in result.stdout


def test_node_holds_the_pinned_manifest(node):
    local = _manifest(node)
    remote = json.loads(node.host.file("/etc/inference-nodes/model-manifest.json").content_string)
    assert remote == local


def test_cache_layout_has_refs_main(node):
    if node.cfg.model_layout != "hf_cache":
        pytest.skip("plain layout: no HF cache refs")
    assert node.host.file(f"{node.cfg.model_dir}/refs/main").content_string.strip() == node.cfg.model_revision


def test_no_push_seed_or_run_secret_left(node):
    """A push fan-out serves peers only while its run lasts: no daemon, no secret afterwards."""
    assert not node.host.service(SEED_UNIT).is_running
    assert not node.host.file(SEED_DIR).exists


def test_no_model_swarm_left_unless_kept_seeding(node):
    """The swarm runs while a run syncs (or as long as `model_swarm_keep_seeding_h` says): afterwards no unit, no
    torrent or status, nothing listening on its port."""
    if node.cfg.model_sync_mode == "swarm" and node.cfg.model_swarm_keep_seeding_h:
        pytest.skip(f"the swarm may keep seeding {node.cfg.model_swarm_keep_seeding_h} h (model_swarm_keep_seeding_h)")
    assert not node.host.service(SWARM_UNIT).is_running, f"{SWARM_UNIT} still runs"
    assert not node.host.file(SWARM_STATE).exists, f"{SWARM_STATE} is left"
    if node.cfg.model_sync_mode == "swarm":
        listening = node.host.run("ss -Htln").stdout
        assert f":{node.cfg.model_swarm_port} " not in listening, listening


def test_hub_token_only_where_configured(node):
    """A hub token is on the node, 0600 root, exactly while the inventory configures one for hub mode."""
    token = node.host.file(HUB_TOKEN)
    if node.cfg.model_sync_mode == "hub" and node.cfg.model_hub_token_file:
        assert token.is_file and token.user == "root" and token.mode == 0o600
    else:
        assert not token.exists, f"{HUB_TOKEN} is on the node but the inventory configures no hub token"


def test_deep_verify_timer_is_installed_and_active(node):
    for suffix, render in ((".service", render_service), (".timer", render_timer)):
        unit = node.host.file(f"{UNIT_DIR}/{UNIT}{suffix}")
        assert unit.exists and unit.content_string == render(node.cfg), f"{UNIT}{suffix} is not the rendered one"
    timer = node.host.service(f"{UNIT}.timer")
    assert timer.is_enabled and timer.is_running, f"{UNIT}.timer is not enabled and active"


def test_last_deep_verify_is_recent_and_found_every_file_good(node):
    record_file = node.host.file(RECORD)
    assert record_file.exists, (f"no deep verify recorded ({RECORD}): run `systemctl start {UNIT}.service` on the "
                                f"node, or converge with --data model_verify_full=true")
    record = json.loads(record_file.content_string)
    age = time.time() - record["at"]
    print(f"{node.name}: last deep verify {age / 3600:.1f} h ago: {record['verdict']}, {record.get('hashed')} files "
          f"hashed in {record.get('seconds')} s")
    assert record["verdict"] == "ok", f"the last deep verify found bad files: {'; '.join(record['problems'][:10])}"
    assert record.get("manifest_digest") == manifest_digest(_manifest(node)), "last verified against another manifest"
    assert age <= max_age_s(node.cfg), (f"the last deep verify is {age / 3600:.0f} h old; "
                                        f"model_deep_verify_every={node.cfg.model_deep_verify_every} allows "
                                        f"{max_age_s(node.cfg) / 3600:.0f} h")


def test_every_file_rehashes_to_the_manifest(node, pytestconfig):
    if not pytestconfig.getoption("full_verify"):
        pytest.skip("re-hashing every file is slow: pytest tests/audit --full-verify")
    argv = ["python3", VERIFIER, MANIFEST, node.cfg.snapshot_dir, "--stamp", STAMP, "--full", "--check-only", "--json",
            "--quiet"]
    result = json.loads(node.host.run(shlex.join(argv)).stdout.strip().splitlines()[-1])
    assert result["ok"], "; ".join(result["problems"][:20])
