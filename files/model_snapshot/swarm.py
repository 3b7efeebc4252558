#!/usr/bin/python3
"""A private BitTorrent swarm for one model snapshot, on libtorrent-rasterbar (Debian and Ubuntu's
python3-libtorrent; run with the system interpreter, which is the one the package is built for).

    swarm.py make DIR MANIFEST TORRENT [--piece-mib 16]
    swarm.py serve TORRENT DIR MANIFEST --listen ADDR:PORT [--peer ADDR:PORT ...] [--seed [--super-seed]]
                   [--status FILE]

`make` writes a private torrent (v1 and v2 piece hashes: SHA-1 and SHA-256 Merkle trees) of DIR's files, which must
be exactly the manifest's (the verified copy seeds). `serve` joins the swarm: with --seed it serves DIR as it is;
without, it downloads into DIR what is missing or bad (every piece checked against the torrent's hashes; a run
killed and started again rechecks what is there and goes on from it), then serves it on. It runs until stopped
(the deploy stops it once every node verified its copy), writing its progress to FILE as JSON every second.

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
import sys
import time

if __package__:  # files.model_snapshot.swarm on the control node (its unit tests)
    from .snapshot_manifest import ManifestError, read_manifest
else:  # run as a file on the node, beside the verifier's modules (/usr/local/lib/inference-nodes/)
    from snapshot_manifest import ManifestError, read_manifest

RECONNECT_EVERY_S = 10  # a peer that restarted (or came up late) is dialled again


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


def make(directory: str, manifest_path: str, out: str, piece_mib: int) -> int:
    lt = engine()
    manifest = read_manifest(manifest_path)
    fs = lt.file_storage()
    lt.add_files(fs, os.path.abspath(directory))
    ct = lt.create_torrent(fs, piece_mib * 2**20)
    ct.set_priv(True)
    ct.set_creator("inference-nodes")
    lt.set_piece_hashes(ct, os.path.dirname(os.path.abspath(directory)))
    data = lt.bencode(ct.generate())
    problems = torrent_problems(torrent_files(lt.torrent_info(lt.bdecode(data))), manifest)
    if problems:
        print(f"swarm: {directory} is not the manifest's snapshot: {'; '.join(problems[:5])}", file=sys.stderr)
        return 1
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
            "enable_natpmp": False, "announce_to_all_trackers": False, "active_downloads": -1, "active_seeds": -1,
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
    if problems or info.name() != os.path.basename(os.path.abspath(directory)):
        problems = problems or [f"its folder is {info.name()!r}, not {os.path.basename(directory)!r}"]
        print(f"swarm: {torrent} refused: {'; '.join(problems[:5])}", file=sys.stderr)
        return 1
    session = lt.session(settings(listen))
    params = lt.add_torrent_params()
    params.ti = info
    params.save_path = os.path.dirname(os.path.abspath(directory))
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
    args = ap.parse_args(argv)
    try:
        if args.cmd == "make":
            return make(args.dir, args.manifest, args.torrent, args.piece_mib)
        return serve(args.torrent, args.dir, args.manifest, args.listen, args.peer, args.seed, args.status,
                     args.super_seed)
    except ManifestError as e:
        print(f"swarm: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
