#!/usr/bin/env python3
"""Verify a model snapshot against a trusted manifest; stdlib only (it runs on the node).

    verify_snapshot.py MANIFEST DIR [--stamp FILE] [--full] [--record FILE] [--jobs N] [--json] [--quiet]
                       [--max-rate MB_S] [--drop-cold] [--stop-service UNIT] [--check-only]
    verify_snapshot.py MANIFEST DIR --gate [--stamp FILE]
    verify_snapshot.py --remove WITHIN -- MANIFEST DIR PATH...

Checks, in order: the file set (missing and extra files), sizes, the safetensors index's weight map
against the manifest's shards, then content hashes (sha256 for LFS files, git blob sha1 for small
files) in parallel threads, largest files first. Every bad file is named. On success it writes a
stamp (manifest digest + per-file size/mtime/inode) atomically; an unchanged snapshot then re-verifies
from the stamp in well under a second unless --full is given. A full run also writes --record (verdict,
time, problems): what the scheduled deep verify and the audit read.

Speed: a file already in the page cache is hashed in place through mmap (no copy out of the cache, which
costs ~15 % of a core at SHA-NI speed); a cold one is streamed with read() in 1 MiB chunks by a reader
thread a few chunks ahead of the hashing (there the IO, not the copy, is the limit; O_DIRECT was slower on
virtio disks). One thread per core; hashlib releases the GIL. bench/verify.py measures it.

--gate never hashes: it passes only when the stamp matches this manifest and every file's
size/mtime/inode (the service's start precondition), and names the files that differ.
--remove deletes bad and extra files before a fetch, never through a link out of DIR (remove_paths).

Manifest entries are data, never trusted as paths: check_manifest refuses anything but relative, normalised
paths of a safe character set, and no link in the snapshot may be absolute or resolve outside it (in the
hf_cache layout: outside the repo's blobs/). deploys/model_manifest.py and peer_pull.py use these checks.
Exit status: 0 good, 1 bad, 2 usage/manifest error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import mmap
import os
import queue
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time

READ_CHUNK = 1024 * 1024  # cold files: the kernel's readahead sizes the requests; small buffers stay in L2
READ_BUFFERS = 3  # cold files: one chunk being hashed while the reader thread fills the next
MAP_WINDOW = 8 * 1024 * 1024  # cached files: hashed in place, this much per update (progress, rate cap)
STAMP_NAME = ".inference-nodes-verified.json"
IGNORED_DIRS = {".cache"}  # huggingface_hub's local_dir metadata (at the top of the snapshot only)
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
    if parts[0] in IGNORED_DIRS or rel == STAMP_NAME:
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


class RateLimit:
    """A shared bytes-per-second cap across the hashing threads (the scheduled deep verify's --max-rate)."""

    def __init__(self, bytes_per_s: float):
        self.rate, self.done, self.start, self.lock = bytes_per_s, 0, time.monotonic(), threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:
            self.done += n
            due = self.start + self.done / self.rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def is_cached(fd: int, size: int) -> bool:
    """Whether the file's pages are in the page cache: three one-byte RWF_NOWAIT reads, which fail
    instead of doing IO (any other error, e.g. a filesystem without RWF_NOWAIT, counts as cold)."""
    one = bytearray(1)
    try:
        return all(os.preadv(fd, [one], off, os.RWF_NOWAIT) == 1 for off in sorted({0, size // 2, size - 1}))
    except (OSError, AttributeError):
        return False


def _hash_stream(fd: int, h, limit: RateLimit | None) -> None:
    """Hash ``fd`` from its offset to EOF through READ_BUFFERS buffers that a reader thread fills ahead of
    this one: the device always has a request outstanding, and the kernel's copy out of the page cache runs
    beside the hashing rather than between two of its chunks (both release the GIL). An error in the
    reader is raised here."""
    free: queue.SimpleQueue = queue.SimpleQueue()
    full: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(READ_BUFFERS):
        free.put(bytearray(READ_CHUNK))
    stop = threading.Event()

    def reader() -> None:
        try:
            while (buf := free.get()) is not None and not stop.is_set():
                n = os.readv(fd, [buf])
                full.put((buf, n))
                if not n:
                    return
        except BaseException as e:  # handed to the hashing thread
            full.put((None, e))

    thread = threading.Thread(target=reader, name="verify-read", daemon=True)
    thread.start()
    try:
        while True:
            buf, n = full.get()
            if buf is None:
                raise n
            if not n:
                return
            with memoryview(buf) as view, view[:n] as data:
                h.update(data)
            if limit:
                limit.take(n)
            free.put(buf)
    finally:
        stop.set()
        free.put(None)  # wakes a reader waiting for a buffer
        thread.join()


def hash_file(path: str, kind: str, size: int, limit: RateLimit | None = None, drop_cold: bool = False) -> str:
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1()
    if kind == "git_sha1":
        h.update(b"blob %d\0" % size)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        actual = os.fstat(fd).st_size
        cached = actual > 0 and is_cached(fd, actual)
        if cached:  # in place: no copy (a file truncated meanwhile ends the process with SIGBUS: fails closed)
            with mmap.mmap(fd, actual, prot=mmap.PROT_READ) as mapped:
                mapped.madvise(mmap.MADV_SEQUENTIAL)
                with memoryview(mapped) as view:
                    for off in range(0, actual, MAP_WINDOW):
                        with view[off:off + MAP_WINDOW] as window:
                            h.update(window)
                            if limit:
                                limit.take(len(window))
        else:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            _hash_stream(fd, h, limit)
            if drop_cold:  # a scheduled verify must not push the node's working set out of the cache
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return h.hexdigest()


def default_jobs(files: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(files, cores, 64))


def list_files(root: str) -> set[str]:
    """Every file under ``root``, relative, less the verifier's own bookkeeping (the stamp, huggingface_hub's
    top-level .cache). A link to a directory is listed as a file, never walked into: links are checked."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        walk = []
        for d in dirnames:
            if os.path.islink(os.path.join(dirpath, d)):
                out.add(os.path.relpath(os.path.join(dirpath, d), root))
            elif not (dirpath == root and d in IGNORED_DIRS):
                walk.append(d)
        dirnames[:] = walk
        for name in filenames:
            if dirpath == root and name == STAMP_NAME:
                continue
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def stat_key(path: str) -> list[int]:
    st = os.stat(path)  # follows the HF cache's snapshot -> blob symlinks
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def read_stamp(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_stamp(path: str, stamp: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".verify-stamp.")
    with os.fdopen(fd, "w") as f:
        json.dump(stamp, f, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def stamp_changes(stamp: dict, root: str, manifest: dict) -> list[str]:
    """The manifest's files whose size, inode or mtime differ from the stamp, and files the manifest does not
    list (what the gate names: vLLM may import a stray *.py next to the weights with trust_remote_code)."""
    recorded = stamp.get("files", {})
    changes = []
    for entry in manifest["files"]:
        rel = entry["path"]
        try:
            now = stat_key(os.path.join(root, rel))
        except OSError:
            changes.append(f"MISSING {rel}")
            continue
        was = recorded.get(rel)
        if not isinstance(was, list) or len(was) != 3:
            changes.append(f"UNVERIFIED {rel}")
        elif was[0] != now[0]:
            changes.append(f"SIZE {rel}: {now[0]} bytes, {was[0]} when verified")
        elif was[2] != now[2]:
            changes.append(f"REPLACED {rel} (inode {now[2]}, {was[2]} when verified)")
        elif was[1] != now[1]:
            changes.append(f"MODIFIED {rel} (mtime changed since it was verified)")
    known = {e["path"] for e in manifest["files"]}
    present = list_files(root) if os.path.isdir(root) else set()
    changes += [f"EXTRA {shown(rel)} (not in the manifest)" for rel in sorted(present - known)]
    return changes


def stamp_matches(stamp: dict | None, digest: str, root: str, manifest: dict) -> bool:
    return bool(stamp) and stamp.get("manifest_digest") == digest and not stamp_changes(stamp, root, manifest)


def write_record(path: str, result: dict) -> None:
    """The verdict of a full re-hash, kept whatever it was (the stamp is deleted on a bad one)."""
    keep = ("ok", "commit", "manifest_digest", "files", "hashed", "bytes_hashed", "seconds")
    record = {k: result[k] for k in keep if k in result}
    record.update(verdict="ok" if result["ok"] else "bad", at=int(time.time()), problems=result["problems"][:100])
    write_stamp(path, record)


def structural_problems(manifest: dict, root: str, refetch: list[str] | None = None,
                        extra: list[str] | None = None) -> tuple[list[str], list[dict]]:
    """File set, sizes and the safetensors index; returns (problems, entries worth hashing).
    Paths to fetch again are appended to ``refetch``, files the manifest does not know to ``extra``."""
    refetch = [] if refetch is None else refetch
    extra = [] if extra is None else extra
    problems = []
    expected = {e["path"]: e for e in manifest["files"]}
    present = list_files(root) if os.path.isdir(root) else set()
    for rel in sorted(set(expected) - present):
        problems.append(f"MISSING {rel}")
        refetch.append(rel)
    for rel in sorted(present - set(expected)):
        problems.append(f"EXTRA {shown(rel)}")
        extra.append(rel)
    boundary = link_boundary(root)
    bad_links = set()
    for rel in sorted(present):
        if why := link_problem(root, rel, boundary):
            problems.append(f"LINK {shown(rel)}: {why}")
            bad_links.add(rel)
            if rel in expected:  # an extra one is in ``extra`` already
                refetch.append(rel)
    to_hash = []
    for rel, entry in sorted(expected.items()):
        if rel not in present or rel in bad_links:
            continue
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError:  # a dangling snapshot -> blob link
            problems.append(f"MISSING {rel} (dangling link)")
            refetch.append(rel)
            continue
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):  # a directory or a FIFO (which would block the hashing)
            problems.append(f"NOT A FILE {rel}")
            refetch.append(rel)
            continue
        if size != entry["size"]:
            problems.append(f"SIZE {rel}: {size} bytes, manifest says {entry['size']}")
            refetch.append(rel)
        else:
            to_hash.append(entry)
    index = expected.get("model.safetensors.index.json")
    if index and "model.safetensors.index.json" in present:
        try:
            with open(os.path.join(root, "model.safetensors.index.json")) as f:
                weight_map = json.load(f).get("weight_map", {})
            shards = {p for p in expected if p.endswith(".safetensors")}
            mapped = set(weight_map.values())
            for rel in sorted(mapped - shards):
                problems.append(f"INDEX model.safetensors.index.json maps weights to {rel}, not in the manifest")
            for rel in sorted(shards - mapped):
                problems.append(f"INDEX {rel} is in the manifest but no weight maps to it")
        except (OSError, ValueError) as e:
            problems.append(f"INDEX model.safetensors.index.json unreadable: {e}")
    return problems, to_hash


def verify(manifest_path: str, root: str, stamp_path: str | None = None, full: bool = False,
           jobs: int | None = None, progress=None, max_rate: float | None = None, drop_cold: bool = False,
           write: bool = True) -> dict:
    """Verify and (when good) stamp. Returns {"ok", "problems", "manifest_digest", "files", "hashed", "mode"}.
    ``write=False`` checks only: no stamp is written or deleted."""
    started = time.monotonic()
    manifest = read_manifest(manifest_path)
    digest = manifest_digest(manifest)
    stamp_path = stamp_path or os.path.join(root, STAMP_NAME)
    result = {"manifest_digest": digest, "commit": manifest["commit"], "files": len(manifest["files"]),
              "hashed": 0, "bytes_hashed": 0}
    if not full and stamp_matches(read_stamp(stamp_path), digest, root, manifest):
        return {**result, "ok": True, "problems": [], "mode": "stamp", "seconds": round(time.monotonic() - started, 3)}
    refetch: list[str] = []
    extra: list[str] = []
    problems, to_hash = structural_problems(manifest, root, refetch, extra)
    to_hash.sort(key=lambda e: -e["size"])  # largest first: the last file to finish is a small one
    limit = RateLimit(max_rate) if max_rate else None
    want = {e["path"]: (e.get("sha256") or e.get("git_sha1")) for e in to_hash}
    sizes = {e["path"]: e["size"] for e in to_hash}
    total = sum(sizes.values())
    done_bytes = 0

    def one(entry: dict) -> tuple[str, str]:
        kind = "sha256" if entry.get("sha256") else "git_sha1"
        try:
            return entry["path"], hash_file(os.path.join(root, entry["path"]), kind, entry["size"], limit, drop_cold)
        except OSError as e:
            return entry["path"], f"unreadable ({e.strerror})"

    if to_hash:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or default_jobs(len(to_hash))) as pool:
            for rel, got in pool.map(one, to_hash):
                done_bytes += sizes[rel]
                if got != want[rel]:
                    problems.append(f"HASH {rel}: {got}, manifest says {want[rel]}")
                    refetch.append(rel)
                if progress:
                    progress(rel, done_bytes, total)
    result.update(hashed=len(to_hash), bytes_hashed=total, mode="full", refetch=sorted(refetch), extra=extra,
                  refetch_bytes=sum(e["size"] for e in manifest["files"] if e["path"] in set(refetch)))
    ok = not problems
    if write and ok:
        # no time in the stamp: an unchanged snapshot re-verified writes the same stamp (the service's
        # started-from record hashes it, so only a repaired file restarts the service)
        write_stamp(stamp_path, {
            "manifest_digest": digest, "repo": manifest["repo"], "commit": manifest["commit"],
            "files": {e["path"]: stat_key(os.path.join(root, e["path"])) for e in manifest["files"]},
        })
    elif write and os.path.exists(stamp_path):
        os.unlink(stamp_path)  # a bad snapshot must not keep a stale "verified" stamp
    return {**result, "ok": ok, "problems": problems, "seconds": round(time.monotonic() - started, 3)}


def gate(manifest_path: str, root: str, stamp_path: str | None = None) -> tuple[bool, str]:
    manifest = read_manifest(manifest_path)
    digest = manifest_digest(manifest)
    stamp_path = stamp_path or os.path.join(root, STAMP_NAME)
    stamp = read_stamp(stamp_path)
    if stamp is None:
        return False, (f"model snapshot {root} is not verified (no stamp {stamp_path}; a full verify that "
                       "found a bad file removes it): run the model deploy")
    if stamp.get("manifest_digest") != digest:
        return False, (f"model snapshot {root} was verified against {stamp.get('manifest_digest')}, "
                       f"the pinned manifest is {digest}")
    changes = stamp_changes(stamp, root, manifest)
    if changes:
        more = f" (+{len(changes) - 10} more)" if len(changes) > 10 else ""
        return False, (f"model snapshot {root} changed since it was verified: {'; '.join(changes[:10])}{more}: "
                       "run the model deploy")
    return True, f"model snapshot {root} verified against {digest} ({len(manifest['files'])} files)"


def stop_service(unit: str) -> None:
    """The deep verify's mismatch policy `stop`: the service no longer serves from a bad snapshot."""
    proc = subprocess.run(["systemctl", "stop", unit], capture_output=True, text=True)
    print(f"verify: stopped {unit} (its model snapshot is bad)" if proc.returncode == 0
          else f"verify: could not stop {unit}: {proc.stderr.strip()}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("dir")
    ap.add_argument("--stamp")
    ap.add_argument("--full", action="store_true", help="re-hash even when the stamp matches")
    ap.add_argument("--gate", action="store_true", help="stamp check only (service start precondition)")
    ap.add_argument("--record", help="file the verdict of a full re-hash is written to (any verdict)")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--max-rate", type=float, metavar="MB_S", help="cap the read rate (MB/s, all threads)")
    ap.add_argument("--drop-cold", action="store_true", help="drop files that were not cached once hashed")
    ap.add_argument("--stop-service", metavar="UNIT", help="on a bad verdict, `systemctl stop UNIT`")
    ap.add_argument("--check-only", action="store_true", help="write and delete nothing (audits)")
    ap.add_argument("--remove", metavar="WITHIN", help="delete PATH... from DIR (a link's target too if it is "
                                                       "inside WITHIN); put `--` before MANIFEST")
    ap.add_argument("paths", nargs="*", metavar="PATH")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.paths and not args.remove:
        ap.error("PATH... only with --remove")
    if args.remove:
        refused = remove_paths(args.dir, args.remove, args.paths)
        for why in refused:
            print(f"verify: refused to delete {why}", file=sys.stderr)
        return 1 if refused else 0
    try:
        if args.gate:
            ok, message = gate(args.manifest, args.dir, args.stamp)
            print(message, file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        last = [0.0]

        def progress(rel, done, total):
            now = time.monotonic()
            if not args.quiet and (now - last[0] > 2 or done == total):
                last[0] = now
                print(f"verify: {done / 1e9:.1f}/{total / 1e9:.1f} GB hashed ({rel})", file=sys.stderr)

        result = verify(args.manifest, args.dir, args.stamp, args.full, args.jobs, progress,
                        max_rate=args.max_rate * 1e6 if args.max_rate else None, drop_cold=args.drop_cold,
                        write=not args.check_only)
        if args.record and result["mode"] == "full" and not args.check_only:
            write_record(args.record, result)
    except (OSError, ValueError) as e:
        print(f"verify: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for problem in result["problems"]:
            print(problem)
        state = "OK" if result["ok"] else "BAD"
        print(f"{state} {result['files']} files, {result['hashed']} hashed ({result['mode']}), "
              f"{result['manifest_digest']}, {result['seconds']} s")
    if not result["ok"] and args.stop_service:
        stop_service(args.stop_service)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
