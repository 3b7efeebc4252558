"""Hashing a snapshot's files at disk speed; stdlib only (it runs on the node beside verify_snapshot.py).

Every file is hashed in place through mmap (no copy out of the page cache, which costs ~15 % of a core at
SHA-NI speed). A cold one is read into the cache by a second thread a few windows ahead of the hashing, with
MADV_POPULATE_READ (Linux 5.14+): the kernel reads each window with its readahead and maps it, with no copy
and no page fault per page, so on a machine with few cores the hashing keeps nearly all of the CPU (two
cores: 0.01-0.04 s of kernel time per GB against 0.15-0.9 for reads into a buffer). On an older kernel a cold
file is streamed with read() in 1 MiB chunks by a reader thread instead (O_DIRECT was slower on virtio
disks). One thread per core (default_jobs); hashlib releases the GIL. bench/verify.py measures it.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import queue
import threading
import time

READ_CHUNK = 1024 * 1024  # cold files: the kernel's readahead sizes the requests; small buffers stay in L2
READ_BUFFERS = 3  # cold files: one chunk being hashed while the reader thread fills the next
MAP_WINDOW = 8 * 1024 * 1024  # hashed in place, this much per update (progress, rate cap, read-ahead step)
POPULATE_AHEAD = 2  # cold files: windows read into the cache ahead of the one being hashed
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+; Python 3.11's mmap lacks the name


def _populate_supported() -> bool:
    """Whether this kernel knows MADV_POPULATE_READ (an older one refuses it with EINVAL)."""
    try:
        with mmap.mmap(-1, mmap.PAGESIZE) as probe:
            probe.madvise(MADV_POPULATE_READ)
        return True
    except (OSError, AttributeError, ValueError):
        return False


POPULATE = _populate_supported()


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


def _hash_mapped(mapped: mmap.mmap, size: int, h, limit: RateLimit | None, read_ahead: bool) -> None:
    """Hash a mapped file in place, window by window. With ``read_ahead`` (a cold file) a second thread reads
    up to POPULATE_AHEAD windows ahead into the page cache (MADV_POPULATE_READ). A window the kernel could not
    read (an I/O error, a file truncated meanwhile) is never touched, which would end the process with SIGBUS:
    it fails the file as unreadable."""
    ready: queue.SimpleQueue = queue.SimpleQueue()  # per window, in order: None (read) or the error
    room = threading.Semaphore(POPULATE_AHEAD)
    stop = threading.Event()

    def populate() -> None:
        for off in range(0, size, MAP_WINDOW):
            room.acquire()
            if stop.is_set():
                return
            try:
                mapped.madvise(MADV_POPULATE_READ, off, min(MAP_WINDOW, size - off))
            except OSError as e:
                ready.put(e)
                return
            ready.put(None)

    thread = threading.Thread(target=populate, name="verify-populate", daemon=True) if read_ahead else None
    if thread:
        thread.start()
    try:
        with memoryview(mapped) as view:
            for off in range(0, size, MAP_WINDOW):
                if thread and (error := ready.get()) is not None:
                    raise OSError(errno.EIO, os.strerror(errno.EIO)) from error
                with view[off:off + MAP_WINDOW] as window:
                    h.update(window)
                    if limit:
                        limit.take(len(window))
                if thread:
                    room.release()
    finally:
        if thread:
            stop.set()
            room.release()  # wakes a populate thread waiting for room
            thread.join()


def hash_file(path: str, kind: str, size: int, limit: RateLimit | None = None, drop_cold: bool = False) -> str:
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1()
    if kind == "git_sha1":
        h.update(b"blob %d\0" % size)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        actual = os.fstat(fd).st_size
        cached = actual > 0 and is_cached(fd, actual)
        if cached or (actual > 0 and POPULATE):
            # in place: no copy (a cached file truncated meanwhile ends the process with SIGBUS: fails closed)
            with mmap.mmap(fd, actual, prot=mmap.PROT_READ) as mapped:
                mapped.madvise(mmap.MADV_SEQUENTIAL)
                _hash_mapped(mapped, actual, h, limit, read_ahead=not cached)
        elif actual > 0:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            _hash_stream(fd, h, limit)
        if drop_cold and not cached:  # a scheduled verify must not push the node's working set out of the cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return h.hexdigest()


def default_jobs(files: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(files, cores, 64))
