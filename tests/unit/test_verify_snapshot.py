"""The node-side verifier on a real huggingface_hub download from the stand-in hub: corrupt, truncated,
missing, extra and unindexed files are named; the stamp fast path; the start gate names what changed; a
same-size flip with size, mtime and inode kept passes the stamp and is found by a full re-hash, whose
verdict is recorded; both hashing paths (in place, streamed) agree, the streamed one at every tail
and when a read or the hashing fails; the rate cap holds; a nested repo's
relative links into ../../../blobs/ pass, and a file the manifest does not list closes the gate.
(Hostile manifests and links: tests/unit/test_manifest_paths.py.)"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys

import pytest

import hashlib
import threading
import time

from deploys.model.snapshot import VERIFIER_FILES
from files import helper_path
from files.model_snapshot import snapshot_hashing
from files.model_snapshot.snapshot_hashing import RateLimit, hash_file
from files.model_snapshot.snapshot_manifest import manifest_digest
from files.model_snapshot.verify_snapshot import gate, verify

VERIFIER = "files/model_snapshot/verify_snapshot.py"


@pytest.fixture(scope="module")
def hub_snapshot(tmp_path_factory):
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    from huggingface_hub import snapshot_download

    from deploys.model.manifest import generate
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
    assert not ok and "changed since it was verified: MODIFIED model-00002-of-00003.safetensors" in message
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


def _flip_keeping_stat(path: str, offset: int) -> None:
    """Bit rot: one byte changed in place, size, mtime and inode as they were."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(path).st_ino, os.stat(path).st_size, os.stat(path).st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


def test_same_size_flip_passes_the_stamp_and_a_full_rehash_finds_and_records_it(snap, tmp_path):
    record = tmp_path / "record.json"
    cli = [sys.executable, VERIFIER, snap["manifest_path"], snap["dir"], "--stamp", snap["stamp"], "--record",
           str(record), "--quiet"]
    assert subprocess.run([*cli, "--full"], capture_output=True).returncode == 0
    assert json.loads(record.read_text())["verdict"] == "ok"
    stamp_before = open(snap["stamp"], "rb").read()
    blob = _blob(snap, "model-00001-of-00003.safetensors")
    _flip_keeping_stat(blob, os.path.getsize(blob) // 2)
    assert gate(snap["manifest_path"], snap["dir"], snap["stamp"])[0], "the stamp cannot see a same-size flip"
    assert subprocess.run(cli, capture_output=True).returncode == 0  # stamp mode: no re-hash, no new record
    assert json.loads(record.read_text())["verdict"] == "ok"
    found = subprocess.run([*cli, "--full"], capture_output=True, text=True)
    assert found.returncode == 1 and "HASH model-00001-of-00003.safetensors" in found.stdout
    verdict = json.loads(record.read_text())
    assert verdict["verdict"] == "bad" and verdict["problems"][0].startswith("HASH model-00001-of-00003.safetensors")
    assert time.time() - verdict["at"] < 60
    assert not os.path.exists(snap["stamp"])
    ok, message = gate(snap["manifest_path"], snap["dir"], snap["stamp"])
    assert not ok and "not verified" in message
    # repaired with every stat the bad file had (size, mtime, inode: what rsync and a reused inode number give):
    # the stamp differs from the one a service may have started with, so that service restarts; only the count
    # of bad verdicts differs, and the good snapshot re-verified again writes the same stamp
    _flip_keeping_stat(blob, os.path.getsize(blob) // 2)
    assert subprocess.run([*cli, "--full"], capture_output=True).returncode == 0
    repaired = open(snap["stamp"], "rb").read()
    assert repaired != stamp_before
    assert {**json.loads(repaired), "bad_verdicts": 0} == json.loads(stamp_before)
    assert subprocess.run([*cli, "--full"], capture_output=True).returncode == 0
    assert open(snap["stamp"], "rb").read() == repaired, "an unchanged snapshot re-verified writes the same stamp"
    # a file missing (a fresh directory, a deleted file) is no content anyone loaded: the count stays
    moved = blob + ".away"
    os.rename(blob, moved)
    assert subprocess.run([*cli, "--full"], capture_output=True).returncode == 1
    os.rename(moved, blob)
    assert subprocess.run([*cli, "--full"], capture_output=True).returncode == 0
    assert open(snap["stamp"], "rb").read() == repaired


def test_the_installed_files_alone_verify_and_find_a_flipped_byte(snap, tmp_path):
    """What the deploy installs in /usr/local/lib/inference-nodes/, copied alone into an empty folder and run as
    the node runs it: no site-packages (-S), so no `files` package to fall back on, and no PYTHON* variables."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in VERIFIER_FILES:
        shutil.copy(helper_path(f"model_snapshot/{name}"), lib)
    cli = [sys.executable, "-S", "-E", str(lib / "verify_snapshot.py"), snap["manifest_path"], snap["dir"],
           "--stamp", snap["stamp"]]
    ok = subprocess.run([*cli, "--full", "--json", "--quiet"], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True, ok.stderr
    assert json.loads(ok.stdout)["hashed"] == len(snap["manifest"]["files"])
    gated = subprocess.run([*cli, "--gate"], capture_output=True, text=True, cwd=tmp_path)
    assert gated.returncode == 0 and "verified against sha256:" in gated.stdout, gated.stderr
    blob = _blob(snap, "model-00003-of-00003.safetensors")
    _flip_keeping_stat(blob, 123)
    bad = subprocess.run([*cli, "--full"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 1 and bad.stdout.startswith("HASH model-00003-of-00003.safetensors: "), bad.stderr
    assert bad.stdout.splitlines()[-1].startswith("BAD")


def test_check_only_writes_and_deletes_nothing(snap, tmp_path):
    assert run(snap)["ok"]
    stamp = open(snap["stamp"], "rb").read()
    blob = _blob(snap, "model-00002-of-00003.safetensors")
    _flip_keeping_stat(blob, 7)
    result = verify(snap["manifest_path"], snap["dir"], snap["stamp"], full=True, write=False)
    assert not result["ok"] and open(snap["stamp"], "rb").read() == stamp


@pytest.mark.parametrize("cached, populate", [(True, True), (False, True), (False, False)],
                         ids=["in-place-mmap", "populated-mmap", "streamed-read"])
def test_every_hashing_path_gives_the_file_digest(tmp_path, monkeypatch, cached, populate):
    if populate and not cached and not snapshot_hashing.POPULATE:
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux < 5.14): cold files are streamed")
    data = os.urandom(3 * snapshot_hashing.MAP_WINDOW + 12345)
    path = tmp_path / "shard"
    path.write_bytes(data)
    monkeypatch.setattr(snapshot_hashing, "is_cached", lambda fd, size: cached)
    monkeypatch.setattr(snapshot_hashing, "POPULATE", populate)
    assert hash_file(str(path), "sha256", len(data)) == hashlib.sha256(data).hexdigest()
    assert hash_file(str(path), "git_sha1", len(data)) == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert hash_file(str(empty), "sha256", 0) == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * 4096, 10 * 4096 + 7])
def test_streamed_read_hashes_every_tail_and_reuses_its_buffers(tmp_path, monkeypatch, size):
    """A cold file goes through the reader thread's ring of buffers: more chunks than buffers, and a last chunk
    that is short, full or a single byte, all give the file's digest."""
    monkeypatch.setattr(snapshot_hashing, "is_cached", lambda fd, size: False)
    monkeypatch.setattr(snapshot_hashing, "POPULATE", False)  # the streamed path (kernels before 5.14)
    monkeypatch.setattr(snapshot_hashing, "READ_CHUNK", 4096)
    monkeypatch.setattr(snapshot_hashing, "READ_BUFFERS", 2)
    data = os.urandom(size)
    path = tmp_path / "shard"
    path.write_bytes(data)
    assert hash_file(str(path), "sha256", size) == hashlib.sha256(data).hexdigest()
    assert hash_file(str(path), "git_sha1", size) == hashlib.sha1(b"blob %d\0" % size + data).hexdigest()


def test_a_read_error_in_the_reader_thread_fails_the_file_and_stops_the_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot_hashing, "is_cached", lambda fd, size: False)
    monkeypatch.setattr(snapshot_hashing, "POPULATE", False)  # the streamed path (kernels before 5.14)
    monkeypatch.setattr(snapshot_hashing, "READ_CHUNK", 4096)
    (tmp_path / "snap").mkdir()
    path = tmp_path / "snap" / "shard"
    path.write_bytes(os.urandom(20 * 4096))
    real_readv, calls = os.readv, []

    def failing_readv(fd, buffers):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        return real_readv(fd, buffers)

    monkeypatch.setattr(os, "readv", failing_readv)
    with pytest.raises(OSError, match="Input/output error"):
        hash_file(str(path), "sha256", 20 * 4096)
    assert len(calls) == 3  # nothing read after the error
    assert not [t for t in threading.enumerate() if t.name == "verify-read"]
    # through verify(): the file is named as unreadable, not passed
    manifest = {"repo": "o/m", "commit": "0" * 40,
                "files": [{"path": "shard", "size": 20 * 4096, "sha256": "0" * 64}]}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    calls.clear()
    result = verify(str(tmp_path / "m.json"), str(tmp_path / "snap"), str(tmp_path / "stamp"), full=True)
    assert not result["ok"] and result["problems"] == [
        "HASH shard: unreadable (Input/output error), manifest says " + "0" * 64]


@pytest.mark.parametrize("populate, thread", [(False, "verify-read"), (True, "verify-populate")],
                         ids=["streamed-read", "populated-mmap"])
def test_a_failing_hash_step_stops_the_read_ahead_thread(tmp_path, monkeypatch, populate, thread):
    """The rate cap (or anything in the hashing thread) raising ends the read-ahead too: no thread is left reading."""
    if populate and not snapshot_hashing.POPULATE:
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux < 5.14)")
    monkeypatch.setattr(snapshot_hashing, "is_cached", lambda fd, size: False)
    monkeypatch.setattr(snapshot_hashing, "POPULATE", populate)
    monkeypatch.setattr(snapshot_hashing, "READ_CHUNK", 4096)
    monkeypatch.setattr(snapshot_hashing, "MAP_WINDOW", 4 * mmap.PAGESIZE)
    path = tmp_path / "shard"
    path.write_bytes(os.urandom(50 * 4096))

    class Boom(RateLimit):
        def take(self, n):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hash_file(str(path), "sha256", 50 * 4096, Boom(1))
    assert not [t for t in threading.enumerate() if t.name == thread]


@pytest.fixture
def populated(monkeypatch):
    """Cold files through MADV_POPULATE_READ, in small windows."""
    if not snapshot_hashing.POPULATE:
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux < 5.14)")
    monkeypatch.setattr(snapshot_hashing, "is_cached", lambda fd, size: False)
    monkeypatch.setattr(snapshot_hashing, "MAP_WINDOW", 4 * mmap.PAGESIZE)


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 4 * 4096, 4 * 4096 + 1, 41 * 4096 + 7])
def test_populated_mmap_hashes_every_tail(tmp_path, populated, size):
    """More windows than are read ahead, and a last window that is short, full or a single byte."""
    data = os.urandom(size)
    path = tmp_path / "shard"
    path.write_bytes(data)
    assert hash_file(str(path), "sha256", size) == hashlib.sha256(data).hexdigest()
    assert hash_file(str(path), "git_sha1", size) == hashlib.sha1(b"blob %d\0" % size + data).hexdigest()


class _FailingThirdPopulate(mmap.mmap):
    """A mapping whose third MADV_POPULATE_READ fails as the kernel does when it cannot read the pages."""

    calls = 0

    def madvise(self, option, *args):
        if option == snapshot_hashing.MADV_POPULATE_READ:
            type(self).calls += 1
            if type(self).calls == 3:
                raise OSError(14, "Bad address")
        return super().madvise(option, *args)


def test_a_window_the_kernel_cannot_read_fails_the_file_without_touching_it(tmp_path, monkeypatch, populated):
    (tmp_path / "snap").mkdir()
    path = tmp_path / "snap" / "shard"
    path.write_bytes(os.urandom(20 * 4 * 4096))
    monkeypatch.setattr(snapshot_hashing.mmap, "mmap", _FailingThirdPopulate)
    with pytest.raises(OSError, match="Input/output error"):
        hash_file(str(path), "sha256", 20 * 4 * 4096)
    assert _FailingThirdPopulate.calls == 3  # nothing read after the error
    assert not [t for t in threading.enumerate() if t.name == "verify-populate"]
    manifest = {"repo": "o/m", "commit": "0" * 40,
                "files": [{"path": "shard", "size": 20 * 4 * 4096, "sha256": "0" * 64}]}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    _FailingThirdPopulate.calls = 0
    result = verify(str(tmp_path / "m.json"), str(tmp_path / "snap"), str(tmp_path / "stamp"), full=True)
    assert not result["ok"] and result["problems"] == [
        "HASH shard: unreadable (Input/output error), manifest says " + "0" * 64]


def test_rate_cap_spreads_the_reads(tmp_path):
    path = tmp_path / "shard"
    path.write_bytes(os.urandom(3 << 20))
    t0 = time.monotonic()
    hash_file(str(path), "sha256", 3 << 20, RateLimit(10e6))
    assert time.monotonic() - t0 >= (3 << 20) / 10e6 * 0.9


def test_nested_hf_cache_download_passes_and_a_stray_python_file_closes_the_gate(tmp_path):
    """A real huggingface_hub download of a repo with a subdirectory: its links are relative (into
    ../../../blobs/) and pass; a modeling_*.py dropped next to the weights afterwards is named by the gate."""
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    from huggingface_hub import snapshot_download

    from deploys.model.manifest import generate
    from files.model_snapshot.snapshot_manifest import remove_paths
    from tests.sandbox.standin_hub import COMMITS, REPO, serve

    repo = tmp_path / "repo"
    (repo / "original").mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "deepseek_v4"}')
    (repo / "original" / "params.json").write_text('{"dim": 7}')
    (repo / "model-00001-of-00001.safetensors").write_bytes(os.urandom(4096))
    srv = serve(repo_dirs={COMMITS[0]: str(repo)})
    try:
        endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
        (tmp_path / "m.json").write_text(json.dumps(generate(REPO, COMMITS[0], endpoint)))
        path = snapshot_download(REPO, revision=COMMITS[0], cache_dir=str(tmp_path / "hub"), endpoint=endpoint)
    finally:
        srv.shutdown()
    assert os.readlink(os.path.join(path, "original", "params.json")).startswith("../../../blobs/")
    manifest, stamp = str(tmp_path / "m.json"), str(tmp_path / "stamp.json")
    result = verify(manifest, path, stamp)
    assert result["ok"] and result["hashed"] == 3, result["problems"]
    assert gate(manifest, path, stamp)[0]
    with open(os.path.join(path, "original", "modeling_evil.py"), "w") as f:
        f.write("import os\n")
    ok, message = gate(manifest, path, stamp)
    assert not ok and "EXTRA original/modeling_evil.py (not in the manifest)" in message
    result = verify(manifest, path, stamp)
    assert not result["ok"] and result["extra"] == ["original/modeling_evil.py"]
    assert remove_paths(path, os.path.dirname(os.path.dirname(path)), result["extra"]) == []
    assert verify(manifest, path, stamp)["ok"] and gate(manifest, path, stamp)[0]


def test_a_plan_writes_and_hashes_nothing(snap, tmp_path):
    """`--plan` (a converge's plan): where the stamp vouches, ok; where it cannot (none yet, a flipped file's new
    mtime, another manifest, a full re-hash asked for), `needs_hash` with nothing hashed, and the stamp and record
    exactly as they were (a plan must not unstamp the snapshot that is serving)."""
    record = tmp_path / "record.json"
    cli = [sys.executable, VERIFIER, snap["manifest_path"], snap["dir"], "--stamp", snap["stamp"], "--json", "--quiet",
           "--record", str(record)]

    def plan(*extra):
        proc = subprocess.run([*cli, "--plan", *extra], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout.splitlines()[-1])

    first = plan()
    assert not first["ok"] and first["needs_hash"] and first["hashed"] == 0 and "no verify stamp" in first["problems"][-1]
    assert not os.path.exists(snap["stamp"]) and not record.exists()
    assert subprocess.run([*cli, "--full"], capture_output=True, timeout=120).returncode == 0  # stamped, recorded
    stamp, recorded = open(snap["stamp"]).read(), record.read_text()
    assert plan()["ok"] and plan()["mode"] == "stamp"
    due = plan("--full")
    assert not due["ok"] and due["needs_hash"] and "a full re-hash is due" in due["problems"][-1]
    shard = next(e["path"] for e in snap["manifest"]["files"] if e["path"].endswith(".safetensors"))
    path = os.path.realpath(os.path.join(snap["dir"], shard))
    with open(path, "r+b") as f:  # a changed file (same size, new mtime)
        f.seek(10)
        f.write(b"\xff")
    changed = plan()
    assert not changed["ok"] and changed["needs_hash"] and changed["hashed"] == 0, changed
    assert shard in changed["problems"][-1]
    assert open(snap["stamp"]).read() == stamp and record.read_text() == recorded, "the plan wrote nothing"
    written = subprocess.run(cli, capture_output=True, text=True, timeout=120)  # what the run then executes
    assert written.returncode == 1 and not os.path.exists(snap["stamp"]) and f"HASH {shard}" in written.stdout


def test_a_sync_check_of_a_new_commit_records_no_verdict_about_the_live_release(snap, tmp_path):
    """A converge's check before an upgrade's sync finds the new commit's files missing: that says nothing of the
    release that serves, so the deep-verify record (what DeepVerifyBad reads) keeps the live release's verdict. A
    bad verdict about the same manifest (a repair's first check) is recorded; so is a good one about any."""
    record = tmp_path / "record.json"
    base = [sys.executable, VERIFIER, "--stamp", snap["stamp"], "--record", str(record), "--quiet", "--full"]
    assert subprocess.run([*base, snap["manifest_path"], snap["dir"]], capture_output=True).returncode == 0
    live = json.loads(record.read_text())
    assert live["verdict"] == "ok"
    upgrade = dict(snap["manifest"], commit="9e165c30e2704aec5d9d593cce3eebd58bbef1cb")
    (tmp_path / "new.json").write_text(json.dumps(upgrade))
    empty = tmp_path / "new-commit"
    empty.mkdir()
    check = [*base, "--sync-check", str(tmp_path / "new.json"), str(empty)]
    assert subprocess.run(check, capture_output=True).returncode == 1
    assert json.loads(record.read_text()) == live, "the new commit's missing files were recorded as the verdict"
    # without --sync-check (the deep verify's own run) any verdict is recorded
    assert subprocess.run([c for c in check if c != "--sync-check"], capture_output=True).returncode == 1
    assert json.loads(record.read_text())["verdict"] == "bad"
    # the live manifest again: a good verdict replaces the bad one; then a bad file of the same manifest is recorded
    assert subprocess.run([*base, "--sync-check", snap["manifest_path"], snap["dir"]], capture_output=True).returncode == 0
    assert json.loads(record.read_text())["verdict"] == "ok"
    blob = _blob(snap, "model-00001-of-00003.safetensors")
    _flip_keeping_stat(blob, os.path.getsize(blob) // 2)
    assert subprocess.run([*base, "--sync-check", snap["manifest_path"], snap["dir"]], capture_output=True).returncode == 1
    assert json.loads(record.read_text())["verdict"] == "bad"


def test_the_deep_verify_skips_while_a_converge_upgrades_and_verifies_once_the_mark_stops_counting(snap, tmp_path):
    """Issue 52 slice 1: between the install of another commit's manifest and the switch, the deep verify (the
    timer's own command line) would find the live files bad against it and stop the service. While the converge's
    upgrade mark counts it exits 0 and writes nothing; an expired or unreadable mark mutes nothing."""
    from deploys.inventory import inventory_configs, load_inventory
    from deploys.model.integrity import verify_argv
    from deploys.model.snapshot import MANIFEST, RECORD, STAMP, UPGRADE_MARKER
    from deploys.ops import until_marker_command
    from tests.unit.profiles import lab_filled_in

    cfg = inventory_configs(load_inventory(lab_filled_in(str(tmp_path))))["rtx-pro-a.lab.example"]
    record, marker = tmp_path / "record.json", tmp_path / "model-upgrade.json"
    places = {MANIFEST: str(tmp_path / "new.json"), STAMP: snap["stamp"], RECORD: str(record),
              UPGRADE_MARKER: str(marker), cfg.snapshot_dir: snap["dir"], "/usr/bin/python3": sys.executable,
              cfg.model_dir: os.path.dirname(os.path.dirname(snap["dir"])),  # (hf_cache: the manifest's commit in it)
              "/usr/local/lib/inference-nodes/verify_snapshot.py": VERIFIER}
    argv = [places.get(a, a) for a in verify_argv(cfg) if a != "--stop-service" and not a.endswith(".service")]
    assert "--skip-while" in argv and str(marker) in argv
    live = [sys.executable, VERIFIER, snap["manifest_path"], snap["dir"], "--stamp", snap["stamp"], "--full",
            "--record", str(record), "--quiet"]
    assert subprocess.run(live, capture_output=True).returncode == 0
    stamp, recorded = open(snap["stamp"], "rb").read(), record.read_bytes()
    # the converge installed the new commit's manifest (its files are not the live ones) and marked the node
    (tmp_path / "new.json").write_text(json.dumps(dict(snap["manifest"], commit="9e165c30e2704aec5d9d593cce3eebd58bbef1cb",
                                                       files=snap["manifest"]["files"][1:])))
    write = until_marker_command(UPGRADE_MARKER, 3600).replace(UPGRADE_MARKER, str(marker)).replace(
        "mkdir -p /var/lib/inference-nodes", f"mkdir -p {tmp_path}")
    subprocess.run(["sh", "-c", write], check=True)
    assert abs(json.loads(marker.read_text())["until"] - (time.time() + 3600)) < 5
    skipped = subprocess.run(argv, capture_output=True, text=True)
    assert skipped.returncode == 0, skipped.stderr
    assert "verify: skipped: a converge is upgrading this node's model" in skipped.stderr
    assert open(snap["stamp"], "rb").read() == stamp and record.read_bytes() == recorded, "the skipped run wrote"
    # a mark that cannot be read, or whose bound passed (a killed converge's), mutes nothing: today's verdict
    for mark in ("not json", '{"until": "soon"}', '{"until": true}', json.dumps({"until": time.time() - 1})):
        marker.write_text(mark)
        found = subprocess.run(argv, capture_output=True, text=True)
        assert found.returncode == 1 and "skipped" not in found.stderr, (mark, found.stderr)
        assert json.loads(record.read_text())["verdict"] == "bad" and not os.path.exists(snap["stamp"])
        record.write_bytes(recorded)
        open(snap["stamp"], "wb").write(stamp)
