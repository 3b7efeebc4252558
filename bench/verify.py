#!/usr/bin/env python3
"""Benchmark the model verifier: ours vs `sha256sum` over the same files, raw read throughput, and the
unchanged re-verify (stamp) time. Prints a table; not a test.

    python bench/verify.py [--files 48] [--mb 32] [--dir /var/tmp/verify-bench]

Targets (2-core machine): >= 3x faster than sha256sum; unchanged re-verify < 1 s for 48 files.
Files are read from the page cache after the first pass (each measurement gets one warm-up read).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from files.model_snapshot.verify_snapshot import verify  # noqa: E402


def make_files(root: str, count: int, size: int) -> dict:
    os.makedirs(root, exist_ok=True)
    files = []
    block = os.urandom(1024 * 1024)
    for i in range(count):
        name = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        path = os.path.join(root, name)
        if not (os.path.exists(path) and os.path.getsize(path) == size):
            with open(path, "wb") as f:
                left = size
                while left:
                    chunk = block[: min(left, len(block))]
                    f.write(chunk)
                    left -= len(chunk)
                f.write(b"")
            with open(path, "r+b") as f:  # make every file distinct
                f.write(i.to_bytes(8, "little"))
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while b := f.read(16 << 20):
                h.update(b)
        files.append({"path": name, "size": size, "sha256": h.hexdigest()})
    return {"repo": "bench/model", "commit": "0" * 40, "files": files}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=48)
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--dir", default="/var/tmp/inference-nodes-verify-bench")
    args = ap.parse_args()
    root = os.path.join(args.dir, "snapshot")
    manifest = make_files(root, args.files, args.mb * 1024 * 1024)
    mpath = os.path.join(args.dir, "manifest.json")
    with open(mpath, "w") as f:
        json.dump(manifest, f)
    stamp = os.path.join(args.dir, "stamp.json")
    paths = [os.path.join(root, e["path"]) for e in manifest["files"]]
    total = sum(e["size"] for e in manifest["files"])

    def raw_read():
        buf = bytearray(16 << 20)
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

    def ours_full():
        assert verify(mpath, root, stamp, full=True)["ok"]

    def sha256sum():
        subprocess.run(["sha256sum", *paths], check=True, stdout=subprocess.DEVNULL)

    def ours_stamp():
        r = verify(mpath, root, stamp)
        assert r["ok"] and r["mode"] == "stamp"

    raw_read()  # warm the page cache once
    rows = []
    t_raw = min(timed(raw_read) for _ in range(2))
    t_ours = min(timed(ours_full) for _ in range(2))
    t_sum = timed(sha256sum) if shutil.which("sha256sum") else float("nan")
    t_stamp = min(timed(ours_stamp) for _ in range(3))
    gb = total / 1e9
    rows.append(("raw read (readinto 16 MiB)", t_raw, gb / t_raw))
    rows.append((f"ours, full re-hash ({os.cpu_count()} procs)", t_ours, gb / t_ours))
    rows.append(("sha256sum (coreutils)", t_sum, gb / t_sum))
    rows.append(("ours, unchanged (stamp)", t_stamp, float("nan")))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.files} files x {args.mb} MiB = {gb:.2f} GB, page cache warm")
    print(f"| {'measurement':<34} | {'seconds':>8} | {'GB/s':>6} |")
    print(f"|{'-' * 36}|{'-' * 10}|{'-' * 8}|")
    for name, secs, rate in rows:
        print(f"| {name:<34} | {secs:>8.3f} | {rate:>6.2f} |")
    print(f"ours vs sha256sum: {t_sum / t_ours:.2f}x faster (target >= 3x); "
          f"unchanged re-verify {t_stamp * 1000:.1f} ms (target < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
