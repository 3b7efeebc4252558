#!/usr/bin/env python3
"""Node-side download for model_sync_mode `hub` (run with the venv that holds the pinned huggingface_hub):

    hub_download.py [--expect-bytes N] REPO COMMIT LAYOUT DEST ENDPOINT [TOKEN_FILE]

LAYOUT hf_cache: DEST is the cache dir (`<model_root>/hub`); plain: DEST is the directory itself
(huggingface_hub's local_dir mode). The token is read from TOKEN_FILE and never printed.
A progress line (bytes written under DEST, rate, time left against N; sync_progress.py) goes to stderr every
PROGRESS_EVERY_S seconds and at the end; huggingface_hub's own bars are off (a converge shows these lines).
"""

import os
import sys
import threading
import time

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("HF_HUB_DISABLE_SHARED_BLOBS", "1")  # blobs stay inside models--X (it is mounted alone)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from huggingface_hub import snapshot_download  # noqa: E402
from huggingface_hub.errors import HfHubHTTPError  # noqa: E402
from sync_progress import PROGRESS_EVERY_S, progress_line, written_bytes  # noqa: E402  (installed beside this file)


def report_progress(dest: str, expect: int, every: float, stop: threading.Event) -> None:
    """Every ``every`` seconds until ``stop``, then once more: what the download has written so far."""
    base, t0 = written_bytes(dest), time.monotonic()
    while not stop.wait(every):
        print(progress_line(max(0, written_bytes(dest) - base), expect, time.monotonic() - t0), file=sys.stderr,
              flush=True)
    print(progress_line(max(0, written_bytes(dest) - base), expect, time.monotonic() - t0, final=True),
          file=sys.stderr, flush=True)


def main(argv):
    expect = 0
    if argv[:1] == ["--expect-bytes"]:
        expect, argv = int(argv[1]), argv[2:]
    repo, commit, layout, dest, endpoint = argv[:5]
    token = False
    if len(argv) > 5 and argv[5]:
        with open(argv[5]) as f:
            token = f.read().strip()
    where = {"cache_dir": dest} if layout == "hf_cache" else {"local_dir": dest}
    os.makedirs(dest, exist_ok=True)
    stop = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(dest, expect, PROGRESS_EVERY_S, stop), daemon=True)
    reporter.start()
    try:
        path = snapshot_download(repo, revision=commit, endpoint=endpoint, token=token, **where)
    except HfHubHTTPError as e:
        stop.set()
        reporter.join()
        status = getattr(e.response, "status_code", "?")
        print(f"hub_download: the hub refused {repo}@{commit} (HTTP {status}): check model_hub_token_file and "
              "access to the repo", file=sys.stderr)
        return 1
    stop.set()
    reporter.join()
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
