#!/usr/bin/python3
"""A private BitTorrent swarm for one model snapshot, on libtorrent-rasterbar (Debian and Ubuntu's
python3-libtorrent; run with the system interpreter, which is the one the package is built for).

    swarm.py make DIR MANIFEST TORRENT [--piece-mib 16]
    swarm.py serve TORRENT DIR MANIFEST --listen ADDR:PORT [--peer ADDR:PORT ...] [--seed [--super-seed]]
                   [--status FILE]
    swarm.py up FILE UNIT
    swarm.py wait FILE [--stale-s 30] [--stall-s 600] [--every 30]

`make` writes a private torrent (v1 and v2 piece hashes: SHA-1 and SHA-256 Merkle trees) of the manifest's files as
DIR holds them (the verified copy seeds). Its files are the manifest's, in its order, under one folder named
`snapshot` whatever DIR is called, so the same commit gives the same torrent from any copy and a node may keep the
files anywhere (its live directory, or the tree a release is staged in). `serve` joins the swarm: with --seed it
serves DIR as it is; without, it downloads into DIR what is missing or bad (every piece checked against the
torrent's hashes; a run killed and started again rechecks what is there and goes on from it), then serves it on. It
runs until stopped (the deploy stops it once every node verified its copy), writing its progress to FILE as JSON
every second, the first time once it listens on ADDR:PORT itself (the engine would take another port when that one
is taken: refused). `up` returns once UNIT's swarm listens, or fails as soon as UNIT stops. `wait` returns once FILE
says every piece is held (exit 0), or fails (exit 1) when FILE stops being written (the swarm died) or nothing more
arrived for --stall-s seconds; it prints the model sync's progress line meanwhile.

The swarm is private and bound: no DHT, local discovery, UPnP or NAT-PMP, no peer exchange (the torrent's private
flag), listening and connecting from ADDR only; peers are the --peer addresses, told by the deploy (no tracker).
The torrent is not trusted with paths: each of its files must be a manifest entry of the same size, and it must
hold all of them, before anything is written. The engine moves bytes; the snapshot verifier stays the gate before
a node serves the model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

if __package__:  # files.model_snapshot.swarm on the control node (its unit tests)
    from .snapshot_manifest import ManifestError, read_manifest
    from .sync_progress import PROGRESS_EVERY_S, progress_line
else:  # run as a file on the node, beside the verifier's modules (/usr/local/lib/inference-nodes/)
    from snapshot_manifest import ManifestError, read_manifest
    from sync_progress import PROGRESS_EVERY_S, progress_line

RECONNECT_EVERY_S = 10  # a peer that restarted (or came up late) is dialled again
ROOT_NAME = "snapshot"  # the torrent's one folder, whatever the directory holding the files is called


def engine():
    import libtorrent  # python3-libtorrent: imported here so `make`'s checks and the unit tests need no engine

    return libtorrent


def endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"swarm: {text!r} is not ADDRESS:PORT")
    return host.strip("[]"), int(port)


def torrent_problems(files: list[tuple[str, int]], manifest: dict) -> list[str]:
    """What keeps a torrent's files (path relative to the snapshot, size) from being exactly the manifest's."""
    want = {e["path"]: e["size"] for e in manifest["files"]}
    problems = [f"{p}: not in the manifest" for p, _ in files if p not in want]
    problems += [f"{p}: {s} bytes, the manifest says {want[p]}" for p, s in files if p in want and want[p] != s]
    have = {p for p, _ in files}
    problems += [f"{p}: missing from the torrent" for p in sorted(want) if p not in have]
    return problems


def torrent_files(info) -> list[tuple[str, int]]:
    """(path relative to the snapshot, size) of a torrent's real files (v2 pad files left out)."""
    fs = info.files()
    out = []
    for i in range(fs.num_files()):
        if fs.file_flags(i) & fs.flag_pad_file:
            continue
        path = fs.file_path(i).replace(os.sep, "/")
        out.append((path.split("/", 1)[1] if "/" in path else path, fs.file_size(i)))
    return out


class linked_as_root:
    """A private folder in which ROOT_NAME is a link to ``directory``: the engine's save path, so the torrent's
    folder name need not be the directory's."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)

    def __enter__(self) -> str:
        self.path = tempfile.mkdtemp(prefix="swarm-")
        os.symlink(self.directory, os.path.join(self.path, ROOT_NAME))
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def make(directory: str, manifest_path: str, out: str, piece_mib: int) -> int:
    lt = engine()
    manifest = read_manifest(manifest_path)
    missing = [e["path"] for e in manifest["files"]
               if not os.path.isfile(os.path.join(directory, e["path"]))
               or os.path.getsize(os.path.join(directory, e["path"])) != e["size"]]
    if missing:
        print(f"swarm: {directory} is not the manifest's snapshot: {', '.join(missing[:5])} missing or of "
              "another size", file=sys.stderr)
        return 1
    fs = lt.file_storage()
    for entry in manifest["files"]:  # the manifest's files and sizes, not the directory's: no stray file, no link
        fs.add_file(f"{ROOT_NAME}/{entry['path']}", entry["size"])
    ct = lt.create_torrent(fs, piece_mib * 2**20)
    ct.set_priv(True)
    ct.set_creator("inference-nodes")
    with linked_as_root(directory) as save_path:
        lt.set_piece_hashes(ct, save_path)
    torrent = ct.generate()
    torrent.pop(b"creation date", None)  # one commit, one torrent: byte for byte, whenever and wherever it is made
    data = lt.bencode(torrent)
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out)
    print(f"swarm: {out}: {len(manifest['files'])} files, pieces of {piece_mib} MiB", file=sys.stderr)
    return 0


def settings(listen: tuple[str, int]) -> dict:
    address, port = listen
    return {"listen_interfaces": f"{'[' + address + ']' if ':' in address else address}:{port}",
            "outgoing_interfaces": address, "enable_dht": False, "enable_lsd": False, "enable_upnp": False,
            "enable_natpmp": False, "max_retry_port_bind": 0, "announce_to_all_trackers": False,
            "active_downloads": -1, "active_seeds": -1,
            "active_limit": -1, "alert_mask": 1 | 64}  # error and status notifications


def status_of(handle, started: float) -> dict:
    s = handle.status()
    return {"state": str(s.state).rsplit(".", 1)[-1], "done": s.total_wanted_done, "wanted": s.total_wanted,
            "seeding": bool(s.is_seeding), "peers": s.num_peers, "down_bps": s.download_rate,
            "up_bps": s.upload_rate, "uploaded": s.all_time_upload, "downloaded": s.all_time_download,
            "elapsed_s": round(time.monotonic() - started, 1)}


def write_status(path: str | None, status: dict) -> None:
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, path)


def serve(torrent: str, directory: str, manifest_path: str, listen: tuple[str, int], peers: list[tuple[str, int]],
          seed: bool, status_path: str | None, super_seed: bool = False) -> int:
    lt = engine()
    manifest = read_manifest(manifest_path)
    info = lt.torrent_info(torrent)
    problems = torrent_problems(torrent_files(info), manifest)
    if problems or info.name() != ROOT_NAME:
        problems = problems or [f"its folder is {info.name()!r}, not {ROOT_NAME!r}"]
        print(f"swarm: {torrent} refused: {'; '.join(problems[:5])}", file=sys.stderr)
        return 1
    os.makedirs(directory, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `systemctl stop`: the link folder goes too
    with linked_as_root(directory) as save_path:
        return _serve(lt, info, save_path, listen, peers, seed, status_path, super_seed)


def listen_refused(lt, session, listen: tuple[str, int], within_s: float = 15) -> str | None:
    """Why the session does not listen on ``listen`` (None: it does). libtorrent takes the next ports, then any
    port, when the one asked for is taken: only the port asked for is what the peers and the firewall know."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        session.wait_for_alert(200)
        for alert in session.pop_alerts():
            if isinstance(alert, lt.listen_failed_alert):
                return alert.message()
            if isinstance(alert, lt.listen_succeeded_alert) and str(alert.socket_type) == "tcp":
                return None if alert.port == listen[1] else f"the port is taken (the engine fell back to {alert.port})"
    return f"no answer from the engine in {within_s:.0f} s"


def _serve(lt, info, save_path: str, listen: tuple[str, int], peers: list[tuple[str, int]], seed: bool,
           status_path: str | None, super_seed: bool) -> int:
    session = lt.session(settings(listen))
    if (refused := listen_refused(lt, session, listen)) is not None:
        print(f"swarm: cannot listen on {listen[0]}:{listen[1]}: {refused}", file=sys.stderr)
        return 1
    params = lt.add_torrent_params()
    params.ti = info
    params.save_path = save_path
    params.flags = (params.flags | lt.torrent_flags.disable_dht | lt.torrent_flags.disable_lsd
                    | lt.torrent_flags.disable_pex) & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused
    if seed:  # the verified copy: each piece hashed when first asked for
        params.flags |= lt.torrent_flags.seed_mode
    if super_seed:  # each peer is offered pieces no one else has yet, then they trade them among themselves: the
        # seed's upload nears one copy, slower to start (a single peer waits on itself)
        params.flags |= lt.torrent_flags.super_seeding
    handle = session.add_torrent(params)
    started, dialled, told = time.monotonic(), 0.0, False
    while True:
        for alert in session.pop_alerts():
            if isinstance(alert, (lt.file_error_alert, lt.listen_failed_alert)):
                print(f"swarm: {alert.message()}", file=sys.stderr)
                return 1
        if time.monotonic() - dialled > RECONNECT_EVERY_S:
            for peer in peers:
                handle.connect_peer(peer)
            dialled = time.monotonic()
        status = status_of(handle, started)
        write_status(status_path, status)
        if status["seeding"] and not told:
            print(f"swarm: holding every piece after {status['elapsed_s']} s "
                  f"({status['downloaded']} bytes in, {status['uploaded']} out): serving on", file=sys.stderr, flush=True)
            told = True
        time.sleep(1)


def up(status_path: str, unit: str, within_s: float = 20) -> int:
    """Until the swarm of ``unit`` listens (its first status is written only then); 1 as soon as ``unit`` stops."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if os.path.exists(status_path):
            return 0
        if subprocess.run(["systemctl", "is-active", "--quiet", unit]).returncode != 0:
            break
        time.sleep(0.2)
    log = subprocess.run(["journalctl", "-u", unit, "-n", "3", "--no-pager", "-o", "cat"], capture_output=True,
                         text=True).stdout.split("\n")
    print(f"swarm: {unit} is not listening ({' | '.join(line for line in log if line) or 'no log'})", file=sys.stderr)
    return 1


def wait(status_path: str, stale_s: float, stall_s: float, every_s: float) -> int:
    """Until the swarm at ``status_path`` holds every piece; 1 when it stopped writing it or nothing arrived for
    ``stall_s``."""
    started = last_line = time.monotonic()
    progress_at, done = started, -1
    while True:
        now = time.monotonic()
        try:
            age = time.time() - os.stat(status_path).st_mtime
            with open(status_path) as f:
                status = json.load(f)
        except (OSError, ValueError):
            age, status = now - started, {}
        if status.get("seeding"):
            print(progress_line(status["done"], status["wanted"], now - started, " (swarm)", final=True), flush=True)
            return 0
        if age > stale_s:
            print(f"swarm: its status ({status_path}) was last written {age:.0f} s ago: the swarm is not running",
                  file=sys.stderr)
            return 1
        if status.get("done", 0) > done:
            done, progress_at = status["done"], now
        elif now - progress_at > stall_s:
            print(f"swarm: nothing arrived for {stall_s:.0f} s ({done} of {status.get('wanted')} bytes, "
                  f"{status.get('peers', 0)} peers)", file=sys.stderr)
            return 1
        if now - last_line >= every_s and status:
            print(progress_line(status["done"], status["wanted"], now - started, " (swarm)"), flush=True)
            last_line = now
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="swarm.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("manifest")
    m.add_argument("torrent")
    m.add_argument("--piece-mib", type=int, default=16, choices=[1, 2, 4, 8, 16, 32, 64])
    s = sub.add_parser("serve")
    s.add_argument("torrent")
    s.add_argument("dir")
    s.add_argument("manifest")
    s.add_argument("--listen", required=True, type=endpoint)
    s.add_argument("--peer", action="append", default=[], type=endpoint)
    s.add_argument("--seed", action="store_true")
    s.add_argument("--super-seed", action="store_true", help="with --seed: BitTorrent's initial seeding")
    s.add_argument("--status")
    u = sub.add_parser("up")
    u.add_argument("status")
    u.add_argument("unit")
    w = sub.add_parser("wait")
    w.add_argument("status")
    w.add_argument("--stale-s", type=float, default=30)
    w.add_argument("--stall-s", type=float, default=600)
    w.add_argument("--every", type=float, default=PROGRESS_EVERY_S)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up":
            return up(args.status, args.unit)
        if args.cmd == "wait":
            return wait(args.status, args.stale_s, args.stall_s, args.every)
        if args.cmd == "make":
            return make(args.dir, args.manifest, args.torrent, args.piece_mib)
        return serve(args.torrent, args.dir, args.manifest, args.listen, args.peer, args.seed, args.status,
                     args.super_seed)
    except ManifestError as e:
        print(f"swarm: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
