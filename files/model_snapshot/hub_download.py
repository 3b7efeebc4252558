#!/usr/bin/env python3
"""Node-side download for model_sync_mode `hub` (run with the venv that holds the pinned huggingface_hub):

    hub_download.py REPO COMMIT LAYOUT DEST ENDPOINT [TOKEN_FILE]

LAYOUT hf_cache: DEST is the cache dir (`<model_root>/hub`); plain: DEST is the directory itself
(huggingface_hub's local_dir mode). The token is read from TOKEN_FILE and never printed.
"""

import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("HF_HUB_DISABLE_SHARED_BLOBS", "1")  # blobs stay inside models--X (it is mounted alone)

from huggingface_hub import snapshot_download  # noqa: E402
from huggingface_hub.errors import HfHubHTTPError  # noqa: E402


def main(argv):
    repo, commit, layout, dest, endpoint = argv[:5]
    token = False
    if len(argv) > 5 and argv[5]:
        with open(argv[5]) as f:
            token = f.read().strip()
    where = {"cache_dir": dest} if layout == "hf_cache" else {"local_dir": dest}
    try:
        path = snapshot_download(repo, revision=commit, endpoint=endpoint, token=token, **where)
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", "?")
        print(f"hub_download: the hub refused {repo}@{commit} (HTTP {status}): check model_hub_token_file and "
              "access to the repo", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
