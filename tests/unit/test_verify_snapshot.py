"""The node-side verifier on a real huggingface_hub download from the stand-in hub: corrupt, truncated,
missing, extra and unindexed files are named; the stamp fast path; the start gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from files.model_snapshot.verify_snapshot import gate, manifest_digest, verify

VERIFIER = "files/model_snapshot/verify_snapshot.py"


@pytest.fixture(scope="module")
def hub_snapshot(tmp_path_factory):
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    from huggingface_hub import snapshot_download

    from deploys.model_manifest import generate
    from tests.sandbox.standin_hub import COMMITS, REPO, serve

    srv = serve(shards=3, shard_bytes=256 * 1024 + 3)
    endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
    base = tmp_path_factory.mktemp("hub")
    manifest = generate(REPO, COMMITS[0], endpoint)
    (base / "manifest.json").write_text(json.dumps(manifest))
    yield {"manifest": manifest, "manifest_path": str(base / "manifest.json"), "endpoint": endpoint,
           "base": base, "download": lambda d: snapshot_download(REPO, revision=COMMITS[0], cache_dir=str(d),
                                                                  endpoint=endpoint)}
    srv.shutdown()


@pytest.fixture
def snap(hub_snapshot, tmp_path):
    path = hub_snapshot["download"](tmp_path / "hub")
    return {**hub_snapshot, "dir": path, "stamp": str(tmp_path / "stamp.json")}


def run(snap, *extra):
    return verify(snap["manifest_path"], snap["dir"], snap["stamp"], *extra)


def test_manifest_lists_lfs_sha256_and_git_sha1(hub_snapshot):
    files = {e["path"]: e for e in hub_snapshot["manifest"]["files"]}
    assert len(files["model-00001-of-00003.safetensors"]["sha256"]) == 64
    assert len(files["config.json"]["git_sha1"]) == 40


def test_good_snapshot_verifies_then_reverifies_from_the_stamp(snap):
    first = run(snap)
    assert first["ok"] and first["mode"] == "full" and first["hashed"] == len(snap["manifest"]["files"]) == 6
    second = run(snap)
    assert second["ok"] and second["mode"] == "stamp" and second["hashed"] == 0
    assert run(snap, True)["mode"] == "full"  # --full re-hashes on demand
    assert gate(snap["manifest_path"], snap["dir"], snap["stamp"])[0]


def _blob(snap, name):
    return os.path.realpath(os.path.join(snap["dir"], name))


def test_corrupt_shard_is_named_and_the_gate_closes(snap):
    assert run(snap)["ok"]
    blob = _blob(snap, "model-00002-of-00003.safetensors")
    with open(blob, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff\xfe\xfd\xfc")
    ok, message = gate(snap["manifest_path"], snap["dir"], snap["stamp"])
    assert not ok and "changed since it was verified" in message
    result = run(snap)
    assert not result["ok"]
    assert [p.split(":")[0] for p in result["problems"]] == ["HASH model-00002-of-00003.safetensors"]
    assert not os.path.exists(snap["stamp"]), "a bad snapshot keeps no stamp"
    assert not gate(snap["manifest_path"], snap["dir"], snap["stamp"])[0]


def test_truncated_missing_extra_and_unindexed_files_are_named(snap):
    os.truncate(_blob(snap, "model-00001-of-00003.safetensors"), 10)
    os.unlink(os.path.join(snap["dir"], "model-00003-of-00003.safetensors"))
    with open(os.path.join(snap["dir"], "stray.bin"), "w") as f:
        f.write("x")
    problems = run(snap)["problems"]
    assert "MISSING model-00003-of-00003.safetensors" in problems
    assert "EXTRA stray.bin" in problems
    assert any(p.startswith("SIZE model-00001-of-00003.safetensors: 10 bytes") for p in problems)


def test_index_that_maps_to_a_shard_outside_the_manifest(hub_snapshot, tmp_path):
    plain = tmp_path / "plain"
    src = hub_snapshot["download"](tmp_path / "hub")
    subprocess.run(["cp", "-rL", src, str(plain)], check=True)
    index = json.loads((plain / "model.safetensors.index.json").read_text())
    index["weight_map"]["extra.weight"] = "model-00009-of-00009.safetensors"
    data = json.dumps(index).encode()
    (plain / "model.safetensors.index.json").write_bytes(data)
    manifest = json.loads(open(hub_snapshot["manifest_path"]).read())
    for e in manifest["files"]:  # keep the index's own hash consistent so only the map rule fires
        if e["path"] == "model.safetensors.index.json":
            import hashlib
            e["size"], e["git_sha1"] = len(data), hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    mpath = tmp_path / "m.json"
    mpath.write_text(json.dumps(manifest))
    result = verify(str(mpath), str(plain), str(tmp_path / "s.json"))
    assert result["problems"] == [
        "INDEX model.safetensors.index.json maps weights to model-00009-of-00009.safetensors, not in the manifest"]


def test_gate_refuses_a_stamp_for_another_manifest(snap, tmp_path):
    assert run(snap)["ok"]
    other = dict(snap["manifest"], commit="9e165c30e2704aec5d9d593cce3eebd58bbef1cb")
    (tmp_path / "other.json").write_text(json.dumps(other))
    ok, message = gate(str(tmp_path / "other.json"), snap["dir"], snap["stamp"])
    assert not ok and manifest_digest(other) in message


def test_cli_exit_codes_and_output(snap):
    ok = subprocess.run([sys.executable, VERIFIER, snap["manifest_path"], snap["dir"], "--stamp", snap["stamp"],
                         "--json", "--quiet"], capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    os.truncate(_blob(snap, "config.json"), 1)
    bad = subprocess.run([sys.executable, VERIFIER, snap["manifest_path"], snap["dir"], "--stamp", snap["stamp"]],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "SIZE config.json: 1 bytes" in bad.stdout and bad.stdout.splitlines()[-1].startswith("BAD")
    gated = subprocess.run([sys.executable, VERIFIER, snap["manifest_path"], snap["dir"], "--stamp", snap["stamp"],
                            "--gate"], capture_output=True, text=True)
    assert gated.returncode == 1 and "not verified" in gated.stderr
    usage = subprocess.run([sys.executable, VERIFIER, "/nonexistent.json", snap["dir"]], capture_output=True, text=True)
    assert usage.returncode == 2
