"""A model sync's progress line (files/model_snapshot/sync_progress.py): what the streams report as they copy, on
real rsync processes, and its wording."""

from __future__ import annotations

import os

from files.model_snapshot.peer_pull import parallel_rsync
from files.model_snapshot.sync_progress import progress_line, written_bytes


def test_parallel_rsync_reports_the_bytes_its_streams_copied(tmp_path):
    src, dest, tmp = tmp_path / "src", tmp_path / "dest", tmp_path / "tmp"
    for d in (src, dest, tmp):
        d.mkdir()
    sizes = {"a.safetensors": 3_000_000, "b.safetensors": 1_000_000, "c.json": 1234}
    for name, size in sizes.items():
        (src / name).write_bytes(os.urandom(size))
    calls = []
    failed = parallel_rsync(["-a"], f"{src}/", f"{dest}/", [["a.safetensors"], ["b.safetensors", "c.json"]], str(tmp),
                            report=lambda done, elapsed, final: calls.append((done, final)), every=0.01)
    assert failed == []
    assert calls[-1] == (sum(sizes.values()), True), calls
    assert all(not final for _, final in calls[:-1])
    assert written_bytes(str(dest)) == sum(sizes.values())
    # without a report nothing is parsed or printed, and a failing stream is named
    assert parallel_rsync(["-a"], f"{src}/", f"{dest}/", [["missing.bin"]], str(tmp))[0].startswith("rsync exit ")


def test_the_line_says_bytes_rate_and_time_left():
    assert progress_line(40_000_000_000, 160_000_000_000, 100.0) == (
        "model sync: 40.00 of 160.00 GB, 400.0 MB/s, 100 s, about 300 s left")
    assert progress_line(160_000_000_000, 160_000_000_000, 390.0, final=True) == (
        "model sync: 160.00 of 160.00 GB, 410.3 MB/s, 390 s (done)")
    # below a GB in MB; the last line never promises time left (an hf_cache copy's links count in the total)
    assert progress_line(1_200_000, 1_250_402, 1.0, " from 10.0.0.2:8731", final=True) == (
        "model sync from 10.0.0.2:8731: 1.20 of 1.25 MB, 1.2 MB/s, 1 s (done)")
    assert progress_line(0, 10, 0.0) == "model sync: 0.00 of 0.00 MB, 0.0 MB/s, 0 s"
