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
