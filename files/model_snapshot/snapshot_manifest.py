"""The snapshot manifest and the path rules it implies; stdlib only (it runs on the node beside verify_snapshot.py).

A manifest is {"repo", "commit", "files": [{"path", "size", "sha256" | "git_sha1"}]}: what a snapshot must hold,
file by file. Its entries are data, never trusted as paths: check_manifest refuses anything but relative,
normalised paths of a safe character set, and no link in the snapshot may be absolute or resolve outside it (in
the hf_cache layout: outside the repo's blobs/); remove_paths never deletes through a link out of the snapshot.
The verifier, the peer pull (peer_pull.py), the control node's manifest tool (deploys/model_manifest.py) and the
inventory schema all use these checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

# the verifier's own bookkeeping in a snapshot, never a manifest path
STAMP_NAME = ".inference-nodes-verified.json"
# The toolkit's mark on a model directory it owns (deploys/model_snapshot.py): the sync deletes files the
# manifest does not list only in a directory that carries it.
OWNER_MARKER = ".inference-nodes-owned"
KEPT_TREES = ".inference-nodes-releases"  # plain layout: kept commits of releases (snapshot_releases.py)
# at the top of the snapshot only: huggingface_hub's local_dir metadata, and the kept commits
IGNORED_DIRS = {".cache", KEPT_TREES}
HF_METADATA = ".cache/huggingface/download"  # where it keeps a file's metadata
MANIFEST_KEYS = {"repo", "commit", "files"}
ENTRY_KEYS = {"path", "size", "sha256", "git_sha1"}
HASH_LENGTH = {"sha256": 64, "git_sha1": 40}
HEX = re.compile(r"[0-9a-f]+")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
SAFE_PATH = re.compile(r"[A-Za-z0-9._+@=,/-]+")
SAFE_CHARS = re.compile(r"[A-Za-z0-9._+@=,/-]")


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON: what every rank must report identically."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


class ManifestError(ValueError):
    """A manifest that is not a well-formed list of safe paths; the message names the file and the entry."""


def _kind(value) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _hex(value, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and bool(HEX.fullmatch(value))


def path_problem(rel) -> str | None:
    """Why ``rel`` cannot be a manifest path (None: it can). It must be relative and normalised, and use only
    characters that rsync's --files-from, the shell and Quadlet's Volume= take as they are (every file name
    of the usual model repos does: `model-00001-of-00046.safetensors`, `original/params.json`)."""
    if not isinstance(rel, str) or not rel:
        return f"the path is {_kind(rel) if not isinstance(rel, str) else 'empty'}, not a file name"
    if any(c < " " or c == "\x7f" for c in rel):
        return "a control character in the path"
    if "\\" in rel:
        return "a backslash in the path (paths use '/')"
    if rel.startswith("/"):
        return "an absolute path (entries are relative to the snapshot)"
    parts = rel.split("/")
    if "." in parts or ".." in parts:
        return "a '.' or '..' component (entries are normalised and stay inside the snapshot)"
    if "" in parts:
        return "an empty component ('//' or a trailing '/')"
    if not SAFE_PATH.fullmatch(rel):
        odd = "".join(sorted(set(SAFE_CHARS.sub("", rel))))
        return f"characters outside [A-Za-z0-9._+@=,-] and '/': {odd!r}"
    if any(p.startswith("-") for p in parts):
        return "a component starting with '-' (it would read as an option)"
    if parts[0] in IGNORED_DIRS or rel in (STAMP_NAME, OWNER_MARKER):
        return f"{parts[0]!r}, which is the verifier's own bookkeeping"
    return None


def check_manifest(manifest, source: str) -> dict:
    """``manifest`` (parsed JSON) if it is a well-formed manifest, else ManifestError naming ``source`` and the
    entry: {"repo", "commit": 40 hex, "files": [{"path", "size", and one of "sha256" / "git_sha1"}]}, every path
    safe (path_problem), no path twice, no path that is also another one's directory."""
    def fail(what: str):
        raise ManifestError(f"manifest {source}: {what}")

    if not isinstance(manifest, dict):
        fail(f"expected a JSON object with repo, commit and files, got {_kind(manifest)}")
    if missing := sorted(MANIFEST_KEYS - manifest.keys()):
        fail(f"missing key(s) {', '.join(map(repr, missing))} (a manifest has repo, commit and files)")
    if unknown := sorted(manifest.keys() - MANIFEST_KEYS):
        fail(f"unknown key(s) {', '.join(map(repr, unknown))} (a manifest has repo, commit and files)")
    if not isinstance(manifest["repo"], str) or not REPO_ID.fullmatch(manifest["repo"]):
        fail(f"repo {manifest['repo']!r} is not an ORG/NAME repo id")
    if not _hex(manifest["commit"], 40):
        fail(f"commit {manifest['commit']!r} is not a 40-hex commit id")
    files = manifest["files"]
    if not isinstance(files, list) or not files:
        fail(f"files must be a non-empty list, got {_kind(files) if files else 'an empty one'}")
    seen: set[str] = set()
    dirs: dict[str, str] = {}
    for i, entry in enumerate(files):
        if not isinstance(entry, dict):
            fail(f"files[{i}]: expected an object with path, size and sha256 or git_sha1, got {_kind(entry)}")
        rel = entry.get("path")
        name = f"files[{i}] {json.dumps(rel)}" if isinstance(rel, str) else f"files[{i}]"
        if problem := path_problem(rel):
            fail(f"{name}: {problem}")
        if unknown := sorted(entry.keys() - ENTRY_KEYS):
            fail(f"{name}: unknown key(s) {', '.join(map(repr, unknown))} (an entry has path, size and "
                 "sha256 or git_sha1)")
        size = entry.get("size")
        if type(size) is not int or size < 0:
            fail(f"{name}: size {size!r} is not a whole number of bytes >= 0")
        kinds = [k for k in HASH_LENGTH if k in entry]
        if len(kinds) != 1:
            fail(f"{name}: needs exactly one of sha256 (LFS files) or git_sha1 (small files), has "
                 f"{' and '.join(kinds) or 'neither'}")
        digest = entry[kinds[0]]
        if not _hex(digest, HASH_LENGTH[kinds[0]]):
            fail(f"{name}: {kinds[0]} {digest!r} is not {HASH_LENGTH[kinds[0]]} lower-case hex digits")
        if rel in seen:
            fail(f"{name}: listed twice")
        seen.add(rel)
        parts = rel.split("/")
        for n in range(1, len(parts)):
            dirs.setdefault("/".join(parts[:n]), rel)
    if clash := sorted(seen & dirs.keys()):
        fail(f"{json.dumps(clash[0])} is a file and also the directory of {json.dumps(dirs[clash[0]])}")
    return manifest


def read_manifest(path: str) -> dict:
    """The manifest at ``path``, checked (check_manifest); ManifestError for anything else, never a traceback."""
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except OSError as e:
        raise ManifestError(f"manifest {path}: cannot be read ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ManifestError(f"manifest {path}: not JSON ({e or 'nested too deeply'})") from None
    return check_manifest(manifest, path)


def shown(rel: str) -> str:
    """A path as a message shows it: quoted and escaped unless plain (a newline in a name cannot forge a line)."""
    return rel if SAFE_PATH.fullmatch(rel) else repr(rel)


def inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or below it (both already resolved)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def link_boundary(root: str) -> str:
    """Where a link in the snapshot ``root`` may resolve to: in the hf_cache layout (``…/snapshots/COMMIT``) the
    repo folder's blobs/, which huggingface_hub links to as ``../../blobs/ETAG``; otherwise the snapshot itself."""
    parent = os.path.dirname(os.path.normpath(root))
    if os.path.basename(parent) == "snapshots":
        return os.path.join(os.path.dirname(parent), "blobs")
    return root


def link_problem(root: str, rel: str, boundary: str | None = None) -> str | None:
    """Why the link at ``root/rel`` is refused (None: no link, or a safe one): an absolute link, or one that
    resolves outside ``boundary`` (default link_boundary(root)), is what a container would not see, or worse."""
    path = os.path.join(root, rel)
    if not os.path.islink(path):
        return None
    target = os.readlink(path)
    if os.path.isabs(target):
        return f"an absolute link to {target!r}"
    boundary = boundary or link_boundary(root)
    if not inside(os.path.realpath(path), os.path.realpath(boundary)):
        return f"a link to {target!r}, which resolves outside {boundary}"
    return None


def remove_paths(root: str, within: str, paths: list[str]) -> list[str]:
    """Delete ``paths`` (relative to the snapshot ``root``: bad and extra files) and their huggingface_hub
    local_dir metadata, and a link's target too when it resolves inside ``within`` (the hf_cache blob).
    Nothing is deleted through a directory that resolves outside ``root``. Returns what was refused."""
    real_root, real_within = os.path.realpath(root), os.path.realpath(within)
    refused = []
    for rel in paths:
        if not rel or os.path.isabs(rel) or any(p in ("", ".", "..") for p in rel.split("/")):
            refused.append(f"{rel!r}: not a normalised path inside {root}")
            continue
        for sub in (rel, f"{HF_METADATA}/{rel}.metadata"):
            path = os.path.join(root, sub)
            if not inside(os.path.realpath(os.path.dirname(path)), real_root):
                refused.append(f"{sub!r}: its directory resolves outside {root}")
                continue
            if not os.path.lexists(path):
                continue
            target = os.path.realpath(path) if os.path.islink(path) else None
            try:
                os.unlink(path)
                if target and inside(target, real_within) and os.path.isfile(target):
                    os.unlink(target)
            except OSError as e:
                refused.append(f"{sub!r}: {e.strerror}")
    return refused
