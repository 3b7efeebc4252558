"""files/model_snapshot/swarm.py: a torrent is refused unless its files are exactly the manifest's; on loopback
addresses of its own, a swarm of the real engine (Debian's python3-libtorrent, run by the system interpreter as on
a node; `make test` installs it) takes a seed's snapshot to two peers, listening on the given addresses only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time

import pytest

from files.model_snapshot.swarm import endpoint, torrent_problems

SWARM = "files/model_snapshot/swarm.py"
VERIFIER = "files/model_snapshot/verify_snapshot.py"
SYSTEM_PYTHON = "/usr/bin/python3"
FILES = {"config.json": b'{"a": 1}\n', "model-00001-of-00002.safetensors": os.urandom(3 * 2**20 + 5),
         "model-00002-of-00002.safetensors": os.urandom(2**20 + 7), "original/params.json": b"{}"}


def manifest_of(files: dict[str, bytes]) -> dict:
    def digest(rel, data):
        if rel.endswith(".safetensors"):
            return {"sha256": hashlib.sha256(data).hexdigest()}
        return {"git_sha1": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
    return {"repo": "deepseek-ai/DeepSeek-V4-Flash-0731", "commit": "7872f01b1d1fe23eabc4c98b48bffcef5a386062",
            "files": [{"path": rel, "size": len(data), **digest(rel, data)} for rel, data in sorted(files.items())]}


def test_a_torrent_must_hold_exactly_the_manifests_files():
    manifest = manifest_of(FILES)
    files = [(rel, len(data)) for rel, data in FILES.items()]
    assert torrent_problems(files, manifest) == []
    assert torrent_problems(files + [("../../etc/passwd", 10)], manifest) == ["../../etc/passwd: not in the manifest"]
    assert torrent_problems([(p, s + (p == "config.json")) for p, s in files], manifest) == \
        [f"config.json: {len(FILES['config.json']) + 1} bytes, the manifest says {len(FILES['config.json'])}"]
    assert torrent_problems(files[1:], manifest) == ["config.json: missing from the torrent"]


def test_an_endpoint_is_address_and_port():
    assert endpoint("10.44.1.1:6881") == ("10.44.1.1", 6881)
    assert endpoint("[fd00::1]:6881") == ("fd00::1", 6881)
    for bad in ("10.44.1.1", "10.44.1.1:0", "10.44.1.1:70000", ":6881", "host:port"):
        with pytest.raises(SystemExit):
            endpoint(bad)


@pytest.fixture
def engine():
    if subprocess.run([SYSTEM_PYTHON, "-c", "import libtorrent"], capture_output=True).returncode != 0:
        pytest.fail("python3-libtorrent is not installed for /usr/bin/python3: `make sandbox-deps` installs it")


def snapshot(root, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return str(root)


def swarm(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([SYSTEM_PYTHON, SWARM, *args], capture_output=True, text=True, timeout=120, **kw)


def test_make_refuses_a_folder_that_is_not_the_manifests_snapshot(engine, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(manifest_of(FILES)))
    short = {**FILES, "config.json": b"{}"}
    del short["original/params.json"]
    seed = snapshot(tmp_path / "seed" / "snap", short)
    made = swarm("make", seed, str(manifest), str(tmp_path / "t.torrent"))
    assert made.returncode == 1 and "config.json, original/params.json missing or of another size" in made.stderr, \
        made.stderr
    assert not os.path.exists(tmp_path / "t.torrent")


def test_the_same_commit_gives_the_same_torrent_from_any_copy(engine, tmp_path):
    """The manifest's files under one folder `snapshot`: a stray file, the directory's name and its links into a
    cache's blobs change nothing (the control node's copy is a hub cache snapshot, a node's a plain directory)."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(manifest_of(FILES)))
    plain = snapshot(tmp_path / "plain" / "model", {**FILES, "stray.bin": b"x"})
    blobs = snapshot(tmp_path / "cache" / "blobs", {f"b{i}": d for i, d in enumerate(FILES.values())})
    linked = tmp_path / "cache" / "snapshots" / "7872f01b"
    for i, rel in enumerate(FILES):
        (linked / rel).parent.mkdir(parents=True, exist_ok=True)
        (linked / rel).symlink_to(os.path.join(blobs, f"b{i}"))
    made = [swarm("make", d, str(manifest), str(tmp_path / f"{n}.torrent"), "--piece-mib", "1")
            for n, d in (("a", plain), ("b", str(linked)))]
    assert all(m.returncode == 0 for m in made), [m.stderr for m in made]
    assert (tmp_path / "a.torrent").read_bytes() == (tmp_path / "b.torrent").read_bytes()


def test_a_seed_and_two_peers_on_loopback_end_with_the_verified_snapshot_and_listen_where_told(engine, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(manifest_of(FILES)))
    seed = snapshot(tmp_path / "seed" / "snap", FILES)
    torrent = str(tmp_path / "snap.torrent")
    made = swarm("make", seed, str(manifest), torrent, "--piece-mib", "1")
    assert made.returncode == 0, made.stderr
    port = 20000 + os.getpid() % 20000
    # the peers keep the files in directories of other names (a live one, a staged release's tree)
    nodes = {"seed": ("127.0.0.61", seed), "b": ("127.0.0.62", str(tmp_path / "b" / "model")),
             "c": ("127.0.0.63", str(tmp_path / "c" / ".inference-nodes-releases" / "7872f01b"))}
    procs = {}
    try:
        for name, (address, directory) in nodes.items():
            peers = [a for n, (a, _) in nodes.items() if n != name]
            procs[name] = subprocess.Popen(
                [SYSTEM_PYTHON, SWARM, "serve", torrent, directory, str(manifest), "--listen", f"{address}:{port}",
                 *[x for a in peers for x in ("--peer", f"{a}:{port}")], "--status", str(tmp_path / f"{name}.json"),
                 *(["--seed"] if name == "seed" else [])], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = {}
            for name in nodes:
                try:
                    with open(tmp_path / f"{name}.json") as f:
                        states[name] = json.load(f)["seeding"]
                except (OSError, ValueError):
                    states[name] = False
            if all(states.values()):
                break
            assert all(p.poll() is None for p in procs.values()), {n: p.poll() for n, p in procs.items()}
            time.sleep(0.5)
        assert all(states.values()), states
        listening = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
        mine = [line.split()[3] for line in listening.splitlines() if f":{port} " in line + " "]
        assert sorted(re.sub(r"%[^:]+", "", a) for a in mine) == sorted(f"{a}:{port}" for a, _ in nodes.values()), mine
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(timeout=30)
    for name in ("b", "c"):
        check = subprocess.run([SYSTEM_PYTHON, VERIFIER, str(manifest), nodes[name][1], "--full"],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_serve_refuses_a_torrent_of_other_files_before_writing_anything(engine, tmp_path):
    manifest = tmp_path / "manifest.json"
    other = {**FILES, "config.json": b'{"a": 2}\n\n'}
    manifest.write_text(json.dumps(manifest_of(FILES)))
    (tmp_path / "other.json").write_text(json.dumps(manifest_of(other)))
    seed = snapshot(tmp_path / "seed" / "snap", other)
    torrent = str(tmp_path / "snap.torrent")
    assert swarm("make", seed, str(tmp_path / "other.json"), torrent).returncode == 0
    refused = swarm("serve", torrent, str(tmp_path / "b" / "snap"), str(manifest), "--listen", "127.0.0.64:20999")
    assert refused.returncode == 1 and "config.json: 10 bytes, the manifest says 9" in refused.stderr, refused.stderr
    assert not os.path.exists(tmp_path / "b")


def test_serve_refuses_a_taken_port_instead_of_taking_another(engine, tmp_path):
    """libtorrent moves to the next ports, then to any, when the one asked for is taken; the peers and the firewall
    know only the one asked for."""
    import socket

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(manifest_of(FILES)))
    seed = snapshot(tmp_path / "seed" / "snap", FILES)
    torrent = str(tmp_path / "snap.torrent")
    assert swarm("make", seed, str(manifest), torrent, "--piece-mib", "1").returncode == 0
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.65", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        refused = swarm("serve", torrent, seed, str(manifest), "--listen", f"127.0.0.65:{port}", "--seed",
                        "--status", str(tmp_path / "status.json"))
    finally:
        taken.close()
    assert refused.returncode == 1 and f"cannot listen on 127.0.0.65:{port}: the port is taken" in refused.stderr, \
        refused.stderr
    assert not os.path.exists(tmp_path / "status.json")
