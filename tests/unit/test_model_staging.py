"""Issue 52 slice 2: another commit is staged beside the live release (its own manifest, stamp and deep-verify
record under /var/lib/inference-nodes/commits/<commit>/), and becomes the live one only at the switch, behind the
closed door. The real verifier and the switch's own shell on real files in a scratch folder: a failed and then a
completed staged sync leave the live gate passing and the live stamp byte-identical; the switch installs the
staged commit whole, or refuses one not verified and changes nothing."""

import hashlib
import json
import subprocess
import sys

import pytest

from deploys.model.snapshot import COMMITS_DIR, LIVE, MANIFEST, RECORD, STAMP, model_state, staged_state
from deploys.schema import NodeConfig
from deploys.service.release import model_switch_command
from deploys.service.restart import restart_reason
from tests.unit.profiles import profile

VERIFIER = "files/model_snapshot/verify_snapshot.py"
REPO = "deepseek-ai/DeepSeek-V4-Flash-0731"
A, B = "7872f01b1d1fe23eabc4c98b48bffcef5a386062", "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
FILES_A = {"config.json": b'{"a": 1}', "model-00001-of-00002.safetensors": b"x" * 1000,
           "model-00002-of-00002.safetensors": b"y" * 999}
FILES_B = {**FILES_A, "model-00002-of-00002.safetensors": b"z" * 1001}


def write_commit(root, commit: str, files: dict, manifest_path) -> str:
    """A snapshot directory of ``files`` and its manifest at ``manifest_path``; returns the directory."""
    entries = [{"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
               for rel, data in sorted(files.items())]
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps({"repo": REPO, "commit": commit, "files": entries}))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (snapshot / rel).write_bytes(data)
    return str(snapshot)


def verifier(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, VERIFIER, *map(str, args)], capture_output=True, text=True, timeout=60)


def on_disk(path: str, tmp_path) -> str:
    """A node path in the scratch folder (/etc/inference-nodes and /var/lib/inference-nodes under it)."""
    return path.replace("/etc/inference-nodes/", f"{tmp_path}/etc/").replace("/var/lib/inference-nodes/",
                                                                               f"{tmp_path}/var/")


def switch(tmp_path, staged) -> subprocess.CompletedProcess:
    command = on_disk(on_disk(model_switch_command(staged), tmp_path), tmp_path)
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def paths(state, tmp_path):
    return tuple(on_disk(p, tmp_path) for p in (state.manifest, state.stamp, state.record))


@pytest.fixture
def live(tmp_path):
    """Commit A verified and live: its manifest, stamp and record in the live places."""
    (tmp_path / "var").mkdir()
    manifest, stamp, record = paths(LIVE, tmp_path)
    snapshot = write_commit(tmp_path / "models", A, FILES_A, tmp_path / "etc" / "model-manifest.json")
    assert manifest == str(tmp_path / "etc" / "model-manifest.json")
    assert verifier(manifest, snapshot, "--stamp", stamp, "--full", "--record", record, "--quiet").returncode == 0
    return {"snapshot": snapshot, "manifest": manifest, "stamp": stamp, "record": record}


def test_a_failed_then_a_completed_staged_sync_leave_the_live_release_able_to_start(live, tmp_path):
    before = {p: open(live[p], "rb").read() for p in ("manifest", "stamp", "record")}
    staged = staged_state(B)
    manifest, stamp, record = paths(staged, tmp_path)
    assert manifest.startswith(on_disk(COMMITS_DIR, tmp_path) + f"/{B}/")
    files = dict(FILES_B)
    shard = files.pop("model-00002-of-00002.safetensors")  # the sync stops before its last file
    snapshot_b = write_commit(tmp_path / "models", B, files, tmp_path / "manifest-b.json")
    (tmp_path / "manifest-b.json").write_text(json.dumps({**json.loads((tmp_path / "manifest-b.json").read_text()),
                                                          "files": [{"path": r, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                                                    for r, d in sorted(FILES_B.items())]}))
    subprocess.run(["install", "-D", "-m", "0644", str(tmp_path / "manifest-b.json"), manifest], check=True)
    staged_run = [manifest, snapshot_b, "--stamp", stamp, "--full", "--record", record, "--quiet"]
    failed = verifier(*staged_run)
    assert failed.returncode == 1 and "model-00002-of-00002.safetensors" in failed.stdout
    assert json.loads(open(record).read())["verdict"] == "bad"  # the staged commit's own record
    gate = verifier(live["manifest"], live["snapshot"], "--gate", "--stamp", live["stamp"])
    assert gate.returncode == 0, gate.stderr
    assert {p: open(live[p], "rb").read() for p in before} == before, "the staged sync wrote the live release's state"
    # the sync completes
    (tmp_path / "models" / "snapshots" / B / "model-00002-of-00002.safetensors").write_bytes(shard)
    assert verifier(*staged_run).returncode == 0
    assert json.loads(open(record).read())["verdict"] == "ok"
    assert verifier(live["manifest"], live["snapshot"], "--gate", "--stamp", live["stamp"]).returncode == 0
    assert {p: open(live[p], "rb").read() for p in before} == before
    # the switch: B whole, then the staged state goes
    done = switch(tmp_path, staged)
    assert done.returncode == 0, done.stderr
    assert open(live["manifest"], "rb").read() == (tmp_path / "manifest-b.json").read_bytes()
    assert verifier(live["manifest"], snapshot_b, "--gate", "--stamp", live["stamp"]).returncode == 0
    assert json.loads(open(live["record"]).read())["commit"] == B
    assert verifier(live["manifest"], live["snapshot"], "--gate", "--stamp", live["stamp"]).returncode == 1
    assert not (tmp_path / "var" / "commits").exists()
    assert not list((tmp_path / "etc").glob("*.switch")) and not list((tmp_path / "var").glob("*.switch"))


def test_the_switch_refuses_a_commit_that_was_not_verified_and_changes_nothing(live, tmp_path):
    before = {p: open(live[p], "rb").read() for p in ("manifest", "stamp", "record")}
    staged = staged_state(B)
    manifest = paths(staged, tmp_path)[0]
    write_commit(tmp_path / "models", B, FILES_B, tmp_path / "manifest-b.json")
    subprocess.run(["install", "-D", "-m", "0644", str(tmp_path / "manifest-b.json"), manifest], check=True)
    refused = switch(tmp_path, staged)  # its manifest is staged, its sync never passed: no stamp
    assert refused.returncode == 1 and "the new model commit was not verified" in refused.stderr
    assert {p: open(live[p], "rb").read() for p in before} == before
    assert verifier(live["manifest"], live["snapshot"], "--gate", "--stamp", live["stamp"]).returncode == 0


def cfg() -> NodeConfig:
    return NodeConfig.model_validate(profile("rtx_pro_6000_pair"))


def test_the_model_step_works_in_place_on_the_live_commit_and_beside_it_on_another(tmp_path):
    (tmp_path / "manifest.json").write_text('{"repo": "r", "commit": "c", "files": []}')
    c = cfg().model_copy(update={"model_manifest": str(tmp_path / "manifest.json")})
    same = {"sha1": hashlib.sha1((tmp_path / "manifest.json").read_bytes()).hexdigest()}
    assert model_state(c, same) == LIVE  # a repair of what serves: in place
    assert model_state(c, {"sha1": "0" * 40}) == staged_state(c.model_revision)  # another commit serves
    assert model_state(c, None) == LIVE  # none yet (a first sync) or lost: no release to keep, in place
    assert staged_state(c.model_revision).manifest == f"{COMMITS_DIR}/{c.model_revision}/manifest.json"
    assert {MANIFEST, STAMP, RECORD} == {LIVE.manifest, LIVE.stamp, LIVE.record}


def test_a_service_that_serves_another_commit_than_the_inventorys_restarts():
    start = {"unit": "u", "snapshot": "s", "verified": "s", "manifest": "live-sha1"}
    assert restart_reason(True, start, "u", "live-sha1") is None
    assert restart_reason(True, start, "u", "wanted-sha1") == "it serves another model commit than the inventory's"
    assert restart_reason(True, {**start, "manifest": None}, "u", "wanted-sha1") is None  # lost: put back in place
    assert restart_reason(True, start, "u", None) is None  # no manifest in the inventory: refused elsewhere
    assert restart_reason(False, start, "u", "live-sha1") == "not running"


def test_the_deep_verify_checks_the_live_commits_snapshot_not_the_inventorys(tmp_path):
    """Slice 5: while the inventory's commit B is staged (a converge killed before its switch), the timer's deep
    verify checks what serves: the live manifest (A) and, in the `hf_cache` layout, A's snapshot. Bound to the
    inventory's snapshot directory instead, it would judge A's manifest against B's files, record them bad and stop
    the service (shown below with the inventory's directory put back)."""
    from deploys.model.integrity import verify_argv

    c = cfg().model_copy(update={"model_revision": B})
    assert c.model_layout == "hf_cache"
    model_dir = tmp_path / "models"
    write_commit(model_dir, A, FILES_A, tmp_path / "etc" / "model-manifest.json")
    write_commit(model_dir, B, FILES_B, tmp_path / "manifest-b.json")  # synced beside, not switched to
    (tmp_path / "var").mkdir()
    places = {MANIFEST: on_disk(MANIFEST, tmp_path), STAMP: on_disk(STAMP, tmp_path), RECORD: on_disk(RECORD, tmp_path),
              c.model_dir: str(model_dir), c.snapshot_dir: str(model_dir / "snapshots" / B),
              "/usr/bin/python3": sys.executable, "/usr/local/lib/inference-nodes/verify_snapshot.py": VERIFIER}
    argv = [places.get(a, a) for a in verify_argv(c) if a != "--stop-service" and not a.endswith(".service")]
    argv = [a for a in argv if a not in ("--skip-while", on_disk("/var/lib/inference-nodes/model-upgrade.json", tmp_path),
                                         "/var/lib/inference-nodes/model-upgrade.json")]
    checked = subprocess.run(argv, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(open(places[RECORD]).read())["commit"] == A
    inventorys = [places[c.snapshot_dir] if a == str(model_dir) else a for a in argv if a != "--hf-snapshot"]
    assert subprocess.run(inventorys, capture_output=True, text=True).returncode == 1  # what slice 5 mends


FILES_B_PLAIN = {**FILES_B, "config.json": b'{"a": 2}'}  # changed at the same size: seeded, then found bad


def inodes(root) -> dict:
    import os
    return {rel: os.stat(os.path.join(root, rel)).st_ino for rel in FILES_A}


def test_a_plain_commit_is_staged_in_a_tree_of_links_and_the_live_directory_changes_only_at_the_switch(tmp_path):
    """Slice 4: the `plain` layout's other commit is synced into its kept tree, seeded with hard links of the live
    files of the same path and size: the sync fetches (and the free-space check counts) only the changed files, a
    file changed at the same size is found by the staged verify and replaced in the tree alone, and the live
    directory keeps its inodes and bytes until the switch links it from the tree."""
    import os

    from deploys.model.snapshot import kept_tree

    c = NodeConfig.model_validate(profile("gb10_dspark")).model_copy(update={"model_revision": B})
    assert c.model_layout == "plain"
    (tmp_path / "var").mkdir()
    manifest_a, stamp_a, record_a = paths(LIVE, tmp_path)
    live = str(tmp_path / "plain")
    write_commit(tmp_path / "a", A, FILES_A, tmp_path / "etc" / "model-manifest.json")
    os.rename(tmp_path / "a" / "snapshots" / A, live)
    assert verifier(manifest_a, live, "--stamp", stamp_a, "--full", "--record", record_a, "--quiet").returncode == 0
    before = inodes(live), {rel: open(f"{live}/{rel}", "rb").read() for rel in FILES_A}
    tree = kept_tree(c, B).replace(c.model_dir, live)
    assert tree == f"{live}/.inference-nodes-releases/{B}"
    staged = staged_state(B)
    manifest, stamp, record = paths(staged, tmp_path)
    write_commit(tmp_path / "b", B, FILES_B_PLAIN, tmp_path / "manifest-b.json")
    subprocess.run(["install", "-D", "-m", "0644", str(tmp_path / "manifest-b.json"), manifest], check=True)

    seeded = verifier(manifest, tree, "--seed-from", live)
    assert seeded.returncode == 0 and "seeded 2 of 3 files" in seeded.stdout, seeded.stdout + seeded.stderr
    plan = json.loads(verifier(manifest, tree, "--stamp", stamp, "--plan", "--json", "--quiet").stdout)
    assert plan["refetch"] == ["model-00002-of-00002.safetensors"] and plan["refetch_bytes"] == 1001
    full = json.loads(verifier(manifest, tree, "--stamp", stamp, "--full", "--json", "--quiet").stdout)
    assert full["refetch"] == ["config.json", "model-00002-of-00002.safetensors"], full
    # the sync: bad files removed from the tree (its links, never the live inode's bytes), the changed ones fetched
    assert verifier("--remove", tree, "--", manifest, tree, *full["refetch"]).returncode == 0
    for rel in full["refetch"]:
        (tmp_path / "b" / "snapshots" / B / rel).rename(f"{tree}/{rel}")
    done = verifier(manifest, tree, "--stamp", stamp, "--full", "--record", record, "--quiet")
    assert done.returncode == 0, done.stdout
    assert os.stat(f"{tree}/model-00001-of-00002.safetensors").st_ino == before[0]["model-00001-of-00002.safetensors"]
    assert (inodes(live), {rel: open(f"{live}/{rel}", "rb").read() for rel in FILES_A}) == before, \
        "the staged sync touched the live directory"
    assert verifier(manifest_a, live, "--gate", "--stamp", stamp_a).returncode == 0

    command = on_disk(model_switch_command(staged, live, tree), tmp_path).replace(
        "/usr/local/lib/inference-nodes/verify_snapshot.py", VERIFIER)
    switched = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    assert switched.returncode == 0, switched.stderr
    assert verifier(manifest_a, live, "--gate", "--stamp", stamp_a).returncode == 0  # now B's manifest and stamp
    assert json.loads(open(manifest_a).read())["commit"] == B
    assert inodes(live) == inodes(tree), "the live directory is the staged tree's files"
    assert open(f"{live}/config.json", "rb").read() == FILES_B_PLAIN["config.json"]


def test_the_switch_links_no_tree_its_stamp_does_not_vouch_for(live, tmp_path):
    """A node synced in place (a fan-out, or a stamp of other files): the switch installs the stamp, links nothing."""
    import os

    staged = staged_state(B)
    manifest, stamp, _ = paths(staged, tmp_path)
    snapshot_b = write_commit(tmp_path / "models", B, FILES_B, tmp_path / "manifest-b.json")
    subprocess.run(["install", "-D", "-m", "0644", str(tmp_path / "manifest-b.json"), manifest], check=True)
    assert verifier(manifest, snapshot_b, "--stamp", stamp, "--full", "--quiet").returncode == 0
    tree = tmp_path / "stale-tree"
    tree.mkdir()
    (tree / "config.json").write_bytes(b"old")
    command = on_disk(model_switch_command(staged, live["snapshot"], str(tree)), tmp_path).replace(
        "/usr/local/lib/inference-nodes/verify_snapshot.py", VERIFIER)
    before = {rel: os.stat(f"{live['snapshot']}/{rel}").st_ino for rel in FILES_A}
    assert subprocess.run(["sh", "-c", command], capture_output=True, text=True).returncode == 0
    assert {rel: os.stat(f"{live['snapshot']}/{rel}").st_ino for rel in FILES_A} == before
    assert verifier(live["manifest"], snapshot_b, "--gate", "--stamp", live["stamp"]).returncode == 0


@pytest.mark.parametrize("layout, mode, waves, staged, tree", [
    ("plain", "push", 1, True, True),
    ("plain", "hub", 3, True, True),
    ("plain", "push", 2, True, False),  # a fan-out: peers serve their live directories, in place
    ("plain", "push", 1, False, False),  # a repair of what serves, or a first sync
    ("hf_cache", "push", 1, True, False),  # the cache stages in its own snapshot
])
def test_where_the_model_step_syncs(layout, mode, waves, staged, tree):
    from deploys.model.snapshot import kept_tree, staged_tree

    c = NodeConfig.model_validate(profile("gb10_dspark" if layout == "plain" else "rtx_pro_6000_pair")).model_copy(
        update={"model_sync_mode": mode, "model_revision": B})
    got = staged_tree(c, staged_state(B) if staged else LIVE, waves)
    assert got == (kept_tree(c, B) if tree else None)
