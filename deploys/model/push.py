"""`push` mode's control-node side: download and verify the snapshot once per run, rsync to a node what its
verifier reports missing or bad, in parallel streams (the same streams as a peer pull: files/model_snapshot/peer_pull.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import gevent.lock
from pyinfra import logger

from deploys.inventory import node_config, ssh_options
from deploys.ops import ControlNodeError, host_failed, uses_sudo
from deploys.run.state import kept
from deploys.schema import NodeConfig
from files.model_snapshot.peer_pull import balanced, parallel_rsync  # the same streams on both sides
from files.model_snapshot.snapshot_manifest import inside
from files.model_snapshot.sync_progress import progress_line

# One lock per control-node download (cache directory, repo, commit), process-wide like the cache on disk (not run
# state): two hosts, or two runs in one process, never fetch the same snapshot into it at once.
_control_dir_locks: dict[tuple, gevent.lock.Semaphore] = {}


def control_snapshot(cfg: NodeConfig, state) -> str:
    """The verified control-node copy (downloaded once per run, whichever host of ``state`` asks first)."""
    key = (cfg.model_control_cache, cfg.model_repo, cfg.model_revision)
    fetched: dict[tuple, str] = kept(state, "control-node snapshots", dict)
    with _control_dir_locks.setdefault(key, gevent.lock.Semaphore()):
        if key not in fetched:
            cmd = [sys.executable, "-m", "deploys.model.fetch", cfg.model_repo, cfg.model_revision,
                   os.path.abspath(cfg.model_manifest), cfg.model_control_cache, cfg.model_hub_endpoint]
            if cfg.model_hub_token_file:
                cmd += ["--token-file", cfg.model_hub_token_file]
            logger.info(f"control node: fetching {cfg.model_repo}@{cfg.model_revision} into {cfg.model_control_cache}")
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                raise ControlNodeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "model_fetch failed")
            fetched[key] = proc.stdout.strip().splitlines()[-1]
        return fetched[key]


def rsync_plan(cfg: NodeConfig, control_dir: str, refetch: list[str],
               dest: str | None = None) -> tuple[str, str, list[str], list[str]]:
    """(source root, node destination, paths relative to the source, rsync flags) for the layout (``dest``: where a
    `plain` layout's files go, its live directory or a staged tree; the `hf_cache` layout's go to its cache folder). ValueError for a path that resolves outside the
    control copy's repo folder: nothing else of the control node is sent."""
    repo_root = os.path.dirname(os.path.dirname(control_dir))  # models--ORG--NAME
    real_root = os.path.realpath(repo_root)
    blobs = {}
    for rel in sorted(refetch):
        blobs[rel] = os.path.realpath(os.path.join(control_dir, rel))
        if not inside(blobs[rel], real_root):
            raise ValueError(f"{control_dir}/{rel} resolves to {blobs[rel]}, outside {repo_root}: refused")
    if cfg.model_layout == "plain":
        return control_dir, dest or cfg.model_root, sorted(refetch), ["-aL"]
    paths = []
    for rel, blob in blobs.items():
        paths.append(f"{cfg.snapshot_subdir}/{rel}")
        paths.append(os.path.relpath(blob, real_root))
    return repo_root, cfg.model_dir, paths, ["-a"]


def push_from_control(state, host, refetch: list[str], dest: str | None = None) -> bool:
    """Rsync ``refetch`` from the verified control-node copy to ``host``, into ``dest`` where the model step syncs
    (``snapshot_synced``'s dest_dir; a FunctionCommand's body; False fails it)."""
    cfg = node_config(host)
    try:
        control_dir = control_snapshot(cfg, state)
    except ControlNodeError as e:
        return host_failed(host, f"control-node download failed: {e}")
    try:
        src, dest, paths, flags = rsync_plan(cfg, control_dir, refetch, dest)
    except ValueError as e:
        return host_failed(host, f"control-node copy refused: {e}")
    follow = "-aL" in flags  # plain: links in the control cache are sent as the files; hf_cache: as links + blobs
    sizes = {p: (os.stat if follow else os.lstat)(os.path.join(src, p)).st_size
             for p in paths if os.path.lexists(os.path.join(src, p))}
    data = host.data.dict()
    ssh = "ssh " + " ".join(f"-o {o}" for o in ssh_options(data))
    target = f"{data.get('ssh_hostname') or host.name}:{dest}/"
    extra = ["--rsync-path", "sudo rsync"] if uses_sudo(host) else []
    groups = balanced(paths, sizes, cfg.model_rsync_streams)
    expect = sum(sizes.values())

    def report(done: int, elapsed: float, final: bool) -> None:
        host.log_styled(progress_line(done, expect, elapsed, " from the control node", final),
                        log_func=logger.info)

    with tempfile.TemporaryDirectory() as tmp:
        failed = parallel_rsync([*flags, "-e", ssh, *extra], f"{src}/", target, groups, tmp, report)
    if failed:
        return host_failed(host, f"rsync to {dest} failed: {' | '.join(failed)}")
    host.log_styled(f"pushed {len(refetch)} file(s), {sum(sizes.values())} bytes, in {len(groups)} stream(s)",
                    log_func=logger.info)
    return True
