#!/usr/bin/env python3
"""Pull model files from a peer node's read-only rsync daemon, in parallel streams; stdlib only (runs on the node).

    peer_pull.py URL DEST PASSWORD_FILE MANIFEST --layout {plain,hf_cache} --streams N [--snapshot REL] FILE...

FILE paths are relative to the snapshot. In the `hf_cache` layout the snapshot's symlinks come first (tiny), and
the blobs they point at follow; in `plain` the files themselves. Sizes come from the manifest so the streams are
balanced, largest first. Exit status: 0 every stream succeeded, 1 otherwise (each failure named).

The peer is not trusted with paths: the manifest is checked as the verifier checks it, every FILE must be one of
its entries, and a link the peer sends that is absolute or resolves outside the snapshot (hf_cache: outside the
repo's blobs/) is deleted again and refused, before any blob is fetched through it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

if __package__:  # files.model_snapshot.peer_pull on the control node (as verify_snapshot.py imports its siblings)
    from .snapshot_manifest import ManifestError, link_problem, read_manifest
    from .sync_progress import PROGRESS_EVERY_S, progress_line, rsync_progress
else:  # run as a file on the node: installed beside the verifier's modules (/usr/local/lib/inference-nodes/)
    from snapshot_manifest import ManifestError, link_problem, read_manifest
    from sync_progress import PROGRESS_EVERY_S, progress_line, rsync_progress


def balanced(paths: list[str], sizes: dict[str, int], streams: int) -> list[list[str]]:
    """Largest first onto the least-loaded stream (the control node's push splits its streams the same way)."""
    buckets = [[0, []] for _ in range(max(1, min(streams, len(paths))))]
    for p in sorted(paths, key=lambda p: -sizes.get(p, 0)):
        bucket = min(buckets, key=lambda b: b[0])
        bucket[0] += sizes.get(p, 0)
        bucket[1].append(p)
    return [items for _, items in buckets if items]


# modes normalised: a copy must stay readable by a peer's unprivileged seed daemon and by the container
COPY_OPTIONS = ["--chmod=D0755,F0644", "--partial", "--mkpath"]


def parallel_rsync(options: list[str], src: str, dest: str, groups: list[list[str]], tmp: str,
                   report=None, every: float = PROGRESS_EVERY_S) -> list[str]:
    """One rsync per group of paths (its own --files-from listing in ``tmp``), all at once; the failures.
    The control node's push runs it too. ``report(bytes_so_far, elapsed, final)``, when given, is called every
    ``every`` seconds and once at the end, from the streams' own progress (`--info=progress2`)."""
    procs, readers, done = [], [], [0] * len(groups)
    started = time.monotonic()
    for n, group in enumerate(groups):
        listing = os.path.join(tmp, f"files-{len(os.listdir(tmp))}-{n}")
        with open(listing, "w") as f:
            f.write("\n".join(group) + "\n")
        progress = ["--info=progress2", "--no-human-readable"] if report else []
        cmd = ["rsync", *options, *COPY_OPTIONS, *progress, f"--files-from={listing}", src, dest]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if report else subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        if report:
            readers.append(rsync_progress(proc, done, n))
    errors = [""] * len(procs)

    def collect(n: int, proc: subprocess.Popen) -> None:
        errors[n] = proc.stderr.read()

    collectors = [threading.Thread(target=collect, args=(n, p), daemon=True) for n, p in enumerate(procs)]
    for thread in collectors:
        thread.start()
    due = started + every
    while any(proc.poll() is None for proc in procs):
        time.sleep(0.2)
        if report and time.monotonic() >= due:
            report(sum(done), time.monotonic() - started, False)
            due += every
    for thread in (*collectors, *readers):
        thread.join()
    if report:
        report(sum(done), time.monotonic() - started, True)
    return [f"rsync exit {proc.returncode}: {err.strip()[-500:]}" for proc, err in zip(procs, errors)
            if proc.returncode != 0]


def refuse_links(root: str, files: list[str]) -> list[str]:
    """The pulled ``files`` (relative to the snapshot ``root``) that are absolute links or resolve outside it
    (hf_cache: outside the repo's blobs/), each deleted again (the link only, never what it points at)."""
    refused = []
    for rel in files:
        if why := link_problem(root, rel):
            refused.append(f"{rel}: {why}")
            os.unlink(os.path.join(root, rel))
    return refused


def blob_targets(dest: str, snapshot: str, files: list[str], sizes: dict[str, int]) -> dict[str, int]:
    """hf_cache: the blobs (relative to DEST) the pulled snapshot links point at, with their sizes (the links
    already checked; a regular file came with the links)."""
    root, real_dest = os.path.join(dest, snapshot), os.path.realpath(dest)
    return {os.path.relpath(os.path.realpath(os.path.join(root, rel)), real_dest): sizes[rel]
            for rel in files if os.path.islink(os.path.join(root, rel))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("dest")
    ap.add_argument("password_file")
    ap.add_argument("manifest")
    ap.add_argument("--layout", choices=("plain", "hf_cache"), required=True)
    ap.add_argument("--snapshot", default="", help="the snapshot directory relative to DEST (hf_cache)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    try:
        sizes = {e["path"]: e["size"] for e in read_manifest(args.manifest)["files"]}
    except ManifestError as e:
        print(e, file=sys.stderr)
        return 1
    if unknown := [f for f in args.files if f not in sizes]:
        print(f"refused: {', '.join(map(repr, unknown[:5]))} not in the manifest {args.manifest}", file=sys.stderr)
        return 1
    if args.layout == "hf_cache" and not re.fullmatch(r"snapshots/[0-9a-f]{40}", args.snapshot):
        print(f"refused: --snapshot {args.snapshot!r} is not snapshots/COMMIT", file=sys.stderr)
        return 1
    root = os.path.join(args.dest, args.snapshot) if args.layout == "hf_cache" else args.dest
    started = time.monotonic()
    daemon = ["-a", "--contimeout=10", "--timeout=120", f"--password-file={args.password_file}"]
    with tempfile.TemporaryDirectory() as tmp:
        if args.layout == "plain":
            wanted = {p: sizes[p] for p in args.files}
        else:
            links = [f"{args.snapshot}/{p}" for p in args.files]
            failures = parallel_rsync(daemon, args.url, args.dest + "/", [links], tmp)
            if failures:
                print(f"snapshot links from {args.url}: {'; '.join(failures)}", file=sys.stderr)
                return 1
            if refused := refuse_links(root, args.files):  # before any blob is fetched through them
                print(f"links from {args.url} refused: {'; '.join(refused[:5])}", file=sys.stderr)
                return 1
            wanted = blob_targets(args.dest, args.snapshot, args.files, sizes)
        expect, peer = sum(wanted.values()), urllib.parse.urlsplit(args.url).netloc.rsplit("@", 1)[-1]

        def report(done: int, elapsed: float, final: bool) -> None:
            print(progress_line(done, expect, elapsed, f" from {peer}", final),
                  file=sys.stderr, flush=True)

        failures = parallel_rsync(daemon, args.url, args.dest + "/", balanced(list(wanted), wanted, args.streams), tmp,
                                  report)
    if refused := refuse_links(root, args.files):  # a blob that is itself a link out; plain: a file sent as a link
        print(f"pulled links refused: {'; '.join(refused[:5])}", file=sys.stderr)
        return 1
    if failures:
        print(f"pull from {args.url} failed: {' | '.join(failures)}", file=sys.stderr)
        return 1
    total = sum(wanted.values())
    took = time.monotonic() - started
    print(f"{len(args.files)} file(s), {total} bytes in {min(args.streams, len(wanted))} stream(s), {took:.1f} s "
          f"({total / max(took, 1e-6) / 1e6:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
