"""Model snapshot: the pinned commit on every node, verified file by file against a trusted manifest.

`push` mode: the control node downloads once (deploys/model_fetch.py), verifies that copy, and rsyncs
to each node only what the node's own verifier reports missing or bad, in parallel streams; past
`model_push_fanout` nodes, verified nodes feed the next ones (deploys/model_fanout.py). `hub` mode:
each node downloads with the pinned huggingface_hub in a venv the deploy manages (wheels pushed from the
control node, so nodes need no package index). `present` mode only verifies. Either way the node's
verifier (files/model_snapshot/verify_snapshot.py, stdlib only) writes the stamp that
/usr/local/bin/inference-nodes-model-gate checks before the service starts.
"""

from __future__ import annotations

import importlib.metadata
import os
import posixpath
import subprocess
import sys
import tempfile
from io import StringIO

import gevent.lock
from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, deploy, operation
from pyinfra.operations import apt, files

from deploys import hub_lock, model_fanout
from deploys.apt_state import apt_lists_updated
from deploys.inventory import node_config, ssh_options
from deploys.ops import atomic_put, fail_host, host_failed, refuse, secret_file
from deploys.run_state import kept
from deploys.schema import NodeConfig
from facts.host import FreeBytes
from files import helper_path
from files.model_snapshot.peer_pull import balanced, parallel_rsync  # the same streams on both sides
from files.model_snapshot.verify_snapshot import inside, read_manifest
from facts.model import HubClient, ModelVerification, NodePython


VERIFIER = "/usr/local/lib/inference-nodes/verify_snapshot.py"
MANIFEST = "/etc/inference-nodes/model-manifest.json"
STAMP = "/var/lib/inference-nodes/model-verified.json"
RECORD = "/var/lib/inference-nodes/model-deep-verify.json"  # verdict and time of the last full re-hash
GATE = "/usr/local/bin/inference-nodes-model-gate"
HUB_DOWNLOAD = "/usr/local/lib/inference-nodes/hub_download.py"
HUB_TOKEN = "/etc/inference-nodes/secrets/hf-token"
NODE_WHEELS = "/var/cache/inference-nodes/wheels"
HUB_VERSION = importlib.metadata.version("huggingface_hub")  # pinned in pyproject.toml
HUB_LOCK_NAME = os.path.basename(hub_lock.LOCK)  # pushed beside the wheels, kept in the venv

# One lock per control-node download (cache directory, repo, commit), process-wide like the cache on disk (not run
# state): two hosts, or two runs in one process, never fetch the same snapshot into it at once.
_control_dir_locks: dict[tuple, gevent.lock.Semaphore] = {}


class ControlNodeError(RuntimeError):
    """The control node cannot provide what a host needs (its model download, the hub client's wheels): that
    host fails, with this message (fail_host); the others go on."""


def render_gate(snapshot_dir: str) -> str:
    return (
        "#!/bin/sh\n# Managed by inference-nodes: the service's start precondition (no hashing, stamp + stat only).\n"
        f"exec python3 {VERIFIER} --gate {MANIFEST} {snapshot_dir} --stamp {STAMP}\n"
    )


def control_snapshot(cfg: NodeConfig, state) -> str:
    """The verified control-node copy (downloaded once per run, whichever host of ``state`` asks first)."""
    key = (cfg.model_control_cache, cfg.model_repo, cfg.model_revision)
    fetched: dict[tuple, str] = kept(state, "control-node snapshots", dict)
    with _control_dir_locks.setdefault(key, gevent.lock.Semaphore()):
        if key not in fetched:
            cmd = [sys.executable, "-m", "deploys.model_fetch", cfg.model_repo, cfg.model_revision,
                   os.path.abspath(cfg.model_manifest), cfg.model_control_cache, cfg.model_hub_endpoint]
            if cfg.model_hub_token_file:
                cmd += ["--token-file", cfg.model_hub_token_file]
            logger.info(f"control node: fetching {cfg.model_repo}@{cfg.model_revision} into {cfg.model_control_cache}")
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                raise ControlNodeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "model_fetch failed")
            fetched[key] = proc.stdout.strip().splitlines()[-1]
        return fetched[key]


def rsync_plan(cfg: NodeConfig, control_dir: str, refetch: list[str]) -> tuple[str, str, list[str], list[str]]:
    """(source root, node destination, paths relative to the source, rsync flags) for the layout. ValueError
    for a path that resolves outside the control copy's repo folder: nothing else of the control node is sent."""
    repo_root = os.path.dirname(os.path.dirname(control_dir))  # models--ORG--NAME
    real_root = os.path.realpath(repo_root)
    blobs = {}
    for rel in sorted(refetch):
        blobs[rel] = os.path.realpath(os.path.join(control_dir, rel))
        if not inside(blobs[rel], real_root):
            raise ValueError(f"{control_dir}/{rel} resolves to {blobs[rel]}, outside {repo_root}: refused")
    if cfg.model_layout == "plain":
        return control_dir, cfg.model_root, sorted(refetch), ["-aL"]
    paths = []
    for rel, blob in blobs.items():
        paths.append(f"{cfg.snapshot_subdir}/{rel}")
        paths.append(os.path.relpath(blob, real_root))
    return repo_root, cfg.model_dir, paths, ["-a"]


def _push(state, host, refetch: list[str]) -> bool:
    cfg = node_config(host)
    try:
        control_dir = control_snapshot(cfg, state)
    except ControlNodeError as e:
        return host_failed(host, f"control-node download failed: {e}")
    try:
        src, dest, paths, flags = rsync_plan(cfg, control_dir, refetch)
    except ValueError as e:
        return host_failed(host, f"control-node copy refused: {e}")
    follow = "-aL" in flags  # plain: links in the control cache are sent as the files; hf_cache: as links + blobs
    sizes = {p: (os.stat if follow else os.lstat)(os.path.join(src, p)).st_size
             for p in paths if os.path.lexists(os.path.join(src, p))}
    data = host.data.dict()
    ssh = "ssh " + " ".join(f"-o {o}" for o in ssh_options(data))
    target = f"{data.get('ssh_hostname') or host.name}:{dest}/"
    extra = ["--rsync-path", "sudo rsync"] if data.get("_sudo") else []
    groups = balanced(paths, sizes, cfg.model_rsync_streams)
    with tempfile.TemporaryDirectory() as tmp:
        failed = parallel_rsync([*flags, "-e", ssh, *extra], f"{src}/", target, groups, tmp)
    if failed:
        return host_failed(host, f"rsync to {dest} failed: {' | '.join(failed)}")
    host.log_styled(f"pushed {len(refetch)} file(s), {sum(sizes.values())} bytes, in {len(groups)} stream(s)",
                    log_func=logger.info)
    return True


_wheel_dir_locks: dict[str, gevent.lock.Semaphore] = {}  # per wheel cache directory, process-wide (as above)


def control_wheels(pyver: str, machine: str) -> list[str]:
    """The wheels of huggingface_hub and its dependencies for the node's Python and CPU, exactly as the lock
    pins them (files/model_snapshot/hub-client.lock: versions and sha256, deploys/hub_lock.py), downloaded
    once per (lock, python, arch) into a control-node cache. A cached wheel whose hash is not in the lock is
    refused."""
    lock_id = hub_lock.sha256(hub_lock.LOCK)[:12]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                         "inference-nodes", "wheels", f"cp{pyver}-{machine}-hf{HUB_VERSION}-{lock_id}")
    with _wheel_dir_locks.setdefault(cache, gevent.lock.Semaphore()):
        if not os.path.exists(os.path.join(cache, ".complete")):
            os.makedirs(cache, exist_ok=True)
            cmd = hub_lock.download_command(pyver, machine, cache, "--require-hashes", "-r", hub_lock.LOCK)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise ControlNodeError(f"pip download for cp{pyver}/{machine} failed: {proc.stderr.strip()[-400:]}")
            open(os.path.join(cache, ".complete"), "w").close()
    wheels = sorted(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".whl"))
    allowed = hub_lock.lock_hashes()
    bad = [os.path.basename(w) for w in wheels if hub_lock.sha256(w) not in allowed]
    if bad:
        raise ControlNodeError(f"wheel(s) in {cache} not in {hub_lock.LOCK} (refused): {', '.join(bad)}")
    return wheels


def node_install_command(pip: str, wheels: str) -> list[str]:
    """What the node runs: only the locked wheels from ``wheels``, each checked against the lock's hashes."""
    return [pip, "install", "-q", "--require-hashes", "--no-index", "--find-links", wheels,
            "-r", f"{wheels}/{HUB_LOCK_NAME}"]


@operation()
def hub_client_installed(venv: str):
    """The pinned huggingface_hub in ``venv`` on the node, installed with --require-hashes from the wheels the
    control node pushes; the lock it was installed from is kept in the venv, so a new lock reinstalls.

    + venv: the venv path on the node
    """
    have = host.get_fact(HubClient, venv=venv, lock_name=HUB_LOCK_NAME)
    if (have["version"], have["lock_sha256"]) == (HUB_VERSION, hub_lock.sha256(hub_lock.LOCK)):
        host.noop(f"huggingface_hub {HUB_VERSION} in {venv}, from the current lock")
        return
    node = host.get_fact(NodePython)
    pyver, machine = node["version"], node["machine"]
    if pyver not in hub_lock.PYTHONS or machine not in hub_lock.MACHINES:
        yield fail_host(f"{host.name}: the hub client lock has no wheels for Python {pyver[0]}.{pyver[1:]} on "
                        f"{machine}: add it to deploys/hub_lock.py and run `python -m deploys.hub_lock`")
        return
    try:
        wheels = control_wheels(pyver, machine)
    except ControlNodeError as e:
        yield fail_host(f"{host.name}: {e}")
        return
    yield StringCommand("rm", "-rf", NODE_WHEELS, "&&", "mkdir", "-p", NODE_WHEELS)
    for wheel in [*wheels, hub_lock.LOCK]:
        yield FileUploadCommand(wheel, f"{NODE_WHEELS}/{os.path.basename(wheel)}")
    yield StringCommand("python3", "-m", "venv", "--clear", venv)
    yield StringCommand(*node_install_command(f"{venv}/bin/pip", NODE_WHEELS))
    yield StringCommand("cp", f"{NODE_WHEELS}/{HUB_LOCK_NAME}", f"{venv}/{HUB_LOCK_NAME}")


@operation()
def snapshot_synced(mode: str, snapshot_dir: str, dest_dir: str, wave: int = 0,
                    assignment: model_fanout.Assignment | None = None):
    """Verify the node's snapshot; unless `present`, fetch exactly the missing/bad files, then verify in full.

    + mode: push, hub or present
    + snapshot_dir: the files of the pinned commit on the node
    + dest_dir: where fetched files land (free disk is checked there first)
    + wave: the fan-out wave this operation is (0-based); the first one also records what every node needs
    + assignment: this node's wave and source in a `push` fan-out (None: wave 0 from the control node)
    """
    assignment = assignment or model_fanout.Assignment(0, None)
    if wave not in (0, assignment.wave):
        host.noop(f"{host.name} is synced in wave {assignment.wave + 1}")
        return
    result = model_fanout.recorded_verdict(host.name) if wave > 0 else None  # unchanged since the first wave
    if result is None:
        result = host.get_fact(ModelVerification, verifier=VERIFIER, manifest=MANIFEST, snapshot_dir=snapshot_dir,
                               stamp=STAMP, record=RECORD, full=node_config().model_verify_full)
        model_fanout.record_verdict(host.name, result)
    if result.get("ok"):
        host.noop(f"{result['files']} files verified ({result['mode']}), {result['manifest_digest']}")
        return
    if wave != assignment.wave:
        host.noop(f"{host.name} needs files: fed by {assignment.source} in wave {assignment.wave + 1}")
        return
    problems = result.get("problems", [])
    if mode == "present":
        yield fail_host(f"{host.name}: model snapshot {snapshot_dir} is not the pinned one (model_sync_mode "
                        f"present fetches nothing): {'; '.join(problems[:20]) or 'not verified'}")
        return
    refetch, extra = result.get("refetch", []), result.get("extra", [])
    known = {e["path"] for e in read_manifest(node_config().model_manifest)["files"]}
    if stray := sorted(set(refetch) - known):  # the node's report is not trusted with paths either
        yield fail_host(f"{host.name}: the node asks for files the manifest does not list: {stray[:5]!r}")
        return
    needed = result.get("refetch_bytes", 0)
    free = host.get_fact(FreeBytes, path=dest_dir)
    if free < needed:
        yield fail_host(f"{host.name}: too little disk for the model at {dest_dir}: {needed} bytes needed, "
                        f"{free} bytes free")
        return
    logger.info(f"{host.name}: model snapshot needs {len(refetch)} file(s) ({needed} bytes): "
                f"{'; '.join(problems[:10])}")
    stale = sorted(set(refetch) | set(extra))
    if stale:  # bad files (the cache layout's blobs, local_dir metadata too) go before the fetch, never
        # through a link out of the snapshot (the verifier's remove_paths)
        yield StringCommand("python3", VERIFIER, "--remove", QuoteString(dest_dir), "--", MANIFEST,
                            QuoteString(snapshot_dir), *(QuoteString(p) for p in stale))
    if refetch:  # parallel rsync streams must not race to create the directories (mkdir: File exists)
        made = {dest_dir, snapshot_dir} | ({f"{dest_dir}/blobs"} if snapshot_dir != dest_dir else set())
        made |= {posixpath.join(snapshot_dir, posixpath.dirname(p)) for p in refetch if "/" in p}
        yield StringCommand("mkdir", "-p", *(QuoteString(d) for d in sorted(made)))
    if refetch and mode == "push" and assignment.source:
        yield FunctionCommand(model_fanout.pull_from_peer, (assignment.source, refetch, MANIFEST, _push), {})
    elif refetch and mode == "push":
        yield FunctionCommand(_push, (refetch,), {})
    elif refetch:
        cfg = node_config()
        # orphaned partial downloads are never resumed by huggingface_hub: clear them first
        yield StringCommand("find", QuoteString(dest_dir), "-name", "'*.incomplete'", "-type", "f", "-delete")
        token = HUB_TOKEN if cfg.model_hub_token_file else ""
        yield StringCommand(f"{cfg.model_hub_venv}/bin/python", HUB_DOWNLOAD, QuoteString(cfg.model_repo),
                            cfg.model_revision, cfg.model_layout, QuoteString(cfg.hub_download_dir),
                            QuoteString(cfg.model_hub_endpoint), token)
    yield StringCommand("python3", VERIFIER, MANIFEST, QuoteString(snapshot_dir), "--stamp", STAMP, "--full",
                        "--record", RECORD)


@deploy("Model snapshot")
def model_snapshot():
    cfg: NodeConfig = node_config()
    if cfg.model_manifest is None:
        fail = f"{host.name}: no trusted manifest (model_manifest): generate one with `python -m " \
               f"deploys.model_manifest {cfg.model_repo} {cfg.model_revision}`, review and commit it"
        refuse(name="Refuse a model without a trusted manifest", message=fail)
        return
    apt_lists_updated(name="Update apt lists when older than a day (waits for a held lock)", cache_time=86400)
    apt.packages(name="Install what the verifier and rsync need", packages=["python3", "rsync"])
    batch = (VERIFIER, MANIFEST, GATE, HUB_DOWNLOAD, f"{cfg.model_dir}/refs/main", model_fanout.PEER_PULL)
    atomic_put(batch=batch, name="Install the snapshot verifier", src=helper_path("model_snapshot/verify_snapshot.py"),
              dest=VERIFIER, user="root", group="root", mode="0755", create_remote_dir=True)
    atomic_put(batch=batch, name="Install the trusted manifest", src=cfg.model_manifest, dest=MANIFEST,
              user="root", group="root", mode="0644", create_remote_dir=True)
    files.directory(name="Create the verify stamp directory", path=posixpath.dirname(STAMP),
                    user="root", group="root", mode="0755")
    atomic_put(batch=batch, name="Install the model start gate", src=StringIO(render_gate(cfg.snapshot_dir)), dest=GATE,
              user="root", group="root", mode="0755")
    if cfg.model_sync_mode == "hub":
        apt.packages(name="Install python3-venv for the hub client", packages=["python3-venv"])
        hub_client_installed(name=f"Install huggingface_hub {HUB_VERSION} (wheels from the control node)",
                             venv=cfg.model_hub_venv)
        atomic_put(batch=batch, name="Install the hub download helper", src=helper_path("model_snapshot/hub_download.py"),
                  dest=HUB_DOWNLOAD, user="root", group="root", mode="0755")
        if cfg.model_hub_token_file:
            secret_file(name="Install the hub token (0600, never printed)", src=cfg.model_hub_token_file,
                        dest=HUB_TOKEN)
    if cfg.model_sync_mode != "hub" or not cfg.model_hub_token_file:  # a token no longer configured leaves the node
        files.file(name="Remove a hub token no longer in the inventory", path=HUB_TOKEN, present=False)
    if cfg.model_layout == "hf_cache":
        atomic_put(batch=batch, name="Write refs/main (offline loads, cache tools)", src=StringIO(cfg.model_revision),
                  dest=f"{cfg.model_dir}/refs/main", user="root", group="root", mode="0644", create_remote_dir=True)
    if cfg.model_sync_mode == "push":
        atomic_put(batch=batch, name="Install the peer pull helper (push fan-out)",
                  src=helper_path("model_snapshot/peer_pull.py"), dest=model_fanout.PEER_PULL,
                  user="root", group="root", mode="0755")
    waves, plan = model_fanout.run_plan()
    for wave in range(waves):
        of = f" (wave {wave + 1} of {waves})" if waves > 1 else ""
        if wave > 0:
            model_fanout.peers_served(
                name=f"Serve the verified model copy to the nodes of wave {wave + 1}",
                wave=wave,
                targets=sorted(t for t, a in plan.items() if a.wave == wave and a.source == host.name),
                root=cfg.model_dir,
                _ignore_errors=True,  # a node that cannot serve is no failure: its targets fall back to the control node
            )
        snapshot_synced(
            name=f"Sync and verify the model snapshot{of}",
            mode=cfg.model_sync_mode,
            snapshot_dir=cfg.snapshot_dir,
            dest_dir=cfg.model_dir,
            wave=wave,
            assignment=plan.get(host.name),
        )
    model_fanout.peers_stopped(name="Stop serving the model to peers (seed daemon, run secret)")
