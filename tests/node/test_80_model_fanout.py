"""Push fan-out on three sandbox nodes: past `model_push_fanout` (2) nodes, a node holding a verified copy feeds
the next one over its transient read-only rsync daemon, not the control node; a peer that cannot serve is replaced
by the control node; nothing is left serving once the run ends.

The three nodes are pointed at one model, commit and path (`--data`; both layouts), which makes them one group: the control node
feeds sandbox-a and sandbox-b0 (wave 1), sandbox-a feeds sandbox-b1 (wave 2). The module fixture converges the
real inventory again afterwards, so each node gets its own model, manifest and gate back.
"""

from __future__ import annotations

import json
import os
import re
import socket

import pytest

from deploys.model.fanout import SEED_DIR, SEED_UNIT
from deploys.model.snapshot import MANIFEST, VERIFIER
from tests.node.conftest import INVENTORY, changed_operations, on_node, pyinfra

pytestmark = pytest.mark.model  # the node tier's subject (`make test-fast SUBJECT=model`)

ROOT = "/srv/fanout"
COMMIT = "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
MODEL_ONLY = "deploys.model.snapshot.model_snapshot"
SHARDS = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]


MANIFEST_FILE = (f"{os.environ.get('SANDBOX_DIR', '/var/tmp/inference-nodes-sandbox')}/manifests/"
                 f"deepseek-ai--DeepSeek-V4-Flash-0731@{COMMIT}.json")


def model_files() -> dict[str, int]:
    """path -> size of the stand-in hub's model at COMMIT, from its manifest."""
    with open(MANIFEST_FILE) as f:
        return {e["path"]: e["size"] for e in json.load(f)["files"]}


def group_args(layout: str) -> list[str]:
    manifest = MANIFEST_FILE
    return ["--data", f'model_root="{ROOT}"', "--data", f'model_layout="{layout}"',
            "--data", f'model_revision="{COMMIT}"', "--data", f'model_manifest="{manifest}"']


def snapshot(layout: str) -> str:
    return f"{ROOT}/hub/models--deepseek-ai--DeepSeek-V4-Flash-0731/snapshots/{COMMIT}" if layout == "hf_cache" else ROOT


@pytest.fixture(scope="module")
def restore(sandbox):
    yield
    for node in sandbox:
        on_node(node, f"rm -rf {ROOT}")
    pyinfra(INVENTORY, "deploys/all.py")  # each node's own model, manifest and gate again


@pytest.fixture(params=["plain", "hf_cache"])
def one_group(request, sandbox, restore):
    for node in sandbox:
        assert on_node(node, f"rm -rf {ROOT}").returncode == 0
    return request.param, group_args(request.param)


def host_lines(proc, node: str) -> list[str]:
    return [line for line in proc.stderr.splitlines() if f"[{node}]" in line]


def verified_in_full(node: str, layout: str) -> bool:
    return on_node(node, f"python3 {VERIFIER} {MANIFEST} {snapshot(layout)} --full").returncode == 0


def nothing_left_serving(node: str) -> bool:
    return on_node(node, f"! systemctl is-active --quiet {SEED_UNIT} && test ! -e {SEED_DIR}").returncode == 0


def test_a_verified_peer_feeds_the_third_node(sandbox, one_group):
    layout, args = one_group
    on_node("sandbox-a", "journalctl --rotate --vacuum-time=1s -q")  # this test's daemon log only
    proc = pyinfra("-vvv", "--diff", INVENTORY, MODEL_ONLY, *args)
    # the run's secret (a 43-character token after the user name in the daemon's secrets file) is never shown
    assert not re.search(r"inference-nodes:[A-Za-z0-9_-]{40,}", proc.stdout + proc.stderr)
    files = model_files()
    for node in ("sandbox-a", "sandbox-b0"):
        assert any(f"pushed {len(files)} file(s)" in line for line in host_lines(proc, node)), proc.stderr[-3000:]
    b1 = host_lines(proc, "sandbox-b1")
    pulled = rf"pulled {len(files)} file\(s\), {sum(files.values())} bytes .* from peer sandbox-a \(127\.0\.0\.1:8731\)"
    assert any(re.search(pulled, line) for line in b1), proc.stderr[-3000:]
    assert not any("pushed" in line for line in b1), "the control node fed sandbox-b1"
    # each copy printed its progress as it went (bytes of the expected total, rate), ending with a line of its own
    total = "of [0-9.]+ [GM]B"
    for node in ("sandbox-a", "sandbox-b0"):
        assert any(re.search(rf"model sync from the control node: [0-9.]+ {total}, .* \(done\)", line)
                   for line in host_lines(proc, node)), proc.stderr[-3000:]
    assert any(re.search(rf"model sync from 127\.0\.0\.1:8731: [0-9.]+ {total}, .* \(done\)", line) for line in b1), \
        proc.stderr[-3000:]
    assert any("serving its verified model copy on 127.0.0.1:8731 to sandbox-b1" in line
               for line in host_lines(proc, "sandbox-a"))
    # the peer's own daemon log: it sent every shard
    sent = on_node("sandbox-a", "journalctl -t rsyncd -o cat --no-pager").stdout
    for shard in SHARDS:  # hf_cache: the blob behind each shard's link
        name = shard if layout == "plain" else "blobs/[0-9a-f]{64}"
        assert len(re.findall(rf"send .* model \(inference-nodes\) {name} {files[shard]}", sent)) >= 1, sent[-2000:]
    for node in sandbox:
        assert verified_in_full(node, layout), node
        assert nothing_left_serving(node), node
    assert changed_operations(pyinfra("--json", INVENTORY, MODEL_ONLY, *args)) == []


def test_a_peer_that_cannot_serve_is_replaced_by_the_control_node(sandbox, restore):
    for node in sandbox:
        assert on_node(node, f"rm -rf {ROOT}").returncode == 0
    args = group_args("plain")
    pyinfra(INVENTORY, MODEL_ONLY, *args)  # a and b0 hold verified copies (also when run alone)
    assert on_node("sandbox-b1", f"rm -rf {ROOT}").returncode == 0
    with socket.socket() as squatter:  # the nodes share this machine's network: take sandbox-a's peer port
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", 8731))
        squatter.listen()
        proc = pyinfra("-v", INVENTORY, MODEL_ONLY, *args)
    assert any("cannot serve peers on 127.0.0.1:8731" in line for line in host_lines(proc, "sandbox-a"))
    b1 = host_lines(proc, "sandbox-b1")
    assert any("peer sandbox-a cannot feed sandbox-b1 (its seed is not running): the control node feeds it instead"
               in line for line in b1), proc.stderr[-3000:]
    assert any(f"pushed {len(model_files())} file(s)" in line for line in b1)
    for node in sandbox:
        assert verified_in_full(node, "plain"), node
        assert nothing_left_serving(node), node
    assert changed_operations(pyinfra("--json", INVENTORY, MODEL_ONLY, *args)) == []
