"""Model snapshot on sandbox nodes: corrupt / truncated / missing shards are named, the start gate stays
shut until the next converge repairs exactly those files; too little disk is refused before anything is
fetched; a refused hub token is a clear error that never shows the token.

Runs after the earlier modules on the same session nodes (test_10 converged them, model included).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.node.conftest import INVENTORY, changed_operations, on_node, pyinfra

pytestmark = pytest.mark.model  # the node tier's subject (`make test-fast SUBJECT=model`)

PLAIN = "/srv/models/DeepSeek-V4-Flash-0731"  # gb10_dspark: plain layout
CACHE = "/mnt/data/hf/hub/models--deepseek-ai--DeepSeek-V4-Flash-0731"  # rtx_pro_6000_pair: HF cache layout
COMMIT_A = "7872f01b1d1fe23eabc4c98b48bffcef5a386062"  # what rtx_pro_6000_pair pins in the sandbox
SYNC = "Model snapshot | Sync and verify the model snapshot"
RESTART = "Inference service | Start or update heads and single nodes"
CLOSE = "Inference service | Close the door to new requests before a restart"  # every head
MARK = "Inference service | Mark the switch before it starts (heads and single nodes)"
WORKER_RESTART = "Inference service | Start or update workers (rank > 0) before heads"
SERVING = "Inference service | Wait until it serves (heads: /health and the serving gate)"


@pytest.fixture
def refusing_hub(tmp_path):
    """A second stand-in hub that wants another token, and a (wrong) token file for it: (endpoint, file, token)."""
    from tests.sandbox.standin_hub import serve

    token = "hf_sandboxSecretToken0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    srv = serve(token="the-right-one")
    yield f"http://127.0.0.1:{srv.server_address[1]}", str(token_file), token
    srv.shutdown()


def gate(node: str) -> subprocess.CompletedProcess:
    return on_node(node, "inference-nodes-model-gate")


def test_every_node_verified_against_the_same_manifest_per_cluster(sandbox):
    digests = {}
    for node in sandbox:
        proc = gate(node)
        assert proc.returncode == 0, proc.stderr
        digests[node] = proc.stdout.split("verified against ")[1].split()[0]
    assert digests["sandbox-b0"] == digests["sandbox-b1"] != digests["sandbox-a"]


def test_corrupt_truncated_and_missing_shards_are_named_and_repaired_alone(sandbox, refusing_hub, tmp_path):
    """... and a repair whose fetch the hub refuses (a wrong token) fails clearly and never prints the token."""
    node = "sandbox-a"
    snap = f"{CACHE}/snapshots/{COMMIT_A}"
    damage = (f"printf 'XXXX' | dd of=$(readlink -f {snap}/model-00001-of-00004.safetensors) bs=1 seek=4096 conv=notrunc 2>/dev/null; "
              f"truncate -s 100 $(readlink -f {snap}/model-00002-of-00004.safetensors); "
              f"rm $(readlink -f {snap}/model-00003-of-00004.safetensors)")
    assert on_node(node, damage).returncode == 0
    shut = gate(node)
    assert shut.returncode == 1 and "changed since it was verified" in shut.stderr
    for named in ("MODIFIED model-00001-of-00004.safetensors", "SIZE model-00002-of-00004.safetensors: 100 bytes",
                  "MISSING model-00003-of-00004.safetensors"):  # the gate names what changed
        assert named in shut.stderr, shut.stderr

    present = pyinfra(INVENTORY, "deploys/all.py", "--limit", node, "--data", 'model_sync_mode="present"', check=False)
    assert present.returncode == 1
    for named in ("HASH model-00001-of-00004.safetensors", "SIZE model-00002-of-00004.safetensors: 100 bytes",
                  "MISSING model-00003-of-00004.safetensors (dangling link)"):
        assert named in present.stderr
    assert gate(node).returncode == 1, "the gate stays shut while the snapshot is bad"

    # the repair's fetch from a hub that refuses the token: a clear error that never shows the token (folded in
    # here, issue 50: the damaged node needs a fetch already, and a separate drill paid a pair restart for it)
    endpoint, token_file, token = refusing_hub
    refused = pyinfra("-vv", INVENTORY, "deploys/all.py", "--limit", node, "--data", f'model_hub_endpoint="{endpoint}"',
                      "--data", f'model_hub_token_file="{token_file}"',
                      "--data", f'model_control_cache="{tmp_path / "cache"}"', check=False)
    assert refused.returncode == 1
    assert f"the hub refused deepseek-ai/DeepSeek-V4-Flash-0731@{COMMIT_A} (HTTP 401)" in refused.stderr
    assert token not in refused.stdout + refused.stderr
    assert gate(node).returncode == 1, "the gate stays shut while the snapshot is bad"

    repaired = pyinfra("-v", "--json", INVENTORY, "deploys/all.py", "--limit", node)
    # the service may have loaded the bad files before they were found: restarted from the repaired snapshot
    assert changed_operations(repaired) == [(SYNC, [node]), (MARK, [node]), (CLOSE, [node]), (RESTART, [node]),
                                          (SERVING, [node])]
    assert "pushed 3 file(s)" in repaired.stderr
    assert gate(node).returncode == 0


def test_too_little_disk_is_refused_before_fetching(sandbox):
    node = "sandbox-b1"
    # 1 MiB: less than the known-answer model (1.25 MB), so the verifier's own count of missing bytes refuses it
    assert on_node(node, f"rm -rf {PLAIN} && mkdir -p {PLAIN} && mount -t tmpfs -o size=1m tmpfs {PLAIN}").returncode == 0
    try:
        # the entry point: preflight refuses it from model_size_gb, before any operation
        proc = pyinfra(INVENTORY, "deploys/all.py", "--limit", node, check=False)
        assert proc.returncode == 1
        assert f"host {node}: too little disk for the model at {PLAIN}: 1048576 bytes free" in proc.stderr
        # the model component alone: from the exact bytes its verifier says are missing
        proc = pyinfra(INVENTORY, "deploys.model.snapshot.model_snapshot", "--limit", node, check=False)
        assert proc.returncode == 1
        assert f"{node}: too little disk for the model at {PLAIN}: " in proc.stderr
        assert "bytes needed, 1048576 bytes free" in proc.stderr
        assert on_node(node, f"ls -A {PLAIN}").stdout.strip() == "", "nothing was fetched"
    finally:
        on_node(node, f"umount {PLAIN}")
    changed = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node))
    # its model was emptied under the running worker: restarted from the synced snapshot
    assert changed == [(SYNC, [node]), (WORKER_RESTART, [node])]  # a worker runs once started: nothing to wait for
    assert gate(node).returncode == 0


def test_a_model_directory_the_toolkit_does_not_own_is_never_emptied(sandbox):
    """The sync deletes files the manifest does not list only in a directory carrying the owner marker (written by
    the first fetch): without it, a stray file fails the host, named, and stays; with it, the file goes."""
    node = "sandbox-b1"  # the plain layout: the model directory is model_root itself
    marker = f"{PLAIN}/.inference-nodes-owned"
    assert on_node(node, f"test -f {marker}").returncode == 0, "the fetch into the emptied directory marked it"
    assert on_node(node, f"rm {marker} && echo keep > {PLAIN}/notes.txt").returncode == 0
    full = ["--limit", node, "--data", "model_verify_full=true"]  # the stamp's fast path does not list a directory
    refused = pyinfra(INVENTORY, "deploys.model.snapshot.model_snapshot", *full, check=False)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert f"{PLAIN} holds 1 file(s) the model's manifest does not list (notes.txt)" in refused.stderr
    assert "Nothing was deleted" in refused.stderr
    assert on_node(node, f"cat {PLAIN}/notes.txt").stdout.strip() == "keep"
    assert on_node(node, f"touch {marker}").returncode == 0  # the admin says: this directory holds the model alone
    owned = changed_operations(pyinfra("--json", INVENTORY, "deploys.model.snapshot.model_snapshot", *full))
    assert owned == [(SYNC, [node])], owned
    assert on_node(node, f"test -e {PLAIN}/notes.txt").returncode == 1, "a stray file in an owned directory goes"
    assert gate(node).returncode == 0
    pyinfra(INVENTORY, "deploys/all.py", "--limit", node)  # the re-verified snapshot: the worker restarts onto it
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node)) == []


def test_hub_mode_downloads_on_the_node_and_resumes_after_an_interruption(sandbox):
    node = "sandbox-a"  # HF cache layout
    hub = ["--limit", node, "--data", 'model_sync_mode="hub"']
    # an interrupted earlier download: one shard missing, its orphaned partial blob left behind
    snap = f"{CACHE}/snapshots/7872f01b1d1fe23eabc4c98b48bffcef5a386062"
    assert on_node(node, f"b=$(readlink -f {snap}/model-00004-of-00004.safetensors); rm {snap}/model-00004-of-00004.safetensors "
                         f"$b; head -c 1000 /dev/zero > $b.1a2b3c4d.incomplete").returncode == 0
    first = pyinfra("--json", INVENTORY, "deploys/all.py", *hub)
    changed = [name for name, _ in changed_operations(first)]
    assert "Model snapshot | Install huggingface_hub 2.4.0 (wheels from the control node)" in changed
    assert SYNC in changed
    # the download printed its progress without -v (bytes written on the node of the bytes it lacked)
    assert re.search(rf"\[{node}\] +model sync: [0-9.]+ of [0-9.]+ [GM]B, [0-9.]+ MB/s, [0-9]+ s.* \(done\)",
                     first.stderr), first.stderr[-3000:]
    assert gate(node).returncode == 0
    assert on_node(node, f"find {CACHE} -name '*.incomplete' | wc -l").stdout.strip() == "0"
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", *hub)) == []


def test_hub_mode_refused_token_on_the_node(sandbox, refusing_hub):
    endpoint, token_file, token = refusing_hub
    node = "sandbox-a"
    assert on_node(node, f"rm -f {CACHE}/snapshots/*/config.json").returncode == 0
    proc = pyinfra("-vv", INVENTORY, "deploys/all.py", "--limit", node, "--data", 'model_sync_mode="hub"',
                   "--data", f'model_hub_endpoint="{endpoint}"', "--data", f'model_hub_token_file="{token_file}"',
                   check=False)
    assert proc.returncode == 1
    assert "the hub refused deepseek-ai/DeepSeek-V4-Flash-0731@7872f01b1d1fe23eabc4c98b48bffcef5a386062 (HTTP 401)" in proc.stderr
    assert token not in proc.stdout + proc.stderr
    assert on_node(node, "stat -c '%a' /etc/inference-nodes/secrets/hf-token").stdout.strip() == "600"
    pyinfra(INVENTORY, "deploys/all.py", "--limit", node)  # push mode repairs it
    assert gate(node).returncode == 0
