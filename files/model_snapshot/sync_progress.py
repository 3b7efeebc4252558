"""A model sync's progress line, the same wherever the bytes move (stdlib only; runs on the node and the control
node): the hub download, a peer pull and the control node's push print it every PROGRESS_EVERY_S seconds and at
the end, so a 160 GB sync is not minutes of silence in the run a person watches.

    model sync: 12.40 of 160.00 GB, 410.2 MB/s, 30 s, about 384 s left
    model sync: 160.00 of 160.00 GB, 412.0 MB/s, 388 s (done)
"""

from __future__ import annotations

import os
import re
import subprocess
import threading

PROGRESS_EVERY_S = 30.0


def progress_line(done: int, expect: int, elapsed: float, where: str = "", final: bool = False) -> str:
    """``done`` of ``expect`` bytes after ``elapsed`` seconds (GB, or MB below a GB), the rate so far and the
    time left at that rate; the ``final`` line says "(done)" instead."""
    rate = done / elapsed if elapsed > 0 else 0.0
    unit, name = (1e9, "GB") if expect >= 1e9 else (1e6, "MB")
    line = (f"model sync{where}: {done / unit:.2f} of {expect / unit:.2f} {name}, {rate / 1e6:.1f} MB/s, "
            f"{elapsed:.0f} s")
    if final:
        return line + " (done)"
    if rate > 0 and done < expect:
        line += f", about {(expect - done) / rate:.0f} s left"
    return line


def written_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (partial downloads included; links count as links)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


_PROGRESS2 = re.compile(r"^\s*([0-9][0-9,.]*)\s+[0-9]+%")


def rsync_progress(proc: subprocess.Popen, done: list[int], slot: int) -> threading.Thread:
    """Read an ``rsync --info=progress2`` stdout in a thread, keeping its bytes so far in ``done[slot]``."""

    def read():
        buffer = ""
        for chunk in iter(lambda: proc.stdout.read(256), ""):
            buffer += chunk
            *lines, buffer = re.split(r"[\r\n]", buffer)
            for line in lines:
                if m := _PROGRESS2.match(line):
                    done[slot] = int(re.sub(r"[,.]", "", m.group(1)))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread
