"""`push` mode fan-out: past `model_push_fanout` nodes, nodes holding a verified copy feed the next ones.

A group is the push-mode hosts of this run that want the same files at the same place (repo, commit, layout,
snapshot path). Wave 1: the control node feeds the group's first F nodes (F = `model_push_fanout`). Wave k: every
node fed before serves F more, so holders multiply by F+1 per wave and the control node's uplink carries F
copies per group however many nodes it has (plus any fallback below).

pyinfra must run each operation on every host before the next (its default): under `--serial` or `--no-wait`
the waves lose their order and targets fall back to the control node, with a warning each.

A serving node runs a transient, read-only rsync daemon (`systemd-run`, chrooted, as nobody, on its peer address)
with a secret made for this run only: 0600 under /run, never printed, removed when the run ends. Neither outlives a
killed run for long: the daemon stops after SEED_MAX_SECONDS at most, and the secret directory is its unit's
RuntimeDirectory=, which systemd removes whenever the unit stops, however it stops. The daemon accepts packets only
from its own address and its targets' peer addresses (systemd's IPAddressDeny=any + IPAddressAllow=); where one of
those is a host name rather than an IP address it cannot be listed, and the run says so: the per-run password is
then the only gate. A target pulls inside a transient unit of its own that removes the target's copy of the
password when it ends, even when the run that started it was killed; a guard timer, armed before the password is
written and stopped by that unit, removes it should the run die in between. A target whose
peer cannot serve (it failed earlier, its daemon did not start, the pull broke) is fed by the control node instead,
and every target verifies what it received in full before it may serve anyone.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import secrets
import uuid
from dataclasses import dataclass, field
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand

from deploys.run.reads import operation, read, run_on
from deploys.inventory import inventory_configs, node_config
from deploys.model.push import push_from_control
from deploys.ops import fail_host, upload_private, sudo_args
from deploys.run.state import kept, this_run
from deploys.schema import NodeConfig
from deploys.schema.listeners import peer_address
from facts.model import SeedDaemon
from files import helper_text

SEED_UNIT = "inference-nodes-model-seed"
SEED_DIR = "/run/inference-nodes/model-seed"
SEED_USER = "inference-nodes"
SEED_MAX_SECONDS = 6 * 3600  # a run killed mid-way leaves no daemon behind for longer than this
PULL_UNIT = "inference-nodes-model-pull"
PULL_GUARD_SECONDS = 300  # a target's password left by a run killed before its pull started lives this long at most
PEER_PULL = "/usr/local/lib/inference-nodes/peer_pull.py"
SEED_LISTENING = "model_snapshot/seed_listening.py"  # run as python3 -c: nothing installed


@dataclass(frozen=True)
class Assignment:
    wave: int  # 0-based
    source: str | None  # the serving host's name; None: the control node


def fanout_waves(members: list[str], per_source: int) -> dict[str, Assignment]:
    """Who feeds whom, in order: the control node the first ``per_source``, then each holder ``per_source`` more."""
    plan = {name: Assignment(0, None) for name in members[:per_source]}
    holders, pending, wave = list(plan), list(members[per_source:]), 1
    while pending:
        fed = []
        for source in holders:
            for _ in range(per_source):
                if pending:
                    target = pending.pop(0)
                    plan[target] = Assignment(wave, source)
                    fed.append(target)
        holders += fed
        wave += 1
    return plan


def swarm_waves(members: list[str], seed: str) -> dict[str, Assignment]:
    """The `swarm` mode's two steps: with ``seed`` `first` the control node feeds the group's first node (wave 1),
    which seeds the others' swarm (wave 2); with `control` every node joins the control node's swarm in wave 1."""
    if seed == "control":
        return {name: Assignment(0, None) for name in members}
    return {members[0]: Assignment(0, None), **{name: Assignment(1, members[0]) for name in members[1:]}}


def group_key(cfg: NodeConfig) -> tuple:
    """What the hosts of one distribution group share: the mode, the files they want where, and how they are fed."""
    how = cfg.model_push_fanout if cfg.model_sync_mode == "push" else cfg.model_swarm_seed
    return (cfg.model_sync_mode, cfg.model_repo, cfg.model_revision, cfg.model_layout, cfg.snapshot_dir, how)


def distribution_groups(hosts: list[tuple[str, NodeConfig]]) -> dict[tuple, list[str]]:
    """The `push` and `swarm` hosts with a manifest, in inventory order, by ``group_key``."""
    groups: dict[tuple, list[str]] = {}
    for name, cfg in hosts:
        if cfg.model_sync_mode in ("push", "swarm") and cfg.model_manifest is not None:
            groups.setdefault(group_key(cfg), []).append(name)
    return groups


def fanout_plan(hosts: list[tuple[str, NodeConfig]]) -> dict[str, Assignment]:
    """Assignments of the `push`- and `swarm`-mode hosts, in inventory order, grouped by the files they want where."""
    plan: dict[str, Assignment] = {}
    for key, members in distribution_groups(hosts).items():
        plan.update(fanout_waves(members, key[-1]) if key[0] == "push" else swarm_waves(members, key[-1]))
    return plan


@dataclass
class _Run:
    """One deploy run's fan-out: the plan, each host's verifier verdict (recorded by the first sync wave, read by
    the serving waves and by the host's own later wave, so a big snapshot is not re-hashed), which hosts serve,
    and each server's secret."""

    waves: int
    plan: dict[str, Assignment]
    groups: dict[str, list[str]] = field(default_factory=dict)  # each host's group, in inventory order
    verdicts: dict[str, dict] = field(default_factory=dict)  # the verifier's, per host, from the first wave
    serving: set[str] = field(default_factory=set)
    secrets: dict[str, str] = field(default_factory=dict)

    def secret(self, server: str) -> str:
        return self.secrets.setdefault(server, secrets.token_urlsafe(32))


def _run(state=None) -> _Run:
    """This run's fan-out (deploys/run/state.py), planned for the hosts it connected."""
    state = state if state is not None else this_run()

    def planned() -> _Run:
        configs = inventory_configs(state.inventory)
        running = [(h.name, configs[h.name]) for h in state.inventory
                   if h.name in configs and h in state.activated_hosts and state.is_host_in_limit(h)]
        plan = fanout_plan(running)
        groups = {name: members for members in distribution_groups(running).values() for name in members}
        return _Run(1 + max((a.wave for a in plan.values()), default=0), plan, groups)

    return kept(state, "model fan-out", planned)


def run_plan() -> tuple[int, dict[str, Assignment]]:
    """(number of waves, assignment of every push-mode host) for the hosts connected in this run."""
    run = _run()
    return run.waves, run.plan


def group_of(name: str, state=None) -> list[str]:
    """The hosts of ``name``'s distribution group in this run, in inventory order."""
    return _run(state).groups.get(name, [name])


def needy_targets(source: str, wave: int, state=None) -> list[str]:
    """The hosts ``source`` feeds in ``wave`` whose first verdict found files missing or bad."""
    run = _run(state)
    return [t for t, a in run.plan.items() if a.wave == wave and a.source == source
            and t in run.verdicts and not run.verdicts[t].get("ok")]


def record_verdict(name: str, verdict: dict) -> None:
    _run().verdicts[name] = verdict


def recorded_verdict(name: str) -> dict | None:
    return _run().verdicts.get(name)


def run_host(name: str):
    return this_run().inventory.get_host(name)


def peer_endpoint(peer) -> tuple[str, int]:
    cfg = node_config(peer)
    # the SSH host by default (a GB10 pair's fabric is often a direct cable that no other node can reach)
    address = peer_address(peer.name, cfg, peer.data)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.:-]*", address):
        raise ValueError(f"host {peer.name}: peer address {address!r} (from ssh_hostname or the host name) is not an "
                         "address or host name: set model_peer_address")
    return address, cfg.model_peer_port


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def seed_allow_list(own: str, target_addresses: list[str]) -> list[str] | None:
    """The addresses the seed daemon accepts (its own, for the listening check, and its targets'), or None
    when one is a host name: systemd's IPAddressAllow= takes addresses only."""
    wanted = [own, *target_addresses]
    return sorted(set(wanted)) if all(is_ip(a) for a in wanted) else None


def seed_firewall_properties(allow: list[str] | None) -> list[str]:
    if allow is None:
        return []
    return ["--property=IPAddressDeny=any", *(f"--property=IPAddressAllow={a}" for a in allow)]


def render_rsyncd_conf(root: str, max_connections: int) -> str:
    return (
        "# Managed by inference-nodes: this node's verified model copy, read-only, for one deploy run's peers.\n"
        "use chroot = yes\nuid = nobody\ngid = nogroup\ntransfer logging = yes\n"
        f"max connections = {max_connections}\nlock file = {SEED_DIR}/rsyncd.lock\n\n"
        f"[model]\n    path = {root}\n    read only = yes\n    list = no\n    auth users = {SEED_USER}\n"
        f"    secrets file = {SEED_DIR}/secrets\n    strict modes = yes\n"
    )


@operation()
def peers_served(wave: int, targets: list[str], root: str):
    """Serve this node's verified copy to its ``targets`` of ``wave``, when any of them needs files.

    + wave: the wave (0-based) the targets are fed in
    + targets: hosts this node feeds in that wave
    + root: the directory served (the repo's cache folder, or the plain directory)
    """
    run = _run()
    needy = needy_targets(host.name, wave) if node_config().model_sync_mode == "push" else []  # a swarm seeds itself
    if not needy:
        host.noop(f"no node of wave {wave + 1} needs files from {host.name}")
        return
    if host.name in run.serving:
        host.noop(f"{host.name} already serves its copy in this run")
        return
    try:
        address, port = peer_endpoint(host)
    except ValueError as e:
        yield fail_host(str(e))  # the operation's errors are ignored: its targets fall back to the control node
        return
    # every target's streams at once (they may be configured differently), plus one for the links pass
    connections = sum(node_config(run_host(t)).model_rsync_streams + 1 for t in targets)
    target_addresses = []
    for t in targets:
        try:
            target_addresses.append(peer_endpoint(run_host(t))[0])
        except ValueError:
            target_addresses.append(t)  # a name: no address to list
    allow = seed_allow_list(address, target_addresses)
    if allow is None:
        logger.warning(f"{host.name}: the seed daemon accepts connections from any address (a peer address of "
                       f"{host.name} or of {', '.join(targets)} is a host name, not an IP address: set "
                       "model_peer_address to an address to restrict it); the run's password still gates it")
    yield StringCommand("systemctl", "stop", SEED_UNIT, "2>/dev/null", "||", "true")
    yield StringCommand("install", "-d", "-m", "0700", "-o", "root", "-g", "root", SEED_DIR)
    yield FileUploadCommand(StringIO(render_rsyncd_conf(root, connections)), f"{SEED_DIR}/rsyncd.conf")
    yield from upload_private(StringIO(f"{SEED_USER}:{run.secret(host.name)}\n"), f"{SEED_DIR}/secrets")
    yield StringCommand("chmod", "0600", f"{SEED_DIR}/secrets", f"{SEED_DIR}/rsyncd.conf")
    yield StringCommand(
        "systemd-run", "--quiet", f"--unit={SEED_UNIT}", "--collect", f"--property=RuntimeMaxSec={SEED_MAX_SECONDS}",
        "--property=ProtectSystem=strict",
        # systemd's own directory for the unit (kept as written, writable, 0700): removed whenever the unit stops,
        # however it stops, so the run secret never outlives the daemon
        f"--property=RuntimeDirectory={SEED_DIR.removeprefix('/run/')}", "--property=RuntimeDirectoryMode=0700",
        "--property=ProtectHome=read-only",
        "--property=PrivateTmp=yes", "--property=NoNewPrivileges=yes",
        *seed_firewall_properties(allow),
        "rsync", "--daemon", "--no-detach", f"--config={SEED_DIR}/rsyncd.conf", QuoteString(f"--address={address}"),
        f"--port={port}",
    )
    yield StringCommand("python3", "-c", QuoteString(helper_text(SEED_LISTENING)), QuoteString(address), str(port),
                        SEED_UNIT)
    yield FunctionCommand(_mark_serving, (f"serving its verified model copy on {address}:{port} to "
                                          f"{', '.join(needy)}",), {})


def _mark_serving(state, host, message: str) -> bool:
    _run(state).serving.add(host.name)
    host.log_styled(message, log_func=logger.info)
    return True


@operation()
def peers_stopped():
    """No seed daemon and no run secret left on the node once the run's waves are done."""
    yield from left_stopped(read(host, SeedDaemon, unit=SEED_UNIT, secret_dir=SEED_DIR), SEED_UNIT, SEED_DIR,
                            "no seed daemon, no run secret")


def left_stopped(left: dict, unit: str, directory: str, nothing: str):
    """The commands that stop a transient unit of the run and remove its directory, as SeedDaemon found them (``left``;
    ``nothing``: the note when neither is there)."""
    if left["running"]:
        yield StringCommand("systemctl", "stop", unit)
    if left["secret_dir"]:
        yield StringCommand("rm", "-rf", directory)
    if not (left["running"] or left["secret_dir"]):
        host.noop(nothing)


def pull_from_peer(state, host, source: str, refetch: list[str], manifest: str) -> bool:
    """Fetch ``refetch`` from ``source``'s seed; when it cannot serve, from the control node."""
    peer = state.inventory.get_host(source)
    if peer in state.failed_hosts:
        reason = "it failed earlier in this run"
    elif source not in _run(state).serving:
        reason = "its seed is not running"
    else:
        cfg = node_config(host)
        address, port = peer_endpoint(peer)
        sudo = sudo_args(host)
        password = f"{SEED_DIR}/password-{hashlib.sha256(source.encode()).hexdigest()[:16]}"  # no name in a path
        url = f"rsync://{SEED_USER}@{f'[{address}]' if ':' in address else address}:{port}/model/"
        dest = cfg.model_dir
        unit = f"{PULL_UNIT}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"
        # the guard first: should the run die before the pull unit starts, the password goes after a while
        ok, out = run_on(host, StringCommand(  # a killed run's pull of the same peer ends first
            "systemctl", "stop", f"{unit}.service", f"{unit}-guard.timer", "2>/dev/null", ";",
            "install", "-d", "-m", "0700", SEED_DIR, "&&", "systemd-run", "--quiet", "--collect",
            f"--unit={unit}-guard", f"--on-active={PULL_GUARD_SECONDS}", "/bin/rm", "-f", password), **sudo)
        private = f"/tmp/inference-nodes-upload-{uuid.uuid4().hex}"  # a sudo upload's temp file: 0700, never /tmp
        try:
            if sudo:
                ok = ok and run_on(host, StringCommand("mkdir", "-m", "0700", private))[0]
            ok = ok and host.put_file(StringIO(_run(state).secret(source) + "\n"), password,
                                      remote_temp_filename=f"{private}/secret" if sudo else None, **sudo)
            ok = ok and run_on(host, StringCommand("chmod", "0600", password), **sudo)[0]
            if ok:  # the pull's own unit removes the password when it ends, even if this run is killed meanwhile
                ok, out = run_on(host, StringCommand(
                    "systemd-run", "--quiet", "--wait", "--pipe", "--collect", f"--unit={unit}",
                    f"--property=RuntimeMaxSec={SEED_MAX_SECONDS}",
                    QuoteString(f"--property=ExecStartPre=-+/bin/systemctl stop {unit}-guard.timer"),
                    QuoteString(f"--property=ExecStopPost=+/bin/rm -f {password}"),
                    "python3", PEER_PULL, QuoteString(url), QuoteString(dest), password, manifest,
                    "--layout", cfg.model_layout, "--snapshot", QuoteString(cfg.snapshot_subdir),
                    "--streams", str(cfg.model_rsync_streams), *(QuoteString(p) for p in sorted(refetch)),
                ), print_output=True, **sudo)  # its progress lines as they come (sync_progress.py)
        finally:  # not left behind even if this host fails before the run's stop operation
            run_on(host, StringCommand("rm", "-f", password, ";", "systemctl", "stop", f"{unit}-guard.timer",
                                                 "2>/dev/null", ";", "true"), **sudo)
            if sudo:
                run_on(host, StringCommand("rm", "-rf", private))
        if ok:
            host.log_styled(f"pulled {out.stdout.strip()} from peer {source} ({address}:{port})", log_func=logger.info)
            return True
        reason = (out.stderr.strip().splitlines() or ["could not pull"])[-1]
    host.log_styled(f"peer {source} cannot feed {host.name} ({reason}): the control node feeds it instead",
                    fg="yellow", log_func=logger.warning)
    return push_from_control(state, host, refetch)
