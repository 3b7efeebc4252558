"""Pruning: releases beyond `releases_kept` leave the disk once a newer one passed the serving gate."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand

from deploys.model.snapshot import PRUNER
from deploys.run.reads import operation, read
from deploys.schema import NodeConfig
from deploys.service.release import release_history_path
from facts.containers import ReleasesOnDisk


def prune_reads(cfg: NodeConfig) -> dict:
    """What ``ReleasesOnDisk`` reads with, and ``releases_pruned`` prunes with."""
    return {"pruner": PRUNER, "model_dir": cfg.model_dir, "layout": cfg.model_layout,
            "history": release_history_path(cfg), "kept": cfg.releases_kept, "keep": cfg.model_revision,
            "image": cfg.image_ref}


@operation()
def releases_pruned(pruner: str, model_dir: str, layout: str, history: str, kept: int, keep: str, image: str):
    """Releases beyond ``kept`` leave the disk once a newer one passed the gate: model commits (the `hf_cache`
    snapshots and the blobs no kept snapshot links to; a `plain` layout's kept trees) and images of the
    service's repository that no kept release names (files/model_snapshot/snapshot_releases.py). The commit
    and image the inventory asks for are always kept, and nothing is pruned before a release passed here.

    + pruner: the node's pruner (installed with the verifier)
    + model_dir: the model directory (``NodeConfig.model_dir``)
    + layout: hf_cache or plain
    + history: the node's release history (``release_history_path``)
    + kept: ``releases_kept``
    + keep: the commit the inventory asks for
    + image: the image reference the inventory asks for
    """
    args = dict(pruner=pruner, model_dir=model_dir, layout=layout, history=history, kept=kept, keep=keep, image=image)
    plan = read(host, ReleasesOnDisk, **args)
    if not plan["history"]:
        host.noop("no release has passed the serving gate here yet: nothing is pruned")
        return
    if not (plan["paths"] or plan["images"] or not plan["recorded"]):
        host.noop(f"only the newest {kept} release(s) and the one asked for are on disk")
        return
    yield StringCommand("python3", pruner, QuoteString(model_dir), "--layout", layout, "--history",
                        QuoteString(history), "--kept", str(kept), "--keep", QuoteString(keep), "--image",
                        QuoteString(image), ">", "/dev/null")
