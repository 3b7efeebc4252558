#!/usr/bin/env python3
"""Verify a model snapshot against a trusted manifest; stdlib only (it runs on the node).

    verify_snapshot.py MANIFEST DIR [--stamp FILE] [--full] [--record FILE] [--jobs N] [--json] [--quiet]
                       [--max-rate MB_S] [--drop-cold] [--stop-service UNIT] [--check-only]
    verify_snapshot.py MANIFEST DIR --gate [--stamp FILE]
    verify_snapshot.py --remove WITHIN -- MANIFEST DIR PATH...
    verify_snapshot.py MANIFEST DIR --link-from SRC
    verify_snapshot.py MANIFEST DIR --seed-from SRC

Checks, in order: the file set (missing and extra files), sizes, the safetensors index's weight map
against the manifest's shards, then content hashes (sha256 for LFS files, git blob sha1 for small
files) in parallel threads, largest files first (snapshot_hashing.py: at disk speed). Every bad file is
named. On success it writes a stamp (manifest digest + per-file size/mtime/inode) atomically; an unchanged
snapshot then re-verifies from the stamp in well under a second unless --full is given. A full run also
writes --record (verdict, time, problems): what the scheduled deep verify and the audit read.

--gate never hashes: it passes only when the stamp matches this manifest and every file's
size/mtime/inode (the service's start precondition), and names the files that differ.
--remove deletes bad and extra files before a fetch, never through a link out of DIR (remove_paths).
--link-from makes DIR hold the manifest's files as hard links of SRC's and nothing else (a `plain` layout's kept
commit, and its rollback: snapshot_releases.py). It hashes nothing: SRC is a snapshot the verifier passed.
--seed-from links into DIR (another commit staged beside the live SRC) the manifest's files DIR lacks and SRC holds
at the manifest's size: only the changed files are fetched (seed_tree). It hashes nothing: the staged verify does.

The manifest is data, never trusted with paths: snapshot_manifest.py checks it and the snapshot's links.
Exit status: 0 good, 1 bad, 2 usage/manifest error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import stat
import subprocess
import sys
import tempfile
import time

# The modules beside this one, imported the way this one was loaded: run as a file (on the node
# `python3 /usr/local/lib/inference-nodes/verify_snapshot.py`, where deploys/model_snapshot.py installs them
# all together), its own folder is sys.path[0] and __package__ is empty; imported as
# files.model_snapshot.verify_snapshot (deploys, tests), they come from that package. Chosen by __package__,
# never by trying one and falling back: a process holds one copy of each module, so ManifestError is one class
# whichever module it is caught through, and a module left out of the install fails here, by its name.
if __package__:
    from .snapshot_hashing import RateLimit, default_jobs, hash_file
    from .snapshot_manifest import (IGNORED_DIRS, OWNER_MARKER, STAMP_NAME, link_boundary, link_problem, manifest_digest,
                                    read_manifest, remove_paths, shown)
    from .snapshot_releases import link_tree, seed_tree
else:
    from snapshot_hashing import RateLimit, default_jobs, hash_file
    from snapshot_manifest import (IGNORED_DIRS, OWNER_MARKER, STAMP_NAME, link_boundary, link_problem, manifest_digest,
                                   read_manifest, remove_paths, shown)
    from snapshot_releases import link_tree, seed_tree


def list_files(root: str) -> set[str]:
    """Every file under ``root``, relative, less the toolkit's own bookkeeping (the stamp, the owner marker,
    huggingface_hub's top-level .cache). A link to a directory is listed as a file, never walked into: links are checked."""
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
            if dirpath == root and name in (STAMP_NAME, OWNER_MARKER):
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


def read_bad_verdicts(stamp_path: str) -> int:
    """How many verdicts found a file's content bad (``<stamp>.bad-verdicts``, kept across good ones)."""
    try:
        with open(f"{stamp_path}.bad-verdicts") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def write_bad_verdicts(stamp_path: str, count: int) -> None:
    tmp = f"{stamp_path}.bad-verdicts.tmp"
    with open(tmp, "w") as f:
        f.write(f"{count}\n")
    os.replace(tmp, f"{stamp_path}.bad-verdicts")


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
           write: bool = True, hash_files: bool = True) -> dict:
    """Verify and (when good) stamp. Returns {"ok", "problems", "manifest_digest", "files", "hashed", "mode"}.
    ``write=False`` checks only: no stamp is written or deleted. ``hash_files=False`` (a converge's plan) hashes
    nothing either: where the stamp cannot vouch for the files (or ``full`` asks for a re-hash), the verdict is
    "not ok, ``needs_hash``", with what the file set and sizes already show."""
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
    if not hash_files:
        stamp = read_stamp(stamp_path)
        why = ("a full re-hash is due" if full else "no verify stamp" if stamp is None else
               f"verified against {stamp.get('manifest_digest')}" if stamp.get("manifest_digest") != digest else
               "; ".join(stamp_changes(stamp, root, manifest)[:5]) or "changed since it was verified")
        problems.append(f"UNVERIFIED {len(to_hash)} file(s) to hash: {why}")
        return {**result, "ok": False, "problems": problems, "mode": "plan", "needs_hash": True,
                "refetch": sorted(refetch), "extra": extra,
                "refetch_bytes": sum(e["size"] for e in manifest["files"] if e["path"] in set(refetch)),
                "seconds": round(time.monotonic() - started, 3)}
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
        # started-from record hashes it, so only a repaired file restarts the service). The count of bad
        # verdicts is in it because a repaired file can come back with the size, mtime and even the inode
        # number of the bad one (rsync keeps the mtime; a freed inode is reused): its stamp still differs.
        write_stamp(stamp_path, {
            "manifest_digest": digest, "repo": manifest["repo"], "commit": manifest["commit"],
            "files": {e["path"]: stat_key(os.path.join(root, e["path"])) for e in manifest["files"]},
            "bad_verdicts": read_bad_verdicts(stamp_path),
        })
    elif write:
        if any(p.startswith("HASH ") for p in problems):  # content a service may have loaded (missing or resized
            write_bad_verdicts(stamp_path, read_bad_verdicts(stamp_path) + 1)  # files come back with new stats)
        if os.path.exists(stamp_path):
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


def marker_until(text: str) -> float | None:
    """The end time a bounded marker's text (``{"until": epoch}``) says, else None: unreadable."""
    try:
        until = json.loads(text).get("until")
    except (ValueError, AttributeError):
        return None
    if isinstance(until, bool) or not isinstance(until, (int, float)):
        return None
    return float(until)


def marker_in_force(path: str, now: float | None = None) -> float | None:
    """The end time of a bounded marker (``{"until": epoch}``) that still counts, else None: absent, expired or
    unreadable (a marker that cannot be read mutes nothing)."""
    try:
        with open(path) as f:
            until = marker_until(f.read())
    except OSError:
        return None
    return until if until is not None and (time.time() if now is None else now) < until else None


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
    ap.add_argument("--sync-check", action="store_true",
                    help="a converge's check before its sync: a bad verdict is recorded only over a record of the "
                    "same manifest (a new commit's files not there yet say nothing about the release that serves)")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--every", type=float, default=2.0, metavar="S", help="a progress line at most every S seconds")
    ap.add_argument("--max-rate", type=float, metavar="MB_S", help="cap the read rate (MB/s, all threads)")
    ap.add_argument("--drop-cold", action="store_true", help="drop files that were not cached once hashed")
    ap.add_argument("--stop-service", metavar="UNIT", help="on a bad verdict, `systemctl stop UNIT`")
    ap.add_argument("--skip-while", metavar="MARKER", help="exit 0 and touch nothing while MARKER ({\"until\": "
                    "epoch}) counts: a converge is upgrading the model, the manifest is not the live files' yet")
    ap.add_argument("--hf-snapshot", action="store_true", help="DIR is a hub cache folder: verify its "
                    "snapshots/<the manifest's commit> (the live release's, whichever commit that is)")
    ap.add_argument("--check-only", action="store_true", help="write and delete nothing (audits)")
    ap.add_argument("--plan", action="store_true", help="write, delete and hash nothing: what the stamp and the file "
                    "set say (a converge's plan)")
    ap.add_argument("--remove", metavar="WITHIN", help="delete PATH... from DIR (a link's target too if it is "
                                                       "inside WITHIN); put `--` before MANIFEST")
    ap.add_argument("--link-from", metavar="SRC", help="make DIR the manifest's files as hard links of SRC's")
    ap.add_argument("--seed-from", metavar="SRC", help="link SRC's files of the manifest's size that DIR lacks")
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
    if args.skip_while and (until := marker_in_force(args.skip_while)):
        print(f"verify: skipped: a converge is upgrading this node's model ({args.skip_while} counts until "
              f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(until))}); nothing was checked or written",
              file=sys.stderr)
        return 0
    try:
        if args.hf_snapshot:
            args.dir = os.path.join(args.dir, "snapshots", read_manifest(args.manifest)["commit"])
        if args.link_from:
            paths = [e["path"] for e in read_manifest(args.manifest)["files"]]
            link_tree(paths, args.link_from, args.dir, list_files(args.dir) if os.path.isdir(args.dir) else set())
            print(f"linked {len(paths)} files of {args.link_from} into {args.dir}")
            return 0
        if args.seed_from:
            files = read_manifest(args.manifest)["files"]
            linked = seed_tree(files, args.seed_from, args.dir)
            print(f"seeded {len(linked)} of {len(files)} files from {args.seed_from} into {args.dir}")
            return 0
        if args.gate:
            ok, message = gate(args.manifest, args.dir, args.stamp)
            print(message, file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        last = [0.0]

        def progress(rel, done, total):
            now = time.monotonic()
            if not args.quiet and (now - last[0] > args.every or done == total):
                last[0] = now
                print(f"verify: {done / 1e9:.1f}/{total / 1e9:.1f} GB hashed ({rel})", file=sys.stderr)

        result = verify(args.manifest, args.dir, args.stamp, args.full, args.jobs, progress,
                        max_rate=args.max_rate * 1e6 if args.max_rate else None, drop_cold=args.drop_cold,
                        write=not (args.check_only or args.plan), hash_files=not args.plan)
        if args.record and result["mode"] == "full" and not (args.check_only or args.plan):
            earlier = read_stamp(args.record) if args.sync_check and not result["ok"] else None
            if not (args.sync_check and not result["ok"]
                    and (earlier or {}).get("manifest_digest") != result.get("manifest_digest")):
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
