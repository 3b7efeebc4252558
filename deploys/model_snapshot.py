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
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files

from deploys import model_fanout
from deploys.inventory import node_config, ssh_options
from deploys.ops import atomic_put, fail_host, refuse, secret_file
from deploys.schema import ModelKeys, NodeConfig, defaults_of
from facts.host import FreeBytes
from files.model_snapshot.peer_pull import balanced, parallel_rsync  # the same streams on both sides
from facts.model import ModelVerification

DEFAULTS = defaults_of(ModelKeys)  # keys, defaults and meanings: README "Inventory keys"

VERIFIER = "/usr/local/lib/inference-nodes/verify_snapshot.py"
MANIFEST = "/etc/inference-nodes/model-manifest.json"
STAMP = "/var/lib/inference-nodes/model-verified.json"
RECORD = "/var/lib/inference-nodes/model-deep-verify.json"  # verdict and time of the last full re-hash
GATE = "/usr/local/bin/inference-nodes-model-gate"
HUB_DOWNLOAD = "/usr/local/lib/inference-nodes/hub_download.py"
HUB_TOKEN = "/etc/inference-nodes/secrets/hf-token"
NODE_WHEELS = "/var/cache/inference-nodes/wheels"
HUB_VERSION = importlib.metadata.version("huggingface_hub")  # pinned in pyproject.toml

_control_locks: dict[tuple, gevent.lock.Semaphore] = {}
_control_paths: dict[tuple, str] = {}


def render_gate(snapshot_dir: str) -> str:
    return (
        "#!/bin/sh\n# Managed by inference-nodes: the service's start precondition (no hashing, stamp + stat only).\n"
        f"exec python3 {VERIFIER} --gate {MANIFEST} {snapshot_dir} --stamp {STAMP}\n"
    )


def control_snapshot(cfg: NodeConfig) -> str:
    """The verified control-node copy (downloaded once per run, whichever host asks first)."""
    key = (cfg.model_control_cache, cfg.model_repo, cfg.model_revision)
    with _control_locks.setdefault(key, gevent.lock.Semaphore()):
        if key not in _control_paths:
            cmd = [sys.executable, "-m", "deploys.model_fetch", cfg.model_repo, cfg.model_revision,
                   os.path.abspath(cfg.model_manifest), cfg.model_control_cache, cfg.model_hub_endpoint]
            if cfg.model_hub_token_file:
                cmd += ["--token-file", cfg.model_hub_token_file]
            logger.info(f"control node: fetching {cfg.model_repo}@{cfg.model_revision} into {cfg.model_control_cache}")
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "model_fetch failed")
            _control_paths[key] = proc.stdout.strip().splitlines()[-1]
        return _control_paths[key]


def rsync_plan(cfg: NodeConfig, control_dir: str, refetch: list[str]) -> tuple[str, str, list[str], list[str]]:
    """(source root, node destination, paths relative to the source, rsync flags) for the layout."""
    if cfg.model_layout == "plain":
        return control_dir, cfg.model_root, sorted(refetch), ["-aL"]
    repo_root = os.path.dirname(os.path.dirname(control_dir))  # models--ORG--NAME
    paths = []
    for rel in sorted(refetch):
        link = f"snapshots/{cfg.model_revision}/{rel}"
        paths.append(link)
        paths.append(os.path.relpath(os.path.realpath(os.path.join(control_dir, rel)), repo_root))
    return repo_root, cfg.model_dir, paths, ["-a"]


def _push(state, host, refetch: list[str]) -> bool:
    cfg = node_config(host)
    try:
        control_dir = control_snapshot(cfg)
    except RuntimeError as e:
        host.log_styled(f"control-node download failed: {e}", fg="red", log_func=logger.error)
        return False
    src, dest, paths, flags = rsync_plan(cfg, control_dir, refetch)
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
        host.log_styled(f"rsync to {dest} failed: {' | '.join(failed)}", fg="red", log_func=logger.error)
        return False
    host.log_styled(f"pushed {len(refetch)} file(s), {sum(sizes.values())} bytes, in {len(groups)} stream(s)",
                    log_func=logger.info)
    return True


_wheel_locks: dict[str, gevent.lock.Semaphore] = {}


def control_wheels(pyver: str, machine: str) -> list[str]:
    """huggingface_hub==HUB_VERSION and its dependencies as wheels for the node's Python and CPU, downloaded
    once per (version, arch) into a control-node cache."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                         "inference-nodes", "wheels", f"cp{pyver}-{machine}-hf{HUB_VERSION}")
    with _wheel_locks.setdefault(cache, gevent.lock.Semaphore()):
        if not os.path.exists(os.path.join(cache, ".complete")):
            os.makedirs(cache, exist_ok=True)
            platforms = []
            for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014", "manylinux_2_34", "manylinux_2_31"):
                platforms += ["--platform", f"{tag}_{machine}"]
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", pyver,
                   "--implementation", "cp", *platforms, "-d", cache, f"huggingface_hub=={HUB_VERSION}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"pip download for cp{pyver}/{machine} failed: {proc.stderr.strip()[-400:]}")
            open(os.path.join(cache, ".complete"), "w").close()
    return sorted(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".whl"))


@operation()
def hub_client_installed(venv: str):
    """The pinned huggingface_hub in ``venv`` on the node, installed from wheels the control node pushes.

    + venv: the venv path on the node
    """
    have = host.get_fact(Command, command=f"{venv}/bin/python -c 'import huggingface_hub as h; print(h.__version__)' "
                                          "2>/dev/null || true")
    if have == HUB_VERSION:
        host.noop(f"huggingface_hub {HUB_VERSION} in {venv}")
        return
    node = host.get_fact(Command, command="python3 -c 'import sys, platform; "
                                          "print(f\"{sys.version_info[0]}{sys.version_info[1]} {platform.machine()}\")'")
    pyver, machine = node.split()
    try:
        wheels = control_wheels(pyver, machine)
    except RuntimeError as e:
        yield fail_host(f"{host.name}: {e}")
        return
    yield StringCommand("rm", "-rf", NODE_WHEELS, "&&", "mkdir", "-p", NODE_WHEELS)
    for wheel in wheels:
        yield FileUploadCommand(wheel, f"{NODE_WHEELS}/{os.path.basename(wheel)}")
    yield StringCommand("python3", "-m", "venv", "--clear", venv)
    yield StringCommand(f"{venv}/bin/pip", "install", "-q", "--no-index", "--find-links", NODE_WHEELS,
                        f"huggingface_hub=={HUB_VERSION}")


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
    needed = result.get("refetch_bytes", 0)
    free = host.get_fact(FreeBytes, path=dest_dir)
    if free < needed:
        yield fail_host(f"{host.name}: too little disk for the model at {dest_dir}: {needed} bytes needed, "
                        f"{free} bytes free")
        return
    logger.info(f"{host.name}: model snapshot needs {len(refetch)} file(s) ({needed} bytes): "
                f"{'; '.join(problems[:10])}")
    stale = sorted(set(refetch) | set(extra))
    if stale:  # bad files (the cache layout's blobs, local_dir metadata too) go before the fetch
        script = ('cd "$1" || exit 0; shift; for f in "$@"; do t=$(readlink -f -- "$f"); rm -f -- "$f" '
                  '".cache/huggingface/download/$f.metadata"; case "$t" in "$0"/*) rm -f -- "$t";; esac; done')
        yield StringCommand("sh", "-c", QuoteString(script), QuoteString(dest_dir), QuoteString(snapshot_dir),
                            *(QuoteString(p) for p in stale))
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
        dest = f"{cfg.model_root}/hub" if cfg.model_layout == "hf_cache" else cfg.model_root
        token = HUB_TOKEN if cfg.model_hub_token_file else ""
        yield StringCommand(f"{cfg.model_hub_venv}/bin/python", HUB_DOWNLOAD, QuoteString(cfg.model_repo),
                            cfg.model_revision, cfg.model_layout, QuoteString(dest),
                            QuoteString(cfg.model_hub_endpoint), token)
    yield StringCommand("python3", VERIFIER, MANIFEST, QuoteString(snapshot_dir), "--stamp", STAMP, "--full",
                        "--record", RECORD)


@deploy("Model snapshot", data_defaults=DEFAULTS)
def model_snapshot():
    cfg: NodeConfig = node_config()
    if cfg.model_manifest is None:
        fail = f"{host.name}: no trusted manifest (model_manifest): generate one with `python -m " \
               f"deploys.model_manifest {cfg.model_repo} {cfg.model_revision}`, review and commit it"
        refuse(name="Refuse a model without a trusted manifest", message=fail)
        return
    apt.packages(name="Install what the verifier and rsync need", packages=["python3", "rsync"],
                 update=True, cache_time=86400)
    batch = (VERIFIER, MANIFEST, GATE, HUB_DOWNLOAD, f"{cfg.model_dir}/refs/main", model_fanout.PEER_PULL)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    atomic_put(batch=batch, name="Install the snapshot verifier", src=os.path.join(here, "files/model_snapshot/verify_snapshot.py"),
              dest=VERIFIER, user="root", group="root", mode="0755", create_remote_dir=True)
    atomic_put(batch=batch, name="Install the trusted manifest", src=cfg.model_manifest, dest=MANIFEST,
              user="root", group="root", mode="0644", create_remote_dir=True)
    files.directory(name="Create the verify stamp directory", path=posixpath.dirname(STAMP),
                    user="root", group="root", mode="0755")
    atomic_put(batch=batch, name="Install the model start gate", src=StringIO(render_gate(cfg.snapshot_dir)), dest=GATE,
              user="root", group="root", mode="0755")
    if cfg.model_sync_mode == "hub":
        apt.packages(name="Install python3-venv for the hub client", packages=["python3-venv"],
                     update=True, cache_time=86400)
        hub_client_installed(name=f"Install huggingface_hub {HUB_VERSION} (wheels from the control node)",
                             venv=cfg.model_hub_venv)
        atomic_put(batch=batch, name="Install the hub download helper", src=os.path.join(here, "files/model_snapshot/hub_download.py"),
                  dest=HUB_DOWNLOAD, user="root", group="root", mode="0755")
        if cfg.model_hub_token_file:
            secret_file(name="Install the hub token (0600, never printed)", src=cfg.model_hub_token_file,
                        dest=HUB_TOKEN)
    if cfg.model_layout == "hf_cache":
        atomic_put(batch=batch, name="Write refs/main (offline loads, cache tools)", src=StringIO(cfg.model_revision),
                  dest=f"{cfg.model_dir}/refs/main", user="root", group="root", mode="0644", create_remote_dir=True)
    if cfg.model_sync_mode == "push":
        atomic_put(batch=batch, name="Install the peer pull helper (push fan-out)",
                  src=os.path.join(here, "files/model_snapshot/peer_pull.py"), dest=model_fanout.PEER_PULL,
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
            dest_dir=cfg.model_dir if cfg.model_layout == "hf_cache" else cfg.model_root,
            wave=wave,
            assignment=plan.get(host.name),
        )
    model_fanout.peers_stopped(name="Stop serving the model to peers (seed daemon, run secret)")
