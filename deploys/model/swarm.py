"""`swarm` mode: the nodes of a group share the snapshot in a private BitTorrent swarm (libtorrent, through
files/model_snapshot/swarm.py and Debian's/Ubuntu's python3-libtorrent), so a copy reaches many nodes in about the
time of one, and the control node's uplink carries about one copy.

Who seeds (`model_swarm_seed`): `first`, the group's first node, fed by the control node as in `push` mode (wave 1),
makes the torrent of its verified copy, sends it back to the control node and seeds the others (wave 2);
`control`, the control node itself, from its verified copy (python3-libtorrent on the control node). Every node
joins with every other member of its group as a peer (no tracker, DHT, local discovery, peer exchange or port
mapping), listens on its peer address only, and lets in only its group's addresses (systemd's IPAddressDeny=any
+ IPAddressAllow=). The engine checks every piece against the torrent; the toolkit's verifier checks every file
against the trusted manifest before the node may serve, as in every mode. A node whose swarm stalls or stops is
fed by the control node instead.

The swarm runs as a transient unit on each node (`systemd-run`, bounded by RuntimeMaxSec=) and stops once every node
of the run verified its copy (unless `model_swarm_keep_seeding_h`); the control node's seed is a child of the run
that dies with it. Nothing listens afterwards.
"""

from __future__ import annotations

import atexit
import ctypes
import io
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field

import gevent
import gevent.lock
from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand

from deploys.inventory import node_config
from deploys.model import fanout as model_fanout
from deploys.model.push import control_snapshot, push_from_control
from deploys.ops import ControlNodeError, host_failed, sudo_args
from deploys.run.reads import operation, read, run_on
from deploys.run.state import kept
from deploys.schema import NodeConfig
from deploys.schema.listeners import swarm_address
from facts.model import SeedDaemon
from files import helper_path

SWARM = "/usr/local/lib/inference-nodes/swarm.py"  # beside the verifier's modules (it imports the manifest's)
SWARM_UNIT = "inference-nodes-model-swarm"
SWARM_STATE = "/var/lib/inference-nodes/model-swarm"  # the torrent and the swarm's status, while it runs
TORRENT = f"{SWARM_STATE}/snapshot.torrent"
STATUS = f"{SWARM_STATE}/status.json"
SWARM_MAX_SECONDS = 6 * 3600  # a run killed mid-way leaves no swarm behind for longer than this
SYSTEM_PYTHON = "/usr/bin/python3"  # the interpreter python3-libtorrent is built for (never a venv's)


@dataclass
class _Swarms:
    """This run's swarms: each group's torrent (made where the verified copy is), the control node's seeds, the
    nodes that seed."""

    torrents: dict[tuple, bytes] = field(default_factory=dict)
    control_seeds: dict[tuple, subprocess.Popen] = field(default_factory=dict)
    seeding: set[str] = field(default_factory=set)
    lock: gevent.lock.Semaphore = field(default_factory=gevent.lock.Semaphore)


def _swarms(state) -> _Swarms:
    return kept(state, "model swarms", _Swarms)


def listen_address(peer) -> str:
    """The address ``peer``'s swarm binds to (validated: one IP address of the node)."""
    return swarm_address(peer.name, node_config(peer), peer.data)[0]


def endpoint(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def member_addresses(state, name: str) -> dict[str, str]:
    """Each member of ``name``'s group and the address its swarm binds to, in inventory order."""
    return {m: listen_address(state.inventory.get_host(m)) for m in model_fanout.group_of(name, state)}


def peer_addresses(state, name: str) -> list[str]:
    """The addresses ``name``'s swarm dials: the control node's seed first where it seeds, then the group's other
    members."""
    cfg = node_config(state.inventory.get_host(name))
    seed = [cfg.model_swarm_control_address] if cfg.model_swarm_seed == "control" else []
    return seed + [a for m, a in member_addresses(state, name).items() if m != name]


def unit_command(state, name: str, directory: str, manifest: str, seed: bool) -> StringCommand:
    """The node's swarm as a transient unit: writes only ``directory`` and its own state, talks only to its group."""
    cfg = node_config(state.inventory.get_host(name))
    own = listen_address(state.inventory.get_host(name))
    peers = peer_addresses(state, name)
    lifetime = cfg.model_swarm_keep_seeding_h * 3600 or SWARM_MAX_SECONDS
    return StringCommand(
        "systemd-run", "--quiet", f"--unit={SWARM_UNIT}", "--collect", f"--property=RuntimeMaxSec={lifetime}",
        "--property=ProtectSystem=strict", QuoteString(f"--property=ReadWritePaths={directory} {SWARM_STATE}"),
        "--property=ProtectHome=read-only", "--property=PrivateTmp=yes", "--property=NoNewPrivileges=yes",
        *model_fanout.seed_firewall_properties(sorted({own, *peers})),
        SYSTEM_PYTHON, SWARM, "serve", TORRENT, QuoteString(directory), QuoteString(manifest),
        "--listen", QuoteString(endpoint(own, cfg.model_swarm_port)),
        *(x for p in peers for x in ("--peer", QuoteString(endpoint(p, cfg.model_swarm_port)))), "--status", STATUS,
        *(["--seed"] if seed else []), *(["--super-seed"] if seed and cfg.model_swarm_super_seed else []))


def listening_command() -> StringCommand:
    """Returns once the node's swarm listens where told; fails as soon as its unit stops (``swarm.py up``)."""
    return StringCommand("python3", SWARM, "up", STATUS, SWARM_UNIT)


def stale_swarm_stopped() -> StringCommand:
    """A swarm a killed run left is stopped before this run's starts (its unit's name is taken)."""
    return StringCommand("systemctl", "stop", SWARM_UNIT, "2>/dev/null", ";", "install", "-d", "-m", "0700",
                         SWARM_STATE, "&&", "rm", "-f", STATUS)


@operation()
def swarm_seeded(wave: int, directory: str, manifest: str):
    """The group's first node (`model_swarm_seed: first`) seeds its verified copy to the nodes of ``wave`` that need
    files: it makes the torrent, the control node keeps it for them, and its swarm starts seeding.

    + wave: the wave (0-based) its group's other nodes join the swarm in
    + directory: the verified files (``snapshot_synced``'s snapshot_dir)
    + manifest: the trusted manifest on the node (the commit's: live or staged)
    """
    cfg = node_config()
    if cfg.model_sync_mode != "swarm":
        host.noop("not the swarm mode")
        return
    needy = model_fanout.needy_targets(host.name, wave)
    if not needy:
        host.noop(f"no node of wave {wave + 1} needs files from {host.name}")
        return
    yield stale_swarm_stopped()
    yield StringCommand(SYSTEM_PYTHON, SWARM, "make", QuoteString(directory), QuoteString(manifest), TORRENT,
                        "--piece-mib", str(cfg.model_swarm_piece_mib))
    yield FunctionCommand(_torrent_kept, (), {})
    yield FunctionCommand(_unit_started, (directory, manifest, True), {})
    # a seed that cannot listen (its port taken, say) fails here, before any node waits on it: they are fed by the
    # control node at once
    yield listening_command()
    yield FunctionCommand(_mark_seeding, (needy,), {})


def _torrent_kept(state, host) -> bool:
    data = io.BytesIO()
    if not host.get_file(TORRENT, data, **sudo_args(host)):
        return host_failed(host, f"could not read back the torrent it made ({TORRENT})")
    _swarms(state).torrents[model_fanout.group_key(node_config(host))] = data.getvalue()
    return True


def _unit_started(state, host, directory: str, manifest: str, seed: bool) -> bool:
    why = unit_start_refused(state, host, directory, manifest, seed)
    return True if why is None else host_failed(host, why)


def unit_start_refused(state, host, directory: str, manifest: str, seed: bool) -> str | None:
    """Start the node's swarm unit; None once systemd took it, else why not."""
    ok, out = run_on(host, unit_command(state, host.name, directory, manifest, seed), **sudo_args(host))
    return None if ok else f"its model swarm did not start: {' '.join(out.stderr.split())[-400:]}"


def _listening(host) -> tuple[bool, str]:
    """Whether the node's swarm listens (``swarm.py up``), and why not."""
    ok, out = run_on(host, listening_command(), **sudo_args(host))
    return ok, (out.stderr.strip().splitlines() or ["its swarm does not listen"])[-1]


def _mark_seeding(state, host, needy: list[str]) -> bool:
    _swarms(state).seeding.add(host.name)
    host.log_styled(f"seeding its verified model copy to {', '.join(needy)} on "
                    f"{endpoint(listen_address(host), node_config(host).model_swarm_port)}", log_func=logger.info)
    return True


def _die_with_the_run() -> None:
    """In the control node's seed (preexec): SIGTERM when the run that started it dies, however it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def control_seeding(state, cfg: NodeConfig, name: str) -> str | None:
    """The control node's seed for ``name``'s group (`model_swarm_seed: control`), started once per run from its
    verified copy; None once it runs, else why it cannot."""
    swarms, key = _swarms(state), model_fanout.group_key(cfg)
    with swarms.lock:
        if key in swarms.control_seeds and swarms.control_seeds[key].poll() is None:
            return None
        try:
            copy = control_snapshot(cfg, state)
        except ControlNodeError as e:
            return f"control-node download failed: {e}"
        work = tempfile.mkdtemp(prefix="inference-nodes-swarm-")
        torrent, status = os.path.join(work, "snapshot.torrent"), os.path.join(work, "status.json")
        made = subprocess.run([SYSTEM_PYTHON, helper_path("model_snapshot/swarm.py"), "make", copy, cfg.model_manifest,
                               torrent, "--piece-mib", str(cfg.model_swarm_piece_mib)], capture_output=True, text=True)
        if made.returncode != 0:
            why = " ".join(made.stderr.split())[-400:]
            if "No module named 'libtorrent'" in made.stderr:
                why = f"python3-libtorrent is not installed on the control node ({SYSTEM_PYTHON}): apt install it"
            return f"the control node could not make the torrent: {why}"
        with open(torrent, "rb") as f:
            swarms.torrents[key] = f.read()
        peers = [endpoint(a, cfg.model_swarm_port) for a in member_addresses(state, name).values()]
        log = open(os.path.join(work, "seed.log"), "w")
        seed = subprocess.Popen(
            [SYSTEM_PYTHON, helper_path("model_snapshot/swarm.py"), "serve", torrent, copy, cfg.model_manifest,
             "--listen", endpoint(cfg.model_swarm_control_address, cfg.model_swarm_port), "--seed", "--status", status,
             *(["--super-seed"] if cfg.model_swarm_super_seed else []),
             *(x for p in peers for x in ("--peer", p))],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_the_run)
        for _ in range(100):  # the seed is up once it reports (it checked the torrent and listens)
            if seed.poll() is not None or os.path.exists(status):
                break
            gevent.sleep(0.1)
        if seed.poll() is not None:
            with open(log.name) as f:
                return f"the control node's seed stopped: {' '.join(f.read().split())[-400:]}"
        swarms.control_seeds[key] = seed
        atexit.register(_stop_seed, seed)
        logger.info(f"control node: seeding {cfg.model_repo}@{cfg.model_revision[:12]} on "
                    f"{endpoint(cfg.model_swarm_control_address, cfg.model_swarm_port)} (log: {log.name})")
        return None


def _stop_seed(seed: subprocess.Popen) -> None:
    if seed.poll() is None:
        seed.terminate()
        try:
            seed.wait(timeout=30)
        except subprocess.TimeoutExpired:
            seed.kill()


def swarm_fetch(state, host, source: str | None, refetch: list[str], directory: str, manifest: str) -> bool:
    """Join the group's swarm and wait until it holds every piece (a FunctionCommand's body: the verifier runs
    next); where the seed cannot serve or the swarm stalls, the control node pushes ``refetch`` instead."""
    cfg = node_config(host)
    swarms = _swarms(state)
    if source is None:
        reason = control_seeding(state, cfg, host.name)
    elif state.inventory.get_host(source) in state.failed_hosts:
        reason = f"{source}, the seed, failed earlier in this run"
    else:
        reason = None if source in swarms.seeding else f"{source}, the seed, is not seeding"
    torrent = swarms.torrents.get(model_fanout.group_key(cfg))
    if reason is None and torrent is None:
        reason = "no torrent was made"
    if reason is None:
        sudo = sudo_args(host)
        ok, out = run_on(host, stale_swarm_stopped(), **sudo)
        ok = ok and host.put_file(io.BytesIO(torrent), TORRENT, **sudo)
        reason = unit_start_refused(state, host, directory, manifest, False) if ok else "it could not take the torrent"
        ok, reason = _listening(host) if reason is None else (False, reason)
        if ok:
            ok, out = run_on(host, StringCommand("python3", SWARM, "wait", STATUS, "--stall-s",
                                                 str(cfg.model_swarm_stall_s)), print_output=True, **sudo)
            if ok:
                host.log_styled(f"holds every piece from the swarm ({len(refetch)} file(s) were missing or bad)",
                                log_func=logger.info)
                return True
            reason = (out.stderr.strip().splitlines() or ["its swarm failed"])[-1]
        run_on(host, StringCommand("systemctl", "stop", SWARM_UNIT, "2>/dev/null", ";", "true"), **sudo)
    host.log_styled(f"the model swarm cannot feed {host.name} ({reason}): the control node feeds it instead",
                    fg="yellow", log_func=logger.warning)
    return push_from_control(state, host, refetch, directory)


def swarm_reads(cfg: NodeConfig) -> list:
    """What ``swarm_stopped`` reads on a node of the `swarm` mode (for ``expect``: one command with the others)."""
    return [(SeedDaemon, {"unit": SWARM_UNIT, "secret_dir": SWARM_STATE})] if cfg.model_sync_mode == "swarm" else []


@operation()
def swarm_stopped():
    """No swarm on the node once every node of the run verified its copy (unless the inventory keeps it seeding),
    and the control node's seed stopped."""
    cfg = node_config()
    if cfg.model_sync_mode != "swarm":
        host.noop("not the swarm mode")
        return
    left = read(host, SeedDaemon, unit=SWARM_UNIT, secret_dir=SWARM_STATE)
    if cfg.model_swarm_keep_seeding_h and left["running"]:
        host.noop(f"the model swarm keeps seeding (at most {cfg.model_swarm_keep_seeding_h} h from its start)")
    else:
        yield from model_fanout.left_stopped(left, SWARM_UNIT, SWARM_STATE, "no model swarm")
    if model_fanout.group_key(cfg) in _swarms(host.state).control_seeds:
        yield FunctionCommand(_control_seed_stopped, (), {})


def _control_seed_stopped(state, host) -> bool:
    seed = _swarms(state).control_seeds.pop(model_fanout.group_key(node_config(host)), None)
    if seed is not None:
        _stop_seed(seed)
        logger.info("control node: its model seed stopped")
    return True
