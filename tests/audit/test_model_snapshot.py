"""Audit of the model snapshot: the node's start gate passes against the manifest the inventory pins
(so every rank of a cluster reports the same manifest digest), and the cache layout keeps its ref."""

import json

import pytest

from deploys.model_fanout import SEED_DIR, SEED_UNIT
from files.model_snapshot.verify_snapshot import manifest_digest


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
