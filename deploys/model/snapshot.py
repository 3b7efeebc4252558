"""Model snapshot: the pinned commit on every node, verified file by file against a trusted manifest.

`push` mode: the control node downloads once (deploys/model/fetch.py), verifies that copy, and rsyncs
to each node only what the node's own verifier reports missing or bad, in parallel streams
(deploys/model/push.py); past `model_push_fanout` nodes, verified nodes feed the next ones
(deploys/model/fanout.py). `hub` mode: each node downloads with the pinned huggingface_hub in a venv the
deploy manages (deploys/model/hub.py: wheels pushed from the control node, so nodes need no package index). `present` mode only verifies. Either way the node's
verifier (files/model_snapshot/verify_snapshot.py, stdlib only) writes the stamp that
/usr/local/bin/inference-nodes-model-gate checks before the service starts.
"""

from __future__ import annotations

import hashlib
import posixpath
import time
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy
from pyinfra.facts.files import Directory, File, FileContents

from deploys.model import fanout as model_fanout, hub as model_hub, push as model_push, swarm as model_swarm
from deploys.apt_state import APT_READS, apt_lists_updated
from deploys.run.held import release_held
from deploys.run.reads import expect, operation, read
from deploys.inventory import cluster_member_names, node_config
from deploys.ops import directory_present, file_absent, packages_installed, atomic_put, cluster_all_here, fail_host, refuse, secret_file, shown, until_marker_command
from deploys.run.state import this_run
from deploys.schema import NodeConfig
from facts.host import FreeBytes, ManagedFiles, NodeResources
from facts.model import ModelVerification, SeedDaemon
from files import helper_path
from files.model_snapshot.snapshot_manifest import KEPT_TREES, OWNER_MARKER, read_manifest
from files.model_snapshot.verify_snapshot import marker_until
from files.model_snapshot.sync_progress import PROGRESS_EVERY_S


NODE_LIB = "/usr/local/lib/inference-nodes"
# files/model_snapshot/ modules the verifier is made of, installed side by side in NODE_LIB (run as a file, it
# imports the others from its own folder); the script last, so a run killed in between never leaves a verifier
# whose modules are not there yet
VERIFIER_FILES = ("snapshot_manifest.py", "snapshot_hashing.py", "snapshot_releases.py", "sync_progress.py",
                  "verify_snapshot.py")  # sync_progress: the hub download's and the peer pull's progress line
VERIFIER_PATHS = tuple(f"{NODE_LIB}/{name}" for name in VERIFIER_FILES)  # where the model step installs them
VERIFIER = f"{NODE_LIB}/verify_snapshot.py"
PRUNER = f"{NODE_LIB}/snapshot_releases.py"  # model commits beyond the kept releases (run by the service deploy)
MANIFEST = "/etc/inference-nodes/model-manifest.json"
STAMP = "/var/lib/inference-nodes/model-verified.json"
RECORD = "/var/lib/inference-nodes/model-deep-verify.json"  # verdict and time of the last full re-hash
GATE = "/usr/local/bin/inference-nodes-model-gate"
# written before another commit's manifest is installed, removed when the node's switch ends (deploys/service/
# switch.py): the scheduled deep verify skips while it counts (`model_upgrade_marker_h`)
UPGRADE_MARKER = "/var/lib/inference-nodes/model-upgrade.json"
COMMITS_DIR = "/var/lib/inference-nodes/commits"  # a commit staged beside the live release, until its switch


@dataclass(frozen=True)
class ModelState:
    """Where a commit's trusted manifest, verify stamp and deep-verify record are on the node."""

    manifest: str
    stamp: str
    record: str


LIVE = ModelState(MANIFEST, STAMP, RECORD)  # the release that serves: what the start gate and the deep verify read


def staged_state(revision: str) -> ModelState:
    """Another commit's, synced and verified beside the live release until the switch installs it
    (deploys/service/release.py ``model_release_switched``)."""
    return ModelState(*(f"{COMMITS_DIR}/{revision}/{name}" for name in ("manifest.json", "verified.json",
                                                                         "deep-verify.json")))


def manifest_sha1(cfg: NodeConfig) -> str | None:
    """The inventory's trusted manifest as ManagedFiles names a file's content (sha1; None: none, refused)."""
    if cfg.model_manifest is None:
        return None
    with open(cfg.model_manifest, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


def model_state(cfg: NodeConfig, live_manifest: dict | None) -> ModelState:
    """Where the model step installs and verifies the inventory's commit: staged beside the live release when that
    is another commit's (``live_manifest``: ManagedFiles' entry of the live manifest), so the live release keeps its
    manifest, stamp and gate until its switch and can restart meanwhile; else in place (a repair of what serves, a
    live manifest lost, or a first sync: no release to keep)."""
    other = live_manifest is not None and live_manifest.get("sha1") != manifest_sha1(cfg)
    return staged_state(cfg.model_revision) if other else LIVE


def kept_tree(cfg: NodeConfig, revision: str) -> str | None:
    """Where a `plain` layout keeps a commit as a tree of hard links beside the live directory: a release's, to roll
    back to, and the commit staged for the next switch (None: `hf_cache` keeps each commit in its own snapshot)."""
    return None if cfg.model_layout == "hf_cache" else f"{cfg.model_dir}/{KEPT_TREES}/{revision}"


def staged_tree(cfg: NodeConfig, state: ModelState, fanout_waves: int) -> str | None:
    """Where a `plain` layout syncs another commit while the live directory keeps serving the old one: its kept
    tree, seeded with the live files the new commit keeps (hard links: only changed bytes are fetched), linked over
    the live directory at the switch. None: in place (`hf_cache` stages in its own snapshot; a repair of what serves
    or a first sync has no release to keep; a run with a node-to-node fan-out still syncs in place, its peers serving
    their live directories)."""
    if state == LIVE or cfg.model_layout != "plain" or (cfg.model_sync_mode == "push" and fanout_waves > 1):
        return None
    return kept_tree(cfg, cfg.model_revision)


def unchanged_bytes(cfg: NodeConfig, live_manifest: dict) -> int:
    """Bytes of the inventory's commit that a `plain` directory holding another commit already has: the files whose
    path, size and hash the live manifest (``live_manifest``, as the node keeps it) shares with the inventory's. The
    sync links those from the live directory (``tree_seeded``) or keeps them in place, and fetches the others. Sizes
    are the inventory's trusted manifest's; 0 for `hf_cache` (a snapshot per commit) or without a manifest."""
    if cfg.model_layout != "plain" or cfg.model_manifest is None or not isinstance(live_manifest.get("files"), list):
        return 0
    live = {(e.get("path"), e.get("size"), e.get("sha256"), e.get("git_sha1"))
            for e in live_manifest["files"] if isinstance(e, dict)}
    return sum(e["size"] for e in read_manifest(cfg.model_manifest)["files"]
               if (e["path"], e["size"], e.get("sha256"), e.get("git_sha1")) in live)


HUB_DOWNLOAD = f"{NODE_LIB}/hub_download.py"
HUB_TOKEN = "/etc/inference-nodes/secrets/hf-token"


def owner_marker(model_dir: str) -> str:
    return f"{model_dir}/{OWNER_MARKER}"


OWNER_TEXT = ("Managed by inference-nodes: this directory holds one model snapshot, and the toolkit deletes files in "
              "it that the snapshot's manifest does not list.\n")


def owner_commands(dest_dir: str, extra: list[str], owned: bool):
    """The model directory is the toolkit's before anything in it is deleted or fetched: it carries the owner
    marker, or holds nothing the manifest does not list (then it is marked now: absent, empty, or the snapshot
    alone; a converge with nothing to fetch writes nothing).
    A directory with other files and no marker (`model_root` pointed at a shared one) fails the host with
    nothing deleted. Yields the commands (the marker write, or the failure)."""
    if owned:
        return
    marker = owner_marker(dest_dir)
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        yield fail_host(f"{host.name}: {dest_dir} holds {len(extra)} file(s) the model's manifest does not list "
                        f"({shown}) and no {OWNER_MARKER}: the sync deletes such files, so only in a directory the "
                        f"toolkit owns. Nothing was deleted. Point model_root at a directory of its own, or, if this "
                        f"directory holds this model alone, create {marker} and run again")
        return
    yield StringCommand("mkdir", "-p", QuoteString(dest_dir), "&&", "printf", "'%s'", QuoteString(OWNER_TEXT), ">",
                        QuoteString(f"{marker}.tmp"), "&&", "mv", "-f", QuoteString(f"{marker}.tmp"),
                        QuoteString(marker))


def render_gate(snapshot_dir: str) -> str:
    return (
        "#!/bin/sh\n# Managed by inference-nodes: the service's start precondition (no hashing, stamp + stat only).\n"
        f"exec python3 {VERIFIER} --gate {MANIFEST} {snapshot_dir} --stamp {STAMP}\n"
    )


def verdict_reads(cfg: NodeConfig, state: ModelState, snapshot_dir: str) -> dict:
    """ModelVerification's arguments for the files of ``state``'s commit in ``snapshot_dir`` (one read per run)."""
    return dict(verifier=VERIFIER, manifest=state.manifest, snapshot_dir=snapshot_dir, stamp=state.stamp,
                record=state.record, full=cfg.model_verify_full, stale_after_s=max_age_s(cfg),
                max_rate=cfg.model_deep_verify_max_mbps)


@operation()
def tree_seeded(state: ModelState, tree: str, live: str):
    """Before another commit is synced into its staged tree (``staged_tree``), the live files it keeps are linked
    in (same path, same size; the staged verify hashes them): the sync then fetches, and the free-space check
    counts, only the changed files, and the live directory is not touched until the switch.

    + state: the staged commit's manifest, stamp and record
    + tree: the staged tree
    + live: the live directory (``NodeConfig.snapshot_dir``)
    """
    result = read(host, ModelVerification, **verdict_reads(node_config(), state, tree), plan=True)
    if result.get("ok") or not result.get("refetch"):
        host.noop(f"the staged tree {tree} lacks no file")
        return
    yield StringCommand("python3", VERIFIER, state.manifest, QuoteString(tree), "--seed-from", QuoteString(live))


@operation()
def snapshot_synced(mode: str, snapshot_dir: str, dest_dir: str, state: ModelState = LIVE, wave: int = 0,
                    assignment: model_fanout.Assignment | None = None, batch: tuple[str, ...] = ()):
    """Verify the node's snapshot; unless `present`, fetch exactly the missing/bad files, then verify in full.

    + mode: push, swarm, hub or present
    + snapshot_dir: the files of the pinned commit on the node
    + dest_dir: where fetched files land (free disk is checked there first)
    + state: its manifest, stamp and record (``model_state``: the live ones, or staged beside them)
    + wave: the fan-out wave this operation is (0-based); the first one also records what every node needs
    + assignment: this node's wave and source in a `push` fan-out (None: wave 0 from the control node)
    + batch: the model deploy's managed files (the owner marker among them), read in one round trip
    """
    assignment = assignment or model_fanout.Assignment(0, None)
    if wave not in (0, assignment.wave):
        host.noop(f"{host.name} is synced in wave {assignment.wave + 1}")
        return
    result = model_fanout.recorded_verdict(host.name) if wave > 0 else None  # unchanged since the first wave
    if result is None:
        # the plan writes and hashes nothing (a plan that re-hashed would also rewrite the stamp of the snapshot that
        # is serving); where the stamp cannot vouch, the hashing verdict is read when the run executes
        verdict = verdict_reads(node_config(), state, snapshot_dir)
        result = read(host, ModelVerification, **verdict, plan=True)
        if result.get("needs_hash") and this_run().is_executing:
            result = read(host, ModelVerification, **verdict)
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
    free = read(host, FreeBytes, path=dest_dir)
    if free < needed:
        yield fail_host(f"{host.name}: too little disk for the model at {dest_dir}: {needed} bytes needed, "
                        f"{free} bytes free")
        return
    logger.info(f"{host.name}: model snapshot needs {len(refetch)} file(s) ({needed} bytes): "
                f"{'; '.join(problems[:10])}")
    # the directory is the toolkit's before anything in it is deleted or written
    marker = owner_marker(dest_dir)
    owned = read(host, ManagedFiles, paths=batch if marker in batch else (marker,)).get(marker) is not None
    yield from owner_commands(dest_dir, extra, owned)
    if not owned and extra:
        return  # the host failed, nothing deleted
    stale = sorted(set(refetch) | set(extra))
    if stale:  # bad files (the cache layout's blobs, local_dir metadata too) go before the fetch, never
        # through a link out of the snapshot (the verifier's remove_paths)
        yield StringCommand("python3", VERIFIER, "--remove", QuoteString(dest_dir), "--", state.manifest,
                            QuoteString(snapshot_dir), *(QuoteString(p) for p in stale))
    if refetch:  # parallel rsync streams must not race to create the directories (mkdir: File exists)
        made = {dest_dir, snapshot_dir} | ({f"{dest_dir}/blobs"} if snapshot_dir != dest_dir else set())
        made |= {posixpath.join(snapshot_dir, posixpath.dirname(p)) for p in refetch if "/" in p}
        yield StringCommand("mkdir", "-p", *(QuoteString(d) for d in sorted(made)))
    if refetch and mode == "swarm" and (assignment.source or node_config().model_swarm_seed == "control"):
        yield FunctionCommand(model_swarm.swarm_fetch, (assignment.source, refetch, snapshot_dir, state.manifest), {})
    elif refetch and mode == "push" and assignment.source:
        yield FunctionCommand(model_fanout.pull_from_peer, (assignment.source, refetch, state.manifest), {})
    elif refetch and mode in ("push", "swarm"):  # the swarm's first node is fed as in `push` mode
        yield FunctionCommand(model_push.push_from_control, (refetch, dest_dir), {})
    elif refetch:
        cfg = node_config()
        # orphaned partial downloads are never resumed by huggingface_hub: clear them first
        yield StringCommand("find", QuoteString(dest_dir), "-name", "'*.incomplete'", "-type", "f", "-delete")
        token = HUB_TOKEN if cfg.model_hub_token_file else ""
        yield shown(StringCommand(f"{cfg.model_hub_venv}/bin/python", HUB_DOWNLOAD, "--expect-bytes", str(needed),
                                  QuoteString(cfg.model_repo), cfg.model_revision,
                                  cfg.model_layout, QuoteString(dest_dir if cfg.model_layout == "plain" else
                                                                cfg.hub_download_dir),
                                  QuoteString(cfg.model_hub_endpoint), token))
    rate = node_config().model_deep_verify_max_mbps
    yield shown(StringCommand("python3", VERIFIER, state.manifest, QuoteString(snapshot_dir), "--stamp", state.stamp,
                              "--full", "--record", state.record, "--every", str(int(PROGRESS_EVERY_S)),
                              *(["--max-rate", str(rate)] if rate else [])))


PERIOD_DAYS = {"daily": 1, "weekly": 7, "monthly": 31}
# a long run; a node down through its window is not caught up at boot (Persistent=false: vLLM loads the same bytes
# then), but by the next converge, which re-hashes in full once the record is older than this
SLACK_S = 12 * 3600


def max_age_s(cfg: NodeConfig) -> int:
    """How old the last full re-hash may be: beyond it the audit fails, and a converge re-hashes in full."""
    return PERIOD_DAYS[cfg.model_deep_verify_every] * 86400 + cfg.model_deep_verify_window_h * 3600 + SLACK_S


def resources_args(cfg: NodeConfig) -> dict:
    """NodeResources' arguments. The `plain` layout has one directory for every commit: its stamp says which commit
    the bytes there are (`hf_cache` has a directory per commit, and keeps the others' snapshots beside)."""
    args = {"model_root": cfg.model_root, "snapshot_dir": cfg.snapshot_dir}
    return args if cfg.model_layout == "hf_cache" else {**args, "revision": cfg.model_revision, "stamp": STAMP}


def upgrade_starts(installed: dict | None, manifest: bytes) -> bool:
    """A converge starts a model upgrade on a node when it replaces the node's installed manifest with another
    (none installed: a first sync, no release serves to protect)."""
    return installed is not None and installed["sha1"] != hashlib.sha1(manifest).hexdigest()


@operation()
def upgrade_marked(manifest: str, hours: int, batch: tuple[str, ...]):
    """Mark the node before another commit's manifest is installed: until the switch ends the manifest describes
    files that are not serving yet, and the scheduled deep verify (deploys/model/integrity.py) would find the live
    ones bad and stop the service. The mark holds its own bound, so a killed converge's mark stops counting.

    + manifest: the local trusted manifest about to be installed
    + hours: the mark's bound (`model_upgrade_marker_h`)
    + batch: the managed files read in one round trip (MANIFEST among them)
    """
    installed = read(host, ManagedFiles, paths=batch).get(MANIFEST)
    with open(manifest, "rb") as f:
        if not upgrade_starts(installed, f.read()):
            host.noop("no other commit's manifest to install")
            return
    # a converge that resumes the same upgrade (the model step run again before the switch) leaves a mark that
    # still counts for more than half its bound as it is: a second run changes nothing
    if (left := marker_left_s(read(host, FileContents, path=UPGRADE_MARKER))) > hours * 3600 / 2:
        host.noop(f"the upgrade mark counts for {left / 3600:.1f} h more")
        return
    yield StringCommand("sh", "-c", QuoteString(until_marker_command(UPGRADE_MARKER, hours * 3600)))


def marker_left_s(lines: list[str] | None, now: float | None = None) -> float:
    """How long a bounded marker (``{"until": epoch}``, FileContents' lines) still counts: 0 when absent, expired or
    unreadable."""
    until = marker_until("\n".join(lines or []))  # the deep verify's own reading of the mark
    return 0.0 if until is None else max(0.0, until - (time.time() if now is None else now))


def model_files(cfg: NodeConfig) -> tuple[str, ...]:
    """The model step's managed files, read in one round trip; preflight reads them with its own facts, so the
    step's choice between the live place and a staged one (``model_state``, made while the run is planned) costs
    no command of its own."""
    return (*VERIFIER_PATHS, MANIFEST, staged_state(cfg.model_revision).manifest,
            HUB_DOWNLOAD, model_fanout.PEER_PULL, model_swarm.SWARM, owner_marker(cfg.model_dir))


@operation()
def cluster_model_changes_whole(cluster: str, members: list[str], held: str | None, revision: str):
    """A multi-node cluster on the `plain` layout changes its model commit as one: the sync rewrites the directory
    every start loads, so a member would restart onto the new commit while one outside this run (or failed before
    this step) keeps the old. Then every member in the run fails before its directory or manifest changes.

    + cluster: the cluster's name
    + members: the host names of every member
    + held: the commit the directory's verify stamp vouches for (None: none verified yet)
    + revision: the commit the inventory asks for
    """
    if len(members) < 2 or held is None or held == revision:
        host.noop("no multi-node model commit change")
        return
    yield FunctionCommand(cluster_all_here, (cluster, members, f" (model commit {held[:12]} -> {revision[:12]})"), {})


@deploy("Model snapshot")
def model_snapshot():
    cfg: NodeConfig = node_config()
    if release_held():  # the model commit is the release's: it stays as it is (deploys/run/held.py)
        return
    if cfg.model_manifest is None:
        fail = f"{host.name}: no trusted manifest (model_manifest): generate one with `python -m " \
               f"deploys.model.manifest {cfg.model_repo} {cfg.model_revision}`, review and commit it"
        refuse(name="Refuse a model without a trusted manifest", message=fail)
        return
    apt_lists_updated(name="Update apt lists when older than a day (waits for a held lock)", cache_time=86400)
    packages_installed(name="Install what the verifier and rsync need", packages=["python3", "rsync"])
    batch = model_files(cfg)
    # not the verification itself: it may re-hash every file, and would run twice if a command ran in between
    expect([*APT_READS, (ManagedFiles, {"paths": batch}), (Directory, {"path": posixpath.dirname(STAMP)}),
            (File, {"path": HUB_TOKEN}), (SeedDaemon, {"unit": model_fanout.SEED_UNIT, "secret_dir": model_fanout.SEED_DIR}),
            *model_swarm.swarm_reads(cfg)])
    if cfg.model_layout == "plain":  # the fact preflight read: no round trip of its own
        held = read(host, NodeResources, **resources_args(cfg)).get("model_held_commit")
        cluster_model_changes_whole(name="Change a multi-node cluster's model commit only as a whole",
                                    cluster=cfg.cluster_name, members=cluster_member_names(), held=held, revision=cfg.model_revision)
    for name, dest in zip(VERIFIER_FILES, VERIFIER_PATHS):
        atomic_put(batch=batch, name=f"Install the snapshot verifier ({name})",
                  src=helper_path(f"model_snapshot/{name}"), dest=dest, user="root", group="root",
                  mode="0755" if dest == VERIFIER else "0644", create_remote_dir=True)
    upgrade_marked(name="Mark a model upgrade in progress (the scheduled deep verify waits for the switch)",
                   manifest=cfg.model_manifest, hours=cfg.model_upgrade_marker_h, batch=batch)
    # the live release keeps its manifest, stamp and start gate until its switch: another commit is staged beside
    # (and in the `plain` layout, its files in a tree beside the live directory)
    state = model_state(cfg, read(host, ManagedFiles, paths=batch).get(MANIFEST))
    waves, plan = model_fanout.run_plan()
    tree = staged_tree(cfg, state, waves)
    atomic_put(batch=batch, name="Install the trusted manifest (another commit's: staged beside the live one)",
              src=cfg.model_manifest, dest=state.manifest, user="root", group="root", mode="0644",
              create_remote_dir=True)
    directory_present(name="Create the verify stamp directory", path=posixpath.dirname(STAMP),
                    user="root", group="root", mode="0755")
    if cfg.model_sync_mode == "hub":
        packages_installed(name="Install python3-venv for the hub client", packages=["python3-venv"])
        model_hub.hub_client_installed(name=f"Install huggingface_hub {model_hub.HUB_VERSION} (wheels from the control node)",
                             venv=cfg.model_hub_venv)
        atomic_put(batch=batch, name="Install the hub download helper", src=helper_path("model_snapshot/hub_download.py"),
                  dest=HUB_DOWNLOAD, user="root", group="root", mode="0755")
        if cfg.model_hub_token_file:
            secret_file(name="Install the hub token (0600, never printed)", src=cfg.model_hub_token_file,
                        dest=HUB_TOKEN)
    if cfg.model_sync_mode != "hub" or not cfg.model_hub_token_file:  # a token no longer configured leaves the node
        file_absent(name="Remove a hub token no longer in the inventory", path=HUB_TOKEN)
    if cfg.model_sync_mode == "push":
        atomic_put(batch=batch, name="Install the peer pull helper (push fan-out)",
                  src=helper_path("model_snapshot/peer_pull.py"), dest=model_fanout.PEER_PULL,
                  user="root", group="root", mode="0755")
    if cfg.model_sync_mode == "swarm":
        packages_installed(name="Install the swarm's engine (python3-libtorrent)", packages=["python3-libtorrent"])
        atomic_put(batch=batch, name="Install the model swarm helper", src=helper_path("model_snapshot/swarm.py"),
                   dest=model_swarm.SWARM, user="root", group="root", mode="0755")
    if tree:
        tree_seeded(name="Link the live files the new commit keeps into its staged tree", state=state, tree=tree,
                    live=cfg.snapshot_dir)
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
            model_swarm.swarm_seeded(
                name=f"Seed the model swarm for the nodes of wave {wave + 1}",
                wave=wave, directory=tree or cfg.snapshot_dir, manifest=state.manifest,
                _ignore_errors=True,  # a seed that cannot start is no failure: its targets fall back to the control node
            )
        snapshot_synced(
            name=f"Sync and verify the model snapshot{of}",
            mode=cfg.model_sync_mode,
            snapshot_dir=tree or cfg.snapshot_dir,
            dest_dir=tree or cfg.model_dir,
            state=state,
            wave=wave,
            assignment=plan.get(host.name),
            batch=batch,
        )
    model_fanout.peers_stopped(name="Stop serving the model to peers (seed daemon, run secret)")
    model_swarm.swarm_stopped(name="Stop the model swarm once every node verified its copy")
