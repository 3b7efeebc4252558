"""Model commits of releases kept beside the serving one; stdlib only (it runs on the node, from the verifier).

The `hf_cache` layout keeps each commit in `snapshots/<commit>/` (links to shared `blobs/`), so a new commit is
synced beside the last good one by huggingface_hub's own design. The `plain` layout has one directory (the path
the write-ups mount): there the commit of a release that passed the serving gate is kept as a tree of hard links
in `<dir>/.inference-nodes-releases/<commit>/` (no bytes copied; a sync replaces files by rename, never in place,
so the kept inodes keep their content), and a rollback links the directory back from it.

Pruning keeps the commits of the newest releases that passed the gate (the node's release history) and the
commit the directory serves now; in the cache layout it then deletes the blobs no kept snapshot links to.
"""

from __future__ import annotations

import json
import os
import re
import shutil

COMMIT = re.compile(r"[0-9a-f]{40}")
# run as a file on the node, beside the verifier's modules; imported as files.model_snapshot.* elsewhere
if __package__:
    from .snapshot_manifest import KEPT_TREES
else:
    from snapshot_manifest import KEPT_TREES


def link_tree(paths: list[str], src: str, dest: str, files_in_dest: set[str]) -> None:
    """Make ``dest`` hold exactly ``paths`` as hard links of the same files in ``src`` (each through a temporary
    name and a rename, so a run killed half-way leaves every file whole), then delete the files of
    ``files_in_dest`` (the verifier's listing: bookkeeping excluded) that ``paths`` does not hold."""
    for rel in paths:
        source, target = os.path.join(src, rel), os.path.join(dest, rel)
        if not os.path.isfile(source) or os.path.islink(source):
            raise OSError(f"{source}: not a regular file, nothing to link")
        if os.path.lexists(target) and os.path.samefile(source, target):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.link-tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.link(source, tmp)
        os.replace(tmp, target)
    for rel in sorted(files_in_dest - set(paths)):
        os.unlink(os.path.join(dest, rel))


def kept_commits(history_path: str, kept: int) -> list[str]:
    """The model commits of the newest ``kept`` releases in the node's release history (newest last)."""
    try:
        with open(history_path) as f:
            history = json.load(f)
    except (OSError, ValueError):
        history = []
    releases = [r for r in history if isinstance(r, dict)][-kept:] if kept > 0 else []
    return [r["model_revision"] for r in releases if isinstance(r.get("model_revision"), str)]


def _cache_links(snapshot: str) -> set[str]:
    """The blob names the links of one cache snapshot point to."""
    out = set()
    for dirpath, _, filenames in os.walk(snapshot):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                out.add(os.path.basename(os.readlink(path)))
    return out


def prune_plan(model_dir: str, layout: str, keep: set[str]) -> list[str]:
    """What pruning deletes (paths under ``model_dir``): commits outside ``keep`` (only names that are
    commits), and in the cache layout the blobs no kept snapshot links to."""
    commits_dir = os.path.join(model_dir, "snapshots" if layout == "hf_cache" else KEPT_TREES)
    try:
        names = sorted(os.listdir(commits_dir))
    except FileNotFoundError:
        names = []
    gone = [os.path.join(commits_dir, n) for n in names if COMMIT.fullmatch(n) and n not in keep]
    if layout == "hf_cache":
        linked = set()
        for name in names:
            if name in keep or not COMMIT.fullmatch(name):
                linked |= _cache_links(os.path.join(commits_dir, name))
        blobs = os.path.join(model_dir, "blobs")
        try:
            stored = sorted(os.listdir(blobs))
        except FileNotFoundError:
            stored = []
        gone += [os.path.join(blobs, b) for b in stored if b not in linked and not b.endswith(".incomplete")]
    return gone


def prune(paths: list[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys
    ap = argparse.ArgumentParser(description="Prune model commits beyond the kept releases")
    ap.add_argument("model_dir")
    ap.add_argument("--layout", choices=("hf_cache", "plain"), required=True)
    ap.add_argument("--history", required=True, help="the node's release history (JSON list, newest last)")
    ap.add_argument("--kept", type=int, required=True, help="how many of the newest releases keep their commit")
    ap.add_argument("--keep", action="append", default=[], help="a commit kept whatever the history says")
    ap.add_argument("--plan", action="store_true", help="print what would go, delete nothing")
    args = ap.parse_args(argv)
    keep = set(kept_commits(args.history, args.kept)) | set(args.keep)
    gone = prune_plan(args.model_dir, args.layout, keep)
    if not args.plan:
        prune(gone)
    print(json.dumps({"keep": sorted(keep), "pruned" if not args.plan else "prunable": gone}, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
