#!/usr/bin/env python3
"""Verify a model snapshot against a trusted manifest; stdlib only (it runs on the node).

    verify_snapshot.py MANIFEST DIR [--stamp FILE] [--full] [--record FILE] [--jobs N] [--json] [--quiet]
                       [--max-rate MB_S] [--drop-cold] [--stop-service UNIT] [--check-only]
    verify_snapshot.py MANIFEST DIR --gate [--stamp FILE]

Checks, in order: the file set (missing and extra files), sizes, the safetensors index's weight map
against the manifest's shards, then content hashes (sha256 for LFS files, git blob sha1 for small
files) in parallel threads, largest files first. Every bad file is named. On success it writes a
stamp (manifest digest + per-file size/mtime/inode) atomically; an unchanged snapshot then re-verifies
from the stamp in well under a second unless --full is given. A full run also writes --record (verdict,
time, problems): what the scheduled deep verify and the audit read.

Speed: a file already in the page cache is hashed in place through mmap (no copy out of the cache, which
costs ~15 % of a core at SHA-NI speed); a cold one is streamed with read() in 4 MiB chunks (there the IO,
not the copy, is the limit). One thread per core; hashlib releases the GIL. bench/verify.py measures it.

--gate never hashes: it passes only when the stamp matches this manifest and every file's
size/mtime/inode (the service's start precondition), and names the files that differ.
Exit status: 0 good, 1 bad, 2 usage/manifest error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time

READ_CHUNK = 4 * 1024 * 1024  # cold files: large requests keep the device busy (the copy is not the limit there)
MAP_WINDOW = 8 * 1024 * 1024  # cached files: hashed in place, this much per update (progress, rate cap)
STAMP_NAME = ".inference-nodes-verified.json"
IGNORED_DIRS = {".cache"}  # huggingface_hub's local_dir metadata


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON: what every rank must report identically."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def load_manifest(path: str) -> dict:
    with open(path) as f:
        manifest = json.load(f)
    for key in ("repo", "commit", "files"):
        if key not in manifest:
            raise ValueError(f"manifest {path} has no '{key}'")
    for entry in manifest["files"]:
        if not entry.get("path") or not isinstance(entry.get("size"), int) or not (
            entry.get("sha256") or entry.get("git_sha1")
        ):
            raise ValueError(f"manifest {path}: bad entry {entry!r}")
    return manifest


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
            buf = bytearray(READ_CHUNK)
            view = memoryview(buf)
            while n := f.readinto(buf):
                h.update(view[:n])
                if limit:
                    limit.take(n)
            if drop_cold:  # a scheduled verify must not push the node's working set out of the cache
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return h.hexdigest()


def default_jobs(files: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(files, cores, 64))


def list_files(root: str) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in IGNORED_DIRS]
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
    """The manifest's files whose size, inode or mtime differ from the stamp (what the gate names)."""
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
        problems.append(f"EXTRA {rel}")
        extra.append(rel)
    to_hash = []
    for rel, entry in sorted(expected.items()):
        if rel not in present:
            continue
        try:
            size = os.stat(os.path.join(root, rel)).st_size
        except OSError:  # a dangling snapshot -> blob link
            problems.append(f"MISSING {rel} (dangling link)")
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
    manifest = load_manifest(manifest_path)
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
    manifest = load_manifest(manifest_path)
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
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
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
