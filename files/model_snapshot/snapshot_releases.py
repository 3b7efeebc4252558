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
import subprocess
import sys

COMMIT = re.compile(r"[0-9a-f]{40}")
# run as a file on the node, beside the verifier's modules; imported as files.model_snapshot.* elsewhere
if __package__:
    from .snapshot_manifest import KEPT_TREES
else:
    from snapshot_manifest import KEPT_TREES


def _link(source: str, target: str) -> None:
    """``target`` becomes a hard link of ``source`` through a temporary name and a rename (a run killed half-way
    leaves the old file or the new one whole)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.link-tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.link(source, tmp)
    os.replace(tmp, target)


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
        _link(source, target)
    for rel in sorted(files_in_dest - set(paths)):
        os.unlink(os.path.join(dest, rel))


def seed_tree(files: list[dict], src: str, dest: str) -> list[str]:
    """Link into ``dest`` (a `plain` layout's staged commit) each manifest file (``{"path", "size"}``) that ``dest``
    lacks and ``src`` (the live directory) holds as a regular file of the manifest's size: the unchanged files of a
    new commit cost no bytes and no download. Sizes only, no hashing: the staged verify hashes the tree, and a sync
    replaces a file by rename, never in place, so the live inode keeps its content. Returns the paths linked."""
    linked = []
    for entry in files:
        rel = entry["path"]
        source, target = os.path.join(src, rel), os.path.join(dest, rel)
        if os.path.lexists(target) or os.path.islink(source):
            continue
        try:
            if not os.path.isfile(source) or os.stat(source).st_size != entry["size"]:
                continue
        except OSError:
            continue
        _link(source, target)
        linked.append(rel)
    return linked


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


def image_repository(ref: str) -> str:
    """`registry:5000/org/name` of `registry:5000/org/name:tag@sha256:…` (a port is no tag)."""
    name = ref.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def images_to_prune(images: list[dict], used: list[str], keep_refs: list[str]) -> list[str]:
    """IDs of the local images of the service's repository (theirs alone) that no kept release names
    (`name@digest`, matched against the image's digest and every repo digest: an index digest is one of them) and
    no container uses. Nothing when a kept release names its image by tag alone (its digest is unknown, so
    nothing is provably unused)."""
    if not keep_refs or any("@" not in ref for ref in keep_refs):
        return []
    repo = image_repository(keep_refs[-1])
    keep = {ref.split("@", 1)[1] for ref in keep_refs}
    out = []
    for image in images:
        names = [*(image.get("RepoDigests") or []), *(image.get("RepoTags") or [])]
        if not names or any(image_repository(n) != repo for n in names):
            continue  # another repository's, or shared with one (removing it by ID would untag theirs)
        digests = {image.get("Digest")} | {d.split("@", 1)[1] for d in image.get("RepoDigests") or [] if "@" in d}
        if digests & keep or image.get("Id") in used:
            continue
        out.append(image["Id"])
    return out


def _podman(*args: str) -> str:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise OSError(f"podman {args[0]}: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def local_images() -> tuple[list[dict], list[str]]:
    """Every local image (podman's inspect JSON) and the IDs of the images containers were made from."""
    ids = sorted(set(_podman("images", "-q", "--no-trunc").split()))
    images = json.loads(_podman("image", "inspect", *ids)) if ids else []
    used = sorted(set(_podman("ps", "-a", "--no-trunc", "--format", "{{.ImageID}}").split()))
    return images, used


def read_history(path: str) -> list[dict]:
    try:
        with open(path) as f:
            history = json.load(f)
    except (OSError, ValueError):
        return []
    return [r for r in history if isinstance(r, dict)] if isinstance(history, list) else []


HISTORY_LENGTH = 50


def record_release(path: str, entry: dict) -> None:
    """Append a release that passed the gate to the history (an older entry of the same release moves to the
    end), through a rename: a run killed half-way leaves the history as it was."""
    history = [r for r in read_history(path) if r.get("release") != entry["release"]]
    with open(f"{path}.tmp", "w") as f:
        f.write(json.dumps(history[-(HISTORY_LENGTH - 1):] + [entry], sort_keys=True) + "\n")
    os.replace(f"{path}.tmp", path)


def main(argv: list[str] | None = None) -> int:
    """Plan (``--plan``: print what would go, change nothing) or prune, as one JSON line. Images are looked at
    once per release that passed (``<history>.pruned`` records the last one pruned for): a no-op converge
    runs no podman command. ``record HISTORY ENTRY``: append a release that passed (record_release)."""
    import argparse
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["record"] and len(argv) == 3:
        record_release(argv[1], json.loads(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description="Prune model commits and images beyond the kept releases")
    ap.add_argument("model_dir")
    ap.add_argument("--layout", choices=("hf_cache", "plain"), required=True)
    ap.add_argument("--history", required=True, help="the node's release history (JSON list, newest last)")
    ap.add_argument("--kept", type=int, required=True, help="how many of the newest releases keep their commit")
    ap.add_argument("--keep", action="append", default=[], help="a commit kept whatever the history says")
    ap.add_argument("--image", help="the image the inventory asks for (images are pruned only with it)")
    ap.add_argument("--plan", action="store_true", help="print what would go, delete nothing")
    args = ap.parse_args(argv)
    history = read_history(args.history)
    if not history:  # nothing has passed here yet: nothing is known to be unused
        print(json.dumps({"history": 0, "paths": [], "images": [], "recorded": True}))
        return 0
    kept = history[-args.kept:]
    keep = {r["model_revision"] for r in kept if isinstance(r.get("model_revision"), str)} | set(args.keep)
    paths = prune_plan(args.model_dir, args.layout, keep)
    marker = f"{args.history}.pruned"
    try:
        with open(marker) as f:
            recorded = f.read().strip() == str(history[-1].get("release"))
    except OSError:
        recorded = False
    images: list[str] = []
    if args.image and not recorded:
        refs = [r["image"] for r in kept if isinstance(r.get("image"), str)] + [args.image]
        try:
            images = images_to_prune(*local_images(), refs)
        except (OSError, ValueError) as e:  # no podman, or it failed: images are looked at again next time
            print(f"prune: images not read: {e}", file=sys.stderr)
            recorded = True
    if not args.plan:
        prune(paths)
        if images:
            _podman("rmi", *images)
        with open(f"{marker}.tmp", "w") as f:
            f.write(f"{history[-1].get('release')}\n")
        os.replace(f"{marker}.tmp", marker)
    print(json.dumps({"history": len(history), "paths": paths, "images": images, "recorded": recorded},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
