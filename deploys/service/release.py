"""Releases on a node: what the inventory asks the service to run (``release_of``), where a head keeps the release
it last passed the serving gate with and the gate's last verdict, the last good release's files (saved when a
release passes, put back by a rollback), the history pruning keeps the newest of, and the record of a release that
failed (its pure parts: the refusal itself is deploys/service/failed_release.py)."""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import time
from datetime import datetime, timezone

from deploys.model import integrity as model_integrity
from deploys.model.snapshot import COMMITS_DIR, GATE, MANIFEST, PRUNER, RECORD, STAMP, VERIFIER, ModelState, kept_tree
from deploys.ops import content_fingerprint, files_fingerprint_command, follow_up_stamp
from deploys.run.held import release_api_of
from deploys.schema import NodeConfig
from deploys.service.unit import QUADLET_STAMP, UNIT_DIR, served_model_name, service_env_path


def gate_record_path(cfg: NodeConfig) -> str:
    """Where a head keeps the release its service last passed the serving gate with (persistent: the last good
    release outlives a reboot)."""
    return f"/var/lib/inference-nodes/{cfg.container_name}.gate-passed.json"


def gate_last_path(cfg: NodeConfig) -> str:
    """Where a head keeps the verdict of the last serving gate it ran, passed or failed, with its time and release
    (what the node's metrics report: deploys/monitoring/node.py)."""
    return f"/var/lib/inference-nodes/{cfg.container_name}.gate-last.json"


def release_of(cfg: NodeConfig, unit_fingerprint: str) -> dict:
    """What the service runs, as the inventory asks for it: the image (by digest), the model commit and its
    manifest, the rendered unit and environment. ``release`` names the whole."""
    manifest = None
    if cfg.model_manifest:
        with open(cfg.model_manifest, "rb") as f:
            manifest = hashlib.sha256(f.read()).hexdigest()
    return {"release": content_fingerprint(unit_fingerprint, manifest or "")[:16], "image": cfg.image_ref,
            "model_repo": cfg.model_repo, "model_revision": cfg.model_revision, "manifest_sha256": manifest,
            "unit": unit_fingerprint, **release_api(cfg)}


def release_api(cfg: NodeConfig) -> dict:
    """Where a release answers and under which name: kept with it, so a rollback gates the release it restored
    where that one listens (a failed release may have changed the port, address or name)."""
    return {"api_bind_address": cfg.api_bind_address, "api_port": cfg.api_port, "engine_port": cfg.engine_port,
            "served_model_name": served_model_name(cfg)}


def as_released(cfg: NodeConfig, model: str, release: dict) -> tuple[NodeConfig, str]:
    """``cfg`` and the served name as ``release`` recorded them (a release kept before they were recorded: as now)."""
    api = release_api_of(release)
    return cfg.model_copy(update=api), release.get("served_model_name") or model


RELEASES_DIR = "/var/lib/inference-nodes/releases"


def release_files(cfg: NodeConfig) -> list[tuple[str, str, str]]:
    """(name, path, mode) of every node file a release consists of beside its image and snapshot: what a rollback
    puts back (the unit and its environments, the model's manifest, verify stamp, deep-verify record, start gate
    and deep-verify service, which name the snapshot the release serves)."""
    out = [("unit.container", f"{UNIT_DIR}/{cfg.container_name}.container", "0644"),
           ("service.env", service_env_path(cfg), "0600"), ("fabric.env", cfg.fabric_env_file, "0600"),
           ("model-manifest.json", MANIFEST, "0644"), ("model-verified.json", STAMP, "0644"),
           ("model-deep-verify.json", RECORD, "0644"), ("model-gate", GATE, "0755"),
           ("model-verify.service", f"{model_integrity.UNIT_DIR}/{model_integrity.UNIT}.service", "0644")]
    if cfg.model_layout == "hf_cache":
        out.append(("refs-main", f"{cfg.model_dir}/refs/main", "0644"))
    return out


def good_release_dir(cfg: NodeConfig) -> str:
    """The last good release of this node's service: a copy of its ``release_files`` taken when it passed the gate."""
    return f"{RELEASES_DIR}/{cfg.container_name}/good"


def previous_release_dir(cfg: NodeConfig) -> str:
    """The good release before the last: moved aside when another release passed the gate, what
    deploys/roll_back.py puts back (a rollout's `--abort`)."""
    return f"{RELEASES_DIR}/{cfg.container_name}/previous"


def release_history_path(cfg: NodeConfig) -> str:
    """The releases that passed the gate on this node, newest last (what pruning keeps the newest of)."""
    return f"{RELEASES_DIR}/{cfg.container_name}/history.json"


HISTORY_KEYS = ("release", "image", "model_repo", "model_revision", "manifest_sha256", "unit", "passed_at", "bench")
def save_good_command(cfg: NodeConfig, passed: dict) -> str:
    """Keep the release that just passed the gate as the last good one: a `plain` layout's model commit linked
    into its kept tree; the release's files copied whole into a new directory (0700), then swapped in by rename,
    so a run killed half-way leaves the previous good release; the good release it replaces, when another one, kept
    as the previous (``previous_release_dir``: copied, then renamed in); the release appended to the history."""
    good, previous = good_release_dir(cfg), previous_release_dir(cfg)
    new, old, aside = f"{good}.new", f"{good}.old", f"{previous}.new"
    copies = " && ".join(f"{{ [ ! -e {shlex.quote(path)} ] || cp -p {shlex.quote(path)} {new}/{name}; }}"
                         for name, path, _ in release_files(cfg))  # a file the node never had stays absent
    record = shlex.quote(json.dumps(passed, sort_keys=True) + "\n")
    entry = shlex.quote(json.dumps({k: passed.get(k) for k in HISTORY_KEYS}, sort_keys=True))
    same = shlex.quote(f'"release": {json.dumps(passed.get("release"))}')  # (release.json: sorted keys, json.dumps)
    keep_previous = (f"{{ [ ! -f {good}/release.json ] || grep -qF {same} {good}/release.json || {{ rm -rf {aside} && "
                     f"cp -a {good} {aside} && rm -rf {previous} && mv {aside} {previous}; }}; }}")
    tree = kept_tree(cfg, passed["model_revision"])
    keep = (f"python3 {VERIFIER} {MANIFEST} {shlex.quote(tree)} --link-from {shlex.quote(cfg.snapshot_dir)} "
            f"> /dev/null && " if tree else "")
    return (f"{keep}umask 077 && rm -rf {new} {old} && mkdir -p {new} && {copies} && printf %s {record} > {new}/release.json"
            f" && {keep_previous} && {{ [ ! -e {good} ] || mv {good} {old}; }} && mv {new} {good} && rm -rf {old} && "
            f"python3 {PRUNER} record {release_history_path(cfg)} {entry}")


def restore_good_command(cfg: NodeConfig, good: dict, source: str | None = None) -> str:
    """Put the last good release ``good`` back (from ``source``: ``good_release_dir`` unless another is named): its
    files (each through a private temporary and a rename), a `plain` layout's model commit linked back from its kept
    tree; then reload the unit and restart the service."""
    dest = source or good_release_dir(cfg)
    installs = " && ".join(f"{{ [ ! -e {dest}/{name} ] || {{ install -m {mode} {dest}/{name} {shlex.quote(path)}.rollback && "
                           f"mv -f {shlex.quote(path)}.rollback {shlex.quote(path)}; }}; }}"
                           for name, path, mode in release_files(cfg))
    tree = kept_tree(cfg, str(good.get("model_revision")))
    relink = (f"python3 {VERIFIER} {dest}/model-manifest.json {shlex.quote(cfg.snapshot_dir)} --link-from "
              f"{shlex.quote(tree)} > /dev/null && " if tree else "")
    unit = f"{UNIT_DIR}/{cfg.container_name}.container"
    reloaded = follow_up_stamp(QUADLET_STAMP)  # the generator ran after the unit held these contents (follow_up_done)
    return (f"{relink}umask 077 && {installs} && systemctl daemon-reload && umask 022 && mkdir -p {posixpath.dirname(reloaded)} && "
            f"{files_fingerprint_command((unit,))} > {reloaded}.tmp && mv -f {reloaded}.tmp {reloaded} && "
            f"systemctl restart {cfg.container_name}.service")


def model_switch_command(staged: ModelState, live_dir: str | None = None, tree: str | None = None) -> str:
    """Shell: the staged commit becomes the live model release, behind the closed door just before the restart: a
    `plain` layout's live directory linked from the staged tree where the staged stamp vouches for that tree (the
    model step synced it there: ``staged_tree``; else it synced in place), then its verify stamp and deep-verify
    record, then its manifest (each through a temporary and a rename; the manifest last, so a run killed in between
    leaves the live manifest another commit's and the next converge switches again), then the staged state goes.
    Refused, changing nothing, when the commit was not verified."""
    check = (f"{{ [ -f {staged.manifest} ] && [ -f {staged.stamp} ]; }} || {{ echo 'the new model commit was not "
             f"verified ({posixpath.dirname(staged.stamp)}): its sync must pass first' >&2; exit 1; }}")
    if live_dir and tree:
        t = shlex.quote(tree)
        check += (f" && {{ ! [ -d {t} ] || ! python3 {VERIFIER} {staged.manifest} {t} --gate --stamp {staged.stamp} "
                  f"> /dev/null 2>&1 || python3 {VERIFIER} {staged.manifest} {shlex.quote(live_dir)} --link-from {t} "
                  f"> /dev/null; }}")
    record = (f"{{ if [ -f {staged.record} ]; then install -m 0644 {staged.record} {RECORD}.switch && "
              f"mv -f {RECORD}.switch {RECORD}; else rm -f {RECORD}; fi; }}")
    installs = " && ".join(f"install -m 0644 {src} {dest}.switch && mv -f {dest}.switch {dest}"
                           for src, dest in ((staged.stamp, STAMP), (staged.manifest, MANIFEST)))
    return f"{check} && mkdir -p {posixpath.dirname(STAMP)} && {record} && {installs} && rm -rf {COMMITS_DIR}"


def verdict_command(cfg: NodeConfig, passed: bool, of: dict) -> str:
    """Shell: the last serving gate's verdict on this head, with its time and the release it ran against (what the
    node's metrics report: deploys/monitoring/node.py)."""
    return json_file_command(gate_last_path(cfg), {"ok": passed, "at": int(time.time()), "release": of.get("release"),
                                                   "image": of.get("image"), "model_revision": of.get("model_revision")})


def release_named(release: dict) -> str:
    revision = str(release.get("model_revision") or "?")
    return f"release {release.get('release')} (image {release.get('image')}, {release.get('model_repo')}@{revision[:12]})"


STATE_DIR = "/var/lib/inference-nodes"


def failed_release_path(cfg: NodeConfig) -> str:
    return f"{STATE_DIR}/{cfg.container_name}.failed-release.json"


def failure_record(release: dict, why: str) -> dict:
    """What a member keeps of a failed release: which, when, and the first line of why (no journal)."""
    reason = why.strip().splitlines()[0] if why.strip() else "failed"
    return {"release": release.get("release"), "image": release.get("image"),
            "model_repo": release.get("model_repo"), "model_revision": release.get("model_revision"),
            "failed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "reason": reason[:300]}


def json_file_command(path: str, data: dict) -> str:
    """Shell: ``data`` as the JSON file ``path`` on a node, replaced whole (a temporary renamed over it)."""
    text = shlex.quote(json.dumps(data, sort_keys=True) + "\n")
    return f"mkdir -p {posixpath.dirname(path)} && printf %s {text} > {path}.tmp && mv -f {path}.tmp {path}"


def record_command(cfg: NodeConfig, record: dict) -> str:
    """Shell: keep ``record`` as this member's failed release."""
    return json_file_command(failed_release_path(cfg), record)


def forget_command(cfg: NodeConfig) -> str:
    return f"rm -f {failed_release_path(cfg)}"
