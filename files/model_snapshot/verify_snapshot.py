#!/usr/bin/env python3
"""Verify a model snapshot against a trusted manifest; stdlib only (it runs on the node).

    verify_snapshot.py MANIFEST DIR [--stamp FILE] [--full] [--jobs N] [--json] [--quiet]
    verify_snapshot.py MANIFEST DIR --gate [--stamp FILE]

Checks, in order: the file set (missing and extra files), sizes, the safetensors index's weight map
against the manifest's shards, then content hashes (sha256 for LFS files, git blob sha1 for small
files) in parallel processes, largest files first. Every bad file is named. On success it writes a
stamp (manifest digest + per-file size/mtime/inode) atomically; an unchanged snapshot then re-verifies
from the stamp in well under a second unless --full is given.

--gate never hashes: it passes only when the stamp matches this manifest and every file's
size/mtime/inode (the service's start precondition). Exit status: 0 good, 1 bad, 2 usage/manifest error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import sys
import tempfile
import time

CHUNK = 16 * 1024 * 1024
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


def hash_file(path: str, kind: str, size: int) -> str:
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1()
    if kind == "git_sha1":
        h.update(b"blob %d\0" % size)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _hash_job(args: tuple[str, str, str, int]) -> tuple[str, str]:
    rel, path, kind, size = args
    return rel, hash_file(path, kind, size)


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


def stamp_matches(stamp: dict | None, digest: str, root: str, manifest: dict) -> bool:
    if not stamp or stamp.get("manifest_digest") != digest:
        return False
    recorded = stamp.get("files", {})
    try:
        return all(recorded.get(e["path"]) == stat_key(os.path.join(root, e["path"])) for e in manifest["files"])
    except OSError:
        return False


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
           jobs: int | None = None, progress=None) -> dict:
    """Verify and (when good) stamp. Returns {"ok", "problems", "manifest_digest", "files", "hashed", "mode"}."""
    manifest = load_manifest(manifest_path)
    digest = manifest_digest(manifest)
    stamp_path = stamp_path or os.path.join(root, STAMP_NAME)
    result = {"manifest_digest": digest, "commit": manifest["commit"], "files": len(manifest["files"]),
              "hashed": 0, "bytes_hashed": 0}
    if not full and stamp_matches(read_stamp(stamp_path), digest, root, manifest):
        return {**result, "ok": True, "problems": [], "mode": "stamp"}
    refetch: list[str] = []
    extra: list[str] = []
    problems, to_hash = structural_problems(manifest, root, refetch, extra)
    to_hash.sort(key=lambda e: -e["size"])
    jobs = jobs or max(1, min(len(to_hash), os.cpu_count() or 1, 16))
    work = [(e["path"], os.path.join(root, e["path"]), "sha256" if e.get("sha256") else "git_sha1", e["size"])
            for e in to_hash]
    want = {e["path"]: (e.get("sha256") or e.get("git_sha1")) for e in to_hash}
    total = sum(e["size"] for e in to_hash)
    done_bytes = 0
    sizes = {e["path"]: e["size"] for e in to_hash}
    if work:
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
            for rel, got in pool.map(_hash_job, work):
                done_bytes += sizes[rel]
                if got != want[rel]:
                    problems.append(f"HASH {rel}: {got}, manifest says {want[rel]}")
                    refetch.append(rel)
                if progress:
                    progress(rel, done_bytes, total)
    result.update(hashed=len(work), bytes_hashed=total, mode="full", refetch=sorted(refetch), extra=extra,
                  refetch_bytes=sum(e["size"] for e in manifest["files"] if e["path"] in set(refetch)))
    ok = not problems
    if ok:
        write_stamp(stamp_path, {
            "manifest_digest": digest, "repo": manifest["repo"], "commit": manifest["commit"],
            "verified_at": int(time.time()),
            "files": {e["path"]: stat_key(os.path.join(root, e["path"])) for e in manifest["files"]},
        })
    elif os.path.exists(stamp_path):
        os.unlink(stamp_path)  # a bad snapshot must not keep a stale "verified" stamp
    return {**result, "ok": ok, "problems": problems}


def gate(manifest_path: str, root: str, stamp_path: str | None = None) -> tuple[bool, str]:
    manifest = load_manifest(manifest_path)
    digest = manifest_digest(manifest)
    stamp_path = stamp_path or os.path.join(root, STAMP_NAME)
    stamp = read_stamp(stamp_path)
    if stamp is None:
        return False, f"model snapshot {root} is not verified (no stamp {stamp_path}): run the model deploy"
    if stamp.get("manifest_digest") != digest:
        return False, (f"model snapshot {root} was verified against {stamp.get('manifest_digest')}, "
                       f"the pinned manifest is {digest}")
    if not stamp_matches(stamp, digest, root, manifest):
        return False, f"model snapshot {root} changed since it was verified: run the model deploy"
    return True, f"model snapshot {root} verified against {digest} ({len(manifest['files'])} files)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("dir")
    ap.add_argument("--stamp")
    ap.add_argument("--full", action="store_true", help="re-hash even when the stamp matches")
    ap.add_argument("--gate", action="store_true", help="stamp check only (service start precondition)")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.gate:
            ok, message = gate(args.manifest, args.dir, args.stamp)
            print(message, file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        started = time.monotonic()
        last = [0.0]

        def progress(rel, done, total):
            now = time.monotonic()
            if not args.quiet and (now - last[0] > 2 or done == total):
                last[0] = now
                print(f"verify: {done / 1e9:.1f}/{total / 1e9:.1f} GB hashed ({rel})", file=sys.stderr)

        result = verify(args.manifest, args.dir, args.stamp, args.full, args.jobs, progress)
        result["seconds"] = round(time.monotonic() - started, 3)
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
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
