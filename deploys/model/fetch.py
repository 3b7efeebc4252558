"""Control-node download for the `push` mode, run as a subprocess by deploys/model/push.py:

    python -m deploys.model.fetch REPO COMMIT MANIFEST CACHE ENDPOINT [--token-file F]

Downloads the pinned commit into CACHE (HF layout, blobs as plain files so rsync can ship them), then
verifies it with the same verifier the nodes run. Prints the snapshot path on success; progress and
errors go to stderr (the token never does).
"""

from __future__ import annotations

import argparse
import os
import sys

from files.model_snapshot.snapshot_manifest import ManifestError, remove_paths
from files.model_snapshot.verify_snapshot import verify


def fetch(repo: str, commit: str, manifest: str, cache: str, endpoint: str, token_file: str | None) -> str:
    os.environ.setdefault("HF_HUB_DISABLE_SHARED_BLOBS", "1")  # plain blobs under models--X/blobs
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    token = open(token_file).read().strip() if token_file else False
    stamp = os.path.join(cache, f".inference-nodes-control-{commit}.json")
    path = os.path.join(cache, f"models--{repo.replace('/', '--')}", "snapshots", commit)
    if os.path.isdir(path) and verify(manifest, path, stamp)["ok"]:
        return path
    for attempt in (1, 2):
        try:
            path = snapshot_download(repo, revision=commit, cache_dir=cache, endpoint=endpoint, token=token)
        except HfHubHTTPError as e:
            status = getattr(e.response, "status_code", "?")
            raise SystemExit(f"model_fetch: the hub refused {repo}@{commit} (HTTP {status}): "
                             "check model_hub_token_file and access to the repo") from None
        result = verify(manifest, path, stamp, progress=lambda rel, done, total: None)
        if result["ok"]:
            return path
        # huggingface_hub returns present files without hashing them: drop the bad ones (and their blobs, never
        # a file a link points at outside the repo folder) and fetch again
        print(f"model_fetch: control copy is bad ({'; '.join(result['problems'][:5])}); refetching", file=sys.stderr)
        refused = remove_paths(path, os.path.dirname(os.path.dirname(path)),
                               result.get("refetch", []) + result.get("extra", []))
        if refused:
            raise SystemExit(f"model_fetch: refused to delete {'; '.join(refused[:5])} in {cache}")
    raise SystemExit(f"model_fetch: {repo}@{commit} still fails verification in {cache}")


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("repo", "commit", "manifest", "cache", "endpoint"):
        ap.add_argument(name)
    ap.add_argument("--token-file")
    args = ap.parse_args()
    try:
        print(fetch(args.repo, args.commit, args.manifest, args.cache, args.endpoint, args.token_file))
    except ManifestError as e:
        raise SystemExit(f"model_fetch: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
