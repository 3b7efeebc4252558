"""Trusted model manifests: generate one from the hub for a repo + commit, load and check one.

    python -m deploys.model.manifest REPO COMMIT [--endpoint URL] [--token-file FILE] [--out PATH]

writes files/manifests/<org>--<name>@<commit>.json for a reviewer to commit. Deploys only ever read
committed manifests; nothing fetches a "trusted" manifest at deploy time.

``read_manifest(path)`` is the one reader for the control node: the shape and every entry checked (relative,
normalised, safe characters, no duplicates, sizes and hashes well formed), else ``ManifestError`` (a
ValueError) whose message names the file and the entry. The check itself lives in the node-side verifier
(stdlib only, copied to nodes alone), so nodes and the control node refuse the same manifests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from files.model_snapshot.snapshot_manifest import ManifestError, check_manifest, manifest_digest, read_manifest

__all__ = ["ManifestError", "check_manifest", "default_path", "generate", "manifest_digest", "read_manifest"]

MANIFEST_DIR = "files/manifests"


def default_path(repo: str, commit: str) -> str:
    return f"{MANIFEST_DIR}/{repo.replace('/', '--')}@{commit}.json"


def generate(repo: str, commit: str, endpoint: str | None = None, token: str | None = None) -> dict:
    """Per file: path, size, and sha256 (LFS) or git blob sha1, from the hub's recursive tree listing."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"revision {commit!r} is not a 40-hex commit")
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token or False)
    files = []
    for item in api.list_repo_tree(repo, revision=commit, recursive=True):
        if not isinstance(item, RepoFile):
            continue
        entry = {"path": item.path, "size": item.size}
        if item.lfs is not None:
            entry["sha256"] = item.lfs.sha256
        else:
            entry["git_sha1"] = item.blob_id
        files.append(entry)
    if not files:
        raise ValueError(f"{repo}@{commit}: the hub lists no files")
    manifest = {"repo": repo, "commit": commit, "files": sorted(files, key=lambda e: e["path"])}
    return check_manifest(manifest, f"generated for {repo}@{commit}")  # a hostile listing never reaches review


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="generate a trusted manifest for review")
    ap.add_argument("repo")
    ap.add_argument("commit")
    ap.add_argument("--endpoint", help="hub URL (default: huggingface_hub's, i.e. HF_ENDPOINT)")
    ap.add_argument("--token-file", help="file holding a hub token (never printed)")
    ap.add_argument("--out", help="default: files/manifests/<org>--<name>@<commit>.json")
    args = ap.parse_args(argv)
    token = open(args.token_file).read().strip() if args.token_file else None
    try:
        manifest = generate(args.repo, args.commit, args.endpoint, token)
    except ValueError as e:  # ManifestError too: the hub lists a path no deploy would accept
        print(f"model_manifest: {e}", file=sys.stderr)
        return 1
    out = args.out or default_path(args.repo, args.commit)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(e["size"] for e in manifest["files"])
    print(f"{out}: {len(manifest['files'])} files, {total} bytes, {manifest_digest(manifest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
