"""The manifest is data, not a path oracle: hostile manifests are refused by every reader with a message that
names the file and the entry (never a traceback); no delete or write resolves outside the snapshot; links that
are absolute or leave the snapshot are refused by the verifier and the peer pull, while the hf_cache layout's
relative links into ../../blobs/ keep working; the start gate names files the manifest does not list."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from deploys.model.manifest import ManifestError, read_manifest
from deploys.model.snapshot import VERIFIER_FILES
from files import helper_path
from files.model_snapshot import peer_pull
from files.model_snapshot.snapshot_manifest import remove_paths
from files.model_snapshot.verify_snapshot import gate, verify

VERIFIER = "files/model_snapshot/verify_snapshot.py"
PEER_PULL = "files/model_snapshot/peer_pull.py"
REPO, COMMIT = "deepseek-ai/DeepSeek-V4-Flash-0731", "7872f01b1d1fe23eabc4c98b48bffcef5a386062"


def entry(path, size=5, **digest):
    return {"path": path, "size": size, **(digest or {"sha256": "a" * 64})}


def manifest_of(*entries) -> dict:
    return {"repo": REPO, "commit": COMMIT, "files": list(entries)}


GOOD = manifest_of(
    entry("model-00001-of-00046.safetensors"), entry("model.safetensors.index.json", 9, git_sha1="b" * 40),
    entry("tokenizer.json"), entry("original/config.json"), entry("original/params.json"),
    entry(".gitattributes", 0, git_sha1="c" * 40), entry("1_Pooling/config.json"), entry("README_WEIGHTS.md"),
    entry("onnx/model_q4f16.onnx"), entry("inference/configs/config_671B.json"), entry("LICENSE-CODE"),
    entry("tokenizer+extra@v2=final,b.json"), entry("Config.json"), entry("config.json"),  # case twins are fine
)


class Raw(str):
    """Manifest text written as it is (not JSON-encoded)."""


def hostile_path(path):
    return manifest_of(entry("config.json"), entry(path))


# (id, manifest as JSON-able value or raw text, fragments the message must hold besides the file name)
HOSTILE = [
    ("absolute", hostile_path("/etc/passwd"), ['files[1] "/etc/passwd"', "absolute path"]),
    ("dotdot", hostile_path("../x"), ['files[1] "../x"', "'..' component"]),
    ("dotdot-inside", hostile_path("a/../../x"), ['files[1] "a/../../x"', "'..' component"]),
    ("dot", hostile_path("./config.json"), ['"./config.json"', "'.' or '..'"]),
    ("nul", hostile_path("a\x00b"), ['files[1] "a\\u0000b"', "control character"]),
    ("newline", hostile_path("config.json\nExecStartPre=/bin/sh"), ['"config.json\\nExecStartPre', "control"]),
    ("escape-char", hostile_path("a\x1b[2Jb"), ["files[1]", "control character"]),
    ("backslash", hostile_path("a\\..\\b"), ['files[1] "a\\\\..\\\\b"', "backslash"]),
    ("double-slash", hostile_path("original//config.json"), ['"original//config.json"', "empty component"]),
    ("trailing-slash", hostile_path("original/"), ['"original/"', "empty component"]),
    ("space", hostile_path("fig 1.png"), ['"fig 1.png"', "characters outside", "' '"]),
    ("shell", hostile_path("$(reboot).json"), ['"$(reboot).json"', "characters outside"]),
    ("glob", hostile_path("*.py"), ['"*.py"', "characters outside"]),
    ("non-ascii", hostile_path("modèle.bin"), ["files[1]", "characters outside"]),
    ("leading-dash", hostile_path("-rf"), ['"-rf"', "starting with '-'"]),
    ("reserved-cache", hostile_path(".cache/huggingface/download/x.metadata"), ["'.cache'", "bookkeeping"]),
    ("reserved-stamp", hostile_path(".inference-nodes-verified.json"), ["bookkeeping"]),
    ("empty-path", hostile_path(""), ["files[1]", "empty"]),
    ("path-not-string", manifest_of(entry("a"), {"path": 7, "size": 1, "sha256": "a" * 64}), ["files[1]", "a number"]),
    ("no-path", manifest_of({"size": 1, "sha256": "a" * 64}), ["files[0]", "null"]),
    ("duplicate", manifest_of(entry("config.json"), entry("tokenizer.json"), entry("config.json")),
     ['files[2] "config.json"', "listed twice"]),
    ("file-vs-dir", manifest_of(entry("original"), entry("original/config.json")),
     ['"original" is a file and also the directory of "original/config.json"']),
    ("file-vs-deep-dir", manifest_of(entry("a/b/c"), entry("a")), ['"a" is a file', '"a/b/c"']),
    ("negative-size", manifest_of(entry("config.json", -1)), ['files[0] "config.json"', "size -1"]),
    ("bool-size", manifest_of(entry("config.json", True)), ["size True"]),
    ("float-size", manifest_of(entry("config.json", 1.5)), ["size 1.5"]),
    ("string-size", manifest_of(entry("config.json", "10")), ["size '10'"]),
    ("short-sha256", manifest_of(entry("m.safetensors", sha256="abc")), ['"m.safetensors"', "64 lower-case hex"]),
    ("upper-sha256", manifest_of(entry("m.safetensors", sha256="A" * 64)), ["64 lower-case hex"]),
    ("sha1-as-sha256", manifest_of(entry("m.safetensors", sha256="a" * 40)), ["64 lower-case hex"]),
    ("bad-git-sha1", manifest_of(entry("config.json", git_sha1="g" * 40)), ["git_sha1", "40 lower-case hex"]),
    ("both-hashes", manifest_of(entry("config.json", sha256="a" * 64, git_sha1="b" * 40)), ["sha256 and git_sha1"]),
    ("no-hash", manifest_of({"path": "config.json", "size": 1}), ['"config.json"', "neither"]),
    ("unknown-entry-key", manifest_of({**entry("config.json"), "mode": "0777"}), ["unknown key(s) 'mode'"]),
    ("entry-not-object", manifest_of("config.json"), ["files[0]", "got a string"]),
    ("top-level-list", [entry("config.json")], ["expected a JSON object", "got a list"]),
    ("top-level-string", "a manifest", ["got a string"]),
    ("top-level-null", None, ["got null"]),
    ("no-files", {"repo": REPO, "commit": COMMIT}, ["missing key(s) 'files'"]),
    ("no-repo-no-commit", {"files": [entry("a")]}, ["missing key(s) 'commit', 'repo'"]),
    ("files-object", {"repo": REPO, "commit": COMMIT, "files": {"config.json": entry("config.json")}},
     ["files must be a non-empty list", "an object"]),
    ("files-empty", manifest_of(), ["files must be a non-empty list"]),
    ("commit-branch", {**GOOD, "commit": "main"}, ["commit 'main'"]),
    ("repo-path", {**GOOD, "repo": "../../etc"}, ["repo '../../etc'"]),
    ("unknown-top-key", {**GOOD, "files_extra": []}, ["unknown key(s) 'files_extra'"]),
    ("not-json", Raw("{'repo': 'x'}"), ["not JSON"]),
    ("truncated-json", Raw(json.dumps(GOOD)[:-20]), ["not JSON"]),
    ("deeply-nested", Raw("[" * 100000 + "]" * 100000), ["not JSON"]),
    ("not-utf8", b'{"repo": "\xff"}', ["not JSON"]),
]


def write(tmp_path, content) -> str:
    path = tmp_path / "hostile.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, Raw):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return str(path)


def test_at_least_forty_hostile_manifests():
    assert len(HOSTILE) >= 40 and len({h[0] for h in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("content,fragments", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_manifest_is_refused_naming_the_file_and_entry(tmp_path, content, fragments):
    path = write(tmp_path, content)
    with pytest.raises(ManifestError) as raised:
        read_manifest(path)
    message = str(raised.value)
    assert message.startswith(f"manifest {path}: ")
    for fragment in fragments:
        assert fragment in message
    assert "\n" not in message and "\x00" not in message, "a hostile name cannot forge a line of output"


@pytest.mark.parametrize("content", [h[1] for h in HOSTILE if h[0] in ("dotdot", "newline", "top-level-list", "not-json")])
def test_the_node_verifier_and_gate_refuse_it_with_exit_2_and_no_traceback(tmp_path, content):
    path = write(tmp_path, content)
    for extra in ([], ["--gate"]):
        proc = subprocess.run([sys.executable, VERIFIER, path, str(tmp_path), *extra], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith(f"verify: manifest {path}: ")
        assert "Traceback" not in proc.stderr


def test_unreadable_manifest_is_a_manifest_error(tmp_path):
    with pytest.raises(ManifestError, match=r"manifest .*/missing.json: cannot be read \(No such file"):
        read_manifest(str(tmp_path / "missing.json"))


def test_good_manifest_with_real_model_repo_names_passes(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(GOOD))
    assert read_manifest(str(tmp_path / "good.json")) == GOOD


def test_generate_refuses_a_hostile_hub_listing(monkeypatch):
    import huggingface_hub
    from huggingface_hub import hf_api

    from deploys.model import manifest as model_manifest

    class File:
        def __init__(self, path):
            self.path, self.size, self.lfs, self.blob_id = path, 3, None, "d" * 40

    class Api:
        def __init__(self, **kw):
            pass

        def list_repo_tree(self, *a, **kw):
            return [File("config.json"), File("../../.ssh/authorized_keys")]

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(hf_api, "RepoFile", File)
    with pytest.raises(ManifestError, match=r'generated for .*: files\[0\] "\.\./\.\./\.ssh/authorized_keys"'):
        model_manifest.generate(REPO, COMMIT)


# --- snapshots on disk -------------------------------------------------------------------------------------

def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


FILES = {"config.json": b'{"a": 1}', "model-00001-of-00002.safetensors": b"x" * 1000,
         "model-00002-of-00002.safetensors": b"y" * 999, "original/params.json": b"{}", "tokenizer.json": b"t"}


def make_manifest(tmp_path, files=FILES) -> str:
    entries = [{"path": rel, "size": len(data), **({"sha256": hashlib.sha256(data).hexdigest()}
                                                  if rel.endswith(".safetensors") else {"git_sha1": git_sha1(data)})}
               for rel, data in sorted(files.items())]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest_of(*entries)))
    return str(path)


@pytest.fixture
def hf_cache(tmp_path):
    """The hf_cache layout as huggingface_hub writes it: snapshots/COMMIT/<rel> -> ../../blobs/<etag>."""
    repo = tmp_path / "hub" / "models--deepseek-ai--DeepSeek-V4-Flash-0731"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    for rel, data in FILES.items():
        etag = hashlib.sha256(data).hexdigest() if rel.endswith(".safetensors") else git_sha1(data)
        (repo / "blobs" / etag).write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / etag, link.parent), link)
    assert os.readlink(snapshot / "original/params.json").startswith("../../../blobs/")
    return SimpleNamespace(repo=str(repo), dir=str(snapshot), manifest=make_manifest(tmp_path),
                           stamp=str(tmp_path / "stamp.json"), outside=str(tmp_path / "outside"))


@pytest.fixture
def plain(tmp_path):
    root = tmp_path / "model"
    for rel, data in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return SimpleNamespace(dir=str(root), manifest=make_manifest(tmp_path), stamp=str(tmp_path / "stamp.json"))


def relink(snapshot: str, rel: str, target: str) -> None:
    os.unlink(os.path.join(snapshot, rel))
    os.symlink(target, os.path.join(snapshot, rel))


def test_hf_cache_snapshot_with_relative_blob_links_verifies_and_gates(hf_cache):
    result = verify(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)
    assert result["ok"] and result["hashed"] == len(FILES), result["problems"]
    assert gate(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)[0]
    assert verify(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)["mode"] == "stamp"


def test_absolute_link_to_etc_passwd_is_refused_and_not_hashed(hf_cache):
    relink(hf_cache.dir, "config.json", "/etc/passwd")
    result = verify(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)
    assert not result["ok"] and result["hashed"] == len(FILES) - 1
    assert "LINK config.json: an absolute link to '/etc/passwd'" in result["problems"]
    assert "config.json" in result["refetch"]


def test_relative_link_escaping_through_dotdot_is_refused(hf_cache):
    relink(hf_cache.dir, "original/params.json", "../../../../../../../../../../etc/passwd")
    problems = verify(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)["problems"]
    assert any(p.startswith("LINK original/params.json: a link to '../../../../") and "resolves outside" in p
               for p in problems), problems


def test_link_into_another_snapshot_is_refused_in_the_hf_cache_layout(hf_cache):
    other = os.path.join(hf_cache.repo, "snapshots", "0" * 40)
    os.makedirs(other)
    with open(os.path.join(other, "tokenizer.json"), "wb") as f:
        f.write(FILES["tokenizer.json"])
    relink(hf_cache.dir, "tokenizer.json", f"../{'0' * 40}/tokenizer.json")
    problems = verify(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)["problems"]
    assert any(p.startswith("LINK tokenizer.json") and "blobs" in p for p in problems), problems


def test_blob_that_is_itself_a_link_out_is_refused(hf_cache, tmp_path):
    outside = tmp_path / "secret"
    outside.write_bytes(FILES["tokenizer.json"])  # same content: the hash alone would pass it
    blob = os.path.realpath(os.path.join(hf_cache.dir, "tokenizer.json"))
    os.unlink(blob)
    os.symlink(str(outside), blob)
    problems = verify(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)["problems"]
    assert [p.split(":")[0] for p in problems] == ["LINK tokenizer.json"]


def test_extra_link_to_a_directory_outside_is_named_and_not_walked(hf_cache):
    os.symlink("/etc", os.path.join(hf_cache.dir, "evil"))
    result = verify(hf_cache.manifest, hf_cache.dir, hf_cache.stamp)
    assert "EXTRA evil" in result["problems"] and "LINK evil: an absolute link to '/etc'" in result["problems"]
    assert result["extra"] == ["evil"] and not any("passwd" in p for p in result["problems"])


def test_plain_layout_takes_a_link_inside_and_refuses_one_outside(plain, tmp_path):
    relink(plain.dir, "tokenizer.json", "original/../tokenizer.json.real")
    with open(os.path.join(plain.dir, "tokenizer.json.real"), "wb") as f:
        f.write(FILES["tokenizer.json"])
    assert verify(plain.manifest, plain.dir, plain.stamp)["problems"] == ["EXTRA tokenizer.json.real"]
    (tmp_path / "x").write_bytes(FILES["tokenizer.json"])
    relink(plain.dir, "tokenizer.json", "../x")
    assert any(p.startswith("LINK tokenizer.json: a link to '../x', which resolves outside")
               for p in verify(plain.manifest, plain.dir, plain.stamp)["problems"])


@pytest.mark.parametrize("stray", ["modeling_evil.py", "original/extra.safetensors", "sub/.cache/x.py",
                                   "new\nline.py"])
def test_the_gate_names_a_file_the_manifest_does_not_list(plain, stray):
    assert verify(plain.manifest, plain.dir, plain.stamp)["ok"]
    path = os.path.join(plain.dir, stray)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("import os\n")
    ok, message = gate(plain.manifest, plain.dir, plain.stamp)
    shown = repr(stray) if "\n" in stray else stray
    assert not ok and f"EXTRA {shown} (not in the manifest)" in message
    assert "\n" not in message
    again = verify(plain.manifest, plain.dir, plain.stamp)  # the stamp fast path sees it too
    assert not again["ok"] and again["mode"] == "full" and again["extra"] == [stray]


def test_huggingface_hubs_own_top_level_cache_is_bookkeeping_not_an_extra_file(plain):
    meta = os.path.join(plain.dir, ".cache", "huggingface", "download", "config.json.metadata")
    os.makedirs(os.path.dirname(meta))
    with open(meta, "w") as f:
        f.write("etag\n")
    assert verify(plain.manifest, plain.dir, plain.stamp)["ok"]
    assert gate(plain.manifest, plain.dir, plain.stamp)[0]


def test_a_fifo_in_place_of_a_file_is_named_not_hashed(plain):
    os.unlink(os.path.join(plain.dir, "tokenizer.json"))
    os.mkfifo(os.path.join(plain.dir, "tokenizer.json"))
    result = verify(plain.manifest, plain.dir, plain.stamp)
    assert "NOT A FILE tokenizer.json" in result["problems"] and "tokenizer.json" in result["refetch"]


# --- deletes and writes stay inside the snapshot ---------------------------------------------------------

def test_remove_deletes_the_link_and_its_blob(hf_cache):
    blob = os.path.realpath(os.path.join(hf_cache.dir, "config.json"))
    assert remove_paths(hf_cache.dir, hf_cache.repo, ["config.json"]) == []
    assert not os.path.lexists(os.path.join(hf_cache.dir, "config.json")) and not os.path.exists(blob)


def test_remove_never_deletes_what_a_link_points_at_outside(hf_cache, tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep")
    relink(hf_cache.dir, "config.json", str(precious))
    assert remove_paths(hf_cache.dir, hf_cache.repo, ["config.json"]) == []
    assert precious.read_text() == "keep" and not os.path.lexists(os.path.join(hf_cache.dir, "config.json"))


def test_remove_refuses_a_path_through_a_linked_directory(plain, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("keep")
    shutil.rmtree(os.path.join(plain.dir, "original"))
    os.symlink(str(elsewhere), os.path.join(plain.dir, "original"))
    refused = remove_paths(plain.dir, plain.dir, ["original/config.json", "../elsewhere/config.json", "/etc/x"])
    assert len(refused) == 3 and "'original/config.json': its directory resolves outside" in refused[0]
    assert (elsewhere / "config.json").read_text() == "keep"


def test_remove_takes_huggingface_hubs_metadata_along_in_the_plain_layout(plain):
    meta = os.path.join(plain.dir, ".cache", "huggingface", "download", "original", "params.json.metadata")
    os.makedirs(os.path.dirname(meta))
    open(meta, "w").close()
    assert remove_paths(plain.dir, plain.dir, ["original/params.json"]) == []
    assert not os.path.exists(meta) and not os.path.exists(os.path.join(plain.dir, "original/params.json"))


def test_remove_cli_takes_names_that_look_like_options_and_exits_1_on_a_refusal(plain):
    odd = os.path.join(plain.dir, "-rf")
    open(odd, "w").close()
    base = [sys.executable, VERIFIER, "--remove", plain.dir, "--", plain.manifest, plain.dir]
    assert subprocess.run([*base, "-rf", "config.json"], capture_output=True).returncode == 0
    assert not os.path.exists(odd) and not os.path.exists(os.path.join(plain.dir, "config.json"))
    bad = subprocess.run([*base, "../manifest.json"], capture_output=True, text=True)
    assert bad.returncode == 1 and "refused to delete '../manifest.json'" in bad.stderr
    assert os.path.exists(plain.manifest)


def test_control_push_refuses_a_control_copy_link_that_leaves_the_repo_folder(hf_cache, tmp_path):
    from deploys.model.push import rsync_plan

    cfg = SimpleNamespace(model_layout="hf_cache", model_revision=COMMIT, model_root="/models",
                          model_dir="/models/hub/models--x", snapshot_subdir=f"snapshots/{COMMIT}")
    src, dest, paths, _ = rsync_plan(cfg, hf_cache.dir, ["config.json", "original/params.json"])
    assert src == hf_cache.repo and all(p.startswith(("snapshots/", "blobs/")) for p in paths)
    (tmp_path / "id_rsa").write_text("secret")
    relink(hf_cache.dir, "config.json", str(tmp_path / "id_rsa"))
    for layout in ("hf_cache", "plain"):
        with pytest.raises(ValueError, match="config.json resolves to .*id_rsa, outside"):
            rsync_plan(SimpleNamespace(**{**vars(cfg), "model_layout": layout}), hf_cache.dir, ["config.json"])


# --- the peer pull ---------------------------------------------------------------------------------------

def test_peer_pull_refuses_links_out_before_fetching_blobs_through_them(hf_cache):
    relink(hf_cache.dir, "config.json", "/etc/passwd")
    relink(hf_cache.dir, "tokenizer.json", "../../../../../etc/shadow")
    refused = peer_pull.refuse_links(hf_cache.dir, sorted(FILES))
    assert [r.split(":")[0] for r in refused] == ["config.json", "tokenizer.json"]
    assert not os.path.lexists(os.path.join(hf_cache.dir, "config.json")), "a refused link is deleted again"
    dest, snapshot = os.path.dirname(os.path.dirname(hf_cache.dir)), f"snapshots/{COMMIT}"
    wanted = peer_pull.blob_targets(dest, snapshot, ["original/params.json"], {"original/params.json": 2})
    assert list(wanted) == [f"blobs/{git_sha1(FILES['original/params.json'])}"]


def test_peer_pull_on_the_node_refuses_a_bad_manifest_and_files_it_does_not_list(tmp_path, plain):
    node = tmp_path / "node"  # as installed: peer_pull.py beside the verifier's modules, nothing else
    node.mkdir()
    for script in (PEER_PULL, *(helper_path(f"model_snapshot/{name}") for name in VERIFIER_FILES)):
        shutil.copy(script, node)
    cmd = [sys.executable, str(node / "peer_pull.py"), "rsync://peer/model/", plain.dir, "/nonexistent"]
    bad = write(tmp_path, hostile_path("../../etc/cron.d/x"))
    proc = subprocess.run([*cmd, bad, "--layout", "plain", "config.json"], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.startswith(f"manifest {bad}: files[1]") and "Traceback" not in proc.stderr
    proc = subprocess.run([*cmd, plain.manifest, "--layout", "plain", "../../etc/cron.d/x"], capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "'../../etc/cron.d/x' not in the manifest" in proc.stderr
    proc = subprocess.run([*cmd, plain.manifest, "--layout", "hf_cache", "--snapshot", "snapshots/../..",
                           "config.json"], capture_output=True, text=True)
    assert proc.returncode == 1 and "is not snapshots/COMMIT" in proc.stderr
